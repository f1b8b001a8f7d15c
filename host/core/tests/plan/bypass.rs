//! Bypassed nodes become wires; what cannot be wired is dropped with a warning.

use super::*;

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

/// The edge into a bypassed node disappears in the rewrite; a rule on it would go with
/// it and let through what it rules out, so the graph is refused instead.
#[test]
fn a_rule_on_an_edge_into_a_bypassed_node_is_refused_not_dropped() {
    for rule in [json!({"when": "value != 'x'"}), json!({"fields": ["a"]})] {
        let mut into = ed("in", "t", "text", "u", "text");
        into.as_object_mut()
            .unwrap()
            .extend(rule.as_object().unwrap().clone());
        let e = err(json!({
            "nodes": [
                n("t", "test.text"),
                {"id": "u", "type": "test.upper", "ui_properties": {"bypassed": true}},
                n("o", "heddle.output"),
            ],
            "edges": [into, ed("out", "u", "text", "o", "value")]
        }));
        let found = of_kind(&e, IssueKind::InvalidEdgeRule);
        assert_eq!(found.len(), 1, "{e}");
        assert_eq!((found[0].0, found[0].1), (Some("u"), Some("in")));
        assert!(found[0].3.contains("bypassed"), "{}", found[0].3);
    }
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
