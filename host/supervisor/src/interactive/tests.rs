//! The desk and the handle through the kernel's bounded wrapper, as a run uses them.

use std::collections::BTreeMap;

use heddle_core::NodeMode;
use heddle_core::supervise::{AllowedSet, RawEscalation, RedactLimits, Redactor};
use tokio_util::sync::CancellationToken;

use super::*;

fn esc(allowed: &[VerdictAction], secret: &str) -> Escalation {
    let mut inputs = BTreeMap::new();
    inputs.insert("text".to_string(), Value::from(format!("token {secret}")));
    let declared = BTreeMap::from([(
        "value".to_string(),
        heddle_core::supervise::DeclaredOutput::of_type(heddle_core::PortType::Int),
    )]);
    Redactor::new(vec![secret.to_string()], RedactLimits::default()).escalation(RawEscalation {
        node_id: "parse",
        node_type: "std.json.parse",
        lineage: &[],
        invocation_key: "",
        mode: NodeMode::Buffered,
        allowed: AllowedSet::of(allowed),
        failure: &FailureKind::Node,
        detail: &format!("cannot parse `token {secret}`"),
        signature: Some("json:parse"),
        candidate: None,
        inputs: &inputs,
        declared_outputs: &declared,
        attempt: 1,
        spent_cost_usd: 0.0,
        created_assets: false,
        retry_safe: true,
        emitted: false,
    })
}

use VerdictAction::*;

const ALL: &[VerdictAction] = &[Retry, Substitute, Skip, Fail];

/// Starts one decision through the bounded handle and waits until it is on the desk.
async fn asked(
    desk: &Arc<Desk>,
    allowed: &[VerdictAction],
    ctx: DecideCtx,
) -> (String, tokio::task::JoinHandle<Decision>) {
    let mut notices = desk.subscribe();
    let sup = Interactive::bounded(desk.clone(), Bounds::default());
    let e = esc(allowed, "hunter2-secret");
    let task = tokio::spawn(async move { sup.decide(&e, &ctx).await.unwrap() });
    let n = notices.recv().await.unwrap();
    assert_eq!(n.state, "pending");
    (n.id, task)
}

fn answer(verdict: &str) -> Answer {
    Answer {
        verdict: verdict.into(),
        ..Answer::default()
    }
}

#[tokio::test]
async fn a_persons_retry_is_the_decision_and_the_listing_is_redacted() {
    let desk = Desk::new(DEFAULT_DECISION_TIMEOUT);
    let (id, task) = asked(&desk, ALL, DecideCtx::detached()).await;
    let listed = desk.pending();
    assert_eq!(listed.len(), 1);
    let json = listed[0].to_json().to_string();
    assert!(!json.contains("hunter2-secret"), "{json}");
    assert!(json.contains("«redacted»"), "{json}");
    assert_eq!(
        listed[0].to_json()["allowed"],
        serde_json::json!(["retry", "substitute", "skip", "fail"])
    );
    assert_eq!(
        listed[0].deadline_ms - listed[0].created_at_ms,
        DEFAULT_DECISION_TIMEOUT.as_millis() as u64
    );

    assert_eq!(desk.answer(&id, answer("retry")).unwrap(), Verdict::Retry);
    let d = task.await.unwrap();
    assert_eq!(d.verdict, Verdict::Retry);
    assert_eq!(d.decided_by, DecidedBy::Agent);
    assert!(desk.pending().is_empty());
    // A second answer finds it answered, not open.
    assert!(matches!(
        desk.answer(&id, answer("skip")),
        Err(AnswerError::Closed {
            how: Closed::Answered,
            ..
        })
    ));
}

