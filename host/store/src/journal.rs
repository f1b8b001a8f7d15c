//! The kernel's journal over a run log: records go to the [`RunLog`], and what an
//! earlier process recorded is reduced, per occurrence, to the crash table's decision.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use heddle_core::{Occurrence, Record, RecordedAction};
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
    settled: Option<Prior>,
}

/// The crash table (README, "Durable runs"), per occurrence, from the log alone: nothing
/// recorded → fresh; dispatched but not started, or started and retry-safe → redo;
/// started, not retry-safe and no result → reconcile; a result → replay it.
fn decide(records: &[Stored], reoffer: &dyn Fn(&Occurrence) -> bool) -> HashMap<Occurrence, Prior> {
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
                    RecordedAction::Skip => e.settled = Some(Prior::Skipped { error: error() }),
                    RecordedAction::EndStream => {
                        e.settled = Some(Prior::EndedStream { error: error() })
                    }
                    RecordedAction::Retry | RecordedAction::Approve | RecordedAction::Reject => {}
                }
            }
            _ => {}
        }
    }
    seen.into_iter()
        .map(|(occ, s)| {
            let retry_safe = !s.dispatched || s.recorded_retry_safe;
            let prior = match s.settled {
                Some(p) => p,
                None if s.started > 0 && !retry_safe && !reoffer(occ) => Prior::Uncertain,
                None if s.dispatched || s.started > 0 => Prior::Redo { started: s.started },
                None => Prior::Fresh,
            };
            (occ.clone(), prior)
        })
        .collect()
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
