//! What a graph declares beyond wiring, enforced by the real runtime: edge conditions and
//! the gating rule (diamond joins, vetoes, skip reasons), field narrowing, declared
//! output fields and check nodes.

mod common;

use common::{registry, within};
use heddle_core::contract::{FieldDecl, OutputContract};
use heddle_core::{GraphBuilder, GraphDoc, NodeOutcome, RunResult, RunStatus, SkipReason, Value};
use heddle_kernel::runtime::{RunOptions, run_graph};
use serde_json::json;

async fn run(doc: &GraphDoc) -> RunResult {
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

fn val(j: serde_json::Value) -> Value {
    Value::from_json(j)
}

fn field(key: &str, ty: &str) -> FieldDecl {
    FieldDecl {
        key: key.into(),
        ty: ty.into(),
        description: None,
        required: true,
    }
}

/// The seed's diamond, per item of a fan-out: each item takes one branch, and the join
/// below both branches runs off whichever branch ran (the other reaches it as a drop,
/// not a veto).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_below_two_condition_branches_runs_off_whichever_ran() {
    let doc = GraphBuilder::new()
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
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![val(json!([5, -3, 7, 0]))]);
    assert_eq!(r.nodes["pos"].invocations, 2);
    assert_eq!(r.nodes["neg"].invocations, 2);
    assert_eq!(r.nodes["join"].invocations, 4);
}

/// A branch no value takes is skipped for `condition`; what hangs below it only on that
/// branch is skipped for `upstream_skipped`; the run still completes and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untaken_branch_is_skipped_with_its_reason() {
    let doc = GraphBuilder::new()
        .node_with("n", "heddle.constant", json!({"value": 1}))
        .node("big", "heddle.passthrough")
        .node("after", "heddle.passthrough")
        .node("small", "heddle.passthrough")
        .node("out", "heddle.output")
        .edge("n", "value", "big", "value")
        .when("value > 5")
        .edge("big", "value", "after", "value")
        .edge("n", "value", "small", "value")
        .when("value <= 5")
        .edge("small", "value", "out", "value")
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(outcome(&r, "big"), skipped(SkipReason::Condition));
    assert_eq!(outcome(&r, "after"), skipped(SkipReason::UpstreamSkipped));
    assert_eq!(outcome(&r, "small"), NodeOutcome::Done);
    assert_eq!(r.outputs["out"], vec![Value::Int(1)]);
}

/// An edge ruled out by its own condition vetoes its target for that item even though
/// its other input delivered and the vetoed input has a default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ruled_out_edge_vetoes_its_target_even_when_other_inputs_deliver() {
    let doc = GraphBuilder::new()
        .node_with("a", "heddle.constant", json!({"value": 1}))
        .node_with("b", "heddle.constant", json!({"value": 2}))
        .node("sum", "test.add")
        .node("out", "heddle.output")
        .edge("a", "value", "sum", "a")
        .edge("b", "value", "sum", "b")
        .when("value > 5")
        .edge("sum", "sum", "out", "value")
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(outcome(&r, "sum"), skipped(SkipReason::Condition));
    assert!(r.outputs.get("out").is_none_or(Vec::is_empty));

    // The same per item: only the items whose edge holds reach the node.
    let doc = GraphBuilder::new()
        .node_with("list", "heddle.constant", json!({"value": [1, 20, 3, 40]}))
        .node("each", "heddle.foreach")
        .node("sum", "test.add")
        .node("gather", "heddle.collect")
        .node("out", "heddle.output")
        .edge("list", "value", "each", "list")
        .edge("each", "item", "sum", "a")
        .edge("each", "item", "sum", "b")
        .when("value > 10")
        .edge("sum", "sum", "gather", "item")
        .edge("gather", "list", "out", "value")
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![val(json!([40, 80]))]);
}

/// A condition that cannot be evaluated fails its target with the expression and the
/// error; it is never a quiet false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_throws_fails_the_target_naming_the_expression() {
    let doc = GraphBuilder::new()
        .node_with("n", "heddle.constant", json!({"value": {"x": 1}}))
        .node("t", "heddle.passthrough")
        .node("out", "heddle.output")
        .edge_id("gate", "n", "value", "t", "value")
        .when("value.x + 1")
        .edge("t", "value", "out", "value")
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    let NodeOutcome::Failed { error } = outcome(&r, "t") else {
        panic!("{:?}", outcome(&r, "t"))
    };
    assert!(error.contains("edge gate"), "{error}");
    assert!(error.contains("`value.x + 1`"), "{error}");
    assert!(error.contains("must yield true or false"), "{error}");
}

/// `fields` carries only the named keys of an object, unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_carries_only_the_fields_it_names() {
    let doc = GraphBuilder::new()
        .node_with(
            "n",
            "heddle.constant",
            json!({"value": {"a": 1, "b": [2], "secret": "x"}}),
        )
        .node("out", "heddle.output")
        .edge("n", "value", "out", "value")
        .fields(&["a", "b", "absent"])
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![val(json!({"a": 1, "b": [2]}))]);
}

