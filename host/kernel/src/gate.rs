//! The gate node (`heddle.gate`): reaching it suspends the run, with no provider call and
//! no instance, until a person approves it. An approved gate passes its `value` on; a
//! rejected one never runs again (the run store cancels the run).
//!
//! The decision reaches the executor from the run's options
//! ([`crate::RunOptions::approved_gates`]), read from the durable run's log by whoever
//! resumes it, so a node can never approve itself.

use std::sync::Arc;

use heddle_core::gate::{GATE_TYPE, GateAsk};
use heddle_core::{LogLevel, NodeDecl, OutputDecl, PortDecl, PortType, Value};

use crate::executor::{BoxFuture, Call, Executor, NodeError, NodeSpec, Outputs};

/// The gate's declaration (a built-in).
pub fn declaration() -> NodeDecl {
    let mut d = NodeDecl::new(GATE_TYPE);
    d.title = "Gate".into();
    d.description = "Pauses a durable run until a person approves (`heddle runs approve`) or \
        rejects (`heddle runs reject`) it; approved, it passes `value` on."
        .into();
    d.origin = heddle_core::Origin::Builtin;
    d.inputs = vec![
        PortDecl::new("value", PortType::Any)
            .describe("The upstream work under review, passed on once approved"),
    ];
    d.outputs = vec![OutputDecl::new("value", PortType::Any)];
    d.properties = vec![
        PortDecl::new("title", PortType::Str)
            .required()
            .describe("What is being decided, shown to the reviewer and in a rejection"),
        PortDecl::new("prompt", PortType::Str).describe("What the reviewer should check"),
    ];
    // Waiting again is harmless: asking twice changes nothing.
    d.retry_safe = true;
    d
}

/// A gate of one run: unanswered, or approved with the reviewer's note.
pub(crate) struct Gate {
    ask: GateAsk,
    approved: Option<String>,
}

impl Gate {
    pub(crate) fn executor(spec: &NodeSpec<'_>, approved: Option<&String>) -> Arc<dyn Executor> {
        let text = |k: &str| {
            spec.properties
                .get(k)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        Arc::new(Gate {
            ask: GateAsk {
                // Planning refused a gate without a title; the id stands in for direct use.
                title: text("title").unwrap_or_else(|| spec.id.to_string()),
                prompt: text("prompt"),
            },
            approved: approved.cloned(),
        })
    }
}

impl Executor for Gate {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        let r = match &self.approved {
            Some(note) => {
                let note = if note.is_empty() {
                    String::new()
                } else {
                    format!(": {note}")
                };
                call.ctx.log(
                    LogLevel::Info,
                    format!("gate \"{}\" approved{note}", self.ask.title),
                );
                let v = call.inputs.get("value").cloned().unwrap_or(Value::Null);
                Ok(Outputs::one("value", v))
            }
            None => Err(NodeError::suspend(self.ask.reason(), self.ask.to_state())),
        };
        Box::pin(std::future::ready(r))
    }
}
