//! Planning: every validation issue kind, bypass rewriting, and the static correlation
//! analysis on the shapes the runtime relies on. One test binary; this file holds the
//! fixtures the modules share.
//!
//! Graphs here are written as JSON documents, not with `GraphBuilder`, on purpose: these
//! tests are about what the planner makes of a document as read from a file (derived edge
//! ids, the `data` alias, duplicate ids, dangling ends), which the builder cannot express.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use heddle_core::plan::{HandleClass, InputError, IssueKind, Plan, ValidationError, plan};
use heddle_core::{
    DeclLookup, EdgeType, GraphDoc, NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl,
    PortType, Value,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

struct Decls(HashMap<String, Arc<NodeDecl>>);

impl DeclLookup for Decls {
    fn decl(&self, type_name: &str) -> Option<Arc<NodeDecl>> {
        self.0.get(type_name).cloned()
    }
    fn type_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.keys().cloned().collect();
        v.sort();
        v
    }
}

fn t(s: &str) -> PortType {
    s.parse().expect("test types are valid")
}

fn decl(name: &str, inputs: Vec<PortDecl>, outputs: Vec<OutputDecl>) -> NodeDecl {
    NodeDecl {
        inputs,
        outputs,
        ..NodeDecl::new(name)
    }
}

fn decls() -> Decls {
    let mut all = vec![
        // The built-in shapes, as the kernel declares them (kernel `builtins.rs`).
        NodeDecl {
            properties: vec![
                PortDecl::new("name", t("str")),
                PortDecl::new("type", t("str")),
                PortDecl::new("value", t("any")),
                PortDecl::new("streaming", t("bool")),
            ],
            ..decl(
                "heddle.input",
                vec![],
                vec![OutputDecl::new("value", t("any"))],
            )
        },
        NodeDecl {
            properties: vec![PortDecl::new("name", t("str"))],
            ..decl(
                "heddle.output",
                vec![PortDecl::new("value", t("any"))],
                vec![],
            )
        },
        NodeDecl {
            properties: vec![PortDecl::new("value", t("any"))],
            ..decl(
                "heddle.constant",
                vec![],
                vec![OutputDecl::new("value", t("any"))],
            )
        },
        decl(
            "heddle.foreach",
            vec![PortDecl::new("list", t("list[any]")).required()],
            vec![
                OutputDecl::new("item", t("any")).correlated(OutputCorrelation::Iteration {
                    group: Some("item".into()),
                }),
                OutputDecl::new("index", t("int")).correlated(OutputCorrelation::Iteration {
                    group: Some("item".into()),
                }),
            ],
        ),
        NodeDecl {
            mode: NodeMode::StreamingInput,
            ..decl(
                "heddle.collect",
                vec![PortDecl::new("item", t("any"))],
                vec![
                    OutputDecl::new("list", t("list[any]"))
                        .correlated(OutputCorrelation::Aggregate),
                ],
            )
        },
        decl(
            "heddle.passthrough",
            vec![PortDecl::new("value", t("any"))],
            vec![OutputDecl::new("value", t("any"))],
        ),
        // Test types.
        decl(
            "test.add",
            vec![
                PortDecl::new("a", t("int")).required(),
                PortDecl::new("b", t("int")).with_default(0i64),
            ],
            vec![OutputDecl::new("sum", t("int"))],
        ),
        decl(
            "test.scale",
            vec![
                PortDecl::new("x", t("float")).required(),
                PortDecl::new("factor", t("float")),
            ],
            vec![OutputDecl::new("y", t("float"))],
        ),
        decl(
            "test.upper",
            vec![PortDecl::new("text", t("str")).required()],
            vec![OutputDecl::new("text", t("str"))],
        ),
        decl("test.text", vec![], vec![OutputDecl::new("text", t("str"))]),
        decl(
            "test.sum",
            vec![PortDecl::new("values", t("list[int]"))],
            vec![OutputDecl::new("sum", t("int"))],
        ),
        decl(
            "test.chunks",
            vec![PortDecl::new("text", t("str"))],
            vec![OutputDecl::new("chunk", t("str")).correlated(OutputCorrelation::Chunk)],
        ),
        NodeDecl {
            is_join: true,
            ..decl(
                "test.zip",
                vec![PortDecl::new("a", t("any")), PortDecl::new("b", t("any"))],
                vec![OutputDecl::new("pair", t("any"))],
            )
        },
        decl(
            "test.pair",
            vec![PortDecl::new("a", t("any")), PortDecl::new("b", t("any"))],
            vec![OutputDecl::new("pair", t("any"))],
        ),
        NodeDecl {
            mode: NodeMode::Controlled,
            ..decl(
                "test.gate",
                vec![PortDecl::new("value", t("any")).required()],
                vec![OutputDecl::new("value", t("any"))],
            )
        },
        decl(
            "test.agent",
            vec![PortDecl::new("prompt", t("any"))],
            vec![],
        ),
        decl(
            "test.bad_aggregate",
            vec![PortDecl::new("item", t("any"))],
            vec![OutputDecl::new("all", t("list[any]")).correlated(OutputCorrelation::Aggregate)],
        ),
        decl(
            "test.forward",
            vec![
                PortDecl::new("item", t("any")),
                PortDecl::new("side", t("any")),
            ],
            vec![
                OutputDecl::new("out", t("any")).correlated(OutputCorrelation::Forward {
                    source: "side".into(),
                }),
            ],
        ),
        decl(
            "test.forward_unknown",
            vec![PortDecl::new("item", t("any"))],
            vec![
                OutputDecl::new("out", t("any")).correlated(OutputCorrelation::Forward {
                    source: "nope".into(),
                }),
            ],
        ),
        NodeDecl {
            mode: NodeMode::StreamingInput,
            ..decl(
                "test.join_text",
                vec![
                    PortDecl::new("item", t("any")),
                    PortDecl::new("sep", t("str")),
                ],
                vec![OutputDecl::new("text", t("str")).correlated(OutputCorrelation::Aggregate)],
            )
        },
        NodeDecl {
            dynamic_inputs: true,
            properties: vec![PortDecl::new("code", t("str")).required()],
            ..decl(
                "test.code",
                vec![],
                vec![OutputDecl::new("result", t("any"))],
            )
        },
    ];
    Decls(
        all.drain(..)
            .map(|d| (d.type_name.clone(), Arc::new(d)))
            .collect(),
    )
}

