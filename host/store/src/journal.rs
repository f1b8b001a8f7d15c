//! The kernel's journal over a run log: records go to the [`RunLog`], and what an
//! earlier process recorded is reduced, per occurrence, to the crash table's decision.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use heddle_core::{Occurrence, ReconcileAnswer, Record, RecordedAction, SkipReason};
use heddle_kernel::executor::BoxFuture;
use heddle_kernel::{Journal, JournalError, Outputs, Prior, Refused, SealError, Step};

use crate::fault::{self, Boundary};
use crate::spill::Spiller;
use crate::{Budget, Exhausted, RunLog, Stored};

pub struct DurableJournal {
    log: Arc<RunLog>,
    prior: HashMap<Occurrence, Prior>,
    /// Dispatches left in the budget; `None` without one. Starts from the budget less
    /// every occurrence the log knows of.
    dispatches_left: Option<AtomicU64>,
    max_dispatches: u64,
    exhausted: OnceLock<Exhausted>,
    /// Where results' large values go; without it every value stays inline.
    spiller: Option<Spiller>,
}

impl DurableJournal {
    /// A journal writing to `log`, continuing after `records` (empty for a new run).
    /// `reoffer` says which uncertain occurrences an explicit resume offers again (the
    /// user decided); no other uncertain work is ever re-run.
    pub fn new(
        log: Arc<RunLog>,
        records: &[Stored],
        reoffer: &dyn Fn(&Occurrence) -> bool,
    ) -> Self {
        Self::with_budget(log, records, reoffer, Budget::default())
    }

    /// [`DurableJournal::new`] enforcing `budget`'s dispatch limit, counted from the log.
    pub fn with_budget(
        log: Arc<RunLog>,
        records: &[Stored],
        reoffer: &dyn Fn(&Occurrence) -> bool,
        budget: Budget,
    ) -> Self {
        let prior = decide(records, reoffer);
        let retries = records
            .iter()
            .filter(|s| crate::budget::is_retry(&s.record))
            .count();
        let known = (prior.len() + retries) as u64;
        DurableJournal {
            log,
            prior,
            dispatches_left: budget
                .max_dispatches
                .map(|m| AtomicU64::new(m.saturating_sub(known))),
            max_dispatches: budget.max_dispatches.unwrap_or(0),
            exhausted: OnceLock::new(),
            spiller: None,
        }
    }

    /// Stores results' values that are too large to travel inline through `spiller`.
    pub fn spilling(mut self, spiller: Spiller) -> Self {
        self.spiller = Some(spiller);
        self
    }

    pub fn log(&self) -> &Arc<RunLog> {
        &self.log
    }

    /// The budget that ran out in this process, if one did.
    pub fn exhausted(&self) -> Option<&Exhausted> {
        self.exhausted.get()
    }

    /// Marks a budget as run out (the run time limit, whose clock the caller keeps).
    pub fn exhaust(&self, e: Exhausted) {
        let _ = self.exhausted.set(e);
    }
}

#[derive(Default)]
struct Seen {
    /// Set by a dispatch record. Work that is not retry-safe always records its dispatch
    /// before its start (and the log on disk is a prefix of what was written), so an
    /// occurrence without one is retry-safe.
    recorded_retry_safe: bool,
    dispatched: bool,
    /// Attempts begun (start records).
    started: u32,
    /// Retry verdicts: each says an attempt ended in failure and the next one was
    /// decided (a retry-safe node's attempts leave no start records, only these).
    retried: u32,
    settled: Option<Prior>,
}

