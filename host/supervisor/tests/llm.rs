//! The LLM handle against a local OpenAI-compatible server on 127.0.0.1, speaking the
//! real chat-completions wire protocol over a real socket (HTTP/1.1 via hyper).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use heddle_core::supervise::{
    AllowedSet, DecidedBy, DeclaredOutput, Escalation, FailureKind, LineageStep, RawEscalation,
    RedactLimits, Redactor, Verdict, VerdictAction,
};
use heddle_core::{NodeMode, Value};
use heddle_kernel::SecretRegistry;
use heddle_kernel::supervisor::{DecideCtx, RunLedger, Supervisor, SupervisorError};
use heddle_supervisor::{ConfigError, LlmConfig, LlmSupervisor, ModelPrice};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use serde_json::{Value as Json, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// One scripted reply: HTTP status and body, or "never answer".
#[derive(Clone)]
enum Reply {
    Json(u16, Json),
    Raw(u16, &'static str),
    Hang,
}

#[derive(Clone, Debug)]
struct Seen {
    path: String,
    auth: Option<String>,
    body: Json,
}

struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn server(script: Vec<Reply>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(Mutex::new(script.into_iter().rev().collect::<Vec<_>>()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (seen, script) = (seen2.clone(), script.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (seen, script) = (seen.clone(), script.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let auth = req
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap_or("").to_string());
                        let bytes = req.into_body().collect().await.unwrap().to_bytes();
                        let body: Json = serde_json::from_slice(&bytes).unwrap_or(Json::Null);
                        seen.lock().unwrap().push(Seen { path, auth, body });
                        let next = script.lock().unwrap().pop();
                        let (status, text) = match next {
                            Some(Reply::Json(s, j)) => (s, j.to_string()),
                            Some(Reply::Raw(s, t)) => (s, t.to_string()),
                            Some(Reply::Hang) => {
                                std::future::pending::<()>().await;
                                unreachable!()
                            }
                            None => (500, r#"{"error":{"message":"script exhausted"}}"#.into()),
                        };
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(text)))
                                .unwrap(),
                        )
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    Server {
        url: format!("http://{addr}/v1"),
        seen,
    }
}

/// A chat completion whose message calls `tool` with `args` (already a JSON string).
fn tool_reply(tool: &str, args: &str, prompt: u64, completion: u64) -> Reply {
    Reply::Json(
        200,
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": format!("call_{tool}"),
                        "type": "function",
                        "function": {"name": tool, "arguments": args},
                    }],
                },
            }],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }),
    )
}

const KEY: &str = "sk-test-KEY-0123456789";

fn config(url: &str) -> LlmConfig {
    let mut c = LlmConfig::new(url, "test-model");
    c.api_key = Some(KEY.to_string());
    c.pricing.insert(
        "test-model",
        ModelPrice {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
        },
    );
    c.max_output_tokens = 256;
    c
}

