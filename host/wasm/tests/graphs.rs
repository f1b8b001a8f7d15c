//! Graphs mixing native built-ins and WASM nodes, run through the kernel.

mod common;

use std::sync::Arc;

use common::*;
use heddle_core::builder::graph;
use heddle_core::{GraphBuilder, NodeLimits, RunStatus, Value};
use heddle_kernel::runtime::RunOptions;
use heddle_kernel::{Registry, run_graph};
use heddle_wasm::{DirGrant, DirMode, PackageGrant, WasmConfig, WasmPackage};
use serde_json::json;

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
        &[
            ("name", "heddle.input", json!({"type": "str"})),
            ("greeting", "heddle.constant", json!({"value": "hello"})),
            ("concat", "std.text.concat", json!({"sep": ", "})),
            ("shout", "std.text.case", json!({"mode": "upper"})),
            ("pass", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "result"})),
        ],
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
        &[
            ("nums", "heddle.constant", json!({"value": [3, 1, 2, 5]})),
            ("each", "heddle.foreach", json!({})),
            ("times", "std.math.arith", json!({"b": 10, "op": "mul"})),
            ("gather", "heddle.collect", json!({})),
            ("sorted", "std.list.sort", json!({})),
            ("total", "std.math.aggregate", json!({"op": "sum"})),
            ("out_list", "heddle.output", json!({})),
            ("out_sum", "heddle.output", json!({})),
        ],
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
        &[
            (
                "text",
                "heddle.constant",
                json!({"value": "alpha\nbeta\n\ngamma\n"}),
            ),
            ("lines", "std.text.lines", json!({})),
            ("up", "std.text.case", json!({"mode": "upper"})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
            ("count", "heddle.output", json!({})),
        ],
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
    let doc = GraphBuilder::new()
        .node("loop", "hostile.spin")
        .limits(NodeLimits {
            fuel: Some(2_000_000),
            ..Default::default()
        })
        .node("out", "heddle.output")
        .edge("loop", "out", "out", "value")
        .build();
    let reg = registry(WasmConfig::default()).await;
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap();
    assert!(err.contains("loop") && err.contains("fuel"), "{err}");

    let doc = graph(
        &[
            ("raw", "heddle.constant", json!({"value": "{not json"})),
            ("parse", "std.json.parse", json!({})),
            ("out", "heddle.output", json!({})),
        ],
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
        &[
            (
                "text",
                "heddle.constant",
                json!({"value": "written by a graph"}),
            ),
            (
                "write",
                "files.write_text",
                json!({"path": "/data/note.txt"}),
            ),
            ("read", "files.read_text", json!({})),
            ("out", "heddle.output", json!({})),
        ],
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
