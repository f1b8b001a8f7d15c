//! `heddle.check`: one JSONata assertion over what the node's incoming edges delivered.
//! Deterministic validation by the engine itself: no provider call, no WASM instance.
//!
//! Its scope is `upstream.<node-id>.output` (the value) and, for an object value,
//! `upstream.<node-id>.fields.<key>`. Each input is named after the node feeding it, so
//! the expression names nodes, not handles.
// NodeError is the seam's error type; its size is by design (it carries a candidate).
#![allow(clippy::result_large_err)]

use heddle_core::expr::Expr;
use heddle_core::{ConfigProblem, Map, Value};

use crate::executor::{BoxFuture, Call, ErrorKind, Executor, Inputs, NodeError, NodeSpec, Outputs};

/// The failure signature of an assertion that did not hold.
pub const CHECK_FAILED: &str = "check:failed";

pub(super) struct Check {
    expr: Expr,
    message: Option<String>,
}

fn assertion(spec: &NodeSpec<'_>) -> Result<Expr, ConfigProblem> {
    let text = spec
        .properties
        .get("assert")
        .and_then(Value::as_str)
        .ok_or_else(|| ConfigProblem {
            property: Some("assert".into()),
            message: "a check needs its `assert` expression".into(),
        })?;
    Expr::compile(text).map_err(|e| ConfigProblem {
        property: Some("assert".into()),
        message: e.to_string(),
    })
}

pub(super) fn problems(spec: &NodeSpec<'_>) -> Vec<ConfigProblem> {
    assertion(spec).err().into_iter().collect()
}

impl Check {
    pub(super) fn new(spec: &NodeSpec<'_>) -> Result<Check, NodeError> {
        let expr = assertion(spec).map_err(|p| NodeError::host(p.message))?;
        let message = spec
            .properties
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Check { expr, message })
    }

    fn judge(&self, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let mut upstream = Map::new();
        let mut delivered = Map::new();
        for (node, v) in inputs {
            delivered.insert(node.clone(), v.clone());
            let mut entry = Map::new();
            if v.as_object().is_some() {
                entry.insert("fields".into(), v.clone());
            }
            entry.insert("output".into(), v.clone());
            upstream.insert(node.clone(), Value::object(entry));
        }
        let mut scope = Map::new();
        scope.insert("upstream".into(), Value::object(upstream));
        let scope = Value::object(scope);
        match self.expr.test(&scope) {
            Ok(true) => Ok(Outputs::one("output", Value::object(delivered))),
            Ok(false) => {
                let why = match &self.message {
                    Some(m) => format!("check failed: {m} (`{}` is false)", self.expr.text()),
                    None => format!("check failed: `{}` is false", self.expr.text()),
                };
                Err(NodeError::new(ErrorKind::Assertion, why).with_signature(CHECK_FAILED))
            }
            // Deterministic too: the same data cannot be evaluated the next time either.
            Err(e) => Err(NodeError::new(
                ErrorKind::Assertion,
                format!("check could not be evaluated: {e}"),
            )
            .with_signature(CHECK_FAILED)),
        }
    }
}

impl Executor for Check {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        let mut inputs = call.inputs;
        inputs.remove("assert");
        inputs.remove("message");
        Box::pin(std::future::ready(self.judge(&inputs)))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_check_signature_keeps_the_signature_grammar() {
        heddle_core::supervise::signatures::check_declared(super::CHECK_FAILED).unwrap();
    }
}
