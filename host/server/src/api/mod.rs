//! The HTTP API (JSON): runs created, listed, shown, cancelled and resumed, each run's
//! records as Server-Sent Events, gates and escalations answered. Every request but
//! one for the viewer's files carries the bearer token, checked before anything else
//! (an unknown path without it is 401, not 404); a body declared over the limit is
//! refused before it is read; every error, whoever made it (a handler, the router's
//! 404 and 405, an extractor's rejection), has a JSON body `{"error": ...}`. A refused
//! request (400, 401, 404, 405, 409, 413, 422) changes nothing.

pub(crate) mod escalations;
mod hosts;
mod runs;
pub(crate) mod state;

pub use runs::ARTIFACT_CHUNK;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;

use crate::host::Host;
use crate::token::Token;
use state::{Api, ApiError};

/// Largest request body taken (a graph document with its inputs).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// The whole HTTP surface of a server: the viewer's files, and every other path
/// through the API (behind the token, its JSON answers masked, an unknown path a JSON
/// 404), every answer through [`guard`]. Testable in-process with
/// `tower::ServiceExt::oneshot`.
pub fn router(host: Arc<Host>, token: Token) -> Router {
    router_bounded(host, token, crate::mask::MAX_MASKED_BODY)
}

/// [`router`] with another bound on the JSON answers it masks (a test's, to reach it
/// without writing 64 MiB): an answer over `max_json_bytes` is a 500, not sent.
pub fn router_bounded(host: Arc<Host>, token: Token, max_json_bytes: usize) -> Router {
    let api = Api {
        host,
        token: Arc::new(token),
    };
    let routes = Router::new()
        .merge(runs::routes())
        .merge(escalations::routes())
        .merge(hosts::routes())
        .route(
            "/metrics",
            axum::routing::get(|State(api): State<Api>| {
                crate::metrics::scrape(State(api.host.clone()))
            }),
        )
        .fallback(unknown)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            crate::mask::Masking {
                mask: api.host.mask.clone(),
                max_body: max_json_bytes,
            },
            crate::mask::responses,
        ))
        .layer(middleware::from_fn_with_state(api.clone(), admit))
        .with_state(api);
    // The page's files hold no data: the one thing answered without the token.
    guard(crate::viewer::router().fallback_service(routes))
}

/// The layers every answer goes through, outermost first: a handler that panics is
/// answered 500 with a JSON error (the connection and the server go on; the panic is
/// logged), and a body is compressed (zstd or gzip, as the request's `Accept-Encoding`
/// takes) unless it is the event stream, whose feed compresses each batch once for all
/// its subscribers (`crate::sse`), or already compressed, or too small to gain.
///
/// Innermost, an error answer that has no JSON body (the router's 405, an extractor's
/// plain-text rejection) is given one, so a client reads every error the same way.
pub fn guard(routes: Router) -> Router {
    routes
        .layer(middleware::from_fn(json_errors))
        .layer(CompressionLayer::new())
        .layer(CatchPanicLayer::custom(panicked))
}

/// The answer to a request whose handler panicked: the panic is a bug, logged with its
/// message; the client is told no more than that.
fn panicked(payload: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    tracing::error!("a request's handler panicked: {message}");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the server failed while answering this request (a bug; it is logged)",
    )
    .into_response()
}

/// A path no route has (after the token check: which paths exist is not told to a
/// client without it).
async fn unknown(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("{} {}: no such route", req.method(), req.uri().path()),
    )
}

/// Largest error body [`json_errors`] reads to quote (the router's and extractors'
/// rejections are one line).
const MAX_QUOTED_ERROR: usize = 4 << 10;

/// Gives an error answer without a JSON body one, `{"error": ...}`, quoting its text
/// (or saying what its status means when it has none), its other headers (a 405's
/// `Allow`) kept.
async fn json_errors(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&resp) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_QUOTED_ERROR)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no method");
        format!("{method} {path}: method not allowed (this path takes {allow})")
    } else if text.is_empty() {
        format!(
            "{method} {path}: {}",
            status.canonical_reason().unwrap_or("refused")
        )
    } else {
        format!("{method} {path}: {text}")
    };
    let json = ApiError::new(status, message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.extend(json.headers().clone());
    Response::from_parts(parts, json.into_body())
}

/// Whether `resp` says its body is JSON.
pub(crate) fn is_json(resp: &Response) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// What every API request passes before it is routed: `Authorization: Bearer TOKEN`
/// (else 401), then a declared body length within [`MAX_BODY_BYTES`] (else 413 at
/// once: the body is never waited for, so a client that declares more than it sends
/// does not hold the connection).
async fn admit(State(api): State<Api>, req: Request, next: Next) -> Response {
    if !authorized(&api, &req) {
        return unauthorized();
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > MAX_BODY_BYTES as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body: Content-Length {n} is over the limit of {MAX_BODY_BYTES} bytes; nothing was read"
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// Whether the request carries `Authorization: Bearer TOKEN`.
fn authorized(api: &Api, req: &Request) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| api.token.matches(t.trim()))
}

/// The answer to a request without the right token.
fn unauthorized() -> Response {
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token (Authorization: Bearer TOKEN; the token is in serve.token beside the run store)",
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}
