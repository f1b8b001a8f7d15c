//! A run created through the API chooses its own supervisor: a policy document, or the
//! LLM agent with a model and endpoint among those the operator permits (`[serve]
//! supervisor_models`, `supervisor_endpoints`). The choice is recorded with the run, so
//! whoever drives it on supervises it the same way. A choice the operator did not
//! permit, or one given half, is refused before anything is written.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use heddle_store::SuperviseMode;
use serde_json::{Value, json};

use crate::support::*;

crate::on_both_stores!(
    a_run_created_with_a_policy_is_decided_by_it_and_records_it,
    a_run_created_with_the_llm_agent_asks_the_permitted_model_and_records_it,
    a_supervisor_the_operator_did_not_permit_or_given_half_is_refused_writing_nothing,
);

/// Reads `/data/ready.txt`, which no test writes: `read` fails every time.
const READ: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/ready.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

const SKIP_READ: &str = "[[rule]]\nname = \"no file yet\"\nnode = \"read\"\nverdict = \"skip\"\n";

/// What the run recorded as its supervisor.
fn recorded(s: &TestServer, id: &str) -> Option<SuperviseMode> {
    s.store().header(id).unwrap().run.limits.supervise
}

/// The run's verdict records (`verdict` events), as the event stream gives them.
async fn verdicts(s: &TestServer, id: &str) -> Vec<Value> {
    s.events(id, None)
        .await
        .into_iter()
        .filter(|(_, kind, _)| kind == "verdict")
        .map(|(_, _, data)| data)
        .collect()
}

async fn a_run_created_with_a_policy_is_decided_by_it_and_records_it(store: Store) {
    // The server's own default is no supervision: the request's choice wins.
    let s = TestServer::on(store).await;
    let body = json!({"graph": graph(READ), "supervise": "policy", "policy": SKIP_READ});
    let (status, created) = s.call("POST", "/api/runs", Some(body)).await;
    assert_eq!(status, 201, "{created:#}");
    let id = created["run_id"].as_str().unwrap().to_string();
    let show = s.ended(&id).await;
    assert_eq!(
        show["state"], "completed",
        "the policy skipped `read`: {show:#}"
    );
    let v = verdicts(&s, &id).await;
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0]["verdict"]["verdict"], "skip", "{v:#?}");
    // Decided by the policy's rule: its default is to fail.
    assert_eq!(v[0]["decided_by"], "supervisor", "{v:#?}");
    assert_eq!(
        recorded(&s, &id),
        Some(SuperviseMode::Policy {
            document: SKIP_READ.into()
        }),
        "recorded whole, for whoever drives the run on"
    );
}

/// The requests an endpoint was sent: path and body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A scripted OpenAI-compatible endpoint on a real socket: every chat completion it is
/// asked for calls `submit_verdict` with `skip`; it keeps the requests' model and path.
async fn chat_endpoint() -> (String, Seen) {
    use axum::routing::post;
    let seen = Seen::default();
    async fn complete(
        State(seen): State<Seen>,
        uri: axum::http::Uri,
        Json(req): Json<Value>,
    ) -> Json<Value> {
        seen.lock().unwrap().push((uri.path().to_string(), req));
        Json(json!({
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
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "submit_verdict",
                            "arguments": "{\"action\":\"skip\",\"reason\":\"the file comes later\"}"
                        }
                    }]
                }
            }],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        }))
    }
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(complete))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), seen)
}

/// The operator's settings for the LLM supervisor: `endpoint` is the configured one and
/// the only permitted one, with one permitted model that has a price.
fn llm_config(endpoint: &str) -> &'static str {
    let text = format!(
        r#"
[supervisor]
endpoint = "{endpoint}"
model = "test-model"

[supervisor.pricing."test-model"]
input_per_mtok = 1.0
output_per_mtok = 1.0

[supervisor.pricing."other-model"]
input_per_mtok = 1.0
output_per_mtok = 1.0

[serve]
supervisor_models = ["test-model"]
supervisor_endpoints = ["{endpoint}"]
"#
    );
    // One per test server, which lives as long as the test.
    Box::leak(text.into_boxed_str())
}

async fn a_run_created_with_the_llm_agent_asks_the_permitted_model_and_records_it(store: Store) {
    let (url, seen) = chat_endpoint().await;
    let s = TestServer::with(Setup {
        store,
        config: llm_config(&url),
        ..Setup::default()
    })
    .await;
    let body = json!({
        "graph": graph(READ),
        "supervise": "llm",
        "llm": {"model": "test-model", "endpoint": url},
    });
    let (status, created) = s.call("POST", "/api/runs", Some(body)).await;
    assert_eq!(status, 201, "{created:#}");
    let id = created["run_id"].as_str().unwrap().to_string();
    let show = s.ended(&id).await;
    assert_eq!(
        show["state"], "completed",
        "the agent skipped `read`: {show:#}"
    );
    let v = verdicts(&s, &id).await;
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0]["verdict"]["verdict"], "skip", "{v:#?}");
    let asked = seen.lock().unwrap().clone();
    assert!(!asked.is_empty());
    for (path, req) in &asked {
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(req["model"], "test-model", "{req:#}");
    }
    assert_eq!(
        recorded(&s, &id),
        Some(SuperviseMode::Llm {
            model: Some("test-model".into()),
            endpoint: Some(url.clone()),
        })
    );
}

async fn a_supervisor_the_operator_did_not_permit_or_given_half_is_refused_writing_nothing(
    store: Store,
) {
    let (url, seen) = chat_endpoint().await;
    let s = TestServer::with(Setup {
        store,
        config: llm_config(&url),
        ..Setup::default()
    })
    .await;
    let g = graph(READ);
    let cases = [
        (
            json!({"graph": g, "supervise": "llm", "llm": {"endpoint": "http://127.0.0.1:9/v1"}}),
            "endpoint `http://127.0.0.1:9/v1` is not one this server permits",
        ),
        (
            json!({"graph": g, "supervise": "llm", "llm": {"model": "other-model"}}),
            "model `other-model` is not one this server permits (test-model)",
        ),
        (
            json!({"graph": g, "supervise": "policy"}),
            "needs `policy`: the policy document",
        ),
        (
            json!({"graph": g, "supervise": "interactive", "policy": SKIP_READ}),
            "`policy` is the document of \"supervise\": \"policy\"",
        ),
        (
            json!({"graph": g, "llm": {"model": "test-model"}}),
            "`llm` is the setting of \"supervise\": \"llm\"",
        ),
        (
            json!({"graph": g, "supervise": "policy", "policy": "[[rule]]\nverdict = \"explode\"\n"}),
            "explode",
        ),
        (
            json!({"graph": g, "supervise": "maybe"}),
            "unknown variant `maybe`",
        ),
    ];
    for (body, said) in cases {
        let (status, answer) = s.call("POST", "/api/runs", Some(body.clone())).await;
        assert!(
            status == 422 || status == 400,
            "{body}: {status} {answer:#}"
        );
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(said),
            "{body}: expected `{said}` in {answer:#}"
        );
    }
    assert_eq!(s.runs().await, Vec::<Value>::new(), "nothing was recorded");
    assert!(seen.lock().unwrap().is_empty(), "no endpoint was called");
}
