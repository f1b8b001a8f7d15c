//! The interactive supervisor's routes: a run's escalations waiting for a person, and
//! a person's verdict on one. A refused answer (404, 409, 422) decides nothing: the
//! escalation stays as it was and nothing is written.
//!
//! The desk of a run lives in the host that drives it: on a store several hosts share,
//! a request about a run another host drives is relayed to it through the store
//! ([`Host::relay`]), which answers it with these same functions.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use heddle_supervisor::interactive::{Answer, AnswerError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::state::{Api, ApiError, parse};
use crate::host::Host;

pub fn routes() -> Router<Api> {
    Router::new()
        .route("/api/runs/{id}/escalations", get(list))
        .route("/api/runs/{id}/escalations/{eid}", post(answer))
}

/// The command a relayed list is sent as.
pub(crate) const LIST: &str = "escalations";
/// The command a relayed answer is sent as.
pub(crate) const ANSWER: &str = "answer";

async fn list(State(api): State<Api>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if let Some(relayed) = api.host.relay(&id, LIST, json!({})).await? {
        return Ok(relayed);
    }
    Ok(reply(list_here(&api.host, &id).await))
}

/// The escalations of run `id` waiting at this host's desk: none for a run that is not
/// driven here or not supervised interactively; 404 for an unknown run.
pub(crate) async fn list_here(host: &Arc<Host>, id: &str) -> (StatusCode, serde_json::Value) {
    match host.escalations(id).await {
        Ok(pending) => {
            let list: Vec<_> = pending.iter().map(|p| p.to_json()).collect();
            (StatusCode::OK, json!({ "run_id": id, "escalations": list }))
        }
        Err(e) => {
            let e = ApiError::from(e);
            (e.status, e.body)
        }
    }
}

/// A person's verdict on an escalation, as the API takes it (and a relayed command
/// carries it).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerdictRequest {
    verdict: String,
    #[serde(default)]
    outputs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    note: Option<String>,
}

/// A relayed answer: which escalation, and the verdict.
#[derive(Deserialize, Serialize)]
pub(crate) struct Relayed {
    pub(crate) eid: String,
    pub(crate) request: VerdictRequest,
}

async fn answer(
    State(api): State<Api>,
    Path((id, eid)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: VerdictRequest = parse(body)?;
    let relay = Relayed {
        eid: eid.clone(),
        request: req.clone(),
    };
    // A JSON value of strings and maps serializes.
    let body = serde_json::to_value(&relay).expect("a JSON value");
    if let Some(relayed) = api.host.relay(&id, ANSWER, body).await? {
        return Ok(relayed);
    }
    Ok(reply(answer_here(&api.host, &id, &eid, req).await))
}

/// A person's answer `req` to escalation `eid` of run `id`, at this host's desk.
pub(crate) async fn answer_here(
    host: &Arc<Host>,
    id: &str,
    eid: &str,
    req: VerdictRequest,
) -> (StatusCode, serde_json::Value) {
    let note = req.note.clone();
    // The node it is about, for the log line of an answer with a note.
    let node = match &note {
        Some(_) => host
            .escalations(id)
            .await
            .ok()
            .and_then(|v| v.into_iter().find(|p| p.id == eid))
            .map(|p| p.escalation.node_id),
        None => None,
    };
    let answer = Answer {
        verdict: req.verdict,
        outputs: req.outputs,
        note: req.note,
    };
    let verdict = match host.answer(id, eid, answer).await {
        Ok(v) => v,
        Err(e) => {
            let status = match &e {
                AnswerError::Unknown(_) | AnswerError::Closed { .. } => StatusCode::NOT_FOUND,
                AnswerError::NotAllowed { .. } => StatusCode::CONFLICT,
                AnswerError::Malformed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            };
            let mut err = ApiError::new(status, e.to_string());
            match &e {
                AnswerError::Closed { how, .. } => err = err.with("closed", json!(how.as_str())),
                AnswerError::NotAllowed { allowed, .. } => {
                    err = err.with("allowed", json!(allowed));
                }
                _ => {}
            }
            return (err.status, err.body);
        }
    };
    if let Some(n) = &note {
        tracing::info!(
            run_id = %id,
            node_id = node.as_deref(),
            "run {id}: escalation {eid} answered {}: {}",
            verdict.action(),
            heddle_core::text::bounded(&host.mask.text(n))
        );
    }
    (
        StatusCode::OK,
        json!({
            "run_id": id,
            "escalation": eid,
            "verdict": verdict.action(),
            "applied": verdict,
            "note": note,
        }),
    )
}

/// An answer as the route sends it.
pub(crate) fn reply((status, body): (StatusCode, serde_json::Value)) -> Response {
    (status, Json(body)).into_response()
}