/// A node that declares fields must produce an object carrying them; conditions read
/// them as `fields.<key>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_fields_are_enforced_and_readable_by_conditions() {
    let contract = OutputContract {
        handle: None,
        fields: vec![field("score", "number"), field("label", "string")],
    };
    let doc = GraphBuilder::new()
        .node_with(
            "judge",
            "heddle.constant",
            json!({"value": {"score": 0.9, "label": "good"}}),
        )
        .output(contract.clone())
        .node("out", "heddle.output")
        .edge("judge", "value", "out", "value")
        .when("fields.score > 0.5")
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), 1);

    let doc = GraphBuilder::new()
        .node_with(
            "judge",
            "heddle.constant",
            json!({"value": {"score": "high"}}),
        )
        .output(contract)
        .node("out", "heddle.output")
        .edge("judge", "value", "out", "value")
        .build();
    let r = run(&doc).await;
    assert_eq!(r.status, RunStatus::Failed);
    let NodeOutcome::Failed { error } = outcome(&r, "judge") else {
        panic!("{:?}", outcome(&r, "judge"))
    };
    assert_eq!(
        error,
        "node \"judge\" (type heddle.constant) failed: output contract on `value` {score: number, label: string} broken: field `score` must be number, got str (signature output:contract)"
    );
    assert_eq!(outcome(&r, "out"), skipped(SkipReason::UpstreamFailed));
}

/// A check releases downstream when its assertion holds and fails the run with its
/// message when it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_passes_or_fails_the_run_with_its_message() {
    let doc = |ready: bool| {
        GraphBuilder::new()
            .node_with("verify", "heddle.constant", json!({"value": {"ready": ready}}))
            .node_with(
                "gate",
                "heddle.check",
                json!({"assert": "upstream.verify.fields.ready = true", "message": "verify is not ready"}),
            )
            .node("out", "heddle.output")
            .edge("verify", "value", "gate", "verify")
            .edge("gate", "output", "out", "value")
            .build()
    };
    let r = run(&doc(true)).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![val(json!({"verify": {"ready": true}}))]
    );

    let r = run(&doc(false)).await;
    assert_eq!(r.status, RunStatus::Failed);
    let NodeOutcome::Failed { error } = outcome(&r, "gate") else {
        panic!("{:?}", outcome(&r, "gate"))
    };
    assert!(error.contains("verify is not ready"), "{error}");
    assert_eq!(outcome(&r, "out"), skipped(SkipReason::UpstreamFailed));
}

// ------------------------------------------------------------------ refused at planning

/// The issues planning reports for `doc`, as `(kind, node, edge, message)`.
fn issues(doc: &GraphDoc) -> Vec<(IssueKind, Option<String>, Option<String>, String)> {
    let (reg, _) = registry();
    match plan(doc, &reg) {
        Ok(_) => Vec::new(),
        Err(e) => e
            .issues
            .into_iter()
            .map(|i| (i.kind, i.node, i.edge, i.message))
            .collect(),
    }
}

use heddle_core::plan::{IssueKind, plan};

#[test]
fn bad_conditions_are_refused_before_anything_runs_naming_the_edge() {
    for (when, says) in [
        ("value >", "invalid JSONata expression `value >`"),
        (
            "$now() > 1",
            "uses the function $now(), which this build does not support",
        ),
        ("$lenght(value) > 1", "uses the unknown function $lenght()"),
    ] {
        let doc = GraphBuilder::new()
            .node_with("n", "heddle.constant", json!({"value": 1}))
            .node("t", "heddle.passthrough")
            .edge_id("e1", "n", "value", "t", "value")
            .when(when)
            .build();
        let got = issues(&doc);
        assert_eq!(got.len(), 1, "{got:?}");
        let (kind, node, edge, message) = &got[0];
        assert_eq!(*kind, IssueKind::InvalidEdgeRule);
        assert_eq!((node.as_deref(), edge.as_deref()), (Some("t"), Some("e1")));
        assert!(message.contains(says), "{message}");
    }
}

#[test]
fn fields_need_an_object_output_and_declared_keys() {
    // `foreach`'s `index` output is an int: no fields to select.
    let doc = GraphBuilder::new()
        .node_with("list", "heddle.constant", json!({"value": [1]}))
        .node("each", "heddle.foreach")
        .node("t", "heddle.passthrough")
        .edge("list", "value", "each", "list")
        .edge_id("e1", "each", "index", "t", "value")
        .fields(&["a"])
        .build();
    let got = issues(&doc);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0]
            .3
            .contains("output `index` of node each is of type int"),
        "{got:?}"
    );

    // A source that declares its fields: only those may be selected.
    let doc = GraphBuilder::new()
        .node_with("n", "heddle.constant", json!({"value": {"a": 1}}))
        .output(OutputContract {
            handle: None,
            fields: vec![field("a", "number")],
        })
        .node("t", "heddle.passthrough")
        .edge_id("e1", "n", "value", "t", "value")
        .fields(&["a", "b"])
        .build();
    let got = issues(&doc);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].3.contains("names b which node n does not declare"),
        "{got:?}"
    );
}

