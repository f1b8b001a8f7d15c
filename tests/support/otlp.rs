//! An OTLP/HTTP trace receiver on a loopback port, as a collector would be: `POST
//! /v1/traces` decoded with `opentelemetry-proto`'s `ExportTraceServiceRequest`, every
//! span kept, flattened for assertions. It can answer slowly, to play an endpoint that
//! does not keep up.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use serde_json::Value;

/// One span as received.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent: String,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: BTreeMap<String, Value>,
    pub events: Vec<(String, BTreeMap<String, Value>)>,
    /// 0 unset, 1 ok, 2 error.
    pub status: i32,
    pub status_message: String,
    /// The resource it came with (`service.name`, `process.pid`…).
    pub resource: BTreeMap<String, Value>,
}

impl Span {
    pub fn str(&self, k: &str) -> &str {
        self.attrs.get(k).and_then(|v| v.as_str()).unwrap_or("")
    }

    pub fn int(&self, k: &str) -> Option<i64> {
        self.attrs.get(k).and_then(|v| v.as_i64())
    }

    /// Everything the span carries as one text (to look for a secret anywhere).
    pub fn text(&self) -> String {
        format!("{self:?}")
    }
}

#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<Span>>,
    requests: Mutex<u64>,
    gzipped: Mutex<u64>,
    delay: Option<Duration>,
}

pub struct Receiver {
    /// The base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub url: String,
    shared: Arc<Shared>,
    _rt: tokio::runtime::Runtime,
}

impl Receiver {
    pub fn start() -> Receiver {
        Self::with_delay(None)
    }

    /// A receiver that answers each request only after `delay`.
    pub fn slow(delay: Duration) -> Receiver {
        Self::with_delay(Some(delay))
    }

    fn with_delay(delay: Option<Duration>) -> Receiver {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let shared = Arc::new(Shared {
            delay,
            ..Shared::default()
        });
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(shared.clone());
        rt.spawn(async move { axum::serve(listener, app).await });
        Receiver {
            url,
            shared,
            _rt: rt,
        }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.shared.spans.lock().unwrap().clone()
    }

    pub fn requests(&self) -> u64 {
        *self.shared.requests.lock().unwrap()
    }

    /// Requests that came gzip-compressed.
    pub fn gzipped(&self) -> u64 {
        *self.shared.gzipped.lock().unwrap()
    }

    /// The spans once `done` holds for them, polled for at most 30 s (a bound, not a
    /// timing claim: a failure prints what came).
    #[track_caller]
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        for _ in 0..300 {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what}: never came; received:\n{:#?}", self.spans());
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    *shared.requests.lock().unwrap() += 1;
    // A gzip-compressed body is read as a collector reads it (and counted).
    let body = if headers
        .get(axum::http::header::CONTENT_ENCODING)
        .is_some_and(|v| v == "gzip")
    {
        *shared.gzipped.lock().unwrap() += 1;
        let mut plain = Vec::new();
        if let Err(e) =
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut plain)
        {
            return (StatusCode::BAD_REQUEST, e.to_string().into_bytes());
        }
        Bytes::from(plain)
    } else {
        body
    };
    if let Some(d) = shared.delay {
        tokio::time::sleep(d).await;
    }
    let req = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
    };
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let resource = rs
            .resource
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let status = s.status.unwrap_or_default();
                out.push(Span {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name,
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                    attrs: attrs(&s.attributes),
                    events: s
                        .events
                        .into_iter()
                        .map(|e| (e.name, attrs(&e.attributes)))
                        .collect(),
                    status: status.code,
                    status_message: status.message,
                    resource: resource.clone(),
                });
            }
        }
    }
    shared.spans.lock().unwrap().extend(out);
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value(kv.value.as_ref())))
        .collect()
}

fn value(v: Option<&AnyValue>) -> Value {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Value::from(s.clone()),
        Some(any_value::Value::BoolValue(b)) => Value::from(*b),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(f)) => Value::from(*f),
        Some(other) => Value::from(format!("{other:?}")),
        None => Value::Null,
    }
}

/// `spans` as a tree, children under their parent by start time: one line per span with
/// its name, duration and `heddle.*` attributes (what a trace viewer shows).
pub fn tree(spans: &[Span]) -> String {
    let mut sorted: Vec<&Span> = spans.iter().collect();
    sorted.sort_by_key(|s| (s.start_ns, s.end_ns));
    let ids: std::collections::BTreeSet<&str> = sorted.iter().map(|s| s.span_id.as_str()).collect();
    let mut out = String::new();
    fn walk(out: &mut String, all: &[&Span], s: &Span, depth: usize) {
        let attrs: Vec<String> = s
            .attrs
            .iter()
            .filter(|(k, _)| k.starts_with("heddle.") && *k != "heddle.run.id")
            .map(|(k, v)| match v {
                Value::String(t) => format!("{k}={t}"),
                other => format!("{k}={other}"),
            })
            .collect();
        let events: Vec<&str> = s.events.iter().map(|(n, _)| n.as_str()).collect();
        out.push_str(&format!(
            "{:indent$}{} {} {:.3} ms{}{}  {}\n",
            "",
            s.name,
            s.span_id,
            (s.end_ns.saturating_sub(s.start_ns)) as f64 / 1e6,
            if s.status == 2 { " ERROR" } else { "" },
            if events.is_empty() {
                String::new()
            } else {
                format!(" events {events:?}")
            },
            attrs.join(" "),
            indent = depth * 2
        ));
        for c in all.iter().filter(|c| c.parent == s.span_id) {
            walk(out, all, c, depth + 1);
        }
    }
    for root in sorted.iter().filter(|s| !ids.contains(s.parent.as_str())) {
        if !root.parent.is_empty() {
            out.push_str(&format!("(under the caller's span {})\n", root.parent));
        }
        out.push_str(&format!("trace {}\n", root.trace_id));
        walk(&mut out, &sorted, root, 1);
    }
    out
}
