//! A durable run's side of an invocation: what an earlier process recorded for an
//! occurrence is carried out instead of run again (the crash table), every attempt of a
//! node that is not retry-safe is written ahead (dispatch and start synced before its
//! code runs), and results and supervisor decisions are recorded. [`Actor::invoke`]
//! calls in here only when the run has a journal.

use std::sync::Arc;

use heddle_core::{
    Decider, InvocationMetrics, Occurrence, Record, RecordedAction, RecordedVerdict, SuspendInfo,
    Value,
};

use super::invoke::{Ahead, Invocation, Settled};

/// Resolves once a record is on disk ([`Journal::append_synced`]).
pub(super) type Written = BoxFuture<'static, Result<(), JournalError>>;

use super::routing::MintedTokens;
use super::{Actor, Stop};
use crate::executor::{BoxFuture, Emitted, Outputs};
use crate::journal::{Journal, JournalError, Prior, RECONCILE_REASON, SealError, Step};

impl Actor {
    /// Whether a durable run recomputes this node's invocations on recovery instead of
    /// journaling them: the kernel's own retry-safe built-ins (constant, foreach, collect,
    /// pass-through, gate) are deterministic functions of their inputs, rebuilt from the
    /// results recorded upstream for less than recording them would cost, and they
    /// report no usage. Under a supervisor they are journaled like any node, so a
    /// verdict about one is never asked again.
    ///
    /// A run-scoped resource ([`crate::Executor::run_scoped`], a server) is recomputed
    /// too, supervised or not: its recorded result would name a resource that died with
    /// the process that started it.
    ///
    /// A controlled node driven by controllers is journaled even then: its replies are
    /// what a controller that runs again on recovery must get back, the recorded ones.
    pub(super) fn recomputed(&self) -> bool {
        (self.native
            && self.spec.decl.retry_safe
            && self.shared.escalator.is_none()
            && !(self.spec.decl.mode == heddle_core::NodeMode::Controlled
                && self.spec.controllers > 0))
            || self.spec.exec.run_scoped()
    }

    /// A durable run's side of [`Actor::invoke`] before the attempts: what an earlier
    /// process recorded for this occurrence is carried out instead of run again (the
    /// invocation settles here), and a fresh one is admitted and written ahead.
    pub(super) async fn journal_ahead(
        &mut self,
        journal: &dyn Journal,
        inv: &Invocation<'_>,
        mint: &mut MintedTokens,
    ) -> Result<Ahead, Stop> {
        let occ = self.occurrence(&inv.key);
        let (fresh, begun) = match journal.prior(&occ) {
            Prior::Fresh => (true, 0),
            Prior::Redo { started } => (false, started),
            Prior::Completed {
                outputs,
                emitted,
                metrics,
            } => {
                self.invocations += 1;
                if !self.native {
                    self.rare().metrics.accumulate(&metrics);
                }
                *mint = MintedTokens::default();
                for (handle, value) in emitted {
                    if handle.as_ref() == crate::runtime::control::CONTROL_SENT {
                        if let Some(c) = self.spec.controls() {
                            c.resend(&value).await;
                        }
                        continue;
                    }
                    self.route_emitted(Emitted { handle, value }, inv.lineage, mint)
                        .await?;
                }
                return Ok(Ahead::Settled(Settled::Produced(outputs)));
            }
            Prior::Failed { error } => return Err(Stop::Failed(error)),
            Prior::Skipped { error, reason } => {
                self.skipped_by.get_or_insert(reason);
                return Ok(Ahead::Settled(Settled::Skipped { error }));
            }
            Prior::EndedStream { error } => return Ok(Ahead::Settled(Settled::Ended { error })),
            Prior::Uncertain => {
                return Err(Stop::Suspended(SuspendInfo {
                    node_id: self.spec.id.to_string(),
                    reason: RECONCILE_REASON.to_string(),
                    // An occurrence is three plain fields; it always serializes.
                    state: Value::from_json(
                        serde_json::to_value(&occ).expect("occurrence serializes"),
                    ),
                }));
            }
        };
        if fresh && let Err(e) = journal.admit(&occ) {
            return Err(Stop::Abort(format!(
                "node \"{}\" (type {}) at {occ}: {e}",
                self.spec.id, self.spec.node_type
            )));
        }
        if self.spec.decl.retry_safe {
            journal.passed(Step::Dispatch, &occ);
        } else if fresh {
            journal.append(Record::Dispatched {
                occurrence: occ.clone(),
                retry_safe: false,
            });
        }
        Ok(Ahead::Run { occ, fresh, begun })
    }