#[test]
fn output_fields_need_an_object_output_the_node_has() {
    let doc = GraphBuilder::new()
        .node_with("list", "heddle.constant", json!({"value": [1]}))
        .node("each", "heddle.foreach")
        .output(OutputContract {
            handle: None,
            fields: vec![field("a", "number")],
        })
        .edge("list", "value", "each", "list")
        .build();
    let got = issues(&doc);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, IssueKind::InvalidOutputContract);
    assert!(
        got[0]
            .3
            .contains("say which one carries the declared fields"),
        "{got:?}"
    );

    let doc = GraphBuilder::new()
        .node_with("list", "heddle.constant", json!({"value": [1]}))
        .node("each", "heddle.foreach")
        .output(OutputContract {
            handle: Some("index".into()),
            fields: vec![field("a", "number")],
        })
        .edge("list", "value", "each", "list")
        .build();
    let got = issues(&doc);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0]
            .3
            .contains("output `index` is of type int, not an object"),
        "{got:?}"
    );
}

/// Two edges into one plain input are a join of condition branches only when both come
/// from below a condition and neither carries one itself.
#[test]
fn only_condition_branches_may_join_into_one_input() {
    let join = |first_when: Option<&str>, join_when: Option<&str>| {
        let mut b = GraphBuilder::new()
            .node_with("n", "heddle.constant", json!({"value": 1}))
            .node("x", "heddle.passthrough")
            .node("y", "heddle.passthrough")
            .node("j", "heddle.passthrough")
            .edge("n", "value", "x", "value");
        if let Some(w) = first_when {
            b = b.when(w);
        }
        b = b
            .edge("n", "value", "y", "value")
            .when("value <= 0")
            .edge("x", "value", "j", "value");
        if let Some(w) = join_when {
            b = b.when(w);
        }
        b.edge("y", "value", "j", "value").build()
    };
    assert_eq!(issues(&join(Some("value > 0"), None)), Vec::new());
    let got = issues(&join(None, None));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, IssueKind::MultipleEdgesIntoInput);
    let got = issues(&join(Some("value > 0"), Some("value > 3")));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, IssueKind::MultipleEdgesIntoInput);
}

#[test]
fn a_check_names_its_inputs_after_their_source_and_parses_its_assertion() {
    let doc = GraphBuilder::new()
        .node_with("verify", "heddle.constant", json!({"value": 1}))
        .node_with(
            "c",
            "heddle.check",
            json!({"assert": "upstream.verify.output >"}),
        )
        .edge_id("e1", "verify", "value", "c", "input")
        .build();
    let got = issues(&doc);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.iter()
            .any(|i| i.2.as_deref() == Some("e1") && i.3.contains("\"targetHandle\": \"verify\"")),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|i| i.1.as_deref() == Some("c") && i.3.contains("invalid JSONata expression")),
        "{got:?}"
    );
}

/// On a stream (every value at the same root lineage) a condition rules out single
/// messages, not the stream: a ruled-out message still drives its firing (against the
/// sticky other input) and only that firing is vetoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_stream_a_condition_rules_out_messages_not_the_stream() {
    let (reg, _) = registry();
    let doc = GraphBuilder::new()
        .node_with(
            "in",
            "heddle.input",
            json!({"name": "nums", "streaming": true, "type": "int"}),
        )
        .node_with("hundred", "heddle.constant", json!({"value": 100}))
        .node("sum", "test.add")
        .node("big", "heddle.passthrough")
        .node("sums", "heddle.output")
        .node("bigs", "heddle.output")
        .edge("in", "value", "sum", "a")
        .when("value > 2")
        .edge("hundred", "value", "sum", "b")
        .edge("in", "value", "big", "value")
        .when("value > 3")
        .edge("sum", "sum", "sums", "value")
        .edge("big", "value", "bigs", "value")
        .build();
    let plan = plan(&doc, &reg).unwrap();
    let h = heddle_kernel::runtime::Run::new(plan, &reg, RunOptions::default())
        .unwrap()
        .start();
    for v in [1, 3, 2, 4, 5] {
        h.push_input("nums", Value::Int(v)).await.unwrap();
    }
    h.finish_input("nums").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(common::ints(&r.outputs["sums"]), vec![103, 104, 105]);
    assert_eq!(common::ints(&r.outputs["bigs"]), vec![4, 5]);
}
