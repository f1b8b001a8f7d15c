//! The JSONata engine behind [`super::Expr`]: the one place that names the crate.
//!
//! `jsonata-core` was chosen by running the jsonata-js reference suite against the
//! candidate crates (`scripts/jsonata-suite`; figures in the README's "Node declarations"
//! section): it passed 1,654 of 1,657 cases (the other three need the suite's own depth
//! and time limits), against 79.0% for `seuil` and 75.4% for `jsonata-rs`. It also takes
//! a wall-clock limit, a stack-depth limit and a sequence-length limit per evaluation.

use jsonata_core::evaluator::{Context, Evaluator, EvaluatorOptions};
use jsonata_core::value::JValue;

use super::EVAL_LIMIT_MS;

/// Nesting an evaluation may reach (jsonata-js's `stack` option): deep enough for real
/// expressions, shallow enough that a runaway recursion ends with an error.
const MAX_STACK_DEPTH: usize = 500;
/// Items one intermediate sequence may hold (`[1..100000000]` must not eat the memory).
const MAX_SEQUENCE: usize = 1_000_000;

pub(super) struct Program(jsonata_core::ast::AstNode);

impl Program {
    pub(super) fn parse(text: &str) -> Result<Program, String> {
        jsonata_core::parser::parse(text)
            .map(Program)
            .map_err(|e| e.to_string())
    }

    /// `None` is undefined.
    pub(super) fn eval(
        &self,
        input: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, String> {
        let options = EvaluatorOptions {
            timeout_ms: Some(EVAL_LIMIT_MS),
            max_stack_depth: Some(MAX_STACK_DEPTH),
            max_sequence_length: Some(MAX_SEQUENCE),
            ..Default::default()
        };
        let mut evaluator = Evaluator::with_options(Context::new(), options);
        let out = evaluator
            .evaluate(&self.0, &JValue::from(input.clone()))
            .map_err(|e| e.to_string())?;
        if out.is_undefined() {
            return Ok(None);
        }
        // A result of plain data always serializes; a function does not.
        serde_json::to_value(&out)
            .map(Some)
            .map_err(|e| format!("the result is not a JSON value: {e}"))
    }
}

/// Functions refused at planning. `$eval` builds an expression at run time, which could
/// not be checked before the run; the others read the clock or randomness, which would
/// make a condition answer differently on a rerun of the same data (a durable run
/// re-routes recorded results through the same conditions after a crash).
pub(super) const REFUSED_FUNCTIONS: &[&str] =
    &["eval", "now", "millis", "random", "shuffle", "uuid"];
