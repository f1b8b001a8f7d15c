//! The built-ins' synchronous path (`Executor::invoke_now`): it reads inputs where they
//! are, with the same precedence as the input map (an edge value over a property), and
//! an executor that declines (a failure) falls back to `invoke`, which reports it.

mod common;

use common::{graph, registry, within};
use heddle_core::{NodeOutcome, RunResult, RunStatus, Value};
use heddle_kernel::executor::{Executor, InputView, Inputs};
use heddle_kernel::runtime::{RunOptions, run_graph};
use serde_json::json;
use smallvec::smallvec;

async fn run(doc: &heddle_core::GraphDoc) -> RunResult {
    let (reg, _) = registry();
    within(run_graph(doc, &reg, RunOptions::default()))
        .await
        .unwrap()
}

#[test]
fn an_edge_value_wins_over_a_property_and_a_declined_view_gives_its_values_back() {
    let props: Inputs = [
        ("value".to_string(), Value::Int(1)),
        ("other".to_string(), Value::Int(2)),
    ]
    .into();
    let mut view = InputView::new(smallvec![("value", Value::Int(10))], &props);
    assert_eq!(view.get("value"), Some(&Value::Int(10)));
    assert_eq!(view.get("other"), Some(&Value::Int(2)));
    assert_eq!(view.get("none"), None);
    assert_eq!(
        view.take("other"),
        Some(Value::Int(2)),
        "a property is cloned"
    );
    assert_eq!(view.take("value"), Some(Value::Int(10)));
    assert_eq!(
        view.take("value"),
        Some(Value::Int(1)),
        "then the property shows"
    );

    let view = InputView::new(
        smallvec![("a", Value::Int(1)), ("b", Value::Int(2))],
        &props,
    );
    assert_eq!(
        view.into_edges().collect::<Vec<_>>(),
        vec![("a", Value::Int(1)), ("b", Value::Int(2))]
    );
}

#[test]
fn the_pass_through_answers_at_once_and_an_executor_without_the_path_declines() {
    let (reg, _) = registry();
    let decl = reg
        .declarations()
        .into_iter()
        .find(|d| d.type_name == "heddle.passthrough")
        .expect("built-in");
    let props = Inputs::new();
    let spec = heddle_kernel::NodeSpec {
        id: "p",
        decl: &decl,
        properties: &props,
        limits: None,
    };
    let exec = reg.create(&spec).expect("created");
    let mut view = InputView::new(smallvec![("value", Value::Int(7))], &props);
    let out = exec.invoke_now(&mut view).expect("answered at once");
    assert_eq!(out.get("value"), Some(&Value::Int(7)));

    /// The trait's default: no synchronous path.
    struct Plain;
    impl Executor for Plain {
        fn invoke(
            &self,
            _call: heddle_kernel::Call,
        ) -> heddle_kernel::BoxFuture<'_, Result<heddle_kernel::Outputs, heddle_kernel::NodeError>>
        {
            Box::pin(async { Ok(heddle_kernel::Outputs::new()) })
        }
    }
    let mut view = InputView::new(smallvec![("value", Value::Int(7))], &props);
    assert!(Plain.invoke_now(&mut view).is_none());
    assert_eq!(
        view.into_edges().collect::<Vec<_>>(),
        vec![("value", Value::Int(7))]
    );

    // Into the last outputs: the pass-through keeps their handle (no new reference to
    // it per hop) and replaces the value; a declining executor leaves them untouched.
    let mut out = heddle_kernel::Outputs::new();
    let mut view = InputView::new(smallvec![("value", Value::Int(1))], &props);
    assert!(exec.invoke_now_into(&mut view, &mut out));
    let handle = out.0[0].0.clone();
    let mut view = InputView::new(smallvec![("value", Value::Int(2))], &props);
    assert!(exec.invoke_now_into(&mut view, &mut out));
    assert_eq!(out.0.len(), 1);
    assert!(std::sync::Arc::ptr_eq(&out.0[0].0, &handle), "handle kept");
    assert_eq!(out.get("value"), Some(&Value::Int(2)));
    let mut view = InputView::new(smallvec![("value", Value::Int(3))], &props);
    assert!(!Plain.invoke_now_into(&mut view, &mut out));
    assert_eq!(
        out.get("value"),
        Some(&Value::Int(2)),
        "declined: untouched"
    );
    assert_eq!(view.into_edges().count(), 1, "declined: nothing taken");
}

