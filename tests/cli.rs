//! Runs the built `heddle` binary the way a user does: on the examples and on broken
//! inputs, checking exit codes and what the messages say.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::*;

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
    no_panic(&o);
    let o = heddle_in(dir.path(), &["validate", "bad.json"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("bad.json:3:"), "{}", stderr(&o));
}

#[test]
fn syntax_and_shape_errors_point_at_the_offending_token() {
    let dir = tempfile::tempdir().unwrap();
    // Syntax: the `}` at line 3, column 12 cannot start a value.
    write(
        dir.path(),
        "syntax.json",
        "{\n  \"nodes\": [\n    {\"id\": }\n  ]\n}\n",
    );
    // Shape: `id` must be a string; the `{` at line 3, column 12 is a map.
    write(
        dir.path(),
        "shape.json",
        "{\n  \"nodes\": [\n    {\"id\": {\"x\": 1}}\n  ]\n}\n",
    );
    for (file, at) in [
        ("syntax.json", "syntax.json:3:12:"),
        ("shape.json", "shape.json:3:12:"),
    ] {
        let o = heddle_in(dir.path(), &["validate", file]);
        expect_code(&o, INVALID);
        assert!(stderr(&o).contains(at), "{}", stderr(&o));
    }
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
    no_panic(&o);
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
    no_panic(&o);

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
fn an_unknown_node_type_names_the_store_searched_and_close_types() {
    let dir = tempfile::tempdir().unwrap();
    // `files.read` is close to a type of the first-party `files` package, which a graph
    // using none of its types does not load: the hint still finds it.
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [{"id": "a", "type": "files.read"}, {"id": "b", "type": "std.text.cas"}],
          "edges": []}"#,
    );
    let o = heddle_in(
        dir.path(),
        &["validate", "g.json", "--packages", "elsewhere"],
    );
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("node a: unknown node type `files.read` (did you mean `files.read_text`?)"),
        "{e}"
    );
    assert!(
        e.contains("unknown node type `std.text.cas` (did you mean `std.text.case`?)"),
        "{e}"
    );
    assert!(
        e.contains("the package store elsewhere (nothing installed)"),
        "{e}"
    );
    assert!(
        e.contains("`--packages DIR` or `[cli] packages_dir` in heddle.toml"),
        "{e}"
    );
    // The same words in the machine-readable form.
    let o = heddle_in(
        dir.path(),
        &["validate", "g.json", "--json", "--packages", "elsewhere"],
    );
    let v = json(&o);
    let message = v["issues"][0]["message"].as_str().unwrap();
    assert!(message.contains("package store elsewhere"), "{message}");
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
    no_panic(&o);
}

