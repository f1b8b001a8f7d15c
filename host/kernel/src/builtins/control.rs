//! The built-in controller and a built-in controlled node (seed 002, "Control events"),
//! so a graph drives a node per item of a list without any custom code.
//!
//! `heddle.run_each` runs the controlled node its control edge reaches once per item
//! of its `items`, each time with that item as a property override, and collects the
//! replies in item order. Every event is dispatched before the first reply is awaited,
//! so they are in flight together and the target answers them FIFO.
//!
//! `heddle.eval` is a controlled node: each `run` event evaluates its JSONata
//! `expression` over its inputs (`value`, and whatever the event overrides).

use std::collections::BTreeMap;

use heddle_core::expr::Expr;
use heddle_core::{NodeDecl, NodeMode, OutputDecl, PortDecl, PortType, Value};

use super::decl;
use crate::executor::{BoxFuture, Call, Executor, NodeError, Outputs};

/// The built-in controller's type name.
pub const RUN_EACH_TYPE: &str = "heddle.run_each";
/// The built-in controlled node's type name.
pub const EVAL_TYPE: &str = "heddle.eval";

pub(super) fn declarations() -> [NodeDecl; 2] {
    let mut run_each = decl(
        RUN_EACH_TYPE,
        "Run each",
        "Controller: runs the controlled node its control edge reaches once per item of `items` (the item overrides property `property`, or, without one, each item is an object of overrides) and collects the replies in item order.",
    );
    run_each.inputs = vec![
        PortDecl::new("items", PortType::list_of(PortType::Any))
            .required()
            .describe("One run event per item"),
    ];
    run_each.properties = vec![
        PortDecl::new("property", PortType::Str)
            .describe("The target property each item sets; empty: each item is an object of overrides"),
        PortDecl::new("target", PortType::Str)
            .describe("Which controlled node to run, when control edges reach several"),
        PortDecl::new("output", PortType::Str).describe(
            "Which output of the target to collect; empty: its only output, or all of them as an object",
        ),
    ];
    run_each.outputs = vec![
        OutputDecl::new("results", PortType::list_of(PortType::Any))
            .describe("One reply per item, in item order"),
    ];
    // Its own work is deterministic. A run of a target that is not retry-safe counts as
    // an asset of the invocation (so a supervisor offers no retry), and a durable run's
    // journal answers the events it had recorded when recovery runs it again.
    run_each.retry_safe = true;

    let mut eval = decl(
        EVAL_TYPE,
        "Evaluate",
        "Controlled: each run event evaluates the JSONata `expression` over the node's inputs (`value`, and whatever the event overrides) and replies with the result.",
    );
    eval.mode = NodeMode::Controlled;
    eval.inputs = vec![PortDecl::new("value", PortType::Any).describe("What `value` reads")];
    eval.properties = vec![
        PortDecl::new("expression", PortType::Str)
            .required()
            .describe("JSONata over `value` (and any other input)"),
    ];
    eval.outputs = vec![OutputDecl::new("result", PortType::Any)];
    eval.retry_safe = true;
    [run_each, eval]
}

/// `heddle.run_each`.
pub(super) struct RunEach;

impl Executor for RunEach {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let ctx = &call.ctx;
            let me = ctx.node_id();
            let controls = ctx.controls().ok_or_else(|| {
                NodeError::msg(format!(
                    "node {me} ({RUN_EACH_TYPE}) controls nothing: add a control edge from it to `__control__` of the node it should run"
                ))
            })?;
            let named = str_prop(&call.inputs, "target");
            let target = match named {
                Some(t) => t.to_string(),
                None => {
                    let all: Vec<&str> = controls.targets().collect();
                    match all.as_slice() {
                        [one] => one.to_string(),
                        _ => {
                            return Err(NodeError::msg(format!(
                                "node {me} ({RUN_EACH_TYPE}) controls nodes {}: set property `target` to the one to run",
                                all.join(", ")
                            )));
                        }
                    }
                }
            };
            let items = match call.inputs.get("items") {
                Some(Value::List(items)) => items.clone(),
                Some(other) => {
                    return Err(NodeError::msg(format!(
                        "node {me}: input `items` must be a list, got {}",
                        other.kind()
                    )));
                }
                None => {
                    return Err(NodeError::msg(format!(
                        "node {me}: input `items` is missing"
                    )));
                }
            };
            let property = str_prop(&call.inputs, "property");
            let output = str_prop(&call.inputs, "output");
            let outputs = controls.outputs(&target).unwrap_or_default();
            if let Some(o) = output
                && !outputs.iter().any(|name| name == o)
            {
                return Err(NodeError::msg(format!(
                    "node {me}: property `output` names `{o}`, which node {target} does not declare (it has: {})",
                    outputs.join(", ")
                )));
            }
            let mut replies = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let overrides = match (property, item) {
                    (Some(p), v) => BTreeMap::from([(p.to_string(), v.clone())]),
                    (None, Value::Object(m)) => (**m).clone(),
                    (None, v) => {
                        return Err(NodeError::msg(format!(
                            "node {me}: item {i} is {}, not an object of property overrides; set property `property` to the one each item sets",
                            v.kind()
                        )));
                    }
                };
                replies.push(ctx.dispatch_control(&target, overrides).await?);
            }
            let mut results = Vec::with_capacity(replies.len());
            for reply in replies {
                let out = reply.outputs().await?;
                results.push(match (output, outputs.as_slice()) {
                    (Some(o), _) => out.get(o).cloned().unwrap_or_default(),
                    (None, [only]) => out.get(only).cloned().unwrap_or_default(),
                    (None, _) => Value::object(out.to_map()),
                });
            }
            Ok(Outputs::one("results", Value::list(results)))
        })
    }
}

/// A string property, absent when empty.
fn str_prop<'a>(inputs: &'a crate::executor::Inputs, name: &str) -> Option<&'a str> {
    inputs
        .get(name)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
}

/// `heddle.eval`.
pub(super) struct Eval;

impl Executor for Eval {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let me = call.ctx.node_id();
            let text = call
                .inputs
                .get("expression")
                .and_then(|v| v.as_str())
                .ok_or_else(|| {
                    NodeError::msg(format!("node {me}: property `expression` is missing"))
                })?;
            let expr =
                Expr::compile(text).map_err(|e| NodeError::msg(format!("node {me}: {e}")))?;
            let scope = Value::object(
                call.inputs
                    .iter()
                    .filter(|(k, _)| !k.starts_with('_'))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            let v = expr
                .eval(&scope)
                .map_err(|e| NodeError::msg(format!("node {me}: {e}")))?;
            Ok(Outputs::one("result", v.unwrap_or_default()))
        })
    }
}

/// Planning-time check of `heddle.eval`'s expression: a typo is refused before any node
/// runs (an event may still override it, checked when it runs).
pub(super) fn check_eval(spec: &crate::executor::NodeSpec<'_>) -> Vec<heddle_core::ConfigProblem> {
    let Some(text) = spec.properties.get("expression").and_then(|v| v.as_str()) else {
        return Vec::new();
    };
    match Expr::compile(text) {
        Ok(_) => Vec::new(),
        Err(e) => vec![heddle_core::ConfigProblem {
            property: Some("expression".into()),
            message: e.to_string(),
        }],
    }
}