#[tokio::test]
async fn a_foreach_given_no_list_declines_and_fails_with_the_invoke_error() {
    let doc = graph(
        &[
            ("v", "heddle.constant", json!({"value": "not a list"})),
            ("each", "heddle.foreach", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("v", "value", "each", "list"),
            ("each", "item", "out", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    match &r.nodes["each"].outcome {
        NodeOutcome::Failed { error } => {
            assert!(
                error.contains("input `list` must be a list, got"),
                "{error}"
            )
        }
        other => panic!("each: {other:?}"),
    }
}

#[tokio::test]
async fn a_pass_through_forwards_its_edge_value_over_its_property() {
    let doc = graph(
        &[
            ("v", "heddle.constant", json!({"value": 5})),
            ("p", "heddle.passthrough", json!({"value": 9})),
            ("alone", "heddle.passthrough", json!({"value": 3})),
            ("out", "heddle.output", json!({"name": "out"})),
            ("out2", "heddle.output", json!({"name": "alone"})),
        ],
        &[
            ("v", "value", "p", "value"),
            ("p", "value", "out", "value"),
            ("alone", "value", "out2", "value"),
        ],
    );
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::Int(5)]);
    assert_eq!(r.outputs["alone"], vec![Value::Int(3)]);
    assert_eq!(r.nodes["p"].invocations, 1);
}

/// Inboxes of one message: nearly every hop finds its target's inbox full and queues
/// what it routes; every value still arrives, once, in order, on both branches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_inboxes_delay_values_but_lose_and_reorder_none() {
    let (reg, _) = registry();
    let doc = graph(
        &[
            (
                "in",
                "heddle.input",
                json!({"name": "in", "streaming": true, "type": "int"}),
            ),
            ("p1", "heddle.passthrough", json!({})),
            ("p2", "heddle.passthrough", json!({})),
            ("p3", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
            ("out2", "heddle.output", json!({"name": "out2"})),
        ],
        &[
            ("in", "value", "p1", "value"),
            ("p1", "value", "p2", "value"),
            ("p1", "value", "p3", "value"),
            ("p2", "value", "out", "value"),
            ("p3", "value", "out2", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let opts = RunOptions {
        inbox: heddle_kernel::InboxLimits {
            buffer: 1,
            ..Default::default()
        },
        ..RunOptions::default()
    };
    let h = heddle_kernel::Run::new(plan, &reg, opts).unwrap().start();
    let n = 300;
    for v in 0..n {
        h.push_input("in", Value::Int(v)).await.unwrap();
    }
    h.finish_input("in").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let expect: Vec<Value> = (0..n).map(Value::Int).collect();
    assert_eq!(r.outputs["out"], expect);
    assert_eq!(r.outputs["out2"], expect);
    for p in ["p1", "p2", "p3"] {
        assert_eq!(r.nodes[p].invocations, n as u64, "{p}");
    }
}

#[test]
fn outputs_as_a_map_keep_each_handles_last_value() {
    let mut out = heddle_kernel::Outputs::new();
    for i in 0..5 {
        out.push("item", Value::Int(i));
        out.push("index", Value::Int(10 + i));
    }
    out.push("other", Value::Null);
    let map = out.to_map();
    assert_eq!(map.len(), 3);
    assert_eq!(map["item"], Value::Int(4));
    assert_eq!(map["index"], Value::Int(14));
    assert_eq!(map["other"], Value::Null);
}

/// Every node that forwards `value` (input, constant, pass-through) shares one executor:
/// it holds nothing of a node's own, and a large graph of them would otherwise allocate
/// one (and its handle's name) per node. Shared, it still forwards each node's own
/// values, on a runtime with several workers too.
#[test]
fn forwarding_nodes_share_one_executor_and_still_forward_their_own_values() {
    use heddle_core::DeclLookup;
    let reg = heddle_kernel::registry::Registry::with_builtins();
    let decl = reg.decl("heddle.passthrough").expect("a built-in");
    let props = std::collections::BTreeMap::new();
    let create = |id: &str| {
        reg.create(&heddle_core::NodeSpec {
            id,
            decl: &decl,
            properties: &props,
            limits: None,
        })
        .expect("a pass-through is created")
    };
    assert!(std::sync::Arc::ptr_eq(&create("a"), &create("b")));

    let doc = graph(
        &[
            ("k1", "heddle.constant", json!({"value": 1})),
            ("k2", "heddle.constant", json!({"value": 2})),
            ("p1", "heddle.passthrough", json!({})),
            ("p2", "heddle.passthrough", json!({})),
            ("o1", "heddle.output", json!({"name": "one"})),
            ("o2", "heddle.output", json!({"name": "two"})),
        ],
        &[
            ("k1", "value", "p1", "value"),
            ("k2", "value", "p2", "value"),
            ("p1", "value", "o1", "value"),
            ("p2", "value", "o2", "value"),
        ],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let r = rt.block_on(run(&doc));
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["one"], vec![Value::Int(1)]);
    assert_eq!(r.outputs["two"], vec![Value::Int(2)]);
}
