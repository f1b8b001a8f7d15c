//! Fused groups: native nodes fed by one edge from another native node run in their
//! producer's task, through a local queue. What a user sees must not change: order,
//! events, counters, backpressure, cancellation.

use super::*;

/// Default options with inboxes (and local queues) of `buffer` slots: small ones make
/// members wait for room.
fn with_buffer(buffer: usize) -> RunOptions {
    RunOptions {
        inbox: InboxLimits {
            buffer,
            ..InboxLimits::default()
        },
        ..RunOptions::default()
    }
}

/// `in` (streaming) → `p0` … `p{n-1}` → `out`, every node native: one fused group.
fn native_chain(n: usize) -> heddle_core::GraphDoc {
    let mut nodes = vec![(
        "in".to_string(),
        "heddle.input",
        json!({"name": "in", "streaming": true}),
    )];
    let mut edges = Vec::new();
    let mut prev = "in".to_string();
    for i in 0..n {
        let id = format!("p{i}");
        nodes.push((id.clone(), "heddle.passthrough", json!({})));
        edges.push((prev.clone(), id.clone()));
        prev = id;
    }
    nodes.push(("out".into(), "heddle.output", json!({"name": "out"})));
    edges.push((prev, "out".into()));
    let nodes: Vec<(&str, &str, serde_json::Value)> = nodes
        .iter()
        .map(|(id, t, p)| (id.as_str(), *t, p.clone()))
        .collect();
    let edges: Vec<(&str, &str, &str, &str)> = edges
        .iter()
        .map(|(s, t)| (s.as_str(), "value", t.as_str(), "value"))
        .collect();
    graph(&nodes, &edges)
}

/// Queues of one slot, so every member waits for room in the next one over and over:
/// values still arrive in order, every node reports each status once, and every edge's
/// last counter is the number of values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_chain_under_backpressure_keeps_order_events_and_counters() {
    check_chain(5, 500).await;
}

/// A chain longer than a group on a multi-thread runtime is cut into several groups
/// joined by channels: the same order, events and counters across the cuts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_fused_chain_cut_into_groups_keeps_order_events_and_counters() {
    check_chain(40, 200).await;
}

async fn check_chain(nodes: usize, values: i64) {
    let (reg, _) = registry();
    let doc = native_chain(nodes);
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let edge_ids: Vec<String> = plan.edges.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(edge_ids.len(), nodes + 1);
    let opts = with_buffer(1);
    let h = Run::new(plan, &reg, opts).unwrap().start();
    within(async {
        for v in 0..values {
            h.push_input("in", Value::Int(v)).await.unwrap();
        }
        h.finish_input("in").await.unwrap();
    })
    .await;
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), (0..values).collect::<Vec<_>>());
    for i in 0..nodes {
        let id = format!("p{i}");
        assert_eq!(outcome(&r, &id), NodeOutcome::Done, "{id}");
        assert_eq!(r.nodes[&id].invocations, values as u64, "{id}");
        let statuses: Vec<NodeStatus> = r
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Node {
                    node_id, status, ..
                } if *node_id == id => Some(*status),
                _ => None,
            })
            .collect();
        assert_eq!(
            statuses,
            vec![NodeStatus::Running, NodeStatus::Completed],
            "{id}"
        );
    }
    for id in &edge_ids {
        let last = r
            .events
            .iter()
            .filter_map(|ev| match &ev.kind {
                EventKind::Edge {
                    edge_id,
                    status,
                    counter,
                } if edge_id == id => Some((*status, *counter)),
                _ => None,
            })
            .next_back();
        assert_eq!(
            last,
            Some((EdgeStatus::Completed, values as u64)),
            "edge {id}"
        );
    }
}

