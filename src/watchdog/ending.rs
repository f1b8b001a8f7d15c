//! How a supervised run ends: the final report read back verified from the store, the
//! exit code, the state file's last word, the lock released (or kept), and what is
//! printed.

use heddle_store::lock::ProcessLock;
use heddle_store::status::RunState;

use super::state::{Phase, Supervision, now_ms};
use super::{Ending, Target};
use crate::execute::FINAL_REPORT;
use crate::exit::Exit;

/// The final report the worker stored for the ending the log records, read back and
/// verified against its digest. A completed run must have one; for other endings it is
/// used when present. A report whose outcome is not the recorded ending (left by an
/// earlier pause) does not count.
fn read_final(
    target: &Target,
    state: RunState,
) -> Result<
    Option<(heddle_store::artifacts::ArtifactRef, serde_json::Value)>,
    heddle_store::artifacts::ArtifactError,
> {
    use heddle_store::artifacts::ArtifactError;
    let store = heddle_store::SqliteStore::open(&target.store)?;
    let missing = || ArtifactError::Missing {
        run: target.run.clone(),
        sha256: format!("(the {FINAL_REPORT} of the {} ending)", state.as_str()),
    };
    let found = match store.named_artifact(&target.run, FINAL_REPORT)? {
        Some(r) => {
            let bytes = store.get_artifact(&target.run, &r)?;
            let mut report: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|_| ArtifactError::Corrupt {
                    run: target.run.clone(),
                    sha256: r.sha256.clone(),
                    found: "not a JSON report".into(),
                })?;
            // Large values are references to the artifacts their nodes' results used.
            crate::report::map_output_values(&mut report, |vs| {
                heddle_store::spill::resolve_values(&store, &target.run, vs.iter_mut())
            })?;
            let outcome = report["outcome"].as_str().unwrap_or_default();
            let matches = match state {
                RunState::Completed => outcome == "completed",
                RunState::Failed => outcome == "failed",
                RunState::Cancelled => outcome == "cancelled",
                // An interrupt pauses a durable run; the kernel saw it cancelled.
                RunState::Paused => outcome == "suspended" || outcome == "cancelled",
                _ => false,
            };
            matches.then_some((r, report))
        }
        None => None,
    };
    match found {
        None if state == RunState::Completed => Err(missing()),
        f => Ok(f),
    }
}

pub(super) fn exit_from(code: i32) -> Exit {
    match code {
        0 => Exit::Ok,
        2 => Exit::Invalid,
        3 => Exit::Cancelled,
        4 => Exit::Suspended,
        5 => Exit::Store,
        6 => Exit::Limit,
        7 => Exit::Locked,
        8 => Exit::Teardown,
        9 => Exit::Damaged,
        _ => Exit::Failed,
    }
}

