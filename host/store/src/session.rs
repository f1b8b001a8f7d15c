//! The life of a durable run around the kernel: begin (record the run, take it), reopen
//! (check a resume without writing, then take the run over), end (record how the
//! kernel's run ended) and cancel. The CLI drives these; a server would too.

use std::sync::Arc;

use heddle_core::trace::RunTrace;
use heddle_core::{
    NodeOutcome, Occurrence, OpenReason, PauseReason, Record, RunResult, RunStatus, SkipReason,
    Value,
};
use heddle_kernel::journal::RECONCILE_REASON;

use crate::spill::Spiller;
use crate::status::{OpenPause, RunState, RunView};
use crate::{
    Budget, DurableJournal, Exhausted, NewRun, RunHeader, RunLog, RunStore, Spent, StoreError,
    Stored,
};

/// A run this process owns: its log and the journal the kernel writes through.
pub struct Session {
    pub run_id: String,
    pub log: Arc<RunLog>,
    pub journal: Arc<DurableJournal>,
    /// The run's recorded budget.
    pub budget: Budget,
    /// What earlier processes spent (nothing for a new run).
    pub spent: Spent,
    /// Where the run's large values go; [`Spiller::configure`] sets its inline limit
    /// and known secrets.
    pub spill: Spiller,
    /// Where the run is stored: an ending without a kernel's report reads the log back
    /// to say which nodes never ran ([`Session::never_ran`]).
    store: Arc<dyn RunStore>,
    /// When this process took the run (just before its `opened` record): where the log
    /// starts counting this process's execution time.
    taken: std::time::Instant,
}

impl Session {
    /// Sets how the run's values are stored (inline limit, artifact limits) and the
    /// secret values the log must never hold: values holding one are refused, text
    /// masked ([`crate::secrets`]). Only the first call counts.
    pub fn configure(&self, spill: crate::spill::Spill) {
        self.log.keep_out(spill.policy.known_secrets.clone());
        self.spill.configure(spill);
    }

    /// Execution time the run has left from when this process took it; `None` without
    /// a limit. The caller keeps the clock and calls [`DurableJournal::exhaust`].
    pub fn time_left(&self) -> Option<std::time::Duration> {
        self.budget.time_left(&self.spent)
    }

    /// When the run's execution time runs out; `None` without a limit. Counted from when
    /// this process took the run, as the log counts execution, not from when its nodes
    /// start: loading and preparing them comes later and would otherwise be time the
    /// limit never sees. The caller keeps the clock and calls [`DurableJournal::exhaust`].
    pub fn deadline(&self) -> Option<std::time::Instant> {
        Some(self.taken + self.time_left()?)
    }

    /// The budget that is already spent before anything runs here.
    pub fn exhausted_at_open(&self) -> Option<Exhausted> {
        self.budget.exhausted(&self.spent)
    }

    /// Whether another process asked for the run to be cancelled
    /// ([`RunStore::request_cancel`]).
    pub fn cancel_requested(&self) -> Result<bool, StoreError> {
        self.store.cancel_requested(&self.run_id)
    }

    /// Gives the run's lease up once its ending or pause is written
    /// ([`RunStore::let_go`]); one that cannot be given up now expires on its own.
    fn let_go(&self) {
        let _ = self.store.let_go(&self.run_id, self.log.epoch());
    }

    /// The nodes that never ran by the log as it stands (what this process wrote
    /// flushed first), each skipped for `reason`: for an ending no kernel reported on.
    fn never_ran(&self, reason: SkipReason) -> Result<Vec<(String, SkipReason)>, StoreError> {
        self.log.flush().wait()?;
        let (header, _, view) = inspect_progress(&*self.store, &self.run_id)?;
        Ok(never_ran(&header, &view, reason))
    }
}

