//! The supervisor end to end: real kernel runs whose failing nodes are escalated, decided
//! by the kernel-side handles, checked against the allowed set and carried out.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use heddle_core::builder::graph;
use heddle_core::supervise::{DecidedBy, Decision, Escalation, Intervention, Verdict};
use heddle_core::{
    EventKind, GraphDoc, NodeDecl, NodeMode, NodeOutcome, OutputDecl, PortDecl, PortType,
    RunResult, RunStatus, SkipReason, Value,
};
use heddle_kernel::runtime::{Run, RunOptions, run_graph};
use heddle_kernel::supervisor::{ApplyTo, DecideCtx, Policy, Replay, Supervisor, SupervisorError};
use heddle_kernel::{
    BoxFuture, Call, Executor, InputStream, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs,
    Registry,
};
use serde_json::json;

const SECRET: &str = "sk-live-SECRET-4242";

/// Test node types (provider `sup`).
#[derive(Default)]
struct SupNodes;

fn t(s: &str) -> PortType {
    s.parse().unwrap()
}

fn decl(name: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> NodeDecl {
    NodeDecl {
        inputs: inputs
            .iter()
            .map(|(n, ty)| PortDecl::new(*n, t(ty)))
            .collect(),
        outputs: outputs
            .iter()
            .map(|(n, ty)| OutputDecl::new(*n, t(ty)))
            .collect(),
        origin: "test".into(),
        ..NodeDecl::new(name)
    }
}

impl NodeProvider for SupNodes {
    fn name(&self) -> &str {
        "sup"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        let fail_times = PortDecl::new("fail_times", t("int")).with_default(Value::Int(1));
        vec![
            // Fails its first `fail_times` invocations per value with an HTTP 503.
            NodeDecl {
                retry_safe: true,
                properties: vec![fail_times.clone()],
                ..decl("sup.flaky", &[("value", "any")], &[("value", "any")])
            },
            NodeDecl {
                retry_safe: false,
                properties: vec![fail_times],
                ..decl("sup.flaky_unsafe", &[("value", "any")], &[("value", "any")])
            },
            // Fails the first time per value; odd values report provider cost first.
            NodeDecl {
                retry_safe: true,
                ..decl("sup.cost_if_odd", &[("value", "int")], &[("value", "int")])
            },
            // Reports provider cost, then fails: never retried even though retry-safe.
            NodeDecl {
                retry_safe: true,
                ..decl("sup.costly", &[("value", "any")], &[("value", "any")])
            },
            // Parses JSON text; broken text becomes the candidate output.
            decl("sup.parse", &[("text", "str")], &[("value", "object")]),
            // Fails (http:401) when value == property `bad`.
            NodeDecl {
                properties: vec![PortDecl::new("bad", t("int"))],
                ..decl("sup.fail_on", &[("value", "int")], &[("value", "int")])
            },
            // Is handed a secret and fails mentioning it (and its inputs carry it too).
            decl("sup.leak", &[("value", "any")], &[("value", "any")]),
            // Streams 0..n, then fails (after emitting).
            NodeDecl {
                mode: NodeMode::StreamingOutput,
                retry_safe: true,
                ..decl("sup.stream", &[("n", "int")], &[("value", "int")])
            },
            // Running sum of its input stream; fails on a negative item.
            NodeDecl {
                mode: NodeMode::StreamingInput,
                ..decl("sup.sum", &[("value", "int")], &[("sum", "int")])
            },
            // Controlled node that fails the first time it is run.
            NodeDecl {
                mode: NodeMode::Controlled,
                retry_safe: true,
                ..decl("sup.ctl", &[("x", "int")], &[("out", "int")])
            },
        ]
        .into_iter()
        .map(Arc::new)
        .collect()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        Ok(Arc::new(SupExec {
            ty: spec.decl.type_name.clone(),
            id: spec.id.to_string(),
            props: spec.properties.clone(),
            calls: Arc::new(Mutex::new(HashMap::new())),
        }))
    }
}

struct SupExec {
    ty: String,
    id: String,
    props: BTreeMap<String, Value>,
    /// Invocations so far per input value, for "fails the first N times".
    calls: Arc<Mutex<HashMap<String, u32>>>,
}

impl SupExec {
    fn count(&self, v: &Value) -> u32 {
        let mut c = self.calls.lock().unwrap();
        let n = c.entry(format!("{}/{v}", self.id)).or_insert(0);
        *n += 1;
        *n
    }
    fn prop_i(&self, k: &str, default: i64) -> i64 {
        self.props.get(k).and_then(Value::as_i64).unwrap_or(default)
    }
}

impl Executor for SupExec {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let inputs = call.inputs;
            let ctx: NodeCtx = call.ctx;
            let v = |k: &str| inputs.get(k).cloned().unwrap_or(Value::Null);
            match self.ty.as_str() {
                "sup.flaky" | "sup.flaky_unsafe" => {
                    let n = self.count(&v("value"));
                    if i64::from(n) <= self.prop_i("fail_times", 1) {
                        return Err(NodeError::msg("GET upstream: HTTP 503 Service Unavailable"));
                    }
                    Ok(Outputs::one("value", v("value")))
                }
                "sup.cost_if_odd" => {
                    let x = v("value");
                    if self.count(&x) == 1 {
                        if x.as_i64().unwrap_or(0) % 2 == 1 {
                            ctx.report_cost(0.01);
                        }
                        return Err(NodeError::msg("HTTP 503"));
                    }
                    Ok(Outputs::one("value", x))
                }
                "sup.costly" => {
                    ctx.report_cost(0.02);
                    Err(NodeError::msg("provider timed out after billing"))
                }
                "sup.parse" => {
                    let text = v("text");
                    let s = text.as_str().unwrap_or("");
                    match serde_json::from_str::<serde_json::Value>(s) {
                        Ok(j) => Ok(Outputs::one("value", Value::from_json(j))),
                        Err(e) => Err(NodeError::msg(format!("invalid JSON: {e}"))
                            .with_signature("validation:$")
                            .with_candidate(Outputs::one("value", text.clone()))),
                    }
                }
                "sup.fail_on" => {
                    let x = v("value");
                    if x.as_i64() == Some(self.prop_i("bad", -1)) {
                        return Err(
                            NodeError::msg(format!("item {x} rejected")).with_signature("http:401")
                        );
                    }
                    Ok(Outputs::one("value", x))
                }
                "sup.leak" => {
                    ctx.secrets().register(SECRET);
                    Err(NodeError::msg(format!(
                        "auth failed for https://api.example/?key={SECRET}"
                    ))
                    .with_candidate(Outputs::one("value", Value::from(SECRET))))
                }
                "sup.stream" => {
                    let n = v("n").as_i64().unwrap_or(0);
                    for i in 0..n {
                        ctx.emit("value", Value::Int(i)).await?;
                    }
                    Err(NodeError::msg("stream broke"))
                }
                "sup.ctl" => {
                    let x = v("x").as_i64().unwrap_or(0);
                    if self.count(&Value::Null) == 1 {
                        return Err(NodeError::msg("HTTP 502 on first run"));
                    }
                    Ok(Outputs::one("out", Value::Int(x * 10)))
                }
                other => Err(NodeError::host(format!("no such test node {other}"))),
            }
        })
    }

    fn run_stream(
        &self,
        mut input: InputStream,
        ctx: NodeCtx,
    ) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let mut sum = 0;
            while let Some(item) = input.next().await {
                let x = item.value.as_i64().unwrap_or(0);
                if x < 0 {
                    return Err(NodeError::msg("negative item"));
                }
                sum += x;
                ctx.emit("sum", Value::Int(sum)).await?;
            }
            Ok(Outputs::new())
        })
    }
}

