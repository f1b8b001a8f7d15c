//! Escalations: the public record of a failed invocation that a supervisor decides on,
//! and the intervention that records what became of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::verdicts::{AllowedSet, DecidedBy, DeclaredOutput, Verdict, check_substitute};
use crate::decl::NodeMode;
use crate::value::Value;

/// One step of an invocation's correlation lineage: the root a fan-out minted and the
/// item index within it (outermost first in [`Escalation::lineage`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LineageStep {
    /// The fan-out that minted the item (its root id).
    pub root: String,
    /// The item's position within that fan-out, from 0.
    pub index: u64,
}

/// Whether a value produced at lineage `output` is on the lineage of `item`: produced by
/// that item itself or by one of its ancestors, i.e. every (root, index) of `output` is
/// one of `item`'s. A sibling item, a descendant, or an item of another fan-out is not:
/// showing its value as this item's would mix items up.
pub fn on_lineage(output: &[LineageStep], item: &[LineageStep]) -> bool {
    output.iter().all(|o| item.contains(o))
}

/// The kernel's class of failure, mirrored here so the signature recognizers can stay in
/// this crate (the kernel's own error type lives above it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureKind {
    /// The node's own code reported an error.
    Node,
    /// The invocation used up its fuel budget.
    FuelExhausted,
    /// The invocation reached its time limit.
    Deadline,
    /// The invocation reached its memory limit.
    MemoryLimit,
    /// An output value was larger than allowed.
    OutputTooLarge,
    /// The guest trapped (panic, unreachable, bad memory access).
    Trap {
        /// The kind of trap, as wasmtime names it.
        trap: String,
    },
    /// A value did not fit the declared type of the input it arrived on (checked by the
    /// kernel before the invocation).
    Input,
    /// A fault in the machinery around the node (container engine down, I/O error):
    /// not the node's doing, so a retry may well succeed.
    Host,
}

/// An escalation: what the supervisor sees of a failed invocation. Built only by
/// [`Redactor::escalation`](super::Redactor::escalation), so every string in it has had
/// secrets masked and caps applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Escalation {
    /// The failing node's id.
    pub node_id: String,
    /// Its type name, so a policy rule can match on it.
    pub node_type: String,
    /// Full lineage of the failing invocation, outermost root first.
    #[serde(default)]
    pub lineage: Vec<LineageStep>,
    /// Canonical lineage key of the invocation (`""` for single-fire nodes).
    #[serde(default)]
    pub invocation_key: String,
    /// The node's mode: `end_stream` only makes sense for a streaming one.
    pub mode: NodeMode,
    /// The verdicts the kernel will accept for this failure; anything else is overruled.
    pub allowed_actions: AllowedSet,
    /// The class of failure.
    pub failure: FailureKind,
    /// The error, stringified and redacted.
    pub detail: String,
    /// Stable categorical code; absent means stickiness is off for this failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_signature: Option<String>,
    /// The malformed output the node produced (redacted, truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_output: Option<BTreeMap<String, Value>>,
    /// The invocation's inputs (redacted, truncated).
    #[serde(default)]
    pub inputs: BTreeMap<String, Value>,
    /// What the node declared per output handle (its type, and the fields it promised):
    /// what a substitute must match.
    #[serde(default)]
    pub declared_outputs: BTreeMap<String, DeclaredOutput>,
    /// 1-based, per (node, invocation key).
    pub attempt: u32,
    /// 0 for the first decision on this failure; n when the n-th substitute was rejected.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub repair_round: u32,
    /// Why the previous substitute was rejected (set when `repair_round > 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_error: Option<String>,
    /// What the failed attempt already spent, in USD: a retry would spend it again.
    #[serde(default)]
    pub spent_cost_usd: f64,
    /// The attempt created assets before failing, so a retry could duplicate them.
    #[serde(default)]
    pub created_assets: bool,
    /// The node's declaration says a rerun with the same inputs is harmless.
    pub retry_safe: bool,
    /// Streaming: the invocation already sent something downstream.
    #[serde(default)]
    pub emitted: bool,
}

impl Escalation {
    /// Checks a substitute against everything the node declared for its outputs (the
    /// check every decider and the kernel apply, see [`check_substitute`]).
    pub fn check_substitute(
        &self,
        outputs: &BTreeMap<String, Value>,
    ) -> Result<BTreeMap<String, Value>, String> {
        check_substitute(outputs, &self.declared_outputs)
    }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// One escalation and what became of it: the unit of audit, of replay and of the
/// `interventions` list in a run result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intervention {
    /// What the decider was shown.
    pub escalation: Escalation,
    /// The verdict the kernel applied.
    pub verdict: Verdict,
    /// Who made the applied verdict ([`DecidedBy::Kernel`] when it overruled).
    pub decided_by: DecidedBy,
    /// What deciding cost, in USD.
    #[serde(default)]
    pub cost_usd: f64,
    /// When the kernel overruled the handle: what the handle had asked for, and why it was
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overruled: Option<Overruled>,
    /// A substitute that failed runtime validation and went back to the decider (the
    /// verdict was not applied; the next intervention for this failure says what was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// A verdict the kernel refused, kept in the audit next to the one it applied instead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overruled {
    /// What the decider asked for.
    pub requested: Verdict,
    /// Who asked.
    pub requested_by: DecidedBy,
    /// Why it was refused (outside the allowed set, repairs exhausted...).
    pub why: String,
}

impl Intervention {
    /// The intervention as the JSON a run result's `interventions` and a decision
    /// event carry.
    pub fn to_json(&self) -> serde_json::Value {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Reads back what [`Intervention::to_json`] wrote (a recorded run's interventions,
    /// for replay).
    pub fn from_json(v: &serde_json::Value) -> Result<Self, serde_json::Error> {
        Intervention::deserialize(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineage_relation() {
        let st = |r: &str, i| LineageStep {
            root: r.into(),
            index: i,
        };
        // Itself and its ancestors.
        assert!(on_lineage(&[st("a", 1)], &[st("a", 1)]));
        assert!(on_lineage(&[], &[st("a", 1)]));
        assert!(on_lineage(&[st("a", 1)], &[st("a", 1), st("b", 4)]));
        // A sibling, a descendant, another fan-out's item.
        assert!(!on_lineage(&[st("a", 1)], &[st("a", 2)]));
        assert!(!on_lineage(&[st("a", 1)], &[]));
        assert!(!on_lineage(&[st("a", 1), st("b", 4)], &[st("a", 1)]));
        assert!(!on_lineage(&[st("b", 0)], &[st("a", 0)]));
    }
}