/// Records the ending in the state file, releases the lock (kept when cleanup was
/// incomplete), and reports.
pub(super) fn finish(
    target: &Target,
    mut sup: Supervision,
    mut ending: Ending,
    lock: ProcessLock,
) -> anyhow::Result<Exit> {
    // The report of a run that recorded its ending travels through the store.
    let mut final_report = None;
    let mut worker_report = None;
    if let Ending::Recorded(state) = ending {
        match read_final(target, state) {
            Ok(Some((r, report))) => {
                worker_report = Some(report);
                final_report = Some(r);
            }
            Ok(None) => {}
            Err(e) => {
                ending = Ending::Stopped {
                    code: e.code(),
                    detail: format!("{e} (the worker's error, if any, is above)"),
                    exit: Exit::Failed,
                };
            }
        }
    }
    sup.freeze(now_ms());
    sup.worker = None;
    sup.backoff_ms = None;
    let (exit, keep_lock) = match &ending {
        Ending::Recorded(state) => {
            sup.phase = match state {
                RunState::Completed => Phase::Completed,
                RunState::Failed => Phase::Failed,
                RunState::Cancelled => Phase::Cancelled,
                _ => Phase::Paused,
            };
            // The worker's verified report says how its run ended exactly as an
            // unsupervised run would exit (a budget that ran out is 6, not 1).
            let reported = worker_report
                .as_ref()
                .and_then(|r| r["exit_code"].as_i64())
                .map(|c| exit_from(c as i32));
            let exit = reported.unwrap_or(match state {
                RunState::Completed => Exit::Ok,
                RunState::Cancelled => Exit::Cancelled,
                RunState::Paused => Exit::Suspended,
                _ => Exit::Failed,
            });
            (exit, false)
        }
        Ending::Stopped { code, detail, exit } => {
            sup.phase = Phase::Stopped;
            sup.code = Some(code.to_string());
            sup.detail = Some(detail.clone());
            (*exit, *code == "TEARDOWN_INCOMPLETE")
        }
    };
    sup.save(&target.store)?;
    if keep_lock {
        // Kept: the lock reads stale after this process until `heddle runs unlock`.
        lock.retain();
    } else {
        lock.release()?;
    }
    let supervision = serde_json::json!({
        "run_id": sup.run_id,
        "phase": sup.phase,
        "code": sup.code,
        "detail": sup.detail,
        "launches": sup.launches,
        "restarts": sup.restarts,
        "elapsed_ms": sup.elapsed_ms,
        "cleanup_verified": sup.cleanup_verified,
        "survivors": sup.survivors,
        "last_cleanup": sup.last_cleanup,
        "final_report": final_report,
        "limits": sup.limits,
        "workers": sup.history,
    });
    // A run waiting at a gate is answered, not resumed (a resume would only pause there
    // again): the pause line says how, as an unsupervised durable run's does.
    let gate = worker_report
        .as_ref()
        .and_then(|r| serde_json::from_value::<heddle_core::SuspendInfo>(r["suspend"].clone()).ok())
        .filter(|s| heddle_core::gate::GateAsk::from_state(&s.state).is_some())
        .map(|s| s.node_id);
    if target.worker.json {
        // The worker's own report when the run recorded its ending; the watchdog's view
        // always, with the exit code this process ends with.
        // Only a report read back verified from the store; never raw console bytes (cut
        // at the output limit, or refused for holding a secret).
        let mut report: serde_json::Value = worker_report
            .filter(serde_json::Value::is_object)
            .unwrap_or_else(|| {
                serde_json::json!({
                    "run_id": sup.run_id,
                    "outcome": if sup.phase == Phase::Stopped { "stopped" } else { "unknown" },
                })
            });
        if let Ending::Stopped { code, detail, .. } = &ending {
            report["outcome"] = "stopped".into();
            report["code"] = (*code).into();
            report["error"] = detail.clone().into();
        }
        report["exit_code"] = exit.code().into();
        report["supervision"] = supervision;
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if let Some(outputs) = worker_report
        .as_ref()
        .and_then(|r| serde_json::from_value(r["outputs"].clone()).ok())
    {
        // The summary an unsupervised run prints, from the verified report.
        let skipped: Vec<crate::report::SkippedNode> = worker_report
            .as_ref()
            .and_then(|r| serde_json::from_value(r["skipped"].clone()).ok())
            .unwrap_or_default();
        print!(
            "{}{}",
            crate::report::outputs_summary(&outputs),
            crate::report::skipped_summary(&skipped)
        );
    }
    let verified = match sup.cleanup_verified {
        Some(true) => "cleanup verified",
        Some(false) => "cleanup NOT verified",
        None => "no worker ran",
    };
    match &ending {
        Ending::Recorded(state) => eprintln!(
            "watchdog: run {} {} ({} launches, {} restarts, {verified})",
            sup.run_id,
            state.as_str(),
            sup.launches,
            sup.restarts
        ),
        Ending::Stopped { code, detail, .. } => eprintln!(
            "watchdog: run {} stopped: {code}: {detail} ({} launches, {} restarts, {verified})",
            sup.run_id, sup.launches, sup.restarts
        ),
    }
    if exit == Exit::Suspended {
        let run = &sup.run_id;
        match gate {
            Some(g) => eprintln!(
                "run {run} waits at gate {g}; approve with: heddle runs approve {run} {g} [--note TEXT], or reject with: heddle runs reject {run} {g} --note TEXT"
            ),
            None => eprintln!("run {run} paused; resume with: heddle runs resume --watchdog {run}"),
        }
    }
    Ok(exit)
}
