//! Executors are initialized in graph order before any node runs: a failure there fails
//! the run with nothing run, and a cancel while one still initializes ends it cancelled.
//! (Most executors are ready at once and the runner takes their answer without waiting;
//! these pin both that path and the one that waits.)

use super::*;

/// `given` (an input) → `before` (initialized first) → `init` (as `how` says) →
/// `after`, with `alone` beside.
fn init_graph(how: &str) -> heddle_core::GraphDoc {
    graph(
        &[
            ("given", "heddle.input", json!({"value": 1})),
            ("before", "test.init", json!({})),
            ("init", "test.init", json!({"init": how})),
            ("after", "heddle.passthrough", json!({})),
            ("alone", "heddle.passthrough", json!({"value": 2})),
        ],
        &[
            ("given", "value", "before", "value"),
            ("before", "value", "init", "value"),
            ("init", "value", "after", "value"),
        ],
    )
}

/// Every node of `r` has the outcome `outcome(id)` and no invocation; no node event.
fn no_node_ran(r: &RunResult, outcome: impl Fn(&str) -> NodeOutcome) {
    assert_eq!(r.nodes.len(), 5);
    for (id, n) in &r.nodes {
        assert_eq!(n.outcome, outcome(id), "{id}");
        assert_eq!(n.invocations, 0, "{id}");
    }
    assert!(
        !r.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Node { .. })),
        "{:?}",
        r.events
    );
}

#[tokio::test]
async fn an_executor_that_fails_to_initialize_fails_the_run_with_nothing_run() {
    let (reg, probe) = registry();
    let r = within(run_graph(&init_graph("fail"), &reg, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let error = "node \"init\" (type test.init) failed to initialize: no licence";
    assert_eq!(r.error.as_deref(), Some(error));
    // The node that failed is `failed`, the input that was given is `done`, and every
    // other node never ran because of the failure.
    no_node_ran(&r, |id| match id {
        "init" => NodeOutcome::Failed {
            error: error.into(),
        },
        "given" => NodeOutcome::Done,
        _ => skipped(SkipReason::UpstreamFailed),
    });
    assert_eq!(&*r.nodes["after"].node_type, "heddle.passthrough");
    // Only the executor initialized before it is finalized.
    assert_eq!(probe.finalized.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_run_cancelled_while_an_executor_initializes_ends_cancelled() {
    let (reg, probe) = registry();
    let plan = heddle_core::plan::plan(&init_graph("wait"), &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    // The runner is stuck in `init`'s initialization until the cancel reaches it.
    tokio::task::yield_now().await;
    h.cancel();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(r.error.as_deref(), Some("cancelled"));
    no_node_ran(&r, |_| skipped(SkipReason::Cancelled));
    assert_eq!(probe.finalized.load(Ordering::SeqCst), 1);
}
