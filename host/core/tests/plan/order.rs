//! The plan's id order ([`Plan::by_id`]) and lookup by id ([`Plan::node_index`]), which
//! the kernel builds its per-node report in.

use super::*;

#[test]
fn by_id_lists_every_node_once_in_the_order_of_the_ids() {
    // Ids sharing their first eight bytes, shorter than eight, a prefix of another,
    // beyond ASCII, and in a document order that is neither sorted nor reversed;
    // the edges make the plan's own (topological) order differ from both.
    let ids = [
        "node-0000b",
        "n",
        "node-0000a",
        "z",
        "node-0000",
        "é",
        "node-00001",
        "a",
        "nodf",
    ];
    let plan = ok(json!({
        "nodes": ids.iter().map(|id| n(id, "heddle.passthrough")).collect::<Vec<_>>(),
        "edges": [ed("e1", "z", "value", "a", "value"), ed("e2", "é", "value", "n", "value")]
    }));
    let in_order: Vec<&str> = plan
        .by_id()
        .iter()
        .map(|&i| &*plan.nodes[i as usize].id)
        .collect();
    let mut sorted = ids.to_vec();
    sorted.sort();
    assert_eq!(in_order, sorted);
    for id in ids {
        let i = plan.node_index(id).expect("every node is found");
        assert_eq!(&*plan.nodes[i as usize].id, id);
    }
    assert_eq!(plan.node_index("node-000"), None);
    assert_eq!(plan.node_index(""), None);
}
