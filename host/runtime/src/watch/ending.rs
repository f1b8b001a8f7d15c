//! How a watched run ends: the final report read back verified from the store, the
//! exit code, the state file's last word, and the lock released (or kept). What is
//! printed of it is the caller's ([`WatchReport`]).

use heddle_store::SqliteStore;
use heddle_store::artifacts::ArtifactRef;
use heddle_store::lock::ProcessLock;
use heddle_store::status::RunState;
use serde_json::json;

use super::state::{WatchPhase, WatchState, now_ms};
use super::{Stop, Target, WatchEnding};
use crate::error::Error;
use crate::exit::Exit;

/// How a watched run ended, for its watchdog's caller to print.
#[derive(Debug)]
pub struct WatchReport {
    /// The exit code: the worker's verified report's when the run recorded its ending
    /// (as an unwatched run would exit), else the watchdog's.
    pub exit: Exit,
    /// How it ended.
    pub ending: WatchEnding,
    /// The watchdog's final state (as its state file now holds it).
    pub state: WatchState,
    /// The worker's final report, read back verified from the store (its large values
    /// read back too), when the run recorded the ending it reports.
    pub worker_report: Option<serde_json::Value>,
    /// Where that report is stored.
    pub final_report: Option<ArtifactRef>,
    /// The gate the run waits at, when it paused at one (it is answered, not resumed).
    pub gate: Option<String>,
}

impl WatchReport {
    /// The watchdog's view: phase, code, launches, restarts, time, cleanup, limits and
    /// every worker launch.
    pub fn supervision(&self) -> serde_json::Value {
        let s = &self.state;
        json!({
            "run_id": s.run_id,
            "phase": s.phase,
            "code": s.code,
            "detail": s.detail,
            "launches": s.launches,
            "restarts": s.restarts,
            "elapsed_ms": s.elapsed_ms,
            "cleanup_verified": s.cleanup_verified,
            "survivors": s.survivors,
            "last_cleanup": s.last_cleanup,
            "final_report": self.final_report,
            "limits": s.limits,
            "workers": s.history,
        })
    }

    /// The outputs summary an unwatched run prints, from the worker's verified report
    /// (empty when the run recorded no outputs).
    pub fn outputs_text(&self) -> String {
        let Some(w) = &self.worker_report else {
            return String::new();
        };
        let Ok(outputs) = serde_json::from_value(w["outputs"].clone()) else {
            return String::new();
        };
        let skipped: Vec<crate::run_report::SkippedNode> =
            serde_json::from_value(w["skipped"].clone()).unwrap_or_default();
        format!(
            "{}{}",
            crate::run_report::outputs_summary(&outputs),
            crate::run_report::skipped_summary(&skipped)
        )
    }

    /// The watchdog's last word on run `run`: how it ended (launches, restarts, cleanup)
    /// and, for a paused run, how to go on.
    pub fn ending_lines(&self, run: &str) -> Vec<String> {
        let s = &self.state;
        let verified = match s.cleanup_verified {
            Some(true) => "cleanup verified",
            Some(false) => "cleanup NOT verified",
            None => "no worker ran",
        };
        let mut lines = vec![match &self.ending {
            WatchEnding::Recorded(state) => format!(
                "watchdog: run {run} {} ({} launches, {} restarts, {verified})",
                state.as_str(),
                s.launches,
                s.restarts
            ),
            WatchEnding::Stopped { code, detail, .. } => format!(
                "watchdog: run {run} stopped: {code}: {detail} ({} launches, {} restarts, {verified})",
                s.launches, s.restarts
            ),
        }];
        if self.exit == Exit::Suspended {
            lines.push(match &self.gate {
                Some(g) => format!(
                    "run {run} waits at gate {g}; approve with: heddle runs approve {run} {g} [--note TEXT], or reject with: heddle runs reject {run} {g} --note TEXT"
                ),
                None => format!("run {run} paused; resume with: heddle runs resume --watchdog {run}"),
            });
        }
        lines
    }

