//! The life of a durable run around the kernel: begin (record the run, take it), reopen
//! (check a resume without writing, then take the run over), end (record how the
//! kernel's run ended) and cancel. The CLI drives these; a server would too.

use std::sync::Arc;

use heddle_core::{
    NodeOutcome, Occurrence, OpenReason, PauseReason, Record, RunResult, RunStatus, SkipReason,
    Value,
};
use heddle_kernel::journal::RECONCILE_REASON;

use crate::spill::Spiller;
use crate::status::{OpenPause, RunState, RunView, pid_alive};
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

    /// The budget that is already spent before anything runs here.
    pub fn exhausted_at_open(&self) -> Option<Exhausted> {
        self.budget.exhausted(&self.spent)
    }
}

fn open(
    store: Arc<dyn RunStore>,
    header: &RunHeader,
    records: &[Stored],
    reason: OpenReason,
    extra: Option<Record>,
    reoffer: &dyn Fn(&Occurrence) -> bool,
) -> Result<Session, StoreError> {
    let run_id = header.run_id.as_str();
    let budget = Budget::of(&header.run.limits);
    let spent = RunView::fold(records, |_| false).spent();
    let epoch = store.acquire(run_id)?;
    if !records.is_empty() {
        // Blobs an earlier process stored for a record it never committed: unreadable,
        // and they would count against the run's artifact quota for good.
        store.drop_unreferenced_artifacts(run_id, &crate::spill::referenced(records))?;
    }
    let spill = Spiller::new(store.clone(), run_id);
    let log = Arc::new(RunLog::start(store, run_id, epoch, records.len() as u64));
    log.append(Record::Opened {
        epoch,
        reason,
        pid: std::process::id(),
    });
    if let Some(r) = extra {
        log.append(r);
    }
    log.flush().wait()?;
    let journal = Arc::new(
        DurableJournal::with_budget(log.clone(), records, reoffer, budget).spilling(spill.clone()),
    );
    Ok(Session {
        run_id: run_id.to_string(),
        log,
        journal,
        budget,
        spent,
        spill,
    })
}

/// Records a new run and takes it.
pub fn begin(store: Arc<dyn RunStore>, run: &NewRun) -> Result<(RunHeader, Session), StoreError> {
    let header = store.create_run(run)?;
    let session = open(store, &header, &[], OpenReason::Start, None, &|_| false)?;
    Ok((header, session))
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
    let view = RunView::fold(&records, pid_alive);
    Ok((header, records, view))
}

/// [`inspect`] for showing a run: a value whose artifact is missing or corrupt is left
/// as a marker and listed ([`crate::spill::resolve_marking`]) instead of failing.
pub fn inspect_readable(
    store: &dyn RunStore,
    run_id: &str,
) -> Result<(RunHeader, RunView, Vec<crate::spill::Unreadable>), StoreError> {
    let header = store.header(run_id)?;
    let mut records = store.read(run_id, 0)?.records;
    let unreadable = crate::spill::resolve_marking(store, run_id, &mut records)?;
    let view = RunView::fold(&records, pid_alive);
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
    let view = RunView::fold(&read.records, pid_alive);
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
        RunState::Running => {
            return Err(StoreError::Live {
                run: run_id.to_string(),
                pid: view.owner_pid.unwrap_or(0),
            });
        }
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
    let (reason, extra) = match &r.pause {
        Some(p) => (OpenReason::Resume, Some(Record::Resumed { pause: p.event })),
        None => (OpenReason::Recover, None),
    };
    // Recovery feeds recorded results downstream: their real values, verified.
    let mut records = r.records.clone();
    crate::spill::resolve(&*store, &r.header.run_id, &mut records)?;
    // Acquiring drops a torn tail; read again so numbering continues after what counts.
    let session = open(store.clone(), &r.header, &records, reason, extra, &|occ| {
        r.reoffers(occ)
    })?;
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

/// Records that a budget ran out (the run ends failed) and closes the log.
pub fn end_exhausted(session: &Session, e: Exhausted) -> Result<Ending, StoreError> {
    let (_, wait) = session.log.append_synced(Record::Finished {
        status: RunStatus::Failed,
        error: Some(e.to_string()),
    });
    wait.wait()?;
    session.log.close()?;
    Ok(Ending::Exhausted(e))
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
    Exhausted(Exhausted),
}

/// Decides how the kernel's run ends. A run cancelled by the user's interrupt
/// (`interrupted`) is paused, not ended: it stays resumable. A run stopped because a
/// budget ran out ends failed whatever the kernel reported.
pub fn plan_ending(session: &Session, result: &RunResult, interrupted: bool) -> Planned {
    if let Some(e) = session.journal.exhausted() {
        return Planned::Exhausted(e.clone());
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
            skipped: result
                .nodes
                .iter()
                .filter_map(|(node, r)| match r.outcome {
                    // Not skipped for good: the node runs when the run is resumed.
                    NodeOutcome::Skipped {
                        reason: SkipReason::Suspended,
                    } => None,
                    NodeOutcome::Skipped { reason } => Some((node.clone(), reason)),
                    _ => None,
                })
                .collect(),
        },
    }
}

