//! Handle and escalator tests that need no running graph; end-to-end runs are in the
//! kernel's integration tests.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use heddle_core::supervise::{Escalation, FailureKind, RawEscalation, RedactLimits, Redactor};
use heddle_core::{EventKind, InvocationMetrics, NodeDecl, NodeMode, OutputDecl, PortType, Value};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::executor::{BoxFuture, EventSink, NodeError, Outputs, SecretRegistry};

/// Answers from a script; counts how often it was asked.
struct Scripted {
    answers: Mutex<Vec<Verdict>>,
    asked: AtomicU32,
    seen: Mutex<Vec<Escalation>>,
}

impl Scripted {
    fn new(answers: Vec<Verdict>) -> Arc<Self> {
        Arc::new(Scripted {
            answers: Mutex::new(answers.into_iter().rev().collect()),
            asked: AtomicU32::new(0),
            seen: Mutex::new(Vec::new()),
        })
    }
}

impl Supervisor for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(e.clone());
        let v = self.answers.lock().unwrap().pop();
        Box::pin(async move {
            // Yield so queued escalations really queue behind this one.
            tokio::task::yield_now().await;
            Ok(Decision::new(
                v.unwrap_or_else(|| Verdict::fail("script exhausted")),
                DecidedBy::Agent,
            ))
        })
    }
}

/// Never answers; records whether its decision was cancelled.
struct Stuck {
    cancelled: Arc<std::sync::atomic::AtomicBool>,
}

impl Supervisor for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }
    fn decide<'a>(
        &'a self,
        _e: &'a Escalation,
        ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        // Background work of the handle (as an HTTP client would have): it must learn of
        // the cancellation even though the decide future itself is simply dropped.
        let token = ctx.cancel.clone();
        let flag = self.cancelled.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            flag.store(true, Ordering::SeqCst);
        });
        Box::pin(std::future::pending())
    }
}

#[derive(Default)]
struct Sink(Mutex<Vec<EventKind>>);
impl EventSink for Sink {
    fn emit(&self, e: EventKind) {
        self.0.lock().unwrap().push(e);
    }
}

