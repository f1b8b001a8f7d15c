//! A watched run's progress (`heddle runs status RUN`), read from any process, never
//! taking the run over. Progress comes from the event log, the watchdog's side (worker,
//! restarts, time, cleanup) from its state file, the lock from the OS; what none of
//! them can know is reported as `unknown`, never guessed.

use std::collections::BTreeMap;

use heddle_core::{Occurrence, Record};
use heddle_store::lock::LockState;
use heddle_store::session;
use heddle_store::status::pid_alive;
use serde_json::{Value, json};

use super::state::{WatchState, now_ms};
use crate::error::Error;
use crate::settings::Settings;

/// A run's progress as its watchdog and its log know it; what neither can know is
/// `unknown`, never guessed.
#[derive(Debug)]
pub struct WatchStatus {
    /// Everything, as `heddle runs status --json` prints it.
    pub json: Value,
    /// The watchdog's state file, when a watchdog ever watched the run.
    pub state: Option<WatchState>,
    /// The run's process lock.
    pub lock: LockState,
    /// The watchdog's phase (`watchdog_gone` when it died mid-run; the run's state,
    /// `(not supervised)`, without one).
    pub phase: String,
    /// Whether the watchdog's process is alive.
    pub watchdog_alive: bool,
    /// Whether the worker's process is alive.
    pub worker_alive: bool,
    /// Run time used by the watchdog's clock.
    pub elapsed_ms: Option<u64>,
    /// Run time left, when the run has a limit.
    pub remaining_ms: Option<u64>,
    /// Dispatches the log records.
    pub dispatches: u64,
}