#[test]
fn bad_input_syntax_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "echo.json", ECHO_GRAPH);
    let o = heddle_in(dir.path(), &["run", "echo.json", "--input", "text"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("expected NAME=VALUE"), "{}", stderr(&o));
    no_panic(&o);

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
fn an_inherited_rust_backtrace_does_not_turn_an_error_into_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [{"id": "a", "type": "no.such.node"}], "edges": []}"#,
    );
    for var in ["RUST_BACKTRACE", "RUST_LIB_BACKTRACE"] {
        let o = command(dir.path())
            .env(var, "1")
            .args(["validate", "g.json"])
            .output()
            .unwrap();
        expect_code(&o, INVALID);
        // A package compiled for the first time says so first (a cold compile cache:
        // this test may be the first of its process to load the packages).
        let e = stderr(&o)
            .lines()
            .filter(|l| !l.ends_with("(first use)…"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            e.starts_with("error: g.json: graph is invalid (1 problem)"),
            "{var}: {e}"
        );
        assert!(
            !e.contains("backtrace") && !e.contains("Caused by"),
            "{var}: {e}"
        );
    }
    // `--verbose` still shows it all.
    let o = command(dir.path())
        .env("RUST_BACKTRACE", "1")
        .args(["--verbose", "validate", "g.json"])
        .output()
        .unwrap();
    assert!(stderr(&o).contains("Stack backtrace"), "{}", stderr(&o));
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

#[test]
fn the_examples_readme_lists_every_example() {
    let readme = std::fs::read_to_string(root().join("examples/README.md")).unwrap();
    for ex in examples() {
        let name = ex.file_name().unwrap().to_str().unwrap();
        assert!(
            readme.contains(&format!("| `{name}` |")),
            "examples/README.md has no row for {name}"
        );
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

/// Runs an example with `--json` and returns the report.
fn run_example(name: &str, extra: &[&str]) -> serde_json::Value {
    let path = format!("examples/{name}");
    let mut args = vec!["run", path.as_str(), "--json"];
    args.extend_from_slice(extra);
    let o = heddle(&args);
    expect_code(&o, OK);
    json(&o)
}

#[test]
fn run_each_example_collects_one_reply_per_item() {
    let v = run_example("run-each.json", &[]);
    assert_eq!(
        v["outputs"]["results"],
        serde_json::json!([[10, 20, 30, 40, 50]])
    );
    assert_eq!(v["nodes"]["e"]["invocations"], 5);
}

#[test]
fn quickstart_example_outputs() {
    let v = run_example("quickstart.json", &[]);
    assert_eq!(v["outcome"], "completed");
    let out = &v["outputs"];
    assert_eq!(
        out["shouted"],
        serde_json::json!(["HELLO HEDDLE: GRAPHS OF WEBASSEMBLY NODES"])
    );
    assert_eq!(
        out["title"],
        serde_json::json!(["Hello Heddle: Graphs Of Webassembly Nodes"])
    );
    assert_eq!(out["word_count"], serde_json::json!([6]));
    // WASM nodes report fuel and wall time; built-ins report none.
    let upper = &v["nodes"]["upper"];
    assert_eq!(upper["type"], "std.text.case");
    assert!(upper["fuel"].as_u64().unwrap() > 0, "{upper}");
    assert!(upper["wall_us"].as_u64().is_some(), "{upper}");
    assert!(v["nodes"]["text"]["fuel"].is_null());

    let v = run_example("quickstart.json", &["--input", "text=one   two"]);
    assert_eq!(v["outputs"]["shouted"], serde_json::json!(["ONE TWO"]));
    assert_eq!(v["outputs"]["word_count"], serde_json::json!([2]));
}

#[test]
fn documents_example_fans_out_and_collects_in_order() {
    let v = run_example("documents.json", &[]);
    let out = &v["outputs"];
    assert_eq!(out["word_counts"], serde_json::json!([[9, 9, 12, 4]]));
    assert_eq!(
        out["mentions_heddle"],
        serde_json::json!([[true, false, true, false]])
    );
    assert_eq!(out["total_words"], serde_json::json!([34.0]));
    // One invocation of the per-item node per document.
    assert_eq!(v["nodes"]["split"]["invocations"], 4);

    let v = run_example(
        "documents.json",
        &["--input", r#"documents=["a b", "heddle c d", "e"]"#],
    );
    assert_eq!(v["outputs"]["word_counts"], serde_json::json!([[2, 3, 1]]));
    assert_eq!(
        v["outputs"]["mentions_heddle"],
        serde_json::json!([[false, true, false]])
    );
}

#[test]
fn orders_example_transforms_json() {
    let v = run_example("orders.json", &[]);
    let out = &v["outputs"];
    assert_eq!(out["best_customer"], serde_json::json!(["grace"]));
    assert_eq!(out["revenue"], serde_json::json!([188.5]));
    assert_eq!(
        out["customers"],
        serde_json::json!([["ada", "alan", "edsger", "grace", "linus"]])
    );
    let top3: serde_json::Value = serde_json::from_str(out["top3"][0].as_str().unwrap()).unwrap();
    assert_eq!(top3[0]["customer"], "grace");
    assert_eq!(top3.as_array().unwrap().len(), 3);
}

/// The example's own script starts its pricing service on a free loopback port, grants
/// exactly that destination and runs the graph against it.
#[test]
fn http_json_example_calls_its_local_service() {
    let o = std::process::Command::new("bash")
        .arg(root().join("examples/http-json/run.sh"))
        .arg("--json")
        .env("HEDDLE", env!("CARGO_BIN_EXE_heddle"))
        .output()
        .unwrap();
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["outputs"]["total"], serde_json::json!([10.5]));
    assert_eq!(v["outputs"]["code"], serde_json::json!(["GBP"]));
    assert_eq!(v["nodes"]["quote"]["http_requests"], 1);
    assert!(
        v["nodes"]["quote"]["http_bytes"].as_u64().unwrap() > 100,
        "{v:#}"
    );
    assert_eq!(v["totals"]["http_requests"], 2);
}

#[test]
fn a_failing_node_fails_the_run_with_exit_1() {
    let o = heddle(&["run", "examples/orders.json", "--input", "orders=not json"]);
    expect_code(&o, FAILED);
    let e = stderr(&o);
    assert!(e.contains("FAILED   parse (std.json.parse)"), "{e}");
    // The node's failure signature, which policy rules match, is on its failed line.
    assert!(e.contains("(signature json:parse)"), "{e}");
    assert!(
        e.contains("skipped  by_total (std.list.sort): upstream failed"),
        "{e}"
    );
    assert!(e.contains("run failed"), "{e}");
    no_panic(&o);

    let o = heddle(&[
        "run",
        "examples/orders.json",
        "--json",
        "-i",
        "orders=not json",
    ]);
    expect_code(&o, FAILED);
    let v = json(&o);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["exit_code"], FAILED);
    assert_eq!(v["nodes"]["parse"]["status"], "failed");
    let error = v["nodes"]["parse"]["error"].as_str().unwrap();
    assert!(error.contains("parse"), "{error}");
    assert!(error.ends_with("(signature json:parse)"), "{error}");
    // The signature is a field too, for programs that match on it without the text.
    assert_eq!(v["nodes"]["parse"]["signature"], "json:parse", "{v}");
    assert_eq!(v["nodes"]["parse"]["timed_out"], false, "{v}");
    assert!(v["nodes"]["by_total"].get("signature").is_none(), "{v}");
    assert_eq!(v["nodes"]["by_total"]["status"], "skipped");
    assert_eq!(v["nodes"]["by_total"]["skip_reason"], "upstream_failed");
    assert!(v["error"].is_string(), "{v}");
}

#[test]
fn a_code_node_that_cannot_start_is_the_failed_node_and_the_given_input_is_done() {
    // No Docker engine answers where this config points: the code node cannot start,
    // so nothing runs, and the summary says which node failed rather than calling it
    // (and the input that was given) "upstream failed".
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("no-docker.sock");
    write(
        dir.path(),
        "heddle.toml",
        &format!("[runners]\ndocker_host = \"unix://{}\"\n", sock.display()),
    );
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [
            {"id": "n", "type": "heddle.input", "properties": {"value": 3}},
            {"id": "double", "type": "code.python", "properties": {"code": "set_result(n * 2)"}},
            {"id": "out", "type": "heddle.output", "properties": {"name": "out"}}
          ],
          "edges": [
            {"source": "n", "sourceHandle": "value", "target": "double", "targetHandle": "n"},
            {"source": "double", "sourceHandle": "result", "target": "out", "targetHandle": "value"}
          ]}"#,
    );
    let o = heddle_in(dir.path(), &["run", "g.json", "--json"]);
    expect_code(&o, FAILED);
    let v = json(&o);
    assert_eq!(v["nodes"]["double"]["status"], "failed", "{v}");
    let error = v["nodes"]["double"]["error"].as_str().unwrap();
    assert!(error.contains("failed to initialize"), "{error}");
    assert_eq!(v["nodes"]["n"]["status"], "done", "{v}");
    assert_eq!(v["nodes"]["out"]["skip_reason"], "upstream_failed", "{v}");
    assert_eq!(
        v["skipped"],
        serde_json::json!([{"node": "out", "reason": "upstream_failed", "because": ["double"]}])
    );
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, FAILED);
    assert!(
        stdout(&o).ends_with("skipped 1 node:\n  - out (upstream failed: double)\n"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn the_report_says_which_node_timed_out_and_nothing_of_usage_for_nodes_that_cannot_spend() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "heddle.toml",
        "[runners]\nallow_subprocess = true\n",
    );
    // `slow` sleeps far past its time limit; `up`, a std (WASM) node beside it, can
    // reach no paid service.
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [
            {"id": "slow", "type": "code.bash", "timeout_ms": 200,
             "properties": {"code": "sleep 60", "mode": "subprocess"}},
            {"id": "slow_out", "type": "heddle.output", "properties": {"name": "slow"}},
            {"id": "up", "type": "std.text.case", "properties": {"text": "hi", "mode": "upper"}},
            {"id": "up_out", "type": "heddle.output", "properties": {"name": "up"}}
          ],
          "edges": [
            {"source": "slow", "sourceHandle": "result", "target": "slow_out", "targetHandle": "value"},
            {"source": "up", "sourceHandle": "text", "target": "up_out", "targetHandle": "value"}
          ]}"#,
    );
    let o = heddle_in(dir.path(), &["run", "g.json", "--json"]);
    expect_code(&o, FAILED);
    let v = json(&o);
    assert_eq!(v["nodes"]["slow"]["status"], "failed", "{v}");
    assert_eq!(v["nodes"]["slow"]["timed_out"], true, "{v}");
    assert_eq!(v["nodes"]["up"]["status"], "done", "{v}");
    assert_eq!(v["nodes"]["up"]["timed_out"], false, "{v}");
    // A code node runs any program: what it spent is unknown unless it says.
    assert_eq!(v["nodes"]["slow"]["usage"], "unknown", "{v}");
    // A package node cannot spend (no grant gives WASM a network): it says nothing about usage,
    // although it measured its fuel and time.
    assert!(v["nodes"]["up"]["fuel"].is_u64(), "{v}");
    assert_eq!(v["nodes"]["up"]["usage"], serde_json::Value::Null, "{v}");
    assert_eq!(v["totals"]["supervisor_cost_usd"].to_string(), "0.0", "{v}");
}