    /// The run's JSON report: the worker's own when the run recorded its ending, with
    /// the watchdog's view (`supervision`) and the exit code this process ends with;
    /// only a report read back verified from the store, never a worker's console bytes.
    pub fn json(&self) -> serde_json::Value {
        let s = &self.state;
        let mut report = self
            .worker_report
            .clone()
            .filter(serde_json::Value::is_object)
            .unwrap_or_else(|| {
                json!({
                    "run_id": s.run_id,
                    "outcome": if s.phase == WatchPhase::Stopped { "stopped" } else { "unknown" },
                })
            });
        if let WatchEnding::Stopped { code, detail, .. } = &self.ending {
            report["outcome"] = "stopped".into();
            report["code"] = (*code).into();
            report["error"] = detail.clone().into();
        }
        report["exit_code"] = self.exit.code().into();
        report["supervision"] = self.supervision();
        report
    }
}

/// Records the ending in the state file, releases the lock (kept when cleanup was
/// incomplete), and reports.
pub(super) fn finish(
    target: &Target,
    mut sup: WatchState,
    mut ending: WatchEnding,
    lock: ProcessLock,
) -> Result<WatchReport, Error> {
    // The report of a run that recorded its ending travels through the store.
    let mut final_report = None;
    let mut worker_report = None;
    if let WatchEnding::Recorded(state) = ending {
        let read = SqliteStore::open(&target.store)
            .map_err(Into::into)
            .and_then(|store| crate::report::read(&store, &target.run, state));
        match read {
            Ok(Some((r, report))) => {
                worker_report = Some(report);
                final_report = Some(r);
            }
            Ok(None) => {}
            Err(e) => {
                let (code, exit) = Stop::Unreadable(e.code()).outcome();
                ending = WatchEnding::Stopped {
                    code,
                    detail: format!("{e} (the worker's error, if any, is above)"),
                    exit,
                };
            }
        }
    }
    sup.freeze(now_ms());
    sup.worker = None;
    sup.backoff_ms = None;
    let (exit, keep_lock) = match &ending {
        WatchEnding::Recorded(state) => {
            sup.phase = match state {
                RunState::Completed => WatchPhase::Completed,
                RunState::Failed => WatchPhase::Failed,
                RunState::Cancelled => WatchPhase::Cancelled,
                _ => WatchPhase::Paused,
            };
            // The worker's verified report says how its run ended exactly as an
            // unwatched run would exit (a budget that ran out is 6, not 1).
            let reported = worker_report
                .as_ref()
                .and_then(|r| r["exit_code"].as_i64())
                .map(|c| Exit::from_code(c as i32));
            let exit = reported.unwrap_or(match state {
                RunState::Completed => Exit::Ok,
                RunState::Cancelled => Exit::Cancelled,
                RunState::Paused => Exit::Suspended,
                _ => Exit::Failed,
            });
            (exit, false)
        }
        WatchEnding::Stopped { code, detail, exit } => {
            sup.phase = WatchPhase::Stopped;
            sup.code = Some(code.to_string());
            sup.detail = Some(detail.clone());
            (*exit, *exit == Exit::Teardown)
        }
    };
    sup.save(&target.store)?;
    if keep_lock {
        // Kept: the lock reads stale after this process until `heddle runs unlock`.
        lock.retain();
    } else {
        lock.release()?;
    }
    // A run waiting at a gate is answered, not resumed (a resume would only pause there
    // again).
    let gate = worker_report
        .as_ref()
        .and_then(|r| serde_json::from_value::<heddle_core::SuspendInfo>(r["suspend"].clone()).ok())
        .filter(|s| heddle_core::gate::GateAsk::from_state(&s.state).is_some())
        .map(|s| s.node_id);
    Ok(WatchReport {
        exit,
        ending,
        state: sup,
        worker_report,
        final_report,
        gate,
    })
}
