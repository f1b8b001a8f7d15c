//! The bad inputs of per-node declarations, with the real `heddle` binary: a retry on a
//! node that may edit and an access level its executor cannot enforce are refused
//! before anything runs (exit 2), naming the node, and the same graph made safe runs.

mod support;

use support::*;

/// `c` feeds `w` (`files.write_text`, not retry-safe) with `decl` merged into `w`.
fn writer(decl: &str) -> String {
    format!(
        r#"{{"nodes": [
  {{"id": "c", "type": "heddle.constant", "properties": {{"value": "x"}}}},
  {{"id": "w", "type": "files.write_text", "properties": {{"path": "/data/f.txt"}}{decl}}},
  {{"id": "out", "type": "heddle.output"}}
], "edges": [
  {{"source": "c", "sourceHandle": "value", "target": "w", "targetHandle": "text"}},
  {{"source": "w", "sourceHandle": "path", "target": "out", "targetHandle": "value"}}
]}}"#
    )
}

#[test]
fn a_retry_on_a_node_that_may_edit_is_refused_before_the_run_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    write(
        dir.path(),
        "heddle.toml",
        "[packages.files]\ndirs = [{ host = \"./data\", guest = \"/data\", mode = \"rw\" }]\n",
    );
    write(
        dir.path(),
        "g.json",
        &writer(r#", "retry": {"attempts": 3}"#),
    );
    for cmd in ["validate", "run"] {
        let o = heddle_in(dir.path(), &[cmd, "g.json"]);
        expect_code(&o, INVALID);
        no_panic(&o);
        let e = stderr(&o);
        assert!(e.contains("node w") && e.contains("may edit"), "{e}");
    }
    // Nothing ran: the file the node would write does not exist.
    assert!(!dir.path().join("data/f.txt").exists());
    let o = heddle_in(dir.path(), &["validate", "g.json", "--json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["issues"][0]["kind"], "invalid_limits");
    assert_eq!(v["issues"][0]["node"], "w");

    // Read access makes the retry allowed, and WASI then refuses the write itself.
    write(
        dir.path(),
        "g.json",
        &writer(r#", "access": "read", "retry": {"attempts": 2}"#),
    );
    let o = heddle_in(dir.path(), &["validate", "g.json"]);
    expect_code(&o, OK);
    let o = heddle_in(dir.path(), &["run", "g.json", "--json"]);
    expect_code(&o, FAILED);
    assert_eq!(json(&o)["nodes"]["w"]["invocations"], 2);
    assert!(!dir.path().join("data/f.txt").exists());

    // A durable run records every attempt's start and the policy's retry verdict.
    let mut toml = std::fs::read_to_string(dir.path().join("heddle.toml")).unwrap();
    toml.push_str("[store]\npath = \"runs.db\"\n");
    write(dir.path(), "heddle.toml", &toml);
    let o = heddle_in(dir.path(), &["run", "--durable", "g.json"]);
    expect_code(&o, FAILED);
    let e = stderr(&o);
    let run = e
        .lines()
        .find_map(|l| l.strip_prefix("durable run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id:\n{e}"));
    let o = heddle_in(dir.path(), &["runs", "show", run, "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    let w = v["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == "w")
        .unwrap();
    assert_eq!(w["started"], 2, "{w}");
    assert_eq!(w["verdicts"][0]["verdict"], "retry", "{w}");
    assert_eq!(w["verdicts"][0]["attempt"], 1, "{w}");
    // Every attempt is charged to the run: the retry is a second dispatch.
    assert_eq!(v["dispatches"], 2, "{v:#}");

    // So a dispatch budget that covers the first attempt only stops the retry.
    let o = heddle_in(
        dir.path(),
        &["run", "--durable", "--max-dispatches", "1", "g.json"],
    );
    expect_code(&o, 6);
    let e = stderr(&o);
    assert!(e.contains("dispatch budget exhausted"), "{e}");
    assert!(e.contains("attempt 2"), "{e}");

    // A crash after the first attempt started does not refill the retry allowance: the
    // attempt an explicit resume re-offers is the second and last of the two.
    let o = command(dir.path())
        .args(["run", "--durable", "g.json"])
        .env("HEDDLE_FAULT", "after-start:w")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), None, "not aborted:\n{}", stderr(&o));
    let run = run_id(&o);
    // The started, not retry-safe attempt pauses the run for reconciliation first.
    expect_code(&heddle_in(dir.path(), &["runs", "resume", &run]), SUSPENDED);
    let o = heddle_in(dir.path(), &["runs", "resume", &run, "--json"]);
    expect_code(&o, FAILED);
    let o = heddle_in(dir.path(), &["runs", "show", &run, "--json"]);
    let v = json(&o);
    let w = v["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == "w")
        .unwrap();
    assert_eq!(
        w["started"], 2,
        "one attempt before the crash, one after: {w}"
    );
    assert!(
        w["verdicts"].as_array().is_none_or(|v| v.is_empty()),
        "the policy's two attempts were spent; nothing retried: {w}"
    );
}

/// The id a durable run prints first (`durable run ID …` on stderr).
fn run_id(o: &std::process::Output) -> String {
    let e = stderr(o);
    e.lines()
        .find_map(|l| l.strip_prefix("durable run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id:\n{e}"))
        .to_string()
}

#[test]
fn an_access_level_the_executor_cannot_enforce_is_refused_naming_node_level_and_executor() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "heddle.toml",
        "[runners]\nallow_subprocess = true\n",
    );
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [{"id": "sh", "type": "code.bash", "access": "read",
            "properties": {"mode": "subprocess", "code": "echo hi"}}]}"#,
    );
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("node sh") && e.contains("access `read`") && e.contains("code.bash"),
        "{e}"
    );
}