/// The ending lines of a run's progress (`[  0.002s] done     id (type)`): stamp in
/// microseconds and node id, in the order printed; and the run's `in Xs` time.
fn progress_endings(err: &str) -> (Vec<(u64, String)>, u64) {
    let secs =
        |s: &str| (s.trim().trim_end_matches('s').parse::<f64>().unwrap() * 1e6).round() as u64;
    let mut endings = Vec::new();
    let mut wall = None;
    for line in err.lines() {
        if let Some(rest) = line.strip_prefix('[') {
            let (stamp, rest) = rest.split_once(']').unwrap();
            let mut words = rest.split_whitespace();
            let status = words.next().unwrap();
            if ["done", "FAILED", "skipped", "suspended"].contains(&status) {
                endings.push((secs(stamp), words.next().unwrap().to_string()));
            }
        } else if let Some(rest) = line.strip_prefix("run ")
            && let Some((_, t)) = rest.rsplit_once(" in ")
        {
            wall = Some(secs(t));
        }
    }
    (endings, wall.expect("the run's last line"))
}

#[test]
fn progress_prints_a_node_after_what_fed_it_and_a_suspension_once() {
    for example in ["gate.json", "declarations.json", "orders.json"] {
        let path = root().join("examples").join(example);
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for round in 0..8 {
            // orders.json fails at `parse` with this input: its downstream is skipped.
            let mut args = vec!["run", path.to_str().unwrap()];
            if example == "orders.json" {
                args.extend(["-i", "orders=not json"]);
            }
            let o = heddle(&args);
            let err = stderr(&o);
            let (endings, wall) = progress_endings(&err);
            let at = |id: &str| endings.iter().position(|(_, n)| n == id);
            for e in doc["edges"].as_array().unwrap() {
                let (s, t) = (e["source"].as_str().unwrap(), e["target"].as_str().unwrap());
                if let (Some(s_at), Some(t_at)) = (at(s), at(t)) {
                    assert!(
                        s_at < t_at,
                        "{example} round {round}: {t} printed before {s}:\n{err}"
                    );
                }
            }
            let latest = endings.iter().map(|(t, _)| *t).max().unwrap();
            assert!(
                wall >= latest,
                "{example} round {round}: the run ends before its events:\n{err}"
            );
        }
    }
    // A gate's suspension is said once, with what to do (here: run it durable).
    let o = heddle(&["run", "examples/gate.json"]);
    expect_code(&o, SUSPENDED);
    let err = stderr(&o);
    assert_eq!(err.matches("awaits a decision").count(), 1, "{err}");
    assert!(!err.contains("error: "), "{err}");
    assert!(err.contains("needs a durable run"), "{err}");
}

