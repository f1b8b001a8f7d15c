//! The HTTP API (JSON): runs created, listed, shown, cancelled and resumed, and each
//! run's records as Server-Sent Events. Every request carries the bearer token; bodies
//! are bounded. A refused request (401, 404, 409, 413, 422) changes nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use heddle_store::{StoreError, session};
use serde::Deserialize;
use serde_json::json;

use super::host::{CreateError, CreateOptions, Host};
use super::token::Token;
use crate::cli::Supervise;
use crate::durable;

/// Largest request body taken (a graph document with its inputs).
pub const MAX_BODY_BYTES: usize = 4 << 20;

#[derive(Clone)]
pub struct Api {
    pub host: Arc<Host>,
    token: Arc<Token>,
}

pub fn router(host: Arc<Host>, token: Token) -> Router {
    let api = Api {
        host,
        token: Arc::new(token),
    };
    Router::new()
        .route("/api/runs", get(list).post(create))
        .route("/api/runs/{id}", get(show))
        .route("/api/runs/{id}/cancel", post(cancel))
        .route("/api/runs/{id}/resume", post(resume))
        .route("/api/runs/{id}/events", get(events))
        .route("/api/runs/{id}/gates/{gate}/approve", post(approve))
        .route("/api/runs/{id}/gates/{gate}/reject", post(reject))
        .merge(super::escalations::routes())
        .route("/api/runs/{id}/artifacts/{sha256}", get(artifact))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            api.host.mask.clone(),
            super::mask::responses,
        ))
        .layer(middleware::from_fn_with_state(api.clone(), authorize))
        // Added after the token check: the page's files hold no data.
        .merge(super::viewer::router())
        .with_state(api)
}

/// A refusal: its status and a JSON body with `error` and whatever else explains it.
pub struct ApiError {
    status: StatusCode,
    body: serde_json::Value,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: json!({ "error": crate::exit::bounded(&message.into()) }),
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
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The status for a store refusal: a run that is not there (404) or not in a state
/// for the request (409), a store this server no longer owns (503).
fn status_of(e: &StoreError) -> StatusCode {
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
        ApiError::new(status_of(&e), chain(&e))
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        let locked = e.chain().any(|c| c.is::<heddle_store::lock::LockError>());
        let status = match e.chain().find_map(|c| c.downcast_ref::<StoreError>()) {
            Some(s) => status_of(s),
            // A watchdog holds the run.
            None if locked => StatusCode::CONFLICT,
            None if crate::exit::classify(&e) == crate::exit::Exit::Invalid => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            None => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, format!("{e:#}"))
    }
}

pub fn body_error(r: BytesRejection) -> ApiError {
    ApiError::new(r.status(), r.body_text())
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

async fn list(State(api): State<Api>) -> Result<Json<serde_json::Value>, ApiError> {
    let store = api.host.store.clone();
    let rows = tokio::task::spawn_blocking(move || durable::list_states(&*store))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let v: Vec<_> = rows
        .iter()
        .map(|(s, st)| durable::list_json(s, *st))
        .collect();
    Ok(Json(json!(v)))
}

async fn show(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let store = api.host.store.clone();
    let (header, _, view) = tokio::task::spawn_blocking(move || session::inspect(&*store, &id))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let mut v = durable::show_json(&header, &view);
    // The document as submitted, for the viewer to draw (its nodes' UI positions
    // included); stored bytes that are not JSON are left out, not an error.
    v["document"] = serde_json::from_slice(&header.run.graph_bytes).unwrap_or_default();
    Ok(Json(v))
}

/// A stored artifact's bytes (the viewer links large values to them).
async fn artifact(
    State(api): State<Api>,
    Path((id, sha256)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("artifact `{sha256}`: expected a sha256 digest (64 hex digits)"),
        ));
    }
    let store = api.host.store.clone();
    let want = heddle_store::artifacts::ArtifactRef {
        sha256: sha256.to_ascii_lowercase(),
        size: 0,
    };
    let bytes = tokio::task::spawn_blocking(move || store.get_artifact(&id, &want))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| {
            let status = match &e {
                heddle_store::artifacts::ArtifactError::Missing { .. } => StatusCode::NOT_FOUND,
                heddle_store::artifacts::ArtifactError::Store(s) => status_of(s),
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            ApiError::new(status, chain(&e))
        })?;
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    Ok((headers, bytes).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    /// The graph document, as `heddle run` reads it from a file.
    graph: serde_json::Value,
    #[serde(default)]
    inputs: serde_json::Map<String, serde_json::Value>,
    /// A name to list the run under (default: the document's `name`, else `api`).
    #[serde(default)]
    name: Option<String>,
    /// Who decides a failed invocation: `none` or `interactive` (default: the
    /// server's `--supervise`).
    #[serde(default)]
    supervise: Option<Supervise>,
    /// The run's budget (default: `[store]`'s keys of the same names).
    #[serde(default)]
    max_dispatches: Option<u64>,
    #[serde(default)]
    time_limit_ms: Option<u64>,
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

async fn create(
    State(api): State<Api>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CreateRequest = parse(body)?;
    let doc_name = req
        .graph
        .get("name")
        .and_then(|n| n.as_str())
        .map(str::to_string);
    let name = req.name.or(doc_name).unwrap_or_else(|| "api".into());
    let options = CreateOptions {
        supervise: req.supervise,
        max_dispatches: req.max_dispatches,
        time_limit_ms: req.time_limit_ms,
    };
    match api
        .host
        .create(&name, &req.graph, req.inputs, options)
        .await
    {
        Ok(run_id) => {
            let body = json!({
                "run_id": run_id,
                "state": "running",
                "events": format!("/api/runs/{run_id}/events"),
            });
            Ok((StatusCode::CREATED, Json(body)).into_response())
        }
        Err(CreateError::Store(e)) => Err(e.into()),
        Err(e @ CreateError::TooLarge { .. }) => {
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()))
        }
        Err(e @ CreateError::Budget(_)) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            e.to_string(),
        )),
        Err(e) => {
            // The shape of `heddle validate --json` for a refused graph.
            let error = match &e {
                CreateError::Invalid(_) => None,
                _ => Some(crate::exit::bounded(&chain(&e))),
            };
            let body = json!({
                "graph": name,
                "valid": false,
                "error": error.clone().unwrap_or_else(|| crate::exit::bounded(&e.to_string())),
                "issues": e.issues(),
                "warnings": [],
            });
            Err(ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                body,
            })
        }
    }
}

