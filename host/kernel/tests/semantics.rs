//! The kernel's fan-in, skip and empty-stream rules (host/kernel/README.md), one rule per
//! test, through the real runtime.

mod common;

use common::{graph, ilist, ints, registry, within};
use heddle_core::{EdgeStatus, EventKind, NodeOutcome, RunResult, RunStatus, SkipReason, Value};
use heddle_kernel::runtime::{Run, RunOptions, run_graph};
use serde_json::json;

async fn run(doc: &heddle_core::GraphDoc) -> RunResult {
    let (reg, _) = registry();
    within(run_graph(doc, &reg, RunOptions::default()))
        .await
        .unwrap()
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

fn floats(v: &Value) -> Vec<f64> {
    v.as_list()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

// ------------------------------------------------------------------ fan-in

/// Per item: `item / total`, where the total comes from another branch over the same
/// items (foreach → collect → sum), so it arrives only after the fan-out has closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_side_input_releases_the_waiting_items_into_one_aggregate() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 3, 4]})),
            ("each", "heddle.foreach", json!({})),
            ("all", "heddle.collect", json!({})),
            ("total", "test.sum", json!({})),
            ("share", "test.div", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "all", "item"),
            ("all", "list", "total", "list"),
            ("each", "item", "share", "a"),
            ("total", "sum", "share", "b"),
            ("share", "q", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), 1, "{:?}", r.outputs["out"]);
    assert_eq!(floats(&r.outputs["out"][0]), vec![0.125, 0.375, 0.5]);
    assert_eq!(r.nodes["gather"].invocations, 1);
}

/// The same with the side input from an unrelated fan-out's aggregate, and one that is
/// merely slow: either way one aggregate per parent scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_input_from_another_fan_out_or_a_slow_node_gives_one_aggregate() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 2, 3]})),
            ("each", "heddle.foreach", json!({})),
            ("other", "heddle.constant", json!({"value": [10, 20]})),
            ("each2", "heddle.foreach", json!({})),
            ("all2", "heddle.collect", json!({})),
            ("total", "test.sum", json!({})),
            ("plus", "test.add", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
            ("ten", "heddle.constant", json!({"value": 10})),
            ("slow", "test.delay", json!({"n": 60, "step_ms": 5})),
            ("plus_slow", "test.add", json!({})),
            ("gather_slow", "heddle.collect", json!({})),
            ("out_slow", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("other", "value", "each2", "list"),
            ("each2", "item", "all2", "item"),
            ("all2", "list", "total", "list"),
            ("each", "item", "plus", "a"),
            ("total", "sum", "plus", "b"),
            ("plus", "sum", "gather", "item"),
            ("gather", "list", "out", "value"),
            ("ten", "value", "slow", "value"),
            ("each", "item", "plus_slow", "a"),
            ("slow", "value", "plus_slow", "b"),
            ("plus_slow", "sum", "gather_slow", "item"),
            ("gather_slow", "list", "out_slow", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), 1, "{:?}", r.outputs["out"]);
    assert_eq!(ilist(&r.outputs["out"][0]), vec![31, 32, 33]);
    assert_eq!(
        r.outputs["out_slow"].len(),
        1,
        "{:?}",
        r.outputs["out_slow"]
    );
    assert_eq!(ilist(&r.outputs["out_slow"][0]), vec![11, 12, 13]);
    assert_eq!(r.nodes["gather"].invocations, 1);
    assert_eq!(r.nodes["gather_slow"].invocations, 1);
}

/// A failed run reports no partial aggregate: the scope whose items did not all settle
/// never closed, so the collect is skipped with the failure's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_item_leaves_no_partial_aggregate() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 2, 3]})),
            ("each", "heddle.foreach", json!({})),
            ("f", "test.fail", json!({"fail_on": 3})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "f", "value"),
            ("f", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.outputs["out"].is_empty(), "{:?}", r.outputs["out"]);
    assert_eq!(outcome(&r, "gather"), skipped(SkipReason::UpstreamFailed));
}