/// What a process writes when it takes a run: its `opened` record (why, and the trace it
/// continues or starts) and `extra` records in the same transaction (a resume's
/// `resumed`, a person's answer).
struct Opening {
    reason: OpenReason,
    trace: Option<RunTrace>,
    extra: Vec<Record>,
}

/// Takes the run over after `records` (the log as checked, values read back) with
/// `opening` in one transaction. The journal decides from `records` and `answered` (the
/// answer's records with their values, as recovery reads them back later).
fn open(
    store: Arc<dyn RunStore>,
    header: &RunHeader,
    records: &[Stored],
    opening: Opening,
    answered: Vec<Record>,
    reoffer: &dyn Fn(&Occurrence) -> bool,
) -> Result<Session, StoreError> {
    let Opening {
        reason,
        trace,
        extra,
    } = opening;
    let run_id = header.run_id.as_str();
    // The one point where a taker wins: the opening records go in with the new epoch,
    // only if nobody took the run since `records` were read.
    let opening_records = |epoch| {
        [Record::Opened {
            epoch,
            reason,
            pid: std::process::id(),
            trace,
        }]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect::<Vec<_>>()
    };
    let written = 1 + extra.len() as u64;
    let epoch = take_over(&*store, run_id, records.len() as u64, &opening_records)?;
    if !records.is_empty() {
        // Blobs an earlier process stored for a record it never committed: unreadable,
        // and they would count against the run's artifact quota for good. Decided from
        // the log as stored (read again now that the torn tail is gone), never from
        // `records`, whose references recovery replaced by their values.
        crate::spill::sweep(&*store, run_id)?;
    }
    Ok(taken(
        store, header, records, epoch, written, answered, reoffer,
    ))
}

/// The session of a run this process just took at `epoch`, its log `records` as
/// checked followed by the `written` records of the opening.
fn taken(
    store: Arc<dyn RunStore>,
    header: &RunHeader,
    records: &[Stored],
    epoch: u64,
    written: u64,
    answered: Vec<Record>,
    reoffer: &dyn Fn(&Occurrence) -> bool,
) -> Session {
    let run_id = header.run_id.as_str();
    let budget = header.run.limits.budget;
    let spent = RunView::fold(records, |_| false).spent();
    let spill = Spiller::new(store.clone(), run_id);
    let taken = std::time::Instant::now();
    let log = Arc::new(RunLog::start(
        store.clone(),
        run_id,
        epoch,
        records.len() as u64 + written,
    ));
    let decided: Vec<Stored>;
    let records = if answered.is_empty() {
        records
    } else {
        let next = records.len() as u64;
        decided = records
            .iter()
            .cloned()
            .chain(answered.into_iter().enumerate().map(|(i, record)| Stored {
                seq: next + i as u64,
                at_ms: 0,
                record,
            }))
            .collect();
        &decided
    };
    let journal = Arc::new(
        DurableJournal::with_budget(log.clone(), records, reoffer, budget).spilling(spill.clone()),
    );
    Session {
        run_id: run_id.to_string(),
        log,
        journal,
        budget,
        spent,
        spill,
        store,
        taken,
    }
}

/// [`RunStore::take_over`] of `run_id` after the `next` records its taker checked; a
/// taker that lost is told what the winner made of the run ([`StoreError::TakenOver`]).
fn take_over(
    store: &dyn RunStore,
    run_id: &str,
    next: u64,
    opening: &dyn Fn(u64) -> Vec<Record>,
) -> Result<u64, StoreError> {
    match store.take_over(run_id, next, opening) {
        Err(StoreError::NotNext { .. }) => {
            let (_, _, view) = inspect_progress(store, run_id)?;
            let now = match (view.state, view.owner_pid) {
                (RunState::Running, Some(pid)) => format!("running, owner process {pid}"),
                (state, _) => state.as_str().to_string(),
            };
            Err(StoreError::TakenOver {
                run: run_id.to_string(),
                now,
            })
        }
        r => r,
    }
}

