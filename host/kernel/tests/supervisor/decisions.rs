//! Pending decisions: cancel and timeout, replay of a recorded run, cost accounting.

use super::*;

/// Never answers.
struct Stuck;
impl Supervisor for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }
    fn decide<'a>(
        &'a self,
        _e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn cancel_while_a_decision_is_pending_returns_at_once() {
    let (doc, mut opts) = chain("sup.flaky", json!({}), Value::Int(1));
    opts.supervisor = Some(Arc::new(Stuck));
    let plan = heddle_core::plan::plan(&doc, &registry()).unwrap();
    let run = Run::new(plan, &registry(), opts).unwrap();
    let mut events = run.subscribe();
    let handle = run.start();
    while let Some(e) = events.next().await {
        if matches!(e.kind, EventKind::Escalation { .. }) {
            break;
        }
    }
    handle.cancel();
    let r = tokio::time::timeout(Duration::from_secs(20), handle.wait())
        .await
        .expect("cancel must not wait for the decision");
    assert_eq!(r.status, RunStatus::Cancelled);
}

#[tokio::test]
async fn decision_timeout_fails_decided_by_bounds() {
    let (doc, mut opts) = chain("sup.flaky", json!({}), Value::Int(1));
    opts.supervisor = Some(Arc::new(heddle_kernel::supervisor::Bounded::new(
        Arc::new(Stuck),
        heddle_kernel::supervisor::Bounds {
            decision_timeout: Duration::from_millis(50),
            ..Default::default()
        },
    )));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let i = interventions(&r);
    assert_eq!(i[0].decided_by, DecidedBy::Bounds);
    assert!(r.error.unwrap().contains("longer than"));
}

#[tokio::test]
async fn replay_reproduces_a_recorded_runs_decisions() {
    // Recorded run: a retry for the flaky node, a sticky skip for item 3.
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("flaky", "sup.flaky", json!({})),
            ("check", "sup.fail_on", json!({"bad": 3})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "flaky", "value"),
            ("flaky", "value", "check", "value"),
            ("check", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(vec![Value::Int(1), Value::Int(3), Value::Int(5)]),
    );
    let mut first = opts.clone();
    first.supervisor = policy(
        "[[rule]]\nsignature = \"http:5*\"\nverdict = \"retry\"\n\n[[rule]]\nverdict = \"skip\"\n",
    );
    let recorded = run(&doc, first).await;
    assert_eq!(
        recorded.status,
        RunStatus::Completed,
        "{:?}",
        recorded.error
    );
    let report = serde_json::to_value(&recorded).unwrap();

    let mut again = opts.clone();
    again.supervisor = Some(Arc::new(
        Replay::from_json(&report, "recorded.json").unwrap(),
    ));
    let replayed = run(&doc, again).await;
    assert_eq!(
        replayed.status,
        RunStatus::Completed,
        "{:?}",
        replayed.error
    );
    assert_eq!(replayed.outputs, recorded.outputs);
    let key = |i: &Intervention| {
        (
            i.escalation.node_id.clone(),
            i.escalation.invocation_key.clone(),
            i.escalation.attempt,
            i.verdict.clone(),
        )
    };
    let mut a: Vec<_> = interventions(&recorded).iter().map(key).collect();
    let mut b: Vec<_> = interventions(&replayed).iter().map(key).collect();
    a.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    b.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    assert_eq!(a, b);
    assert!(
        interventions(&replayed)
            .iter()
            .all(|i| i.decided_by == DecidedBy::Replay)
    );

    // A recording without these decisions: every miss is fail.
    let mut empty = opts;
    empty.supervisor = Some(Arc::new(
        Replay::from_json(&json!({"status": "completed"}), "empty.json").unwrap(),
    ));
    let r = run(&doc, empty).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        r.error
            .unwrap()
            .contains("replay: the recorded run has no decision")
    );
}

#[tokio::test]
async fn cost_is_accounted_per_invocation_so_only_the_billed_item_loses_retry() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("call", "sup.cost_if_odd", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "call", "value"),
            ("call", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(3),
            Value::Int(4),
        ]),
    );
    // Retry where allowed, else skip.
    opts.supervisor = policy("[[rule]]\nverdict = \"retry\"\n\n[[rule]]\nverdict = \"skip\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![Value::list(vec![Value::Int(2), Value::Int(4)])]
    );
    let mut by_item: Vec<(u64, f64, Verdict)> = interventions(&r)
        .into_iter()
        .map(|i| {
            (
                i.escalation.lineage[0].index,
                i.escalation.spent_cost_usd,
                i.verdict,
            )
        })
        .collect();
    by_item.sort_by_key(|x| x.0);
    assert_eq!(
        by_item,
        vec![
            (0, 0.01, Verdict::skip()),
            (1, 0.0, Verdict::Retry),
            (2, 0.01, Verdict::skip()),
            (3, 0.0, Verdict::Retry),
        ]
    );
}
