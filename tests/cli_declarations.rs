//! Node declarations through the CLI: the example graph, the wrap-up naming every
//! skipped node, `validate --json` showing declarations, and a bad condition refused
//! with exit 2 before anything runs.

mod support;

use support::*;

#[test]
fn the_declarations_example_runs_the_diamond_and_the_check() {
    let o = heddle(&["run", "examples/declarations.json", "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(
        v["outputs"]["triaged"],
        serde_json::json!([{"all": [
            {"id": "a1", "amount": 250}, {"id": "a2", "amount": 40}, {"id": "a3", "amount": 120}
        ]}])
    );
    assert_eq!(v["nodes"]["urgent"]["invocations"], 2);
    assert_eq!(v["nodes"]["routine"]["invocations"], 1);
    assert_eq!(v["nodes"]["join"]["invocations"], 3);

    // The same example, with every order small: the urgent branch never runs, and both
    // the report and the human summary name it with its reason.
    let small = r#"orders=[{"id":"b1","amount":1},{"id":"b2","amount":2},{"id":"b3","amount":3}]"#;
    let o = heddle(&[
        "run",
        "examples/declarations.json",
        "--json",
        "--input",
        small,
    ]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(
        v["skipped"],
        serde_json::json!([{"node": "urgent", "reason": "condition"}])
    );
    assert_eq!(v["nodes"]["urgent"]["skip_reason"], "condition");
    let o = heddle(&["run", "examples/declarations.json", "--input", small]);
    expect_code(&o, OK);
    let out = stdout(&o);
    assert!(
        out.contains("skipped 1 node:\n  - urgent (an edge's condition chose another branch)"),
        "{out}"
    );
}

#[test]
fn validate_json_shows_declared_fields_and_edge_rules() {
    let o = heddle(&["validate", "examples/declarations.json", "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["valid"], true);
    assert_eq!(v["declared_fields"][0]["node"], "order");
    assert_eq!(v["declared_fields"][0]["handle"], "value");
    assert_eq!(
        v["declared_fields"][0]["fields"][2],
        serde_json::json!({"key": "note", "type": "string", "required": false})
    );
    let rules = v["edge_rules"].as_array().unwrap();
    assert!(
        rules.contains(&serde_json::json!(
            {"edge": "to-urgent", "when": "fields.amount >= 100", "fields": ["id", "amount"]}
        )),
        "{rules:?}"
    );
}

#[test]
fn a_bad_condition_is_refused_with_exit_2_naming_the_edge() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/declarations.json"))
        .unwrap()
        .replace("fields.amount >= 100", "fields.amount >=");
    let path = write(dir.path(), "bad.json", &text);
    let o = heddle(&["validate", path.to_str().unwrap()]);
    expect_code(&o, INVALID);
    let err = stderr(&o);
    assert!(err.contains("edge to-urgent"), "{err}");
    assert!(
        err.contains("invalid JSONata expression `fields.amount >=`"),
        "{err}"
    );
    let o = heddle(&["run", path.to_str().unwrap()]);
    expect_code(&o, INVALID);
}

/// A condition and a narrowing over fields `p` never declares, a check below that
/// condition (so never reached) reading an upstream nothing brings it, and a gate with
/// no upstream: every one runs and quietly does nothing.
const QUIETLY_NOTHING: &str = r#"{"format": "heddle.graph", "version": 1, "nodes": [
  {"id": "in", "type": "heddle.input", "properties": {"value": {"amount": 250}}},
  {"id": "p", "type": "heddle.passthrough"},
  {"id": "big", "type": "heddle.passthrough"},
  {"id": "verify", "type": "heddle.check", "properties": {"assert": "upstream.big.output.amount > 0 and upstream.other.output"}},
  {"id": "out", "type": "heddle.output", "properties": {"name": "o"}}
], "edges": [
  {"source": "in", "sourceHandle": "value", "target": "p", "targetHandle": "value"},
  {"id": "cond", "source": "p", "sourceHandle": "value", "target": "big", "targetHandle": "value",
   "when": "fields.amount > 100", "fields": ["amount"]},
  {"source": "big", "sourceHandle": "value", "target": "verify", "targetHandle": "big"},
  {"source": "verify", "sourceHandle": "output", "target": "out", "targetHandle": "value"}
]}"#;

#[test]
fn review_warnings_name_what_would_quietly_do_nothing_in_validate_and_first_in_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "quiet.json", QUIETLY_NOTHING);
    let path = path.to_str().unwrap();
    let o = heddle(&["validate", path, "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    let warnings: Vec<(String, String, String)> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let s = |k: &str| w[k].as_str().unwrap_or_default().to_string();
            (s("kind"), s("node"), s("message"))
        })
        .collect();
    let has = |kind: &str, node: &str, text: &str| {
        assert!(
            warnings
                .iter()
                .any(|(k, n, m)| k == kind && n == node && m.contains(text)),
            "no {kind} warning on {node} saying {text:?}: {warnings:#?}"
        )
    };
    has(
        "undeclared_fields",
        "big",
        "condition `fields.amount > 100` reads `fields.amount`, but node p declares no output fields on `value`",
    );
    has(
        "undeclared_fields",
        "big",
        "so the condition is always false and node big never runs through this edge",
    );
    has(
        "undeclared_fields",
        "big",
        "`fields` keeps `amount`, but node p declares no output fields",
    );
    has(
        "unreachable_check",
        "verify",
        "this check can never be reached: every path into it crosses a condition that is always false (edge `cond`)",
    );
    has(
        "unreachable_check",
        "verify",
        "reads `upstream.other`, but no edge from node other comes into this check (fed by: `big`)",
    );
    assert_eq!(warnings.len(), 4, "{warnings:#?}");

    // The human form says the same on stderr, and so do a run's first lines.
    let o = heddle(&["validate", path]);
    expect_code(&o, OK);
    let err = stderr(&o);
    assert!(
        err.starts_with("warning: node big, edge cond: condition `fields.amount > 100`"),
        "{err}"
    );
    let o = heddle(&["run", path]);
    expect_code(&o, OK);
    let err = stderr(&o);
    let running = err.find("running ").expect("the run's banner");
    assert_eq!(err[..running].matches("warning: ").count(), 4, "{err}");

    // A gate nothing feeds asks before any work it could review.
    let gate = r#"{"format": "heddle.graph", "version": 1, "nodes": [
      {"id": "ask", "type": "heddle.gate", "properties": {"title": "Ship?"}},
      {"id": "out", "type": "heddle.output", "properties": {"name": "o"}}
    ], "edges": [{"source": "ask", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
    let path = write(dir.path(), "gate.json", gate);
    let o = heddle(&["validate", path.to_str().unwrap(), "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["warnings"][0]["kind"], "unfed_gate", "{v}");
    assert_eq!(v["warnings"][0]["node"], "ask", "{v}");
    assert!(
        v["warnings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("the gate has no upstream"),
        "{v}"
    );
}

#[test]
fn declared_graphs_get_no_review_warnings() {
    // Every example, declarations and all, reads only what its nodes declare.
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let o = heddle(&["validate", path.to_str().unwrap(), "--json"]);
        expect_code(&o, OK);
        let v = json(&o);
        assert_eq!(v["warnings"], serde_json::json!([]), "{}", path.display());
    }
    // A condition reading a key the producer does declare is fine; one it does not is
    // named, with the keys it does declare.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/declarations.json"))
        .unwrap()
        .replace("fields.amount < 100", "fields.amout < 100");
    let path = write(dir.path(), "typo.json", &text);
    let o = heddle(&["validate", path.to_str().unwrap(), "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    let w = &v["warnings"];
    assert_eq!(w.as_array().unwrap().len(), 1, "{w}");
    assert_eq!(w[0]["edge"], "to-routine");
    assert!(
        w[0]["message"].as_str().unwrap().contains(
            "reads `fields.amout`, which node order does not declare on `value` (declared: {id: string, amount: number, note?: string}) (did you mean `amount`?)"
        ),
        "{w}"
    );
}
