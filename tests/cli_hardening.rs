//! The CLI under hostile or careless use: input that must never vanish, secrets that
//! must never leave, limits on what a user's text can make the CLI print.

mod support;

use support::*;

const STREAM_ANY: &str = r#"{"nodes": [
  {"id": "in", "type": "heddle.input", "properties": {"name": "lines", "streaming": true}},
  {"id": "out", "type": "heddle.output", "properties": {"name": "seen"}}],
 "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn a_stream_line_that_does_not_fit_stops_the_run_naming_the_line() {
    let sum = ["run", "examples/running-sum.json", "--stream", "numbers"];
    let o = heddle_stdin(&root(), &sum, b"1\nabc\n3\n");
    expect_code(&o, INVALID);
    no_panic(&o);
    let e = stderr(&o);
    assert!(e.contains("--stream numbers: line 2"), "{e}");
    assert!(e.contains("`abc`") && e.contains("float"), "{e}");
    // No total computed from part of the input passes for the real one.
    assert!(!stdout(&o).contains("total: 1"), "{}", stdout(&o));

    let o = heddle_stdin(&root(), &sum, b"1\n2\n\xff\xfe\n3\n");
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(e.contains("line 3") && e.contains("UTF-8"), "{e}");

    // The JSON report carries the same error and exit code.
    let mut json_args = sum.to_vec();
    json_args.push("--json");
    let o = heddle_stdin(&root(), &json_args, b"1\nabc\n");
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["exit_code"], INVALID, "{v}");
    assert!(v["error"].as_str().unwrap_or("").contains("line 2"), "{v}");

    // Lines that fit still all arrive, CRLF line ends included.
    let o = heddle_stdin(&root(), &json_args, b"1\r\n2\r\n3\r\n");
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["total"], serde_json::json!([6.0]));
}

#[test]
fn a_stream_line_that_is_not_json_passes_as_text_where_text_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", STREAM_ANY);
    let o = heddle_stdin(
        dir.path(),
        &["run", "g.json", "--stream", "lines", "--json"],
        b"1\nabc\n3\n",
    );
    expect_code(&o, OK);
    assert_eq!(
        json(&o)["outputs"]["seen"],
        serde_json::json!([1, "abc", 3])
    );
    // Text, yes; bytes that are not text, no.
    let o = heddle_stdin(
        dir.path(),
        &["run", "g.json", "--stream", "lines"],
        b"a\n\xc3\n",
    );
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("line 2"), "{}", stderr(&o));
}

#[test]
fn the_escalation_line_says_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", PARSE_EACH);
    write(
        dir.path(),
        "policy.toml",
        "[[rule]]\nsignature = \"json:parse\"\nverdict = \"skip\"\n",
    );
    let o = heddle_in(dir.path(), &["run", "g.json", "--policy", "policy.toml"]);
    expect_code(&o, OK);
    let e = stderr(&o);
    let line = e
        .lines()
        .find(|l| l.contains("⛨ escalated"))
        .unwrap_or_else(|| panic!("no escalation line:\n{e}"));
    let (_, what) = line
        .split_once("⛨ escalated parse: [json:parse] ")
        .unwrap_or_else(|| panic!("escalation line without node and signature: {line}"));
    assert!(
        what.len() > 3 && what.contains('x'),
        "escalation line without the error: {line}"
    );
    assert!(e.contains("⛨ decision parse: skip (by policy)"), "{e}");
}