fn registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.add(Arc::new(SupNodes)).unwrap();
    r
}

/// input `x` → node → output `out`.
fn chain(node_type: &str, props: serde_json::Value, x: Value) -> (GraphDoc, RunOptions) {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            ("n", node_type, props),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "n", node_type_input(node_type)),
            ("n", "value", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), x);
    (doc, opts)
}

fn node_type_input(ty: &str) -> &'static str {
    match ty {
        "sup.parse" => "text",
        "sup.stream" => "n",
        _ => "value",
    }
}

async fn run(doc: &GraphDoc, opts: RunOptions) -> RunResult {
    tokio::time::timeout(Duration::from_secs(20), run_graph(doc, &registry(), opts))
        .await
        .expect("the run should not hang")
        .unwrap()
}

fn interventions(r: &RunResult) -> Vec<Intervention> {
    r.interventions
        .iter()
        .map(|v| Intervention::from_json(v).unwrap())
        .collect()
}

fn policy(text: &str) -> Option<Arc<dyn Supervisor>> {
    Some(Arc::new(Policy::parse(text, "test-policy.toml").unwrap()))
}

/// Answers every escalation with one verdict; counts the questions.
struct Always {
    verdict: Verdict,
    asked: AtomicU32,
}

impl Always {
    fn new(verdict: Verdict) -> Arc<Self> {
        Arc::new(Always {
            verdict,
            asked: AtomicU32::new(0),
        })
    }
}

