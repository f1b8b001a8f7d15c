//! The runtime's behaviour, one property per test: actor modes, correlation-aware
//! scheduling, end-of-stream, skips, failures, suspension, cancellation, limits, control.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use common::{graph, ilist, ints, registry, within};
use heddle_core::plan::{InputError, InputErrors};
use heddle_core::{
    EdgeStatus, EventKind, NodeOutcome, NodeStatus, RunResult, RunStatus, SkipReason, Value,
};
use heddle_kernel::runtime::{InboxLimits, KernelError, Run, RunOptions, run_graph};
use serde_json::json;

async fn run(doc: &heddle_core::GraphDoc, opts: RunOptions) -> RunResult {
    let (reg, _) = registry();
    within(run_graph(doc, &reg, opts)).await.unwrap()
}

fn outcome(r: &RunResult, id: &str) -> NodeOutcome {
    r.nodes
        .get(id)
        .unwrap_or_else(|| panic!("no node {id}"))
        .outcome
        .clone()
}

fn skipped(reason: SkipReason) -> NodeOutcome {
    NodeOutcome::Skipped { reason }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_chain_delivers_outputs_and_a_gapless_event_record() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x", "type": "int"})),
            ("p", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "result"})),
        ],
        &[
            ("in", "value", "p", "value"),
            ("p", "value", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), Value::Int(5));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["result"], vec![Value::Int(5)]);
    assert_eq!(r.nodes["p"].invocations, 1);
    for (i, e) in r.events.iter().enumerate() {
        assert_eq!(e.seq, i as u64);
    }
    assert!(matches!(
        r.events.first().unwrap().kind,
        EventKind::Run {
            status: RunStatus::Running,
            ..
        }
    ));
    assert!(matches!(
        r.events.last().unwrap().kind,
        EventKind::Run {
            status: RunStatus::Completed,
            ..
        }
    ));
    let completed_p = r.events.iter().find_map(|e| match &e.kind {
        EventKind::Node {
            node_id,
            status: NodeStatus::Completed,
            result,
            ..
        } if node_id == "p" => result.clone(),
        _ => None,
    });
    assert_eq!(completed_p.unwrap()["value"], Value::Int(5));
    assert!(r.events.iter().any(|e| matches!(&e.kind, EventKind::Output { name, value, .. } if name == "result" && *value == Value::Int(5))));
    assert!(r.events.iter().any(|e| matches!(
        &e.kind,
        EventKind::Edge {
            status: EdgeStatus::Completed,
            counter: 1,
            ..
        }
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_input_type_or_missing_input_is_refused_before_the_run() {
    let (reg, _) = registry();
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x", "type": "int"})),
            ("out", "heddle.output", json!({})),
        ],
        &[("in", "value", "out", "value")],
    );
    let e = run_graph(&doc, &reg, RunOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, KernelError::Inputs(InputErrors(v))
            if matches!(&v[..], [InputError::Missing { name, .. }] if name == "x")),
        "{e}"
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), Value::str("nope"));
    let e = run_graph(&doc, &reg, opts).await.unwrap_err();
    assert!(e.to_string().contains("input `x` (node in)"), "{e}");
    let bad = graph(&[("a", "no.such.type", json!({}))], &[]);
    let e = run_graph(&bad, &reg, RunOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, KernelError::Invalid(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_input_pushed_while_live_reaches_a_streaming_input_node() {
    let (reg, _) = registry();
    let doc = graph(
        &[
            (
                "in",
                "heddle.input",
                json!({"name": "nums", "streaming": true, "type": "int"}),
            ),
            ("sum", "test.running_sum", json!({})),
            ("sums", "heddle.output", json!({})),
            ("total", "heddle.output", json!({})),
        ],
        &[
            ("in", "value", "sum", "value"),
            ("sum", "sum", "sums", "value"),
            ("sum", "total", "total", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let run = Run::new(plan, &reg, RunOptions::default()).unwrap();
    let mut events = run.subscribe();
    let h = run.start();
    for v in [1, 2, 3] {
        h.push_input("nums", Value::Int(v)).await.unwrap();
        // The running sum for this value arrives while the input is still open.
        within(async {
            loop {
                let e = events.next().await.expect("run still live");
                if let EventKind::Output { name, value, .. } = &e.kind
                    && name == "sums"
                    && value.as_i64() == Some(v * (v + 1) / 2)
                {
                    break;
                }
            }
        })
        .await;
    }
    assert!(matches!(
        h.push_input("nope", Value::Int(1)).await,
        Err(KernelError::Input(InputError::Unknown { .. }))
    ));
    assert!(
        h.push_input("nums", Value::str("x")).await.is_err(),
        "type-checked"
    );
    h.finish_input("nums").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["sums"]), vec![1, 3, 6]);
    assert_eq!(ints(&r.outputs["total"]), vec![6]);
    assert_eq!(r.nodes["sum"].invocations, 1, "one stream session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_output_is_routed_while_the_invocation_runs() {
    let doc = graph(
        &[
            ("n", "heddle.constant", json!({"value": 3})),
            ("e", "test.emit", json!({})),
            ("p", "test.probe", json!({})),
            ("out", "heddle.output", json!({})),
            ("done", "heddle.output", json!({})),
        ],
        &[
            ("n", "value", "e", "n"),
            ("e", "value", "p", "value"),
            ("p", "value", "out", "value"),
            ("e", "done", "done", "value"),
        ],
    );
    // test.emit waits after each emit until test.probe has seen the value: this run only
    // finishes if emitted values travel downstream before the invocation returns.
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![0, 1, 2]);
    assert_eq!(r.outputs["done"], vec![Value::Bool(true)]);
    assert_eq!(r.nodes["e"].invocations, 1);
    assert_eq!(r.nodes["p"].invocations, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controlled_node_runs_per_control_event_with_latest_data_and_non_persisting_properties() {
    let doc = graph(
        &[
            ("x", "heddle.constant", json!({"value": 10})),
            (
                "ctl",
                "test.controller",
                json!({"events": [
                    {"factor": 2},
                    {"event_type": "run", "properties": {"factor": 3}},
                    {},
                    {"properties": {"factor": 5}},
                    7
                ]}),
            ),
            ("s", "test.scale", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("x", "value", "s", "x"),
            ("ctl", "__control__", "s", "__control__"),
            ("s", "out", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    // {} runs with the declared default factor: earlier event properties did not stick;
    // the non-object 7 is not a control event.
    assert_eq!(ints(&r.outputs["out"]), vec![20, 30, 10, 50]);
    assert_eq!(r.nodes["s"].invocations, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_control_answers_concurrent_callers_in_fifo_order() {
    let (reg, _) = registry();
    // A streaming input behind a control edge keeps a controller live until the end,
    // so the caller can drive the node alongside it.
    let doc = graph(
        &[
            ("ctl", "heddle.input", json!({"streaming": true})),
            ("p", "heddle.passthrough", json!({})),
            ("x", "heddle.constant", json!({"value": 10})),
            ("s", "test.scale", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("ctl", "value", "p", "value"),
            ("p", "value", "s", "__control__"),
            ("x", "value", "s", "x"),
            ("s", "out", "out", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    let call = |f: i64| {
        let mut p = BTreeMap::new();
        p.insert("factor".to_string(), Value::Int(f));
        h.send_control("s", p)
    };
    let (a, b, c) = within(async { tokio::join!(call(1), call(2), call(3)) }).await;
    let got: Vec<i64> = [a, b, c]
        .into_iter()
        .map(|r| r.unwrap().get("out").unwrap().as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![10, 20, 30]);
    assert!(matches!(
        h.send_control("x", BTreeMap::new()).await,
        Err(KernelError::NotControlled(_))
    ));
    assert!(matches!(
        h.send_control("nope", BTreeMap::new()).await,
        Err(KernelError::UnknownNode(id)) if id == "nope"
    ));
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![10, 20, 30]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_and_in_pairs_items_by_lineage_when_branches_finish_out_of_order() {
    // item → delay (early items slowest) → add.a ; index → add.b ; add → collect.
    let doc = graph(
        &[
            (
                "list",
                "heddle.constant",
                json!({"value": [0, 1, 2, 3, 4, 5, 6, 7]}),
            ),
            ("each", "heddle.foreach", json!({})),
            ("slow", "test.delay", json!({"n": 8, "step_ms": 3})),
            ("add", "test.add", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "slow", "value"),
            ("slow", "value", "add", "a"),
            ("each", "index", "add", "b"),
            ("add", "sum", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), 1);
    assert_eq!(ilist(&r.outputs["out"][0]), vec![0, 2, 4, 6, 8, 10, 12, 14]);
    assert_eq!(r.nodes["add"].invocations, 8);
    assert_eq!(r.nodes["gather"].invocations, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_iteration_mints_one_token_per_item_group() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [5, 6, 7]})),
            ("each", "test.stream_each", json!({})),
            ("add", "test.add", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "add", "a"),
            ("each", "index", "add", "b"),
            ("add", "sum", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ilist(&r.outputs["out"][0]), vec![5, 7, 9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_iteration_collects_per_parent_including_empty_lists() {
    let doc = graph(
        &[
            (
                "lists",
                "heddle.constant",
                json!({"value": [[1, 2], [3], [], [4, 5, 6]]}),
            ),
            ("outer", "heddle.foreach", json!({})),
            ("inner", "heddle.foreach", json!({})),
            ("p", "heddle.passthrough", json!({})),
            ("c_inner", "heddle.collect", json!({})),
            ("c_outer", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("lists", "value", "outer", "list"),
            ("outer", "item", "inner", "list"),
            ("inner", "item", "p", "value"),
            ("p", "value", "c_inner", "item"),
            ("c_inner", "list", "c_outer", "item"),
            ("c_outer", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let got: Vec<Vec<i64>> = r.outputs["out"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(ilist)
        .collect();
    assert_eq!(got, vec![vec![1, 2], vec![3], vec![], vec![4, 5, 6]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_over_an_empty_list_emits_an_empty_list() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": []})),
            ("each", "heddle.foreach", json!({})),
            ("p", "heddle.passthrough", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "p", "value"),
            ("p", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::list(vec![])]);
    assert_eq!(outcome(&r, "p"), skipped(SkipReason::NoInput));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_side_inputs_pair_with_every_item() {
    // Empty-scope side input (k) and prefix-scope side input (outer index) under a
    // nested iteration.
    let doc = graph(
        &[
            ("lists", "heddle.constant", json!({"value": [[1, 2], [3]]})),
            ("k", "heddle.constant", json!({"value": 10})),
            ("outer", "heddle.foreach", json!({})),
            ("inner", "heddle.foreach", json!({})),
            ("plus_k", "test.add", json!({})),
            ("plus_outer", "test.add", json!({})),
            ("c_inner", "heddle.collect", json!({})),
            ("c_outer", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("lists", "value", "outer", "list"),
            ("outer", "item", "inner", "list"),
            ("inner", "item", "plus_k", "a"),
            ("k", "value", "plus_k", "b"),
            ("plus_k", "sum", "plus_outer", "a"),
            ("outer", "index", "plus_outer", "b"),
            ("plus_outer", "sum", "c_inner", "item"),
            ("c_inner", "list", "c_outer", "item"),
            ("c_outer", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let got: Vec<Vec<i64>> = r.outputs["out"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(ilist)
        .collect();
    assert_eq!(got, vec![vec![11, 12], vec![14]]);
}

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
async fn exceeding_max_pending_keys_aborts_the_run() {
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
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "join", "a"),
            ("each", "index", "never", "value"),
            ("never", "value", "join", "b"),
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
    let err = r.error.unwrap();
    assert!(
        err.starts_with("Inbox for node \"join\" exceeded max_pending_keys (3) on handle \"a\"."),
        "{err}"
    );
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
