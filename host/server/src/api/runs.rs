//! The run routes: create, list, show, cancel, resume, the event stream, gates and
//! stored artifacts.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use heddle_store::artifacts::{ArtifactError, ArtifactReader};
use heddle_store::session;
use serde::Deserialize;
use serde_json::json;

use super::state::{Api, ApiError, body_error, chain, parse, status_of};
use crate::host::{CreateError, CreateOptions};
use heddle_runtime::Supervise;
use heddle_runtime::durable::{self, reconcile};

pub fn routes() -> Router<Api> {
    Router::new()
        .route("/api/runs", get(list).post(create))
        .route("/api/runs/{id}", get(show))
        .route("/api/runs/{id}/cancel", post(cancel))
        .route("/api/runs/{id}/resume", post(resume))
        .route("/api/runs/{id}/events", get(events))
        .route("/api/runs/{id}/gates/{gate}/approve", post(approve))
        .route("/api/runs/{id}/gates/{gate}/reject", post(reject))
        .route("/api/runs/{id}/artifacts/{sha256}", get(artifact))
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
    let (header, view, unreadable) =
        tokio::task::spawn_blocking(move || session::inspect_readable(&*store, &id))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let mut v = durable::show_json(&header, &view);
    // What an answer that the uncertain work completed must supply, for the person
    // answering (the viewer fills its form from it).
    if let Some(heddle_core::PauseReason::Reconcile { occurrence }) =
        view.pause.as_ref().map(|p| &p.reason)
        && let Some(d) = reconcile::declared_outputs(api.host.runtime(), &header, &occurrence.node)
    {
        v["pause"]["declared_outputs"] = json!(d);
    }
    // A value whose artifact is missing or corrupt is a fact about the run, not a
    // failed request: the run is shown with a marker in the value's place, and each
    // such value is listed with where it was and what is wrong with it.
    v["unreadable"] = unreadable
        .iter()
        .map(|u| {
            json!({
                "occurrence": u.occurrence,
                "handle": u.handle,
                "sha256": u.artifact.sha256,
                "size": u.artifact.size,
                "problem": u.problem(),
                "error": chain(&u.error),
            })
        })
        .collect();
    // The document as submitted, for the viewer to draw (its nodes' UI positions
    // included); stored bytes that are not JSON are left out, not an error.
    v["document"] = serde_json::from_slice(&header.run.graph_bytes).unwrap_or_default();
    // The graph as the run planned it, which is what the viewer draws and what the
    // records name: a NodeTool workflow read as Heddle's, and every graph node expanded
    // with its inner nodes at their paths (`plan.graphs` lists the graph nodes), from
    // the documents the run recorded.
    v["expanded"] = durable::stored_flat(&header)
        .map(|d| json!(d))
        .unwrap_or_default();
    link_artifacts(&mut v["occurrences"], &header.run_id, 0);
    Ok(Json(v))
}

/// How deep in an occurrence's shown object a result's values sit (the references are
/// whole values of its outputs: `result` → outcome → `outputs` → pair → value).
const REFERENCE_DEPTH: usize = 8;

/// Gives every artifact reference (`{"$artifact": {"sha256", "size"}}`, as the event
/// stream sends it) in `v` the `url` its bytes are fetched from: the shown run refers
/// to its large values instead of holding them, so its size does not grow with theirs.
fn link_artifacts(v: &mut serde_json::Value, run_id: &str, depth: usize) {
    if depth > REFERENCE_DEPTH {
        return;
    }
    match v {
        serde_json::Value::Object(m) => {
            let reference = (m.len() == 1)
                .then(|| m.get_mut(heddle_store::spill::KEY))
                .flatten()
                .and_then(|r| r.as_object_mut())
                .filter(|r| r.len() == 2 && r.contains_key("size"));
            if let Some(r) = reference {
                if let Some(sha) = r.get("sha256").and_then(|s| s.as_str()).map(str::to_string) {
                    r.insert(
                        "url".into(),
                        format!("/api/runs/{run_id}/artifacts/{sha}").into(),
                    );
                }
                return;
            }
            for x in m.values_mut() {
                link_artifacts(x, run_id, depth + 1);
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                link_artifacts(x, run_id, depth + 1);
            }
        }
        _ => {}
    }
}

/// How much of an artifact goes out in one piece of the response body (what the
/// compression layer takes at a time); a stored piece
/// ([`heddle_store::artifacts::PIECE_BYTES`]) goes out as several.
pub const ARTIFACT_CHUNK: usize = 64 << 10;