/// Run `run`'s status in the store of `settings`.
pub fn inspect(settings: &Settings, run: &str) -> Result<WatchStatus, Error> {
    let path = settings.store.path();
    let store = settings.store.existing(run)?;
    let (header, records, view) = session::inspect_progress(&*store, run)?;
    let sup = WatchState::load(path, run)?;
    let lock = heddle_store::lock::inspect(path, run)?;
    let now = now_ms();

    let watchdog_alive = sup.as_ref().is_some_and(|s| pid_alive(s.watchdog_pid));
    let phase = match &sup {
        None => format!("{} (not supervised)", view.state.as_str()),
        Some(s) if s.phase.is_active() && !watchdog_alive => "watchdog_gone".into(),
        Some(s) => serde_json::to_value(s.phase)
            .ok()
            .and_then(|p| p.as_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".into()),
    };
    let worker = sup.as_ref().and_then(|s| s.worker.as_ref());
    let worker_alive = worker.is_some_and(|w| pid_alive(w.pid));
    let elapsed = sup.as_ref().map(|s| {
        if watchdog_alive {
            s.elapsed_at(now)
        } else {
            // Nobody counts for a dead watchdog: what it banked.
            s.elapsed_ms
        }
    });
    let remaining = sup.as_ref().and_then(|s| {
        s.limits
            .run_time_limit_ms
            .map(|l| l.saturating_sub(elapsed.unwrap_or(0)))
    });

    // Usage per node as the log knows it (reported / partial / unknown; a call
    // without a receipt is unknown, never zero); active entries carry their node's.
    let usage = crate::durable::usage(&header, &view);
    let cannot_spend = crate::durable::cannot_spend(&header);
    let budget = header.run.limits.budget;
    let spent = view.spent();
    // A node's own time limit (from the stored graph), else the run's `--node-timeout-ms`;
    // an executor's built-in default is not known here.
    let run_timeout = header.run.limits.node_timeout_ms;
    let node_timeouts: BTreeMap<String, u64> = std::str::from_utf8(&header.run.graph_bytes)
        .ok()
        .and_then(|text| heddle_core::GraphDoc::parse(text, &header.run.graph_name).ok())
        .map(|doc| {
            doc.nodes
                .iter()
                .filter_map(|n| Some((n.id.clone(), n.resolved_limits().0?.timeout_ms?)))
                .collect()
        })
        .unwrap_or_default();
    let mut started_at: BTreeMap<&Occurrence, u64> = BTreeMap::new();
    for r in &records {
        if let Record::Started { occurrence } = &r.record {
            started_at.insert(occurrence, r.at_ms);
        }
    }
    // Work is active only while a worker runs it; otherwise a start without a result
    // is uncertain (recovery decides), not active.
    let (active, uncertain): (Vec<Value>, Vec<Value>) = view
        .uncertain()
        .map(|(occ, o)| {
            let started = started_at.get(occ).copied();
            let node_timeout = node_timeouts.get(&occ.node).copied().or(run_timeout);
            let elapsed = started.map(|s| now.saturating_sub(s));
            json!({
                "node": occ.node,
                "position": occ.key,
                "invocation": occ.n,
                "retry_safe": o.retry_safe,
                "started_ms": started,
                "elapsed_ms": elapsed,
                "remaining_node_timeout_ms": match (node_timeout, elapsed) {
                    (Some(t), Some(e)) => json!(t.saturating_sub(e)),
                    _ => json!("unknown"),
                },
                "usage": match usage.get(&occ.node) {
                    Some(u) => json!(u.state),
                    None if cannot_spend.contains(occ.node.as_str()) => json!(null),
                    None => json!("unknown"),
                },
            })
        })
        .partition(|_| worker_alive);

    let v = json!({
        "run_id": header.run_id,
        "graph": header.run.graph_name,
        "phase": phase,
        "state": view.state,
        "supervised": sup.is_some(),
        // On a store several hosts share: the host whose live lease drives the run (no
        // watchdog or file lock there: the lease is what says who has it).
        "owner_host": view.owner_host,
        "watchdog": sup.as_ref().map(|s| json!({"pid": s.watchdog_pid, "alive": watchdog_alive})),
        "lock": lock,
        "worker": worker.map(|w| json!({
            "pid": w.pid, "alive": worker_alive, "launch": w.launch, "launched_ms": w.launched_ms,
        })),
        "launches": sup.as_ref().map(|s| s.launches),
        "restarts": sup.as_ref().map(|s| s.restarts),
        "backoff_ms": sup.as_ref().and_then(|s| s.backoff_ms),
        "elapsed_ms": elapsed.map_or(json!("unknown"), |e| json!(e)),
        "remaining_ms": match (&sup, remaining) {
            (Some(_), Some(r)) => json!(r),
            (Some(_), None) => json!("no limit"),
            (None, _) => json!("unknown"),
        },
        "dispatches": view.dispatches,
        "active": active,
        "uncertain": uncertain,
        "usage": usage.iter().map(|(node, u)| {
            let mut v = json!(u);
            v["node"] = json!(node);
            v
        }).collect::<Vec<_>>(),
        "budget": {
            "max_dispatches": budget.max_dispatches,
            "time_limit_ms": budget.time_limit_ms,
            "dispatches": spent.dispatches,
            "execution_ms": spent.execution_ms,
            "time_left_ms": budget.time_left(&spent).map(|d| d.as_millis() as u64),
        },
        "cleanup_verified": sup.as_ref().and_then(|s| s.cleanup_verified),
        "survivors": sup.as_ref().map(|s| s.survivors.clone()).unwrap_or_default(),
        "code": sup.as_ref().and_then(|s| s.code.clone()),
        "detail": sup.as_ref().and_then(|s| s.detail.clone()),
        "limits": sup.as_ref().map(|s| &s.limits),
    });
    Ok(WatchStatus {
        json: v,
        state: sup,
        lock,
        phase,
        watchdog_alive,
        worker_alive,
        elapsed_ms: elapsed,
        remaining_ms: remaining,
        dispatches: view.dispatches,
    })
}

impl WatchStatus {
    /// As `heddle runs status RUN` prints it for a person: the watchdog's side, then the
    /// run's progress and its active work.
    pub fn text(&self, run: &str) -> String {
        let mut out = Vec::new();
        let v = &self.json;
        let alive = |a: bool| if a { "alive" } else { "gone" };
        out.push(format!("run        {run}"));
        out.push(format!("phase      {}", self.phase));
        out.push(format!("lock       {}", describe_lock(self.lock)));
        if let Some(s) = &self.state {
            out.push(format!(
                "watchdog   pid {} ({})",
                s.watchdog_pid,
                alive(self.watchdog_alive)
            ));
            out.push(match &s.worker {
                Some(w) => format!(
                    "worker     pid {} ({}), launch {}",
                    w.pid,
                    alive(self.worker_alive),
                    w.launch
                ),
                None => "worker     none".to_string(),
            });
            out.push(format!(
                "restarts   {} of {} ({} launches){}",
                s.restarts,
                s.limits.max_restarts,
                s.launches,
                s.backoff_ms
                    .map(|b| format!(", backing off {b} ms"))
                    .unwrap_or_default()
            ));
            out.push(format!(
                "time       {} ms used, {}",
                self.elapsed_ms.unwrap_or(0),
                self.remaining_ms
                    .map_or("no limit".to_string(), |r| format!("{r} ms left"))
            ));
            out.push(format!(
                "cleanup    {}",
                match s.cleanup_verified {
                    None => "not yet".to_string(),
                    Some(true) => "verified".to_string(),
                    Some(false) => format!("NOT verified: {}", s.survivors.join(", ")),
                }
            ));
            if let (Some(c), Some(d)) = (&s.code, &s.detail) {
                out.push(format!("ended      {c}: {d}"));
            }
        }
        out.push(format!(
            "progress   {} dispatches, {} active, {} uncertain",
            self.dispatches,
            v["active"].as_array().map_or(0, Vec::len),
            v["uncertain"].as_array().map_or(0, Vec::len)
        ));
        for a in v["active"].as_array().into_iter().flatten() {
            out.push(format!(
                "  active   {} {} ({} ms)",
                a["node"].as_str().unwrap_or_default(),
                a["position"].as_str().unwrap_or_default(),
                a["elapsed_ms"]
            ));
        }
        out.iter().map(|l| format!("{l}\n")).collect()
    }
}

fn describe_lock(l: LockState) -> String {
    match l {
        LockState::Free => "free".into(),
        LockState::Held { pid } => format!("held by pid {pid}"),
        LockState::Stale { pid } => {
            format!("STALE: pid {pid} died holding it; check, then `heddle runs unlock`")
        }
    }
}