async fn cancel(State(api): State<Api>, Path(id): Path<String>) -> Result<Response, ApiError> {
    api.host.cancel(&id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "run_id": id, "cancel": "requested" })),
    )
        .into_response())
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeRequest {
    /// The pause event to reopen; refused when the run holds a different one.
    #[serde(default)]
    pause: Option<u64>,
}

async fn resume(
    State(api): State<Api>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let req: ResumeRequest = if body.is_empty() {
        ResumeRequest::default()
    } else {
        parse(Ok(body))?
    };
    api.host.resume(&id, req.pause).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "run_id": id, "state": "running" })),
    )
        .into_response())
}

/// `Last-Event-ID` (what an `EventSource` sends when it reconnects): continue after it.
async fn events(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let from = match headers.get("last-event-id") {
        None => 0,
        Some(v) => {
            let seq = v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok());
            match seq {
                Some(s) => s + 1,
                None => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "Last-Event-ID: expected the sequence number of a record",
                    ));
                }
            }
        }
    };
    Ok(super::feed::stream(api.host.clone(), id, from).await?)
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateRequest {
    #[serde(default)]
    note: Option<String>,
}

fn gate_request(body: Result<Bytes, BytesRejection>) -> Result<GateRequest, ApiError> {
    let body = body.map_err(body_error)?;
    if body.is_empty() {
        return Ok(GateRequest::default());
    }
    parse(Ok(body))
}

/// A gate the run does not wait at (or does not have) is a conflict with the run's
/// state, not a malformed request.
fn gate_error(e: anyhow::Error) -> ApiError {
    let mut out = ApiError::from(e);
    if out.status == StatusCode::UNPROCESSABLE_ENTITY {
        out.status = StatusCode::CONFLICT;
    }
    out
}

async fn approve(
    State(api): State<Api>,
    Path((id, gate)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = gate_request(body)?;
    api.host
        .approve(&id, &gate, req.note)
        .await
        .map_err(gate_error)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "run_id": id, "gate": gate, "verdict": "approve", "state": "running" })),
    )
        .into_response())
}

async fn reject(
    State(api): State<Api>,
    Path((id, gate)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = gate_request(body)?;
    let Some(note) = req.note.filter(|n| !n.trim().is_empty()) else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "a rejection needs a note saying why: {\"note\": \"...\"}",
        ));
    };
    let reason = api
        .host
        .reject(&id, &gate, note)
        .await
        .map_err(gate_error)?;
    Ok(Json(json!({ "run_id": id, "gate": gate, "verdict": "reject", "state": "cancelled", "reason": reason }))
        .into_response())
}
