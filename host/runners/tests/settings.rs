//! Code node settings are checked while the graph is planned: every problem at once,
//! each naming the node and the property, the same verdict `heddle validate` gives and a
//! run gives, and no absurd value panics or wraps around into a missing limit.

mod common;

use std::sync::Arc;

use common::*;
use heddle_core::plan::{Issue, plan};
use heddle_core::{GraphBuilder, GraphDoc, Value};
use heddle_kernel::Registry;
use heddle_runners::{CodeNodes, RunnersConfig};
use serde_json::json;

fn registry(config: RunnersConfig) -> Registry {
    let mut r = Registry::with_builtins();
    r.add(Arc::new(CodeNodes::new(config)))
        .expect("code node types are new");
    r
}

/// A graph of one `code.bash` node `id` with `properties`.
fn one_node(id: &str, properties: serde_json::Value) -> GraphDoc {
    GraphBuilder::new()
        .node_with(id, "code.bash", properties)
        .build()
}

/// The planner's issues for the graph (it must be refused).
fn issues(doc: &GraphDoc, config: RunnersConfig) -> Vec<Issue> {
    match plan(doc, &registry(config)) {
        Ok(_) => panic!("the graph was accepted"),
        Err(e) => e.issues,
    }
}

/// The property each issue is about, sorted.
fn properties_of(issues: &[Issue], node: &str) -> Vec<String> {
    let mut v: Vec<String> = issues
        .iter()
        .inspect(|i| assert_eq!(i.node.as_deref(), Some(node), "{i:?}"))
        .map(|i| i.handle.clone().unwrap_or_default())
        .collect();
    v.sort();
    v
}

#[test]
fn every_bad_setting_is_an_issue_of_the_plan_at_once() {
    let outside = tempfile::tempdir().unwrap();
    let doc = one_node(
        "coder",
        json!({
            "code": "echo hi",
            "mode": "vm",
            "timeout_s": -1,
            "workspace": outside.path(),
            "tmp_size_mb": 0,
        }),
    );
    let found = issues(&doc, RunnersConfig::default());
    assert_eq!(
        properties_of(&found, "coder"),
        ["mode", "timeout_s", "tmp_size_mb", "workspace"],
        "{found:#?}"
    );
    let text: Vec<String> = found.iter().map(|i| i.message.clone()).collect();
    assert!(text.iter().any(|m| m.contains("`vm`")), "{text:?}");
    assert!(
        text.iter().any(|m| m.contains("workspace_roots")),
        "{text:?}"
    );
}

#[test]
fn settings_the_operator_refuses_are_issues_of_the_plan() {
    let doc = one_node(
        "host",
        json!({"code": "echo hi", "mode": "subprocess", "network": false}),
    );
    let found = issues(&doc, RunnersConfig::default());
    assert_eq!(
        properties_of(&found, "host"),
        ["mode", "network"],
        "{found:#?}"
    );
    let allowed = RunnersConfig {
        allow_subprocess: true,
        ..RunnersConfig::default()
    };
    let found = issues(&doc, allowed.clone());
    assert_eq!(properties_of(&found, "host"), ["network"], "{found:#?}");

    let fine = one_node("host", json!({"code": "echo hi", "mode": "subprocess"}));
    assert!(plan(&fine, &registry(allowed)).is_ok());
}

/// Values whose conversion to bytes, nano-CPUs or a duration used to overflow: each is
/// refused, naming the node and the setting, and nothing panics.
#[test]
fn absurd_numbers_are_refused_not_panicked_on() {
    let near_2_53 = 9_007_199_254_740_991_i64;
    let doc = one_node(
        "huge",
        json!({
            "code": "echo hi",
            "timeout_s": 1e300,
            "memory_mb": near_2_53,
            "tmp_size_mb": near_2_53,
            "cpus": 1e300,
            "pids_limit": near_2_53,
            "output_limit_bytes": near_2_53,
            "kill_grace_ms": near_2_53,
        }),
    );
    let found = issues(&doc, RunnersConfig::default());
    assert_eq!(
        properties_of(&found, "huge"),
        [
            "cpus",
            "kill_grace_ms",
            "memory_mb",
            "output_limit_bytes",
            "pids_limit",
            "timeout_s",
            "tmp_size_mb"
        ],
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|i| i.message.contains("must be an integer from 6 to")),
        "{found:#?}"
    );
}

#[test]
fn the_largest_allowed_values_are_accepted() {
    let doc = one_node(
        "big",
        json!({
            "code": "echo hi",
            "timeout_s": 604800,
            "memory_mb": 1_048_576,
            "tmp_size_mb": 1_048_576,
            "cpus": 1024,
            "pids_limit": 4_194_304,
            "output_limit_bytes": 1_073_741_824,
            "kill_grace_ms": 600_000,
        }),
    );
    if let Err(e) = plan(&doc, &registry(RunnersConfig::default())) {
        panic!("refused: {e}");
    }
}

#[test]
fn a_missing_code_property_is_reported_once() {
    let doc = one_node("empty", json!({}));
    let found = issues(&doc, RunnersConfig::default());
    assert_eq!(properties_of(&found, "empty"), ["code"], "{found:#?}");
}

/// A huge value is not echoed whole into the error.
#[test]
fn long_values_are_cut_in_the_message() {
    let doc = one_node(
        "long",
        json!({"code": "echo hi", "mode": "x".repeat(1_000_000)}),
    );
    let found = issues(&doc, RunnersConfig::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].message.len() < 500, "{}", found[0].message.len());
}

/// Creation refuses what planning refuses, with every problem in one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_lists_every_problem_naming_the_node() {
    let r = run_node(
        &code_nodes(),
        "n4",
        "code.python",
        props(&[
            ("code", Value::str("print(1)")),
            ("timeout_s", Value::Float(1e300)),
            ("memory_mb", Value::Int(1 << 53)),
        ]),
    )
    .await;
    let m = &r.error().message;
    assert!(m.starts_with("node n4: "), "{m}");
    assert!(
        m.contains("`timeout_s`") && m.contains("`memory_mb`"),
        "{m}"
    );
}

/// A node's `limits.timeout_ms` becomes a deadline (`now + ms`); an absurd one is refused
/// when the graph is read, naming the range, the file and the line.
#[test]
fn absurd_node_time_limits_are_refused_when_the_graph_is_read() {
    let text = |ms: &str| {
        format!(
            r#"{{"nodes": [{{"id": "n", "type": "code.bash", "properties": {{"code": "true"}},
                "limits": {{"timeout_ms": {ms}}}}}], "edges": []}}"#
        )
    };
    let e = GraphDoc::parse(&text("18446744073709551615"), "g.json").unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("from 1 to 604800000") && m.contains("g.json:2:"),
        "{m}"
    );
    assert!(GraphDoc::parse(&text("0"), "g.json").is_err());
    assert!(GraphDoc::parse(&text("604800000"), "g.json").is_ok());
}
