//! Gate nodes (`heddle.gate`): an attended boundary in a graph. Reaching one suspends
//! the run with the gate's title and review prompt as its state; a person answers it
//! (`heddle runs approve` / `reject`), never a node. The kernel's gate executor writes
//! that state and the CLI reads it back, both through [`GateAsk`].

use serde::{Deserialize, Serialize};

use crate::value::Value;

/// The type name of a gate node.
pub const GATE_TYPE: &str = "heddle.gate";

/// What a gate asks the person answering it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateAsk {
    /// The gate's title (its `title` property, else its id).
    pub title: String,
    /// What the person is asked to check (its `prompt` property).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

impl GateAsk {
    /// The suspension state a gate carries: `{"gate": {"title", "prompt"}}`.
    pub fn to_state(&self) -> Value {
        // Two strings always serialize.
        let json = serde_json::json!({ "gate": self });
        Value::from_json(json)
    }

    /// The ask inside a suspension's state, when the suspension is a gate's.
    pub fn from_state(state: &Value) -> Option<GateAsk> {
        let json = state.to_json();
        serde_json::from_value(json.get("gate")?.clone()).ok()
    }

    /// The suspension reason: what the gate waits for, in one line.
    pub fn reason(&self) -> String {
        match &self.prompt {
            Some(p) => format!("gate \"{}\" awaits a decision: {p}", self.title),
            None => format!("gate \"{}\" awaits a decision", self.title),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ask_survives_the_suspension_state() {
        let ask = GateAsk {
            title: "Ship".into(),
            prompt: Some("Read the diff".into()),
        };
        assert_eq!(GateAsk::from_state(&ask.to_state()), Some(ask));
        assert_eq!(GateAsk::from_state(&Value::Int(1)), None);
    }
}