/// The crash table (README, "Durable runs"), per occurrence, from the log alone: nothing
/// recorded → fresh; dispatched but not started, started and retry-safe, or every
/// started attempt closed by a retry → redo, numbered after the attempts made; an attempt
/// started, not retry-safe and never closed (no result, no retry) → reconcile, unless a
/// person answered that (a skip → skipped, reason `reconciled`; a completion is the
/// result written with the answer); a result → replay it.
fn decide(records: &[Stored], reoffer: &dyn Fn(&Occurrence) -> bool) -> HashMap<Occurrence, Prior> {
    fold(records)
        .into_iter()
        .map(|(occ, s)| {
            let retry_safe = !s.dispatched || s.recorded_retry_safe;
            // Attempts made: each started one, and each one a retry closed (retry-safe
            // attempts record no start). An attempt is open, its effect unknown, when
            // more started than retries closed.
            let begun = s.started.max(s.retried);
            let open = s.started > s.retried;
            let prior = match s.settled {
                Some(p) => p,
                None if open && !retry_safe && !reoffer(occ) => Prior::Uncertain,
                None if s.dispatched || begun > 0 => Prior::Redo { started: begun },
                None => Prior::Fresh,
            };
            (occ.clone(), prior)
        })
        .collect()
}

/// An attempt whose process died while it ran: its start is recorded by the run's last
/// owner, and neither its result nor a retry closing it is ([`died_attempts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiedAttempt {
    pub occurrence: Occurrence,
    /// Its number (1 for the first attempt).
    pub attempt: u32,
    /// When its start was recorded.
    pub started_at_ms: u64,
}

/// The attempts the run's last owner started and never ended, when that owner died
/// (its `opened` record is followed by no pause and no ending): what a recovery reports
/// as died with the process. Attempts of a node that records no start (retry-safe, and
/// spending nothing outside the process) leave no trace to report. An owner that paused
/// ended its attempts itself (cancelled), and one that recovered before reported the
/// attempts of the owner before it, so each died attempt is reported once.
pub fn died_attempts(records: &[Stored]) -> Vec<DiedAttempt> {
    let Some(last_open) = records
        .iter()
        .rposition(|s| matches!(s.record, Record::Opened { .. }))
    else {
        return Vec::new();
    };
    let mine = &records[last_open..];
    if mine
        .iter()
        .any(|s| matches!(s.record, Record::Paused { .. } | Record::Finished { .. }))
    {
        return Vec::new();
    }
    let seen = fold(records);
    let mut died: Vec<DiedAttempt> = mine
        .iter()
        .filter_map(|s| match &s.record {
            Record::Started { occurrence } => Some((occurrence, s.at_ms)),
            _ => None,
        })
        .filter_map(|(occ, at_ms)| {
            let s = seen.get(occ)?;
            (s.settled.is_none() && s.started > s.retried).then(|| DiedAttempt {
                occurrence: occ.clone(),
                attempt: s.started,
                started_at_ms: at_ms,
            })
        })
        .collect();
    // The last start of each occurrence is its open attempt's.
    died.reverse();
    let mut once = std::collections::HashSet::new();
    died.retain(|d| once.insert(d.occurrence.clone()));
    died.reverse();
    died
}

/// Each occurrence's records, folded.
fn fold(records: &[Stored]) -> HashMap<&Occurrence, Seen> {
    let mut seen: HashMap<&Occurrence, Seen> = HashMap::new();
    for s in records {
        let Some(occ) = s.record.occurrence() else {
            continue;
        };
        let e = seen.entry(occ).or_default();
        match &s.record {
            Record::Dispatched { retry_safe, .. } => {
                e.dispatched = true;
                e.recorded_retry_safe = *retry_safe;
            }
            Record::Started { .. } => e.started += 1,
            Record::Completed {
                outputs,
                emitted,
                metrics,
                ..
            } => {
                e.settled = Some(Prior::Completed {
                    outputs: outputs.iter().cloned().collect::<Outputs>(),
                    emitted: emitted
                        .iter()
                        .map(|(h, v)| (Arc::from(h.as_str()), v.clone()))
                        .collect(),
                    metrics: metrics.clone(),
                })
            }
            Record::Failed { error, .. } => {
                e.settled = Some(Prior::Failed {
                    error: error.clone(),
                })
            }
            Record::Verdict { verdict, .. } => {
                let error = || verdict.error.clone().unwrap_or_default();
                match verdict.action {
                    RecordedAction::Skip => {
                        e.settled = Some(Prior::Skipped {
                            error: error(),
                            reason: SkipReason::Supervisor,
                        })
                    }
                    RecordedAction::EndStream => {
                        e.settled = Some(Prior::EndedStream { error: error() })
                    }
                    RecordedAction::Retry => e.retried += 1,
                    RecordedAction::Approve | RecordedAction::Reject => {}
                }
            }
            // A person's answer: a skip settles the invocation here; a completion is the
            // result record written with it, which settles it above.
            Record::Reconciled {
                answer: ReconcileAnswer::Skipped,
                by,
                note,
                ..
            } => {
                e.settled = Some(Prior::Skipped {
                    error: format!("skipped by {by} reconciling it: {note}"),
                    reason: SkipReason::Reconciled,
                })
            }
            _ => {}
        }
    }
    seen
}