fn esc(node: &str, key: &str, sig: Option<&str>, allowed: &[VerdictAction]) -> Escalation {
    let inputs = BTreeMap::new();
    let declared = BTreeMap::new();
    Redactor::new(Vec::new(), RedactLimits::default()).escalation(RawEscalation {
        node_id: node,
        node_type: "t.x",
        lineage: &[],
        invocation_key: key,
        mode: NodeMode::Buffered,
        allowed: AllowedSet::of(allowed),
        failure: &FailureKind::Node,
        detail: "boom",
        signature: sig,
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

#[tokio::test]
async fn seven_identical_failures_with_sticky_skip_make_one_decision() {
    let inner = Scripted::new(vec![Verdict::Skip {
        apply_to: ApplyTo::Signature,
    }]);
    let b = Arc::new(Bounded::new(inner.clone(), Bounds::default()));
    let ctx = DecideCtx::detached();
    let mut tasks = Vec::new();
    for i in 0..7 {
        let b = b.clone();
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let e = esc("fetch", &i.to_string(), Some("http:401"), &[Skip, Fail]);
            b.decide(&e, &ctx).await.unwrap()
        }));
    }
    let mut by = Vec::new();
    for t in tasks {
        let d = t.await.unwrap();
        assert_eq!(d.verdict.action(), Skip);
        by.push(d.decided_by);
    }
    assert_eq!(inner.asked.load(Ordering::SeqCst), 1);
    assert_eq!(by.iter().filter(|d| **d == DecidedBy::Sticky).count(), 6);
    // A different signature on the same node is not covered by the sticky verdict.
    let d = b
        .decide(&esc("fetch", "x", Some("http:500"), &[Skip, Fail]), &ctx)
        .await
        .unwrap();
    assert_eq!(d.decided_by, DecidedBy::Agent);
    assert_eq!(inner.asked.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn no_signature_means_no_stickiness() {
    let inner = Scripted::new(vec![
        Verdict::Skip {
            apply_to: ApplyTo::Signature,
        },
        Verdict::skip(),
    ]);
    let b = Bounded::new(inner.clone(), Bounds::default());
    let ctx = DecideCtx::detached();
    for k in ["a", "b"] {
        b.decide(&esc("n", k, None, &[Skip, Fail]), &ctx)
            .await
            .unwrap();
    }
    assert_eq!(inner.asked.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bounds_exhausted_fail_decided_by_bounds() {
    let inner = Scripted::new(vec![Verdict::Retry; 10]);
    let b = Bounded::new(
        inner.clone(),
        Bounds {
            max_decisions: 3,
            max_retries_per_node: 2,
            ..Bounds::default()
        },
    );
    let ctx = DecideCtx::detached();
    let e = esc("n", "k", None, &[Retry, Skip, Fail]);
    assert_eq!(b.decide(&e, &ctx).await.unwrap().verdict, Verdict::Retry);
    assert_eq!(b.decide(&e, &ctx).await.unwrap().verdict, Verdict::Retry);
    let third = b.decide(&e, &ctx).await.unwrap();
    assert_eq!(third.decided_by, DecidedBy::Bounds);
    assert!(third.verdict.reason().unwrap().contains("retry limit"));
    let fourth = b
        .decide(&esc("m", "k", None, &[Skip, Fail]), &ctx)
        .await
        .unwrap();
    assert_eq!(fourth.decided_by, DecidedBy::Bounds);
    assert!(fourth.verdict.reason().unwrap().contains("decision limit"));
    assert_eq!(inner.asked.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn decision_timeout_fails_and_cancels_the_inner_handle() {
    let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = Bounded::new(
        Arc::new(Stuck {
            cancelled: cancelled.clone(),
        }),
        Bounds {
            decision_timeout: Duration::from_millis(20),
            ..Bounds::default()
        },
    );
    let d = b
        .decide(&esc("n", "", None, &[Skip, Fail]), &DecideCtx::detached())
        .await
        .unwrap();
    assert_eq!(d.decided_by, DecidedBy::Bounds);
    assert!(d.verdict.reason().unwrap().contains("longer than"), "{d:?}");
    // The inner handle's token was cancelled; give its task a turn to observe it.
    for _ in 0..100 {
        if cancelled.load(Ordering::SeqCst) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        cancelled.load(Ordering::SeqCst),
        "inner handle was not cancelled"
    );
}

#[tokio::test]
async fn run_cancel_while_decision_pending_returns_fail_at_once() {
    let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = Arc::new(Bounded::new(
        Arc::new(Stuck {
            cancelled: cancelled.clone(),
        }),
        Bounds::default(),
    ));
    let ctx = DecideCtx::detached();
    let run_cancel = ctx.cancel.clone();
    let pending = {
        let (b, ctx) = (b.clone(), ctx.clone());
        tokio::spawn(async move { b.decide(&esc("n", "1", None, &[Fail]), &ctx).await })
    };
    let queued = {
        let (b, ctx) = (b.clone(), ctx.clone());
        tokio::spawn(async move { b.decide(&esc("n", "2", None, &[Fail]), &ctx).await })
    };
    tokio::task::yield_now().await;
    run_cancel.cancel();
    for t in [pending, queued] {
        let d = t.await.unwrap().unwrap();
        assert_eq!(d.verdict.action(), Fail);
        assert_eq!(d.decided_by, DecidedBy::Bounds);
    }
}

#[tokio::test]
async fn policy_rules_first_allowed_match_wins() {
    let p = Policy::parse(
        r#"
default = "fail"

[[rule]]
name = "retry flaky"
signature = "http:5*"
verdict = "retry"

[[rule]]
node_type = "t.*"
signature = "http:5*"
verdict = "skip"
apply_to = "signature"

[[rule]]
message = "(?i)quota"
verdict = "fail"
reason = "out of quota"
"#,
        "test.toml",
    )
    .unwrap();
    assert_eq!(p.len(), 3);
    let ctx = DecideCtx::detached();
    let d = p
        .decide(&esc("n", "", Some("http:503"), &[Retry, Skip, Fail]), &ctx)
        .await
        .unwrap();
    assert_eq!(
        (d.verdict, d.decided_by),
        (Verdict::Retry, DecidedBy::Policy)
    );
    // Retry not allowed here: the next matching rule applies.
    let d = p
        .decide(&esc("n", "", Some("http:502"), &[Skip, Fail]), &ctx)
        .await
        .unwrap();
    assert!(d.verdict.is_sticky());
    let mut e = esc("n", "", None, &[Skip, Fail]);
    e.detail = "Quota exceeded".into();
    let d = p.decide(&e, &ctx).await.unwrap();
    assert_eq!(d.verdict.reason(), Some("out of quota"));
    let d = p
        .decide(&esc("n", "", None, &[Skip, Fail]), &ctx)
        .await
        .unwrap();
    assert_eq!(d.verdict.action(), Fail);
    assert!(d.verdict.reason().unwrap().contains("no policy rule"));
}

#[test]
fn an_unreadable_policy_file_keeps_the_io_error_as_its_source() {
    let path = std::path::Path::new("/nonexistent/heddle/policy.toml");
    let e = Policy::load(path).unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent/heddle/policy.toml"),
        "{e}"
    );
    let io = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the I/O error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn malformed_policy_names_the_line() {
    let err = |text: &str| Policy::parse(text, "p.toml").unwrap_err();
    let e = err("[[rule]]\nsignature = \"http:500\"\nverdict = \"explode\"\n");
    assert_eq!((e.line, e.origin.as_str()), (3, "p.toml"));
    assert!(e.message.contains("unknown verdict `explode`"), "{e}");
    let e = err("[[rule]]\nverdict = \"skip\"\nwhen = \"x\"\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("when"), "{e}");
    let e = err("[[rule]]\nverdict = \"skip\"\nmessage = \"(\"\n");
    assert_eq!(e.line, 3, "{e}");
    let e = err("[[rule]]\nverdict = \"retry\"\napply_to = \"signature\"\n");
    assert_eq!(e.line, 3, "{e}");
    let e = err("[[rule]\nverdict = \"retry\"\n");
    assert_eq!(e.line, 1, "{e}");
    let e = err("[[rule]]\nverdict = \"substitute\"\n");
    assert!(e.message.contains("outputs"), "{e}");
    assert!(e.to_string().starts_with("p.toml:2:"), "{e}");
}

#[tokio::test]
async fn replay_matches_node_key_attempt_and_misses_fail() {
    let mut e1 = esc("n", "k1", None, &[Retry, Skip, Fail]);
    let rec = |e: &Escalation, v: Verdict| Intervention {
        escalation: e.clone(),
        verdict: v,
        decided_by: DecidedBy::Agent,
        cost_usd: 0.0,
        overruled: None,
        rejected: None,
    };
    let mut list = vec![rec(&e1, Verdict::Retry)];
    e1.attempt = 2;
    list.push(rec(&e1, Verdict::skip()));
    let report = serde_json::json!({
        "status": "completed",
        "interventions": list.iter().map(Intervention::to_json).collect::<Vec<_>>(),
    });
    let r = Replay::from_json(&report, "run.json").unwrap();
    assert_eq!(r.len(), 2);
    let ctx = DecideCtx::detached();
    let mut e = esc("n", "k1", None, &[Retry, Skip, Fail]);
    let d = r.decide(&e, &ctx).await.unwrap();
    assert_eq!(
        (d.verdict, d.decided_by),
        (Verdict::Retry, DecidedBy::Replay)
    );
    e.attempt = 2;
    assert_eq!(r.decide(&e, &ctx).await.unwrap().verdict, Verdict::skip());
    e.attempt = 3;
    let d = r.decide(&e, &ctx).await.unwrap();
    assert_eq!(d.verdict.action(), Fail);
    assert!(d.verdict.reason().unwrap().contains("no decision"));
    assert!(Replay::from_json(&serde_json::json!({"x": 1}), "bad.json").is_err());
}

fn decl() -> NodeDecl {
    let mut d = NodeDecl::new("t.parse");
    d.retry_safe = false;
    d.outputs.push(OutputDecl::new("value", PortType::Object));
    d
}

async fn run_escalator(
    sup: Arc<dyn Supervisor>,
    secrets: Arc<SecretRegistry>,
    error: NodeError,
) -> (Resolution, Vec<EventKind>, Escalator) {
    let sink = Arc::new(Sink::default());
    let esc = Escalator::new(sup, secrets, sink.clone(), CancellationToken::new());
    let d = decl();
    let mut inputs = BTreeMap::new();
    inputs.insert("text".to_string(), Value::from("{broken"));
    let metrics = InvocationMetrics::default();
    let r = esc
        .on_failure(FailedInvocation {
            node_id: "parse",
            node_type: "t.parse",
            decl: &d,
            contract: None,
            mode: NodeMode::Buffered,
            lineage: Vec::new(),
            key: "",
            inputs: &inputs,
            error: &error,
            metrics: &metrics,
            emitted: false,
            attempt: 1,
        })
        .await;
    let events = sink.0.lock().unwrap().clone();
    (r, events, esc)
}

fn obj(k: &str, v: Value) -> Value {
    let mut m = heddle_core::Map::new();
    m.insert(k.into(), v);
    Value::object(m)
}

#[tokio::test]
async fn escalator_enforces_allowed_set_whoever_answers() {
    // The node is not retry-safe: a handle that says retry gets fail, by the kernel.
    let inner = Scripted::new(vec![Verdict::Retry]);
    let (r, _ev, esc) = run_escalator(inner, Arc::default(), NodeError::msg("boom")).await;
    assert_eq!(
        r,
        Resolution::Fail {
            summary: esc.interventions()[0].verdict.reason().map(str::to_string)
        }
    );
    let i = &esc.interventions()[0];
    assert_eq!(i.decided_by, DecidedBy::Kernel);
    assert_eq!(i.overruled.as_ref().unwrap().requested, Verdict::Retry);
}

#[tokio::test]
async fn substitute_valid_is_applied_and_invalid_bounced_then_fail() {
    let good = Verdict::Substitute {
        outputs: [("value".to_string(), obj("a", Value::Int(1)))].into(),
    };
    let bad = Verdict::Substitute {
        outputs: [("value".to_string(), Value::from("still broken"))].into(),
    };
    let err = || {
        NodeError::msg("invalid JSON at line 1")
            .with_candidate(Outputs::one("value", Value::from("{broken")))
    };
    // One bad repair, then a good one.
    let inner = Scripted::new(vec![bad.clone(), good.clone()]);
    let (r, _, esc) = run_escalator(inner.clone(), Arc::default(), err()).await;
    assert_eq!(
        r,
        Resolution::Substitute(Outputs::one("value", obj("a", Value::Int(1))))
    );
    let seen = inner.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].repair_round, 1);
    assert!(
        seen[1]
            .repair_error
            .as_ref()
            .unwrap()
            .contains("expected object"),
        "{:?}",
        seen[1]
    );
    assert!(esc.interventions()[0].rejected.is_some());
    // Three bad repairs: fail, decided by the kernel.
    let inner = Scripted::new(vec![bad.clone(), bad.clone(), bad.clone(), good]);
    let (r, _, esc) = run_escalator(inner.clone(), Arc::default(), err()).await;
    assert!(matches!(r, Resolution::Fail { summary: Some(s) } if s.contains("valid substitute")));
    assert_eq!(inner.asked.load(Ordering::SeqCst), 3);
    let last = esc.interventions().last().unwrap().clone();
    assert_eq!(last.decided_by, DecidedBy::Kernel);
    // Without a candidate, substitute is not even allowed.
    let inner = Scripted::new(vec![bad]);
    let (r, _, _) = run_escalator(inner, Arc::default(), NodeError::msg("boom")).await;
    assert!(matches!(r, Resolution::Fail { .. }));
}

#[tokio::test]
async fn no_secret_value_reaches_escalation_events_or_interventions() {
    let secrets = Arc::new(SecretRegistry::default());
    secrets.register("sk-live-TOPSECRET");
    let inner = Scripted::new(vec![Verdict::fail("gave up on sk-live-TOPSECRET")]);
    let err = NodeError::msg("401 from https://api/?key=sk-live-TOPSECRET").with_candidate(
        Outputs::one("value", Value::from("Bearer sk-live-TOPSECRET")),
    );
    let (r, events, esc) = run_escalator(inner.clone(), secrets, err).await;
    let all = format!(
        "{:?}{}{:?}{:?}",
        events,
        serde_json::to_string(&esc.interventions_json()).unwrap(),
        inner.seen.lock().unwrap(),
        r
    );
    assert!(!all.contains("TOPSECRET"), "{all}");
    assert!(all.contains("«redacted»"));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::Escalation { .. }))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::Decision { .. }))
    );
}