/// Records a planned ending (synced) and closes the log.
pub fn record_ending(session: &Session, planned: Planned) -> Result<Ending, StoreError> {
    let ending = match planned {
        Planned::Exhausted(e) => return end_exhausted(session, e),
        Planned::Pause(reason) => {
            let (event, wait) = session.log.append_synced(Record::Paused {
                pause: reason.clone(),
            });
            wait.wait()?;
            Ending::Paused { event, reason }
        }
        Planned::Finish {
            status,
            error,
            skipped,
        } => {
            // Before the ending, in the same synced batch: a log that shows the ending
            // shows why every node that never ran did not.
            for (node, reason) in skipped {
                session.log.append(Record::Skipped { node, reason });
            }
            let (_, wait) = session
                .log
                .append_synced(Record::Finished { status, error });
            wait.wait()?;
            Ending::Finished(status)
        }
    };
    session.log.close()?;
    Ok(ending)
}

/// Records how the kernel's run ended ([`plan_ending`], then [`record_ending`]).
pub fn end(session: &Session, result: &RunResult, interrupted: bool) -> Result<Ending, StoreError> {
    record_ending(session, plan_ending(session, result, interrupted))
}

/// The occurrence the kernel put in a reconcile suspension's state.
fn reconcile_occurrence(state: &Value) -> Option<Occurrence> {
    serde_json::from_value(state.to_json()).ok()
}

/// Cancels a run that is not running here: takes it over (fencing out a live owner,
/// whose next write is refused) and records the cancel and the ending.
pub fn cancel(store: Arc<dyn RunStore>, run_id: &str) -> Result<(), StoreError> {
    end_cancelled(
        store,
        run_id,
        Vec::new(),
        "cancelled by heddle runs cancel".into(),
    )
}

/// Cancels a run that is not running here with `reason` as its error, after recording
/// `decisions` (a rejected gate's verdict): both in one append, so the run never shows
/// the decision without its ending.
pub fn end_cancelled(
    store: Arc<dyn RunStore>,
    run_id: &str,
    decisions: Vec<Record>,
    reason: String,
) -> Result<(), StoreError> {
    let (_, records, view) = inspect_progress(&*store, run_id)?;
    if view.state.is_final() {
        return Err(StoreError::AlreadyEnded {
            run: run_id.to_string(),
            state: view.state.as_str(),
        });
    }
    let epoch = store.acquire(run_id)?;
    store.append(
        run_id,
        epoch,
        records.len() as u64,
        &decisions
            .into_iter()
            .chain([
                Record::CancelRequested,
                Record::Finished {
                    status: RunStatus::Cancelled,
                    error: Some(reason),
                },
            ])
            .collect::<Vec<_>>(),
        true,
    )
}
