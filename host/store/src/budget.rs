//! Seed 003's "Bound the run": a run's budgets and what it has spent, both from what is
//! stored (its limits and its log), so every process that continues a run (a resume, a
//! recovery, a watchdog's worker) counts from the same figures and a restart never
//! refills a budget.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A run's budgets, recorded in its limits when it is created; resume uses the recorded
/// ones, never the command line's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Logical dispatches the run may make in all: each occurrence counts once, however
    /// often it is recovered or resumed, and each retry of it (the node's own `retry`
    /// policy or a supervisor's verdict) once more: a retry is never a private allowance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dispatches: Option<u64>,
    /// Execution time the run may use in all, in milliseconds: it runs while a process
    /// owns the run and is frozen while the run is paused or nobody runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
}

impl Budget {
    /// Execution time left after `spent` (zero when it is used up); `None` without a limit.
    pub fn time_left(&self, spent: &Spent) -> Option<Duration> {
        self.time_limit_ms
            .map(|l| Duration::from_millis(l.saturating_sub(spent.execution_ms)))
    }

    /// The budget `spent` already exhausts before anything more runs. Dispatches are
    /// exhausted only by one more dispatch (a run may still finish recorded work), so
    /// only the time limit can be.
    pub fn exhausted(&self, spent: &Spent) -> Option<Exhausted> {
        match self.time_left(spent) {
            Some(left) if left.is_zero() => Some(Exhausted::Time {
                limit_ms: self.time_limit_ms.unwrap_or(0),
            }),
            _ => None,
        }
    }
}

/// Whether a record is a retry decision (the node's own policy or the supervisor's): each
/// one is a further dispatch of its occurrence, charged to the dispatch budget.
pub fn is_retry(record: &heddle_core::Record) -> bool {
    matches!(record, heddle_core::Record::Verdict { verdict, .. }
        if verdict.action == heddle_core::RecordedAction::Retry)
}

/// What a run has spent, folded from its log (see [`crate::RunView`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spent {
    /// Logical dispatches: distinct occurrences the log knows of, plus the retries
    /// recorded for them ([`is_retry`]).
    pub dispatches: u64,
    /// Milliseconds between each process taking the run and its last record (its pause,
    /// ending, or the last thing it wrote before it died), summed.
    pub execution_ms: u64,
}

/// A budget that ran out; the run ends failed with this as its error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "budget", rename_all = "snake_case")]
pub enum Exhausted {
    #[error(
        "dispatch budget exhausted: the run made all {limit} dispatches it may (limits.max_dispatches), counted across restarts and resumes"
    )]
    Dispatches { limit: u64 },
    #[error(
        "run time limit exhausted: the run used its {limit_ms} ms of execution (limits.time_limit_ms; time while paused or interrupted does not count)"
    )]
    Time { limit_ms: u64 },
}