/// Records a new run and takes it.
pub fn begin(store: Arc<dyn RunStore>, run: &NewRun) -> Result<(RunHeader, Session), StoreError> {
    begin_traced(store, run, None)
}

/// [`begin`], recording the run's trace with its first `opened` record.
pub fn begin_traced(
    store: Arc<dyn RunStore>,
    run: &NewRun,
    trace: Option<RunTrace>,
) -> Result<(RunHeader, Session), StoreError> {
    // The run and its first owner's `opened` record in one transaction
    // ([`RunStore::create_and_take`]): a new run costs one synced commit.
    let opening = |epoch| {
        vec![Record::Opened {
            epoch,
            reason: OpenReason::Start,
            pid: std::process::id(),
            trace,
        }]
    };
    let (header, epoch) = store.create_and_take(run, &opening)?;
    let session = taken(store, &header, &[], epoch, 1, Vec::new(), &|_| false);
    Ok((header, session))
}

/// The trace a run records (the first `opened` record that carries one, else the one
/// it was queued under, [`crate::RunLimits::trace`]): what every later owner continues.
pub fn recorded_trace(header: &RunHeader, records: &[Stored]) -> Option<RunTrace> {
    records
        .iter()
        .find_map(|s| match &s.record {
            Record::Opened { trace, .. } => *trace,
            _ => None,
        })
        .or(header.run.limits.trace)
}

/// What a resume will do, checked without writing anything.
pub struct Resumption {
    pub header: RunHeader,
    /// The log as stored (large values are references; [`reopen`] reads them back).
    pub records: Vec<Stored>,
    pub view: RunView,
    /// The pause it reopens (none when it recovers an interrupted run).
    pub pause: Option<OpenPause>,
}

impl Resumption {
    /// Whether this resume offers `occ` again although it started without a recorded
    /// result: the uncertain occurrence of a reconcile pause, or the invocation of a node
    /// that suspended the run (it asked to be run again once the user answered).
    pub fn reoffers(&self, occ: &Occurrence) -> bool {
        match &self.pause {
            Some(OpenPause {
                reason: PauseReason::Reconcile { occurrence },
                ..
            }) => occurrence == occ,
            Some(OpenPause {
                reason: PauseReason::Suspend { node, .. },
                ..
            }) => &occ.node == node,
            _ => false,
        }
    }
}

/// Reads a run and its state from the log, with the values its records refer to read
/// back and verified (`TERMINAL_ARTIFACT` when one is missing or corrupt).
pub fn inspect(
    store: &dyn RunStore,
    run_id: &str,
) -> Result<(RunHeader, Vec<Stored>, RunView), StoreError> {
    let header = store.header(run_id)?;
    let mut records = store.read(run_id, 0)?.records;
    crate::spill::resolve(store, run_id, &mut records)?;
    let view = RunView::fold_as(&records, &store.liveness(run_id)?);
    Ok((header, records, view))
}

/// [`inspect`] for showing a run: large values stay references, each verified; one
/// whose artifact is missing or corrupt is left as a marker and listed
/// ([`crate::spill::check_marking`]) instead of failing.
pub fn inspect_readable(
    store: &dyn RunStore,
    run_id: &str,
) -> Result<(RunHeader, RunView, Vec<crate::spill::Unreadable>), StoreError> {
    let header = store.header(run_id)?;
    let mut records = store.read(run_id, 0)?.records;
    let unreadable = crate::spill::check_marking(store, run_id, &mut records)?;
    let view = RunView::fold_as(&records, &store.liveness(run_id)?);
    Ok((header, view, unreadable))
}

/// [`inspect`] without reading any value back: large values stay references. For
/// readers of progress, which never need them.
pub fn inspect_progress(
    store: &dyn RunStore,
    run_id: &str,
) -> Result<(RunHeader, Vec<Stored>, RunView), StoreError> {
    let header = store.header(run_id)?;
    let read = store.read(run_id, 0)?;
    let view = RunView::fold_as(&read.records, &store.liveness(run_id)?);
    Ok((header, read.records, view))
}

