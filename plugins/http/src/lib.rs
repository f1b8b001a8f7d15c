//! The `http` package: call HTTP(S) services from a graph. The package has no authority
//! of its own: every request goes through the host, which lets it out only to the
//! destinations granted under `[packages.http] network` in heddle.toml, adds the
//! headers the operator attached to a destination (`network_auth`), and caps bodies and
//! time.
//!
//! Retry-safety is a property of a node type (a graph cannot change it), so the methods
//! that are safe to repeat have their own types: `http.get` and `http.get_json` (GET,
//! HEAD, OPTIONS) are retry-safe, `http.request` and `http.json` (any method) are not,
//! and a durable run writes their start ahead of the request, so a crash mid-request
//! pauses for reconciliation instead of sending it twice.

use std::collections::BTreeMap;

use heddle_sdk::http::{Method, Request, Response};
use heddle_sdk::{Bytes, Correlation, Decl, Error, Inputs, Node, Outputs, Value, emit};

/// The request described by a node's common inputs.
fn request(inputs: &mut Inputs, default_method: &str, safe_only: bool) -> Result<Request, Error> {
    let url: String = inputs.get("url")?;
    let method: String = inputs.get_or("method", default_method.to_string())?;
    let method = Method::parse(&method)?;
    if safe_only && !method.is_safe() {
        return Err(Error::new(format!(
            "method {method:?} is not one this retry-safe node sends (GET, HEAD, OPTIONS); use http.request or http.json, which are not retry-safe"
        ))
        .signature("http:method"));
    }
    let mut req = Request::new(method, &url);
    let headers: Option<BTreeMap<String, Value>> = inputs.get("headers")?;
    for (name, v) in headers.unwrap_or_default() {
        let value = match v {
            Value::Str(s) => s,
            Value::Null => continue,
            other => other.to_json().to_string(),
        };
        req = req.header(&name, value);
    }
    let redirects: i64 =
        inputs.get_or("redirects", i64::from(heddle_sdk::http::DEFAULT_REDIRECTS))?;
    if !(0..=20).contains(&redirects) {
        return Err(
            Error::new(format!("redirects = {redirects}: from 0 to 20")).signature("http:request")
        );
    }
    Ok(req.redirects(redirects as u32))
}

/// A raw body input: text or bytes.
fn raw_body(req: Request, inputs: &mut Inputs) -> Result<Request, Error> {
    Ok(match inputs.get::<Option<Value>>("body")? {
        None | Some(Value::Null) => req,
        Some(Value::Str(s)) => req.body(s),
        Some(Value::Bytes(b)) => req.body(b),
        Some(other) => req.json(&other.to_json()),
    })
}

fn header_object(headers: &[(String, String)]) -> BTreeMap<String, Value> {
    let mut out: BTreeMap<String, Value> = BTreeMap::new();
    for (n, v) in headers {
        match out.get_mut(n) {
            // Repeated headers join as HTTP folds them.
            Some(Value::Str(s)) => {
                s.push_str(", ");
                s.push_str(v);
            }
            _ => {
                out.insert(n.clone(), Value::Str(v.clone()));
            }
        }
    }
    out
}

/// The body as the output carries it: text when it is UTF-8, bytes otherwise.
fn body_value(body: Vec<u8>) -> Value {
    match String::from_utf8(body) {
        Ok(s) => Value::Str(s),
        Err(e) => Value::Bytes(e.into_bytes()),
    }
}

fn raw_outputs(resp: Response, fail_on_status: bool) -> Result<Outputs, Error> {
    let resp = if fail_on_status {
        resp.error_for_status()?
    } else {
        resp
    };
    Ok(Outputs::new()
        .with("status", i64::from(resp.status))
        .with("headers", header_object(&resp.headers))
        .with("body", body_value(resp.body)))
}

fn common(d: Decl, default_method: &str) -> Decl {
    d.input::<String>(
        "url",
        "Absolute URL (http:// or https://); only granted destinations are reachable",
    )
    .input_default::<String>("method", default_method.to_string(), "HTTP method")
    .input::<Option<BTreeMap<String, Value>>>("headers", "Request headers (name → value)")
    .input_default::<i64>(
        "redirects",
        5,
        "Redirects to follow, each a new request the host checks (0 to 20)",
    )
}

/// Any request, body and status as they are.
pub struct HttpRequest;

impl Node for HttpRequest {
    const TYPE: &'static str = "http.request";

    fn declare() -> Decl {
        common(Decl::new(Self::TYPE), "GET")
            .title("HTTP request")
            .description("Sends one HTTP request with any method and returns the status, headers and body (text when UTF-8, else bytes). Not retry-safe: for GET, HEAD and OPTIONS use http.get.")
            .input::<Option<Value>>("body", "Request body: text, bytes, or JSON (sent as application/json)")
            .input_default::<bool>("fail_on_status", false, "Fail on a status of 400 or more (signature http:<status>)")
            .output::<i64>("status", "Response status")
            .output::<BTreeMap<String, Value>>("headers", "Response headers (names lowercase)")
            .output::<Value>("body", "Response body: text when UTF-8, else bytes")
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let req = request(inputs, "GET", false)?;
        let req = raw_body(req, inputs)?;
        let fail: bool = inputs.get_or("fail_on_status", false)?;
        raw_outputs(req.send()?, fail)
    }
}

/// A safe request (GET, HEAD, OPTIONS): retry-safe.
pub struct HttpGet;

impl Node for HttpGet {
    const TYPE: &'static str = "http.get";

