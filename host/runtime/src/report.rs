//! The final report a watchdog's worker leaves in the run store (the artifact
//! `final-report`), and how the watchdog reads it back: a watched run's outputs reach
//! the user as bytes read back verified from the store, never as a worker's console
//! output (cut at the output limit, or refused for holding a secret). The report is the
//! command line's JSON report (`heddle run --json`); here it is only JSON whose
//! `outputs` hold heddle values.

use heddle_core::Value;
use heddle_kernel::SecretRegistry;
use heddle_store::artifacts::{ArtifactError, ArtifactPolicy, ArtifactRef};
use heddle_store::session::Session;
use heddle_store::status::RunState;
use heddle_store::{RunStore, SqliteStore};

/// The name of the artifact in which a worker leaves its final report.
pub const FINAL_REPORT: &str = "final-report";

/// Runs `f` on each output's values of a report in its JSON form (as heddle values),
/// and puts what it leaves back: how large values become artifact references in a
/// stored report and are read back from it.
pub fn map_output_values<E>(
    report: &mut serde_json::Value,
    mut f: impl FnMut(&mut [Value]) -> Result<(), E>,
) -> Result<(), E> {
    let Some(outputs) = report.get_mut("outputs").and_then(|o| o.as_object_mut()) else {
        return Ok(());
    };
    for values in outputs.values_mut().filter_map(|v| v.as_array_mut()) {
        let mut vs: Vec<Value> = values.drain(..).map(Value::from_json).collect();
        f(&mut vs)?;
        values.extend(vs.iter().map(Value::to_json));
    }
    Ok(())
}

/// Stores a worker's final `report` once as the run's `final-report` artifact in
/// `store`, refused when it holds one of `secrets` (the run's secret values as the run
/// holds them now) or is over the run's storage limits. Output values over the inline
/// limit are references in it, to the artifacts their nodes' results already point at
/// (stored once, counted once against the quota).
pub fn store(
    store: &dyn RunStore,
    session: &Session,
    mut report: serde_json::Value,
    secrets: &SecretRegistry,
) -> Result<ArtifactRef, ArtifactError> {
    let spill = &session.spill;
    map_output_values(&mut report, |vs| {
        spill.spill_values(vs.iter_mut()).map(|_| ())
    })?;
    // Serializing a JSON value cannot fail.
    let bytes = serde_json::to_vec_pretty(&report).expect("a JSON value serializes");
    let policy = ArtifactPolicy {
        known_secrets: secrets.snapshot(),
        ..spill.policy().clone()
    };
    store.put_artifact(&session.run_id, Some(FINAL_REPORT), &bytes, &policy)
}

/// The final report the worker stored for the ending the log records (`state`), read
/// back and verified against its digest, its large values read back too. A completed
/// run must have one; for other endings it is used when present. A report whose
/// outcome is not the recorded ending (left by an earlier pause) does not count.
pub fn read(
    store: &SqliteStore,
    run: &str,
    state: RunState,
) -> Result<Option<(ArtifactRef, serde_json::Value)>, ArtifactError> {
    let missing = || ArtifactError::Missing {
        run: run.to_string(),
        sha256: format!("(the {FINAL_REPORT} of the {} ending)", state.as_str()),
    };
    let found = match store.named_artifact(run, FINAL_REPORT)? {
        Some(r) => {
            let bytes = store.get_artifact(run, &r)?;
            let mut report: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|_| ArtifactError::Corrupt {
                    run: run.to_string(),
                    sha256: r.sha256.clone(),
                    found: "not a JSON report".into(),
                })?;
            map_output_values(&mut report, |vs| {
                heddle_store::spill::resolve_values(store, run, vs.iter_mut())
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
