//! A run's state, folded from its log alone. Recovery decides from this fold and
//! `heddle runs show` prints it; nothing else (no cached status column) is trusted.

use std::collections::BTreeMap;

use heddle_core::{
    InvocationMetrics, Occurrence, OpenReason, PauseReason, ReconcileAnswer, Record,
    RecordedAction, RecordedVerdict, RunStatus, UsageState, Value,
};
use serde::Serialize;

use crate::Stored;
use crate::budget::Spent;

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
    /// Dispatch records (a resumed occurrence is not dispatched again). Always 0 for a
    /// retry-safe node: its dispatch is not recorded (nor the start of a native one).
    pub dispatched: u32,
    /// Start records: more than one means it was offered again after a crash.
    pub started: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<InvocationMetrics>,
    /// Supervisor verdicts in order (carried out on recovery, never asked again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verdicts: Vec<RecordedVerdict>,
    /// A person's answer to the reconcile pause of this invocation (it was not run
    /// again: its result is the outputs they supplied, or it was skipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconciled: Option<Reconciled>,
}

/// A person's answer to a reconcile pause, as [`RunView`] shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// What they said became of the invocation.
    pub answer: ReconcileAnswer,
    /// Who answered.
    pub by: String,
    /// Why.
    pub note: String,
    /// The record holding the answer.
    pub event: u64,
}

/// One node's provider usage as far as the log knows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeUsage {
    pub state: UsageState,
    /// Reported cost in USD: exact when `reported`, a lower bound when `partial`.
    pub cost_usd: f64,
    /// Attempts known from the log.
    pub calls: u64,
    /// Attempts that reported their cost.
    pub receipts: u64,
}

