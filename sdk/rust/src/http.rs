//! Outgoing HTTP from a node (feature `http`), through the host's `wasi:http`.
//!
//! The host lets a request out only to destinations the operator granted the package
//! (`network = [...]` under `[packages.NAME]` in heddle.toml), checks every request (a
//! redirect is a new request: [`Request::send`] follows up to [`Request::redirects`] of
//! them, each judged again), caps bodies and time, and adds the headers the operator
//! attached to a destination (an API key) without the node ever seeing them. A
//! refused request is an [`HttpError`] of kind [`HttpErrorKind::Denied`]; the node's log
//! says which grant would allow it.
//!
//! ```ignore
//! use heddle_sdk::http::Request;
//! let resp = Request::get("https://api.example.com/v1/items")
//!     .header("accept", "application/json")
//!     .send()?;                       // an HttpError becomes a node Error (`http:*`)
//! let items: serde_json::Value = resp.json()?;
//! ```
//!
//! Large bodies: [`Request::send_streaming`] hands the body over in chunks
//! ([`StreamingResponse::next_chunk`]) instead of holding it whole.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingResponse, Method as WasiMethod, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::{InputStream, StreamError};

use crate::Error;

/// The raw `wasi:http` bindings, for what [`Request`] does not express (a body streamed
/// without a declared length, trailers).
pub use wasip2;

/// Redirects [`Request::send`] follows by default (each a new request the host judges).
pub const DEFAULT_REDIRECTS: u32 = 5;
/// Bytes written to the host per call (`wasi:io` accepts at most 4096 at once).
const WRITE_CHUNK: usize = 4096;

/// What went wrong with a request, coarsely: what a node's failure signature says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpErrorKind {
    /// The host refused it: the destination is not granted, its address is private, the
    /// request sets a header the host injects, … (the node's log says which).
    Denied,
    /// Too many requests of this invocation in flight at once.
    TooMany,
    /// A timeout (connecting, first byte, between bytes, the request's total).
    Timeout,
    /// The name did not resolve.
    Dns,
    /// No connection (refused, reset, unreachable).
    Connect,
    /// The TLS handshake failed (an unknown certificate authority, a name mismatch).
    Tls,
    /// A body over the host's limit (`max_http_body_bytes`).
    BodyTooLarge,
    /// A malformed request (URL, method, header).
    Request,
    /// Anything else the protocol or the host reported.
    Protocol,
}

impl HttpErrorKind {
    /// The failure signature (`http:denied`, `http:timeout`, …).
    pub fn signature(self) -> &'static str {
        match self {
            HttpErrorKind::Denied => "http:denied",
            HttpErrorKind::TooMany => "http:too-many",
            HttpErrorKind::Timeout => "http:timeout",
            HttpErrorKind::Dns => "http:dns",
            HttpErrorKind::Connect => "http:connect",
            HttpErrorKind::Tls => "http:tls",
            HttpErrorKind::BodyTooLarge => "http:body-too-large",
            HttpErrorKind::Request => "http:request",
            HttpErrorKind::Protocol => "http:protocol",
        }
    }
}

/// A failed request.
#[derive(Clone, Debug)]
pub struct HttpError {
    pub kind: HttpErrorKind,
    pub message: String,
}

impl HttpError {
    fn new(kind: HttpErrorKind, message: impl Into<String>) -> Self {
        HttpError {
            kind,
            message: message.into(),
        }
    }