/// Cancelled while its members wait for room (the chain's end is a node that never
/// returns): every member stops, the run ends cancelled, no task is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_chain_cancelled_mid_way_stops_every_member() {
    let (reg, probe) = registry();
    let doc = graph(
        &[
            (
                "in",
                "heddle.input",
                json!({"name": "in", "streaming": true}),
            ),
            ("p0", "heddle.passthrough", json!({})),
            ("p1", "heddle.passthrough", json!({})),
            ("h", "test.hang", json!({})),
            ("p2", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "p0", "value"),
            ("p0", "value", "p1", "value"),
            ("p1", "value", "h", "value"),
            ("h", "value", "p2", "value"),
            ("p2", "value", "out", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let opts = with_buffer(1);
    let h = Run::new(plan, &reg, opts).unwrap().start();
    // The first value holds `h`, the second fills its inbox, the third leaves `p1`
    // waiting for room: pushes that each return once `in` has room.
    for v in 0..3 {
        within(h.push_input("in", Value::Int(v))).await.unwrap();
    }
    within(probe.hang_started.notified()).await;
    h.cancel();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Cancelled);
    for id in ["h", "p2", "out"] {
        assert_eq!(outcome(&r, id), skipped(SkipReason::Cancelled), "{id}");
    }
    // Members that ran end either way, as separate tasks would: stopped by the cancel,
    // or done once their producer's end-of-stream (sent on cancel) reached them first.
    for id in ["p0", "p1"] {
        let o = outcome(&r, id);
        assert!(
            matches!(
                o,
                NodeOutcome::Done
                    | NodeOutcome::Skipped {
                        reason: SkipReason::Cancelled
                    }
            ),
            "{id}: {o:?}"
        );
    }
    assert!(r.nodes["p1"].invocations >= 1, "p1 ran before the cancel");
    assert_eq!(
        probe.live.load(Ordering::SeqCst),
        0,
        "in-flight invocation aborted"
    );
    // As in `cancel_mid_run_returns_promptly_and_leaves_nothing_running`: the bound is
    // generous for a loaded machine; a task that really leaks never reaches zero.
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..2000 {
        if metrics.num_alive_tasks() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(metrics.num_alive_tasks(), 0, "no actor task left running");
}

/// A member that fails (a `heddle.check` whose assertion is false) fails alone: what it
/// feeds in the same group is skipped for it, and the run fails naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_member_failure_skips_what_it_feeds() {
    let doc = graph(
        &[
            (
                "in",
                "heddle.input",
                json!({"name": "in", "value": {"n": 1}}),
            ),
            ("p0", "heddle.passthrough", json!({})),
            (
                "c",
                "heddle.check",
                json!({"assert": "upstream.p0.fields.n > 5", "message": "too small"}),
            ),
            ("p1", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "p0", "value"),
            ("p0", "value", "c", "p0"),
            ("c", "output", "p1", "value"),
            ("p1", "value", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Failed, "{:?}", r.outputs);
    assert!(
        r.error.as_deref().unwrap_or("").contains("too small"),
        "{:?}",
        r.error
    );
    assert!(matches!(outcome(&r, "c"), NodeOutcome::Failed { .. }));
    assert_eq!(outcome(&r, "p0"), NodeOutcome::Done);
    assert_eq!(outcome(&r, "p1"), skipped(SkipReason::UpstreamFailed));
    assert_eq!(outcome(&r, "out"), skipped(SkipReason::UpstreamFailed));
}

/// A large fan-out flowing through one group lets the runtime's other tasks run meanwhile
/// (the group yields after a bounded number of passes), as separate actors did at their
/// full inboxes: on a current-thread runtime another task gets turns while the outputs
/// are part-way, not only before the first or after the last.
#[tokio::test(flavor = "current_thread")]
async fn a_group_moving_a_large_fan_out_yields_to_other_tasks() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    const N: usize = 10_000;
    let (reg, _) = registry();
    let items: Vec<i64> = (0..N as i64).collect();
    let doc = graph(
        &[
            (
                "items",
                "heddle.input",
                json!({"name": "items", "value": items}),
            ),
            ("each", "heddle.foreach", json!({})),
            ("p", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("items", "value", "each", "list"),
            ("each", "item", "p", "value"),
            ("p", "value", "out", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let opts = with_buffer(4);
    let run = Run::new(plan, &reg, opts).unwrap();
    let mut events = run.subscribe();
    // Turns the other task got while some but not all outputs were out.
    let midway = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let other = {
        let (midway, done) = (midway.clone(), done.clone());
        tokio::spawn(async move {
            let mut outputs = 0;
            while !done.load(Ordering::SeqCst) {
                while let Some(e) = events.try_next() {
                    outputs += usize::from(matches!(e.kind, EventKind::Output { .. }));
                }
                if outputs > 0 && outputs < N {
                    midway.fetch_add(1, Ordering::SeqCst);
                }
                // Back of the run queue at once (tokio's `yield_now` defers the wake to
                // the runtime's next look at its drivers).
                let mut again = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut again, true) {
                        return std::task::Poll::Ready(());
                    }
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                })
                .await;
            }
        })
    };
    let r = within(run.start().wait()).await;
    done.store(true, Ordering::SeqCst);
    other.await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), N);
    let midway = midway.load(Ordering::SeqCst);
    assert!(midway > 0, "no other task ran while the fan-out flowed");
}
