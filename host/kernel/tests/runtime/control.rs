//! Controllers in a graph (seed 002, "Control events"): a node wired by a control edge
//! to a controlled node drives it with `run` events and gets its outputs back, FIFO;
//! the built-in `heddle.run_each` does it per item of a list; bad wiring and bad
//! overrides are refused by name, never a hang.

use super::*;

fn plan_issues(doc: &heddle_core::GraphDoc) -> Vec<heddle_core::plan::Issue> {
    let (reg, _) = registry();
    match heddle_core::plan::plan(doc, &reg) {
        Ok(_) => Vec::new(),
        Err(e) => e.issues,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_gets_replies_in_the_order_it_sent_its_events_and_the_control_context() {
    let doc = graph(
        &[
            ("x", "heddle.constant", json!({"value": 10})),
            (
                "ctl",
                "test.drive",
                json!({"target": "s", "factors": [1, 2, 3, 4, 5, 6, 7, 8]}),
            ),
            ("s", "test.scale", json!({"factor": 9})),
            ("replies", "heddle.output", json!({})),
            ("context", "heddle.output", json!({})),
            ("each", "heddle.output", json!({})),
        ],
        &[
            ("x", "value", "s", "x"),
            ("ctl", "__control__", "s", "__control__"),
            ("ctl", "replies", "replies", "value"),
            ("ctl", "context", "context", "value"),
            ("s", "out", "each", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    // Eight events in flight at once, each answered with its own invocation's output.
    assert_eq!(
        ilist(&r.outputs["replies"][0]),
        vec![10, 20, 30, 40, 50, 60, 70, 80]
    );
    // The target's outputs also go downstream, one per event, in event order.
    assert_eq!(
        ints(&r.outputs["each"]),
        vec![10, 20, 30, 40, 50, 60, 70, 80]
    );
    assert_eq!(r.nodes["s"].invocations, 8);
    // `test.scale` is not retry-safe: each event counts as an asset of the controller's
    // invocation, so a supervisor would not offer to retry it (and run `s` again).
    assert_eq!(r.nodes["ctl"].metrics.assets, vec!["control:s"; 8]);
    let ctx = r.outputs["context"][0].to_json();
    assert_eq!(ctx["s"]["node_type"], "test.scale");
    assert_eq!(ctx["s"]["properties"]["factor"]["type"], "int");
    assert_eq!(ctx["s"]["properties"]["factor"]["value"], 9);
    assert_eq!(ctx["s"]["properties"]["factor"]["default"], 1);
    assert_eq!(ctx["s"]["actions"]["run"]["outputs"]["out"]["type"], "int");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_each_runs_a_controlled_node_once_per_item_and_collects_the_replies() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 2, 3, 4]})),
            ("x", "heddle.constant", json!({"value": 10})),
            ("each", "heddle.run_each", json!({"property": "factor"})),
            ("s", "test.scale", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "items"),
            ("x", "value", "s", "x"),
            ("each", "__control__", "s", "__control__"),
            ("each", "results", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ilist(&r.outputs["out"][0]), vec![10, 20, 30, 40]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_each_drives_the_built_in_eval_node_with_objects_of_overrides() {
    let doc = graph(
        &[
            (
                "list",
                "heddle.constant",
                json!({"value": [{"value": 2}, {"value": 5, "expression": "value * value"}]}),
            ),
            ("each", "heddle.run_each", json!({})),
            ("e", "heddle.eval", json!({"expression": "value + 1"})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "items"),
            ("each", "__control__", "e", "__control__"),
            ("each", "results", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    // The second item overrides the expression for its own run only.
    assert_eq!(r.outputs["out"][0].to_json(), json!([3, 25]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_of_a_property_the_target_lacks_fails_the_controller_by_name() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1]})),
            ("each", "heddle.run_each", json!({"property": "colour"})),
            ("s", "test.scale", json!({"x": 1})),
        ],
        &[
            ("list", "value", "each", "items"),
            ("each", "__control__", "s", "__control__"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap_or_default();
    for part in ["each", "node s", "`__control__`", "`colour`", "test.scale"] {
        assert!(err.contains(part), "{part} not in: {err}");
    }
    assert_eq!(r.nodes["s"].invocations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_naming_a_node_it_is_not_wired_to_fails_by_name() {
    let doc = graph(
        &[
            (
                "ctl",
                "test.drive",
                json!({"target": "other", "factors": [1]}),
            ),
            ("s", "test.scale", json!({"x": 1})),
            ("other", "test.scale", json!({"x": 1})),
        ],
        &[("ctl", "__control__", "s", "__control__")],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap_or_default();
    assert!(
        err.contains("node other") && err.contains("wired to: s"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_each_without_a_control_edge_fails_instead_of_waiting() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1]})),
            ("each", "heddle.run_each", json!({"property": "factor"})),
        ],
        &[("list", "value", "each", "items")],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        r.error.unwrap_or_default().contains("controls nothing"),
        "the failure says why"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_target_fails_its_controller_and_the_run() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, "two"]})),
            ("each", "heddle.run_each", json!({"property": "value"})),
            (
                "e",
                "heddle.eval",
                json!({"expression": "$number(value) + 1"}),
            ),
        ],
        &[
            ("list", "value", "each", "items"),
            ("each", "__control__", "e", "__control__"),
        ],
    );
    let r = within(run(&doc, RunOptions::default())).await;
    assert_eq!(r.status, RunStatus::Failed, "{:?}", r.outputs);
}