/// Checks that `run_id` can be resumed (at pause event `pause`, when given).
pub fn check_resume(
    store: &dyn RunStore,
    run_id: &str,
    pause: Option<u64>,
) -> Result<Resumption, StoreError> {
    let (header, records, view) = inspect_progress(store, run_id)?;
    match view.state {
        RunState::Paused | RunState::Interrupted => {}
        RunState::Running => return Err(live(run_id, &view)),
        s => {
            return Err(StoreError::NotResumable {
                run: run_id.to_string(),
                state: s.as_str(),
            });
        }
    }
    let open = view.pause.clone();
    if let Some(expected) = pause {
        let found = open.as_ref().map(|p| p.event.to_string());
        if found.as_deref() != Some(expected.to_string().as_str()) {
            return Err(StoreError::PauseMismatch {
                run: run_id.to_string(),
                expected: expected.to_string(),
                found: found.unwrap_or_else(|| "none".into()),
            });
        }
    }
    Ok(Resumption {
        header,
        records,
        view,
        pause: open,
    })
}

/// Takes the run over and reopens it: a paused run at its pause (the user decided), an
/// interrupted one by recovery (no decision is implied: uncertain work pauses again).
pub fn reopen(store: Arc<dyn RunStore>, r: &Resumption) -> Result<Session, StoreError> {
    reopen_traced(store, r, None)
}

/// [`reopen`], recording `trace` with this process's `opened` record: for a run whose
/// log records none yet ([`recorded_trace`]), traced from now on.
pub fn reopen_traced(
    store: Arc<dyn RunStore>,
    r: &Resumption,
    trace: Option<RunTrace>,
) -> Result<Session, StoreError> {
    reopen_answered(store, r, Vec::new(), trace)
}

/// [`reopen_traced`] of a reconcile pause with a person's `answer` to it (a
/// [`Record::Reconciled`], and for a completion the [`Record::Completed`] holding the
/// outputs they supplied, its large values already stored as artifacts and its text
/// masked): written with the `opened` and `resumed` records in the take-over's one
/// transaction, so the answer is on disk exactly when the pause is closed, and every
/// later recovery carries it out instead of asking again.
pub fn reopen_answered(
    store: Arc<dyn RunStore>,
    r: &Resumption,
    answer: Vec<Record>,
    trace: Option<RunTrace>,
) -> Result<Session, StoreError> {
    let (reason, resumed) = match &r.pause {
        Some(p) => (OpenReason::Resume, Some(Record::Resumed { pause: p.event })),
        // A run no process opened yet (queued, or a watchdog's first worker) starts.
        None if r.records.is_empty() => (OpenReason::Start, None),
        None => (OpenReason::Recover, None),
    };
    // Recovery feeds recorded results downstream: their real values, verified.
    let mut records = r.records.clone();
    crate::spill::resolve(&*store, &r.header.run_id, &mut records)?;
    let mut answered: Vec<Stored> = answer
        .iter()
        .cloned()
        .map(|record| Stored {
            seq: 0,
            at_ms: 0,
            record,
        })
        .collect();
    crate::spill::resolve(&*store, &r.header.run_id, &mut answered)?;
    let extra = resumed.into_iter().chain(answer).collect();
    let answered = answered.into_iter().map(|s| s.record).collect();
    // Acquiring drops a torn tail; read again so numbering continues after what counts.
    let session = open(
        store.clone(),
        &r.header,
        &records,
        Opening {
            reason,
            trace,
            extra,
        },
        answered,
        &|occ| r.reoffers(occ),
    )?;
    Ok(session)
}

/// How a durable run ended, as recorded.
#[derive(Debug)]
pub enum Ending {
    Finished(RunStatus),
    Paused {
        event: u64,
        reason: PauseReason,
    },
    /// A budget ran out: the run ended failed.
    Exhausted(Exhausted),
}

