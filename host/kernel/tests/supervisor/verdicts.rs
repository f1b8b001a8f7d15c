//! Retry within bounds, substitute with a repaired output, and the bounds the kernel
//! enforces whatever a handle says.

use super::*;

#[tokio::test]
async fn unsupervised_failure_builds_no_escalation() {
    let (doc, opts) = chain("sup.flaky", json!({}), Value::Int(5));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.interventions.is_empty());
    assert!(!r.events.iter().any(|e| matches!(
        e.kind,
        EventKind::Escalation { .. } | EventKind::Decision { .. }
    )));
}

#[tokio::test]
async fn transient_failure_retried_on_a_retry_safe_node() {
    let (doc, mut opts) = chain("sup.flaky", json!({}), Value::Int(5));
    opts.supervisor = policy("[[rule]]\nsignature = \"http:5*\"\nverdict = \"retry\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::Int(5)]);
    assert_eq!(r.nodes["n"].invocations, 2);
    let i = interventions(&r);
    assert_eq!(i.len(), 1);
    assert_eq!(
        (&i[0].verdict, i[0].decided_by),
        (&Verdict::Retry, DecidedBy::Policy)
    );
    assert_eq!(
        i[0].escalation.failure_signature.as_deref(),
        Some("http:503")
    );
    assert_eq!(i[0].escalation.attempt, 1);
    let kinds: Vec<&str> = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Escalation { .. } => Some("escalation"),
            EventKind::Decision { decided_by, .. } => Some(decided_by.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["escalation", "policy"]);
}

#[tokio::test]
async fn the_supervisor_is_asked_only_after_the_nodes_own_retries_are_spent() {
    let (mut doc, mut opts) = chain("sup.flaky", json!({"fail_times": 3}), Value::Int(5));
    doc.nodes[1].retry = serde_json::from_value(json!({"attempts": 2, "backoff_ms": 0})).unwrap();
    opts.supervisor = policy("[[rule]]\nverdict = \"retry\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    // Two attempts of the node's own, then the supervisor's retry, then its second.
    assert_eq!(r.nodes["n"].invocations, 4);
    let i = interventions(&r);
    // One attempt count across both: the first escalation is attempt 2's failure.
    assert_eq!(
        i.iter().map(|x| x.escalation.attempt).collect::<Vec<_>>(),
        [2, 3]
    );
}

#[tokio::test]
async fn non_retry_safe_node_is_never_retried_whatever_the_handle_says() {
    let (doc, mut opts) = chain("sup.flaky_unsafe", json!({}), Value::Int(5));
    let h = Always::new(Verdict::Retry);
    opts.supervisor = Some(h.clone());
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.nodes["n"].invocations, 1);
    let i = interventions(&r);
    assert_eq!(i[0].decided_by, DecidedBy::Kernel);
    assert_eq!(i[0].overruled.as_ref().unwrap().requested, Verdict::Retry);
    assert!(
        !i[0]
            .escalation
            .allowed_actions
            .contains(heddle_core::supervise::VerdictAction::Retry)
    );
}

#[tokio::test]
async fn an_invocation_that_recorded_cost_is_not_retried() {
    let (doc, mut opts) = chain("sup.costly", json!({}), Value::Int(1));
    opts.supervisor = Some(Always::new(Verdict::Retry));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let i = interventions(&r);
    assert_eq!(i[0].escalation.spent_cost_usd, 0.02);
    assert_eq!(i[0].decided_by, DecidedBy::Kernel);
}

#[tokio::test]
async fn retries_stop_at_the_bound_with_fail_decided_by_bounds() {
    let (doc, mut opts) = chain("sup.flaky", json!({"fail_times": 10}), Value::Int(5));
    opts.supervisor = policy("[[rule]]\nverdict = \"retry\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    // One first attempt and two retries.
    assert_eq!(r.nodes["n"].invocations, 3);
    let i = interventions(&r);
    assert_eq!(i.len(), 3);
    assert_eq!(i[2].decided_by, DecidedBy::Bounds);
    assert_eq!(
        i.iter().map(|x| x.escalation.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(
        r.error
            .as_deref()
            .unwrap()
            .starts_with("supervisor retry limit"),
        "{:?}",
        r.error
    );
}

#[tokio::test]
async fn substitute_repairs_a_recoverable_json_parse() {
    let (doc, mut opts) = chain("sup.parse", json!({}), Value::from("{\"a\": 1,"));
    opts.supervisor = policy(
        "[[rule]]\nnode_type = \"sup.parse\"\nverdict = \"substitute\"\noutputs = { value = { a = 1 } }\n",
    );
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"][0].as_object().unwrap()["a"], Value::Int(1));
    let i = interventions(&r);
    assert_eq!(i.len(), 1);
    assert_eq!(
        i[0].escalation.candidate_output.as_ref().unwrap()["value"],
        Value::from("{\"a\": 1,")
    );
    assert_eq!(
        i[0].escalation.declared_outputs["value"].ty,
        PortType::Object
    );
}

#[tokio::test]
async fn invalid_substitute_is_bounced_then_fails() {
    let (doc, mut opts) = chain("sup.parse", json!({}), Value::from("{oops"));
    opts.supervisor =
        policy("[[rule]]\nverdict = \"substitute\"\noutputs = { value = \"still text\" }\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.outputs.get("out").is_none_or(Vec::is_empty));
    let i = interventions(&r);
    assert_eq!(i.len(), 4, "{i:#?}");
    assert!(i[..3].iter().all(|x| x.rejected.is_some()));
    assert_eq!(i[1].escalation.repair_round, 1);
    assert!(
        i[1].escalation
            .repair_error
            .as_ref()
            .unwrap()
            .contains("expected object")
    );
    assert_eq!(i[3].decided_by, DecidedBy::Kernel);
    assert!(
        r.error.as_deref().unwrap().contains("valid substitute"),
        "{:?}",
        r.error
    );
}