#[tokio::test]
async fn escalations_carry_the_attempt_and_suspend_never_escalates() {
    let inner = Scripted::new(vec![Verdict::skip(), Verdict::skip(), Verdict::skip()]);
    let sink = Arc::new(Sink::default());
    let esc = Escalator::new(
        inner.clone(),
        Arc::default(),
        sink.clone(),
        CancellationToken::new(),
    );
    let d = decl();
    let inputs = BTreeMap::new();
    let metrics = InvocationMetrics::default();
    let err = NodeError::msg("x");
    // The actor counts attempts per invocation; the escalation carries its count.
    for (key, attempt) in [("a", 1), ("a", 2), ("b", 1)] {
        esc.on_failure(FailedInvocation {
            node_id: "n",
            node_type: "t",
            decl: &d,
            contract: None,
            mode: NodeMode::Buffered,
            lineage: Vec::new(),
            key,
            inputs: &inputs,
            error: &err,
            metrics: &metrics,
            emitted: false,
            attempt,
        })
        .await;
    }
    let attempts: Vec<u32> = inner
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.attempt)
        .collect();
    assert_eq!(attempts, [1, 2, 1]);
    let suspend = NodeError::suspend("ask a human", Value::Null);
    let r = esc
        .on_failure(FailedInvocation {
            node_id: "n",
            node_type: "t",
            decl: &d,
            contract: None,
            mode: NodeMode::Buffered,
            lineage: Vec::new(),
            key: "c",
            inputs: &inputs,
            error: &suspend,
            metrics: &metrics,
            emitted: false,
            attempt: 1,
        })
        .await;
    assert_eq!(r, Resolution::Fail { summary: None });
    assert_eq!(inner.asked.load(Ordering::SeqCst), 3);
}

