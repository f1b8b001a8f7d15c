//! A node's own `retry` policy and `timeout_ms` through the real runtime: one bounded
//! attempt loop charged to the run, every attempt reported with its number, a time limit
//! that cancels and that retry catches, a backoff a cancel cuts short, and the refusal of
//! a retry on a node that may edit.

mod common;

use std::sync::atomic::Ordering;

use common::{registry, within};
use heddle_core::plan::IssueKind;
use heddle_core::{EventKind, GraphDoc, RunResult, RunStatus, Value};
use heddle_kernel::runtime::{Run, RunOptions, run_graph};
use serde_json::json;

/// `v` (a constant 7) feeds node `n`, declared by `node`, whose value reaches output
/// `out`; a second, independent branch `free` reaches output `other`.
fn doc(node: serde_json::Value) -> GraphDoc {
    let mut n = node;
    n["id"] = json!("n");
    let text = json!({
        "nodes": [
            {"id": "v", "type": "heddle.constant", "properties": {"value": 7}},
            n,
            {"id": "out", "type": "heddle.output", "properties": {"name": "out"}},
            {"id": "free", "type": "test.add", "properties": {"a": 1, "b": 2}},
            {"id": "other", "type": "heddle.output", "properties": {"name": "other"}}
        ],
        "edges": [
            {"source": "v", "sourceHandle": "value", "target": "n", "targetHandle": "value"},
            {"source": "n", "sourceHandle": "value", "target": "out", "targetHandle": "value"},
            {"source": "free", "sourceHandle": "sum", "target": "other", "targetHandle": "value"}
        ]
    });
    GraphDoc::parse(&text.to_string(), "retry.json").unwrap()
}

/// Node `n`'s reported attempts: (attempt, timed out, failed).
fn attempts(r: &RunResult) -> Vec<(u32, bool, bool)> {
    r.events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Invocation {
                node_id,
                attempt,
                timed_out,
                error,
                ..
            } if node_id == "n" => Some((*attempt, *timed_out, error.is_some())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_attempt_is_retried_in_the_same_loop_and_every_attempt_is_reported() {
    let (reg, probe) = registry();
    let d = doc(
        json!({"type": "test.flaky", "properties": {"fail_times": 2},
        "retry": {"attempts": 3, "backoff_ms": 1}}),
    );
    let r = within(run_graph(&d, &reg, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::Int(7)]);
    assert_eq!(probe.flaky_calls.load(Ordering::SeqCst), 3);
    // Every attempt is charged to the node's invocation count.
    assert_eq!(r.nodes["n"].invocations, 3);
    assert_eq!(attempts(&r), [(1, false, true), (2, false, true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_at_the_policy_and_the_node_fails_with_the_last_error() {
    let (reg, probe) = registry();
    let d = doc(
        json!({"type": "test.flaky", "properties": {"fail_times": 100},
        "retry": {"attempts": 4, "backoff_ms": 0}}),
    );
    let r = within(run_graph(&d, &reg, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(probe.flaky_calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        attempts(&r),
        [
            (1, false, true),
            (2, false, true),
            (3, false, true),
            (4, false, true)
        ]
    );
    let err = r.error.unwrap();
    assert!(err.contains("flaky failure 4"), "{err}");
    // The independent branch finished.
    assert_eq!(r.outputs["other"], vec![Value::Int(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_limit_cancels_each_attempt_and_retry_catches_it() {
    let (reg, probe) = registry();
    let d = doc(
        json!({"type": "test.hang", "timeout_ms": 30, "access": "none",
        "retry": {"attempts": 2, "backoff_ms": 1}}),
    );
    let r = within(run_graph(&d, &reg, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(attempts(&r), [(1, true, true), (2, true, true)]);
    // The node's report says so too; the branch beside it never timed out.
    assert!(r.nodes["n"].timed_out);
    assert!(!r.nodes["free"].timed_out);
    let err = r.error.unwrap();
    assert!(
        err.contains("deadline exceeded") && err.contains("30 ms"),
        "{err}"
    );
    // Each attempt's work was cancelled, not abandoned: no invocation is still alive.
    assert_eq!(probe.live.load(Ordering::SeqCst), 0);
    assert_eq!(r.outputs["other"], vec![Value::Int(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cuts_the_backoff_short() {
    let (reg, probe) = registry();
    // An hour of backoff: the run only ends this side of `within` because cancel ends it.
    let d = doc(
        json!({"type": "test.flaky", "properties": {"fail_times": 1},
        "retry": {"attempts": 2, "backoff_ms": 3_600_000}}),
    );
    let plan = heddle_core::plan::plan(&d, &reg).unwrap();
    let run = Run::new(plan, &reg, RunOptions::default()).unwrap();
    let mut events = run.subscribe();
    let h = run.start();
    within(async {
        while let Some(e) = events.next().await {
            if let EventKind::Log { message, .. } = &e.kind
                && message.contains("retrying in 3600000 ms")
            {
                break;
            }
        }
    })
    .await;
    h.cancel();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Cancelled);
    // The second attempt never started.
    assert_eq!(probe.flaky_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_a_node_that_may_edit_is_refused_naming_the_node() {
    let (reg, _) = registry();
    // test.fail is not retry-safe and its access is the default, write.
    let d = doc(json!({"type": "test.fail", "retry": {"attempts": 2}}));
    let err = heddle_core::plan::plan(&d, &reg).unwrap_err();
    let i = &err.issues[0];
    assert_eq!(
        (i.kind, i.node.as_deref()),
        (IssueKind::InvalidLimits, Some("n"))
    );
    assert!(
        i.message.contains("may edit") && i.message.contains("`write`"),
        "{i}"
    );
    // The old spelling is the same setting, refused the same way.
    let d = doc(json!({"type": "test.fail", "limits": {"retry": {"attempts": 2}}}));
    assert!(heddle_core::plan::plan(&d, &reg).is_err());
    // Read access (either spelling) or a single attempt is allowed.
    for node in [
        json!({"type": "test.fail", "access": "read", "retry": {"attempts": 2}}),
        json!({"type": "test.fail", "limits": {"files": "none"}, "retry": {"attempts": 2}}),
        json!({"type": "test.fail", "retry": {"attempts": 1}}),
    ] {
        heddle_core::plan::plan(&doc(node.clone()), &reg)
            .unwrap_or_else(|e| panic!("{node}: {e:?}"));
    }
    // Two spellings that disagree are named.
    let d = doc(json!({"type": "test.hang", "timeout_ms": 5, "limits": {"timeout_ms": 6}}));
    let err = heddle_core::plan::plan(&d, &reg).unwrap_err();
    assert!(err.issues[0].message.contains("disagree"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_without_declarations_reports_one_attempt_and_retries_nothing() {
    let (reg, probe) = registry();
    let d = doc(json!({"type": "test.flaky", "properties": {"fail_times": 1}}));
    let r = within(run_graph(&d, &reg, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(probe.flaky_calls.load(Ordering::SeqCst), 1);
    assert_eq!(attempts(&r), [(1, false, true)]);
}
