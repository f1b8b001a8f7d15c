//! `[wasm] max_value_bytes` bounds what a WASM node hands the host in one value, and
//! nothing else: a value over it fails its node at once with an error that says which
//! node, which output, the size, the limit and how to raise it; the kernel's own
//! `heddle.collect` gathers any number of small values into a list over the limit (a
//! durable run stores a large one as an artifact). A 100,000-line file read and split
//! by WASM nodes crossed the default 1 MiB at `read`/`split`, not at the collect. With
//! the real binary and first-party packages.

mod support;

use support::store::{CONFIG, StoreDir, expect};
use support::{FAILED, OK};

/// The test configuration with a small value limit.
fn with_limit(graph: &str, limit: usize) -> StoreDir {
    let d = StoreDir::with_graph(graph);
    support::write(
        d.path(),
        "heddle.toml",
        &format!("{CONFIG}\n[wasm]\nmax_value_bytes = {limit}\n"),
    );
    d
}

const READ: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/big.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn a_wasm_value_over_the_limit_fails_naming_node_output_size_limit_and_the_setting() {
    let d = with_limit(READ, 1000);
    std::fs::write(d.path().join("data/big.txt"), "x".repeat(5000)).unwrap();
    let o = d.heddle(&["run", "g.json"]);
    expect(&o, FAILED);
    let err = support::stderr(&o);
    for part in [
        "node \"read\"",
        "output `text` is 5000 bytes",
        "over the 1000-byte limit per value",
        "raise `max_value_bytes` in the `[wasm]` section of heddle.toml (now 1000",
    ] {
        assert!(err.contains(part), "missing {part:?} in: {err}");
    }
}

#[test]
fn collect_gathers_a_list_larger_than_the_wasm_value_limit() {
    let items: Vec<String> = (0..300).map(|i| format!("item {i:04}")).collect();
    let graph = serde_json::json!({"format": "heddle.graph", "version": 1,
      "nodes": [
        {"id": "c", "type": "heddle.constant", "properties": {"value": items}},
        {"id": "each", "type": "heddle.foreach"},
        {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
        {"id": "all", "type": "heddle.collect"},
        {"id": "out", "type": "heddle.output"}],
      "edges": [
        {"source": "c", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
        {"source": "each", "sourceHandle": "item", "target": "up", "targetHandle": "text"},
        {"source": "up", "sourceHandle": "text", "target": "all", "targetHandle": "item"},
        {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}]});
    let d = with_limit(&graph.to_string(), 1000);
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    let report = support::store::report(&o);
    let list = report["outputs"]["out"][0]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(list.len(), 300, "{report:#}");
    assert!(serde_json::to_string(&list).unwrap().len() > 1000);
    assert_eq!(list[299], "ITEM 0299");
}
