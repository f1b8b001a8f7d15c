//! The run driver: the one place a run, in memory or durable, is taken from a plan to
//! its ending. The command line, a watchdog's worker, the server and embedders all
//! drive runs through it, so a run behaves the same whoever drives it: the durable
//! journal attached before the first invocation, the run time limit kept on a clock
//! that starts when this process took the run, a cancel, an interrupt and a host's
//! stop told apart, and a durable run's ending decided once and recorded once.
//!
//! A run goes through four stages, each its own type:
//!
//! - [`Drive`]: a planned run with its options (and, when durable, its session), not
//!   started. Its [`Control`] exists from here on, so a cancel before the start counts.
//! - [`Prepared`]: the kernel's run is built (every executor resolved); subscribe to its
//!   events now to see all of them.
//! - [`Running`]: started; inputs can be pushed through [`Running::handle`].
//! - [`Finished`]: the kernel's result and, for a durable run, its ending as decided.
//!   [`Finished::record`] writes it. Between the two a caller can hand its report over
//!   first: a process killed in between leaves a run that recovery finishes again,
//!   never a recorded ending whose report was lost.
//!
//! A caller with nobody watching the run (a server's worker) takes all four at once
//! with [`Drive::run`].

use std::future::Future;
use std::sync::{Arc, OnceLock};

use heddle_core::plan::Plan;
use heddle_core::{PauseReason, Record, RunResult, RunStatus, SkipReason};
use heddle_kernel::runtime::{Run, RunCanceller, RunHandle, RunOptions};
use heddle_kernel::{EventStream, Registry};
use heddle_store::StoreError;
use heddle_store::session::{self, Ending, Planned, Session};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::exit::Exit;
use crate::telemetry::{RunSpan, RunSpanEnd, RunTracing};

/// How a caller stops a run, from any task, at any stage. Cheap to clone.
///
/// - [`Control::cancel`]: the user's cancel. The run ends cancelled; a durable one
///   records the request, so it is never resumed.
/// - [`Control::interrupt`]: the run stops, and a durable one stays resumable (it
///   pauses, `interrupted`): a Ctrl-C.
/// - [`Control::stop`]: the host is going away. A durable run records no ending and is
///   left running on disk for the next owner to adopt.
#[derive(Clone)]
pub struct Control(Arc<Signals>);

struct Signals {
    cancel: CancellationToken,
    interrupt: CancellationToken,
    stop: CancellationToken,
    /// Fired when the run time limit stopped the run.
    limit: CancellationToken,
    /// The kernel's own cancel, once the run started.
    kernel: OnceLock<RunCanceller>,
    /// Set once the run's ending is decided: a cancel after that is refused
    /// ([`Control::request_cancel`]), so a cancel that was accepted is never lost.
    closed: std::sync::Mutex<bool>,
}

impl Control {
    fn new(stop: CancellationToken) -> Control {
        Control(Arc::new(Signals {
            cancel: CancellationToken::new(),
            interrupt: CancellationToken::new(),
            stop,
            limit: CancellationToken::new(),
            kernel: OnceLock::new(),
            closed: std::sync::Mutex::new(false),
        }))
    }

    /// [`Control::cancel`] unless the run's ending is already decided: `true` when the
    /// cancel was accepted (the run ends cancelled, a durable one with the request
    /// recorded), `false` when it came too late to count (the run ended, or is ending,
    /// as it was going to). What a caller that acknowledges the cancel to someone asks.
    pub fn request_cancel(&self) -> bool {
        let closed = self.0.closed.lock().unwrap_or_else(|e| e.into_inner());
        if *closed {
            return false;
        }
        self.cancel();
        true
    }

    /// Decides the run's ending from here on: later cancels are refused. Returns whether
    /// a cancel was accepted before.
    fn close(&self) -> bool {
        let mut closed = self.0.closed.lock().unwrap_or_else(|e| e.into_inner());
        *closed = true;
        self.0.cancel.is_cancelled()
    }

    /// The user's cancel: the run ends cancelled (a durable one records the request).
    /// The kernel is told before this returns, so work a person was asked about is
    /// cancelled, not failed, when the question is withdrawn next.
    pub fn cancel(&self) {
        self.0.cancel.cancel();
        self.cancel_kernel();
    }

    /// Stops the run so that a durable one stays resumable (it pauses, interrupted).
    pub fn interrupt(&self) {
        self.0.interrupt.cancel();
        self.cancel_kernel();
    }

    /// Stops the run without an ending: a durable one is left for the next owner.
    pub fn stop(&self) {
        self.0.stop.cancel();
        self.cancel_kernel();
    }

