//! Executors are initialized in graph order before any node runs: a failure there fails
//! the run with nothing run, and a cancel while one still initializes ends it cancelled.
//! (Most executors are ready at once and the runner takes their answer without waiting;
//! these pin both that path and the one that waits.)

use super::*;

/// `before` (initialized first) → `init` (as `how` says) → `after`, with `alone` beside.
fn init_graph(how: &str) -> heddle_core::GraphDoc {
    graph(
        &[
            ("before", "test.init", json!({"value": 1})),
            ("init", "test.init", json!({"init": how})),
            ("after", "heddle.passthrough", json!({})),
            ("alone", "heddle.passthrough", json!({"value": 2})),
        ],
        &[
            ("before", "value", "init", "value"),
            ("init", "value", "after", "value"),
        ],
    )
}

fn no_node_ran(r: &RunResult, reason: SkipReason) {
    assert_eq!(r.nodes.len(), 4);
    for (id, n) in &r.nodes {
        assert_eq!(n.outcome, skipped(reason), "{id}");
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
    assert_eq!(
        r.error.as_deref(),
        Some("node \"init\" (type test.init) failed to initialize: no licence")
    );
    no_node_ran(&r, SkipReason::UpstreamFailed);
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
    no_node_ran(&r, SkipReason::Cancelled);
    assert_eq!(probe.finalized.load(Ordering::SeqCst), 1);
}
