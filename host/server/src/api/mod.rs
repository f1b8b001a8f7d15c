//! The HTTP API (JSON): runs created, listed, shown, cancelled and resumed, each run's
//! records as Server-Sent Events, gates and escalations answered. Every request carries
//! the bearer token; bodies are bounded. A refused request (401, 404, 409, 413, 422)
//! changes nothing.

mod escalations;
mod runs;
mod state;

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

/// The whole HTTP surface of a server: the API's routes (behind the token, their JSON
/// answers masked) and the viewer's files, every answer through [`guard`]. Testable
/// in-process with `tower::ServiceExt::oneshot`.
pub fn router(host: Arc<Host>, token: Token) -> Router {
    let api = Api {
        host,
        token: Arc::new(token),
    };
    let routes = Router::new()
        .merge(runs::routes())
        .merge(escalations::routes())
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            api.host.mask.clone(),
            crate::mask::responses,
        ))
        .layer(middleware::from_fn_with_state(api.clone(), authorize))
        // Added after the token check: the page's files hold no data.
        .merge(crate::viewer::router())
        .with_state(api);
    guard(routes)
}

/// The layers every answer goes through, outermost first: a handler that panics is
/// answered 500 with a JSON error (the connection and the server go on; the panic is
/// logged), and a body is compressed (zstd or gzip, as the request's `Accept-Encoding`
/// takes) unless it is the event stream, whose feed compresses each batch once for all
/// its subscribers (`crate::sse`), or already compressed, or too small to gain.
pub fn guard(routes: Router) -> Router {
    routes
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

/// Every route needs `Authorization: Bearer TOKEN`; anything else is 401 before the
/// body is read.
async fn authorize(State(api): State<Api>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if api.token.matches(t.trim()) => next.run(req).await,
        _ => {
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
    }
}
