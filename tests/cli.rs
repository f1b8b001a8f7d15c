//! Runs the built `heddle` binary the way a user does: on the examples and on broken
//! inputs, checking exit codes and what the messages say.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const OK: i32 = 0;
const FAILED: i32 = 1;
const INVALID: i32 = 2;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn heddle(args: &[&str]) -> Output {
    heddle_in(&root(), args)
}

fn heddle_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("the heddle binary starts")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed by a signal")
}

/// Asserts the exit code, showing both streams when it is wrong.
#[track_caller]
fn expect_code(o: &Output, want: i32) {
    assert_eq!(
        code(o),
        want,
        "exit code\n--- stdout\n{}\n--- stderr\n{}",
        stdout(o),
        stderr(o)
    );
}

#[track_caller]
fn no_backtrace(o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("backtrace"), "unexpected backtrace:\n{e}");
    assert!(!e.contains("panicked"), "panic:\n{e}");
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\n--- stderr\n{}",
            stdout(o),
            stderr(o)
        )
    })
}

const ECHO_GRAPH: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "in", "type": "heddle.input", "properties": {"name": "text", "type": "str"}},
    {"id": "out", "type": "heddle.output", "properties": {"name": "echo"}}
  ],
  "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]
}"#;

#[test]
fn malformed_json_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad.json",
        "{\n  \"nodes\": [\n    {\"id\": }\n  ]\n}\n",
    );
    let o = heddle_in(dir.path(), &["run", "bad.json"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(e.contains("bad.json:3:"), "{e}");
    assert!(e.contains("invalid graph JSON"), "{e}");
    no_backtrace(&o);
    let o = heddle_in(dir.path(), &["validate", "bad.json"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("bad.json:3:"), "{}", stderr(&o));
}

#[test]
fn missing_graph_file_is_named() {
    let o = heddle(&["run", "examples/does-not-exist.json"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("cannot read graph file examples/does-not-exist.json"),
        "{e}"
    );
    no_backtrace(&o);
}

#[test]
fn unknown_node_type_names_node_and_type() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [
            {"id": "a", "type": "heddle.constant", "properties": {"value": 1}},
            {"id": "b", "type": "no.such.node"},
            {"id": "c", "type": "also.missing"}
          ],
          "edges": [{"source": "a", "sourceHandle": "value", "target": "b", "targetHandle": "x"}]}"#,
    );
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(e.contains("node b") && e.contains("no.such.node"), "{e}");
    // Every problem at once, not just the first.
    assert!(e.contains("node c") && e.contains("also.missing"), "{e}");
    no_backtrace(&o);

    let o = heddle_in(dir.path(), &["validate", "--json", "g.json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["valid"], false);
    let issues = v["issues"].as_array().unwrap();
    let unknown: Vec<_> = issues
        .iter()
        .filter(|i| i["kind"] == "unknown_node_type")
        .map(|i| i["node"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(unknown, ["b", "c"], "{issues:?}");
}

#[test]
fn missing_input_value_names_the_input() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "echo.json", ECHO_GRAPH);
    let o = heddle_in(dir.path(), &["run", "echo.json"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(e.contains("missing value for input `text`"), "{e}");
    assert!(e.contains("--input text="), "hint missing: {e}");
    no_backtrace(&o);
}

#[test]
fn bad_input_syntax_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "echo.json", ECHO_GRAPH);
    let o = heddle_in(dir.path(), &["run", "echo.json", "--input", "text"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("expected NAME=VALUE"), "{}", stderr(&o));
    no_backtrace(&o);

    let o = heddle_in(dir.path(), &["run", "echo.json", "--input", "txt=hi"]);
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("no input of that name (inputs: text)"),
        "{}",
        stderr(&o)
    );

    let o = heddle_in(
        dir.path(),
        &["run", "echo.json", "--input", "text=@missing.txt"],
    );
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("cannot read file `missing.txt`"),
        "{}",
        stderr(&o)
    );

    let o = heddle_in(dir.path(), &["run", "--no-such-flag", "echo.json"]);
    expect_code(&o, INVALID);
}

#[test]
fn input_values_from_args_and_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "echo.json", ECHO_GRAPH);
    let o = heddle_in(
        dir.path(),
        &["run", "echo.json", "--json", "--input", "text=007"],
    );
    expect_code(&o, OK);
    let v = json(&o);
    // Declared `str`: the text stays text even though it parses as a number.
    assert_eq!(v["outputs"]["echo"], serde_json::json!(["007"]));

    write(dir.path(), "in.txt", "from a file\n");
    let o = heddle_in(dir.path(), &["run", "echo.json", "--input", "text=@in.txt"]);
    expect_code(&o, OK);
    assert!(stdout(&o).contains("echo: from a file"), "{}", stdout(&o));
}

#[test]
fn json_report_has_outcome_outputs_and_nodes() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "echo.json", ECHO_GRAPH);
    let o = heddle_in(dir.path(), &["run", "echo.json", "--json", "-i", "text=hi"]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["outputs"]["echo"], serde_json::json!(["hi"]));
    assert_eq!(v["nodes"]["in"]["status"], "done");
    assert_eq!(v["nodes"]["out"]["type"], "heddle.output");
    assert!(v["interventions"].as_array().unwrap().is_empty());
    // Nothing but the report on stdout.
    assert!(stdout(&o).trim_start().starts_with('{'));
}

#[test]
fn plain_progress_when_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "echo.json", ECHO_GRAPH);
    let o = heddle_in(dir.path(), &["run", "echo.json", "-i", "text=hi"]);
    expect_code(&o, OK);
    let e = stderr(&o);
    assert!(e.contains("done     out (heddle.output)"), "{e}");
    assert!(e.contains("run completed in"), "{e}");
    assert_eq!(stdout(&o), "echo: hi\n");
}

#[test]
fn verbose_shows_error_detail() {
    let o = heddle(&["--verbose", "run", "examples/does-not-exist.json"]);
    expect_code(&o, INVALID);
    // The debug form lists causes separately.
    assert!(stderr(&o).contains("Caused by"), "{}", stderr(&o));
}

#[test]
fn nodes_lists_builtins_with_ports() {
    let o = heddle(&["nodes", "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    let decls = v.as_array().unwrap();
    let foreach = decls
        .iter()
        .find(|d| d["type_name"] == "heddle.foreach")
        .expect("heddle.foreach listed");
    let outs: Vec<_> = foreach["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert!(
        outs.contains(&"item") && outs.contains(&"index"),
        "{outs:?}"
    );
    let o = heddle(&["nodes", "heddle."]);
    expect_code(&o, OK);
    assert!(stdout(&o).contains("heddle.collect"), "{}", stdout(&o));
}

#[test]
fn validate_accepts_every_example() {
    for ex in examples() {
        let o = heddle(&["validate", ex.to_str().unwrap()]);
        expect_code(&o, OK);
        assert!(stdout(&o).contains("valid"), "{}", stdout(&o));
    }
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no examples found");
    v
}
