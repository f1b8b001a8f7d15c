//! Outgoing HTTP the way a guest may abuse it: many requests at once, a request left in
//! flight when the node returns.

use heddle_sdk::http::{Request, send_all};
use heddle_sdk::{Error, node};

node! {
    /// Fire `n` GETs at `url` at once and report each outcome (a status, or the error's
    /// signature), in order.
    #[node("hostile.http_burst")]
    pub fn http_burst(url: String, n: i64 = 4i64) -> outcomes: Vec<String> {
        let reqs: Vec<Request> = (0..n).map(|_| Request::get(&url)).collect();
        Ok(send_all(&reqs)
            .into_iter()
            .map(|r| match r {
                Ok(resp) => resp.status.to_string(),
                Err(e) => e.signature().to_string(),
            })
            .collect())
    }
}

node! {
    /// GET `url`, and return once its headers are in, its body still arriving, without
    /// reading or dropping it.
    #[node("hostile.http_leak")]
    pub fn http_leak(url: String) -> status: i64 {
        let resp = Request::get(&url).send_streaming()?;
        let status = i64::from(resp.status);
        std::mem::forget(resp);
        Ok(status)
    }
}

node! {
    /// POST `bytes` zero bytes to `url` (its work per byte is the host's, not its own:
    /// the buffer is one allocation, written in 4 KiB host calls); with `declare` false
    /// the body goes without a content-length, streamed.
    #[node("hostile.http_upload")]
    pub fn http_upload(url: String, bytes: i64 = 0i64, declare: bool = true) -> status: i64 {
        let body = vec![0u8; bytes.max(0) as usize];
        if declare {
            let resp = Request::post(&url).body(body).send()?;
            return Ok(i64::from(resp.status));
        }
        streamed(&url, &body).map_err(|e| Error::new(e.clone()).signature(&e))
    }
}

/// A POST of `body` to `url` (http://127.0.0.1:PORT/PATH) without a declared length;
/// `Err` is the failure's signature.
fn streamed(url: &str, body: &[u8]) -> Result<i64, String> {
    use heddle_sdk::http::wasip2::http::outgoing_handler;
    use heddle_sdk::http::wasip2::http::types::{
        ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme,
    };
    let rest = url.strip_prefix("http://").ok_or("http:request")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let req = OutgoingRequest::new(Fields::new());
    let _ = req.set_method(&Method::Post);
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some(authority));
    let _ = req.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
    let out = req.body().map_err(|_| "http:request")?;
    let future = outgoing_handler::handle(req, None).map_err(|_| "http:denied")?;
    let code = |e: ErrorCode| match e {
        ErrorCode::HttpRequestBodySize(_) => "http:body-too-large".to_string(),
        _ => "http:other".to_string(),
    };
    let written = {
        let stream = out.write().map_err(|_| "http:request")?;
        body.chunks(4096)
            .try_for_each(|c| stream.blocking_write_and_flush(c))
            .is_ok()
    };
    if written {
        let _ = OutgoingBody::finish(out, None);
    }
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(resp))) => Ok(i64::from(resp.status())),
        Some(Ok(Err(e))) => Err(code(e)),
        _ => Err("http:protocol".into()),
    }
}
