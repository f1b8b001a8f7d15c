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

/// Node declarations written at top level (`access`, `timeout_ms`, `retry`), read from a
/// graph file the way a user writes them.
fn declared(nodes: serde_json::Value, edges: serde_json::Value) -> heddle_core::GraphDoc {
    let text = json!({"nodes": nodes, "edges": edges}).to_string();
    heddle_core::GraphDoc::parse(&text, "declared.json").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_read_and_none_withhold_the_files_from_a_wasm_node() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "granted").unwrap();
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
    let reg = registry(config).await;
    let write = |access: &str| {
        declared(
            json!([
                {"id": "text", "type": "heddle.constant", "properties": {"value": "x"}},
                {"id": "write", "type": "files.write_text", "access": access,
                 "properties": {"path": "/data/out.txt"}},
                {"id": "out", "type": "heddle.output"}
            ]),
            json!([
                {"source": "text", "sourceHandle": "value", "target": "write", "targetHandle": "text"},
                {"source": "write", "sourceHandle": "path", "target": "out", "targetHandle": "value"}
            ]),
        )
    };
    // Read access: WASI refuses the write (the directory is preopened read-only).
    let r = run_graph(&write("read"), &reg, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.error.unwrap().contains("write"));
    assert!(!dir.path().join("out.txt").exists());
    // None: not even a read reaches the granted directory.
    let read = declared(
        json!([
            {"id": "read", "type": "files.read_text", "access": "none",
             "properties": {"path": "/data/in.txt"}},
            {"id": "out", "type": "heddle.output"}
        ]),
        json!([{"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]),
    );
    let r = run_graph(&read, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Failed, "{:?}", r.outputs);
    // Write (the default) works inside the grant: the refusals came from the level.
    let r = run_graph(&write("write"), &reg, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "x"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wasm_time_limit_interrupts_the_guest_and_retry_runs_it_again() {
    let reg = registry(WasmConfig::default()).await;
    let doc = declared(
        json!([
            {"id": "sleep", "type": "hostile.sleep", "timeout_ms": 200, "access": "none",
             "retry": {"attempts": 2, "backoff_ms": 1}},
            {"id": "out", "type": "heddle.output"},
            {"id": "free", "type": "heddle.constant", "properties": {"value": 1}},
            {"id": "other", "type": "heddle.output", "properties": {"name": "other"}}
        ]),
        json!([
            {"source": "sleep", "sourceHandle": "out", "target": "out", "targetHandle": "value"},
            {"source": "free", "sourceHandle": "value", "target": "other", "targetHandle": "value"}
        ]),
    );
    // The guest sleeps an hour: the run ends because each attempt is interrupted.
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        run_graph(&doc, &reg, RunOptions::default()),
    )
    .await
    .expect("the guest was never interrupted")
    .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let attempts: Vec<(u32, bool)> = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            heddle_core::EventKind::Invocation {
                node_id,
                attempt,
                timed_out,
                ..
            } if node_id == "sleep" => Some((*attempt, *timed_out)),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [(1, true), (2, true)]);
    assert_eq!(r.nodes["sleep"].invocations, 2);
    assert!(r.error.unwrap().contains("deadline"));
    assert_eq!(r.outputs["other"], vec![Value::Int(1)]);
}
