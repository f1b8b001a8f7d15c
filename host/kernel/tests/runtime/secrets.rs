//! A node value holding a known secret is refused in every run, durable or not: the node
//! fails with `KNOWN_SECRET`, and the value reaches neither downstream nor the outputs.

use super::*;

const SECRET: &str = "tok-granted-0451";

fn with_secret(x: Value) -> RunOptions {
    let mut opts = RunOptions::default();
    opts.secrets.register(SECRET);
    opts.inputs.insert("x".into(), x);
    opts
}

/// input `x` → `leak` (a node returning what it got) → output `out`.
fn passes_on() -> heddle_core::GraphDoc {
    graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("leak", "test.probe", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "leak", "value"),
            ("leak", "value", "out", "value"),
        ],
    )
}

fn holds_secret(r: &RunResult) -> bool {
    serde_json::to_string(&r.outputs).unwrap().contains(SECRET)
        || serde_json::to_string(&r.events).unwrap().contains(SECRET)
}

#[tokio::test]
async fn a_returned_value_holding_a_known_secret_fails_its_node() {
    let doc = passes_on();
    let r = run(
        &doc,
        with_secret(Value::from_json(
            json!({"auth": {"token": format!("Bearer {SECRET}")}}),
        )),
    )
    .await;
    assert_eq!(r.status, RunStatus::Failed);
    let NodeOutcome::Failed { error } = outcome(&r, "leak") else {
        panic!("{:?}", outcome(&r, "leak"))
    };
    assert!(
        error.contains("KNOWN_SECRET") && error.contains("output `value` of node leak"),
        "{error}"
    );
    assert_eq!(outcome(&r, "out"), skipped(SkipReason::UpstreamFailed));
    assert!(!holds_secret(&r));
}

#[tokio::test]
async fn an_emitted_value_holding_a_known_secret_fails_its_node() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("each", "test.stream_each", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "out", "value"),
        ],
    );
    let r = run(
        &doc,
        with_secret(Value::from_json(json!(["fine", format!("key={SECRET}")]))),
    )
    .await;
    assert_eq!(r.status, RunStatus::Failed);
    let NodeOutcome::Failed { error } = outcome(&r, "each") else {
        panic!("{:?}", outcome(&r, "each"))
    };
    assert!(error.contains("KNOWN_SECRET"), "{error}");
    assert!(!holds_secret(&r));
}

#[tokio::test]
async fn values_without_a_known_secret_pass() {
    let doc = passes_on();
    let r = run(&doc, with_secret(Value::from("tok-granted-04"))).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
}
