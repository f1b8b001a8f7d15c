//! Skips inside fan-outs (one decision for identical failures), fail reasons, and no
//! secret in any escalation, event or report.

use super::*;

/// input list → foreach → fail_on(bad) → collect → output.
fn fan(list: Vec<i64>, bad: i64) -> (GraphDoc, RunOptions) {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("check", "sup.fail_on", json!({"bad": bad})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "check", "value"),
            ("check", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(list.into_iter().map(Value::Int).collect()),
    );
    (doc, opts)
}

#[tokio::test]
async fn skip_of_one_fanout_item_lets_collect_finish_with_the_others() {
    let (doc, mut opts) = fan(vec![1, 2, 3, 4], 3);
    opts.supervisor = policy("[[rule]]\nverdict = \"skip\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![Value::list(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(4)
        ])]
    );
    let i = interventions(&r);
    assert_eq!(i.len(), 1);
    assert_eq!(i[0].escalation.lineage.len(), 1);
    assert_eq!(i[0].escalation.lineage[0].index, 2);
    assert_eq!(r.nodes["check"].outcome, NodeOutcome::Done);
}

#[tokio::test]
async fn seven_identical_failures_with_a_sticky_skip_make_one_decision() {
    let (doc, mut opts) = fan(vec![3, 1, 3, 3, 2, 3, 3, 3, 3], 3);
    let h = Always::new(Verdict::Skip {
        apply_to: ApplyTo::Signature,
    });
    opts.supervisor = Some(h.clone());
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![Value::list(vec![Value::Int(1), Value::Int(2)])]
    );
    assert_eq!(h.asked.load(Ordering::SeqCst), 1);
    let i = interventions(&r);
    assert_eq!(i.len(), 7);
    assert_eq!(
        i.iter()
            .filter(|x| x.decided_by == DecidedBy::Sticky)
            .count(),
        6
    );
}

#[tokio::test]
async fn a_node_whose_only_invocation_is_skipped_ends_skipped_by_the_supervisor() {
    let (doc, mut opts) = chain("sup.fail_on", json!({"bad": 7}), Value::Int(7));
    opts.supervisor = policy("[[rule]]\nverdict = \"skip\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.nodes["n"].outcome,
        NodeOutcome::Skipped {
            reason: SkipReason::Supervisor
        }
    );
    assert!(matches!(
        r.nodes["out"].outcome,
        NodeOutcome::Skipped { .. }
    ));
    assert_eq!(interventions(&r).len(), 1);
}

#[tokio::test]
async fn fail_reason_becomes_the_run_error_and_the_original_stays_in_the_record() {
    let (doc, mut opts) = chain("sup.fail_on", json!({"bad": 7}), Value::Int(7));
    opts.supervisor = policy(
        "[[rule]]\nsignature = \"http:401\"\nverdict = \"fail\"\nreason = \"The API key was revoked; renew it.\"\n",
    );
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let err = r.error.clone().unwrap();
    assert!(
        err.starts_with("The API key was revoked; renew it."),
        "{err}"
    );
    let i = interventions(&r);
    assert_eq!(i[0].escalation.detail, "item 7 rejected");
}

#[tokio::test]
async fn no_secret_value_appears_in_any_escalation_event_or_report() {
    let (doc, mut opts) = chain(
        "sup.leak",
        json!({}),
        Value::from(format!("token={SECRET}")),
    );
    let h = Always::new(Verdict::fail(format!("leaking {SECRET} in a reason")));
    opts.supervisor = Some(h);
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(!r.interventions.is_empty());
    let report = serde_json::to_string(&r).unwrap();
    assert!(!report.contains("SECRET-4242"), "{report}");
    assert!(report.contains("«redacted»"));
}