/// A stored artifact's bytes (the viewer links large values to them), streamed from the
/// store a piece at a time ([`ArtifactReader`]: one piece in memory per download) with
/// the digest checked as they go. A missing artifact is a 404, one whose stored pieces
/// do not add up to its size (or a one-piece artifact whose bytes do not match) a JSON
/// error before the answer starts; a larger one that turns out not to match its digest
/// ends the body before its last piece, so a client never reads damaged bytes as a
/// complete answer (the declared length is never reached).
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
    let sha256 = sha256.to_ascii_lowercase();
    let refused = |e: ArtifactError| {
        let status = match &e {
            ArtifactError::Missing { .. } => StatusCode::NOT_FOUND,
            ArtifactError::Store(s) => status_of(s),
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, chain(&e))
    };
    // Opened, and its first piece read, before the answer starts: what can be refused
    // cleanly is refused with a status.
    let (reader, first) = {
        let (store, id) = (store.clone(), id.clone());
        tokio::task::spawn_blocking(move || {
            let mut reader = ArtifactReader::open(&*store, &id, &sha256)?;
            let first = reader.next_piece(&*store)?;
            Ok::<_, ArtifactError>((reader, first))
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(refused)?
    };
    let length = reader.artifact().size;
    let pieces = Pieces {
        store,
        run_id: id,
        reader: Some(reader),
        rest: Bytes::from(first.unwrap_or_default()),
    };
    let body = futures_util::stream::try_unfold(pieces, Pieces::next);
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    let mut resp = (headers, axum::body::Body::from_stream(body)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, header::HeaderValue::from(length));
    Ok(resp)
}

/// An artifact's bytes as the pieces of a response body: what is left of the piece
/// read last, sent in [`ARTIFACT_CHUNK`]s, then the next piece read off the async
/// threads.
struct Pieces {
    store: std::sync::Arc<dyn heddle_store::RunStore>,
    /// The run the artifact is of, named on the log line of a download cut short.
    run_id: String,
    /// `None` once the last piece was read (and the digest matched).
    reader: Option<ArtifactReader>,
    rest: Bytes,
}

impl Pieces {
    async fn next(mut self) -> Result<Option<(Bytes, Pieces)>, std::io::Error> {
        while self.rest.is_empty() {
            let Some(mut reader) = self.reader.take() else {
                return Ok(None);
            };
            let store = self.store.clone();
            let (reader, piece) = tokio::task::spawn_blocking(move || {
                let piece = reader.next_piece(&*store);
                (reader, piece)
            })
            .await
            .map_err(std::io::Error::other)?;
            match piece {
                Ok(Some(p)) => {
                    self.rest = Bytes::from(p);
                    self.reader = Some(reader);
                }
                Ok(None) => return Ok(None),
                // The body ends short of its declared length: the client sees a broken
                // answer, never a complete one.
                Err(e) => {
                    tracing::warn!(
                        run_id = %self.run_id,
                        "run {}: artifact download stopped: {}",
                        self.run_id,
                        chain(&e)
                    );
                    return Err(std::io::Error::other(e));
                }
            }
        }
        let n = self.rest.len().min(ARTIFACT_CHUNK);
        let chunk = self.rest.split_to(n);
        Ok(Some((chunk, self)))
    }
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
    /// Who decides a failed invocation: `none`, `interactive`, `policy` (with
    /// `policy`) or `llm` (with `llm`, optional) (default: the server's `--supervise`).
    #[serde(default)]
    supervise: Option<SuperviseKind>,
    /// With `"supervise": "policy"`: the policy document (TOML text).
    #[serde(default)]
    policy: Option<String>,
    /// With `"supervise": "llm"`: the model and endpoint, among those the operator
    /// permits (default: the server's configured ones).
    #[serde(default)]
    llm: Option<LlmChoice>,
    /// The run's budget (default: `[store]`'s keys of the same names).
    #[serde(default)]
    max_dispatches: Option<u64>,
    #[serde(default)]
    time_limit_ms: Option<u64>,
    /// The documents the graph's graph nodes include: path as the node names it → the
    /// document's exact text (its sha256 is what the node pins).
    #[serde(default)]
    graphs: std::collections::BTreeMap<String, String>,
}

/// The `supervise` of a create request: what kind of supervisor, its settings beside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SuperviseKind {
    None,
    Interactive,
    Policy,
    Llm,
}

/// The LLM supervisor a create request asks for.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LlmChoice {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
}

impl CreateRequest {
    /// The supervisor asked for, with its settings; a setting given without its kind,
    /// or a kind without its required setting, refused naming both.
    fn supervise(&mut self) -> Result<Option<Supervise>, ApiError> {
        let refuse = |m: &str| {
            Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                m.to_string(),
            ))
        };
        let kind = self.supervise;
        if self.policy.is_some() && kind != Some(SuperviseKind::Policy) {
            return refuse("`policy` is the document of \"supervise\": \"policy\"; give both");
        }
        if self.llm.is_some() && kind != Some(SuperviseKind::Llm) {
            return refuse("`llm` is the setting of \"supervise\": \"llm\"; give both");
        }
        Ok(match kind {
            None => None,
            Some(SuperviseKind::None) => Some(Supervise::None),
            Some(SuperviseKind::Interactive) => Some(Supervise::Interactive),
            Some(SuperviseKind::Policy) => match self.policy.take() {
                Some(document) => Some(Supervise::Policy { document }),
                None => {
                    return refuse(
                        "\"supervise\": \"policy\" needs `policy`: the policy document (TOML text, as `heddle run --policy` reads it)",
                    );
                }
            },
            Some(SuperviseKind::Llm) => {
                let LlmChoice { model, endpoint } = self.llm.take().unwrap_or_default();
                Some(Supervise::Llm { model, endpoint })
            }
        })
    }
}