    fn declare() -> Decl {
        common(Decl::new(Self::TYPE), "GET")
            .title("HTTP GET")
            .description("Sends a GET (or HEAD, OPTIONS) request and returns the status, headers and body. Retry-safe: a policy may run it again.")
            .input_default::<bool>("fail_on_status", false, "Fail on a status of 400 or more (signature http:<status>)")
            .output::<i64>("status", "Response status")
            .output::<BTreeMap<String, Value>>("headers", "Response headers (names lowercase)")
            .output::<Value>("body", "Response body: text when UTF-8, else bytes")
            .retry_safe()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let req = request(inputs, "GET", true)?;
        let fail: bool = inputs.get_or("fail_on_status", false)?;
        raw_outputs(req.send()?, fail)
    }
}

fn json_call(inputs: &mut Inputs, safe_only: bool) -> Result<Outputs, Error> {
    let mut req = request(inputs, "GET", safe_only)?;
    if !safe_only && let Some(body) = inputs.get::<Option<serde_json::Value>>("body")? {
        req = req.json(&body);
    }
    let req = req.header("accept", "application/json");
    let resp = req.send()?.error_for_status()?;
    let value = if resp.body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Null
    } else {
        resp.json().map_err(|e| {
            e.candidate(
                "value",
                serde_json::Value::String(String::from_utf8_lossy(&resp.body).into_owned()),
            )
        })?
    };
    Ok(Outputs::new()
        .with("status", i64::from(resp.status))
        .with("headers", header_object(&resp.headers))
        .with("value", value))
}

fn json_decl(d: Decl) -> Decl {
    common(d, "GET")
        .output::<i64>("status", "Response status")
        .output::<BTreeMap<String, Value>>("headers", "Response headers (names lowercase)")
        .output::<serde_json::Value>("value", "The response body decoded (null when empty)")
}

/// A JSON API call with any method.
pub struct HttpJson;

impl Node for HttpJson {
    const TYPE: &'static str = "http.json";

    fn declare() -> Decl {
        json_decl(Decl::new(Self::TYPE))
            .title("HTTP JSON")
            .description("Sends `body` as JSON (when given) and decodes the JSON response. A status of 400 or more fails with signature http:<status> (a policy can retry 5xx); a body that is not JSON fails with json:parse, the text as candidate. Not retry-safe: for GET use http.get_json.")
            .input::<Option<serde_json::Value>>("body", "Request body, sent as application/json")
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        json_call(inputs, false)
    }
}

/// A JSON GET: retry-safe.
pub struct HttpGetJson;

impl Node for HttpGetJson {
    const TYPE: &'static str = "http.get_json";

    fn declare() -> Decl {
        json_decl(Decl::new(Self::TYPE))
            .title("HTTP GET JSON")
            .description("GETs (or HEADs) a JSON resource and decodes it. A status of 400 or more fails with signature http:<status>. Retry-safe.")
            .retry_safe()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        json_call(inputs, true)
    }
}

/// A response body streamed downstream as it arrives: chunks, or lines.
pub struct HttpStream;

impl Node for HttpStream {
    const TYPE: &'static str = "http.stream";

    fn declare() -> Decl {
        common(Decl::new(Self::TYPE), "GET")
            .title("HTTP stream")
            .description("Sends one request and streams the response body downstream as it arrives, never holding it whole: `chunk` values (bytes, mode \"chunks\") or one item per line (`line`, mode \"lines\": NDJSON, server-sent events, logs). A status of 400 or more fails (http:<status>) before anything is emitted. Not retry-safe.")
            .input::<Option<Value>>("body", "Request body: text, bytes, or JSON")
            .input_default::<String>("mode", "chunks".to_string(), "chunks | lines")
            .output_with::<Bytes>("chunk", Correlation::Chunk, "A piece of the body (mode chunks)")
            .output_with::<String>("line", Correlation::Iteration, "One line of the body (mode lines)")
            .output::<i64>("status", "Response status")
            .output::<BTreeMap<String, Value>>("headers", "Response headers (names lowercase)")
            .output::<i64>("bytes", "Body bytes received")
            .streaming_output()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let mode: String = inputs.get_or("mode", "chunks".to_string())?;
        let lines = match mode.as_str() {
            "chunks" => false,
            "lines" => true,
            other => {
                return Err(Error::new(format!("mode `{other}`: chunks or lines"))
                    .signature("http:request"));
            }
        };
        let req = request(inputs, "GET", false)?;
        let req = raw_body(req, inputs)?;
        let mut resp = req.send_streaming()?;
        if resp.status >= 400 {
            let mut excerpt = Vec::new();
            while excerpt.len() < 500 {
                match resp.next_chunk()? {
                    Some(c) => excerpt.extend_from_slice(&c),
                    None => break,
                }
            }
            let r = Response {
                status: resp.status,
                headers: resp.headers.clone(),
                body: excerpt,
                url: resp.url.clone(),
            };
            r.error_for_status()?;
        }
        let mut total = 0i64;
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.next_chunk()? {
            total += chunk.len() as i64;
            if !lines {
                emit("chunk", Bytes(chunk))?;
                continue;
            }
            pending.extend_from_slice(&chunk);
            while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 1]);
                emit("line", text.trim_end_matches('\r').to_string())?;
            }
        }
        if lines && !pending.is_empty() {
            emit("line", String::from_utf8_lossy(&pending).into_owned())?;
        }
        Ok(Outputs::new()
            .with("status", i64::from(resp.status))
            .with("headers", header_object(&resp.headers))
            .with("bytes", total))
    }
}

heddle_sdk::export_nodes!(HttpRequest, HttpGet, HttpJson, HttpGetJson, HttpStream);
