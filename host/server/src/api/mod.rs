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

use crate::host::Host;
use crate::token::Token;
use state::{Api, ApiError};

/// Largest request body taken (a graph document with its inputs).
pub const MAX_BODY_BYTES: usize = 4 << 20;

pub fn router(host: Arc<Host>, token: Token) -> Router {
    let api = Api {
        host,
        token: Arc::new(token),
    };
    Router::new()
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
        .with_state(api)
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
