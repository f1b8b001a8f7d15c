//! Larger and random graphs: planning order and plan consistency at scale.

use super::*;

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
        assert_eq!(p.nodes[e.target as usize].in_edges.as_slice(), [ei as u32]);
    }
    // Every edge of the chain names `value` at both ends: one shared text, not one per
    // end (a large graph's plan would hold thousands of copies).
    let first = &p.edges[0].source_handle;
    assert!(
        p.edges.iter().all(|e| {
            Arc::ptr_eq(&e.source_handle, first) && Arc::ptr_eq(&e.target_handle, first)
        })
    );
    // A node's edges are held in place, not allocated.
    assert!(
        p.nodes
            .iter()
            .all(|n| !n.in_edges.spilled() && !n.out_edges.spilled())
    );
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
