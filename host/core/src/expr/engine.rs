//! The JSONata engine behind [`super::Expr`]: the one place that names the crate.
//!
//! `jsonata-core` was chosen by running the jsonata-js reference suite against the
//! candidate crates (`scripts/jsonata-suite`; figures in the README's "Node declarations"
//! section): it passed 1,654 of 1,657 cases (the other three need the suite's own depth
//! and time limits), against 79.0% for `seuil` and 75.4% for `jsonata-rs`. It also takes
//! a wall-clock limit, a stack-depth limit and a sequence-length limit per evaluation.

use jsonata_core::ast::AstNode;
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

impl Program {
    /// The paths read from the expression's input, each as its leading names.
    pub(super) fn reads(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        reads(&self.0, 0, &mut out);
        out
    }
}

/// Levels of the tree [`reads`] descends: what it finds feeds advisory warnings only, so
/// a deeper part is left unread rather than risking the stack on a pathological tree.
const READS_DEPTH: usize = 200;

/// The paths `node` reads from the input it is evaluated against (the scope, at the top
/// of an expression). Only the places evaluated against that same input are descended:
/// operands, arguments, branches, constructors. A path's later steps and predicates, and
/// a lambda's body, are evaluated against something else, and are not read here.
fn reads(node: &AstNode, depth: usize, out: &mut Vec<Vec<String>>) {
    if depth > READS_DEPTH {
        return;
    }
    let mut each = |n: &AstNode| reads(n, depth + 1, out);
    match node {
        AstNode::Name(n) => out.push(vec![n.clone()]),
        AstNode::Path { steps } => {
            let mut names = Vec::new();
            for step in steps {
                let AstNode::Name(n) = &step.node else { break };
                names.push(n.clone());
                // `fields[...]`: what follows is read from what the predicate kept.
                if !step.stages.is_empty() {
                    break;
                }
            }
            match steps.first() {
                Some(_) if !names.is_empty() => out.push(names),
                // `(a or b).c`, `$f(x).y`: the first step reads the input itself.
                Some(first) => each(&first.node),
                None => {}
            }
        }
        AstNode::Binary { lhs, rhs, .. } => {
            each(lhs);
            each(rhs);
        }
        AstNode::Unary { operand, .. } => each(operand),
        AstNode::Function { args, .. } => args.iter().for_each(each),
        AstNode::Call { procedure, args } => {
            each(procedure);
            args.iter().for_each(each);
        }
        AstNode::Conditional {
            condition,
            then_branch,
            else_branch,
        } => {
            each(condition);
            each(then_branch);
            if let Some(e) = else_branch {
                each(e);
            }
        }
        AstNode::Block(items) | AstNode::Array(items) => items.iter().for_each(each),
        AstNode::Object(pairs) => pairs.iter().for_each(|(k, v)| {
            each(k);
            each(v);
        }),
        AstNode::ObjectTransform { input, .. } | AstNode::Sort { input, .. } => each(input),
        _ => {}
    }
}

/// Functions refused at planning. `$eval` builds an expression at run time, which could
/// not be checked before the run; the others read the clock or randomness, which would
/// make a condition answer differently on a rerun of the same data (a durable run
/// re-routes recorded results through the same conditions after a crash).
pub(super) const REFUSED_FUNCTIONS: &[&str] =
    &["eval", "now", "millis", "random", "shuffle", "uuid"];
