//! Declared input types are enforced before a node's code sees a value: a value from an
//! untyped input (or any `any` output) that does not fit a typed input fails the
//! invocation without running it (signature `input:type`), naming the input, the type
//! it declares and what arrived; an int reaching a float input is widened.

use std::sync::Arc;

use heddle_core::supervise::{Intervention, VerdictAction};
use heddle_kernel::supervisor::{Policy, Supervisor};

use super::*;

/// untyped input `x` → `test.half` (`n: int`) → output `out`.
fn halves() -> heddle_core::GraphDoc {
    graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("half", "test.half", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "half", "n"),
            ("half", "half", "out", "value"),
        ],
    )
}

async fn run_with(doc: &heddle_core::GraphDoc, opts: RunOptions) -> (RunResult, usize) {
    let (reg, probe) = registry();
    let r = within(run_graph(doc, &reg, opts)).await.unwrap();
    (r, probe.half_calls.load(Ordering::SeqCst))
}

fn given(x: Value) -> RunOptions {
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), x);
    opts
}

#[tokio::test]
async fn a_value_that_does_not_fit_a_typed_input_fails_before_the_node_runs() {
    for (x, got) in [
        (Value::from("7"), "str"),
        (Value::Bool(true), "bool"),
        (Value::Float(7.5), "float"),
    ] {
        let (r, calls) = run_with(&halves(), given(x.clone())).await;
        assert_eq!(r.status, RunStatus::Failed, "{x:?} was computed on");
        assert_eq!(calls, 0, "{x:?}: the node's code ran");
        let NodeOutcome::Failed { error } = outcome(&r, "half") else {
            panic!("{:?}", outcome(&r, "half"))
        };
        assert!(
            error.contains("input `n` is declared `int`")
                && error.contains(&format!("got {got}"))
                && error.ends_with("(signature input:type)"),
            "{error}"
        );
        assert!(r.outputs.get("out").is_none_or(Vec::is_empty));
    }
    let (r, calls) = run_with(&halves(), given(Value::Int(7))).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(calls, 1);
    assert_eq!(r.outputs["out"], vec![Value::Float(3.5)]);
}

#[tokio::test]
async fn an_int_reaching_a_float_input_is_widened_and_a_list_is_checked_item_by_item() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("div", "test.div", json!({"b": 2.0})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[("in", "value", "div", "a"), ("div", "q", "out", "value")],
    );
    let (r, _) = run_with(&doc, given(Value::Int(7))).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::Float(3.5)]);

    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("sum", "test.sum", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "sum", "list"),
            ("sum", "sum", "out", "value"),
        ],
    );
    let (r, _) = run_with(&doc, given(Value::from_json(json!([1, "2", 3])))).await;
    let NodeOutcome::Failed { error } = outcome(&r, "sum") else {
        panic!("{:?}", outcome(&r, "sum"))
    };
    assert!(
        error.contains("input `list` is declared `list[int]`") && error.contains("item 1"),
        "{error}"
    );
}

#[tokio::test]
async fn a_misfit_is_escalated_without_retry_and_a_skip_drops_only_that_item() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("each", "heddle.foreach", json!({})),
            ("half", "test.half", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "half", "n"),
            ("half", "half", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let mut opts = given(Value::from_json(json!([2, "x", 4])));
    let p: Arc<dyn Supervisor> = Arc::new(
        Policy::parse(
            "[[rule]]\nsignature = \"input:type\"\nverdict = \"skip\"\n",
            "p.toml",
        )
        .unwrap(),
    );
    opts.supervisor = Some(p);
    let (r, calls) = run_with(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(calls, 2);
    assert_eq!(r.outputs["out"], vec![Value::from_json(json!([1.0, 2.0]))]);
    let i: Vec<Intervention> = r
        .interventions
        .iter()
        .map(|v| Intervention::from_json(v).unwrap())
        .collect();
    assert_eq!(i.len(), 1);
    let e = &i[0].escalation;
    assert_eq!(e.failure_signature.as_deref(), Some("input:type"));
    // Retry-safe, but the same value would fail the same check.
    assert_eq!(
        e.allowed_actions.to_vec(),
        [VerdictAction::Skip, VerdictAction::Fail]
    );
}
