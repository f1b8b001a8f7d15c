//! Declared input types, enforced before the node's code sees a value. Planning already
//! refuses an edge between incompatible typed ports; what it cannot see is a value from
//! an `any` (or `json`) output, an untyped `heddle.input` above all, reaching a typed
//! input: a Python or JavaScript guest would compute on `"7"` where it declared an int.
//! So every value on a typed input is checked (and widened, int to float) before an
//! invocation, as the WASM host checks every output after one. A value that does not fit
//! fails the invocation without running it (signature `input:type`, escalated like any
//! failure, never retried: the same value fails the same check).
//!
//! Only typed inputs of nodes whose own code runs are checked (`ActorSpec::typed_inputs`,
//! empty for a node whose inputs are all `any` and for a built-in, which handles every
//! value it is given): a node with nothing to check pays one length test.
// NodeError is the seam's error type; its size is by design (it carries a candidate).
#![allow(clippy::result_large_err)]

use heddle_core::supervise::signatures::INPUT_TYPE;
use heddle_core::{PortType, Value};

use super::{Actor, Stop};
use crate::executor::{ErrorKind, Inputs, NodeError};

/// `v` widened to `ty` (int to float), or what is wrong with it. Null passes: it is how
/// an upstream says "no value", and the node's own required/default rules apply to it.
fn fit(ty: &PortType, v: &mut Value) -> Result<(), String> {
    if matches!(v, Value::Null) {
        return Ok(());
    }
    if matches!((ty, &*v), (PortType::Float, Value::Int(_))) {
        *v = ty.coerce(std::mem::take(v));
    }
    ty.check(v)
}

impl Actor {
    /// Checks the values an invocation is about to get on the node's typed inputs.
    pub(super) fn check_inputs(&self, inputs: &mut Inputs) -> Result<(), NodeError> {
        for (name, ty) in self.spec.typed_inputs().iter() {
            if let Some(v) = inputs.get_mut(&**name)
                && let Err(why) = fit(ty, v)
            {
                return Err(self.misfit(name, ty, &why));
            }
        }
        Ok(())
    }

    /// Checks one value arriving on input `handle` of a live stream session (a
    /// streaming-input node reads its items itself, so a misfit stops the node).
    pub(super) fn check_item(&self, handle: &str, v: &mut Value) -> Result<(), Stop> {
        match self
            .spec
            .typed_inputs()
            .iter()
            .find(|(n, _)| **n == *handle)
        {
            Some((name, ty)) => fit(ty, v).map_err(|why| {
                Stop::Failed(format!(
                    "node \"{}\" (type {}) failed: {} (signature {INPUT_TYPE})",
                    self.spec.id,
                    self.spec.node_type,
                    self.misfit(name, ty, &why).message
                ))
            }),
            None => Ok(()),
        }
    }

    fn misfit(&self, name: &str, ty: &PortType, why: &str) -> NodeError {
        NodeError::new(
            ErrorKind::Input,
            format!(
                "input `{name}` is declared `{ty}`, but the value it received does not fit ({why}); the node was not invoked"
            ),
        )
        .with_signature(INPUT_TYPE)
    }
}
