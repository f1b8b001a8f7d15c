//! The static correlation analysis on the shapes the runtime relies on, and the shapes it
//! refuses.

use super::*;

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
fn edges_of_different_scopes_into_one_handle_ask_for_one_level_or_a_join() {
    // A list input accumulates from several edges, but one from inside the iteration and
    // one from outside cannot share a lineage key.
    let e = err(json!({
        "nodes": [n("l", "heddle.constant"), n("f", "heddle.foreach"), n("k", "heddle.constant"),
                  n("s", "test.sum")],
        "edges": [ed("a", "l", "value", "f", "list"), ed("b", "f", "index", "s", "values"),
                  ed("c", "k", "value", "s", "values")]
    }));
    let d = of_kind(&e, IssueKind::IncomparableScopes);
    assert_eq!(d.len(), 1, "{e}");
    assert_eq!(
        (d[0].0, d[0].1, d[0].2),
        (Some("s"), Some("c"), Some("values"))
    );
    assert!(
        d[0].3.contains("[f:item] via edge b, [] via edge c"),
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
    assert_eq!(g.controllers.as_slice(), [node_idx(&p, "agent") as u32]);
    assert_eq!(g.in_edges.len(), 2);
    assert!(p.edges.iter().all(|e| e.edge_type == EdgeType::Control));
    assert!(p.correlation.edges.iter().all(|e| e.scope.is_empty()));
}

#[test]
fn control_height_counts_the_levels_of_controllers_below_a_node() {
    // top drives g1 and g2; g1 (controlled) drives g2 too: a diamond two levels deep.
    let p = ok(json!({
        "nodes": [n("top", "test.agent"), n("g1", "test.gate"), n("g2", "test.gate"),
                  n("alone", "test.agent")],
        "edges": [ctl("c1", "top", "g1"), ctl("c2", "top", "g2"), ctl("c3", "g1", "g2")]
    }));
    let h = |id: &str| p.control_height(node_idx(&p, id) as u32);
    assert_eq!((h("top"), h("g1"), h("g2"), h("alone")), (2, 1, 0, 0));
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