#[tokio::test]
async fn a_verdict_outside_the_allowed_set_is_refused_and_the_escalation_stays() {
    let desk = Desk::new(DEFAULT_DECISION_TIMEOUT);
    let (id, task) = asked(&desk, &[Skip, Fail], DecideCtx::detached()).await;
    let e = desk.answer(&id, answer("retry")).unwrap_err();
    assert!(
        matches!(e, AnswerError::NotAllowed { verdict: Retry, .. }),
        "{e}"
    );
    assert!(matches!(
        desk.answer(&id, answer("explode")),
        Err(AnswerError::Malformed(_))
    ));
    assert!(matches!(
        desk.answer("nope", answer("skip")),
        Err(AnswerError::Unknown(_))
    ));
    assert_eq!(desk.pending().len(), 1, "still waiting for a valid answer");
    let mut a = answer("fail");
    a.note = Some("bad upstream data".into());
    desk.answer(&id, a).unwrap();
    let d = task.await.unwrap();
    assert_eq!(d.verdict.reason(), Some("bad upstream data"));
}

#[tokio::test]
async fn a_substitute_is_checked_against_the_declared_outputs_before_it_is_decided() {
    let desk = Desk::new(DEFAULT_DECISION_TIMEOUT);
    let (id, task) = asked(&desk, ALL, DecideCtx::detached()).await;
    let mut a = answer("substitute");
    assert!(
        matches!(desk.answer(&id, a.clone()), Err(AnswerError::Malformed(_))),
        "no outputs"
    );
    a.outputs = Some(
        serde_json::json!({"value": "seven"})
            .as_object()
            .unwrap()
            .clone(),
    );
    assert!(
        matches!(desk.answer(&id, a.clone()), Err(AnswerError::Malformed(_))),
        "wrong type"
    );
    a.outputs = Some(serde_json::json!({"value": 7}).as_object().unwrap().clone());
    desk.answer(&id, a).unwrap();
    let d = task.await.unwrap();
    assert_eq!(
        d.verdict,
        Verdict::Substitute {
            outputs: BTreeMap::from([("value".to_string(), Value::Int(7))])
        }
    );
}

#[tokio::test]
async fn nobody_answering_fails_closed_at_the_timeout() {
    let desk = Desk::new(Duration::from_millis(30));
    let mut notices = desk.subscribe();
    let (id, task) = asked(&desk, ALL, DecideCtx::detached()).await;
    let d = task.await.unwrap();
    assert_eq!(d.verdict.action(), Fail);
    assert_eq!(d.decided_by, DecidedBy::Bounds);
    assert!(desk.pending().is_empty());
    assert!(matches!(
        desk.answer(&id, answer("retry")),
        Err(AnswerError::Closed {
            how: Closed::TimedOut,
            ..
        })
    ));
    let states: Vec<_> = std::iter::from_fn(|| notices.try_recv().ok())
        .map(|n| n.state)
        .collect();
    assert_eq!(states, ["pending", "timed_out"]);
}

#[tokio::test]
async fn cancelling_the_run_withdraws_the_pending_decision() {
    let desk = Desk::new(DEFAULT_DECISION_TIMEOUT);
    let ctx = DecideCtx {
        cancel: CancellationToken::new(),
        ..DecideCtx::detached()
    };
    let (id, task) = asked(&desk, ALL, ctx.clone()).await;
    ctx.cancel.cancel();
    let d = task.await.unwrap();
    assert_eq!(d.verdict.action(), Fail);
    assert!(matches!(
        desk.answer(&id, answer("retry")),
        Err(AnswerError::Closed {
            how: Closed::Withdrawn,
            ..
        })
    ));
}

#[tokio::test]
async fn withdrawing_the_desk_fails_what_waits_and_everything_asked_later() {
    let desk = Desk::new(DEFAULT_DECISION_TIMEOUT);
    let (id, task) = asked(&desk, ALL, DecideCtx::detached()).await;
    desk.withdraw_all();
    assert_eq!(task.await.unwrap().verdict.action(), Fail);
    assert!(desk.pending().is_empty());
    assert!(matches!(
        desk.answer(&id, answer("retry")),
        Err(AnswerError::Closed {
            how: Closed::Withdrawn,
            ..
        })
    ));
    let sup = Interactive::bounded(desk.clone(), Bounds::default());
    let d = sup
        .decide(&esc(ALL, "x"), &DecideCtx::detached())
        .await
        .unwrap();
    assert_eq!(d.verdict.action(), Fail);
    assert!(desk.pending().is_empty());
}