    /// Whether [`Control::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancel.is_cancelled()
    }

    /// Whether [`Control::interrupt`] was called.
    pub fn is_interrupted(&self) -> bool {
        self.0.interrupt.is_cancelled()
    }

    /// Completes once the run time limit stopped the run.
    pub async fn time_limit_reached(&self) {
        self.0.limit.cancelled().await
    }

    fn cancel_kernel(&self) {
        if let Some(k) = self.0.kernel.get() {
            k.cancel();
        }
    }
}

/// A planned run, not started: in memory, or durable with its session (its log taken
/// and its journal attached).
pub struct Drive {
    plan: Plan,
    opts: RunOptions,
    session: Option<Arc<Session>>,
    control: Control,
    /// Where its spans go, when it is traced.
    tracing: Option<RunTracing>,
}

impl Drive {
    /// A run kept in memory only.
    pub fn in_memory(plan: Plan, opts: RunOptions) -> Drive {
        Drive {
            plan,
            opts,
            session: None,
            control: Control::new(CancellationToken::new()),
            tracing: None,
        }
    }

    /// A durable run in `session`: every invocation is written ahead through its
    /// journal, and its ending is recorded in its log.
    pub fn durable(plan: Plan, mut opts: RunOptions, session: Session) -> Drive {
        opts.journal = Some(session.journal.clone());
        // What nodes label the containers they start with, so the run's next owner finds
        // them should this process be killed outright.
        opts.run_id = Some(session.run_id.as_str().into());
        Drive {
            plan,
            opts,
            session: Some(Arc::new(session)),
            control: Control::new(CancellationToken::new()),
            tracing: None,
        }
    }

    /// Sends the run's spans as `tracing` says (the runtime's [`crate::Runtime::begin`],
    /// [`crate::Runtime::reopen`] and [`crate::Runtime::in_memory`] attach it).
    pub(crate) fn traced(mut self, tracing: Option<RunTracing>) -> Drive {
        self.tracing = tracing;
        self
    }

    /// Makes `token` stop the run as [`Control::stop`] does (a server's shutdown stops
    /// every run it drives). Call before taking [`Drive::control`].
    pub fn stopped_by(mut self, token: &CancellationToken) -> Drive {
        self.control = Control::new(token.child_token());
        self
    }

    /// Sets who decides the run's failed invocations.
    pub fn supervise(&mut self, supervisor: Arc<dyn heddle_kernel::supervisor::Supervisor>) {
        self.opts.supervisor = Some(supervisor);
    }

    /// How the run is stopped.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// The run's secret values (masked in everything it writes).
    pub fn secrets(&self) -> Arc<heddle_kernel::SecretRegistry> {
        self.opts.secrets.clone()
    }

    /// The plan it runs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Its options.
    pub(crate) fn options(&self) -> &RunOptions {
        &self.opts
    }