impl Supervisor for Always {
    fn name(&self) -> &str {
        "always"
    }
    fn decide<'a>(
        &'a self,
        _e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let v = self.verdict.clone();
        Box::pin(async move { Ok(Decision::new(v, DecidedBy::Agent)) })
    }
}

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
    assert_eq!(i[0].escalation.declared_outputs["value"], "object");
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

#[tokio::test]
async fn streaming_output_after_emit_offers_end_stream_and_keeps_what_was_emitted() {
    let (doc, mut opts) = chain("sup.stream", json!({}), Value::Int(3));
    let h = Always::new(Verdict::EndStream);
    opts.supervisor = Some(h);
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![Value::Int(0), Value::Int(1), Value::Int(2)]
    );
    let i = interventions(&r);
    assert!(i[0].escalation.emitted);
    assert_eq!(
        i[0].escalation.allowed_actions.to_vec(),
        [
            heddle_core::supervise::VerdictAction::EndStream,
            heddle_core::supervise::VerdictAction::Fail
        ]
    );
}

#[tokio::test]
async fn streaming_input_node_may_only_end_the_stream_or_fail() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("sum", "sup.sum", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "sum", "value"),
            ("sum", "sum", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(-1),
            Value::Int(5),
        ]),
    );
    // A handle asking for skip is overruled: only end_stream/fail are offered.
    opts.supervisor = Some(Always::new(Verdict::skip()));
    let r = run(&doc, opts.clone()).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(interventions(&r)[0].decided_by, DecidedBy::Kernel);
    opts.supervisor = Some(Always::new(Verdict::EndStream));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::Int(1), Value::Int(3)]);
}

#[tokio::test]
async fn controlled_node_retry_reruns_the_control_event() {
    // A streaming input behind a control edge keeps a controller live until the end,
    // so the caller can drive the node alongside it.
    let doc = graph(
        &[
            ("ctl", "heddle.input", json!({"streaming": true})),
            ("p", "heddle.passthrough", json!({})),
            ("c", "sup.ctl", json!({"x": 4})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("ctl", "value", "p", "value"),
            ("p", "value", "c", "__control__"),
            ("c", "out", "out", "value"),
        ],
    );
    let opts = RunOptions {
        supervisor: policy("[[rule]]\nverdict = \"retry\"\n"),
        ..Default::default()
    };
    let plan = heddle_core::plan::plan(&doc, &registry()).unwrap();
    let handle = Run::new(plan, &registry(), opts).unwrap().start();
    let out = handle.send_control("c", BTreeMap::new()).await.unwrap();
    assert_eq!(out.get("out"), Some(&Value::Int(40)));
    let r = handle.wait().await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(interventions(&r)[0].verdict, Verdict::Retry);
}

/// Never answers.
struct Stuck;
impl Supervisor for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }
    fn decide<'a>(
        &'a self,
        _e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn cancel_while_a_decision_is_pending_returns_at_once() {
    let (doc, mut opts) = chain("sup.flaky", json!({}), Value::Int(1));
    opts.supervisor = Some(Arc::new(Stuck));
    let plan = heddle_core::plan::plan(&doc, &registry()).unwrap();
    let run = Run::new(plan, &registry(), opts).unwrap();
    let mut events = run.subscribe();
    let handle = run.start();
    while let Some(e) = events.next().await {
        if matches!(e.kind, EventKind::Escalation { .. }) {
            break;
        }
    }
    handle.cancel();
    let r = tokio::time::timeout(Duration::from_secs(20), handle.wait())
        .await
        .expect("cancel must not wait for the decision");
    assert_eq!(r.status, RunStatus::Cancelled);
}

