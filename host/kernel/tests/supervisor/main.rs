//! The supervisor end to end: real kernel runs whose failing nodes are escalated, decided
//! by the kernel-side handles, checked against the allowed set and carried out.
//! One test binary; this file holds the fixtures its modules share.

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
            // Fails with a stderr-like tail that echoes its credentials.
            decl(
                "sup.echo_creds",
                &[("password", "any"), ("api_token", "any"), ("req", "any")],
                &[("value", "any")],
            ),
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
            // A retry-safe controller: runs its `target` once, then fails.
            NodeDecl {
                retry_safe: true,
                properties: vec![PortDecl::new("target", t("str"))],
                ..decl("sup.drive", &[], &[("out", "int")])
            },
            // Controlled nodes answering 1: one retry-safe, one not.
            NodeDecl {
                mode: NodeMode::Controlled,
                retry_safe: true,
                ..decl("sup.safe_target", &[], &[("out", "int")])
            },
            NodeDecl {
                mode: NodeMode::Controlled,
                ..decl("sup.unsafe_target", &[], &[("out", "int")])
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
                        return Err(NodeError::msg("GET upstream: HTTP 503 Service Unavailable")
                            .with_signature("http:503"));
                    }
                    Ok(Outputs::one("value", v("value")))
                }
                "sup.cost_if_odd" => {
                    let x = v("value");
                    if self.count(&x) == 1 {
                        if x.as_i64().unwrap_or(0) % 2 == 1 {
                            ctx.report_cost(0.01);
                        }
                        return Err(NodeError::msg("HTTP 503").with_signature("http:503"));
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
                "sup.echo_creds" => {
                    let auth = v("req")
                        .as_object()
                        .and_then(|m| m.get("headers"))
                        .and_then(Value::as_object)
                        .and_then(|h| h.get("authorization"))
                        .cloned()
                        .unwrap_or(Value::Null);
                    let text = |x: Value| x.as_str().unwrap_or_default().to_string();
                    Err(NodeError::msg(format!(
                        "exited with code 1; stderr (last lines):\nlogin pw={} token={}\n> Authorization: {}",
                        text(v("password")),
                        text(v("api_token")),
                        text(auth)
                    )))
                }
                "sup.stream" => {
                    let n = v("n").as_i64().unwrap_or(0);
                    for i in 0..n {
                        ctx.emit("value", Value::Int(i)).await?;
                    }
                    Err(NodeError::msg("stream broke"))
                }
                "sup.drive" => {
                    let target = v("target").as_str().unwrap_or("").to_string();
                    ctx.send_control(&target, BTreeMap::new()).await?;
                    Err(NodeError::msg("failed after its run event").with_signature("drive:after"))
                }
                "sup.safe_target" | "sup.unsafe_target" => Ok(Outputs::one("out", Value::Int(1))),
                "sup.ctl" => {
                    let x = v("x").as_i64().unwrap_or(0);
                    if self.count(&Value::Null) == 1 {
                        return Err(
                            NodeError::msg("HTTP 502 on first run").with_signature("http:502")
                        );
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

mod checks;
mod decisions;
mod fanout;
mod promises;
mod redaction;
mod streams;
mod tools;
mod verdicts;
