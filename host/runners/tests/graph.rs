//! Code nodes inside whole runs: the example graph through the kernel (plan → actors →
//! code nodes), and run-level cancellation reaching the container.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use heddle_core::{EventKind, GraphDoc, RunStatus, Value};
use heddle_kernel::{Registry, Run, RunOptions, run_graph};
use heddle_runners::{CodeNodes, RunnersConfig};
use serde_json::json;

fn example() -> GraphDoc {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/code-pipeline.json");
    GraphDoc::load(&path).expect("example graph parses")
}

fn registry(config: RunnersConfig) -> Registry {
    let mut r = Registry::with_builtins();
    r.add(Arc::new(CodeNodes::new(config)))
        .expect("code node types are new");
    r
}

fn check_pipeline_outputs(r: &heddle_core::RunResult) {
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let last = |name: &str| r.outputs[name].last().unwrap().to_json();
    assert_eq!(
        last("stats"),
        json!({"count": 8, "mean": 3.875, "median": 3.5, "max": 9})
    );
    assert_eq!(
        last("sentence"),
        json!("8 numbers, mean 3.875, median 3.5, max 9")
    );
    assert_eq!(
        last("shouted"),
        json!("8 NUMBERS, MEAN 3.875, MEDIAN 3.5, MAX 9")
    );
    assert_eq!(
        r.outputs["python_log"],
        vec![Value::str("processing 8 numbers")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_code_pipeline_runs_in_docker() {
    if !docker_ready().await {
        return;
    }
    let r = run_graph(
        &example(),
        &registry(RunnersConfig::default()),
        RunOptions::default(),
    )
    .await
    .expect("example graph is valid");
    check_pipeline_outputs(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_code_pipeline_runs_in_subprocess_mode() {
    let mut doc = example();
    for n in &mut doc.nodes {
        if n.node_type.starts_with("code.") {
            n.properties.insert("mode".into(), Value::str("subprocess"));
        }
    }
    let config = RunnersConfig {
        allow_subprocess: true,
        ..RunnersConfig::default()
    };
    let r = run_graph(&doc, &registry(config), RunOptions::default())
        .await
        .expect("example graph is valid");
    check_pipeline_outputs(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_run_removes_the_container() {
    if !docker_ready().await {
        return;
    }
    let id = node_id("run-cancel");
    let doc = GraphDoc::parse(
        &json!({
            "format": "heddle.graph", "version": 1,
            "nodes": [
                {"id": id, "type": "code.bash", "properties": {
                    "code": "echo started; sleep 60", "timeout_s": 120}},
                {"id": "log", "type": "heddle.output"}
            ],
            "edges": [{"source": id, "sourceHandle": "stdout", "target": "log", "targetHandle": "value"}]
        })
        .to_string(),
        "inline",
    )
    .unwrap();
    let reg = registry(RunnersConfig::default());
    let plan = heddle_core::plan::plan(&doc, &reg).expect("valid graph");
    let run = Run::new(plan, &reg, RunOptions::default()).expect("run");
    let mut events = run.subscribe();
    let handle = run.start();
    while let Some(e) = events.next().await {
        if let EventKind::Output { value, .. } = &e.kind
            && value.as_str() == Some("started")
        {
            break;
        }
    }
    assert_eq!(
        containers_of(&id).await.len(),
        1,
        "container runs before the cancel"
    );
    handle.cancel();
    let r = handle.wait().await;
    assert_eq!(r.status, RunStatus::Cancelled);
    let left = containers_of(&id).await;
    assert!(left.is_empty(), "containers left after cancel: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_run_kills_the_subprocess_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let code = format!(
        "sleep 300 & echo $! > {p}; echo $$ >> {p}; echo started; wait",
        p = pidfile.display()
    );
    let doc = GraphDoc::parse(
        &json!({
            "format": "heddle.graph", "version": 1,
            "nodes": [
                {"id": "sleeper", "type": "code.bash", "properties": {
                    "code": code, "mode": "subprocess", "timeout_s": 120}},
                {"id": "log", "type": "heddle.output"}
            ],
            "edges": [{"source": "sleeper", "sourceHandle": "stdout", "target": "log", "targetHandle": "value"}]
        })
        .to_string(),
        "inline",
    )
    .unwrap();
    let reg = registry(RunnersConfig {
        allow_subprocess: true,
        ..RunnersConfig::default()
    });
    let plan = heddle_core::plan::plan(&doc, &reg).expect("valid graph");
    let run = Run::new(plan, &reg, RunOptions::default()).expect("run");
    let mut events = run.subscribe();
    let handle = run.start();
    while let Some(e) = events.next().await {
        if let EventKind::Output { value, .. } = &e.kind
            && value.as_str() == Some("started")
        {
            break;
        }
    }
    handle.cancel();
    let r = handle.wait().await;
    assert_eq!(r.status, RunStatus::Cancelled);
    for pid in std::fs::read_to_string(&pidfile).unwrap().lines() {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let alive =
            !stat.is_empty() && !stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z'));
        assert!(!alive, "process {pid} outlived the cancelled run: {stat}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_fails_the_run_before_any_node_starts() {
    if !docker_ready().await {
        return;
    }
    let mut doc = example();
    for n in &mut doc.nodes {
        if n.id == "shout" {
            n.properties
                .insert("image".into(), Value::str("heddle/not-built:0"));
        }
    }
    let r = run_graph(
        &doc,
        &registry(RunnersConfig::default()),
        RunOptions::default(),
    )
    .await
    .expect("graph is valid");
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap_or_default();
    assert!(
        err.contains("heddle/not-built:0") && err.contains("heddle images build"),
        "{err}"
    );
    assert!(r.outputs.is_empty(), "nothing ran: {:?}", r.outputs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_engine_fails_the_run_before_any_node_starts() {
    let config = RunnersConfig {
        docker_host: Some("unix:///nonexistent/heddle-test/docker.sock".into()),
        ..RunnersConfig::default()
    };
    let r = run_graph(&example(), &registry(config), RunOptions::default())
        .await
        .expect("graph is valid");
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap_or_default();
    assert!(
        err.contains("no Docker engine") && err.contains("subprocess"),
        "{err}"
    );
}