async fn create(
    State(api): State<Api>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut req: CreateRequest = parse(body)?;
    let supervise = req.supervise()?;
    // A caller's broken tracing never refuses its request: ignored (debug log).
    let trace_parent = headers.get("traceparent").and_then(|v| match v.to_str() {
        Ok(text) => heddle_runtime::telemetry::parse_parent(text, "the traceparent header"),
        Err(_) => {
            tracing::debug!("the traceparent header ignored: it is not ASCII text");
            None
        }
    });
    let doc_name = req
        .graph
        .get("name")
        .and_then(|n| n.as_str())
        .map(str::to_string);
    let name = req.name.or(doc_name).unwrap_or_else(|| "api".into());
    let options = CreateOptions {
        graphs: req.graphs,
        supervise,
        max_dispatches: req.max_dispatches,
        time_limit_ms: req.time_limit_ms,
        trace_parent,
    };
    match api
        .host
        .create(&name, &req.graph, req.inputs, options)
        .await
    {
        Ok(created) => {
            let run_id = created.run_id;
            let body = json!({
                "run_id": run_id,
                "state": if created.queued { "queued" } else { "running" },
                "events": format!("/api/runs/{run_id}/events"),
            });
            Ok((StatusCode::CREATED, Json(body)).into_response())
        }
        Err(CreateError::Run(e)) => Err(e.into()),
        Err(e @ CreateError::TooLarge { .. }) => {
            Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()))
        }
        Err(e @ (CreateError::Budget(_) | CreateError::SecretInput(_))) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            e.to_string(),
        )),
        Err(e) => {
            // The shape of `heddle validate --json` for a refused graph.
            let error = match &e {
                CreateError::Invalid(_) => None,
                _ => Some(heddle_core::text::bounded(&chain(&e))),
            };
            let body = json!({
                "graph": name,
                "valid": false,
                "error": error.clone().unwrap_or_else(|| heddle_core::text::bounded(&e.to_string())),
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
    /// An answer to a reconcile pause: the uncertain work completed, with these
    /// outputs (by output handle).
    #[serde(default)]
    completed_with: Option<serde_json::Map<String, serde_json::Value>>,
    /// An answer to a reconcile pause: skip the uncertain work.
    #[serde(default)]
    skip: bool,
    /// Who answers (default `api`).
    #[serde(default)]
    by: Option<String>,
    /// Why (required with an answer).
    #[serde(default)]
    note: Option<String>,
}

impl ResumeRequest {
    /// The answer to a reconcile pause the request gives, if any: it names the pause it
    /// answers, and gives one answer.
    fn answer(&mut self) -> Result<Option<reconcile::Given>, ApiError> {
        let refuse = |m: &str| Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m));
        let answer = match (self.completed_with.take(), self.skip) {
            (Some(_), true) => {
                return refuse(
                    "`completed_with` and `skip` are two answers to a reconcile pause: give one",
                );
            }
            (Some(outputs), false) => reconcile::Answer::Completed(outputs),
            (None, true) => reconcile::Answer::Skip,
            (None, false) => {
                if self.note.is_some() || self.by.is_some() {
                    return refuse(
                        "`note` and `by` go with an answer to a reconcile pause (`completed_with` or `skip`)",
                    );
                }
                return Ok(None);
            }
        };
        if self.pause.is_none() {
            return refuse(
                "an answer to a reconcile pause names the pause it answers: {\"pause\": N, ...}",
            );
        }
        Ok(Some(reconcile::Given {
            answer,
            by: self.by.take().unwrap_or_else(|| "api".into()),
            note: self.note.take().unwrap_or_default(),
        }))
    }
}

async fn resume(
    State(api): State<Api>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let mut req: ResumeRequest = if body.is_empty() {
        ResumeRequest::default()
    } else {
        parse(Ok(body))?
    };
    let given = req.answer()?;
    let answered = given.as_ref().map(|g| match g.answer {
        reconcile::Answer::Completed(_) => "completed",
        reconcile::Answer::Skip => "skipped",
    });
    api.host.resume(&id, req.pause, given).await?;
    let mut body = json!({ "run_id": id, "state": "running" });
    if let Some(a) = answered {
        body["reconciled"] = a.into();
    }
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// The highest record number a run store numbers (its records are numbered with
/// signed 64-bit integers): a `Last-Event-ID` at or past it names a record past the end
/// of every log.
const PAST_EVERY_LOG: u64 = i64::MAX as u64;

/// `Last-Event-ID` (what an `EventSource` sends when it reconnects): continue after it.
/// An id past the end of the log gets an empty stream (nothing comes after it); one
/// that is not a record's number is refused (400).
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
                Some(s) => s
                    .checked_add(1)
                    .map_or(PAST_EVERY_LOG, |n| n.min(PAST_EVERY_LOG)),
                None => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "Last-Event-ID: expected the sequence number of a record",
                    ));
                }
            }
        }
    };
    Ok(crate::sse::stream(api.host.clone(), id, from, &headers).await?)
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
fn gate_error(e: heddle_runtime::Error) -> ApiError {
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
