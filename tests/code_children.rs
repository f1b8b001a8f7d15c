//! SIGKILL of a plain `heddle run --durable` takes a subprocess-mode code node's whole
//! process group with it, not only the code's own process: a background child the code
//! started, which appends a line to a file every 50 ms, stops writing. Counted in the
//! file and in `/proc`, outside heddle.

mod support;

use std::time::{Duration, Instant};

use support::store::StoreDir;

/// `loop` starts a background writer (its pid in `DIR/bg.pid`, a line per tick in
/// `DIR/ticks.txt`) and waits far longer than the test.
fn graph(dir: &std::path::Path) -> String {
    let code = format!(
        "(echo $BASHPID > {d}/bg.pid; while true; do echo tick >> {d}/ticks.txt; sleep 0.05; done) & sleep 600",
        d = dir.display()
    );
    serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "loop", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": code}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [{"source": "loop", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]})
    .to_string()
}

/// Polls `done` until it holds; panics after `limit` (a bound on a hang, not a timing
/// requirement).
fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ticks(env: &StoreDir) -> usize {
    std::fs::read_to_string(env.path().join("ticks.txt"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Whether `pid` is a live process (a zombie is dead: it only waits to be reaped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
    })
}

#[test]
fn a_killed_durable_run_takes_its_code_nodes_background_children_with_it() {
    let env = StoreDir::new();
    std::fs::write(env.path().join("g.json"), graph(env.path())).unwrap();
    let (mut child, _lines) = env.spawn(&["run", "--durable", "g.json"]);
    let bg_pid = || {
        std::fs::read_to_string(env.path().join("bg.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    until(
        "the background writer to tick",
        Duration::from_secs(120),
        || bg_pid().is_some() && ticks(&env) >= 3,
    );
    let bg = bg_pid().unwrap();
    assert!(alive(bg));

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    until(
        "the background writer to die with heddle",
        Duration::from_secs(30),
        || !alive(bg),
    );
    // Nothing writes any more: the count stays as it is.
    let after = ticks(&env);
    assert!(after >= 3);
    assert!(!alive(bg));
    assert_eq!(ticks(&env), after);
}
