//! Inbox limits that abort a run naming node, handle and key, and the event bus
//! (every subscriber sees every event; retained events are capped).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_max_pending_messages_per_key_aborts_the_run_naming_node_handle_key() {
    let (reg, _) = registry();
    // `a` streams (a repeating driver) but `b` never arrives: a's values pile up.
    let doc = graph(
        &[
            (
                "a",
                "heddle.input",
                json!({"name": "a", "streaming": true, "type": "int"}),
            ),
            ("one", "heddle.constant", json!({"value": 1})),
            ("never", "test.hang", json!({})),
            ("join", "test.add", json!({})),
        ],
        &[
            ("a", "value", "join", "a"),
            ("one", "value", "never", "value"),
            ("never", "value", "join", "b"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let opts = RunOptions {
        inbox: InboxLimits {
            max_pending_keys: 10_000,
            max_pending_messages_per_key: 5,
            buffer: 4,
        },
        ..RunOptions::default()
    };
    let h = Run::new(plan, &reg, opts).unwrap().start();
    for v in 0..50 {
        if h.push_input("a", Value::Int(v)).await.is_err() {
            break;
        }
    }
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(
        r.error.as_deref(),
        Some(
            "Inbox for node \"join\" exceeded max_pending_messages_per_key (5) on handle \"a\" for key \"(root)\""
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_max_pending_keys_aborts_the_run_and_labels_what_it_stopped() {
    let doc = graph(
        &[
            (
                "list",
                "heddle.constant",
                json!({"value": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}),
            ),
            ("each", "heddle.foreach", json!({})),
            ("never", "test.hang", json!({})),
            ("join", "test.add", json!({})),
            ("after", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "join", "a"),
            ("each", "index", "never", "value"),
            ("never", "value", "join", "b"),
            ("join", "sum", "after", "value"),
            ("after", "value", "out", "value"),
        ],
    );
    let opts = RunOptions {
        inbox: InboxLimits {
            max_pending_keys: 3,
            ..InboxLimits::default()
        },
        ..RunOptions::default()
    };
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.clone().unwrap();
    assert!(
        err.starts_with("Inbox for node \"join\" exceeded max_pending_keys (3) on handle \"a\"."),
        "{err}"
    );
    // The run failed, nobody cancelled it: what lies below the failing node never ran
    // because its upstream failed; the node beside it was stopped by the run's end.
    assert!(
        matches!(r.nodes["join"].outcome, NodeOutcome::Failed { .. }),
        "{:?}",
        r.nodes["join"]
    );
    for id in ["after", "out"] {
        assert_eq!(
            r.nodes[id].outcome,
            skipped(SkipReason::UpstreamFailed),
            "{id}"
        );
    }
    assert_eq!(r.nodes["never"].outcome, skipped(SkipReason::Cancelled));
    // The events say the same as the result.
    let skip_of = |id: &str| {
        r.events.iter().find_map(|e| match &e.kind {
            EventKind::Node {
                node_id,
                status: NodeStatus::Skipped,
                skip_reason,
                ..
            } if node_id == id => *skip_reason,
            _ => None,
        })
    };
    assert_eq!(skip_of("after"), Some(SkipReason::UpstreamFailed));
    assert_eq!(skip_of("out"), Some(SkipReason::UpstreamFailed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscriber_sees_every_event_in_order() {
    let (reg, _) = registry();
    let doc = heddle_kernel::bench::chain(5);
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let run = Run::new(plan, &reg, RunOptions::default()).unwrap();
    let mut s1 = run.subscribe();
    let h = run.start();
    let mut s2 = h.subscribe();
    for v in 0..20 {
        h.push_input("in", Value::Int(v)).await.unwrap();
    }
    h.finish_input("in").await.unwrap();
    let r = within(h.wait()).await;
    let mut a = Vec::new();
    while let Some(e) = s1.next().await {
        a.push(e.seq);
    }
    let mut b = Vec::new();
    while let Some(e) = s2.next().await {
        b.push(e.seq);
    }
    let all: Vec<u64> = (0..r.events.len() as u64).collect();
    assert_eq!(a, all);
    assert_eq!(b, all);
    assert_eq!(ints(&r.outputs["out"]), (0..20).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_events_are_capped_dropping_the_oldest_half() {
    let (reg, _) = registry();
    let doc = heddle_kernel::bench::chain(1);
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let h = Run::new(
        plan,
        &reg,
        RunOptions {
            event_cap: 100,
            ..RunOptions::default()
        },
    )
    .unwrap()
    .start();
    for v in 0..500 {
        h.push_input("in", Value::Int(v)).await.unwrap();
    }
    h.finish_input("in").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed);
    assert!(r.events.len() <= 100);
    assert!(r.events_dropped > 0);
    assert_eq!(
        r.events.last().unwrap().seq + 1,
        r.events.len() as u64 + r.events_dropped
    );
    assert_eq!(r.outputs["out"].len(), 500, "outputs are never dropped");
}
