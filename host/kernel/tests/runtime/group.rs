//! A node whose declaration allows several invocations at once runs a fan-out's items
//! side by side, up to its declared number; one that declares nothing runs them one at
//! a time. Either way every item's output arrives, in item order, and a failing item
//! fails the node with its error.

use super::*;

/// `items` (0..n) → `each` → `node` (of type `ty`, with `props`) → `all` → `out`.
fn fan(n: i64, ty: &str, props: serde_json::Value) -> heddle_core::GraphDoc {
    let items: Vec<i64> = (0..n).collect();
    graph(
        &[
            ("items", "heddle.constant", json!({"value": items})),
            ("each", "heddle.foreach", json!({})),
            ("node", ty, props),
            ("all", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("items", "value", "each", "list"),
            ("each", "item", "node", "value"),
            ("node", "value", "all", "item"),
            ("all", "list", "out", "value"),
        ],
    )
}

async fn run_fan(n: i64, ty: &str, props: serde_json::Value) -> (RunResult, usize) {
    let (reg, probe) = registry();
    let r = within(run_graph(&fan(n, ty, props), &reg, RunOptions::default()))
        .await
        .unwrap();
    (r, probe.max_in_flight.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_declares_it_runs_up_to_that_many_invocations_at_once() {
    let (r, most) = run_fan(40, "test.overlap", json!({})).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    // Items arrive in batches as the fan-out sends them; every batch runs up to 4 at
    // once, never more.
    assert!((2..=4).contains(&most), "{most} at once");
    assert_eq!(r.nodes["node"].invocations, 40);
    let want: Vec<i64> = (0..40).map(|v| v * 10).collect();
    assert_eq!(ilist(&r.outputs["out"][0]), want, "item order kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_declares_nothing_runs_one_invocation_at_a_time() {
    let (r, most) = run_fan(10, "test.overlap_serial", json!({})).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(most, 1);
    let want: Vec<i64> = (0..10).map(|v| v * 10).collect();
    assert_eq!(ilist(&r.outputs["out"][0]), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_invocation_among_those_running_together_fails_the_node() {
    let (r, _) = run_fan(10, "test.overlap", json!({"fail_on": 5})).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        r.error.as_deref().unwrap_or_default().contains("boom on 5"),
        "{:?}",
        r.error
    );
    assert!(matches!(outcome(&r, "node"), NodeOutcome::Failed { .. }));
}

/// Values of one stream share a key: they are one invocation after another even for a
/// node that may run several at once, and arrive in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_values_of_one_stream_run_one_after_another() {
    let (reg, probe) = registry();
    let doc = graph(
        &[
            (
                "in",
                "heddle.input",
                json!({"name": "nums", "streaming": true, "type": "int"}),
            ),
            ("node", "test.overlap", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "node", "value"),
            ("node", "value", "out", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    for v in 0..20 {
        h.push_input("nums", Value::Int(v)).await.unwrap();
    }
    h.finish_input("nums").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(probe.max_in_flight.load(Ordering::SeqCst), 1);
    let want: Vec<i64> = (0..20).map(|v| v * 10).collect();
    assert_eq!(ints(&r.outputs["out"]), want);
}
