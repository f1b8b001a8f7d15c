//! Issue 13 through the real binary: a hostile package installed with `heddle package
//! add` and run with `heddle run`, one test per defence a user can see from the command
//! line (the library-level tests are in `host/wasm/tests/hostile*.rs`). Name squatting
//! and clashes at install are in `package_store.rs`.

#[path = "../host/wasm/tests/common/mod.rs"]
mod common;
mod support;

use std::path::Path;
use std::process::Output;

use support::*;
use tempfile::TempDir;

/// A directory with the hostile package installed in `.heddle` and `toml` as its
/// `heddle.toml`.
fn with_hostile(toml: &str) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("heddle.toml"), toml).unwrap();
    let pkg = common::package_dir("hostile");
    let o = heddle_in(dir.path(), &["package", "add", pkg.to_str().unwrap()]);
    expect_code(&o, OK);
    dir
}

/// `heddle run --json` of one hostile node `n` of `node_type` with `props`, its output
/// `port` wired to an output named `out`.
fn run_one(dir: &Path, node_type: &str, props: serde_json::Value, port: &str) -> Output {
    let g = serde_json::json!({
        "nodes": [
            {"id": "n", "type": node_type, "properties": props},
            {"id": "out", "type": "heddle.output", "properties": {"name": "out"}},
        ],
        "edges": [{"source": "n", "sourceHandle": port, "target": "out", "targetHandle": "value"}],
    });
    std::fs::write(dir.join("g.json"), g.to_string()).unwrap();
    heddle_in(dir, &["run", "g.json", "--json"])
}

/// The failed node's error line from the run report, after checking the run failed.
fn node_error(o: &Output) -> String {
    expect_code(o, FAILED);
    no_panic(o);
    let v = json(o);
    assert_eq!(v["nodes"]["n"]["status"], "failed", "{v}");
    v["nodes"]["n"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_node_waiting_in_wasi_is_stopped_by_its_timeout_and_by_the_default_deadline() {
    // Issue 13.1: a clock wait runs no guest code, so only the race stops it.
    let dir = with_hostile("[packages.hostile]\ntimeout_ms = 300\n");
    let o = run_one(dir.path(), "hostile.sleep", serde_json::json!({}), "out");
    let e = node_error(&o);
    assert!(e.contains("deadline exceeded"), "{e}");

    // Issue 13.2: without a timeout of its own the engine's default applies.
    std::fs::write(
        dir.path().join("heddle.toml"),
        "[wasm]\ndefault_timeout_ms = 300\n",
    )
    .unwrap();
    let o = run_one(dir.path(), "hostile.sleep", serde_json::json!({}), "out");
    let e = node_error(&o);
    assert!(
        e.contains("deadline exceeded") && e.contains("default deadline of 300 ms"),
        "{e}"
    );
}

#[test]
fn package_add_of_a_describe_that_sleeps_is_refused_in_time() {
    // Issue 13.1: `describe()` at install has its own limit.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("heddle.toml"),
        "[wasm]\ndescribe_timeout_ms = 300\n",
    )
    .unwrap();
    let pkg = common::package_dir("describe-sleep");
    let o = heddle_in(dir.path(), &["package", "add", pkg.to_str().unwrap()]);
    expect_code(&o, FAILED);
    no_panic(&o);
    let e = stderr(&o);
    assert!(
        e.contains("300 ms") && e.contains("describe_timeout_ms"),
        "{e}"
    );
    let o = heddle_in(dir.path(), &["package", "list", "--json"]);
    assert_eq!(json(&o), serde_json::json!([]), "nothing was installed");
}

#[test]
fn host_calls_in_a_loop_run_out_of_fuel() {
    // Issue 13.2: each host call is charged, so a loop of them ends like a loop of
    // instructions.
    let dir = with_hostile("[packages.hostile]\nfuel = 100000000\n");
    let o = run_one(
        dir.path(),
        "hostile.poll_cancelled",
        serde_json::json!({}),
        "calls",
    );
    let e = node_error(&o);
    assert!(e.contains("fuel exhausted"), "{e}");
}

#[test]
fn what_a_guest_hands_the_host_is_bounded() {
    // Issue 13.3: a flood of large asset ids fails the node instead of filling memory.
    let dir = with_hostile("");
    let o = run_one(
        dir.path(),
        "hostile.asset_flood",
        serde_json::json!({"count": 10, "bytes": 1_000_000}),
        "recorded",
    );
    let e = node_error(&o);
    assert!(e.contains("(signature wasm:host-limit)"), "{e}");

    // Refused secret requests are logged a bounded number of times, names cut: 100
    // requests with 100 kB names make a handful of short lines, not 10 MB of log.
    run_one(
        dir.path(),
        "hostile.secret_flood",
        serde_json::json!({"count": 100, "bytes": 100_000}),
        "asked",
    );
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, OK);
    let all = format!("{}{}", stdout(&o), stderr(&o));
    let refused: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("requested but"))
        .collect();
    assert!(
        !refused.is_empty() && refused.len() <= 8,
        "{} refusal lines",
        refused.len()
    );
    assert!(refused.iter().all(|l| l.len() < 400), "{refused:?}");
    assert!(all.contains("further refused secret requests"), "{all}");
}