fn node_of(r: &Record) -> &str {
    r.occurrence().map(|o| o.node.as_str()).unwrap_or("")
}

/// The boundary a record's write completes, for fault injection.
fn after(r: &Record) -> Option<Boundary> {
    match r {
        Record::Dispatched { .. } => Some(Boundary::AfterDispatch),
        Record::Started { .. } => Some(Boundary::AfterStart),
        Record::Completed { .. } | Record::Failed { .. } => Some(Boundary::AfterResult),
        Record::Verdict { .. } => Some(Boundary::AfterVerdict),
        _ => None,
    }
}

impl Journal for DurableJournal {
    fn prior(&self, occ: &Occurrence) -> Prior {
        if self.prior.is_empty() {
            return Prior::Fresh;
        }
        self.prior.get(occ).cloned().unwrap_or(Prior::Fresh)
    }

    fn admit(&self, _occ: &Occurrence) -> Result<(), Refused> {
        let Some(left) = &self.dispatches_left else {
            return Ok(());
        };
        let taken = left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if taken.is_ok() {
            return Ok(());
        }
        let e = Exhausted::Dispatches {
            limit: self.max_dispatches,
        };
        self.exhaust(e.clone());
        Err(Refused(Arc::new(e)))
    }

    fn passed(&self, step: Step, occ: &Occurrence) {
        // The same boundaries a recorded dispatch or start passes, so a crash test can
        // stop a retry-safe node there too.
        match step {
            Step::Dispatch => {
                fault::check(Boundary::BeforeDispatch, &occ.node);
                fault::check(Boundary::AfterDispatch, &occ.node);
            }
            Step::Start => fault::check(Boundary::AfterStart, &occ.node),
        }
    }

    /// Large values go to the run's artifacts here, before the record is queued: the
    /// artifact commits before the record that refers to it (the log is one ordered
    /// file), and a value the policy refuses fails its node rather than the log. Only
    /// a result with a value over the inline limit touches the store on this thread.
    fn seal(&self, record: Record) -> Result<Record, SealError> {
        let Some(s) = &self.spiller else {
            return Ok(record);
        };
        s.spill(record).map_err(|e| match e {
            crate::artifacts::ArtifactError::Store(e) => SealError::Journal(JournalError {
                source: Arc::new(e),
            }),
            e => SealError::Refused(Refused(Arc::new(e))),
        })
    }

    fn append(&self, record: Record) {
        if !fault::is_armed() {
            self.log.append(record);
            return;
        }
        if matches!(record, Record::Dispatched { .. }) {
            fault::check(Boundary::BeforeDispatch, node_of(&record));
        }
        let boundary = after(&record).map(|b| (b, node_of(&record).to_string()));
        self.log.append(record);
        if let Some((b, node)) = boundary {
            fault::check(b, &node);
        }
    }