fn doc(v: serde_json::Value) -> GraphDoc {
    GraphDoc::parse(&v.to_string(), "test.json").expect("fixture documents parse")
}

fn ok(v: serde_json::Value) -> Plan {
    match plan(&doc(v), &decls()) {
        Ok(p) => p,
        Err(e) => panic!("expected a valid plan, got: {e}"),
    }
}

fn err(v: serde_json::Value) -> ValidationError {
    match plan(&doc(v), &decls()) {
        Ok(p) => panic!(
            "expected a validation error, got a plan with {} nodes",
            p.nodes.len()
        ),
        Err(e) => e,
    }
}

/// An issue as (node, edge, handle, message).
type Found<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, &'a str);

/// The issues of one kind.
fn of_kind(e: &ValidationError, kind: IssueKind) -> Vec<Found<'_>> {
    e.issues
        .iter()
        .filter(|i| i.kind == kind)
        .map(|i| {
            (
                i.node.as_deref(),
                i.edge.as_deref(),
                i.handle.as_deref(),
                i.message.as_str(),
            )
        })
        .collect()
}

fn node_idx(p: &Plan, id: &str) -> usize {
    p.nodes
        .iter()
        .position(|n| &*n.id == id)
        .unwrap_or_else(|| panic!("node {id} is in the plan"))
}

/// Scope of a node's invocation, as root names.
fn inv_scope(p: &Plan, id: &str) -> Vec<String> {
    names(p, &p.correlation.nodes[node_idx(p, id)].invocation_scope)
}

fn out_scope(p: &Plan, id: &str, handle: &str) -> Vec<String> {
    names(
        p,
        &p.correlation.nodes[node_idx(p, id)].outputs[handle].scope,
    )
}

fn names(p: &Plan, scope: &[u32]) -> Vec<String> {
    scope
        .iter()
        .map(|&r| p.correlation.roots[r as usize].name.to_string())
        .collect()
}

fn class(p: &Plan, id: &str, handle: &str) -> HandleClass {
    p.correlation.nodes[node_idx(p, id)].inputs[handle].class
}

fn n(id: &str, ty: &str) -> serde_json::Value {
    json!({"id": id, "type": ty})
}

fn np(id: &str, ty: &str, props: serde_json::Value) -> serde_json::Value {
    json!({"id": id, "type": ty, "properties": props})
}

fn ed(id: &str, s: &str, sh: &str, tg: &str, th: &str) -> serde_json::Value {
    json!({"id": id, "source": s, "sourceHandle": sh, "target": tg, "targetHandle": th})
}

fn ctl(id: &str, s: &str, tg: &str) -> serde_json::Value {
    json!({"id": id, "source": s, "sourceHandle": "__control__", "target": tg,
           "targetHandle": "__control__", "edge_type": "control"})
}

mod bypass;
mod correlation;
mod graphs;
mod inputs;
mod issues;
mod larger;
mod order;
