//! A durable run whose run time is used up, end to end with the real binary: the run
//! limit ends it (exit 6, saying which budget), and `heddle runs resume` then refuses it
//! with the documented exit code and message, re-executing nothing (counted on the
//! provider side: the lines a node appended to a granted file); and the limit cancels
//! work in flight when it expires, a WASM guest's loop and a code node's processes.

#[path = "../host/wasm/tests/common/mod.rs"]
mod common;
mod support;

use std::process::{Command, Output, Stdio};

use support::{Backend, INVALID, code, expect_code, stderr};

// On a store file and on PostgreSQL (the budget is recorded with the run in either).
crate::both!(a_run_whose_time_is_used_up_ends_and_a_resume_reruns_nothing);

/// `config` with its runs on `b`: on PostgreSQL a fresh database (`[store] url`) beside
/// the path, which is then never created.
fn on(b: Backend, config: &str) -> String {
    match b {
        Backend::Sqlite => config.to_string(),
        Backend::Postgres => {
            let url = support::pg::fresh_database();
            let c = config.replacen(
                "path = \"runs.db\"\n",
                &format!("path = \"runs.db\"\nurl = \"{url}\"\n"),
                1,
            );
            assert!(c.contains(&url));
            c
        }
    }
}

/// Exit code of a spent budget (README exit code table).
const LIMIT: i32 = 6;

const CONFIG: &str = r#"
[packages.files]
dirs = [{ host = "./data", guest = "/data", mode = "rw" }]

[store]
path = "runs.db"
"#;

/// `w` appends a line to /data/log.txt (not retry-safe, so a re-run would show as a
/// second line); `lines` is a streaming input that only ends when stdin does, so the
/// run is still going when its time runs out, whatever the machine's speed.
const GRAPH: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "one\n"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "lines", "type": "heddle.input", "properties": {"name": "lines", "streaming": true}},
    {"id": "out", "type": "heddle.output"},
    {"id": "seen", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "path", "target": "out", "targetHandle": "value"},
    {"source": "lines", "sourceHandle": "value", "target": "seen", "targetHandle": "value"}
  ]
}"#;

fn cmd(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_heddle"));
    c.args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env_remove("HEDDLE_FAULT");
    c
}

fn lines(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("data/log.txt"))
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

fn run_id(o: &Output) -> String {
    let e = stderr(o);
    e.lines()
        .find_map(|l| l.strip_prefix("durable run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id printed:\n{e}"))
        .to_string()
}

fn a_run_whose_time_is_used_up_ends_and_a_resume_reruns_nothing(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("data")).unwrap();
    std::fs::write(d.join("heddle.toml"), on(b, CONFIG)).unwrap();
    std::fs::write(d.join("g.json"), GRAPH).unwrap();

    let mut child = cmd(
        d,
        &[
            "run",
            "--durable",
            "--time-limit-ms",
            "1",
            "--stream",
            "lines",
            "g.json",
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("heddle starts");
    // Held open until the run has ended: only the time limit can end it.
    let stdin = child.stdin.take();
    let o = child.wait_with_output().expect("heddle ends");
    drop(stdin);
    expect_code(&o, LIMIT);
    assert!(
        stderr(&o).contains("run time limit exhausted"),
        "{}",
        stderr(&o)
    );
    let id = run_id(&o);
    let before = lines(d);

    let o = cmd(d, &["runs", "resume", &id]).output().unwrap();
    assert_eq!(code(&o), INVALID, "{}", stderr(&o));
    support::no_panic(&o);
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "run {id} is failed: only a paused or interrupted run can be resumed"
        )),
        "the refusal names the run and how it ended: {e}"
    );
    assert_eq!(lines(d), before, "nothing ran again");

    // The show command agrees: the run is over, its time spent.
    let o = cmd(d, &["runs", "show", &id, "--json"]).output().unwrap();
    expect_code(&o, support::OK);
    let show = support::json(&o);
    assert_eq!(show["state"], "failed", "{show:#}");
}

