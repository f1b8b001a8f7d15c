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
