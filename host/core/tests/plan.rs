//! Planning: every validation issue kind, bypass rewriting, and the static correlation
//! analysis on the shapes the runtime relies on.

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

// ---------------------------------------------------------------------------------------
// A valid graph
// ---------------------------------------------------------------------------------------

#[test]
fn valid_chain_is_planned_in_topological_order_with_consistent_indices() {
    // Listed out of order on purpose.
    let p = ok(json!({
        "nodes": [
            np("out", "heddle.output", json!({"name": "result"})),
            n("up", "test.upper"),
            np("in", "heddle.input", json!({"name": "text", "type": "str"})),
        ],
        "edges": [ed("e2", "up", "text", "out", "value"), ed("e1", "in", "value", "up", "text")]
    }));
    let ids: Vec<&str> = p.nodes.iter().map(|n| &*n.id).collect();
    assert_eq!(ids, ["in", "up", "out"]);
    for (ei, edge) in p.edges.iter().enumerate() {
        assert!(
            p.nodes[edge.source as usize]
                .out_edges
                .contains(&(ei as u32))
        );
        assert!(
            p.nodes[edge.target as usize]
                .in_edges
                .contains(&(ei as u32))
        );
        assert!(edge.source < edge.target, "topological order");
    }
    assert_eq!(&*p.nodes[0].name, "text");
    assert_eq!(&*p.nodes[1].name, "up");
    assert_eq!(&*p.nodes[2].name, "result");
    assert_eq!(p.correlation.nodes.len(), 3);
    assert_eq!(p.correlation.edges.len(), 2);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn properties_drop_values_for_edge_fed_handles_and_nulls_and_widen_ints() {
    let p = ok(json!({
        "nodes": [
            np("c", "heddle.constant", json!({"value": 2})),
            {"id": "s", "type": "test.scale", "name": "Scaler",
             "data": {"x": 1.5, "factor": 3, "name": "ignored"}},
            np("a", "test.add", json!({"a": 1, "b": null})),
        ],
        "edges": [ed("e1", "c", "value", "s", "x")]
    }));
    let s = &p.nodes[node_idx(&p, "s")];
    assert_eq!(&*s.name, "Scaler", "doc name wins over properties.name");
    assert!(
        !s.properties.contains_key("x"),
        "edge-fed handle loses its static value"
    );
    assert_eq!(s.properties["factor"], Value::Float(3.0));
    let a = &p.nodes[node_idx(&p, "a")];
    assert!(!a.properties.contains_key("b"), "null means unset");
    assert_eq!(a.properties["a"], Value::Int(1));
}

// ---------------------------------------------------------------------------------------
// One test per issue kind
// ---------------------------------------------------------------------------------------

#[test]
fn duplicate_node_id() {
    let e = err(json!({"nodes": [n("a", "heddle.constant"), n("a", "heddle.constant")]}));
    let d = of_kind(&e, IssueKind::DuplicateNodeId);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].0, Some("a"));
}

#[test]
fn duplicate_edge_id_including_derived_ids() {
    let e = err(json!({
        "nodes": [n("a", "heddle.constant"), n("b", "test.sum")],
        "edges": [
            ed("x", "a", "value", "b", "values"), ed("x", "a", "value", "b", "values"),
            {"source": "a", "sourceHandle": "value", "target": "b", "targetHandle": "values"},
            {"source": "a", "sourceHandle": "value", "target": "b", "targetHandle": "values"},
        ]
    }));
    let d = of_kind(&e, IssueKind::DuplicateEdgeId);
    let ids: Vec<_> = d.iter().map(|i| i.1.unwrap()).collect();
    assert_eq!(ids, ["x", "a:value->b:values"]);
}

#[test]
fn dangling_edge_names_the_edge_and_the_missing_end() {
    let e = err(json!({
        "nodes": [n("a", "heddle.constant")],
        "edges": [ed("e1", "a", "value", "ghost", "value"), ed("e2", "nobody", "x", "a", "y")]
    }));
    let d = of_kind(&e, IssueKind::DanglingEdge);
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].1, Some("e1"));
    assert!(d[0].3.contains("target node `ghost`"), "{}", d[0].3);
    assert!(d[1].3.contains("source node `nobody`"), "{}", d[1].3);
}

#[test]
fn unknown_node_type_suggests_a_close_name() {
    let e = err(json!({"nodes": [n("a", "heddle.constnt"), n("b", "zzz.nothing")]}));
    let d = of_kind(&e, IssueKind::UnknownNodeType);
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].0, Some("a"));
    assert!(
        d[0].3.contains("did you mean `heddle.constant`"),
        "{}",
        d[0].3
    );
    assert!(!d[1].3.contains("did you mean"), "{}", d[1].3);
}

#[test]
fn unknown_input_and_output_handles() {
    let e = err(json!({
        "nodes": [n("a", "heddle.constant"), n("b", "test.upper")],
        "edges": [ed("e1", "a", "valeu", "b", "text"), ed("e2", "a", "value", "b", "txt")]
    }));
    let o = of_kind(&e, IssueKind::UnknownOutputHandle);
    assert_eq!(o, [(Some("a"), Some("e1"), Some("valeu"), o[0].3)]);
    assert!(o[0].3.contains("did you mean `value`"), "{}", o[0].3);
    let i = of_kind(&e, IssueKind::UnknownInputHandle);
    assert_eq!(i, [(Some("b"), Some("e2"), Some("txt"), i[0].3)]);
    assert!(i[0].3.contains("did you mean `text`"), "{}", i[0].3);
}