/// Records that a budget ran out before anything ran here (the run ends failed, its
/// nodes that never ran skipped as cancelled) and closes the log.
pub fn end_exhausted(session: &Session, e: Exhausted) -> Result<Ending, StoreError> {
    let skipped = session.never_ran(SkipReason::Cancelled)?;
    finish(session, RunStatus::Failed, Some(e.to_string()), skipped)?;
    Ok(Ending::Exhausted(e))
}

/// Ends a run that this process took but never ran (cancelled before a worker took it,
/// or its plan refused by the kernel) with `status` and `error`; the nodes that never
/// ran are skipped for `reason`. Closes the log.
pub fn end_unrun(
    session: &Session,
    status: RunStatus,
    error: Option<String>,
    reason: SkipReason,
) -> Result<Ending, StoreError> {
    let skipped = session.never_ran(reason)?;
    finish(session, status, error, skipped)?;
    Ok(Ending::Finished(status))
}

/// Writes [`finish_records`] through the session's log (synced) and closes it.
fn finish(
    session: &Session,
    status: RunStatus,
    error: Option<String>,
    skipped: Vec<(String, SkipReason)>,
) -> Result<(), StoreError> {
    let mut records = finish_records(status, error, skipped);
    // Built with the ending last.
    let last = records.pop().expect("an ending");
    for r in records {
        session.log.append(r);
    }
    let (_, wait) = session.log.append_synced(last);
    wait.wait()?;
    session.log.close()?;
    session.let_go();
    Ok(())
}

/// How a run is about to end, decided before anything is recorded, so a caller can
/// hand its report over first: a process killed between the report and the record
/// leaves a run that recovery finishes again (every result replayed), never a recorded
/// ending whose report was lost.
#[derive(Debug)]
pub enum Planned {
    Pause(PauseReason),
    Finish {
        status: RunStatus,
        error: Option<String>,
        /// The nodes that never ran, and why.
        skipped: Vec<(String, SkipReason)>,
    },
    /// A budget ran out: the run ends failed.
    Exhausted {
        exhausted: Exhausted,
        /// The nodes that never ran, and why.
        skipped: Vec<(String, SkipReason)>,
    },
}

/// Decides how the kernel's run ends. A run cancelled by the user's interrupt
/// (`interrupted`) is paused, not ended: it stays resumable. A run stopped because a
/// budget ran out ends failed whatever the kernel reported.
pub fn plan_ending(session: &Session, result: &RunResult, interrupted: bool) -> Planned {
    if let Some(e) = session.journal.exhausted() {
        return Planned::Exhausted {
            exhausted: e.clone(),
            skipped: kernel_skipped(result),
        };
    }
    match result.status {
        RunStatus::Cancelled if interrupted => Planned::Pause(PauseReason::Interrupted),
        RunStatus::Suspended => Planned::Pause(match &result.suspend {
            Some(s) if s.reason == RECONCILE_REASON => PauseReason::Reconcile {
                occurrence: reconcile_occurrence(&s.state)
                    .unwrap_or_else(|| Occurrence::new(s.node_id.clone(), "", 0)),
            },
            Some(s) => PauseReason::Suspend {
                node: s.node_id.clone(),
                reason: s.reason.clone(),
            },
            None => PauseReason::Suspend {
                node: String::new(),
                reason: "suspended".into(),
            },
        }),
        status => Planned::Finish {
            status,
            error: result.error.clone(),
            skipped: kernel_skipped(result),
        },
    }
}

/// The nodes the kernel's run skipped for good, and why.
fn kernel_skipped(result: &RunResult) -> Vec<(String, SkipReason)> {
    result
        .nodes
        .iter()
        .filter_map(|(node, r)| match r.outcome {
            // Not skipped for good: the node runs when the run is resumed.
            NodeOutcome::Skipped {
                reason: SkipReason::Suspended,
            } => None,
            NodeOutcome::Skipped { reason } => Some((node.to_string(), reason)),
            _ => None,
        })
        .collect()
}