fn escalation(allowed: &[VerdictAction], candidate: bool, lineage: Vec<LineageStep>) -> Escalation {
    let mut inputs = BTreeMap::new();
    inputs.insert("text".to_string(), Value::from("{\"a\": 1,"));
    let cand: BTreeMap<String, Value> = [("value".to_string(), Value::from("{\"a\": 1,"))].into();
    let declared: BTreeMap<String, DeclaredOutput> = [(
        "value".to_string(),
        DeclaredOutput::of_type(heddle_core::PortType::Object),
    )]
    .into();
    Redactor::new(Vec::new(), RedactLimits::default()).escalation(RawEscalation {
        node_id: "parse",
        node_type: "std.json.parse",
        lineage: &lineage,
        invocation_key: "each:item=1",
        mode: NodeMode::Buffered,
        allowed: AllowedSet::of(allowed),
        failure: &FailureKind::Node,
        detail: "invalid JSON: EOF while parsing an object at line 1 column 9",
        signature: None,
        candidate: candidate.then_some(&cand),
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
async fn tools_then_verdict_over_a_real_socket() {
    let item = |i| {
        vec![LineageStep {
            root: "each:item".into(),
            index: i,
        }]
    };
    let srv = server(vec![
        tool_reply("get_run_state", "{}", 1000, 20),
        tool_reply("read_node_output", r#"{"node_id":"fetch"}"#, 1200, 20),
        tool_reply("read_node_output", r#"{"node_id":"fetch_other"}"#, 1300, 20),
        tool_reply(
            "submit_verdict",
            r#"{"action":"retry","reason":"flaky"}"#,
            1400,
            30,
        ),
    ])
    .await;
    let sup = LlmSupervisor::new(config(&srv.url)).unwrap();
    let state = Arc::new(RunLedger::new());
    state.add_node("fetch", "std.http.get");
    state.record_steps(
        "fetch",
        &item(1),
        Some(&heddle_kernel::Outputs::one("body", Value::from("mine"))),
        0.0,
    );
    state.add_node("fetch_other", "std.http.get");
    state.record_steps(
        "fetch_other",
        &item(2),
        Some(&heddle_kernel::Outputs::one(
            "body",
            Value::from("NOT-MINE"),
        )),
        0.0,
    );
    let secrets = Arc::new(SecretRegistry::default());
    let ctx = DecideCtx {
        cancel: CancellationToken::new(),
        state: Some(state),
        secrets: secrets.clone(),
    };
    let e = escalation(&[Retry, Skip, Fail], false, item(1));
    let d = sup.decide(&e, &ctx).await.unwrap();
    assert_eq!(d.verdict, Verdict::Retry);
    assert_eq!(d.decided_by, DecidedBy::Agent);
    // Actual usage priced at $1/$2 per Mtok, summed over four turns.
    let expect = (1000.0 + 1200.0 + 1300.0 + 1400.0) * 1e-6 + (20.0 * 3.0 + 30.0) * 2e-6;
    assert!((d.cost_usd - expect).abs() < 1e-12, "{}", d.cost_usd);
    assert!((sup.spent_usd() - expect).abs() < 1e-12);

    let seen = srv.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].auth.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(seen[0].body["model"], "test-model");
    assert_eq!(seen[0].body["max_tokens"], 256);
    // The verdict schema is narrowed to the allowed set, and substitute is absent.
    let tools = seen[0].body["tools"].as_array().unwrap();
    let verdict_tool = tools
        .iter()
        .find(|t| t["function"]["name"] == "submit_verdict")
        .unwrap();
    let params = &verdict_tool["function"]["parameters"];
    assert_eq!(
        params["properties"]["action"]["enum"],
        json!(["retry", "skip", "fail"])
    );
    assert!(params["properties"].get("outputs").is_none());
    // Tool results went back as tool messages; the sibling item's output was refused.
    let last = seen[3].body["messages"].as_array().unwrap();
    let tool_msgs: Vec<&Json> = last.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool_msgs.len(), 3);
    assert!(
        tool_msgs[0]["content"]
            .as_str()
            .unwrap()
            .contains("fetch_other")
    );
    assert!(tool_msgs[1]["content"].as_str().unwrap().contains("mine"));
    let refused = tool_msgs[2]["content"].as_str().unwrap();
    assert!(
        refused.contains("refused") && !refused.contains("NOT-MINE"),
        "{refused}"
    );
    // The API key became a run secret, so the kernel masks it everywhere.
    assert!(secrets.snapshot().contains(&KEY.to_string()));
}

#[tokio::test]
async fn invalid_substitute_is_bounced_inside_the_conversation() {
    let srv = server(vec![
        tool_reply(
            "submit_verdict",
            r#"{"action":"substitute","reason":"repair","outputs":{"value":"{\"a\": 1}"}}"#,
            100,
            10,
        ),
        tool_reply(
            "submit_verdict",
            r#"{"action":"substitute","reason":"repair","outputs":{"value":{"a":1}}}"#,
            100,
            10,
        ),
    ])
    .await;
    let sup = LlmSupervisor::new(config(&srv.url)).unwrap();
    let e = escalation(&[Substitute, Skip, Fail], true, vec![]);
    let d = sup.decide(&e, &DecideCtx::detached()).await.unwrap();
    let Verdict::Substitute { outputs } = d.verdict else {
        panic!("{:?}", d.verdict)
    };
    assert_eq!(outputs["value"].as_object().unwrap()["a"], Value::Int(1));
    let seen = srv.seen.lock().unwrap().clone();
    let params = &seen[0].body["tools"][2]["function"]["parameters"];
    assert_eq!(
        params["properties"]["outputs"]["properties"]["value"]["type"],
        "object"
    );
    let msgs = seen[1].body["messages"].as_array().unwrap();
    let bounce = msgs.last().unwrap()["content"].as_str().unwrap();
    assert!(bounce.contains("expected object"), "{bounce}");
}

#[tokio::test]
async fn malformed_replies_fail_closed() {
    let cases = vec![
        // Arguments that are not JSON.
        vec![tool_reply("submit_verdict", "{action: retry", 10, 10)],
        // A tool that does not exist.
        vec![tool_reply("delete_everything", "{}", 10, 10)],
        // No tool call at all.
        vec![Reply::Json(
            200,
            json!({"choices":[{"index":0,"message":{"role":"assistant","content":"I think retry"}}]}),
        )],
        // Not a chat completion.
        vec![Reply::Raw(200, "<html>proxy login</html>")],
        // A disallowed verdict, three times.
        vec![
            tool_reply(
                "submit_verdict",
                r#"{"action":"substitute","reason":"x","outputs":{}}"#,
                10,
                10,
            ),
            tool_reply(
                "submit_verdict",
                r#"{"action":"retry","reason":"x"}"#,
                10,
                10,
            ),
            tool_reply(
                "submit_verdict",
                r#"{"action":"end_stream","reason":"x"}"#,
                10,
                10,
            ),
        ],
    ];
    for (i, script) in cases.into_iter().enumerate() {
        let srv = server(script).await;
        let sup = LlmSupervisor::new(config(&srv.url)).unwrap();
        let e = escalation(&[Skip, Fail], false, vec![]);
        let d = sup.decide(&e, &DecideCtx::detached()).await.unwrap();
        assert_eq!(d.verdict.action(), Fail, "case {i}: {d:?}");
        assert_eq!(d.decided_by, DecidedBy::Bounds, "case {i}");
        assert!(
            d.verdict.reason().unwrap().contains("malformed"),
            "case {i}: {:?}",
            d.verdict
        );
    }
}

#[tokio::test]
async fn provider_error_fails_closed_without_leaking_the_key() {
    let srv = server(vec![Reply::Json(
        429,
        json!({"error": {"message": format!("Rate limit for key {KEY}"), "code": "rate_limit_exceeded"}}),
    )])
    .await;
    let sup = LlmSupervisor::new(config(&srv.url)).unwrap();
    let d = sup
        .decide(
            &escalation(&[Skip, Fail], false, vec![]),
            &DecideCtx::detached(),
        )
        .await
        .unwrap();
    let reason = d.verdict.reason().unwrap();
    assert_eq!(d.decided_by, DecidedBy::Bounds);
    assert!(
        reason.contains("429") && reason.contains("rate_limit_exceeded"),
        "{reason}"
    );
    assert!(!reason.contains("0123456789"), "{reason}");
    // A failed call may be billed: its reservation is kept as spent.
    assert!(d.cost_usd > 0.0);
}

#[tokio::test]
async fn cost_cap_is_enforced_by_reservation_before_each_turn() {
    // The cap admits no turn at all: the worst case of the first call exceeds it, so the
    // server is never called.
    let srv = server(vec![tool_reply(
        "submit_verdict",
        r#"{"action":"skip","reason":"x"}"#,
        10,
        10,
    )])
    .await;
    let mut cfg = config(&srv.url);
    cfg.cost_cap_usd = 0.0001; // 256 output tokens alone reserve $0.000512
    let sup = LlmSupervisor::new(cfg).unwrap();
    let d = sup
        .decide(
            &escalation(&[Skip, Fail], false, vec![]),
            &DecideCtx::detached(),
        )
        .await
        .unwrap();
    assert_eq!(d.decided_by, DecidedBy::Bounds);
    assert!(d.verdict.reason().unwrap().contains("cost cap"), "{d:?}");
    assert!(srv.seen.lock().unwrap().is_empty());

    // A cap that admits one turn but not a second: the first reply costs most of it.
    let srv = server(vec![
        tool_reply("get_run_state", "{}", 9_000, 100),
        tool_reply(
            "submit_verdict",
            r#"{"action":"skip","reason":"x"}"#,
            10,
            10,
        ),
    ])
    .await;
    let mut cfg = config(&srv.url);
    cfg.cost_cap_usd = 0.012;
    let sup = LlmSupervisor::new(cfg).unwrap();
    let d = sup
        .decide(
            &escalation(&[Skip, Fail], false, vec![]),
            &DecideCtx::detached(),
        )
        .await
        .unwrap();
    assert!(d.verdict.reason().unwrap().contains("cost cap"), "{d:?}");
    assert_eq!(srv.seen.lock().unwrap().len(), 1);
    // Spent is the first turn's actual cost; nothing was reserved past the cap.
    assert!(
        (sup.spent_usd() - 0.0092).abs() < 1e-12,
        "{}",
        sup.spent_usd()
    );
}

#[tokio::test]
async fn cancel_aborts_the_in_flight_request() {
    let srv = server(vec![Reply::Hang]).await;
    let sup = Arc::new(LlmSupervisor::new(config(&srv.url)).unwrap());
    let ctx = DecideCtx::detached();
    let cancel = ctx.cancel.clone();
    let task = {
        let sup = sup.clone();
        tokio::spawn(async move {
            sup.decide(&escalation(&[Skip, Fail], false, vec![]), &ctx)
                .await
        })
    };
    // Wait until the request is really in flight, then cancel.
    while srv.seen.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    cancel.cancel();
    assert!(matches!(
        task.await.unwrap(),
        Err(SupervisorError::Cancelled)
    ));
}

#[test]
fn refuses_to_start_without_pricing_or_endpoint() {
    let c = LlmConfig::new("http://127.0.0.1:9/v1", "no-such-model");
    assert!(matches!(
        LlmSupervisor::new(c),
        Err(ConfigError::NoPricing(_))
    ));
    let c = LlmConfig::new("", "gpt-4o-mini");
    assert!(matches!(
        LlmSupervisor::new(c),
        Err(ConfigError::NoEndpoint)
    ));
}

/// A retry-safe node that fails its first invocation with an HTTP 503.
struct Flaky {
    calls: std::sync::atomic::AtomicU32,
}

impl heddle_kernel::Executor for Flaky {
    fn invoke(
        &self,
        call: heddle_kernel::Call,
    ) -> heddle_kernel::BoxFuture<'_, Result<heddle_kernel::Outputs, heddle_kernel::NodeError>>
    {
        Box::pin(async move {
            if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return Err(heddle_kernel::NodeError::msg(
                    "upstream said HTTP 503 Service Unavailable",
                )
                .with_signature("http:503"));
            }
            let v = call.inputs.get("value").cloned().unwrap_or(Value::Null);
            Ok(heddle_kernel::Outputs::one("value", v))
        })
    }
}

struct FlakyProvider;

impl heddle_kernel::NodeProvider for FlakyProvider {
    fn name(&self) -> &str {
        "e2e"
    }
    fn declarations(&self) -> Vec<Arc<heddle_core::NodeDecl>> {
        let mut d = heddle_core::NodeDecl::new("e2e.flaky");
        d.retry_safe = true;
        d.inputs.push(heddle_core::PortDecl::new(
            "value",
            heddle_core::PortType::Any,
        ));
        d.properties.push(heddle_core::PortDecl::new(
            "note",
            heddle_core::PortType::Any,
        ));
        d.outputs.push(heddle_core::OutputDecl::new(
            "value",
            heddle_core::PortType::Any,
        ));
        vec![Arc::new(d)]
    }
    fn create(
        &self,
        _spec: &heddle_kernel::NodeSpec<'_>,
    ) -> Result<Arc<dyn heddle_kernel::Executor>, heddle_kernel::NodeError> {
        Ok(Arc::new(Flaky {
            calls: std::sync::atomic::AtomicU32::new(0),
        }))
    }
}

#[tokio::test]
async fn llm_supervises_a_real_kernel_run() {
    let srv = server(vec![tool_reply(
        "submit_verdict",
        r#"{"action":"retry","reason":"transient 503"}"#,
        800,
        25,
    )])
    .await;
    let mut reg = heddle_kernel::Registry::with_builtins();
    reg.add(Arc::new(FlakyProvider)).unwrap();
    let doc = heddle_core::builder::graph(
        &[
            ("in", "heddle.input", json!({"name": "x"})),
            (
                "fetch",
                "e2e.flaky",
                json!({"note": "password is hunter2-SECRET"}),
            ),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "fetch", "value"),
            ("fetch", "value", "out", "value"),
        ],
    );
    let mut opts = heddle_kernel::runtime::RunOptions::default();
    // A secret handed to some node earlier in the run, which also sits in an input of
    // the failing node (not in what it returns: a node value holding a known secret is
    // refused, KNOWN_SECRET).
    opts.secrets.register("hunter2-SECRET");
    opts.inputs.insert("x".into(), Value::from("plain data"));
    opts.supervisor = Some(Arc::new(LlmSupervisor::new(config(&srv.url)).unwrap()));
    let r = heddle_kernel::runtime::run_graph(&doc, &reg, opts)
        .await
        .unwrap();
    assert_eq!(r.status, heddle_core::RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.nodes["fetch"].invocations, 2);
    let i = heddle_core::supervise::Intervention::from_json(&r.interventions[0]).unwrap();
    assert_eq!(i.verdict, Verdict::Retry);
    assert_eq!(i.decided_by, DecidedBy::Agent);
    assert!((i.cost_usd - (800.0 * 1e-6 + 25.0 * 2e-6)).abs() < 1e-12);
    // What the model saw: the escalation of node `fetch`, with the secret masked and the
    // API key never in the conversation.
    let seen = srv.seen.lock().unwrap().clone();
    let sent = seen[0].body.to_string();
    assert!(
        sent.contains("fetch") && sent.contains("http:503"),
        "{sent}"
    );
    assert!(
        !sent.contains("hunter2-SECRET") && !sent.contains(KEY),
        "{sent}"
    );
    // The supervision record (interventions, escalation and decision events) masks it.
    let record = serde_json::to_string(&r.interventions).unwrap()
        + &serde_json::to_string(
            &r.events
                .iter()
                .filter(|e| {
                    matches!(
                        e.kind,
                        heddle_core::EventKind::Escalation { .. }
                            | heddle_core::EventKind::Decision { .. }
                    )
                })
                .collect::<Vec<_>>(),
        )
        .unwrap();
    assert!(record.contains("«redacted»"), "{record}");
    assert!(
        !record.contains("hunter2-SECRET") && !record.contains(KEY),
        "{record}"
    );
    assert_eq!(r.outputs["out"], vec![Value::from("plain data")]);
}

/// Fails echoing its credentials the way a stderr tail does.
struct Leaky;

impl heddle_kernel::Executor for Leaky {
    fn invoke(
        &self,
        call: heddle_kernel::Call,
    ) -> heddle_kernel::BoxFuture<'_, Result<heddle_kernel::Outputs, heddle_kernel::NodeError>>
    {
        let json = |k: &str| call.inputs.get(k).map(Value::to_json).unwrap_or_default();
        let msg = format!(
            "exited with code 1; stderr (last lines):\nlogin pw={} with {}",
            json("password").as_str().unwrap_or_default(),
            json("request")
        );
        Box::pin(async move { Err(heddle_kernel::NodeError::msg(msg)) })
    }
}

struct LeakyProvider;

impl heddle_kernel::NodeProvider for LeakyProvider {
    fn name(&self) -> &str {
        "leaky"
    }
    fn declarations(&self) -> Vec<Arc<heddle_core::NodeDecl>> {
        let mut d = heddle_core::NodeDecl::new("e2e.login");
        for p in ["password", "request"] {
            d.inputs
                .push(heddle_core::PortDecl::new(p, heddle_core::PortType::Any));
        }
        d.outputs.push(heddle_core::OutputDecl::new(
            "value",
            heddle_core::PortType::Any,
        ));
        vec![Arc::new(d)]
    }
    fn create(
        &self,
        _spec: &heddle_kernel::NodeSpec<'_>,
    ) -> Result<Arc<dyn heddle_kernel::Executor>, heddle_kernel::NodeError> {
        Ok(Arc::new(Leaky))
    }
}

#[tokio::test]
async fn credentials_masked_in_the_inputs_never_reach_the_model_through_the_error_text() {
    let srv = server(vec![tool_reply(
        "submit_verdict",
        r#"{"action":"fail","reason":"the login is refused"}"#,
        800,
        25,
    )])
    .await;
    let mut reg = heddle_kernel::Registry::with_builtins();
    reg.add(Arc::new(LeakyProvider)).unwrap();
    let doc = heddle_core::builder::graph(
        &[
            ("in", "heddle.input", json!({"name": "request"})),
            ("login", "e2e.login", json!({"password": "hunter2-pw"})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "login", "request"),
            ("login", "value", "out", "value"),
        ],
    );
    let mut opts = heddle_kernel::runtime::RunOptions::default();
    opts.inputs.insert(
        "request".into(),
        Value::from_json(json!({"headers": {"authorization": "Bearer zzz-hdr-999"}})),
    );
    opts.supervisor = Some(Arc::new(LlmSupervisor::new(config(&srv.url)).unwrap()));
    let r = heddle_kernel::runtime::run_graph(&doc, &reg, opts)
        .await
        .unwrap();
    assert_eq!(r.status, heddle_core::RunStatus::Failed);
    let sent = srv.seen.lock().unwrap()[0].body.to_string();
    assert!(sent.contains("pw=«redacted»"), "{sent}");
    for leaked in ["hunter2-pw", "zzz-hdr-999"] {
        assert!(!sent.contains(leaked), "{leaked} sent to the model: {sent}");
    }
}

#[tokio::test]
async fn a_substitute_breaking_the_declared_fields_is_bounced_to_the_model_which_corrects_it() {
    let srv = server(vec![
        tool_reply(
            "submit_verdict",
            r#"{"action":"substitute","reason":"repair","outputs":{"value":{"id":7}}}"#,
            100,
            10,
        ),
        tool_reply(
            "submit_verdict",
            r#"{"action":"substitute","reason":"id as text","outputs":{"value":{"id":"7"}}}"#,
            100,
            10,
        ),
    ])
    .await;
    let reg = heddle_kernel::Registry::with_builtins();
    let mut doc = heddle_core::builder::graph(
        &[
            ("judge", "heddle.constant", json!({"value": {"id": 7}})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[("judge", "value", "out", "value")],
    );
    doc.nodes[0].output =
        Some(serde_json::from_value(json!({"fields": [{"key": "id", "type": "string"}]})).unwrap());
    let opts = heddle_kernel::runtime::RunOptions {
        supervisor: Some(Arc::new(LlmSupervisor::new(config(&srv.url)).unwrap())),
        ..Default::default()
    };
    let r = heddle_kernel::runtime::run_graph(&doc, &reg, opts)
        .await
        .unwrap();
    assert_eq!(r.status, heddle_core::RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::from_json(json!({"id": "7"}))]);
    let seen = srv.seen.lock().unwrap().clone();
    // One decision, two turns: the wrong shape was refused while the conversation was
    // open, naming the field.
    assert_eq!(seen.len(), 2);
    let refusal = seen[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .to_string();
    assert!(
        refusal.contains("rejected") && refusal.contains("field `id` must be string"),
        "{refusal}"
    );
    // The model was shown the fields, and the verdict schema asks for them.
    let first = seen[0].body.to_string();
    assert!(first.contains(r#"\"fields\""#), "{first}");
    let tools = seen[0].body["tools"].as_array().unwrap();
    let params = &tools
        .iter()
        .find(|t| t["function"]["name"] == "submit_verdict")
        .unwrap()["function"]["parameters"];
    let value = &params["properties"]["outputs"]["properties"]["value"];
    assert_eq!(value["properties"]["id"]["type"], "string", "{value}");
    assert_eq!(value["required"], json!(["id"]), "{value}");
}

/// A server that answers one request with an endless body (no content-length) and
/// counts the bytes the client took before hanging up.
fn endless_body_server() -> (String, std::sync::mpsc::Receiver<u64>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        let _ = reader.read_exact(&mut body);
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{{\"choices\": [\"",
        );
        // 400 MB unless the client stops reading first.
        let chunk = vec![b'a'; 64 << 10];
        let mut sent = 0u64;
        while sent < 400_000_000 && stream.write_all(&chunk).is_ok() {
            sent += chunk.len() as u64;
        }
        let _ = tx.send(sent);
    });
    (url, rx)
}

#[tokio::test]
async fn an_endless_reply_body_is_refused_at_the_cap_not_buffered() {
    let (url, sent) = endless_body_server();
    let sup = LlmSupervisor::new(config(&url)).unwrap();
    let d = sup
        .decide(
            &escalation(&[Skip, Fail], false, vec![]),
            &DecideCtx::detached(),
        )
        .await
        .unwrap();
    assert_eq!(
        (d.verdict.action(), d.decided_by),
        (Fail, DecidedBy::Bounds)
    );
    let reason = d.verdict.reason().unwrap();
    assert!(
        reason.contains(&format!(
            "larger than {} bytes",
            heddle_supervisor::MAX_RESPONSE_BYTES
        )),
        "{reason}"
    );
    drop(sup);
    // The client hung up long before the 400 MB were written (the socket buffers hold
    // a few MiB at most beyond what was read). Waited for off the runtime thread, which
    // must stay free to close the connection.
    let sent = tokio::task::spawn_blocking(move || sent.recv().unwrap())
        .await
        .unwrap();
    assert!(sent < 100_000_000, "the server wrote {sent} bytes");
}

#[tokio::test]
async fn a_reply_announcing_a_huge_body_is_refused_unread() {
    let huge = " ".repeat(heddle_supervisor::MAX_RESPONSE_BYTES + 1);
    let srv = server(vec![Reply::Raw(200, Box::leak(huge.into_boxed_str()))]).await;
    let sup = LlmSupervisor::new(config(&srv.url)).unwrap();
    let d = sup
        .decide(
            &escalation(&[Skip, Fail], false, vec![]),
            &DecideCtx::detached(),
        )
        .await
        .unwrap();
    let reason = d.verdict.reason().unwrap();
    assert!(reason.contains("refused unread"), "{reason}");
}

#[tokio::test]
async fn a_timed_out_call_says_it_timed_out() {
    let srv = server(vec![Reply::Hang]).await;
    let mut cfg = config(&srv.url);
    cfg.request_timeout = std::time::Duration::from_millis(300);
    let sup = LlmSupervisor::new(cfg).unwrap();
    let d = sup
        .decide(
            &escalation(&[Skip, Fail], false, vec![]),
            &DecideCtx::detached(),
        )
        .await
        .unwrap();
    assert_eq!(d.decided_by, DecidedBy::Bounds);
    let reason = d.verdict.reason().unwrap();
    assert!(
        reason.contains("timed out after 300ms") && reason.contains("/v1/chat/completions"),
        "{reason}"
    );
}