#[test]
fn streaming_input_from_stdin() {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args([
            "run",
            "examples/running-sum.json",
            "--stream",
            "numbers",
            "--json",
        ])
        .current_dir(root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"1\n2\n3\n4\n5\n").unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(
        v["outputs"]["running"],
        serde_json::json!([1.0, 3.0, 6.0, 10.0, 15.0])
    );
    assert_eq!(v["outputs"]["total"], serde_json::json!([15.0]));

    let o = heddle(&["run", "examples/quickstart.json", "--stream", "text"]);
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("not a streaming input"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn interrupt_cancels_the_run_with_exit_3() {
    use std::io::{BufRead as _, BufReader};
    // The streaming input is fed from a stdin that never ends, so the run stays live
    // until it is interrupted.
    let mut child = Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args(["run", "examples/running-sum.json", "--stream", "numbers"])
        .current_dir(root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_remove("RUST_BACKTRACE")
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    // The announcement comes after the signal handlers are in place.
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "stderr ended: {seen}"
        );
        seen.push_str(&line);
        if line.contains("Ctrl-C cancels") {
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(o.status.code(), Some(3), "stderr:\n{seen}{rest}");
    assert!(rest.contains("interrupted: cancelling the run"), "{rest}");
    assert!(
        rest.contains("skipped  sum (std.math.running_sum): run cancelled"),
        "{rest}"
    );
    assert!(rest.contains("run cancelled in"), "{rest}");
}

#[test]
fn policy_supervision_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", PARSE_EACH);
    write(
        dir.path(),
        "policy.toml",
        "[[rule]]\nsignature = \"json:parse\"\nverdict = \"skip\"\n",
    );
    // Unsupervised: the bad item fails the run.
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, FAILED);

    let o = heddle_in(
        dir.path(),
        &["run", "g.json", "--policy", "policy.toml", "--json"],
    );
    expect_code(&o, OK);
    let report = stdout(&o);
    let v = json(&o);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["supervised"], true);
    assert_eq!(v["outputs"]["numbers"], serde_json::json!([[1, 3]]));
    assert_eq!(v["interventions"].as_array().unwrap().len(), 1, "{v}");

    let o = heddle_in(dir.path(), &["run", "g.json", "--policy", "policy.toml"]);
    expect_code(&o, OK);
    assert!(
        stderr(&o).contains("completed — supervised"),
        "{}",
        stderr(&o)
    );

    // The recorded decisions replay without the policy.
    write(dir.path(), "report.json", &report);
    let o = heddle_in(
        dir.path(),
        &["run", "g.json", "--replay", "report.json", "--json"],
    );
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["numbers"], serde_json::json!([[1, 3]]));

    // A malformed policy is refused before the run, naming the file and line.
    write(dir.path(), "bad.toml", "[[rule]]\nverdict = \"explode\"\n");
    let o = heddle_in(dir.path(), &["run", "g.json", "--policy", "bad.toml"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("bad.toml:2"), "{}", stderr(&o));
    no_panic(&o);
}