#[test]
fn unknown_property_but_name_is_allowed_everywhere() {
    let e = err(json!({
        "nodes": [np("b", "test.upper", json!({"text": "x", "name": "Shout", "colour": "red"}))]
    }));
    let d = of_kind(&e, IssueKind::UnknownProperty);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].0, d[0].2), (Some("b"), Some("colour")));
}

#[test]
fn type_mismatch_names_both_ports_and_types() {
    let e = err(json!({
        "nodes": [n("t", "test.text"), n("a", "test.add"), n("s", "test.scale"), n("a2", "test.add")],
        "edges": [
            ed("bad", "t", "text", "a", "a"),
            ed("widen", "a", "sum", "s", "x"),     // int -> float is fine
            ed("narrow", "s", "y", "a2", "a"),     // float -> int is not
        ]
    }));
    let d = of_kind(&e, IssueKind::TypeMismatch);
    assert_eq!(d.len(), 2, "{e}");
    assert_eq!(d[0].1, Some("bad"));
    assert!(
        d[0].3.contains("t.text") && d[0].3.contains("(str)"),
        "{}",
        d[0].3
    );
    assert!(
        d[0].3.contains("a.a") && d[0].3.contains("(int)"),
        "{}",
        d[0].3
    );
    assert_eq!(d[1].1, Some("narrow"));
}

#[test]
fn property_values_are_checked_against_the_port_type() {
    let e = err(json!({
        "nodes": [np("a", "test.add", json!({"a": "one"})), np("i", "heddle.input", json!({"streaming": "yes"}))]
    }));
    let d = of_kind(&e, IssueKind::InvalidProperty);
    assert_eq!(d.len(), 2, "{e}");
    assert_eq!((d[0].0, d[0].2), (Some("a"), Some("a")));
    assert!(d[0].3.contains("expected int"), "{}", d[0].3);
    assert_eq!((d[1].0, d[1].2), (Some("i"), Some("streaming")));
}

#[test]
fn data_cycle_names_its_nodes_and_self_loop_names_the_edge() {
    let e = err(json!({
        "nodes": [n("a", "heddle.passthrough"), n("b", "heddle.passthrough"),
                  n("c", "heddle.passthrough"), n("s", "heddle.passthrough")],
        "edges": [ed("ab", "a", "value", "b", "value"), ed("bc", "b", "value", "c", "value"),
                  ed("ca", "c", "value", "a", "value"), ed("ss", "s", "value", "s", "value")]
    }));
    let c = of_kind(&e, IssueKind::Cycle);
    assert_eq!(c.len(), 1);
    assert!(c[0].3.contains("a -> b -> c -> a"), "{}", c[0].3);
    let s = of_kind(&e, IssueKind::SelfLoop);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].0, s[0].1), (Some("s"), Some("ss")));
}

#[test]
fn control_edges_must_target_control_handle_of_a_controlled_node() {
    let e = err(json!({
        "nodes": [n("agent", "test.agent"), np("g", "test.gate", json!({"value": 1})),
                  np("u", "test.upper", json!({"text": "x"}))],
        "edges": [
            {"id": "c1", "source": "agent", "sourceHandle": "__control__", "target": "g",
             "targetHandle": "value", "edge_type": "control"},
            ctl("c2", "agent", "u"),
            {"id": "d1", "source": "agent", "sourceHandle": "__control__", "target": "g",
             "targetHandle": "__control__"},
            ctl("ok", "agent", "g"),
        ]
    }));
    let d = of_kind(&e, IssueKind::ControlHandle);
    let edges: Vec<_> = d.iter().map(|i| i.1.unwrap()).collect();
    assert_eq!(edges, ["c1", "c2", "d1"], "{e}");
    assert!(d[1].3.contains("not a controlled node"), "{}", d[1].3);
    assert!(d[2].3.contains("edge_type"), "{}", d[2].3);
}

#[test]
fn control_cycle() {
    let e = err(json!({
        "nodes": [np("g1", "test.gate", json!({"value": 1})), np("g2", "test.gate", json!({"value": 2}))],
        "edges": [
            {"id": "a", "source": "g1", "sourceHandle": "value", "target": "g2",
             "targetHandle": "__control__", "edge_type": "control"},
            {"id": "b", "source": "g2", "sourceHandle": "value", "target": "g1",
             "targetHandle": "__control__", "edge_type": "control"},
        ]
    }));
    let d = of_kind(&e, IssueKind::ControlCycle);
    assert_eq!(d.len(), 1, "{e}");
    assert!(d[0].3.contains("g1 -> g2 -> g1"), "{}", d[0].3);
    assert!(of_kind(&e, IssueKind::Cycle).is_empty());

    let e = err(json!({
        "nodes": [np("g", "test.gate", json!({"value": 1}))],
        "edges": [ctl("self", "g", "g")]
    }));
    let d = of_kind(&e, IssueKind::SelfLoop);
    assert_eq!((d[0].0, d[0].1), (Some("g"), Some("self")), "{e}");
    assert!(d[0].3.starts_with("control edge"), "{}", d[0].3);
}

#[test]
fn several_edges_into_a_non_list_input_but_a_list_input_accumulates() {
    let e = err(json!({
        "nodes": [n("a", "heddle.constant"), n("b", "heddle.constant"),
                  n("u", "test.upper"), n("s", "test.sum")],
        "edges": [ed("e1", "a", "value", "u", "text"), ed("e2", "b", "value", "u", "text"),
                  ed("e3", "a", "value", "s", "values"), ed("e4", "b", "value", "s", "values")]
    }));
    let d = of_kind(&e, IssueKind::MultipleEdgesIntoInput);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!((d[0].0, d[0].2), (Some("u"), Some("text")));
    assert!(d[0].3.contains("e1") && d[0].3.contains("e2"), "{}", d[0].3);

    let p = ok(json!({
        "nodes": [n("a", "heddle.constant"), n("b", "heddle.constant"), n("s", "test.sum")],
        "edges": [ed("e3", "a", "value", "s", "values"), ed("e4", "b", "value", "s", "values")]
    }));
    let h = &p.correlation.nodes[node_idx(&p, "s")].inputs["values"];
    assert!(h.accumulates);
    assert_eq!(h.upstream_edges, 2);
}