    fn code(url: &str, code: &ErrorCode) -> Self {
        use HttpErrorKind as K;
        let (kind, what) = match code {
            ErrorCode::HttpRequestDenied => (
                K::Denied,
                "the host refused the request (see the node's log for the grant that would allow it)".to_string(),
            ),
            ErrorCode::DestinationIpProhibited => (
                K::Denied,
                "the host refused the address the name resolved to (see the node's log)".to_string(),
            ),
            ErrorCode::ConfigurationError => (
                K::Denied,
                "the host's network configuration for this destination is incomplete (see the node's log)".to_string(),
            ),
            ErrorCode::ConnectionLimitReached => (
                K::TooMany,
                "too many requests of this invocation in flight".to_string(),
            ),
            ErrorCode::DnsTimeout
            | ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout => (K::Timeout, format!("timed out ({code:?})")),
            ErrorCode::DnsError(e) => (
                K::Dns,
                format!(
                    "the name did not resolve{}",
                    e.rcode.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
                ),
            ),
            ErrorCode::DestinationNotFound => (K::Dns, "the name did not resolve".to_string()),
            ErrorCode::ConnectionRefused
            | ErrorCode::ConnectionTerminated
            | ErrorCode::DestinationUnavailable
            | ErrorCode::DestinationIpUnroutable => (K::Connect, format!("no connection ({code:?})")),
            ErrorCode::TlsProtocolError
            | ErrorCode::TlsCertificateError
            | ErrorCode::TlsAlertReceived(_) => (K::Tls, format!("TLS failed ({code:?})")),
            ErrorCode::HttpRequestBodySize(_) | ErrorCode::HttpResponseBodySize(_) => (
                K::BodyTooLarge,
                format!("a body over the host's limit ({code:?}; `max_http_body_bytes` in [wasm])"),
            ),
            ErrorCode::HttpRequestMethodInvalid
            | ErrorCode::HttpRequestUriInvalid
            | ErrorCode::HttpRequestUriTooLong
            | ErrorCode::HttpRequestHeaderSectionSize(_)
            | ErrorCode::HttpRequestHeaderSize(_) => {
                (K::Request, format!("malformed request ({code:?})"))
            }
            ErrorCode::InternalError(Some(m)) => (K::Protocol, m.clone()),
            other => (K::Protocol, format!("{other:?}")),
        };
        HttpError::new(kind, format!("request to {}: {what}", shown(url)))
    }

    /// The failure signature (`http:denied`, `http:timeout`, …).
    pub fn signature(&self) -> &'static str {
        self.kind.signature()
    }
}

// No `Display`: the SDK turns anything displayable into an `Error` with its text alone,
// and an `HttpError` must keep its signature (`?` in a node uses this).
impl From<HttpError> for Error {
    fn from(e: HttpError) -> Error {
        Error::new(e.message).signature(e.kind.signature())
    }
}

/// A URL as messages show it: scheme, host and path, without the query (which may hold
/// a token the guest put there).
fn shown(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let mut s: String = url[..cut].chars().take(200).collect();
    if cut < url.len() {
        s.push_str("?…");
    }
    s
}

/// The parts of an absolute `http(s)://` URL.
struct Url {
    scheme: Scheme,
    authority: String,
    path_with_query: String,
}

fn parse_url(url: &str) -> Result<Url, HttpError> {
    let bad =
        |why: &str| HttpError::new(HttpErrorKind::Request, format!("URL {}: {why}", shown(url)));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("not absolute (scheme://host/path)"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        _ => return Err(bad("the scheme is not http or https")),
    };
    let rest = rest.split('#').next().unwrap_or("");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    let path_with_query = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    Ok(Url {
        scheme,
        authority: authority.to_string(),
        path_with_query,
    })
}

/// The methods a request may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Patch,
    Options,
    Other(String),
}

impl Method {
    /// The method named `s` (any case).
    pub fn parse(s: &str) -> Result<Method, HttpError> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "OPTIONS" => Method::Options,
            "" => return Err(HttpError::new(HttpErrorKind::Request, "empty method")),
            other if other.bytes().all(|b| b.is_ascii_alphabetic()) => {
                Method::Other(other.to_string())
            }
            other => {
                return Err(HttpError::new(
                    HttpErrorKind::Request,
                    format!("`{other}` is not an HTTP method"),
                ));
            }
        })
    }

    /// Whether repeating the request is harmless by the method's definition (GET, HEAD,
    /// OPTIONS): what makes a node that sends only these retry-safe.
    pub fn is_safe(&self) -> bool {
        matches!(self, Method::Get | Method::Head | Method::Options)
    }

    fn wasi(&self) -> WasiMethod {
        match self {
            Method::Get => WasiMethod::Get,
            Method::Head => WasiMethod::Head,
            Method::Post => WasiMethod::Post,
            Method::Put => WasiMethod::Put,
            Method::Delete => WasiMethod::Delete,
            Method::Patch => WasiMethod::Patch,
            Method::Options => WasiMethod::Options,
            Method::Other(m) => WasiMethod::Other(m.clone()),
        }
    }
}