    /// A durable run's session.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_deref()
    }

    /// Builds the kernel's run (every executor resolved). A durable run the kernel
    /// refuses is recorded failed (its nodes skipped as upstream-failed, as the kernel
    /// reports a run that failed before it started) before the error is returned; a
    /// cancel accepted before then is recorded with it (whoever asked was told it
    /// counts), and later ones are refused.
    pub async fn prepare(self, registry: &Registry) -> Result<Prepared, Error> {
        let Drive {
            plan,
            opts,
            session,
            control,
            tracing,
        } = self;
        match Run::new(plan, registry, opts) {
            Ok(run) => Ok(Prepared {
                run,
                session,
                control,
                tracing,
            }),
            Err(e) => {
                let cancelled = control.close();
                let error = heddle_core::text::bounded(&heddle_core::text::error_chain(&e));
                if let Some(s) = session {
                    if cancelled {
                        s.log.append(Record::CancelRequested);
                    }
                    let error = error.clone();
                    blocking(move || {
                        session::end_unrun(
                            &s,
                            RunStatus::Failed,
                            Some(error),
                            SkipReason::UpstreamFailed,
                        )
                        .map(|_| ())
                    })
                    .await?;
                }
                if let Some(t) = tracing {
                    t.unrun(RunStatus::Failed, Some(error));
                }
                Err(e.into())
            }
        }
    }

    /// Drives the run to its end with nobody watching it: each streaming input gets
    /// the value given for it as its only item, then ends; a durable run's ending is
    /// recorded. A run the kernel refuses ends failed (durable) or is the error (in
    /// memory).
    pub async fn run(self, registry: &Registry) -> Result<Outcome, Error> {
        self.run_when(registry, std::future::ready(())).await
    }

    /// [`Drive::run`] once `slot` is ready (a worker slot: a server runs a few runs at
    /// once). A cancel before then ends the run without running it, a stop leaves it for
    /// the next owner; the slot is given back when the run ends.
    pub async fn run_when<S>(
        self,
        registry: &Registry,
        slot: impl Future<Output = S>,
    ) -> Result<Outcome, Error> {
        let signals = self.control.0.clone();
        let permit = tokio::select! {
            p = slot => Some(p),
            _ = signals.cancel.cancelled() => None,
            _ = signals.stop.cancelled() => None,
        };
        let session = self.session.clone();
        let outcome = match permit {
            None if signals.cancel.is_cancelled() => {
                let ending = match self.session {
                    Some(s) => {
                        Some(blocking(move || end_cancelled_unrun(&s, CANCELLED_UNRUN)).await?)
                    }
                    None => None,
                };
                if let Some(t) = self.tracing {
                    t.unrun(RunStatus::Cancelled, Some(CANCELLED_UNRUN.into()));
                }
                Outcome {
                    result: None,
                    ending,
                }
            }
            None => Outcome {
                result: None,
                ending: None,
            },
            Some(permit) => {
                let prepared = match self.prepare(registry).await {
                    Ok(p) => p,
                    // Recorded failed by `prepare`.
                    Err(Error::Kernel(_)) if session.is_some() => {
                        close(session).await?;
                        return Ok(Outcome {
                            result: None,
                            ending: Some(Ending::Finished(RunStatus::Failed)),
                        });
                    }
                    Err(e) => return Err(e),
                };
                let running = prepared.start();
                for input in running
                    .handle()
                    .plan()
                    .inputs()
                    .iter()
                    .filter(|i| i.streaming)
                {
                    // Nobody feeds it live: the value given (which the kernel pushed)
                    // is its only item, then it ends, so the run can finish.
                    let _ = running.handle().finish_input(&input.name).await;
                }
                let Finished {
                    result,
                    planned,
                    session,
                    trace,
                } = running.finish().await;
                drop(permit);
                let ending = blocking(move || record_ending(session, planned, trace)).await?;
                Outcome {
                    result: Some(result),
                    ending,
                }
            }
        };
        close(session).await?;
        Ok(outcome)
    }
}

/// What [`Drive::run`] leaves.
#[derive(Debug)]
pub struct Outcome {
    /// What the kernel reports: outputs, each node's outcome, the events; `None` when
    /// the run never started (cancelled or stopped before its slot, or refused).
    pub result: Option<RunResult>,
    /// A durable run's ending as recorded (`None`: kept in memory, or stopped and left
    /// for the next owner).
    pub ending: Option<Ending>,
}

/// Ends a durable run a user cancelled before it started (here).
pub(crate) fn end_cancelled_unrun(s: &Session, why: &str) -> Result<Ending, StoreError> {
    s.log.append(Record::CancelRequested);
    session::end_unrun(
        s,
        RunStatus::Cancelled,
        Some(why.into()),
        SkipReason::Cancelled,
    )
}

/// The error of a run cancelled before it started.
const CANCELLED_UNRUN: &str = "cancelled before it started";

/// Makes what the run wrote durable and stops its log (a no-op once its ending closed
/// it), off the async threads: closing waits for the log's writer thread. After a
/// failed write (a lost lease) nothing else closed it, and the last reference would
/// close it wherever it was dropped.
async fn close(session: Option<Arc<Session>>) -> Result<(), StoreError> {
    match session {
        Some(s) => blocking(move || s.log.close()).await,
        None => Ok(()),
    }
}

/// A run whose kernel run is built, not started.
pub struct Prepared {
    run: Run,
    session: Option<Arc<Session>>,
    control: Control,
    tracing: Option<RunTracing>,
}

impl Prepared {
    /// Every event of the run from its first, as it happens.
    pub fn subscribe(&self) -> EventStream {
        self.run.subscribe()
    }

