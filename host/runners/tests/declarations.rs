//! A code node's `timeout_ms`, `access` and `retry` written in a graph, through the
//! kernel: the time limit kills the work (process group, container) and marks the
//! attempt timed out, retry runs it again, access is imposed by the mount the container
//! gets, and a level the executor cannot enforce is refused before anything runs.

mod common;

use std::sync::Arc;

use common::*;
use heddle_core::plan::IssueKind;
use heddle_core::{EventKind, GraphDoc, RunResult, RunStatus, Value};
use heddle_kernel::{Registry, RunOptions, run_graph};
use heddle_runners::{CodeNodes, RunnersConfig};
use serde_json::json;

fn registry(nodes: CodeNodes) -> Registry {
    let mut r = Registry::with_builtins();
    r.add(Arc::new(nodes)).expect("code node types are new");
    r
}

/// Node `n` (declared by `node`) feeding output `out`, beside an independent constant
/// reaching output `other`.
fn doc(node: serde_json::Value) -> GraphDoc {
    let mut n = node;
    n["id"] = json!("n");
    let text = json!({
        "nodes": [
            n,
            {"id": "out", "type": "heddle.output", "properties": {"name": "out"}},
            {"id": "free", "type": "heddle.constant", "properties": {"value": 1}},
            {"id": "other", "type": "heddle.output", "properties": {"name": "other"}}
        ],
        "edges": [
            {"source": "n", "sourceHandle": "result", "target": "out", "targetHandle": "value"},
            {"source": "free", "sourceHandle": "value", "target": "other", "targetHandle": "value"}
        ]
    });
    GraphDoc::parse(&text.to_string(), "declared.json").unwrap()
}

/// Node `n`'s reported attempts: (attempt, timed out).
fn attempts(r: &RunResult) -> Vec<(u32, bool)> {
    r.events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Invocation {
                node_id,
                attempt,
                timed_out,
                ..
            } if node_id == "n" => Some((*attempt, *timed_out)),
            _ => None,
        })
        .collect()
}

/// Whether process `pid` is gone (or only a zombie waiting for its reaper).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subprocess_time_limit_kills_the_process_group_and_spares_other_branches() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // A grandchild in the node's process group: only a group kill reaches it.
    let d = doc(
        json!({"type": "code.bash", "timeout_ms": 300, "properties": {
            "mode": "subprocess",
            "pidfile": pidfile.to_str().unwrap(),
            "code": "sleep 3600 & echo $! > \"$pidfile\"; wait"
        }}),
    );
    let r = run_graph(&d, &registry(subprocess_nodes()), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(attempts(&r), [(1, true)]);
    let err = r.error.unwrap();
    assert!(
        err.contains("node \"n\"") && err.contains("time limit"),
        "{err}"
    );
    assert_eq!(r.outputs["other"], vec![Value::Int(1)]);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The kill is queued by the kernel; the bound only keeps a broken kill from hanging.
    for _ in 0..500 {
        if gone(pid) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(gone(pid), "the grandchild {pid} outlived the time limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_level_a_subprocess_cannot_enforce_is_refused_before_the_run() {
    let reg = registry(subprocess_nodes());
    for level in ["read", "none"] {
        let d = doc(json!({"type": "code.bash", "access": level,
            "properties": {"mode": "subprocess", "code": "echo hi"}}));
        let err = heddle_core::plan::plan(&d, &reg).unwrap_err();
        let i = &err.issues[0];
        assert_eq!(
            (i.kind, i.node.as_deref()),
            (IssueKind::InvalidProperty, Some("n"))
        );
        assert!(
            i.message.contains(&format!("access `{level}`"))
                && i.message.contains("code.bash")
                && i.message.contains("subprocess"),
            "{i}"
        );
    }
    // Write (the default) needs no enforcing beyond what the host user may do.
    let d = doc(json!({"type": "code.bash", "access": "write",
        "properties": {"mode": "subprocess", "code": "echo hi"}}));
    heddle_core::plan::plan(&d, &reg).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_time_limit_removes_the_container_and_retry_runs_it_again() {
    if !docker_ready().await {
        return;
    }
    let id = node_id("declared-timeout");
    // Access none makes the (not retry-safe) code node allowed to retry.
    let d = doc(
        json!({"type": "code.bash", "timeout_ms": 1500, "access": "none",
        "retry": {"attempts": 2, "backoff_ms": 1},
        "properties": {"code": "sleep 3600"}}),
    );
    let mut d = d;
    d.nodes[0].id = id.clone();
    for e in &mut d.edges {
        if e.source == "n" {
            e.source = id.clone();
        }
    }
    let r = run_graph(&d, &registry(code_nodes()), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let tries: Vec<(u32, bool)> = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Invocation {
                node_id,
                attempt,
                timed_out,
                ..
            } if *node_id == id => Some((*attempt, *timed_out)),
            _ => None,
        })
        .collect();
    assert_eq!(tries, [(1, true), (2, true)]);
    assert_eq!(r.outputs["other"], vec![Value::Int(1)]);
    let left = containers_of(&id).await;
    assert!(left.is_empty(), "containers left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_access_read_mounts_the_workspace_read_only_and_none_mounts_nothing() {
    if !docker_ready().await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(dir.path().join("in.txt"), "seen").unwrap();
    let reg = registry(CodeNodes::new(RunnersConfig {
        workspace_roots: vec![dir.path().to_path_buf()],
        ..RunnersConfig::default()
    }));
    let ws = dir.path().to_str().unwrap();
    // Read: the node reads the workspace, and the kernel refuses its write.
    let d = doc(
        json!({"type": "code.bash", "access": "read", "properties": {
            "workspace": ws,
            "code": "cat /workspace/in.txt; echo x > /workspace/out.txt"
        }}),
    );
    let r = run_graph(&d, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap();
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!dir.path().join("out.txt").exists());
    // None: no mount at all, so the workspace path does not exist in the container.
    let d = doc(
        json!({"type": "code.bash", "access": "none", "properties": {
            "code": "test -e /workspace && echo mounted || echo absent"
        }}),
    );
    let r = run_graph(&d, &reg, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::str("absent")]);
}
