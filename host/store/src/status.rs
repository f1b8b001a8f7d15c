//! A run's state, folded from its log alone. Recovery decides from this fold and
//! `heddle runs show` prints it; nothing else (no cached status column) is trusted.

use std::collections::BTreeMap;

use heddle_core::{
    InvocationMetrics, Occurrence, OpenReason, PauseReason, Record, RunStatus, Value,
};
use serde::Serialize;

use crate::Stored;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Its owner process is alive and writing.
    Running,
    /// Its owner died without an ending: resumable (recovery decides per occurrence).
    Interrupted,
    /// Waiting for `heddle runs resume`.
    Paused,
    Completed,
    Failed,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Interrupted => "interrupted",
            RunState::Paused => "paused",
            RunState::Completed => "completed",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }

    /// Ended for good: nothing can resume it.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunState::Completed | RunState::Failed | RunState::Cancelled
        )
    }
}

/// How one invocation ended, as recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Completed {
        outputs: Vec<(String, Value)>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        emitted: Vec<(String, Value)>,
    },
    Failed {
        error: String,
    },
}

/// What the log says about one occurrence.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OccurrenceView {
    pub retry_safe: bool,
    /// Dispatch records (a resumed occurrence is not dispatched again).
    pub dispatched: u32,
    /// Start records: more than one means it was offered again after a crash.
    pub started: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<InvocationMetrics>,
    /// Supervisor verdicts in order (carried out on recovery, never asked again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verdicts: Vec<serde_json::Value>,
}

/// An open pause: its event id (the record's sequence number) and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpenPause {
    pub event: u64,
    #[serde(flatten)]
    pub reason: PauseReason,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunView {
    pub state: RunState,
    /// The process that last took the run and its epoch.
    pub owner_pid: Option<u32>,
    pub epoch: u64,
    pub pause: Option<OpenPause>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every dispatch ever recorded: the dispatch budget counts across restarts.
    pub dispatches: u64,
    /// How many times a process took the run (start, recoveries, resumes).
    pub opens: u32,
    pub records: u64,
    pub occurrences: BTreeMap<Occurrence, OccurrenceView>,
}

impl RunView {
    /// Folds a log. `alive` says whether a process id is still running (the owner).
    pub fn fold(records: &[Stored], alive: impl Fn(u32) -> bool) -> RunView {
        let mut v = RunView {
            state: RunState::Interrupted,
            owner_pid: None,
            epoch: 0,
            pause: None,
            error: None,
            dispatches: 0,
            opens: 0,
            records: records.len() as u64,
            occurrences: BTreeMap::new(),
        };
        let mut ended: Option<RunState> = None;
        for s in records {
            match &s.record {
                Record::Opened { epoch, pid, reason } => {
                    v.owner_pid = Some(*pid);
                    v.epoch = *epoch;
                    v.opens += 1;
                    // A start or recovery continues the run; only an ending stays.
                    if *reason != OpenReason::Start {
                        ended = None;
                    }
                }
                Record::Dispatched {
                    occurrence,
                    retry_safe,
                } => {
                    v.dispatches += 1;
                    let o = v.occurrences.entry(occurrence.clone()).or_default();
                    o.retry_safe = *retry_safe;
                    o.dispatched += 1;
                }
                Record::Started { occurrence } => {
                    v.occurrences.entry(occurrence.clone()).or_default().started += 1;
                }
                Record::Completed {
                    occurrence,
                    outputs,
                    emitted,
                    metrics,
                } => {
                    let o = v.occurrences.entry(occurrence.clone()).or_default();
                    o.result = Some(Outcome::Completed {
                        outputs: outputs.clone(),
                        emitted: emitted.clone(),
                    });
                    o.metrics = Some(metrics.clone());
                }
                Record::Failed {
                    occurrence,
                    error,
                    metrics,
                } => {
                    let o = v.occurrences.entry(occurrence.clone()).or_default();
                    o.result = Some(Outcome::Failed {
                        error: error.clone(),
                    });
                    o.metrics = Some(metrics.clone());
                }
                Record::Escalated { .. } => {}
                Record::Verdict {
                    occurrence,
                    verdict,
                    ..
                } => {
                    v.occurrences
                        .entry(occurrence.clone())
                        .or_default()
                        .verdicts
                        .push(verdict.clone());
                }
                Record::Paused { pause } => {
                    v.pause = Some(OpenPause {
                        event: s.seq,
                        reason: pause.clone(),
                    });
                    ended = Some(RunState::Paused);
                }
                Record::Resumed { pause } => {
                    if v.pause.as_ref().is_some_and(|p| p.event == *pause) {
                        v.pause = None;
                    }
                    ended = None;
                }
                Record::CancelRequested => {}
                Record::Finished { status, error } => {
                    v.error = error.clone();
                    ended = Some(match status {
                        RunStatus::Completed => RunState::Completed,
                        RunStatus::Failed => RunState::Failed,
                        RunStatus::Cancelled => RunState::Cancelled,
                        RunStatus::Suspended => RunState::Paused,
                        RunStatus::Running => RunState::Interrupted,
                    });
                }
            }
        }
        v.state = match ended {
            Some(s) => s,
            None if v.owner_pid.is_some_and(&alive) => RunState::Running,
            None => RunState::Interrupted,
        };
        v
    }

    /// Occurrences that started and have no recorded result, with their retry safety.
    pub fn uncertain(&self) -> impl Iterator<Item = (&Occurrence, &OccurrenceView)> {
        self.occurrences
            .iter()
            .filter(|(_, o)| o.started > 0 && o.result.is_none())
    }
}

/// Whether process `pid` is alive (Linux: a `/proc` entry that is not a zombie). Only
/// for display: ownership is decided by the epoch, never by a process id.
pub fn pid_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(true),
        Err(_) => false,
    }
}