    /// How the run is stopped.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Starts the run on the current tokio runtime, with its run time limit's clock
    /// (the execution time it has left, counted from when this process took the run).
    pub fn start(self) -> Running {
        let Prepared {
            run,
            session,
            control,
            tracing,
        } = self;
        // Observing before the start: the spans see every event.
        let span = tracing.map(|t| t.start(&run));
        let handle = run.start();
        let _ = control.0.kernel.set(handle.canceller());
        let timer = session.as_ref().and_then(|s| {
            let deadline = s.deadline()?;
            let limit_ms = s.budget.time_limit_ms?;
            let journal = s.journal.clone();
            let control = control.clone();
            Some(tokio::spawn(async move {
                tokio::time::sleep_until(deadline.into()).await;
                journal.exhaust(heddle_store::Exhausted::Time { limit_ms });
                control.0.limit.cancel();
                control.cancel_kernel();
            }))
        });
        let asked = session
            .as_ref()
            .map(|s| tokio::spawn(cancel_when_asked(s.clone(), control.clone())));
        Running {
            handle,
            session,
            control,
            timer,
            asked,
            span,
        }
    }
}

/// How often a durable run's driver looks for a cancel another process asked for.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Cancels the run once another process asked for it in the store
/// ([`heddle_store::RunStore::request_cancel`]: `heddle runs cancel` of a run this
/// process owns): the same cancel as this process's own, recorded and then ended. A
/// store that cannot be read is looked at again next time.
async fn cancel_when_asked(session: Arc<Session>, control: Control) {
    loop {
        tokio::time::sleep(CANCEL_POLL).await;
        let s = session.clone();
        if let Ok(Ok(true)) = tokio::task::spawn_blocking(move || s.cancel_requested()).await {
            control.request_cancel();
            return;
        }
    }
}

/// A started run.
pub struct Running {
    handle: RunHandle,
    session: Option<Arc<Session>>,
    control: Control,
    timer: Option<tokio::task::JoinHandle<()>>,
    /// Looks for a cancel another process asked for ([`cancel_when_asked`]).
    asked: Option<tokio::task::JoinHandle<()>>,
    /// Builds its spans from its events, when it is traced.
    span: Option<RunSpan>,
}

impl Running {
    /// The kernel's handle: push and finish inputs, send control events, subscribe.
    pub fn handle(&self) -> &RunHandle {
        &self.handle
    }

    /// How the run is stopped.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Waits for the run to end and decides a durable run's ending (nothing is
    /// recorded yet: [`Finished::record`]).
    pub async fn finish(self) -> Finished {
        let Running {
            handle,
            session,
            control,
            timer,
            asked,
            span,
        } = self;
        let kernel = handle.canceller();
        let signals = &control.0;
        let wait = handle.wait();
        tokio::pin!(wait);
        let mut stopped = false;
        let mut recorded_cancel = false;
        let result = tokio::select! {
            // A cancel is recorded even when the run ended at the same time: it was
            // asked for, and the run is then never resumed.
            biased;
            _ = signals.cancel.cancelled() => {
                if let Some(s) = &session {
                    s.log.append(Record::CancelRequested);
                }
                recorded_cancel = true;
                kernel.cancel();
                wait.await
            }
            _ = signals.stop.cancelled() => {
                stopped = true;
                kernel.cancel();
                wait.await
            }
            _ = signals.interrupt.cancelled() => {
                kernel.cancel();
                wait.await
            }
            r = &mut wait => r,
        };
        for t in [timer, asked].into_iter().flatten() {
            t.abort();
        }
        // A cancel accepted while the run was ending is recorded all the same: whoever
        // asked was told it counts.
        if control.close()
            && !recorded_cancel
            && let Some(s) = &session
        {
            s.log.append(Record::CancelRequested);
        }
        let planned = match &session {
            Some(s) if !stopped => Some(session::plan_ending(
                s,
                &result,
                signals.interrupt.is_cancelled(),
            )),
            _ => None,
        };
        // The run's event stream ended with it: its consumer is done.
        let trace = match span {
            Some(s) => Some(s.finish().await),
            None => None,
        };
        let trace = match (trace, &session) {
            // In memory, the run ended here: nothing else is recorded.
            (Some((t, end)), None) => {
                t.ended(end, None);
                None
            }
            (trace, _) => trace,
        };
        Finished {
            result,
            planned,
            session,
            trace,
        }
    }
}

/// A run that ended: the kernel's result and, when durable, its ending as decided.
pub struct Finished {
    /// What the kernel reports.
    pub result: RunResult,
    planned: Option<Planned>,
    session: Option<Arc<Session>>,
    /// A durable traced run's span, sent once its ending is recorded.
    trace: Option<(RunTracing, RunSpanEnd)>,
}

impl Finished {
    /// A durable run's ending, decided and not yet recorded (`None`: in memory, or
    /// stopped without an ending).
    pub fn planned(&self) -> Option<&Planned> {
        self.planned.as_ref()
    }

