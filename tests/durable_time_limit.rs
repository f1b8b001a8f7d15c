//! A durable run whose run time is used up, end to end with the real binary: the run
//! limit ends it (exit 6, saying which budget), and `heddle runs resume` then refuses it
//! with the documented exit code and message, re-executing nothing (counted on the
//! provider side: the lines a node appended to a granted file).

mod support;

use std::process::{Command, Output, Stdio};

use support::{INVALID, code, expect_code, stderr};

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

#[test]
fn a_run_whose_time_is_used_up_ends_and_a_resume_reruns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("data")).unwrap();
    std::fs::write(d.join("heddle.toml"), CONFIG).unwrap();
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