#[test]
fn planning_refuses_control_edges_into_uncontrolled_nodes_self_control_and_mutual_waits() {
    // Into a node that is not controlled.
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1]})),
            ("each", "heddle.run_each", json!({})),
            ("p", "heddle.passthrough", json!({})),
        ],
        &[
            ("list", "value", "each", "items"),
            ("each", "__control__", "p", "__control__"),
        ],
    );
    let issues = plan_issues(&doc);
    assert!(
        issues.iter().any(|i| i.node.as_deref() == Some("p")
            && i.handle.as_deref() == Some("__control__")
            && i.message.contains("not a controlled node")),
        "{issues:?}"
    );

    // A controller wired to itself.
    let doc = graph(
        &[("e", "heddle.eval", json!({"expression": "1"}))],
        &[("e", "__control__", "e", "__control__")],
    );
    let issues = plan_issues(&doc);
    assert!(
        issues
            .iter()
            .any(|i| i.node.as_deref() == Some("e") && i.message.contains("to itself")),
        "{issues:?}"
    );

    // The controlled node waits for the controller's outputs (and the other way round).
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1]})),
            ("each", "heddle.run_each", json!({"property": "value"})),
            ("e", "heddle.eval", json!({"expression": "value"})),
        ],
        &[
            ("list", "value", "each", "items"),
            ("each", "results", "e", "value"),
            ("each", "__control__", "e", "__control__"),
        ],
    );
    let issues = plan_issues(&doc);
    assert!(
        issues.iter().any(|i| i.node.as_deref() == Some("e")
            && i.handle.as_deref() == Some("__control__")
            && i.message.contains("controlled by node each")),
        "{issues:?}"
    );
    let doc = graph(
        &[
            ("e", "heddle.eval", json!({"expression": "value"})),
            ("each", "heddle.run_each", json!({"property": "value"})),
        ],
        &[
            ("e", "result", "each", "items"),
            ("each", "__control__", "e", "__control__"),
        ],
    );
    let issues = plan_issues(&doc);
    assert!(
        issues
            .iter()
            .any(|i| i.message.contains("node each controls node e")),
        "{issues:?}"
    );

    // A JSONata typo in heddle.eval is refused before anything runs.
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1]})),
            ("each", "heddle.run_each", json!({"property": "value"})),
            ("e", "heddle.eval", json!({"expression": "value +"})),
        ],
        &[
            ("list", "value", "each", "items"),
            ("each", "__control__", "e", "__control__"),
        ],
    );
    let issues = plan_issues(&doc);
    assert!(
        issues
            .iter()
            .any(|i| i.node.as_deref() == Some("e") && i.message.contains("expression")),
        "{issues:?}"
    );
}
