//! A process running a graph is killed with `kill -9` mid-run, the way an operator or
//! the OOM killer does: its code's processes die with it (the group's guard), and what
//! it leaves behind (its container on the engine, its scratch directory) is removed by
//! the next run. Counted by container label, by the
//! processes' environment and by directory name.
//!
//! The killed process is this test binary run again as a child (`killed_child_run`,
//! ignored unless asked for), which runs the graph through the kernel and the code
//! nodes as `heddle run` does.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use heddle_core::{GraphDoc, RunStatus};
use heddle_kernel::{Registry, RunOptions, run_graph};
use heddle_runners::{CodeNodes, RunnersConfig};
use serde_json::json;

/// Set in the child: the id prefix of the nodes it runs.
const CHILD_IDS: &str = "HEDDLE_TEST_KILLED_IDS";

fn registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.add(Arc::new(CodeNodes::new(RunnersConfig {
        allow_subprocess: true,
        ..RunnersConfig::default()
    })))
    .expect("code node types are new");
    r
}

/// One Docker-mode and one subprocess-mode Bash node running `code` (`{id}-d`, `{id}-s`).
fn graph(id: &str, code: &str) -> GraphDoc {
    let node = |suffix: &str, mode: &str| {
        json!({"id": format!("{id}-{suffix}"), "type": "code.bash", "properties": {
            "code": code, "mode": mode, "timeout_s": 600}})
    };
    GraphDoc::parse(
        &json!({
            "format": "heddle.graph", "version": 1,
            "nodes": [node("d", "docker"), node("s", "subprocess")],
            "edges": []
        })
        .to_string(),
        "inline",
    )
    .expect("graph parses")
}

/// The child's part: runs a graph whose code never ends by itself. In the subprocess
/// node, `sleep 300 &` is a process the code starts in turn, in the code's group: it
/// dies with the group.
#[test]
#[ignore = "run by killed_run_leaves_nothing_once_the_next_run_starts"]
fn killed_child_run() {
    let Ok(id) = std::env::var(CHILD_IDS) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let doc = graph(&id, "sleep 300 & echo up; sleep 300");
    let r = rt.block_on(run_graph(&doc, &registry(), RunOptions::default()));
    panic!("the run was meant to be killed, yet it ended: {r:?}");
}

/// Pids of live processes whose environment holds `HEDDLE_NODE_ID=node`. Zombies
/// (already dead, waiting to be reaped) show no environment.
fn node_processes(node: &str) -> Vec<u32> {
    let mark = format!("HEDDLE_NODE_ID={node}").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == mark.as_slice()))
        })
        .collect()
}

/// Scratch directories created for the process `pid` (their name holds its owner token).
fn scratch_dirs_of(pid: u32) -> usize {
    use std::os::unix::fs::MetadataExt;
    let uid = tempfile::tempfile().unwrap().metadata().unwrap().uid();
    let root = std::env::temp_dir().join(format!("heddle-code-{uid}"));
    let Ok(dir) = std::fs::read_dir(root) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.split('-').nth(2) == Some(pid.to_string().as_str()))
        })
        .count()
}

/// Polls `done` until it holds; fails after `limit` (a bound on a hang, not a timing
/// requirement).
async fn until(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !done().await {
        assert!(t0.elapsed() < limit, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The child, killed should the test fail before it kills it itself.
struct ChildRun(Child);

impl Drop for ChildRun {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_child(id: &str) -> ChildRun {
    ChildRun(
        Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "killed_child_run", "--nocapture"])
            .env(CHILD_IDS, id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_run_leaves_nothing_once_the_next_run_starts() {
    if !docker_ready().await {
        return;
    }
    let id = node_id("killed");
    let (docker_node, sub_node) = (format!("{id}-d"), format!("{id}-s"));
    let mut child = start_child(&id);
    let pid = child.0.id();
    until(
        "both code nodes running",
        Duration::from_secs(120),
        async || {
            // The background sleep and the foreground one (bash execs its last command).
            !containers_of(&docker_node).await.is_empty() && node_processes(&sub_node).len() >= 2
        },
    )
    .await;
    assert!(
        scratch_dirs_of(pid) >= 1,
        "the subprocess run has a scratch dir"
    );

    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();

    // The code's process group goes with its parent: the code's own process and the
    // background one it started (its group's guard kills the group).
    until(
        "the code's processes to die with their parent",
        Duration::from_secs(30),
        async || node_processes(&sub_node).is_empty(),
    )
    .await;
    // What nobody can clean at the moment of a kill -9 is still there.
    assert_eq!(containers_of(&docker_node).await.len(), 1);
    assert!(scratch_dirs_of(pid) >= 1);

    // The next run, by another process (here: this one), cleans up before it starts.
    let next = graph(&node_id("next"), "echo ok");
    let r = run_graph(&next, &registry(), RunOptions::default())
        .await
        .expect("valid graph");
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);

    assert_eq!(containers_of(&docker_node).await, Vec::<String>::new());
    until(
        "the killed run's processes to be gone",
        Duration::from_secs(30),
        async || node_processes(&sub_node).is_empty(),
    )
    .await;
    assert_eq!(
        scratch_dirs_of(pid),
        0,
        "scratch directories of the killed run"
    );
}