#[test]
fn read_output_is_scoped_to_the_failing_lineage() {
    let st = RunLedger::new();
    st.add_node("up", "t");
    let l = |i| {
        vec![LineageStep {
            root: "each:item".into(),
            index: i,
        }]
    };
    st.record_steps("up", &l(0), Some(&Outputs::one("v", Value::Int(0))), 0.0);
    st.record_steps("up", &l(1), Some(&Outputs::one("v", Value::Int(1))), 0.0);
    assert_eq!(st.read_output("up", &l(0)).unwrap()["v"], Value::Int(0));
    assert_eq!(st.read_output("up", &l(1)).unwrap()["v"], Value::Int(1));
    assert_eq!(
        st.read_output("up", &l(2)),
        Err(ReadOutputError::OutsideLineage("up".into()))
    );
    assert!(matches!(
        st.read_output("nope", &l(0)),
        Err(ReadOutputError::UnknownNode(_))
    ));
    assert_eq!(st.digest()["nodes"]["up"]["invocations"], 2);
}

#[test]
fn read_output_returns_only_the_failing_items_ancestors_and_itself() {
    let st = RunLedger::new();
    let step = |root: &str, index| LineageStep {
        root: root.into(),
        index,
    };
    for n in ["config", "each", "up", "inner", "other"] {
        st.add_node(n, "t");
    }
    st.set_fan_out("each", ["item".to_string(), "index".to_string()]);
    // A root-scope node: an ancestor of every item.
    st.record_steps(
        "config",
        &[],
        Some(&Outputs::one("v", Value::from("shared"))),
        0.0,
    );
    // The fan-out node ran at root scope; its items belong to their own lineages.
    let mut fanned = Outputs::new();
    for i in 0..2 {
        fanned
            .0
            .push(("item".into(), Value::from(format!("item-{i}"))));
        fanned.0.push(("index".into(), Value::Int(i)));
    }
    st.record_steps("each", &[], Some(&fanned), 0.0);
    st.record_steps(
        "up",
        &[step("each:item", 1)],
        Some(&Outputs::one("v", Value::Int(1))),
        0.0,
    );
    // A descendant of item 0 (a nested fan-out) and an item of another root.
    st.record_steps(
        "inner",
        &[step("each:item", 0), step("inner:item", 3)],
        Some(&Outputs::one("v", Value::Int(3))),
        0.0,
    );
    st.record_steps(
        "other",
        &[step("b:item", 0)],
        Some(&Outputs::one("v", Value::Int(9))),
        0.0,
    );

    let item0 = [step("each:item", 0)];
    assert_eq!(
        st.read_output("config", &item0).unwrap()["v"],
        Value::from("shared")
    );
    for node in ["each", "up", "inner", "other"] {
        assert_eq!(
            st.read_output(node, &item0),
            Err(ReadOutputError::OutsideLineage(node.into())),
            "{node}"
        );
    }
}

