//! What every route shares: the state (the host and the token), the refusal every
//! handler answers with, and the request-body parser. A leaf, so the route modules and
//! the router import it without importing each other.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use heddle_store::StoreError;
use serde_json::json;

use crate::host::Host;
use crate::token::Token;

#[derive(Clone)]
pub struct Api {
    pub host: Arc<Host>,
    pub(super) token: Arc<Token>,
}

/// A refusal: its status and a JSON body with `error` and whatever else explains it.
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) body: serde_json::Value,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: json!({ "error": heddle_core::text::bounded(&message.into()) }),
        }
    }

    /// Adds `key` to the refusal's body (what the client needs to correct itself).
    pub fn with(mut self, key: &str, value: serde_json::Value) -> ApiError {
        self.body[key] = value;
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// An error and its causes on one line, as the command line prints them.
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    heddle_core::text::error_chain(e)
}

/// The status for a store refusal: a run that is not there (404) or not in a state
/// for the request (409), a store this server no longer owns (503).
pub(super) fn status_of(e: &StoreError) -> StatusCode {
    match e {
        StoreError::UnknownRun(_) => StatusCode::NOT_FOUND,
        StoreError::Owned { .. } | StoreError::LeaseLost { .. } => StatusCode::SERVICE_UNAVAILABLE,
        StoreError::PackageChanged { .. } => StatusCode::CONFLICT,
        e if e.is_bad_request() => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::new(status_of(&e), driven_here(&e).unwrap_or_else(|| chain(&e)))
    }
}

/// What to say of a run found live in this very process: this server drives it (the
/// store names its owner by process id, which would be the server's own).
fn driven_here(e: &StoreError) -> Option<String> {
    match e {
        StoreError::Live { run, pid } if *pid == std::process::id() => Some(format!(
            "run {run} is running: this server drives it; wait for it to pause or end, or cancel it (POST /api/runs/{run}/cancel)"
        )),
        _ => None,
    }
}

impl From<heddle_runtime::Error> for ApiError {
    fn from(e: heddle_runtime::Error) -> ApiError {
        use heddle_runtime::Error as E;
        let status = match &e {
            E::Store(s) => status_of(s),
            // A watchdog holds the run.
            E::Lock(_) => StatusCode::CONFLICT,
            // An answer to a pause the run does not hold.
            E::Reconcile(r) if r.is_conflict() => StatusCode::CONFLICT,
            E::Reconcile(_) => StatusCode::UNPROCESSABLE_ENTITY,
            // The request or the stored run it names cannot be taken as asked.
            E::Refused(_)
            | E::Config(_)
            | E::SecretInput(_)
            | E::Graph(_)
            | E::Plan { .. }
            | E::Policy(_)
            | E::PolicyFile(_)
            | E::Replay(_) => StatusCode::UNPROCESSABLE_ENTITY,
            // A package the run pinned could not be fetched from its registry: the
            // upstream failed, not this server nor the request.
            E::RunPackage { .. } => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let said = match &e {
            E::Store(s) => driven_here(s),
            _ => None,
        };
        ApiError::new(status, said.unwrap_or_else(|| chain(&e)))
    }
}

pub fn body_error(r: BytesRejection) -> ApiError {
    ApiError::new(r.status(), r.body_text())
}

pub fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(body_error)?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("request body: {e}"),
        )
    })
}
