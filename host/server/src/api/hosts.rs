//! `GET /api/hosts`: the hosts serving the store, for operators. On a store several hosts
//! share, every host the store knows (alive or not), with its last heartbeat (store
//! clock) and the runs whose live lease it holds (count and ids); on a store file, this
//! server alone. With them, the store this server uses (never a password) and its lease
//! TTL and renewal period: what an operator checks first when hosts disagree.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::state::{Api, ApiError};

pub fn routes() -> Router<Api> {
    Router::new().route("/api/hosts", get(list))
}

async fn list(State(api): State<Api>) -> Result<Json<serde_json::Value>, ApiError> {
    let host = api.host.clone();
    let ttl = host.runtime().settings().serve.lease_ttl;
    let lease = json!({
        "ttl_ms": ttl.as_millis() as u64,
        "renew_every_ms": (ttl / 3).as_millis() as u64,
    });
    let Some(fleet) = host.fleet().cloned() else {
        // A store file has one owner: this server.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let store = host.runtime().settings().store.path().display().to_string();
        return Ok(Json(json!({
            "shared": false,
            "store": store,
            "lease": lease,
            "this_host": "local",
            "hosts": [{
                "host_id": "local",
                "hostname": heddle_store::lease::host_name(),
                "pid": std::process::id(),
                "alive": true,
                "last_seen_ms": now,
                "runs": host.driving().len(),
                "run_ids": host.driving(),
                "driving": host.driving(),
            }],
        })));
    };
    let f = fleet.clone();
    let hosts = tokio::task::spawn_blocking(move || f.hosts())
        .await
        .map_err(|e| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        })??;
    let me = fleet.host_id().to_string();
    let list: Vec<_> = hosts
        .iter()
        .map(|h| {
            let mut v = serde_json::to_value(h).unwrap_or_default();
            if h.host_id == me {
                // What this host drives now (the store counts live leases only).
                v["driving"] = json!(host.driving());
            }
            v
        })
        .collect();
    Ok(Json(json!({
        "shared": true,
        "store": fleet.target(),
        "lease": lease,
        "this_host": me,
        "hosts": list,
    })))
}
