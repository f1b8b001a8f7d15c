//! The write-ahead seam of a durable run. The kernel records every invocation here in
//! its one invocation path (for a node that is not retry-safe the dispatch before the
//! executor gets it and the start before node code runs; for every node the result when
//! it ends and supervisor verdicts) and asks what a previous process already recorded for
//! an occurrence, to apply the crash table. A store implements it; the kernel never names
//! one. A run without a journal never builds an occurrence.

use std::sync::Arc;

use heddle_core::{InvocationMetrics, Occurrence, Record, SkipReason, Value};

use crate::executor::{BoxFuture, Outputs};

/// What an earlier process recorded for an occurrence, reduced to what the kernel does
/// about it (the crash table: README, "Durable runs").
#[derive(Clone, Debug, PartialEq)]
pub enum Prior {
    /// Nothing recorded: decide and dispatch.
    Fresh,
    /// Dispatched but never started (node code provably did not run), or started and
    /// retry-safe, or offered again by an explicit resume: run it without recording a
    /// second dispatch. `started` counts the attempts an earlier process began, so the
    /// next one carries its real number and a crash never refills the retry allowance.
    Redo {
        /// Attempts an earlier process began.
        started: u32,
    },
    /// A result was recorded: feed it downstream without running anything.
    Completed {
        /// The recorded outputs.
        outputs: Outputs,
        /// What a streaming node emitted before returning, in order.
        emitted: Vec<(Arc<str>, Value)>,
        /// What the recorded invocation measured and reported (its cost counts once).
        metrics: InvocationMetrics,
    },
    /// A terminal failure was recorded: the node fails the same way without running.
    Failed {
        /// The recorded error.
        error: String,
    },
    /// A recorded decision dropped the invocation (a supervisor's skip verdict, or a
    /// person's skip answer to a reconcile pause); carried out, never asked again.
    Skipped {
        /// The failure skipped, or the person's answer.
        error: String,
        /// Who skipped it: [`SkipReason::Supervisor`] or [`SkipReason::Reconciled`].
        reason: SkipReason,
    },
    /// The supervisor's recorded verdict ended the invocation's stream; carried out,
    /// never asked again.
    EndedStream {
        /// The failure that ended it.
        error: String,
    },
    /// Started, not retry-safe, no result: whether its effect happened is unknown. The
    /// run pauses for reconciliation; nothing runs.
    Uncertain,
}

/// A journal failed: the run cannot continue durably and stops (fail closed).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the durable run log failed: {source}")]
pub struct JournalError {
    /// The store's error.
    #[source]
    pub source: Arc<dyn std::error::Error + Send + Sync>,
}

/// A write-ahead boundary a retry-safe invocation passes without a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Decided and handed towards its executor.
    Dispatch,
    /// About to run node code.
    Start,
}

/// Why a journal did not take a result record ([`Journal::seal`]); nothing was appended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SealError {
    /// The store must not keep a value (over its limits, holding a secret): the
    /// invocation fails with this, and its values go nowhere.
    #[error(transparent)]
    Refused(Refused),
    /// The store failed: the run stops, as on any journal failure.
    #[error(transparent)]
    Journal(JournalError),
}

/// The run's budget refused another dispatch; the run stops (the journal keeps which
/// budget ran out, for whoever records the ending).
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct Refused(
    /// Which budget, and what was spent.
    pub Arc<dyn std::error::Error + Send + Sync>,
);

/// Where a durable run's invocations are written ahead: the kernel asks it what an
/// earlier process recorded for an invocation and tells it every step (dispatch, start,
/// result, verdict) before going on. A run without one is kept in memory only.
pub trait Journal: Send + Sync {
    /// What an earlier process recorded for `occ`.
    fn prior(&self, occ: &Occurrence) -> Prior;

    /// Counts a dispatch against the run's budget before it happens: a fresh occurrence
    /// (nothing recorded for it yet), and each retry of one. Recovered and resumed
    /// occurrences are never admitted again: they were counted when first dispatched.
    fn admit(&self, _occ: &Occurrence) -> Result<(), Refused> {
        Ok(())
    }

    /// A retry-safe invocation passed `step`. Its dispatch and start are not recorded:
    /// they never change a recovery decision (without a result it runs again either
    /// way), so retry-safe work costs one group-committed result record. A store may
    /// use the call for fault injection; nothing is written.
    fn passed(&self, _step: Step, _occ: &Occurrence) {}

    /// Readies a result record for the log before it is appended: a store may keep
    /// values too large for a record elsewhere and put references in their place.
    fn seal(&self, record: Record) -> Result<Record, SealError> {
        Ok(record)
    }

    /// Appends a record that may be group-committed.
    fn append(&self, record: Record);

    /// Appends a record and resolves once it, and everything before it, is on disk.
    fn append_synced(&self, record: Record) -> BoxFuture<'static, Result<(), JournalError>>;
}

/// The kernel's pause reason for an uncertain occurrence; the caller records the pause.
pub const RECONCILE_REASON: &str = "reconcile";

impl std::fmt::Debug for dyn Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Journal")
    }
}
