//! The interactive supervisor's routes: a run's escalations waiting for a person, and
//! a person's verdict on one. A refused answer (404, 409, 422) decides nothing: the
//! escalation stays as it was and nothing is written.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use heddle_supervisor::interactive::{Answer, AnswerError};
use serde::Deserialize;
use serde_json::json;

use super::state::{Api, ApiError, parse};

pub fn routes() -> Router<Api> {
    Router::new()
        .route("/api/runs/{id}/escalations", get(list))
        .route("/api/runs/{id}/escalations/{eid}", post(answer))
}

async fn list(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let pending = api.host.escalations(&id).await?;
    let list: Vec<_> = pending.iter().map(|p| p.to_json()).collect();
    Ok(Json(json!({ "run_id": id, "escalations": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerdictRequest {
    verdict: String,
    #[serde(default)]
    outputs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    note: Option<String>,
}

async fn answer(
    State(api): State<Api>,
    Path((id, eid)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let req: VerdictRequest = parse(body)?;
    let note = req.note.clone();
    // The node it is about, for the log line of an answer with a note.
    let node = match &note {
        Some(_) => api
            .host
            .escalations(&id)
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
    let verdict = api.host.answer(&id, &eid, answer).await.map_err(|e| {
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
        err
    })?;
    if let Some(n) = &note {
        tracing::info!(
            run_id = %id,
            node_id = node.as_deref(),
            "run {id}: escalation {eid} answered {}: {}",
            verdict.action(),
            heddle_core::text::bounded(&api.host.mask.text(n))
        );
    }
    Ok(Json(json!({
        "run_id": id,
        "escalation": eid,
        "verdict": verdict.action(),
        "applied": verdict,
        "note": note,
    })))
}
