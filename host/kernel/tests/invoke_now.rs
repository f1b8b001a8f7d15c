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