    fn append_synced(&self, record: Record) -> BoxFuture<'static, Result<(), JournalError>> {
        let boundary = after(&record).map(|b| (b, node_of(&record).to_string()));
        let (_, wait) = self.log.append_synced(record);
        Box::pin(async move {
            wait.done().await.map_err(|e| JournalError {
                source: Arc::new(e),
            })?;
            if let Some((b, node)) = boundary {
                fault::check(b, &node);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use heddle_core::{Decider, RecordedVerdict};

    use super::*;

    fn decided(records: Vec<Record>) -> HashMap<Occurrence, Prior> {
        let stored: Vec<Stored> = records
            .into_iter()
            .enumerate()
            .map(|(seq, record)| Stored {
                seq: seq as u64,
                at_ms: 0,
                record,
            })
            .collect();
        decide(&stored, &|_| false)
    }

    fn occ(n: &str) -> Occurrence {
        Occurrence::new(n, "", 0)
    }

    fn retry(n: &str, by: Decider) -> Record {
        Record::Verdict {
            occurrence: occ(n),
            verdict: RecordedVerdict::new(RecordedAction::Retry),
            decided_by: by,
        }
    }

    fn dispatched(n: &str) -> Record {
        Record::Dispatched {
            occurrence: occ(n),
            retry_safe: false,
        }
    }

    fn started(n: &str) -> Record {
        Record::Started { occurrence: occ(n) }
    }

    /// A retry verdict is an attempt made: numbering goes on after it however the
    /// attempts were recorded, and an attempt it closed is not uncertain work.
    #[test]
    fn recorded_retries_count_as_attempts_made() {
        let p = decided(vec![
            // Retry-safe: its attempts record no start, only the verdicts.
            retry("safe", Decider::RetryPolicy),
            retry("safe", Decider::Supervisor),
            // Not retry-safe: attempt 1 failed and was retried; attempt 2 never started.
            dispatched("closed"),
            started("closed"),
            retry("closed", Decider::RetryPolicy),
            // Not retry-safe: attempt 2 started, and nobody knows how it ended.
            dispatched("open"),
            started("open"),
            retry("open", Decider::RetryPolicy),
            started("open"),
        ]);
        assert_eq!(p[&occ("safe")], Prior::Redo { started: 2 });
        assert_eq!(p[&occ("closed")], Prior::Redo { started: 1 });
        assert_eq!(p[&occ("open")], Prior::Uncertain);
    }

    fn stored(records: Vec<Record>) -> Vec<Stored> {
        records
            .into_iter()
            .enumerate()
            .map(|(seq, record)| Stored {
                seq: seq as u64,
                at_ms: 100 + seq as u64,
                record,
            })
            .collect()
    }

    fn opened(reason: heddle_core::OpenReason) -> Record {
        Record::Opened {
            epoch: 1,
            reason,
            pid: 1,
            trace: None,
        }
    }

    /// Died attempts are the open ones the last owner started, when it ended neither
    /// paused nor finished; each is reported by the one recovery that follows its death.
    #[test]
    fn died_attempts_are_those_the_last_owner_started_and_never_ended() {
        use heddle_core::OpenReason::{Recover, Start};
        let completed = |n: &str| Record::Completed {
            occurrence: occ(n),
            outputs: Vec::new(),
            emitted: Vec::new(),
            metrics: Default::default(),
        };
        let first = vec![
            opened(Start),
            started("done"),
            completed("done"),
            started("retried"),
            retry("retried", Decider::RetryPolicy),
            started("retried"),
            started("lost"),
        ];
        let died = died_attempts(&stored(first.clone()));
        let got: Vec<(&str, u32, u64)> = died
            .iter()
            .map(|d| (d.occurrence.node.as_str(), d.attempt, d.started_at_ms))
            .collect();
        assert_eq!(got, [("retried", 2, 105), ("lost", 1, 106)]);

        // The owner that recovered it paused (reconcile): what it found died was
        // reported by it, and nothing it started was left running.
        let mut paused = first.clone();
        paused.push(opened(Recover));
        paused.push(Record::Paused {
            pause: heddle_core::PauseReason::Interrupted,
        });
        assert!(died_attempts(&stored(paused)).is_empty());
        // The owner that recovered it died too: only its own starts are its dead.
        let mut again = first;
        again.push(opened(Recover));
        again.push(started("later"));
        let died = died_attempts(&stored(again));
        assert_eq!(died.len(), 1);
        assert_eq!(died[0].occurrence, occ("later"));
        assert!(died_attempts(&[]).is_empty());
    }
}