#[test]
fn missing_required_input() {
    let e = err(json!({
        "nodes": [n("a", "test.add"), np("b", "test.add", json!({"a": 1})),
                  n("c", "heddle.constant"), n("d", "test.add")],
        "edges": [ed("e1", "c", "value", "d", "a")]
    }));
    let d = of_kind(&e, IssueKind::MissingRequiredInput);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!((d[0].0, d[0].2), (Some("a"), Some("a")));
}

#[test]
fn required_input_of_a_controlled_node_may_come_from_its_controller() {
    ok(json!({
        "nodes": [n("agent", "test.agent"), n("g", "test.gate")],
        "edges": [ctl("c", "agent", "g")]
    }));
    // Without a controller it runs as a buffered node: planned, with a warning.
    let p = ok(json!({"nodes": [n("g", "test.gate")]}));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert_eq!(p.warnings[0].handle.as_deref(), Some("__control__"));
}

#[test]
fn dynamic_inputs_accept_undeclared_handles_and_properties() {
    let p = ok(json!({
        "nodes": [n("c", "heddle.constant"),
                  np("py", "test.code", json!({"code": "x + y", "y": 2}))],
        "edges": [ed("e1", "c", "value", "py", "x")]
    }));
    let py = node_idx(&p, "py");
    assert_eq!(p.nodes[py].properties["y"], Value::Int(2));
    assert!(p.correlation.nodes[py].inputs.contains_key("x"));
    let e = err(json!({"nodes": [n("py", "test.code")]}));
    assert_eq!(
        of_kind(&e, IssueKind::MissingRequiredInput)[0].2,
        Some("code")
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let e = err(json!({
        "nodes": [
            n("a", "heddle.constant"), n("a", "heddle.constant"),
            n("x", "no.such.type"),
            np("u", "test.upper", json!({"shout": true})),
            n("add", "test.add"),
            n("p", "heddle.passthrough"), n("q", "heddle.passthrough"),
        ],
        "edges": [
            ed("dangle", "a", "value", "missing", "value"),
            ed("hdl", "a", "value", "u", "nope"),
            ed("ty", "u", "text", "add", "a"),
            ed("pq", "p", "value", "q", "value"), ed("qp", "q", "value", "p", "value"),
        ]
    }));
    let kinds: std::collections::HashSet<IssueKind> = e.issues.iter().map(|i| i.kind).collect();
    for k in [
        IssueKind::DuplicateNodeId,
        IssueKind::DanglingEdge,
        IssueKind::UnknownNodeType,
        IssueKind::UnknownInputHandle,
        IssueKind::UnknownProperty,
        IssueKind::TypeMismatch,
        IssueKind::Cycle,
        IssueKind::MissingRequiredInput,
    ] {
        assert!(kinds.contains(&k), "{k:?} missing from:\n{e}");
    }
    let text = e.to_string();
    // Shown with --nocapture: what a user reads for a badly broken graph.
    eprintln!("{text}");
    assert!(
        text.starts_with(&format!("graph is invalid ({} problems)", e.issues.len())),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------
// Bypass
// ---------------------------------------------------------------------------------------

#[test]
fn bypassed_node_is_replaced_by_a_wire_keeping_the_outgoing_edge_id() {
    let p = ok(json!({
        "nodes": [
            n("t", "test.text"),
            {"id": "u", "type": "test.upper", "ui_properties": {"bypassed": true}},
            n("o", "heddle.output"),
        ],
        "edges": [ed("in", "t", "text", "u", "text"), ed("out", "u", "text", "o", "value")]
    }));
    assert_eq!(p.nodes.len(), 2);
    assert_eq!(p.edges.len(), 1);
    let edge = &p.edges[0];
    assert_eq!(&*edge.id, "out");
    assert_eq!(&*p.nodes[edge.source as usize].id, "t");
    assert_eq!(&*edge.source_handle, "text");
}

#[test]
fn bypass_chains_collapse_and_prefer_the_matching_handle() {
    let p = ok(json!({
        "nodes": [
            n("c", "heddle.constant"), n("t", "test.text"),
            {"id": "b1", "type": "test.pair", "ui_properties": {"bypassed": true}},
            {"id": "b2", "type": "heddle.passthrough", "ui_properties": {"bypassed": true}},
            n("o", "heddle.output"),
        ],
        "edges": [
            ed("ca", "c", "value", "b1", "a"),
            ed("tb", "t", "text", "b1", "b"),
            // b1's output is named `pair`, so no handle matches and the first compatible
            // input (`a`) wins; b2's output `value` matches its input `value`.
            ed("b1b2", "b1", "pair", "b2", "value"),
            ed("b2o", "b2", "value", "o", "value"),
        ]
    }));
    assert_eq!(p.edges.len(), 1);
    let edge = &p.edges[0];
    assert_eq!(&*edge.id, "b2o");
    assert_eq!(&*p.nodes[edge.source as usize].id, "c");

    // With a matching handle name, that input wins over the first one.
    let p = ok(json!({
        "nodes": [
            n("c", "heddle.constant"), n("t", "test.text"),
            {"id": "b", "type": "test.pair", "ui_properties": {"bypassed": true}},
            n("o", "heddle.output"),
        ],
        "edges": [ed("ca", "c", "value", "b", "a"), ed("tb", "t", "text", "b", "b"),
                  ed("bo", "b", "b", "o", "value")]
    }));
    assert_eq!(&*p.nodes[p.edges[0].source as usize].id, "t");
}

#[test]
fn bypass_drops_incompatible_and_control_edges_with_warnings() {
    // The only input of the bypassed node carries str; its consumer wants int, so the
    // edge is dropped, and the consumer's required input is then missing.
    let e = err(json!({
        "nodes": [
            n("t", "test.text"),
            {"id": "u", "type": "test.upper", "ui_properties": {"bypassed": true}},
            n("a", "test.add"),
        ],
        "edges": [ed("tu", "t", "text", "u", "text"), ed("ua", "u", "text", "a", "a")]
    }));
    assert_eq!(of_kind(&e, IssueKind::MissingRequiredInput)[0].0, Some("a"));

    let p = ok(json!({
        "nodes": [
            n("agent", "test.agent"), n("t", "test.text"),
            {"id": "g", "type": "test.gate", "ui_properties": {"bypassed": true}},
            n("add", "test.sum"), n("o", "heddle.output"),
        ],
        "edges": [ctl("c", "agent", "g"), ed("tg", "t", "text", "g", "value"),
                  ed("go", "g", "value", "o", "value"), ed("ga", "g", "value", "add", "values")]
    }));
    let dropped: Vec<_> = p
        .warnings
        .iter()
        .map(|w| (w.kind, w.edge.as_deref().unwrap()))
        .collect();
    assert_eq!(
        dropped,
        [
            (IssueKind::BypassDroppedEdge, "c"),
            (IssueKind::BypassDroppedEdge, "ga")
        ]
    );
    assert_eq!(p.edges.len(), 1);
    assert_eq!(&*p.edges[0].id, "go");
}

// ---------------------------------------------------------------------------------------
// Correlation
// ---------------------------------------------------------------------------------------

#[test]
fn correlation_chain_is_all_root_scope() {
    let p = ok(json!({
        "nodes": [np("in", "heddle.input", json!({"value": "x"})), n("u", "test.upper"),
                  n("o", "heddle.output")],
        "edges": [ed("e1", "in", "value", "u", "text"), ed("e2", "u", "text", "o", "value")]
    }));
    assert!(p.correlation.roots.is_empty());
    for ns in &p.correlation.nodes {
        assert!(ns.invocation_scope.is_empty());
        assert!(ns.repeating_driver.is_none());
        for h in ns.inputs.values() {
            assert_eq!(h.class, HandleClass::Max);
        }
    }
    assert!(
        p.correlation
            .edges
            .iter()
            .all(|e| e.scope.is_empty() && !e.repeats_per_key)
    );
}

#[test]
fn streaming_input_node_repeats_and_drives_its_consumer() {
    let p = ok(json!({
        "nodes": [np("in", "heddle.input", json!({"streaming": true})), n("u", "test.upper")],
        "edges": [ed("e1", "in", "value", "u", "text")]
    }));
    assert!(p.correlation.edges[0].repeats_per_key);
    assert_eq!(
        p.correlation.nodes[node_idx(&p, "u")]
            .repeating_driver
            .as_deref(),
        Some("text")
    );
}

#[test]
fn foreach_per_item_collect_returns_to_root_scope() {
    let p = ok(json!({
        "nodes": [np("l", "heddle.constant", json!({"value": [1, 2, 3]})), n("fe", "heddle.foreach"),
                  n("per", "heddle.passthrough"), n("col", "heddle.collect"), n("o", "heddle.output")],
        "edges": [ed("e1", "l", "value", "fe", "list"), ed("e2", "fe", "item", "per", "value"),
                  ed("e3", "per", "value", "col", "item"), ed("e4", "col", "list", "o", "value")]
    }));
    assert_eq!(p.correlation.roots.len(), 1);
    assert_eq!(&*p.correlation.roots[0].name, "fe:item");
    assert_eq!(p.correlation.roots[0].node as usize, node_idx(&p, "fe"));
    let fe = &p.correlation.nodes[node_idx(&p, "fe")];
    assert_eq!(fe.outputs["item"].mints, Some(0));
    assert_eq!(fe.outputs["index"].mints, Some(0), "same group, same root");
    assert_eq!(inv_scope(&p, "per"), ["fe:item"]);
    assert_eq!(inv_scope(&p, "col"), ["fe:item"]);
    assert_eq!(out_scope(&p, "col", "list"), Vec::<String>::new());
    assert!(inv_scope(&p, "o").is_empty());
    assert_eq!(names(&p, &p.correlation.edges[1].scope), ["fe:item"]);
}

#[test]
fn nested_foreach_has_two_roots() {
    let p = ok(json!({
        "nodes": [np("l", "heddle.constant", json!({"value": [[1], [2, 3]]})),
                  n("outer", "heddle.foreach"), n("inner", "heddle.foreach"),
                  n("per", "heddle.passthrough"), n("c1", "heddle.collect"), n("c2", "heddle.collect")],
        "edges": [ed("e1", "l", "value", "outer", "list"), ed("e2", "outer", "item", "inner", "list"),
                  ed("e3", "inner", "item", "per", "value"), ed("e4", "per", "value", "c1", "item"),
                  ed("e5", "c1", "list", "c2", "item")]
    }));
    assert_eq!(p.correlation.roots.len(), 2);
    assert_eq!(inv_scope(&p, "inner"), ["outer:item"]);
    assert_eq!(inv_scope(&p, "per"), ["outer:item", "inner:item"]);
    assert_eq!(out_scope(&p, "c1", "list"), ["outer:item"]);
    assert_eq!(out_scope(&p, "c2", "list"), Vec::<String>::new());
}

#[test]
fn side_inputs_are_prefix_or_empty_sticky() {
    let p = ok(json!({
        "nodes": [np("l", "heddle.constant", json!({"value": [[1], [2, 3]]})),
                  n("outer", "heddle.foreach"), n("inner", "heddle.foreach"),
                  n("k", "heddle.constant"), n("pair", "test.pair"), n("pair2", "test.pair")],
        "edges": [ed("e1", "l", "value", "outer", "list"), ed("e2", "outer", "item", "inner", "list"),
                  ed("e3", "inner", "item", "pair", "a"), ed("e4", "outer", "index", "pair", "b"),
                  ed("e5", "inner", "item", "pair2", "a"), ed("e6", "k", "value", "pair2", "b")]
    }));
    assert_eq!(inv_scope(&p, "pair"), ["outer:item", "inner:item"]);
    assert_eq!(class(&p, "pair", "a"), HandleClass::Max);
    assert_eq!(class(&p, "pair", "b"), HandleClass::Prefix);
    assert_eq!(class(&p, "pair2", "b"), HandleClass::Empty);
}

#[test]
fn join_node_takes_the_common_prefix_of_unrelated_iterations() {
    let p = ok(json!({
        "nodes": [n("l1", "heddle.constant"), n("l2", "heddle.constant"),
                  n("f1", "heddle.foreach"), n("f2", "heddle.foreach"), n("z", "test.zip")],
        "edges": [ed("a", "l1", "value", "f1", "list"), ed("b", "l2", "value", "f2", "list"),
                  ed("c", "f1", "item", "z", "a"), ed("d", "f2", "item", "z", "b")]
    }));
    assert!(inv_scope(&p, "z").is_empty());
    assert!(out_scope(&p, "z", "pair").is_empty());
    let z = &p.correlation.nodes[node_idx(&p, "z")];
    assert!(z.inputs["a"].repeats_per_key && z.inputs["b"].repeats_per_key);
    assert!(z.repeating_driver.is_none());
}

#[test]
fn chunk_output_repeats_per_key_and_drives_the_consumer() {
    let p = ok(json!({
        "nodes": [np("t", "heddle.constant", json!({"value": "abc"})), n("ch", "test.chunks"),
                  n("u", "test.upper"), n("k", "heddle.constant"), n("pair", "test.pair")],
        "edges": [ed("a", "t", "value", "ch", "text"), ed("b", "ch", "chunk", "u", "text"),
                  ed("c", "ch", "chunk", "pair", "a"), ed("d", "k", "value", "pair", "b")]
    }));
    assert!(p.correlation.edges[1].repeats_per_key);
    assert_eq!(
        p.correlation.nodes[node_idx(&p, "u")]
            .repeating_driver
            .as_deref(),
        Some("text")
    );
    assert_eq!(
        p.correlation.nodes[node_idx(&p, "pair")]
            .repeating_driver
            .as_deref(),
        Some("a")
    );
}

// Rejections ----------------------------------------------------------------------------

#[test]
fn incomparable_scopes_on_a_non_join_node_ask_for_a_join() {
    let e = err(json!({
        "nodes": [n("l1", "heddle.constant"), n("l2", "heddle.constant"),
                  n("f1", "heddle.foreach"), n("f2", "heddle.foreach"), n("p", "test.pair")],
        "edges": [ed("a", "l1", "value", "f1", "list"), ed("b", "l2", "value", "f2", "list"),
                  ed("c", "f1", "item", "p", "a"), ed("d", "f2", "item", "p", "b")]
    }));
    let d = of_kind(&e, IssueKind::IncomparableScopes);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!(d[0].0, Some("p"));
    assert!(d[0].3.contains("join node"), "{}", d[0].3);
    assert!(
        d[0].3.contains("f1:item") && d[0].3.contains("f2:item"),
        "{}",
        d[0].3
    );
}

#[test]
fn two_repeating_inputs_on_a_buffered_node_are_rejected() {
    let e = err(json!({
        "nodes": [n("t", "test.text"), n("c1", "test.chunks"), n("c2", "test.chunks"), n("p", "test.pair")],
        "edges": [ed("a", "t", "text", "c1", "text"), ed("b", "t", "text", "c2", "text"),
                  ed("c", "c1", "chunk", "p", "a"), ed("d", "c2", "chunk", "p", "b")]
    }));
    let d = of_kind(&e, IssueKind::Correlation);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!(d[0].0, Some("p"));
    assert!(d[0].3.contains("at most one repeating input"), "{}", d[0].3);
}

#[test]
fn repeating_input_as_prefix_sticky_is_rejected_and_as_empty_sticky_warned() {
    // Chunks at scope [f:item] used as a side input of a node at [f:item, g:item].
    let e = err(json!({
        "nodes": [n("l", "heddle.constant"), n("f", "heddle.foreach"), n("g", "heddle.foreach"),
                  n("ch", "test.chunks"), n("p", "test.pair")],
        "edges": [ed("a", "l", "value", "f", "list"), ed("b", "f", "item", "g", "list"),
                  ed("c", "f", "item", "ch", "text"), ed("d", "g", "item", "p", "a"),
                  ed("x", "ch", "chunk", "p", "b")]
    }));
    let d = of_kind(&e, IssueKind::Correlation);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!((d[0].0, d[0].2), (Some("p"), Some("b")));
    assert!(d[0].3.contains("sticky"), "{}", d[0].3);

    let p = ok(json!({
        "nodes": [n("l", "heddle.constant"), n("f", "heddle.foreach"), n("t", "test.text"),
                  n("ch", "test.chunks"), n("p", "test.pair")],
        "edges": [ed("a", "l", "value", "f", "list"), ed("b", "f", "item", "p", "a"),
                  ed("c", "t", "text", "ch", "text"), ed("d", "ch", "chunk", "p", "b")]
    }));
    assert_eq!(class(&p, "p", "b"), HandleClass::Empty);
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].handle.as_deref(), Some("b"));
}

#[test]
fn aggregate_on_a_buffered_node_is_rejected() {
    let e = err(json!({
        "nodes": [n("l", "heddle.constant"), n("f", "heddle.foreach"), n("b", "test.bad_aggregate")],
        "edges": [ed("a", "l", "value", "f", "list"), ed("b", "f", "item", "b", "item")]
    }));
    let d = of_kind(&e, IssueKind::Correlation);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!((d[0].0, d[0].2), (Some("b"), Some("all")));
    assert!(d[0].3.contains("not a streaming-input node"), "{}", d[0].3);
}

#[test]
fn forward_naming_an_unknown_input_is_rejected() {
    let e = err(json!({"nodes": [n("f", "test.forward_unknown")]}));
    let d = of_kind(&e, IssueKind::Correlation);
    assert_eq!(d.len(), 1, "{e}");
    assert!(d[0].3.contains("`nope`"), "{}", d[0].3);
}

#[test]
fn buffered_output_at_a_strict_prefix_of_the_invocation_scope_is_rejected() {
    // `out` forwards the lineage of the side input (scope []), while the node is invoked
    // per item: every item's output would land on the same key.
    let e = err(json!({
        "nodes": [n("l", "heddle.constant"), n("f", "heddle.foreach"), n("k", "heddle.constant"),
                  n("fw", "test.forward")],
        "edges": [ed("a", "l", "value", "f", "list"), ed("b", "f", "item", "fw", "item"),
                  ed("c", "k", "value", "fw", "side")]
    }));
    let d = of_kind(&e, IssueKind::Correlation);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!((d[0].0, d[0].2), (Some("fw"), Some("out")));
    assert!(d[0].3.contains("strict prefix"), "{}", d[0].3);
}

#[test]
fn control_edges_get_empty_scope_and_controllers_are_unique() {
    let p = ok(json!({
        "nodes": [n("agent", "test.agent"), n("g", "test.gate")],
        "edges": [ctl("c1", "agent", "g"),
                  {"id": "c2", "source": "agent", "sourceHandle": "__control__", "target": "g",
                   "targetHandle": "__control__", "edge_type": "control"}]
    }));
    let g = &p.nodes[node_idx(&p, "g")];
    assert_eq!(g.controllers, vec![node_idx(&p, "agent") as u32]);
    assert_eq!(g.in_edges.len(), 2);
    assert!(p.edges.iter().all(|e| e.edge_type == EdgeType::Control));
    assert!(p.correlation.edges.iter().all(|e| e.scope.is_empty()));
}

// ---------------------------------------------------------------------------------------
// Typed inputs, warnings, larger graphs
// ---------------------------------------------------------------------------------------

#[test]
fn typed_input_narrows_its_output_and_checks_its_default() {
    let e = err(json!({
        "nodes": [np("in", "heddle.input", json!({"type": "str", "value": 3})),
                  np("bad", "heddle.input", json!({"type": "widget"})),
                  n("a", "test.add")],
        "edges": [ed("e1", "in", "value", "a", "a")]
    }));
    let t = of_kind(&e, IssueKind::TypeMismatch);
    assert_eq!(t.len(), 1, "{e}");
    assert!(
        t[0].3.contains("(str)") && t[0].3.contains("(int)"),
        "{}",
        t[0].3
    );
    let p = of_kind(&e, IssueKind::InvalidProperty);
    let at: Vec<_> = p.iter().map(|i| (i.0.unwrap(), i.2.unwrap())).collect();
    assert_eq!(at, [("bad", "type"), ("in", "value")], "{e}");

    let plan = ok(json!({
        "nodes": [np("in", "heddle.input", json!({"type": "float", "value": 3})), n("s", "test.scale")],
        "edges": [ed("e1", "in", "value", "s", "x")]
    }));
    assert_eq!(plan.nodes[0].properties["value"], Value::Float(3.0));
}

#[test]
fn inputs_are_listed_with_their_name_type_default_and_streaming_flag() {
    let p = ok(json!({
        "nodes": [np("b", "heddle.input", json!({"name": "text", "type": "str"})),
                  np("a", "heddle.input", json!({"type": "float", "value": 2})),
                  np("s", "heddle.input", json!({"name": "feed", "streaming": true})),
                  n("c", "heddle.constant")],
        "edges": []
    }));
    let got: Vec<_> = p
        .inputs()
        .iter()
        .map(|i| {
            (
                &*i.name,
                &*i.node_id,
                i.ty.to_string(),
                i.default.clone(),
                i.streaming,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("text", "b", "str".to_string(), None, false),
            (
                "a",
                "a",
                "float".to_string(),
                Some(Value::Float(2.0)),
                false
            ),
            ("feed", "s", "any".to_string(), None, true),
        ]
    );
    for i in p.inputs() {
        assert_eq!(&*p.nodes[i.node as usize].id, &*i.node_id);
    }
}

#[test]
fn binding_inputs_reports_every_problem_and_falls_back_to_defaults() {
    let p = ok(json!({
        "nodes": [np("t", "heddle.input", json!({"name": "text", "type": "str"})),
                  np("n", "heddle.input", json!({"name": "n", "type": "float", "value": 1})),
                  np("m", "heddle.input", json!({"name": "m", "type": "int"})),
                  np("s", "heddle.input", json!({"name": "feed", "streaming": true}))],
        "edges": []
    }));
    let values = |pairs: &[(&str, Value)]| -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    let e = p
        .bind_inputs(&values(&[
            ("txt", Value::from("x")),
            ("text", Value::Int(3)),
        ]))
        .unwrap_err();
    let kinds: Vec<String> = e.0.iter().map(|i| i.to_string()).collect();
    assert_eq!(kinds.len(), 3, "{e}");
    assert!(
        kinds[0].contains("no input named `txt`") && kinds[0].contains("inputs: text, n, m, feed"),
        "{e}"
    );
    assert!(
        matches!(&e.0[1], InputError::Type { name, node, .. } if name == "text" && node == "t"),
        "{e}"
    );
    assert!(
        matches!(&e.0[2], InputError::Missing { name, .. } if name == "m"),
        "{e}"
    );

    let bound = p
        .bind_inputs(&values(&[
            ("text", Value::from("hi")),
            ("m", Value::Int(4)),
        ]))
        .unwrap();
    let at = |id: &str| bound.get(node_idx(&p, id) as u32).cloned();
    assert_eq!(at("t"), Some(Value::from("hi")));
    assert_eq!(at("n"), Some(Value::Float(1.0)), "the default, as its type");
    assert_eq!(at("m"), Some(Value::Int(4)));
    assert_eq!(at("s"), None, "a streaming input waits for pushed values");
    let n = p.input("n").unwrap();
    assert_eq!(n.check(Value::Int(2)), Ok(Value::Float(2.0)));
    assert!(p.input("nope").is_err());
}

#[test]
fn outputs_sharing_a_name_are_warned() {
    let p = ok(json!({
        "nodes": [n("c", "heddle.constant"),
                  np("o1", "heddle.output", json!({"name": "r"})),
                  np("o2", "heddle.output", json!({"name": "r"}))],
        "edges": [ed("a", "c", "value", "o1", "value"), ed("b", "c", "value", "o2", "value")]
    }));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert_eq!(p.warnings[0].node.as_deref(), Some("o2"));
}

#[test]
fn control_output_handle_is_a_valid_control_source() {
    let p = ok(json!({
        "nodes": [n("agent", "test.agent"), n("g", "test.gate")],
        "edges": [{"id": "c", "source": "agent", "sourceHandle": "__control_output__",
                   "target": "g", "targetHandle": "__control__", "edge_type": "control"}]
    }));
    assert_eq!(p.edges.len(), 1);
}

#[test]
fn join_output_repeats_per_key_when_it_pairs_deeper_inputs() {
    let p = ok(json!({
        "nodes": [n("l1", "heddle.constant"), n("l2", "heddle.constant"),
                  n("f1", "heddle.foreach"), n("f2", "heddle.foreach"), n("z", "test.zip"),
                  n("o", "heddle.output")],
        "edges": [ed("a", "l1", "value", "f1", "list"), ed("b", "l2", "value", "f2", "list"),
                  ed("c", "f1", "item", "z", "a"), ed("d", "f2", "item", "z", "b"),
                  ed("e", "z", "pair", "o", "value")]
    }));
    let z = &p.correlation.nodes[node_idx(&p, "z")];
    assert!(z.outputs["pair"].repeats_per_key);
    assert_eq!(
        p.correlation.nodes[node_idx(&p, "o")]
            .repeating_driver
            .as_deref(),
        Some("value")
    );
}

#[test]
fn diamond_and_large_graphs_plan_in_topological_order() {
    // Diamond: a -> b, a -> c, b -> d, c -> d (d takes a list so two edges are fine).
    let p = ok(json!({
        "nodes": [n("d", "test.sum"), n("c", "test.add"), n("b", "test.add"),
                  np("a", "heddle.constant", json!({"value": 1}))],
        "edges": [ed("ab", "a", "value", "b", "a"), ed("ac", "a", "value", "c", "a"),
                  ed("bd", "b", "sum", "d", "values"), ed("cd", "c", "sum", "d", "values")]
    }));
    let ids: Vec<&str> = p.nodes.iter().map(|n| &*n.id).collect();
    assert_eq!(
        ids,
        ["a", "c", "b", "d"],
        "document order among ready nodes"
    );

    // A 1,000-node chain listed backwards and 1,000 independent nodes.
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for i in (0..1000).rev() {
        nodes.push(n(&format!("p{i}"), "heddle.passthrough"));
        if i > 0 {
            edges.push(ed(
                &format!("e{i}"),
                &format!("p{}", i - 1),
                "value",
                &format!("p{i}"),
                "value",
            ));
        }
        nodes.push(np(&format!("k{i}"), "heddle.constant", json!({"value": i})));
    }
    let p = ok(json!({"nodes": nodes, "edges": edges}));
    assert_eq!(p.nodes.len(), 2000);
    let pos = |id: &str| node_idx(&p, id);
    assert!((1..1000).all(|i| pos(&format!("p{}", i - 1)) < pos(&format!("p{i}"))));
    for (ei, e) in p.edges.iter().enumerate() {
        assert!(e.source < e.target);
        assert_eq!(p.nodes[e.target as usize].in_edges, vec![ei as u32]);
    }
}

#[test]
fn edges_into_an_accumulating_list_input_carry_its_items() {
    let e = err(json!({
        "nodes": [n("t", "test.text"), n("u", "test.text"), n("s", "test.sum")],
        "edges": [ed("a", "t", "text", "s", "values"), ed("b", "u", "text", "s", "values")]
    }));
    let d = of_kind(&e, IssueKind::TypeMismatch);
    assert_eq!(d.len(), 2, "{e}");
    assert!(
        d[0].3.contains("items of input `s.values` (list[int])"),
        "{}",
        d[0].3
    );
}

#[test]
fn repeats_propagate_through_driven_nodes_and_a_join_pairs_two_streams() {
    // A streaming input feeds two per-value transforms; both fire once per value, so a
    // plain node combining them would have two repeating inputs: rejected...
    let diamond = |combiner: &str| {
        json!({
            "nodes": [np("in", "heddle.input", json!({"streaming": true})),
                      n("a", "heddle.passthrough"), n("b", "heddle.passthrough"),
                      n("c", combiner)],
            "edges": [ed("ia", "in", "value", "a", "value"), ed("ib", "in", "value", "b", "value"),
                      ed("ac", "a", "value", "c", "a"), ed("bc", "b", "value", "c", "b")]
        })
    };
    let e = err(diamond("test.pair"));
    let d = of_kind(&e, IssueKind::Correlation);
    assert_eq!(d.len(), 1, "{e}");
    assert!(d[0].3.contains("use a join node"), "{}", d[0].3);
    // ... while a join pairs them in arrival order and its output repeats in turn.
    let p = ok(diamond("test.zip"));
    let a = &p.correlation.nodes[node_idx(&p, "a")];
    assert_eq!(a.repeating_driver.as_deref(), Some("value"));
    assert!(a.outputs["value"].repeats_per_key);
    let c = &p.correlation.nodes[node_idx(&p, "c")];
    assert!(c.repeating_driver.is_none());
    assert!(c.outputs["pair"].repeats_per_key);
}

#[test]
fn aggregate_with_a_root_side_input_drops_the_innermost_root_of_the_items() {
    let p = ok(json!({
        "nodes": [n("l", "heddle.constant"), n("outer", "heddle.foreach"),
                  n("inner", "heddle.foreach"), np("sep", "heddle.constant", json!({"value": ","})),
                  n("j", "test.join_text"), n("c", "heddle.collect")],
        "edges": [ed("a", "l", "value", "outer", "list"), ed("b", "outer", "item", "inner", "list"),
                  ed("c", "inner", "item", "j", "item"), ed("d", "sep", "value", "j", "sep"),
                  ed("e", "j", "text", "c", "item")]
    }));
    assert!(
        inv_scope(&p, "j").is_empty(),
        "a streaming-input node sees everything"
    );
    assert_eq!(out_scope(&p, "j", "text"), ["outer:item"]);
    assert_eq!(out_scope(&p, "c", "list"), Vec::<String>::new());
}

/// Random documents (unknown types, bogus handles, bypassed nodes, control edges, cycles)
/// never make planning panic; every plan it returns is internally consistent and every
/// issue says where it is.
#[test]
fn random_graphs_never_panic_and_plans_are_consistent() {
    let types = [
        "heddle.constant",
        "heddle.passthrough",
        "heddle.foreach",
        "heddle.collect",
        "heddle.output",
        "heddle.input",
        "test.add",
        "test.pair",
        "test.zip",
        "test.chunks",
        "test.gate",
        "test.forward",
        "test.join_text",
        "test.code",
        "no.such",
    ];
    let handles = [
        "value",
        "item",
        "index",
        "list",
        "a",
        "b",
        "sum",
        "pair",
        "chunk",
        "text",
        "x",
        "__control__",
        "bogus",
    ];
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let d = decls();
    let (mut planned, mut rejected) = (0, 0);
    for _ in 0..400 {
        let n_nodes = 1 + rnd(8);
        let nodes: Vec<_> = (0..n_nodes)
            .map(|i| {
                json!({"id": format!("n{}", rnd(n_nodes + 1).min(i)), "type": types[rnd(types.len())],
                       "ui_properties": {"bypassed": rnd(6) == 0}})
            })
            .collect();
        let edges: Vec<_> = (0..rnd(10))
            .map(|_| {
                let mut e = ed(
                    &format!("e{}", rnd(12)),
                    &format!("n{}", rnd(n_nodes + 1)),
                    handles[rnd(handles.len())],
                    &format!("n{}", rnd(n_nodes + 1)),
                    handles[rnd(handles.len())],
                );
                if rnd(5) == 0 {
                    e["edge_type"] = json!("control");
                }
                e
            })
            .collect();
        match plan(&doc(json!({"nodes": nodes, "edges": edges})), &d) {
            Ok(p) => {
                planned += 1;
                assert_eq!(p.correlation.nodes.len(), p.nodes.len());
                assert_eq!(p.correlation.edges.len(), p.edges.len());
                for (ei, e) in p.edges.iter().enumerate() {
                    let ei = ei as u32;
                    assert!(p.nodes[e.source as usize].out_edges.contains(&ei));
                    assert!(p.nodes[e.target as usize].in_edges.contains(&ei));
                    if e.edge_type == EdgeType::Data {
                        assert!(e.source < e.target, "topological order");
                    }
                }
                for r in &p.correlation.roots {
                    assert!((r.node as usize) < p.nodes.len());
                }
            }
            Err(e) => {
                rejected += 1;
                assert!(!e.issues.is_empty());
                for i in &e.issues {
                    assert!(i.node.is_some() || i.edge.is_some(), "{i}");
                }
            }
        }
    }
    assert!(
        planned > 10 && rejected > 10,
        "planned {planned}, rejected {rejected}"
    );
}