/// Records a planned ending (synced) and closes the log.
pub fn record_ending(session: &Session, planned: Planned) -> Result<Ending, StoreError> {
    match planned {
        Planned::Exhausted { exhausted, skipped } => {
            finish(
                session,
                RunStatus::Failed,
                Some(exhausted.to_string()),
                skipped,
            )?;
            Ok(Ending::Exhausted(exhausted))
        }
        Planned::Pause(reason) => {
            let (event, wait) = session.log.append_synced(Record::Paused {
                pause: reason.clone(),
            });
            wait.wait()?;
            session.log.close()?;
            session.let_go();
            Ok(Ending::Paused { event, reason })
        }
        Planned::Finish {
            status,
            error,
            skipped,
        } => {
            finish(session, status, error, skipped)?;
            Ok(Ending::Finished(status))
        }
    }
}

/// Records how the kernel's run ended ([`plan_ending`], then [`record_ending`]).
pub fn end(session: &Session, result: &RunResult, interrupted: bool) -> Result<Ending, StoreError> {
    record_ending(session, plan_ending(session, result, interrupted))
}

/// The occurrence the kernel put in a reconcile suspension's state.
fn reconcile_occurrence(state: &Value) -> Option<Occurrence> {
    serde_json::from_value(state.to_json()).ok()
}

/// The records that finish a run, in order: why each node that never ran did not
/// (`skipped`), then the ending. Every way a run finishes writes these (the kernel's
/// ending through [`record_ending`], a cancel or a rejected gate of a run no process
/// drives through [`end_cancelled`]), in one synced batch: a log that shows the ending
/// shows why every node that never ran did not.
fn finish_records(
    status: RunStatus,
    error: Option<String>,
    skipped: Vec<(String, SkipReason)>,
) -> Vec<Record> {
    skipped
        .into_iter()
        .map(|(node, reason)| Record::Skipped { node, reason })
        .chain([Record::Finished { status, error }])
        .collect()
}

/// Cancels a run no live process owns (paused or interrupted): takes it over and
/// records the cancel and the ending. A live run is refused ([`StoreError::Live`]): its
/// owner is asked instead ([`RunStore::request_cancel`]). `secrets` are the known
/// secret values (see [`end_cancelled`]).
pub fn cancel(
    store: Arc<dyn RunStore>,
    run_id: &str,
    secrets: &[String],
) -> Result<(), StoreError> {
    end_cancelled(
        store,
        run_id,
        Vec::new(),
        "cancelled by heddle runs cancel".into(),
        secrets,
    )
}

/// Cancels a run that is not running here with `reason` as its error, after recording
/// `decisions` (a rejected gate's verdict): all in one append, so the run never shows
/// the decision without its ending, and with a `skipped` record for every node that
/// never ran ([`never_ran`]), as the kernel's ending writes them.
///
/// This is the one write to a run's log that does not go through a [`crate::RunLog`],
/// so it masks `secrets` (the known secret values) out of every record itself, as the
/// log does ([`crate::secrets::mask_record`]): a person's note (a rejection's) may
/// quote one.
pub fn end_cancelled(
    store: Arc<dyn RunStore>,
    run_id: &str,
    decisions: Vec<Record>,
    reason: String,
    secrets: &[String],
) -> Result<(), StoreError> {
    let (header, records, view) = inspect_progress(&*store, run_id)?;
    if view.state.is_final() {
        return Err(StoreError::AlreadyEnded {
            run: run_id.to_string(),
            state: view.state.as_str(),
        });
    }
    if view.state == RunState::Running {
        // Taking a live run over would cut its owner off mid-write: its owner is asked
        // instead ([`RunStore::request_cancel`]).
        return Err(live(run_id, &view));
    }
    let skipped = never_ran(&header, &view, SkipReason::Cancelled);
    let mut batch: Vec<Record> = decisions
        .into_iter()
        .chain([Record::CancelRequested])
        .chain(finish_records(RunStatus::Cancelled, Some(reason), skipped))
        .collect();
    if let Some(r) = crate::secrets::redactor(secrets) {
        batch = batch
            .into_iter()
            .map(|record| crate::secrets::mask_record(&r, record))
            .collect();
    }
    let epoch = take_over(&*store, run_id, records.len() as u64, &|_| batch.clone())?;
    // Ended: nothing more of it is written (a lease not given back expires on its own).
    let _ = store.let_go(run_id, epoch);
    Ok(())
}

