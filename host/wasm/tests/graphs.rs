//! Graphs mixing native built-ins and WASM nodes, run through the kernel.

mod common;

use std::sync::Arc;

use common::*;
use heddle_core::{GraphDoc, RunStatus, Value};
use heddle_kernel::runtime::RunOptions;
use heddle_kernel::{Registry, run_graph};
use heddle_wasm::{DirGrant, DirMode, PackageGrant, WasmConfig, WasmPackage};
use serde_json::json;

fn graph(nodes: serde_json::Value, edges: &[(&str, &str, &str, &str)]) -> GraphDoc {
    let edges: Vec<_> = edges
        .iter()
        .map(|(s, sh, t, th)| json!({"source": s, "sourceHandle": sh, "target": t, "targetHandle": th}))
        .collect();
    let doc = json!({"format": "heddle.graph", "version": 1, "nodes": nodes, "edges": edges});
    GraphDoc::parse(&doc.to_string(), "test.json").unwrap()
}

async fn registry(config: WasmConfig) -> Registry {
    let mut p = first_party_provider(config).await;
    p.add(
        WasmPackage::load_dir(p.host(), &package_dir("hostile"))
            .await
            .unwrap(),
    )
    .unwrap();
    let mut r = Registry::with_builtins();
    r.add(Arc::new(p)).unwrap();
    r
}

fn strs(v: &Value) -> Vec<String> {
    v.as_list()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtins_and_wasm_nodes_in_one_graph() {
    let doc = graph(
        json!([
            {"id": "name", "type": "heddle.input", "properties": {"type": "str"}},
            {"id": "greeting", "type": "heddle.constant", "properties": {"value": "hello"}},
            {"id": "concat", "type": "std.text.concat", "properties": {"sep": ", "}},
            {"id": "shout", "type": "std.text.case", "properties": {"mode": "upper"}},
            {"id": "pass", "type": "heddle.passthrough"},
            {"id": "out", "type": "heddle.output", "properties": {"name": "result"}}
        ]),
        &[
            ("greeting", "value", "concat", "a"),
            ("name", "value", "concat", "b"),
            ("concat", "text", "shout", "text"),
            ("shout", "text", "pass", "value"),
            ("pass", "value", "out", "value"),
        ],
    );
    let reg = registry(WasmConfig::default()).await;
    let opts = RunOptions {
        inputs: [("name".to_string(), Value::str("heddle"))].into(),
        ..Default::default()
    };
    let r = run_graph(&doc, &reg, opts).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["result"], vec![Value::str("HELLO, HEDDLE")]);
    let m = &r.nodes["concat"].metrics;
    assert!(
        m.fuel.unwrap() > 0,
        "fuel is recorded per invocation: {m:?}"
    );
    assert!(m.peak_memory_bytes.unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_over_a_list_into_wasm_nodes() {
    let doc = graph(
        json!([
            {"id": "nums", "type": "heddle.constant", "properties": {"value": [3, 1, 2, 5]}},
            {"id": "each", "type": "heddle.foreach"},
            {"id": "times", "type": "std.math.arith", "properties": {"b": 10, "op": "mul"}},
            {"id": "gather", "type": "heddle.collect"},
            {"id": "sorted", "type": "std.list.sort"},
            {"id": "total", "type": "std.math.aggregate", "properties": {"op": "sum"}},
            {"id": "out_list", "type": "heddle.output"},
            {"id": "out_sum", "type": "heddle.output"}
        ]),
        &[
            ("nums", "value", "each", "list"),
            ("each", "item", "times", "a"),
            ("times", "result", "gather", "item"),
            ("gather", "list", "sorted", "items"),
            ("sorted", "items", "out_list", "value"),
            ("gather", "list", "total", "items"),
            ("total", "result", "out_sum", "value"),
        ],
    );
    let reg = registry(WasmConfig::default()).await;
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let list: Vec<i64> = r.outputs["out_list"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(list, vec![10, 20, 30, 50]);
    assert_eq!(r.outputs["out_sum"], vec![Value::Float(110.0)]);
    assert_eq!(r.nodes["times"].invocations, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_wasm_node_feeds_downstream_per_item() {
    let doc = graph(
        json!([
            {"id": "text", "type": "heddle.constant", "properties": {"value": "alpha\nbeta\n\ngamma\n"}},
            {"id": "lines", "type": "std.text.lines"},
            {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
            {"id": "gather", "type": "heddle.collect"},
            {"id": "out", "type": "heddle.output"},
            {"id": "count", "type": "heddle.output"}
        ]),
        &[
            ("text", "value", "lines", "text"),
            ("lines", "line", "up", "text"),
            ("up", "text", "gather", "item"),
            ("gather", "list", "out", "value"),
            ("lines", "count", "count", "value"),
        ],
    );
    let reg = registry(WasmConfig::default()).await;
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(strs(&r.outputs["out"][0]), vec!["ALPHA", "BETA", "GAMMA"]);
    assert_eq!(r.outputs["count"], vec![Value::Int(3)]);
    assert_eq!(r.nodes["up"].invocations, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_wasm_node_fails_the_run_naming_node_and_cause() {
    let doc = graph(
        json!([
            {"id": "loop", "type": "hostile.spin", "limits": {"fuel": 2000000}},
            {"id": "out", "type": "heddle.output"}
        ]),
        &[("loop", "out", "out", "value")],
    );
    let reg = registry(WasmConfig::default()).await;
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap();
    assert!(err.contains("loop") && err.contains("fuel"), "{err}");

    let doc = graph(
        json!([
            {"id": "raw", "type": "heddle.constant", "properties": {"value": "{not json"}},
            {"id": "parse", "type": "std.json.parse"},
            {"id": "out", "type": "heddle.output"}
        ]),
        &[
            ("raw", "value", "parse", "text"),
            ("parse", "value", "out", "value"),
        ],
    );
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap();
    assert!(err.contains("invalid JSON"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_package_works_inside_its_grant() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = WasmConfig::default();
    config.packages.insert(
        "files".into(),
        PackageGrant {
            dirs: vec![DirGrant {
                host: dir.path().into(),
                guest: "/data".into(),
                mode: DirMode::Rw,
            }],
            ..Default::default()
        },
    );
    let doc = graph(
        json!([
            {"id": "text", "type": "heddle.constant", "properties": {"value": "written by a graph"}},
            {"id": "write", "type": "files.write_text", "properties": {"path": "/data/note.txt"}},
            {"id": "read", "type": "files.read_text"},
            {"id": "out", "type": "heddle.output"}
        ]),
        &[
            ("text", "value", "write", "text"),
            ("write", "path", "read", "path"),
            ("read", "text", "out", "value"),
        ],
    );
    let reg = registry(config).await;
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::str("written by a graph")]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("note.txt")).unwrap(),
        "written by a graph"
    );
    assert_eq!(
        r.nodes["write"].metrics.assets,
        vec!["file:/data/note.txt".to_string()]
    );

    // The same graph narrowed to read-only by its author fails at the write.
    let mut narrowed = doc.clone();
    for n in &mut narrowed.nodes {
        if n.id == "write" {
            n.limits = Some(heddle_core::NodeLimits {
                files: Some(heddle_core::graph::AccessLevel::Read),
                ..Default::default()
            });
        }
    }
    let r = run_graph(&narrowed, &reg, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.error.unwrap().contains("write"));
}