#[test]
fn the_supervisor_key_never_reaches_the_endpoint_body_or_the_report() {
    const KEY: &str = "sk-hardening-KEY-9876543210";
    let dir = tempfile::tempdir().unwrap();
    // The failing item is the key itself: it lands in the escalation's inputs and detail.
    write(
        dir.path(),
        "g.json",
        &PARSE_EACH.replace(r#"["1", "x", "3"]"#, &format!(r#"["1", "{KEY}", "3"]"#)),
    );
    let (url, requests) = chat_server(vec![tool_call(
        "submit_verdict",
        r#"{"action":"skip","reason":"not a number"}"#,
    )]);
    let o = supervised(dir.path(), &url, KEY, &["run", "g.json", "--json"]);
    expect_code(&o, OK);
    let request = requests.recv().unwrap();
    assert!(
        request.head.contains(KEY),
        "the key is sent as the bearer token"
    );
    assert!(
        !request.body.contains(KEY),
        "key in the request body:\n{}",
        request.body
    );
    assert!(request.body.contains("«redacted»"), "{}", request.body);
    assert!(
        !stdout(&o).contains(KEY),
        "key in the report:\n{}",
        stdout(&o)
    );
    assert!(!stderr(&o).contains(KEY), "key on stderr:\n{}", stderr(&o));
    // What the supervisor spent is in the totals, apart from what nodes spent.
    let v = json(&o);
    let t = &v["totals"];
    let sup = t["supervisor_cost_usd"].as_f64().unwrap();
    assert!(sup > 0.0, "{t}");
    assert_eq!(
        t["cost_usd"].as_f64().unwrap(),
        t["nodes_cost_usd"].as_f64().unwrap() + sup
    );
}

#[test]
fn secrets_from_the_environment_are_masked_from_the_first_escalation() {
    const SECRET: &str = "hunter2-TOKEN-from-env";
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "g.json",
        &PARSE_EACH.replace(r#"["1", "x", "3"]"#, &format!(r#"["1", "{SECRET}", "3"]"#)),
    );
    write(
        dir.path(),
        "policy.toml",
        "[[rule]]\nsignature = \"json:parse\"\nverdict = \"skip\"\n",
    );
    let o = command(dir.path())
        .args(["run", "g.json", "--policy", "policy.toml", "--json"])
        .env("HEDDLE_SECRET_UPSTREAM_TOKEN", SECRET)
        .output()
        .unwrap();
    expect_code(&o, OK);
    let report = stdout(&o);
    assert!(!report.contains(SECRET), "secret in the report:\n{report}");
    assert!(report.contains("«redacted»"), "{report}");
}

/// Item 0 fails; item 1 succeeds with a value of its own. The model reads the per-item
/// upstream and the fan-out node: it must only ever see item 0's values. (Ancestors at
/// root scope are covered by the kernel's unit test: here their timing would vary.)
const TWO_ITEMS: &str = r#"{"nodes": [
  {"id": "items", "type": "heddle.input", "properties": {"type": "list[str]", "value": ["item-zero{", "[\"item-one\"]"]}},
  {"id": "each", "type": "heddle.foreach"},
  {"id": "lower", "type": "std.text.case", "properties": {"mode": "lower"}},
  {"id": "parse", "type": "std.json.parse"},
  {"id": "gather", "type": "heddle.collect"},
  {"id": "parsed", "type": "heddle.output"}],
 "edges": [
  {"source": "items", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
  {"source": "each", "sourceHandle": "item", "target": "lower", "targetHandle": "text"},
  {"source": "lower", "sourceHandle": "text", "target": "parse", "targetHandle": "text"},
  {"source": "parse", "sourceHandle": "value", "target": "gather", "targetHandle": "item"},
  {"source": "gather", "sourceHandle": "list", "target": "parsed", "targetHandle": "value"}]}"#;

#[test]
fn read_node_output_stays_on_the_failing_items_lineage() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", TWO_ITEMS);
    let (url, requests) = chat_server(vec![
        tool_call("read_node_output", r#"{"node_id":"lower"}"#),
        tool_call("read_node_output", r#"{"node_id":"each"}"#),
        tool_call(
            "submit_verdict",
            r#"{"action":"skip","reason":"broken item"}"#,
        ),
    ]);
    let o = supervised(
        dir.path(),
        &url,
        "sk-lineage-0000000000",
        &["run", "g.json", "--json"],
    );
    expect_code(&o, OK);
    assert_eq!(
        json(&o)["outputs"]["parsed"],
        serde_json::json!([[["item-one"]]])
    );
    let seen: Vec<Seen> = requests.try_iter().collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    let last: serde_json::Value = serde_json::from_str(&seen[2].body).unwrap();
    let tools: Vec<String> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tools.len(), 2, "{tools:?}");
    // The failing item's own upstream value.
    assert!(tools[0].contains("item-zero{"), "{}", tools[0]);
    // The fan-out node's values belong to the items, one each: refused, not the last.
    assert!(tools[1].contains("refused"), "{}", tools[1]);
    for t in &tools {
        assert!(!t.contains("item-one"), "another item's value leaked: {t}");
    }
}

/// A code node with four settings `run` cannot honour: both commands refuse it before
/// anything runs, list every problem, exit 2, and `--json` prints the problems as data.
const BAD_CODE_NODE: &str = r#"{"nodes": [
  {"id": "coder", "type": "code.bash",
   "properties": {"code": "echo hi", "mode": "vm", "timeout_s": -1, "tmp_size_mb": 0, "memory_mb": 9007199254740993}},
  {"id": "out", "type": "heddle.output", "properties": {"name": "said"}}],
 "edges": [{"source": "coder", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn code_node_settings_run_refuses_are_refused_by_validate_and_run_alike() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", BAD_CODE_NODE);
    let props = |issues: &serde_json::Value| -> Vec<String> {
        let mut v: Vec<String> = issues
            .as_array()
            .expect("issues is a list")
            .iter()
            .filter(|i| i["node"] == "coder")
            .filter_map(|i| i["handle"].as_str().map(str::to_string))
            .collect();
        v.sort();
        v
    };
    let want = ["memory_mb", "mode", "timeout_s", "tmp_size_mb"];

    let o = heddle_in(dir.path(), &["validate", "g.json", "--json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["valid"], false, "{v}");
    assert_eq!(props(&v["issues"]), want, "{v}");

    let o = heddle_in(dir.path(), &["run", "g.json", "--json"]);
    expect_code(&o, INVALID);
    no_panic(&o);
    let v = json(&o);
    assert_eq!(v["outcome"], "invalid", "{v}");
    assert_eq!(v["exit_code"], INVALID, "{v}");
    assert_eq!(props(&v["issues"]), want, "{v}");

    // Without --json the same four problems reach the terminal, nothing on stdout.
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    for p in want {
        assert!(e.contains(p), "{p} missing from: {e}");
    }
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}
