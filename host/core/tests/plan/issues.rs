//! A valid graph, and one test per validation issue kind: each names the node, edge or
//! handle it is about.

use super::*;

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
