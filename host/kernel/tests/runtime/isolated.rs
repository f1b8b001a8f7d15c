//! Nodes with no edges at all run inline in the runner, without an actor: each must end,
//! report and emit exactly what an actor would have.

use std::sync::Arc;

use heddle_kernel::supervisor::FailClosed;

use super::*;

/// Every isolated node kind the kernel has a fast path for (forwarding built-ins, a
/// fan-out), an isolated node that is not a native built-in (it runs as an actor, and
/// fails), and a connected pair beside them.
fn isolated_graph() -> heddle_core::GraphDoc {
    graph(
        &[
            ("p", "heddle.passthrough", json!({"value": 7})),
            ("c", "heddle.constant", json!({"value": "x"})),
            ("empty", "heddle.passthrough", json!({})),
            ("each", "heddle.foreach", json!({"list": [1, 2]})),
            ("bad", "test.fail", json!({"value": 3, "fail_on": 3})),
            ("src", "heddle.constant", json!({"value": 1})),
            ("out", "heddle.output", json!({})),
        ],
        &[("src", "value", "out", "value")],
    )
}

/// Per node, its events (status and result) in order, and its report.
fn node_story(r: &RunResult, id: &str) -> (Vec<(NodeStatus, Option<String>)>, String) {
    let events = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Node {
                node_id,
                status,
                result,
                error,
                ..
            } if node_id == id => Some((
                *status,
                result
                    .as_ref()
                    .map(|m| format!("{m:?}"))
                    .or_else(|| error.clone()),
            )),
            _ => None,
        })
        .collect();
    (events, format!("{:?}", r.nodes[id]))
}

#[tokio::test]
async fn isolated_nodes_end_report_and_emit_what_an_actor_does() {
    let doc = isolated_graph();
    let inline = run(&doc, RunOptions::default()).await;
    // A supervised run builds an actor for every node (its invocations need attempts).
    let actors = run(
        &doc,
        RunOptions {
            supervisor: Some(Arc::new(FailClosed)),
            ..RunOptions::default()
        },
    )
    .await;
    for r in [&inline, &actors] {
        assert_eq!(r.status, RunStatus::Failed, "{:?}", r.error);
        assert!(
            r.error.as_deref().unwrap_or("").contains("boom on 3"),
            "{:?}",
            r.error
        );
        assert_eq!(ints(&r.outputs["out"]), vec![1]);
    }
    // (The failing node's error is the supervisor's to word.)
    for id in ["p", "c", "empty", "each", "src", "out"] {
        assert_eq!(node_story(&inline, id), node_story(&actors, id), "{id}");
    }
    // What the stories are, so that both paths changing alike cannot pass.
    let (p, _) = node_story(&inline, "p");
    assert_eq!(
        p,
        vec![
            (NodeStatus::Running, None),
            (
                NodeStatus::Completed,
                Some(format!(
                    "{:?}",
                    BTreeMap::from([("value".to_string(), Value::Int(7))])
                ))
            ),
        ]
    );
    assert_eq!(
        node_story(&inline, "c").0,
        vec![(NodeStatus::Running, None), (NodeStatus::Completed, None)]
    );
    assert_eq!(outcome(&inline, "each"), NodeOutcome::Done);
    assert_eq!(inline.nodes["each"].invocations, 1);
    for r in [&inline, &actors] {
        assert!(matches!(outcome(r, "bad"), NodeOutcome::Failed { .. }));
    }
}

#[tokio::test]
async fn a_cancelled_run_of_isolated_nodes_ends_cancelled() {
    let (reg, _) = registry();
    let plan = heddle_core::plan::plan(&isolated_graph(), &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    // Cancelled before the runner first runs: the run is cancelled whatever its nodes
    // managed, and every node has a report.
    h.cancel();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(r.nodes.len(), 7);
    let last = r.events.last().expect("events");
    assert!(matches!(
        last.kind,
        EventKind::Run {
            status: RunStatus::Cancelled,
            ..
        }
    ));
}

/// The runner publishes inline nodes' events in batches: across several batches and the
/// actors beside them, a subscriber still sees every event once, gapless and in order,
/// the same record the result keeps, each node's `running` before its `completed`.
#[tokio::test]
async fn many_isolated_nodes_publish_every_event_once_and_in_order() {
    let ids: Vec<String> = (0..150).map(|i| format!("w{i:03}")).collect();
    let mut nodes: Vec<(&str, &str, serde_json::Value)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), "heddle.passthrough", json!({ "value": i })))
        .collect();
    nodes.push(("src", "heddle.constant", json!({"value": 1})));
    nodes.push(("out", "heddle.output", json!({})));
    let doc = graph(&nodes, &[("src", "value", "out", "value")]);
    let (reg, _) = registry();
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let run = Run::new(plan, &reg, RunOptions::default()).unwrap();
    let mut sub = run.subscribe();
    let r = within(run.start().wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let mut seen = Vec::new();
    while let Some(e) = sub.try_next() {
        seen.push((*e).clone());
    }
    assert_eq!(seen, r.events);
    assert_eq!(r.events_dropped, 0);
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..seen.len() as u64).collect::<Vec<_>>());
    assert!(seen.windows(2).all(|w| w[0].at_us <= w[1].at_us));
    for (i, id) in ids.iter().enumerate() {
        let story = node_story(&r, id).0;
        let value = BTreeMap::from([("value".to_string(), Value::Int(i as i64))]);
        assert_eq!(
            story,
            vec![
                (NodeStatus::Running, None),
                (NodeStatus::Completed, Some(format!("{value:?}")))
            ],
            "{id}"
        );
        assert_eq!(r.nodes[id.as_str()].invocations, 1);
    }
    assert!(matches!(
        seen.last().map(|e| &e.kind),
        Some(EventKind::Run {
            status: RunStatus::Completed,
            ..
        })
    ));
}