/// An outgoing request, built fluently and sent with [`Request::send`].
#[derive(Clone, Debug)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
    redirects: u32,
    connect_timeout_ms: Option<u64>,
    first_byte_timeout_ms: Option<u64>,
    between_bytes_timeout_ms: Option<u64>,
}

impl Request {
    pub fn new(method: Method, url: &str) -> Request {
        Request {
            method,
            url: url.to_string(),
            headers: Vec::new(),
            body: None,
            redirects: DEFAULT_REDIRECTS,
            connect_timeout_ms: None,
            first_byte_timeout_ms: None,
            between_bytes_timeout_ms: None,
        }
    }

    pub fn get(url: &str) -> Request {
        Request::new(Method::Get, url)
    }

    pub fn post(url: &str) -> Request {
        Request::new(Method::Post, url)
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Adds a header (a second one of the same name adds a second value).
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Request {
        self.headers
            .push((name.to_ascii_lowercase(), value.as_ref().to_vec()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = Some(body.into());
        self
    }

    /// A JSON body, with `content-type: application/json` unless one was set.
    pub fn json(mut self, value: &serde_json::Value) -> Request {
        if !self.headers.iter().any(|(n, _)| n == "content-type") {
            self = self.header("content-type", "application/json");
        }
        self.body(value.to_string())
    }

    /// How many redirects [`Request::send`] follows (0: a 3xx response is returned as
    /// is). A redirect is a new request, judged by the host like the first; 303 (and
    /// 301/302 of a POST) continue as GET without the body, as browsers do.
    pub fn redirects(mut self, n: u32) -> Request {
        self.redirects = n;
        self
    }

    /// Timeouts of this request, in milliseconds; the host's own (`[wasm]`
    /// `http_connect_timeout_ms`, `http_timeout_ms`) and the node's deadline bound them.
    pub fn timeouts(
        mut self,
        connect_ms: Option<u64>,
        first_byte_ms: Option<u64>,
        between_bytes_ms: Option<u64>,
    ) -> Request {
        self.connect_timeout_ms = connect_ms;
        self.first_byte_timeout_ms = first_byte_ms;
        self.between_bytes_timeout_ms = between_bytes_ms;
        self
    }

    /// Sends the request, following redirects, and reads the whole response body.
    pub fn send(self) -> Result<Response, HttpError> {
        self.send_streaming()?.read_all()
    }

    /// Sends the request, following redirects, and returns as soon as the response's
    /// status and headers are in: the body is read in chunks.
    pub fn send_streaming(self) -> Result<StreamingResponse, HttpError> {
        let mut req = self;
        let mut left = req.redirects;
        loop {
            let resp = req.send_once()?;
            let location = resp
                .headers
                .iter()
                .find(|(n, _)| n == "location")
                .map(|(_, v)| v.clone());
            let redirect = matches!(resp.status, 301 | 302 | 303 | 307 | 308);
            match location {
                Some(loc) if redirect && left > 0 => {
                    left -= 1;
                    let status = resp.status;
                    let next = resolve(&req.url, &loc)?;
                    drop(resp);
                    req = req.redirected(next, status);
                }
                _ => return Ok(resp),
            }
        }
    }

    /// The request a redirect with status `status` to `url` continues as.
    fn redirected(mut self, url: String, status: u16) -> Request {
        let to_get = status == 303 || (matches!(status, 301 | 302) && self.method == Method::Post);
        if to_get && self.method != Method::Head {
            self.method = Method::Get;
            self.body = None;
            self.headers
                .retain(|(n, _)| n != "content-type" && n != "content-length");
        }
        // Credentials the guest set for one host never follow it to another.
        if host_of(&url) != host_of(&self.url) {
            self.headers
                .retain(|(n, _)| n != "authorization" && n != "cookie");
        }
        self.url = url;
        self
    }

    fn send_once(&self) -> Result<StreamingResponse, HttpError> {
        self.start()?.wait()
    }

    /// Sends the request (body included) and returns without waiting for the response:
    /// several started requests are in flight together (see [`send_all`]).
    pub fn start(&self) -> Result<Pending, HttpError> {
        let url = parse_url(&self.url)?;
        let bad_header = |n: &str| {
            HttpError::new(
                HttpErrorKind::Request,
                format!(
                    "request to {}: header `{n}` refused by the host",
                    shown(&self.url)
                ),
            )
        };
        let fields = Fields::new();
        for (n, v) in &self.headers {
            fields.append(n, v).map_err(|_| bad_header(n))?;
        }
        // A known length is sent as one (a chunked body is what many servers refuse).
        if let Some(body) = &self.body
            && !self.headers.iter().any(|(n, _)| n == "content-length")
        {
            let len = body.len().to_string();
            fields
                .append("content-length", len.as_bytes())
                .map_err(|_| bad_header("content-length"))?;
        }
        let request = OutgoingRequest::new(fields);
        let fail = |what: &str| {
            HttpError::new(
                HttpErrorKind::Request,
                format!("request to {}: {what}", shown(&self.url)),
            )
        };
        request
            .set_method(&self.method.wasi())
            .map_err(|_| fail("invalid method"))?;
        request
            .set_scheme(Some(&url.scheme))
            .map_err(|_| fail("invalid scheme"))?;
        request
            .set_authority(Some(url.authority.as_str()))
            .map_err(|_| fail("invalid host"))?;
        request
            .set_path_with_query(Some(url.path_with_query.as_str()))
            .map_err(|_| fail("invalid path"))?;
        let options = RequestOptions::new();
        let ms = |v: u64| v.saturating_mul(1_000_000);
        if let Some(t) = self.connect_timeout_ms {
            let _ = options.set_connect_timeout(Some(ms(t)));
        }
        if let Some(t) = self.first_byte_timeout_ms {
            let _ = options.set_first_byte_timeout(Some(ms(t)));
        }
        if let Some(t) = self.between_bytes_timeout_ms {
            let _ = options.set_between_bytes_timeout(Some(ms(t)));
        }
        // Without a body none is taken, so none is sent (not an empty chunked one).
        let out_body = match &self.body {
            Some(_) => Some(request.body().map_err(|_| fail("no body"))?),
            None => None,
        };
        // Sent first, written after: the host streams the body as it is written.
        let future = outgoing_handler::handle(request, Some(options))
            .map_err(|e| HttpError::code(&self.url, &e))?;
        if let (Some(out_body), Some(body)) = (out_body, &self.body) {
            {
                let stream = out_body.write().map_err(|_| fail("no body stream"))?;
                for chunk in body.chunks(WRITE_CHUNK) {
                    if let Err(e) = stream.blocking_write_and_flush(chunk) {
                        drop(stream);
                        return Err(self.stream_error(e, &future));
                    }
                }
            }
            OutgoingBody::finish(out_body, None).map_err(|e| HttpError::code(&self.url, &e))?;
        }
        Ok(Pending {
            url: self.url.clone(),
            future,
        })
    }

    /// What a failed body write means: the response future usually says why.
    fn stream_error(
        &self,
        e: StreamError,
        future: &outgoing_handler::FutureIncomingResponse,
    ) -> HttpError {
        future.subscribe().block();
        if let Some(Ok(Err(code))) = future.get() {
            return HttpError::code(&self.url, &code);
        }
        match e {
            StreamError::LastOperationFailed(err) => {
                match wasip2::http::types::http_error_code(&err) {
                    Some(code) => HttpError::code(&self.url, &code),
                    None => HttpError::new(HttpErrorKind::Protocol, err.to_debug_string()),
                }
            }
            StreamError::Closed => HttpError::new(
                HttpErrorKind::Protocol,
                format!("request to {}: the body stream closed", shown(&self.url)),
            ),
        }
    }
}

/// A request on its way: [`Pending::wait`] for its response.
pub struct Pending {
    url: String,
    future: outgoing_handler::FutureIncomingResponse,
}

impl Pending {
    /// Waits for the response's status and headers; the body is read in chunks.
    pub fn wait(self) -> Result<StreamingResponse, HttpError> {
        self.future.subscribe().block();
        let resp: IncomingResponse = match self.future.get() {
            Some(Ok(Ok(r))) => r,
            Some(Ok(Err(e))) => return Err(HttpError::code(&self.url, &e)),
            _ => {
                return Err(HttpError::new(
                    HttpErrorKind::Protocol,
                    format!("request to {}: the response was lost", shown(&self.url)),
                ));
            }
        };
        let fail = |what: &str| {
            HttpError::new(
                HttpErrorKind::Protocol,
                format!("request to {}: {what}", shown(&self.url)),
            )
        };
        let status = resp.status();
        let headers = resp
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| {
                (
                    n.to_ascii_lowercase(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect();
        let body = resp.consume().map_err(|_| fail("the body was taken"))?;
        let stream = body.stream().map_err(|_| fail("no body stream"))?;
        Ok(StreamingResponse {
            status,
            headers,
            url: self.url.clone(),
            stream: Some(stream),
            body: Some(body),
            _response: resp,
        })
    }
}

/// Sends every request at once (up to the host's `http_max_concurrent` in flight; one
/// more is refused with [`HttpErrorKind::TooMany`]) and reads the responses in order.
/// Redirects are not followed.
pub fn send_all(requests: &[Request]) -> Vec<Result<Response, HttpError>> {
    let started: Vec<Result<Pending, HttpError>> = requests.iter().map(Request::start).collect();
    started.into_iter().map(|p| p?.wait()?.read_all()).collect()
}

/// What a failed read of a response body was, from the host's text: wasmtime's
/// `wasi:http` hands body errors to the guest as an `io-error` without an `error-code`,
/// so its words (fixed by the host's version) are all there is to go by.
fn body_error_kind(text: &str) -> HttpErrorKind {
    let t = text.to_ascii_lowercase();
    if t.contains("body size exceeds limit") {
        HttpErrorKind::BodyTooLarge
    } else if t.contains("timeout") {
        HttpErrorKind::Timeout
    } else if t.contains("connection terminated") || t.contains("connection error") {
        HttpErrorKind::Connect
    } else {
        HttpErrorKind::Protocol
    }
}

/// The host of an absolute URL (lowercase), for comparing redirect targets.
fn host_of(url: &str) -> String {
    parse_url(url)
        .map(|u| u.authority.to_ascii_lowercase())
        .unwrap_or_default()
}

/// A redirect's target: `location` as is when absolute, else relative to `base`.
fn resolve(base: &str, location: &str) -> Result<String, HttpError> {
    let location = location.trim();
    if location.contains("://") {
        parse_url(location)?;
        return Ok(location.to_string());
    }
    let b = parse_url(base)?;
    let scheme = match b.scheme {
        Scheme::Http => "http",
        _ => "https",
    };
    if let Some(rest) = location.strip_prefix("//") {
        return Ok(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Ok(format!("{scheme}://{}{location}", b.authority));
    }
    let path = b.path_with_query.split('?').next().unwrap_or("/");
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    Ok(format!("{scheme}://{}{dir}{location}", b.authority))
}

/// The first value of header `name` (any case) among `headers` (names lowercase).
fn header_in<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

/// A response read whole.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Header names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The URL that answered (after redirects).
    pub url: String,
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header_in(&self.headers, name)
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<String, HttpError> {
        String::from_utf8(self.body.clone()).map_err(|_| {
            HttpError::new(
                HttpErrorKind::Protocol,
                format!("the response of {} is not UTF-8 text", shown(&self.url)),
            )
        })
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value, Error> {
        serde_json::from_slice(&self.body).map_err(|e| {
            Error::new(format!(
                "the response of {} is not JSON: {e}",
                shown(&self.url)
            ))
            .signature("json:parse")
        })
    }

    /// An error status (400 and above) as an error whose signature is `http:<status>`,
    /// so a policy can tell a 503 (retry) from a 404 (do not); the message carries the
    /// start of the body.
    pub fn error_for_status(self) -> Result<Response, Error> {
        if self.status < 400 {
            return Ok(self);
        }
        let excerpt: String = String::from_utf8_lossy(&self.body)
            .chars()
            .take(500)
            .collect();
        Err(Error::new(format!(
            "{} answered {}{}",
            shown(&self.url),
            self.status,
            if excerpt.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", excerpt.trim())
            }
        ))
        .signature(&format!("http:{}", self.status)))
    }
}

/// A response whose body is read in chunks.
pub struct StreamingResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub url: String,
    // Dropped in this order: a stream before its body, a body before its response.
    stream: Option<InputStream>,
    body: Option<IncomingBody>,
    _response: IncomingResponse,
}

impl StreamingResponse {
    /// The next chunk of the body (at most 64 KiB), `None` at its end.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        let Some(stream) = &self.stream else {
            return Ok(None);
        };
        loop {
            match stream.blocking_read(64 << 10) {
                Ok(bytes) if bytes.is_empty() => continue,
                Ok(bytes) => return Ok(Some(bytes)),
                Err(StreamError::Closed) => {
                    self.stream = None;
                    self.body = None;
                    return Ok(None);
                }
                Err(StreamError::LastOperationFailed(err)) => {
                    self.stream = None;
                    self.body = None;
                    return Err(match wasip2::http::types::http_error_code(&err) {
                        Some(code) => HttpError::code(&self.url, &code),
                        None => {
                            let text = err.to_debug_string();
                            HttpError::new(
                                body_error_kind(&text),
                                format!("reading the response of {}: {text}", shown(&self.url)),
                            )
                        }
                    });
                }
            }
        }
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header_in(&self.headers, name)
    }

    /// Reads the rest of the body.
    pub fn read_all(mut self) -> Result<Response, HttpError> {
        let mut body = Vec::new();
        while let Some(chunk) = self.next_chunk()? {
            body.extend_from_slice(&chunk);
        }
        Ok(Response {
            status: self.status,
            headers: std::mem::take(&mut self.headers),
            body,
            url: std::mem::take(&mut self.url),
        })
    }
}

impl Drop for StreamingResponse {
    fn drop(&mut self) {
        self.stream = None;
        self.body = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_what_wasi_http_wants() {
        let u = parse_url("https://API.example.com:8443/v1/items?q=1#frag").unwrap();
        assert_eq!(u.authority, "API.example.com:8443");
        assert_eq!(u.path_with_query, "/v1/items?q=1");
        assert_eq!(parse_url("http://a.com").unwrap().path_with_query, "/");
        assert_eq!(
            parse_url("http://a.com?x=1").unwrap().path_with_query,
            "/?x=1"
        );
        for bad in ["a.com/x", "ftp://a.com", "https:///x"] {
            assert_eq!(
                parse_url(bad).err().unwrap().kind,
                HttpErrorKind::Request,
                "{bad}"
            );
        }
    }

    #[test]
    fn redirects_resolve_against_the_request_and_drop_credentials_across_hosts() {
        let base = "https://a.com/v1/items?page=2";
        assert_eq!(resolve(base, "/login").unwrap(), "https://a.com/login");
        assert_eq!(resolve(base, "next").unwrap(), "https://a.com/v1/next");
        assert_eq!(resolve(base, "//b.com/x").unwrap(), "https://b.com/x");
        assert_eq!(resolve(base, "http://c.com/y").unwrap(), "http://c.com/y");
        let r = Request::post(base)
            .header("Authorization", "Bearer mine")
            .json(&serde_json::json!({"a": 1}))
            .redirected("https://b.com/z".into(), 303);
        assert_eq!(r.method, Method::Get);
        assert!(r.body.is_none());
        assert!(
            r.headers.iter().all(|(n, _)| n != "authorization"),
            "{:?}",
            r.headers
        );
        let r = Request::post(base)
            .header("Authorization", "Bearer mine")
            .body("x")
            .redirected("https://a.com/other".into(), 307);
        assert_eq!(r.method, Method::Post);
        assert!(r.headers.iter().any(|(n, _)| n == "authorization"));
    }

    #[test]
    fn methods_and_failures_name_themselves() {
        assert!(Method::parse("get").unwrap().is_safe());
        assert!(!Method::parse("POST").unwrap().is_safe());
        assert!(Method::parse("GE T").is_err());
        assert_eq!(
            body_error_kind("HTTP response body size exceeds limit: 100001 bytes"),
            HttpErrorKind::BodyTooLarge
        );
        assert_eq!(
            body_error_kind("HTTP response timeout"),
            HttpErrorKind::Timeout
        );
        for k in [
            HttpErrorKind::Denied,
            HttpErrorKind::TooMany,
            HttpErrorKind::Timeout,
            HttpErrorKind::Dns,
            HttpErrorKind::Connect,
            HttpErrorKind::Tls,
            HttpErrorKind::BodyTooLarge,
            HttpErrorKind::Request,
            HttpErrorKind::Protocol,
        ] {
            assert!(crate::check_signature(k.signature()).is_ok(), "{k:?}");
        }
    }
}