    /// A durable run's session.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_deref()
    }

    /// The exit code the run ends with: a durable run's by its ending (paused is
    /// suspended, a spent budget a limit), else the kernel's status.
    pub fn exit(&self) -> Exit {
        match &self.planned {
            Some(p) => planned_exit(p),
            None => Exit::for_status(self.result.status),
        }
    }

    /// Records a durable run's ending (synced) and closes its log, off the async
    /// threads; a stopped run's log is closed without one. Returns the ending recorded.
    pub async fn record(self) -> Result<Option<Ending>, StoreError> {
        blocking(move || self.blocking_record()).await
    }

    /// [`Finished::record`] on this thread: blocks on the disk (call it where blocking
    /// is fine, not on an async thread).
    pub fn blocking_record(self) -> Result<Option<Ending>, StoreError> {
        record_ending(self.session, self.planned, self.trace)
    }
}

/// Records `planned` in `session`'s log (synced) and closes it; without a planned
/// ending (stopped) only closes it. A traced run's span is sent once its ending is on
/// disk, and only for an ending (a paused run's span waits for the process that ends
/// it: sent now, it would be sent again).
fn record_ending(
    session: Option<Arc<Session>>,
    planned: Option<Planned>,
    trace: Option<(RunTracing, RunSpanEnd)>,
) -> Result<Option<Ending>, StoreError> {
    match (session, planned) {
        (Some(s), Some(p)) => {
            let error = match &p {
                Planned::Finish { error, .. } => error.clone(),
                _ => None,
            };
            let ending = session::record_ending(&s, p)?;
            if let Some((t, end)) = trace {
                match &ending {
                    Ending::Finished(status) => t.ended(end, Some((*status, error))),
                    Ending::Exhausted(e) => {
                        t.ended(end, Some((RunStatus::Failed, Some(e.to_string()))))
                    }
                    Ending::Paused { .. } => t.paused(),
                }
            }
            Ok(Some(ending))
        }
        (Some(s), None) => {
            s.log.close()?;
            Ok(None)
        }
        (None, _) => Ok(None),
    }
}

/// The exit code a planned ending will have (the README's: paused = suspended, 4; a
/// spent budget = 6).
pub fn planned_exit(planned: &Planned) -> Exit {
    match planned {
        Planned::Pause(_) => Exit::Suspended,
        Planned::Finish { status, .. } => Exit::for_status(*status),
        Planned::Exhausted { .. } => Exit::Limit,
    }
}

/// The exit code of a recorded ending.
pub fn ending_exit(ending: &Ending) -> Exit {
    match ending {
        Ending::Finished(status) => Exit::for_status(*status),
        Ending::Paused { .. } => Exit::Suspended,
        Ending::Exhausted(_) => Exit::Limit,
    }
}

/// What a person reads when a durable run `run_id` stops: how it ended and what to do
/// next (resume it, answer its gate `gate`, or say what became of uncertain work); `None`
/// for a run that finished, whose report says everything.
pub fn ending_advice(run_id: &str, ending: &Ending, gate: Option<&str>) -> Option<String> {
    match ending {
        Ending::Finished(_) => None,
        Ending::Paused { event, reason } => {
            let why = match reason {
                PauseReason::Interrupted => "interrupted".to_string(),
                PauseReason::Reconcile { occurrence } => format!(
                    "node {occurrence} started and its result was never recorded; it is not retry-safe, so whether its effect happened is unknown"
                ),
                PauseReason::Suspend { node, reason } => format!("node {node} suspended: {reason}"),
                PauseReason::Budget { detail } => detail.clone(),
            };
            Some(match gate {
                Some(g) => format!(
                    "run {run_id} paused at event {event} ({why}); approve with: heddle runs approve {run_id} {g} [--note TEXT], or reject with: heddle runs reject {run_id} {g} --note TEXT"
                ),
                None if matches!(reason, PauseReason::Reconcile { .. }) => format!(
                    "run {run_id} paused at event {event} ({why}); resume with: heddle runs resume {run_id} --pause {event} (offers the work again), or say what became of it: --completed-with OUTPUTS.json --note WHY, or --skip --note WHY"
                ),
                None => format!(
                    "run {run_id} paused at event {event} ({why}); resume with: heddle runs resume {run_id}"
                ),
            })
        }
        Ending::Exhausted(e) => Some(format!("run {run_id} ended: {e}")),
    }
}

/// Runs blocking store work (SQLite, waits for synced writes) off the async threads.
pub(crate) async fn blocking<T: Send + 'static, E: Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        // The closure panicked: that is a bug, and the caller cannot go on sanely.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
