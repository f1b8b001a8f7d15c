//! Declared output fields, enforced: a value on the promised output must be an object
//! carrying them. An invocation whose outputs break the promise fails like any other
//! failure, with its outputs as the candidate a supervisor may repair by substitution.
// NodeError is the seam's error type; its size is by design (it carries a candidate).
#![allow(clippy::result_large_err)]

use heddle_core::Value;

use super::{Actor, Stop};
use crate::executor::{NodeError, Outputs};

/// The failure signature of a broken promise (stable, for supervisor policies).
pub(crate) const CONTRACT_SIGNATURE: &str = "output:contract";

impl Actor {
    /// What a broken promise reads as: output, the contract and the violation (the
    /// failure path puts the node in front).
    fn broken(&self, value: &Value) -> Option<String> {
        let c = self.spec.contract()?;
        c.contract.check(value).err().map(|v| {
            format!(
                "output contract on `{}` {} broken: {v}",
                c.handle,
                c.contract.summary()
            )
        })
    }

    /// `out`, or the failure its promised output makes.
    pub(super) fn keep_promise(&self, out: Outputs) -> Result<Outputs, NodeError> {
        let Some(c) = self.spec.contract() else {
            return Ok(out);
        };
        let broken = out
            .iter()
            .filter(|(h, _)| **h == *c.handle)
            .find_map(|(_, v)| self.broken(v));
        match broken {
            None => Ok(out),
            Some(message) => Err(NodeError::msg(message)
                .with_signature(CONTRACT_SIGNATURE)
                .with_candidate(out)),
        }
    }

    /// A value a streaming node emits on the promised output: emitted values cannot be
    /// substituted, so a broken promise stops the node.
    pub(super) fn keep_emitted_promise(&self, handle: &str, value: &Value) -> Result<(), Stop> {
        match self.spec.contract() {
            Some(c) if *c.handle == *handle => match self.broken(value) {
                Some(m) => Err(Stop::Failed(format!(
                    "node \"{}\" (type {}) failed: {m}",
                    self.spec.id, self.spec.node_type
                ))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_contract_signature_keeps_the_signature_grammar() {
        heddle_core::supervise::signatures::check_declared(super::CONTRACT_SIGNATURE).unwrap();
    }
}