#[test]
fn a_node_that_lies_about_its_output_type_fails_itself() {
    // Issue 13.4: the error names the lying node and port, never the next node.
    let dir = with_hostile("");
    let o = run_one(
        dir.path(),
        "hostile.say_int_give_str",
        serde_json::json!({}),
        "out",
    );
    let e = node_error(&o);
    assert!(
        e.contains("`n`") && e.contains("`out`") && e.contains("(signature wasm:output-type)"),
        "{e}"
    );
    assert_eq!(json(&o)["nodes"]["out"]["invocations"], 0);
}

#[test]
fn package_add_shows_package_text_escaped() {
    // Issue 13.7: a newline in a reason cannot forge a "granted" line, and no escape
    // sequence reaches the terminal.
    let dir = tempfile::tempdir().unwrap();
    let pkg = common::package_dir("spoof");
    let o = heddle_in(dir.path(), &["package", "add", pkg.to_str().unwrap()]);
    expect_code(&o, OK);
    let out = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!out.contains('\x1b') && !out.contains('\r'), "{out:?}");
    assert!(
        !out.lines().any(|l| l.trim_start().starts_with("granted")),
        "a forged line: {out}"
    );
    let o = heddle_in(dir.path(), &["nodes", "spoof.node"]);
    expect_code(&o, OK);
    assert!(!stdout(&o).contains('\x1b'), "{:?}", stdout(&o));
}

#[test]
fn guest_failures_get_their_own_signature_and_one_line() {
    // Issue 13.8: an output past the per-call copy limit, a NaN, and exit().
    let dir = with_hostile("");
    let o = run_one(
        dir.path(),
        "hostile.huge",
        serde_json::json!({"bytes": 20 << 20}),
        "out",
    );
    let e = node_error(&o);
    assert!(e.contains("output too large"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");

    let o = run_one(
        dir.path(),
        "hostile.not_a_number",
        serde_json::json!({}),
        "out",
    );
    let e = node_error(&o);
    assert!(e.contains("(signature wasm:bad-output)"), "{e}");

    let o = run_one(dir.path(), "hostile.exit", serde_json::json!({}), "out");
    let e = node_error(&o);
    assert!(
        e.contains("called exit(") && e.contains("(signature wasm:exit)"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn a_write_quota_refuses_a_sparse_terabyte_file() {
    // Issue 13.8: `files_write_quota` bounds what one invocation adds to its files.
    let data = tempfile::tempdir().unwrap();
    let toml = format!(
        "[packages.hostile]\nfiles_write_quota = 1048576\ndirs = [{{ host = {:?}, guest = \"/data\", mode = \"rw\" }}]\n",
        data.path().display().to_string()
    );
    let dir = with_hostile(&toml);
    let o = run_one(
        dir.path(),
        "hostile.grow",
        serde_json::json!({"path": "/data/sparse"}),
        "ok",
    );
    let e = node_error(&o);
    assert!(e.contains("(signature files:no-space)"), "{e}");
    let len = std::fs::metadata(data.path().join("sparse"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(len, 0);

    // Under the quota the same node works.
    let o = run_one(
        dir.path(),
        "hostile.grow",
        serde_json::json!({"path": "/data/small", "size": 1000}),
        "ok",
    );
    expect_code(&o, OK);
    assert_eq!(
        std::fs::metadata(data.path().join("small")).unwrap().len(),
        1000
    );
}