#[tokio::test]
async fn decision_timeout_fails_decided_by_bounds() {
    let (doc, mut opts) = chain("sup.flaky", json!({}), Value::Int(1));
    opts.supervisor = Some(Arc::new(heddle_kernel::supervisor::Bounded::new(
        Arc::new(Stuck),
        heddle_kernel::supervisor::Bounds {
            decision_timeout: Duration::from_millis(50),
            ..Default::default()
        },
    )));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let i = interventions(&r);
    assert_eq!(i[0].decided_by, DecidedBy::Bounds);
    assert!(r.error.unwrap().contains("longer than"));
}

#[tokio::test]
async fn replay_reproduces_a_recorded_runs_decisions() {
    // Recorded run: a retry for the flaky node, a sticky skip for item 3.
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("flaky", "sup.flaky", json!({})),
            ("check", "sup.fail_on", json!({"bad": 3})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "flaky", "value"),
            ("flaky", "value", "check", "value"),
            ("check", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(vec![Value::Int(1), Value::Int(3), Value::Int(5)]),
    );
    let mut first = opts.clone();
    first.supervisor = policy(
        "[[rule]]\nsignature = \"http:5*\"\nverdict = \"retry\"\n\n[[rule]]\nverdict = \"skip\"\n",
    );
    let recorded = run(&doc, first).await;
    assert_eq!(
        recorded.status,
        RunStatus::Completed,
        "{:?}",
        recorded.error
    );
    let report = serde_json::to_value(&recorded).unwrap();

    let mut again = opts.clone();
    again.supervisor = Some(Arc::new(
        Replay::from_json(&report, "recorded.json").unwrap(),
    ));
    let replayed = run(&doc, again).await;
    assert_eq!(
        replayed.status,
        RunStatus::Completed,
        "{:?}",
        replayed.error
    );
    assert_eq!(replayed.outputs, recorded.outputs);
    let key = |i: &Intervention| {
        (
            i.escalation.node_id.clone(),
            i.escalation.invocation_key.clone(),
            i.escalation.attempt,
            i.verdict.clone(),
        )
    };
    let mut a: Vec<_> = interventions(&recorded).iter().map(key).collect();
    let mut b: Vec<_> = interventions(&replayed).iter().map(key).collect();
    a.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    b.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    assert_eq!(a, b);
    assert!(
        interventions(&replayed)
            .iter()
            .all(|i| i.decided_by == DecidedBy::Replay)
    );

    // A recording without these decisions: every miss is fail.
    let mut empty = opts;
    empty.supervisor = Some(Arc::new(
        Replay::from_json(&json!({"status": "completed"}), "empty.json").unwrap(),
    ));
    let r = run(&doc, empty).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        r.error
            .unwrap()
            .contains("replay: the recorded run has no decision")
    );
}

#[tokio::test]
async fn cost_is_accounted_per_invocation_so_only_the_billed_item_loses_retry() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("call", "sup.cost_if_odd", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "call", "value"),
            ("call", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(3),
            Value::Int(4),
        ]),
    );
    // Retry where allowed, else skip.
    opts.supervisor = policy("[[rule]]\nverdict = \"retry\"\n\n[[rule]]\nverdict = \"skip\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![Value::list(vec![Value::Int(2), Value::Int(4)])]
    );
    let mut by_item: Vec<(u64, f64, Verdict)> = interventions(&r)
        .into_iter()
        .map(|i| {
            (
                i.escalation.lineage[0].index,
                i.escalation.spent_cost_usd,
                i.verdict,
            )
        })
        .collect();
    by_item.sort_by_key(|x| x.0);
    assert_eq!(
        by_item,
        vec![
            (0, 0.01, Verdict::skip()),
            (1, 0.0, Verdict::Retry),
            (2, 0.01, Verdict::skip()),
            (3, 0.0, Verdict::Retry),
        ]
    );
}