/// `heddle run --durable --time-limit-ms 300 --json` of `graph` in `dir`: the run must be
/// ended by its time limit (exit 6) while its node is still at work, and the report says
/// how that node ended.
fn limited_run(dir: &std::path::Path, graph: &serde_json::Value) -> serde_json::Value {
    std::fs::write(dir.join("g.json"), graph.to_string()).unwrap();
    let o = cmd(
        dir,
        &[
            "run",
            "--durable",
            "--time-limit-ms",
            "300",
            "--json",
            "g.json",
        ],
    )
    .output()
    .unwrap();
    expect_code(&o, LIMIT);
    support::no_panic(&o);
    let report = support::json(&o);
    assert_eq!(
        report["outcome"], "failed",
        "a spent budget ends the run failed: {report:#}"
    );
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|e| e.contains("run time limit exhausted")),
        "{report:#}"
    );
    report
}

/// A WASM guest that never yields (a loop with fuel and a node deadline far beyond the
/// run's limit): the run's time limit cancels it in flight, as a node's own time limit
/// would, instead of waiting for it (issue 27 item 8). Without that, the node would be
/// stopped by its own 60 s deadline and report `timed_out`.
#[test]
fn the_run_time_limit_cancels_a_spinning_wasm_node_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("heddle.toml"),
        "[packages.hostile]\nfuel = 9223372036854775807\ntimeout_ms = 60000\n\n[store]\npath = \"runs.db\"\n",
    )
    .unwrap();
    let pkg = common::package_dir("hostile");
    let o = cmd(d, &["package", "add", pkg.to_str().unwrap()])
        .output()
        .unwrap();
    expect_code(&o, support::OK);
    let graph = serde_json::json!({
        "nodes": [
            {"id": "spin", "type": "hostile.spin"},
            {"id": "out", "type": "heddle.output", "properties": {"name": "out"}},
        ],
        "edges": [{"source": "spin", "sourceHandle": "out", "target": "out", "targetHandle": "value"}],
    });
    let report = limited_run(d, &graph);
    let spin = &report["nodes"]["spin"];
    assert_ne!(spin["status"], "done", "{report:#}");
    assert_eq!(
        spin["timed_out"], false,
        "cancelled by the run's limit: {report:#}"
    );
}

/// A subprocess code node that keeps working (a tick a line every 50 ms, for 20 s, then
/// `done`): the run's time limit kills it in flight with its whole process group: no
/// `done` line, and no tick lands after heddle exited (counted in the file it writes).
#[test]
fn the_run_time_limit_kills_a_working_code_node_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("heddle.toml"),
        "[runners]\nallow_subprocess = true\n\n[store]\npath = \"runs.db\"\n",
    )
    .unwrap();
    let ticks = d.join("ticks");
    let code = format!(
        "for i in $(seq 1 400); do echo $i >> '{t}'; sleep 0.05; done; echo done >> '{t}'",
        t = ticks.display()
    );
    let graph = serde_json::json!({
        "nodes": [
            {"id": "work", "type": "code.bash", "timeout_ms": 60000,
             "properties": {"code": code, "mode": "subprocess"}},
            {"id": "out", "type": "heddle.output", "properties": {"name": "out"}},
        ],
        "edges": [{"source": "work", "sourceHandle": "result", "target": "out", "targetHandle": "value"}],
    });
    let report = limited_run(d, &graph);
    assert_ne!(report["nodes"]["work"]["status"], "done", "{report:#}");
    let read = || std::fs::read_to_string(&ticks).unwrap_or_default();
    let at_exit = read();
    assert!(
        !at_exit.contains("done"),
        "the node ran to its end: {at_exit}"
    );
    // Ten ticks' time: a loop still alive would have written more.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        read(),
        at_exit,
        "the node's work went on after heddle exited"
    );
}
