//! A node value holding one of the run's known secret values (a `[secrets]` value, a
//! granted secret, the supervisor's key, one a node registered) is refused in every run,
//! durable or not: its node fails with `KNOWN_SECRET` and the value goes nowhere, neither
//! downstream nor into the run's outputs, report or log. A run hands a secret to the node
//! that needs it by name (a grant); as a node's value it would be printed, stored and fed
//! on. (A durable run's store refuses such a value too, as it records it.)
//!
//! The values checked are those a node's own code hands out (a WASM guest, a code node,
//! any executor that is not a built-in). A built-in only passes on what it was given (an
//! input, a constant of the graph, an upstream value already checked), and a durable run
//! neither records a built-in's results (it recomputes them) nor starts with an input
//! holding a known secret.

use heddle_core::Value;

use super::{Actor, Stop};

impl Actor {
    /// `Err` stops the node when one of the `values` it hands out (returned, or emitted
    /// along an edge; by handle) holds a known secret. Costs one atomic load in a run
    /// that knows none.
    pub(super) fn refuse_known_secrets<'a>(
        &self,
        values: impl IntoIterator<Item = (&'a str, &'a Value)>,
    ) -> Result<(), Stop> {
        if self.native {
            return Ok(());
        }
        for (handle, v) in values {
            if self.shared.secrets.holds(v) {
                return Err(Stop::Failed(format!(
                    "node \"{id}\" (type {ty}) failed: output `{handle}` of node {id} holds a known secret value and was refused (a run hands a secret to a node by name, as a grant, never as a node's value); KNOWN_SECRET",
                    id = self.spec.id,
                    ty = self.spec.node_type,
                    handle = heddle_core::text::clip(handle, heddle_core::text::ECHO_MAX_CHARS),
                )));
            }
        }
        Ok(())
    }
}
