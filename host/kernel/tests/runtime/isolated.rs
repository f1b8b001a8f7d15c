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