/// The refusal of a request that needs a run nobody drives, while someone does: its
/// host on a store several hosts share, else its process.
fn live(run_id: &str, view: &RunView) -> StoreError {
    match &view.owner_host {
        Some(host) => StoreError::RunOwned {
            run: run_id.to_string(),
            host: host.clone(),
            epoch: view.epoch,
            left_ms: view.lease_left_ms.unwrap_or(0),
        },
        None => StoreError::Live {
            run: run_id.to_string(),
            pid: view.owner_pid.unwrap_or(0),
        },
    }
}

/// The nodes of a run no kernel reported on that never ran, each skipped for `reason`
/// (a cancelled run's: cancelled, what the kernel reports for the nodes of a cancelled
/// run that had not finished), from the log alone. A node with a recorded result ran; one with an invocation
/// recorded without a result (a gate waiting for its answer, an uncertain start) did
/// not. A node whose results are not recorded (the kernel's own built-ins, recomputed
/// on recovery) ran when every node feeding it delivered: ran with a completed
/// invocation, or is such a node itself; one that nothing feeds ran once any process
/// ran the run (the log records an invocation), so a run cancelled before it ever ran
/// skips every node. The run's nodes are its stored plan's (those
/// the kernel reports on), the edges its stored document's; a document that no longer
/// parses yields none (there is nothing to tell which nodes ran).
fn never_ran(header: &RunHeader, view: &RunView, reason: SkipReason) -> Vec<(String, SkipReason)> {
    use std::collections::{BTreeMap, BTreeSet};
    let Ok(text) = std::str::from_utf8(&header.run.graph_bytes) else {
        return Vec::new();
    };
    let Ok(doc) = heddle_core::GraphDoc::parse(text, &header.run.graph_name) else {
        return Vec::new();
    };
    let planned: Vec<String> = header.run.plan.nodes.iter().map(|n| n.id.clone()).collect();
    // Per node: whether an invocation completed, and whether one is open.
    let mut completed = BTreeSet::new();
    let mut recorded = BTreeSet::new();
    let mut open = BTreeSet::new();
    for (occ, o) in &view.occurrences {
        match &o.result {
            Some(crate::status::Outcome::Completed { .. }) => {
                completed.insert(occ.node.as_str());
                recorded.insert(occ.node.as_str());
            }
            Some(crate::status::Outcome::Failed { .. }) => {
                recorded.insert(occ.node.as_str());
            }
            None => {
                open.insert(occ.node.as_str());
            }
        }
    }
    let mut feeders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in &doc.edges {
        feeders
            .entry(e.target.as_str())
            .or_default()
            .push(e.source.as_str());
    }
    // Whether `node` delivered its outputs downstream; memoized, and a cycle (which
    // no planned document has) counts as not delivered.
    #[allow(clippy::too_many_arguments)] // the log's facts, borrowed separately
    fn delivered<'a>(
        node: &'a str,
        ran_at_all: bool,
        completed: &BTreeSet<&str>,
        recorded: &BTreeSet<&str>,
        open: &BTreeSet<&str>,
        feeders: &BTreeMap<&'a str, Vec<&'a str>>,
        memo: &mut BTreeMap<&'a str, Option<bool>>,
    ) -> bool {
        if completed.contains(node) {
            return true;
        }
        if recorded.contains(node) || open.contains(node) {
            return false;
        }
        match memo.get(node) {
            Some(Some(d)) => return *d,
            Some(None) => return false,
            None => {}
        }
        memo.insert(node, None);
        let d = match feeders.get(node) {
            None => ran_at_all,
            Some(fs) => fs
                .iter()
                .all(|f| delivered(f, ran_at_all, completed, recorded, open, feeders, memo)),
        };
        memo.insert(node, Some(d));
        d
    }
    let ran_at_all = !view.occurrences.is_empty();
    let mut memo = BTreeMap::new();
    planned
        .iter()
        .filter(|n| {
            let n = n.as_str();
            !recorded.contains(n)
                && !delivered(
                    n, ran_at_all, &completed, &recorded, &open, &feeders, &mut memo,
                )
        })
        .map(|n| (n.clone(), reason))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::InvocationMetrics;

    fn stored(records: Vec<Record>) -> Vec<Stored> {
        records
            .into_iter()
            .enumerate()
            .map(|(i, record)| Stored {
                seq: i as u64,
                at_ms: 0,
                record,
            })
            .collect()
    }

    /// From a log alone: recorded results ran, an open invocation and what it feeds did
    /// not, nor what a failed node feeds; unrecorded built-ins ran when fed.
    #[test]
    fn the_nodes_that_never_ran_come_from_the_log_and_the_graph() {
        let edge = |s: &str, t: &str| serde_json::json!({"source": s, "sourceHandle": "o", "target": t, "targetHandle": "i"});
        let ids = ["c", "a", "g", "out", "f", "d", "e", "x"];
        let doc = serde_json::json!({
            "nodes": ids.iter().map(|id| serde_json::json!({"id": id, "type": "t"})).collect::<Vec<_>>(),
            "edges": [edge("c", "a"), edge("a", "g"), edge("g", "out"), edge("c", "f"),
                      edge("f", "d"), edge("c", "e"), edge("e", "x")],
        });
        let header = RunHeader {
            run_id: "r".into(),
            created_ms: 0,
            graph_sha256: String::new(),
            run: crate::NewRun {
                graph_name: "g.json".into(),
                graph_bytes: doc.to_string().into_bytes(),
                plan: heddle_core::PlanSummary {
                    nodes: ids
                        .iter()
                        .map(|id| heddle_core::PlannedNode {
                            id: id.to_string(),
                            node_type: "t".into(),
                            retry_safe: false,
                            origin: heddle_core::Origin::Unnamed,
                        })
                        .collect(),
                    edges: 7,
                    ..Default::default()
                },
                inputs: Default::default(),
                secrets: Vec::new(),
                packages: Default::default(),
                limits: Default::default(),
            },
        };
        let occ = |n: &str| Occurrence::new(n, "", 0);
        let records = stored(vec![
            Record::Completed {
                occurrence: occ("a"),
                outputs: Vec::new(),
                emitted: Vec::new(),
                metrics: InvocationMetrics::default(),
            },
            Record::Failed {
                occurrence: occ("f"),
                error: "no".into(),
                metrics: InvocationMetrics::default(),
            },
            Record::Started {
                occurrence: occ("g"),
            },
        ]);
        let view = RunView::fold(&records, |_| false);
        let mut never = never_ran(&header, &view, SkipReason::Cancelled);
        never.sort_by(|a, b| a.0.cmp(&b.0));
        let nodes: Vec<&str> = never.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(nodes, ["d", "g", "out"]);
        assert!(never.iter().all(|(_, r)| *r == SkipReason::Cancelled));
        // A run no process ran: every node.
        let none = RunView::fold(&[], |_| false);
        assert_eq!(
            never_ran(&header, &none, SkipReason::Cancelled).len(),
            ids.len()
        );
    }
}