#[tokio::test]
async fn a_matching_rule_whose_verdict_is_not_allowed_says_so() {
    let p = Policy::parse(
        "[[rule]]\nname = \"repair\"\nnode = \"n\"\nverdict = \"substitute\"\noutputs = { value = 0 }\n",
        "p.toml",
    )
    .unwrap();
    // No candidate output, so the kernel does not offer substitute.
    let d = p
        .decide(&esc("n", "", None, &[Skip, Fail]), &DecideCtx::detached())
        .await
        .unwrap();
    assert_eq!(d.verdict.action(), Fail);
    let why = d.verdict.reason().unwrap();
    assert!(why.contains("policy repair matched"), "{why}");
    assert!(why.contains("candidate output"), "{why}");
    assert!(!why.contains("no policy rule matched"), "{why}");
    // A rule that does not match at all still reads as before.
    let d = p
        .decide(&esc("m", "", None, &[Skip, Fail]), &DecideCtx::detached())
        .await
        .unwrap();
    assert!(
        d.verdict
            .reason()
            .unwrap()
            .contains("no policy rule matched")
    );
}

/// A handle holding a credential (an API key), asking nothing of the run.
struct Keyed(Arc<Scripted>);

impl Supervisor for Keyed {
    fn name(&self) -> &str {
        "keyed"
    }

    fn secrets(&self) -> Vec<String> {
        vec!["sk-handle-OWNKEY".into()]
    }

    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        self.0.decide(e, ctx)
    }
}

#[tokio::test]
async fn the_handles_own_secret_is_masked_in_the_first_escalation() {
    let inner = Scripted::new(vec![Verdict::skip()]);
    let err = NodeError::msg("upstream said: bad key sk-handle-OWNKEY");
    let (_, events, esc) = run_escalator(
        Arc::new(Keyed(inner.clone())),
        Arc::new(SecretRegistry::default()),
        err,
    )
    .await;
    let all = format!(
        "{events:?}{}{:?}",
        serde_json::to_string(&esc.interventions_json()).unwrap(),
        inner.seen.lock().unwrap(),
    );
    assert!(!all.contains("OWNKEY"), "{all}");
    assert!(all.contains("«redacted»"), "{all}");
}
