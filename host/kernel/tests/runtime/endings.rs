//! How nodes and runs end: end-of-stream, skips with reasons, failures, suspension,
//! cancellation and per-invocation timeouts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_of_stream_flows_through_chains_and_diamonds() {
    // A diamond per item (one branch longer than the other), joined by lineage.
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 2, 3, 4]})),
            ("each", "heddle.foreach", json!({})),
            ("l", "heddle.passthrough", json!({})),
            ("r1", "heddle.passthrough", json!({})),
            ("r2", "heddle.passthrough", json!({})),
            ("join", "test.add", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "l", "value"),
            ("each", "item", "r1", "value"),
            ("r1", "value", "r2", "value"),
            ("l", "value", "join", "a"),
            ("r2", "value", "join", "b"),
            ("join", "sum", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![2, 4, 6, 8]);
    for id in ["list", "each", "l", "r1", "r2", "join", "out"] {
        assert_eq!(outcome(&r, id), NodeOutcome::Done, "{id}");
    }
    // Exact counters when each edge completes.
    let mut completed: Vec<(String, u64)> = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Edge {
                edge_id,
                status: EdgeStatus::Completed,
                counter,
            } => Some((edge_id.clone(), *counter)),
            _ => None,
        })
        .collect();
    completed.sort();
    assert_eq!(completed.len(), 7);
    assert!(
        completed
            .iter()
            .all(|(id, c)| *c == if id.starts_with("list:") { 1 } else { 4 }),
        "{completed:?}"
    );

    // A chain fed by a live stream ends when the stream ends.
    let (reg, _) = registry();
    let plan = heddle_core::plan::plan(&heddle_kernel::bench::chain(3), &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    for v in 1..=4 {
        h.push_input("in", Value::Int(v)).await.unwrap();
    }
    h.finish_input("in").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_inputs_received_nothing_is_skipped_with_its_reason() {
    let doc = graph(
        &[
            ("v", "heddle.constant", json!({"value": 1})),
            ("br", "test.branch", json!({"take": true})),
            ("yes", "heddle.passthrough", json!({})),
            ("no", "heddle.passthrough", json!({})),
            ("out_yes", "heddle.output", json!({})),
            ("out_no", "heddle.output", json!({})),
            // Partial input: `a` gets a value, `b` (from the untaken branch) closes empty,
            // so the node fires with b's declared default (100).
            ("partial", "test.add", json!({})),
            ("out_partial", "heddle.output", json!({})),
        ],
        &[
            ("v", "value", "br", "value"),
            ("br", "yes", "yes", "value"),
            ("br", "no", "no", "value"),
            ("yes", "value", "out_yes", "value"),
            ("no", "value", "out_no", "value"),
            ("yes", "value", "partial", "a"),
            ("no", "value", "partial", "b"),
            ("partial", "sum", "out_partial", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out_yes"]), vec![1]);
    assert!(r.outputs["out_no"].is_empty());
    assert_eq!(outcome(&r, "no"), skipped(SkipReason::NoInput));
    assert_eq!(outcome(&r, "out_no"), skipped(SkipReason::UpstreamSkipped));
    assert_eq!(ints(&r.outputs["out_partial"]), vec![101]);
    let ev = r.events.iter().find(|e| matches!(&e.kind, EventKind::Node { node_id, status: NodeStatus::Skipped, .. } if node_id == "no"));
    assert!(matches!(
        &ev.unwrap().kind,
        EventKind::Node {
            skip_reason: Some(SkipReason::NoInput),
            ..
        }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_node_fails_the_run_and_skips_its_downstream() {
    let doc = graph(
        &[
            ("v", "heddle.constant", json!({"value": 3})),
            ("f", "test.fail", json!({"fail_on": 3})),
            ("p", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({})),
            // An independent branch still completes.
            ("w", "heddle.constant", json!({"value": 9})),
            ("out2", "heddle.output", json!({})),
        ],
        &[
            ("v", "value", "f", "value"),
            ("f", "value", "p", "value"),
            ("p", "value", "out", "value"),
            ("w", "value", "out2", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.clone().unwrap();
    assert!(
        err.contains("node \"f\" (type test.fail) failed: boom on 3"),
        "{err}"
    );
    assert!(
        matches!(outcome(&r, "f"), NodeOutcome::Failed { error } if error.contains("boom on 3"))
    );
    assert_eq!(outcome(&r, "p"), skipped(SkipReason::UpstreamFailed));
    assert_eq!(outcome(&r, "out"), skipped(SkipReason::UpstreamFailed));
    assert_eq!(ints(&r.outputs["out2"]), vec![9]);
    assert!(r.events.iter().any(|e| matches!(&e.kind, EventKind::Node { node_id, status: NodeStatus::Failed, .. } if node_id == "f")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspending_node_suspends_the_run() {
    let doc = graph(
        &[
            ("v", "heddle.constant", json!({"value": "draft"})),
            ("s", "test.suspend", json!({})),
            ("out", "heddle.output", json!({})),
            ("f", "test.fail", json!({"fail_on": 1})),
            ("one", "heddle.constant", json!({"value": 1})),
        ],
        &[
            ("v", "value", "s", "value"),
            ("s", "value", "out", "value"),
            ("one", "value", "f", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    // Suspension outranks the failure of another node.
    assert_eq!(r.status, RunStatus::Suspended, "{:?}", r.error);
    let s = r.suspend.clone().unwrap();
    assert_eq!(
        (s.node_id.as_str(), s.reason.as_str()),
        ("s", "needs approval")
    );
    assert_eq!(s.state, Value::str("draft"));
    assert_eq!(outcome(&r, "s"), NodeOutcome::Suspended);
    assert_eq!(outcome(&r, "out"), skipped(SkipReason::Suspended));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_run_returns_promptly_and_leaves_nothing_running() {
    let (reg, probe) = registry();
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 2, 3]})),
            ("each", "heddle.foreach", json!({})),
            ("h", "test.hang", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
            (
                "in",
                "heddle.input",
                json!({"name": "in", "streaming": true}),
            ),
            ("h2", "test.hang", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "h", "value"),
            ("h", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
            ("in", "value", "h2", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    within(probe.hang_started.notified()).await;
    assert_eq!(probe.live.load(Ordering::SeqCst), 1);
    h.cancel();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(
        probe.live.load(Ordering::SeqCst),
        0,
        "in-flight invocation aborted"
    );
    assert_eq!(
        probe.finalized.load(Ordering::SeqCst),
        2,
        "every test executor finalized"
    );
    assert_eq!(outcome(&r, "h"), skipped(SkipReason::Cancelled));
    assert_eq!(outcome(&r, "h2"), skipped(SkipReason::Cancelled));
    // A finished task leaves the runtime's task list just after its JoinHandle sees the
    // result; give the release a moment, then nothing may be left. The bound is generous
    // because on a loaded 2-core machine the worker that releases the task may not be
    // scheduled for a while; a task that really leaks never reaches zero.
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..2000 {
        if metrics.num_alive_tasks() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(metrics.num_alive_tasks(), 0, "no actor task left running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_invocation_timeout_cancels_and_fails_with_deadline() {
    let (reg, probe) = registry();
    let doc = heddle_core::GraphDoc::parse(
        &json!({"nodes": [
            {"id": "v", "type": "heddle.constant", "properties": {"value": 1}},
            {"id": "h", "type": "test.hang", "limits": {"timeout_ms": 30}}
        ], "edges": [{"source": "v", "sourceHandle": "value", "target": "h", "targetHandle": "value"}]})
        .to_string(),
        "t.json",
    )
    .unwrap();
    let r = within(run_graph(&doc, &reg, RunOptions::default()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.unwrap();
    assert!(
        err.contains("node \"h\" (type test.hang) failed: deadline exceeded"),
        "{err}"
    );
    assert!(err.contains("30 ms"), "{err}");
    assert_eq!(probe.live.load(Ordering::SeqCst), 0);
}

/// Every node's ending is on the record after the endings of the nodes feeding it (a
/// consumer printing them in order never shows a node settle before its upstream), and
/// the run's wall time is on the events' clock (no event reads later than the run's
/// end). Each graph runs many times: the order used to depend on which task got there
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_ends_on_the_record_after_every_node_that_fed_it() {
    use heddle_core::GraphBuilder;
    // A condition diamond per item, and a failure with what hangs below it.
    let diamond = GraphBuilder::new()
        .node_with("list", "heddle.constant", json!({"value": [5, -3, 7, 0]}))
        .node("each", "heddle.foreach")
        .node("pos", "heddle.passthrough")
        .node("neg", "heddle.passthrough")
        .node("join", "heddle.passthrough")
        .node("gather", "heddle.collect")
        .node("out", "heddle.output")
        .edge("list", "value", "each", "list")
        .edge("each", "item", "pos", "value")
        .when("value > 0")
        .edge("each", "item", "neg", "value")
        .when("value <= 0")
        .edge("pos", "value", "join", "value")
        .edge("neg", "value", "join", "value")
        .edge("join", "value", "gather", "item")
        .edge("gather", "list", "out", "value")
        .build();
    let failing = GraphBuilder::new()
        .node_with("v", "heddle.constant", json!({"value": 1}))
        .node_with("div", "test.fail", json!({"fail_on": 1}))
        .node("quotient", "heddle.passthrough")
        .node("shown", "heddle.output")
        .node_with("free", "heddle.constant", json!({"value": 2}))
        .node("beside", "heddle.passthrough")
        .node("other", "heddle.output")
        .edge("v", "value", "div", "value")
        .edge("div", "value", "quotient", "value")
        .edge("quotient", "value", "shown", "value")
        .edge("free", "value", "beside", "value")
        .edge("beside", "value", "other", "value")
        .build();
    // `each` feeds a fast node and a slow one through inboxes of one message: its end
    // reaches `fast` while it still waits for room in `slow`'s inbox.
    let backed_up = GraphBuilder::new()
        .node_with("list", "heddle.constant", json!({"value": [0, 1, 2, 3]}))
        .node("each", "heddle.foreach")
        .node("fast", "heddle.passthrough")
        .node_with("slow", "test.delay", json!({"n": 4, "step_ms": 5}))
        .node("fast_out", "heddle.output")
        .node("slow_out", "heddle.output")
        .edge("list", "value", "each", "list")
        .edge("each", "item", "fast", "value")
        .edge("each", "item", "slow", "value")
        .edge("fast", "value", "fast_out", "value")
        .edge("slow", "value", "slow_out", "value")
        .build();
    let one = || RunOptions {
        inbox: InboxLimits {
            buffer: 1,
            ..InboxLimits::default()
        },
        ..RunOptions::default()
    };
    for doc in [&diamond, &failing, &backed_up] {
        for round in 0..20 {
            let r = run(doc, one()).await;
            let ended: Vec<(usize, &str)> = r
                .events
                .iter()
                .enumerate()
                .filter_map(|(i, e)| match &e.kind {
                    EventKind::Node {
                        node_id, status, ..
                    } if !matches!(status, NodeStatus::Running | NodeStatus::Warning) => {
                        Some((i, node_id.as_str()))
                    }
                    _ => None,
                })
                .collect();
            let at = |id: &str| {
                ended
                    .iter()
                    .find(|(_, n)| *n == id)
                    .unwrap_or_else(|| panic!("no ending of {id}: {:?}", r.events))
                    .0
            };
            for e in &doc.edges {
                assert!(
                    at(&e.source) < at(&e.target),
                    "round {round}: {} ended before {}, which feeds it: {:#?}",
                    e.target,
                    e.source,
                    r.events
                );
            }
            let last = r.events.len() - 1;
            let latest = r.events[..last].iter().map(|e| e.at_us).max().unwrap();
            assert!(
                r.wall_us >= latest,
                "round {round}: the run took {} us, an event is stamped {latest} us",
                r.wall_us
            );
        }
    }
}