    /// A durable run's side of [`Actor::invoke`] after the attempts: failures, verdicts
    /// and a retry-safe suspension are recorded (results were, by the attempt).
    pub(super) async fn journal_settled(
        &mut self,
        journal: &dyn Journal,
        occ: Occurrence,
        fresh: bool,
        settled: Result<Settled, Stop>,
    ) -> Result<Settled, Stop> {
        let supervised = self.shared.escalator.is_some();
        let record = match &settled {
            Err(Stop::Failed(error)) => Record::Failed {
                occurrence: occ,
                error: error.clone(),
                metrics: InvocationMetrics::default(),
            },
            Ok(Settled::Skipped { error }) | Ok(Settled::Ended { error }) => {
                let action = if matches!(settled, Ok(Settled::Skipped { .. })) {
                    RecordedAction::Skip
                } else {
                    RecordedAction::EndStream
                };
                Record::Verdict {
                    occurrence: occ,
                    verdict: RecordedVerdict::new(action)
                        .with_error(error.clone())
                        .with_note(self.rare.as_mut().and_then(|r| r.decision_note.take())),
                    decided_by: Decider::Supervisor,
                }
            }
            // A retry-safe invocation records no dispatch while it runs; one that suspends
            // the run (a gate, a node waiting for a person) is recorded now, so the pause
            // names an occurrence that its answer and the resume can find.
            Err(Stop::Suspended(_)) if fresh && self.spec.decl.retry_safe => Record::Dispatched {
                occurrence: occ,
                retry_safe: true,
            },
            _ => return settled,
        };
        // A supervisor's decision is on disk before it is carried out, so recovery
        // carries it out again instead of asking again (a fail verdict is the failure).
        if supervised {
            self.append_synced(journal, record).await?;
        } else {
            journal.append(record);
        }
        settled
    }

    /// Writes `record` (a supervisor's decision, or a result or start that must not be
    /// lost) and waits until it is on disk; a store failure stops the node.
    pub(super) async fn append_synced(
        &self,
        journal: &dyn Journal,
        record: Record,
    ) -> Result<(), Stop> {
        journal
            .append_synced(record)
            .await
            .map_err(|e| self.journal_stop(e))
    }

    /// This invocation's occurrence: node id, lineage key and how many invocations at
    /// that key came before it.
    pub(super) fn occurrence(&mut self, key: &Arc<str>) -> Occurrence {
        let n = self.rare().occurrences.entry(key.clone()).or_insert(0);
        let seen = *n;
        *n += 1;
        Occurrence::new(&*self.spec.id, &**key, seen)
    }

    /// Records the start of an attempt: on disk before node code runs when the node is
    /// not retry-safe (its one synced write before it starts). A retry-safe start never
    /// changes a recovery decision; it is group-committed only for executors that can
    /// spend outside the process ([`crate::Executor::spends_outside`]), so an attempt that died
    /// before its result shows as usage unknown rather than zero. Native built-ins and
    /// sandboxed nodes spend nothing there and record no start. The caller waits on the
    /// returned future, if any, before node code runs.
    pub(super) fn record_start(&self, journal: &dyn Journal, occ: &Occurrence) -> Option<Written> {
        if self.spec.decl.retry_safe && (self.native || !self.spec.exec.spends_outside()) {
            journal.passed(Step::Start, occ);
            return None;
        }
        let record = Record::Started {
            occurrence: occ.clone(),
        };
        self.append_by_safety(journal, record)
    }

    /// Appends `record`, group-committed for a retry-safe node; for a node that is not
    /// retry-safe the caller waits on the returned future, resolved once it is on disk.
    /// Not an async fn: most records are retry-safe ones and nothing is awaited for them,
    /// so no future is built (and boxed) per record.
    fn append_by_safety(&self, journal: &dyn Journal, record: Record) -> Option<Written> {
        if self.spec.decl.retry_safe {
            journal.append(record);
            return None;
        }
        Some(journal.append_synced(record))
    }

    /// Records an attempt's outputs. A node that is not retry-safe waits (on the returned
    /// future) for the record to be on disk before its outputs go downstream: a lost
    /// result would make recovery pause on work that did complete.
    pub(super) fn record_result(
        &mut self,
        journal: &dyn Journal,
        occ: &Occurrence,
        out: &Outputs,
        metrics: InvocationMetrics,
    ) -> Result<Option<Written>, Stop> {
        let record = self.result_record(occ, out, metrics);
        let record = self.sealed(journal, record)?;
        Ok(self.append_by_safety(journal, record))
    }

    /// Waits until a record [`Self::record_start`] or [`Self::record_result`] wrote is on
    /// disk; a store failure stops the node.
    pub(super) async fn written(&self, wait: Written) -> Result<(), Stop> {
        wait.await.map_err(|e| self.journal_stop(e))
    }

    pub(super) fn result_record(
        &mut self,
        occ: &Occurrence,
        out: &Outputs,
        metrics: InvocationMetrics,
    ) -> Record {
        Record::Completed {
            occurrence: occ.clone(),
            outputs: out
                .iter()
                .map(|(h, v)| (h.to_string(), v.clone()))
                .collect(),
            emitted: self
                .rare
                .as_mut()
                .and_then(|r| r.emitted.take())
                .unwrap_or_default()
                .into_iter()
                .map(|(h, v)| (h.to_string(), v))
                .collect(),
            metrics,
        }
    }

    /// A result record as the journal will append it ([`Journal::seal`]); a refused
    /// one fails the invocation, so its values go nowhere.
    pub(super) fn sealed(&self, journal: &dyn Journal, record: Record) -> Result<Record, Stop> {
        journal.seal(record).map_err(|e| match e {
            SealError::Refused(e) => Stop::Failed(format!(
                "node \"{}\" (type {}): its result was not recorded: {e}",
                self.spec.id, self.spec.node_type
            )),
            SealError::Journal(e) => self.journal_stop(e),
        })
    }

    pub(super) fn journal_stop(&self, e: crate::journal::JournalError) -> Stop {
        Stop::Abort(format!(
            "node \"{}\" (type {}): {e}; the run stops so nothing runs unrecorded",
            self.spec.id, self.spec.node_type
        ))
    }
}
