//! A node whose package lets its invocations run at once (`files.write_text`) runs a
//! fan-out's items side by side; with fewer pool slots than items running together,
//! the invocations wait for a slot instead of failing to instantiate. Idle warm
//! instances hold pool slots too, and give them up to a node that needs one.

mod common;

use std::sync::Arc;

use common::*;
use heddle_core::RunStatus;
use heddle_core::builder::graph;
use heddle_kernel::runtime::RunOptions;
use heddle_kernel::{Registry, run_graph};
use heddle_wasm::{DirGrant, DirMode, EngineSettings, PackageGrant, WasmConfig};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_invocations_at_once_than_pool_slots_wait_for_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = WasmConfig {
        wasm: EngineSettings {
            pool_instances: 2,
            ..settings()
        },
        ..Default::default()
    };
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
    let p = first_party_provider(config).await;
    assert!(
        p.host().is_pooling(),
        "the test needs the pooling allocator"
    );
    let mut reg = Registry::with_builtins();
    reg.add(Arc::new(p)).unwrap();
    let items: Vec<String> = (0..40).map(|i| format!("{i}\n")).collect();
    let doc = graph(
        &[
            ("items", "heddle.constant", json!({"value": items})),
            ("each", "heddle.foreach", json!({})),
            (
                "w",
                "files.write_text",
                json!({"path": "/data/log.txt", "append": true}),
            ),
            ("all", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("items", "value", "each", "list"),
            ("each", "item", "w", "text"),
            ("w", "bytes", "all", "item"),
            ("all", "list", "out", "value"),
        ],
    );
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.nodes["w"].invocations, 40);
    let bytes: Vec<i64> = r.outputs["out"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let want: Vec<i64> = (0..40).map(|i| format!("{i}\n").len() as i64).collect();
    assert_eq!(bytes, want, "item order kept");
    let mut lines: Vec<String> = std::fs::read_to_string(dir.path().join("log.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort_by_key(|l| l.parse::<i64>().unwrap());
    let want: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    assert_eq!(lines, want, "each item appended once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_more_warm_nodes_than_pool_slots_completes() {
    // Every `std.math.arith` node keeps a warm instance between its invocations, each
    // holding a pool slot: with 3 slots, the 4th node needs one an idle node gives up
    // (before, it failed with the pool's "maximum concurrent limit ... reached").
    let config = WasmConfig {
        wasm: EngineSettings {
            pool_instances: 3,
            ..settings()
        },
        ..Default::default()
    };
    let p = first_party_provider(config).await;
    assert!(
        p.host().is_pooling(),
        "the test needs the pooling allocator"
    );
    let mut reg = Registry::with_builtins();
    reg.add(Arc::new(p)).unwrap();
    let n = 12;
    let mut nodes = vec![(
        "items".to_string(),
        "heddle.constant",
        json!({"value": [1, 2, 3, 4, 5]}),
    )];
    nodes.push(("each".into(), "heddle.foreach", json!({})));
    let mut edges = vec![("items".to_string(), "value", "each".to_string(), "list")];
    let mut prev = ("each".to_string(), "item");
    for i in 0..n {
        let id = format!("w{i}");
        nodes.push((id.clone(), "std.math.arith", json!({"b": 1, "op": "add"})));
        edges.push((prev.0.clone(), prev.1, id.clone(), "a"));
        prev = (id, "result");
    }
    nodes.push(("all".into(), "heddle.collect", json!({})));
    nodes.push(("out".into(), "heddle.output", json!({"name": "out"})));
    edges.push((prev.0.clone(), prev.1, "all".into(), "item"));
    edges.push(("all".into(), "list", "out".into(), "value"));
    let node_refs: Vec<(&str, &str, serde_json::Value)> = nodes
        .iter()
        .map(|(id, t, v)| (id.as_str(), *t, v.clone()))
        .collect();
    let edge_refs: Vec<(&str, &str, &str, &str)> = edges
        .iter()
        .map(|(a, b, c, d)| (a.as_str(), *b, c.as_str(), *d))
        .collect();
    let doc = graph(&node_refs, &edge_refs);
    let r = run_graph(&doc, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let got: Vec<i64> = r.outputs["out"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![13, 14, 15, 16, 17]);
}