impl Default for NodeUsage {
    fn default() -> Self {
        NodeUsage {
            state: UsageState::Unknown,
            cost_usd: 0.0,
            calls: 0,
            receipts: 0,
        }
    }
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
    /// Logical dispatches: occurrences the log knows of, each counted once however
    /// often it was recovered or resumed (the dispatch budget counts across restarts).
    /// A retry-safe occurrence is known by its result (its dispatch is not recorded).
    pub dispatches: u64,
    /// Execution time so far (see [`Spent`]); frozen while paused or interrupted.
    pub execution_ms: u64,
    /// How many times a process took the run (start, recoveries, resumes).
    pub opens: u32,
    pub records: u64,
    pub occurrences: BTreeMap<Occurrence, OccurrenceView>,
    /// The nodes of a finished run that never ran, and why (recorded with its ending).
    pub skipped: BTreeMap<String, heddle_core::SkipReason>,
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
            execution_ms: 0,
            opens: 0,
            records: records.len() as u64,
            occurrences: BTreeMap::new(),
            skipped: BTreeMap::new(),
        };
        let mut ended: Option<RunState> = None;
        // Execution time: from each open to its pause or ending, or to the last record
        // its process wrote before it died.
        let mut opened_at: Option<u64> = None;
        let mut last_at = 0;
        for s in records {
            match &s.record {
                Record::Opened { .. } | Record::Paused { .. } | Record::Finished { .. } => {
                    if let Some(t) = opened_at.take() {
                        let until = if matches!(s.record, Record::Opened { .. }) {
                            last_at
                        } else {
                            s.at_ms
                        };
                        v.execution_ms += until.saturating_sub(t);
                    }
                    if matches!(s.record, Record::Opened { .. }) {
                        opened_at = Some(s.at_ms);
                    }
                }
                _ => {}
            }
            last_at = s.at_ms;
            match &s.record {
                Record::Opened {
                    epoch, pid, reason, ..
                } => {
                    v.owner_pid = Some(*pid);
                    v.epoch = *epoch;
                    v.opens += 1;
                    // A start or recovery continues the run; only an ending stays.
                    if *reason != OpenReason::Start {
                        ended = None;
                        // Written with an ending a crash cut short: the run goes on.
                        v.skipped.clear();
                    }
                }
                Record::Dispatched {
                    occurrence,
                    retry_safe,
                } => {
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
                Record::Reconciled {
                    occurrence,
                    answer,
                    by,
                    note,
                } => {
                    v.occurrences
                        .entry(occurrence.clone())
                        .or_default()
                        .reconciled = Some(Reconciled {
                        answer: *answer,
                        by: by.clone(),
                        note: note.clone(),
                        event: s.seq,
                    });
                }
                Record::CancelRequested => {}
                Record::Skipped { node, reason } => {
                    v.skipped.insert(node.clone(), *reason);
                }
                Record::Finished { status, error } => {
                    v.error = error.clone();
                    // An ending closes the pause it came through (a gate rejected, a
                    // paused run cancelled): only a suspension stays open.
                    if *status != RunStatus::Suspended {
                        v.pause = None;
                    }
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
        if let Some(t) = opened_at {
            v.execution_ms += last_at.saturating_sub(t);
        }
        let retries: usize = v
            .occurrences
            .values()
            .map(|o| {
                o.verdicts
                    .iter()
                    .filter(|d| d.action == RecordedAction::Retry)
                    .count()
            })
            .sum();
        v.dispatches = (v.occurrences.len() + retries) as u64;
        for o in v.occurrences.values_mut() {
            // Only retry-safe work is recorded without a dispatch record.
            o.retry_safe |= o.dispatched == 0;
        }
        v.state = match ended {
            Some(s) => s,
            None if v.owner_pid.is_some_and(&alive) => RunState::Running,
            None => RunState::Interrupted,
        };
        v
    }

    /// Provider usage per node, from the recorded results: each attempt whose start
    /// or result is recorded is a call, and a call without a cost report (an attempt
    /// that died, one a supervisor retried, a node that reported nothing) leaves the
    /// node's usage partial or unknown, never zero. Nodes with nothing measured
    /// (native built-ins) are left out.
    pub fn usage(&self) -> BTreeMap<String, NodeUsage> {
        let mut out: BTreeMap<String, NodeUsage> = BTreeMap::new();
        for (occ, o) in &self.occurrences {
            let measured = o.metrics.as_ref().is_some_and(|m| m.wall_us > 0);
            if o.started == 0 && !measured {
                continue;
            }
            let u = out.entry(occ.node.clone()).or_default();
            u.calls += u64::from(o.started.max(u32::from(o.result.is_some())));
            if let Some(m) = &o.metrics {
                u.receipts += u64::from(m.cost_reports);
                u.cost_usd += m.cost_usd;
            }
        }
        for u in out.values_mut() {
            u.state = UsageState::of(u.calls, u.receipts);
        }
        out
    }

    /// What the run has spent, for its budgets.
    pub fn spent(&self) -> Spent {
        Spent {
            dispatches: self.dispatches,
            execution_ms: self.execution_ms,
        }
    }

    /// Occurrences that started and have no recorded result nor a person's answer,
    /// with their retry safety.
    pub fn uncertain(&self) -> impl Iterator<Item = (&Occurrence, &OccurrenceView)> {
        self.occurrences
            .iter()
            .filter(|(_, o)| o.started > 0 && o.result.is_none() && o.reconciled.is_none())
    }
}

/// The kinds of record a run's state is folded from (see [`RunView::fold`]): the
/// others describe work, never whether the run is running, paused or over.
pub const LIFECYCLE: [&str; 4] = ["opened", "paused", "resumed", "finished"];

/// A run's state from its lifecycle records alone ([`crate::RunStore::read_lifecycle`]),
/// the owner's liveness judged by [`pid_alive`]: the same state a fold of the whole log
/// gives.
pub fn state_of(store: &dyn crate::RunStore, run_id: &str) -> Result<RunState, crate::StoreError> {
    Ok(RunView::fold(&store.read_lifecycle(run_id)?, pid_alive).state)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: u64, at_ms: u64, record: Record) -> Stored {
        Stored { seq, at_ms, record }
    }

    fn opened(reason: OpenReason) -> Record {
        Record::Opened {
            epoch: 1,
            reason,
            pid: u32::MAX,
            trace: None,
        }
    }

    fn completed(node: &str, key: &str, wall_us: u64, cost: Option<f64>) -> Record {
        Record::Completed {
            occurrence: Occurrence::new(node, key, 0),
            outputs: Vec::new(),
            emitted: Vec::new(),
            metrics: InvocationMetrics {
                wall_us,
                cost_usd: cost.unwrap_or(0.0),
                cost_reports: u32::from(cost.is_some()),
                ..Default::default()
            },
        }
    }

    #[test]
    fn execution_time_runs_only_while_a_process_owns_the_run() {
        let log = [
            at(0, 1_000, opened(OpenReason::Start)),
            // The process died 100 ms in; nobody ran the run for a minute.
            at(1, 1_100, completed("a", "", 0, None)),
            at(2, 61_100, opened(OpenReason::Recover)),
            at(
                3,
                61_150,
                Record::Paused {
                    pause: PauseReason::Interrupted,
                },
            ),
            // Paused for an hour: frozen.
            at(4, 3_661_150, opened(OpenReason::Resume)),
            at(5, 3_661_150, Record::Resumed { pause: 3 }),
            at(
                6,
                3_661_160,
                Record::Finished {
                    status: RunStatus::Completed,
                    error: None,
                },
            ),
        ];
        let v = RunView::fold(&log, |_| false);
        assert_eq!(v.execution_ms, 100 + 50 + 10);
        assert_eq!(v.spent().dispatches, 1);
        let budget = crate::Budget {
            max_dispatches: None,
            time_limit_ms: Some(160),
        };
        assert_eq!(
            budget.exhausted(&v.spent()),
            Some(crate::Exhausted::Time { limit_ms: 160 })
        );
        assert_eq!(
            crate::Budget {
                time_limit_ms: Some(161),
                ..budget
            }
            .exhausted(&v.spent()),
            None
        );
    }

    #[test]
    fn missing_usage_is_not_zero() {
        let started = |node: &str, key: &str| Record::Started {
            occurrence: Occurrence::new(node, key, 0),
        };
        let log = [
            at(0, 0, opened(OpenReason::Start)),
            // `llm`: two calls reported, a third started and died without a result.
            at(1, 0, started("llm", "i=0")),
            at(2, 0, completed("llm", "i=0", 5, Some(0.25))),
            at(3, 0, started("llm", "i=1")),
            at(4, 0, completed("llm", "i=1", 5, Some(0.0))),
            at(5, 0, started("llm", "i=2")),
            // `tool`: measured, never reported a cost.
            at(6, 0, completed("tool", "", 5, None)),
            // `paid`: every call reported.
            at(7, 0, completed("paid", "", 5, Some(1.5))),
            // A native built-in measures nothing and is left out.
            at(8, 0, completed("pass", "", 0, None)),
        ];
        let u = RunView::fold(&log, |_| false).usage();
        assert_eq!(u["llm"].state, UsageState::Partial);
        assert_eq!((u["llm"].calls, u["llm"].receipts), (3, 2));
        assert_eq!(u["llm"].cost_usd, 0.25);
        assert_eq!(u["tool"].state, UsageState::Unknown);
        assert_eq!(u["paid"].state, UsageState::Reported);
        assert!(!u.contains_key("pass"));
    }
}