// ------------------------------------------------------------------ missing inputs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_input_whose_upstream_failed_skips_the_node_upstream_failed() {
    let doc = graph(
        &[
            ("one", "heddle.constant", json!({"value": 1})),
            ("f", "test.fail", json!({"fail_on": 1})),
            ("two", "heddle.constant", json!({"value": 2})),
            ("div", "test.div", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("one", "value", "f", "value"),
            ("f", "value", "div", "a"),
            ("two", "value", "div", "b"),
            ("div", "q", "out", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    let error = r.error.clone().unwrap();
    assert!(error.contains("node \"f\""), "{error}");
    assert!(
        !error.contains("div"),
        "only the real failure is named: {error}"
    );
    assert_eq!(outcome(&r, "div"), skipped(SkipReason::UpstreamFailed));
    assert_eq!(r.nodes["div"].invocations, 0);
}

/// A streaming input finished with no value: `a` closes empty while `b` has a value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_input_that_closed_empty_skips_the_node_no_input() {
    let doc = graph(
        &[
            ("s", "heddle.input", json!({"streaming": true})),
            ("two", "heddle.constant", json!({"value": 2})),
            ("div", "test.div", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("s", "value", "div", "a"),
            ("two", "value", "div", "b"),
            ("div", "q", "out", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(outcome(&r, "div"), skipped(SkipReason::NoInput));
    assert!(r.outputs["out"].is_empty());
}

// ------------------------------------------------------------------ empty streams

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_input_nodes_run_on_an_empty_stream_and_see_its_end() {
    let doc = graph(
        &[
            ("s", "heddle.input", json!({"streaming": true})),
            ("sum", "test.running_sum", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("total", "heddle.output", json!({})),
            ("list", "heddle.output", json!({})),
        ],
        &[
            ("s", "value", "sum", "value"),
            ("s", "value", "gather", "item"),
            ("sum", "total", "total", "value"),
            ("gather", "list", "list", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["total"]), vec![0]);
    assert_eq!(r.outputs["list"], vec![Value::list(vec![])]);
    assert_eq!(outcome(&r, "sum"), NodeOutcome::Done);
    assert_eq!(outcome(&r, "gather"), NodeOutcome::Done);
}

/// The empty-stream rule is for streams that ended; one whose feeder failed never was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_input_node_whose_feeder_failed_is_skipped() {
    let doc = graph(
        &[
            ("one", "heddle.constant", json!({"value": 1})),
            ("f", "test.fail", json!({"fail_on": 1})),
            ("sum", "test.running_sum", json!({})),
            ("total", "heddle.output", json!({})),
        ],
        &[
            ("one", "value", "f", "value"),
            ("f", "value", "sum", "value"),
            ("sum", "total", "total", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(outcome(&r, "sum"), skipped(SkipReason::UpstreamFailed));
    assert!(r.outputs["total"].is_empty());
}

// ------------------------------------------------------------------ skip reasons

/// `upstream_skipped` means every feeder was skipped; with one feeder skipped and the
/// other finished without a value, nothing arrived: `no_input`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_skipped_only_when_every_feeder_was_skipped() {
    let doc = graph(
        &[
            ("v", "heddle.constant", json!({"value": 1})),
            ("br", "test.branch", json!({"take": true})),
            ("untaken", "heddle.passthrough", json!({})),
            ("both_skipped", "test.add", json!({})),
            ("one_skipped", "test.add", json!({})),
        ],
        &[
            ("v", "value", "br", "value"),
            ("br", "no", "untaken", "value"),
            ("untaken", "value", "both_skipped", "a"),
            ("untaken", "value", "both_skipped", "b"),
            // `br` finishes having sent nothing on `no`; `untaken` is skipped.
            ("untaken", "value", "one_skipped", "a"),
            ("br", "no", "one_skipped", "b"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(outcome(&r, "untaken"), skipped(SkipReason::NoInput));
    assert_eq!(
        outcome(&r, "both_skipped"),
        skipped(SkipReason::UpstreamSkipped)
    );
    assert_eq!(outcome(&r, "one_skipped"), skipped(SkipReason::NoInput));
}

// ------------------------------------------------------------------ edges and control

/// An edge whose target stopped before taking everything on it ends `drained`; one
/// whose end was consumed ends `completed` and nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_left_unconsumed_by_a_failed_target_ends_drained() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [1, 2, 3]})),
            ("each", "heddle.foreach", json!({})),
            ("f", "test.fail", json!({"fail_on": 1})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "f", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    let last_status = |edge: &str| {
        r.events.iter().rev().find_map(|e| match &e.kind {
            EventKind::Edge {
                edge_id, status, ..
            } if edge_id == edge => Some(*status),
            _ => None,
        })
    };
    assert_eq!(last_status("each:item->f:value"), Some(EdgeStatus::Drained));
    assert_eq!(
        last_status("list:value->each:list"),
        Some(EdgeStatus::Completed)
    );
}

/// Starts `6 -> scale by 7 -> output`: `test.scale` is a controlled node, and no control
/// edge reaches it.
fn start_scale_run() -> heddle_kernel::runtime::RunHandle {
    let doc = graph(
        &[
            ("x", "heddle.constant", json!({"value": 6})),
            ("s", "test.scale", json!({"factor": 7})),
            ("out", "heddle.output", json!({})),
        ],
        &[("x", "value", "s", "x"), ("s", "out", "out", "value")],
    );
    let (reg, _) = registry();
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    Run::new(plan, &reg, RunOptions::default()).unwrap().start()
}

/// A subscriber that arrives after the run ended still sees the whole run: on a
/// current-thread runtime the first subscriber is woken by the final event only after
/// the runner closed the bus, so the second one subscribes to a closed bus every time.
#[tokio::test(flavor = "current_thread")]
async fn a_subscriber_after_the_end_gets_the_whole_record() {
    let handle = start_scale_run();
    let mut first = handle.subscribe();
    let mut early = Vec::new();
    while let Some(e) = within(first.next()).await {
        early.push(e.seq);
    }
    let mut late = handle.subscribe();
    let mut seen = Vec::new();
    while let Some(e) = within(late.next()).await {
        seen.push((e.seq, e.kind.clone()));
    }
    assert_eq!(seen.iter().map(|e| e.0).collect::<Vec<_>>(), early);
    assert!(
        matches!(
            seen.last().map(|e| &e.1),
            Some(EventKind::Run {
                status: RunStatus::Completed,
                ..
            })
        ),
        "{seen:?}"
    );
    let r = within(handle.wait()).await;
    assert_eq!(r.events.len(), seen.len());
}

/// With no control edge a controlled node never gets an event: it runs as a buffered
/// node, once per set of inputs, and the run ends without the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controlled_node_without_a_controller_runs_as_a_buffered_node() {
    let handle = start_scale_run();
    // The run completes on its own: the caller waits for its end before `wait()`.
    let mut events = handle.subscribe();
    within(async {
        while let Some(e) = events.next().await {
            if matches!(
                e.kind,
                EventKind::Run {
                    status: RunStatus::Completed,
                    ..
                }
            ) {
                return;
            }
        }
        panic!("the run ended without completing");
    })
    .await;
    let r = within(handle.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![42]);
}