#[test]
fn llm_supervision_decides_over_the_chat_completions_protocol() {
    const KEY: &str = "sk-cli-test-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", PARSE_EACH);
    let (url, requests) = chat_server(vec![tool_call(
        "submit_verdict",
        r#"{"action":"skip","reason":"not a number"}"#,
    )]);
    let o = supervised(dir.path(), &url, KEY, &["run", "g.json", "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["outputs"]["numbers"], serde_json::json!([[1, 3]]), "{v}");
    assert_eq!(v["interventions"].as_array().unwrap().len(), 1, "{v}");
    let request = requests.recv().unwrap();
    assert!(
        request.head.contains(&format!("Bearer {KEY}"))
            || request.head.contains(&format!("bearer {KEY}")),
        "{request:?}"
    );
    assert!(request.body.contains("submit_verdict"), "{request:?}");
    assert!(
        !stdout(&o).contains(KEY),
        "the API key leaked into the report"
    );
}

#[test]
fn llm_supervision_is_configured_by_the_supervisor_section_and_the_environment_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", PARSE_EACH);
    let (url, requests) = chat_server(vec![
        tool_call(
            "submit_verdict",
            r#"{"action":"skip","reason":"not a number"}"#,
        ),
        tool_call(
            "submit_verdict",
            r#"{"action":"skip","reason":"not a number"}"#,
        ),
    ]);
    write(
        dir.path(),
        "heddle.toml",
        &format!(
            "[supervisor]\nendpoint = \"{url}\"\nmodel = \"file-model\"\ncost_cap_usd = 0.2\n\
             [supervisor.pricing.\"file-model\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n\
             [supervisor.pricing.\"env-model\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n"
        ),
    );
    let o = command(dir.path())
        .args(["run", "g.json", "--supervise", "--json"])
        .env("HEDDLE_SUPERVISOR_API_KEY", "sk-file-test-0123456789")
        .output()
        .unwrap();
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["numbers"], serde_json::json!([[1, 3]]));
    let request = requests.recv().unwrap();
    assert!(
        request.body.contains(r#""model":"file-model""#),
        "{request:?}"
    );
    // The environment over the file.
    let o = command(dir.path())
        .args(["run", "g.json", "--supervise", "--json"])
        .env("HEDDLE_SUPERVISOR_MODEL", "env-model")
        .output()
        .unwrap();
    expect_code(&o, OK);
    let request = requests.recv().unwrap();
    assert!(
        request.body.contains(r#""model":"env-model""#),
        "{request:?}"
    );
    // An unpriced model names the section a price goes in, which the file accepts.
    let o = command(dir.path())
        .args([
            "run",
            "g.json",
            "--supervise",
            "--supervisor-model",
            "unpriced",
        ])
        .output()
        .unwrap();
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("[supervisor.pricing.\"unpriced\"]"),
        "{}",
        stderr(&o)
    );
    // A misspelt key is refused, naming the file and the section.
    write(dir.path(), "heddle.toml", "[supervisor]\nmodle = \"x\"\n");
    let o = command(dir.path())
        .args(["run", "g.json", "--supervise"])
        .output()
        .unwrap();
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("section [supervisor]") && stderr(&o).contains("modle"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn llm_supervision_refuses_to_start_without_endpoint_or_price() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", PARSE_EACH);
    let run = |envs: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_heddle"));
        c.args(["run", "g.json", "--supervise"])
            .current_dir(dir.path());
        for k in [
            "HEDDLE_SUPERVISOR_ENDPOINT",
            "OPENAI_BASE_URL",
            "HEDDLE_SUPERVISOR_MODEL",
            "HEDDLE_SUPERVISOR_PRICE",
        ] {
            c.env_remove(k);
        }
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = run(&[]);
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("HEDDLE_SUPERVISOR_ENDPOINT"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        ("HEDDLE_SUPERVISOR_ENDPOINT", "http://127.0.0.1:9/v1"),
        ("HEDDLE_SUPERVISOR_MODEL", "no-such-model"),
    ]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("no pricing"), "{}", stderr(&o));
}

