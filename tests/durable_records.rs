//! What a durable run writes per invocation of a retry-safe WASM node: its result and
//! nothing before it (its sandbox has no network, so an attempt lost in a crash spent
//! nothing to account, and a start record would only double the log). Recovery from a
//! crash after such a node started re-runs it, as the crash table says for retry-safe
//! work.

mod support;

use std::process::{Command, Output};

use support::{OK, expect_code, json, stderr};

/// `c` → `up` (`std.text.case`, a retry-safe WASM node) → `out`.
const GRAPH: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "quiet"}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

fn heddle(dir: &std::path::Path, args: &[&str], fault: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_heddle"));
    c.args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env_remove("HEDDLE_FAULT");
    if let Some(f) = fault {
        c.env("HEDDLE_FAULT", f);
    }
    c.output().expect("heddle starts")
}

fn run_id(o: &Output) -> String {
    let e = stderr(o);
    e.lines()
        .find_map(|l| l.strip_prefix("durable run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id printed:\n{e}"))
        .to_string()
}

fn occurrence_of(dir: &std::path::Path, id: &str, node: &str) -> serde_json::Value {
    let o = heddle(dir, &["runs", "show", id, "--json"], None);
    expect_code(&o, OK);
    let show = json(&o);
    show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == node)
        .unwrap_or_else(|| panic!("no occurrence of {node}: {show:#}"))
        .clone()
}

#[test]
fn a_retry_safe_wasm_invocation_records_its_result_and_no_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("g.json"), GRAPH).unwrap();
    let o = heddle(dir.path(), &["run", "--durable", "--json", "g.json"], None);
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["out"], serde_json::json!(["QUIET"]));
    let up = occurrence_of(dir.path(), &run_id(&o), "up");
    assert_eq!(up["result"]["outcome"], "completed", "{up:#}");
    assert_eq!(up["started"], 0, "{up:#}");
    assert_eq!(up["dispatched"], 0, "{up:#}");
}

#[test]
fn a_crash_after_a_retry_safe_wasm_node_started_reruns_it_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("g.json"), GRAPH).unwrap();
    let o = heddle(
        dir.path(),
        &["run", "--durable", "g.json"],
        Some("after-start:up"),
    );
    assert_eq!(o.status.code(), None, "not aborted:\n{}", stderr(&o));
    let id = run_id(&o);
    let o = heddle(dir.path(), &["runs", "resume", &id, "--json"], None);
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["out"], serde_json::json!(["QUIET"]));
    let up = occurrence_of(dir.path(), &id, "up");
    assert_eq!(up["result"]["outcome"], "completed", "{up:#}");
}