/// A plain run refuses a node value holding a known secret exactly as a durable run does
/// (`KNOWN_SECRET`): neither the human summary nor `--json` prints it. The code assembles
/// the secret at run time, so the graph does not hold it.
#[test]
fn a_plain_run_refuses_an_output_holding_a_known_secret_like_a_durable_run() {
    const SECRET: &str = "s3cr3t-value-42";
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "heddle.toml",
        &format!(
            "[runners]\nallow_subprocess = true\n\n[secrets]\nvalues = {{ TOKEN = \"{SECRET}\" }}\n"
        ),
    );
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [
    {"id": "leak", "type": "code.bash", "properties": {"code": "a=s3cr3t; b=-value-42; echo \"token=$a$b\"", "mode": "subprocess"}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [{"source": "leak", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]}"#,
    );
    for args in [&["run", "g.json"][..], &["run", "g.json", "--json"]] {
        let o = heddle_in(dir.path(), args);
        expect_code(&o, FAILED);
        let all = stdout(&o) + &stderr(&o);
        assert!(!all.contains(SECRET), "{args:?} printed the secret:\n{all}");
        assert!(all.contains("KNOWN_SECRET"), "{args:?}:\n{all}");
    }
}

/// A WASM node's typed input gets only values of its type: an untyped input's `7` reaching
/// `std.text.case`'s `text: str` fails before the guest runs, naming the input, the type
/// and what arrived (`input:type`), in the summary and the `--json` report.
#[test]
fn a_value_misfitting_a_wasm_nodes_typed_input_fails_before_the_guest_runs() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [
    {"id": "x", "type": "heddle.input"},
    {"id": "case", "type": "std.text.case"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "x", "sourceHandle": "value", "target": "case", "targetHandle": "text"},
    {"source": "case", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#,
    );
    let o = heddle_in(dir.path(), &["run", "g.json", "--input", "x=7"]);
    expect_code(&o, FAILED);
    let e = stderr(&o) + &stdout(&o);
    assert!(
        e.contains("input `text` is declared `str`")
            && e.contains("got int")
            && e.contains("(signature input:type)"),
        "{e}"
    );
    let o = heddle_in(dir.path(), &["run", "g.json", "--input", "x=7", "--json"]);
    expect_code(&o, FAILED);
    let error = json(&o)["nodes"]["case"]["error"].to_string();
    assert!(error.contains("input `text` is declared `str`"), "{error}");
    let o = heddle_in(dir.path(), &["run", "g.json", "--input", "x=\"seven\""]);
    expect_code(&o, OK);
}
