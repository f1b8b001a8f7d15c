//! Watched local runs (`heddle run --watchdog`, `heddle runs resume --watchdog`).
//!
//! The calling process becomes the run's watchdog: it records the run, holds the run's
//! process lock, and runs it in a worker process (`heddle worker RUN`) that it waits
//! for. A worker that dies without a recorded ending is cleaned up after (its process
//! group, its code nodes, the run's containers), and a replacement recovers the run from
//! its event log, within the limits ([`limits`]). Every decision is taken from the log,
//! never from a worker's exit code alone: a worker that recorded its ending ended the
//! run whatever happened to it afterwards.
//!
//! The watchdog is a state machine over [`WatchPhase`]: each phase is one function that
//! returns the next step (`Step`), and every way the watchdog ends a run itself is
//! one row of the `Stop` table, with the code its report carries and the exit code.

pub mod cleanup;
mod ending;
pub mod launch;
pub mod limits;
pub mod packages;
pub mod state;
pub mod status;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use heddle_core::plan::Plan;
use heddle_kernel::runtime::RunOptions;
use heddle_store::lock::{LockState, ProcessLock};
use heddle_store::session;
use heddle_store::status::{RunState, RunView, pid_alive};
use heddle_store::{Budget, RunHeader, RunStore, SqliteStore};
use heddle_wasm::PackageStore;

use crate::durable::Reopening;
use crate::error::Error;
use crate::exit::Exit;
use crate::providers::Runtime;
use crate::settings::Settings;
use cleanup::{Containers, Teardown};
pub use ending::WatchReport;
use launch::{Ended, Signals, StopReason, WorkerCommand};
use limits::WatchLimits;
use state::{Launch, WatchPhase, WatchState, Worker, now_ms};

/// A run taken under a watchdog, not yet watched: [`Watch::run`] watches it to its end.
pub struct Watch {
    target: Target,
    state: WatchState,
    lock: ProcessLock,
    /// The pause the first worker reopens (a resume's).
    reopening: Option<u64>,
}

impl Watch {
    /// Records a new run with the watchdog's `limits` (its time limit is the budget's)
    /// and takes the run's lock before any worker exists. The `worker` command is given
    /// the new run's id.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        runtime: &Runtime,
        graph_name: String,
        graph_bytes: Vec<u8>,
        plan: &Plan,
        opts: &RunOptions,
        budget: Budget,
        limits: WatchLimits,
        mut worker: WorkerCommand,
    ) -> Result<(RunHeader, Watch), Error> {
        let settings = runtime.settings();
        refuse_shared(settings)?;
        // One time limit: the budget's, which every worker's session enforces on the
        // run's recorded execution time, and the watchdog on its own clock (backoff
        // included), so a worker that overruns it is stopped from outside.
        let limits = WatchLimits {
            run_time_limit_ms: budget.time_limit_ms,
            ..limits
        };
        let mut run = runtime.new_run(graph_name, graph_bytes, plan, opts, budget)?;
        limits
            .record(&mut run.limits)
            .map_err(|source| Error::RecordedLimits {
                run: run.graph_name.clone(),
                source,
            })?;
        let header = settings.store.open()?.create_run(&run)?;
        // Nobody else knows the id yet, so the lock is free; taken before any worker.
        let lock = ProcessLock::acquire(settings.store.path(), &header.run_id)?;
        worker.run = header.run_id.clone();
        let target = Target::new(settings, &header, worker);
        let state = WatchState::new(&header.run_id, limits);
        Ok((
            header,
            Watch {
                target,
                state,
                lock,
                reopening: None,
            },
        ))
    }

    /// Takes stored run `run` under a watchdog again (at pause event `pause`, when
    /// given): it keeps the limits, run time and restart count it was recorded with.
    /// Refused (nothing written) when it is finished or live, holds another pause, or
    /// a person supervises it through a server.
    pub fn resume(
        settings: &Settings,
        run: &str,
        pause: Option<u64>,
        worker: WorkerCommand,
    ) -> Result<(Reopening, Watch), Error> {
        refuse_shared(settings)?;
        let store = settings.store.existing(run)?;
        store.header(run)?;
        let lock = ProcessLock::acquire(settings.store.path(), run)?;
        // Refusals (finished, live, another pause) come before anything is written.
        let r = session::check_resume(&*store, run, pause)?;
        crate::durable::refuse_interactive(&r.header)?;
        let limits =
            WatchLimits::stored(&r.header.run.limits).map_err(|source| Error::RecordedLimits {
                run: run.to_string(),
                source,
            })?;
        let mut state = match WatchState::load(settings.store.path(), run)? {
            Some(mut s) => {
                s.watchdog_pid = std::process::id();
                s.phase = WatchPhase::Starting;
                s.code = None;
                s.detail = None;
                s.backoff_ms = None;
                s.worker = None;
                s.limits = limits;
                s
            }
            None => WatchState::new(run, limits),
        };
        // A dead watchdog's stretch never reached a settled pause: it stays spent up to
        // the last state it wrote.
        state.bank_dead_watchdog();
        let how = match &r.pause {
            Some(p) => Reopening::Resume { pause: p.event },
            None => Reopening::Recover,
        };
        let target = Target::new(settings, &r.header, worker);
        Ok((
            how,
            Watch {
                target,
                state,
                lock,
                reopening: r.pause.map(|p| p.event),
            },
        ))
    }

    /// Watches the run to its end and reports it: workers launched, watched, cleaned up
    /// after and replaced; the state file and the lock left as the ending needs them.
    /// Builds its own single-threaded tokio runtime: a worker dies with the thread that
    /// forked it (`PR_SET_PDEATHSIG`), which must be this process's main thread, so
    /// call it from there.
    pub fn run(self) -> Result<WatchReport, Error> {
        let Watch {
            target,
            state,
            lock,
            reopening,
        } = self;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::io("starting the watchdog's runtime"))?;
        let watched = rt.block_on(async {
            let watcher = Watcher {
                target: &target,
                state,
                reopening,
                signals: Signals::new().map_err(Error::io("registering signal handlers"))?,
            };
            watcher.watch().await
        });
        match watched {
            Ok((state, ending)) => ending::finish(&target, state, ending, lock),
            Err(e) => {
                // A worker may have been running and nothing was cleaned up after it:
                // the lock stays (stale once this process exits) for someone to check.
                lock.retain();
                Err(e)
            }
        }
    }
}

/// Refuses a watchdog on a store several hosts share: its lock, state and worker are of
/// one machine, and there the hosts are the watchdogs (`heddle serve` adopts a run whose
/// process died once its lease expires). Before anything is written.
fn refuse_shared(settings: &Settings) -> Result<(), Error> {
    match settings.store.location() {
        heddle_store::StoreLocation::Sqlite(_) => Ok(()),
        l @ heddle_store::StoreLocation::Postgres(_) => Err(crate::error::refused!(
            "run store {l}: the watchdog supervises runs in a store file; on a database several hosts share, `heddle serve` hosts adopt a run whose process died once its lease expires (run without --watchdog, or serve the database); nothing was written"
        )
        .into()),
    }
}

/// Refuses to take over a run a watchdog holds, or one a dead watchdog left locked.
pub fn refuse_if_locked(settings: &Settings, run: &str) -> Result<(), Error> {
    let path = heddle_store::lock::lock_path(settings.store.path(), run);
    if !path.exists() {
        return Ok(());
    }
    let run = run.to_string();
    match heddle_store::lock::inspect(settings.store.path(), &run)? {
        LockState::Free => Ok(()),
        LockState::Held { pid } => {
            Err(heddle_store::lock::LockError::Locked { run, pid, path }.into())
        }
        LockState::Stale { pid } => {
            Err(heddle_store::lock::LockError::Stale { run, pid, path }.into())
        }
    }
}

/// One watched run's fixed parts.
struct Target {
    store: PathBuf,
    run: String,
    containers: Option<Containers>,
    worker: WorkerCommand,
    /// The package digests the run was recorded with, and where packages are installed.
    packages: BTreeMap<String, heddle_store::PackagePin>,
    package_store: PackageStore,
}

impl Target {
    fn new(settings: &Settings, header: &RunHeader, worker: WorkerCommand) -> Target {
        Target {
            store: settings.store.path().to_path_buf(),
            run: header.run_id.clone(),
            containers: header.run.plan.has_code_nodes().then(|| Containers {
                docker_host: settings.runners.docker_host.clone(),
            }),
            worker,
            packages: header.run.packages.clone(),
            package_store: settings.package_store(),
        }
    }

    fn store(&self) -> Result<Arc<SqliteStore>, Error> {
        Ok(Arc::new(SqliteStore::open(&self.store)?))
    }

    fn view(&self) -> Result<RunView, Error> {
        let read = self.store()?.read(&self.run, 0)?;
        Ok(RunView::fold(&read.records, pid_alive))
    }

    /// Whether every value the run's log refers to is there and intact.
    fn recorded_values(&self) -> Result<(), heddle_store::artifacts::ArtifactError> {
        let store = SqliteStore::open(&self.store)?;
        heddle_store::spill::verify(&store, &self.run)
    }

    /// A check of whether someone else (`heddle runs cancel`) ended the run since the
    /// last check: reads only the records written since, looking for a cancel.
    fn ended_elsewhere(&self) -> Result<impl FnMut() -> bool + use<>, Error> {
        let store = self.store()?;
        let run = self.run.clone();
        let mut next = store.read(&run, 0)?.records.len() as u64;
        Ok(move || {
            let Ok(read) = store.read(&run, next) else {
                return false;
            };
            next += read.records.len() as u64;
            read.records
                .iter()
                .any(|r| matches!(r.record, heddle_core::Record::CancelRequested))
        })
    }
}

/// How a watched run ended.
#[derive(Clone, Debug)]
pub enum WatchEnding {
    /// The run recorded its ending (or a pause).
    Recorded(RunState),
    /// The watchdog ended it: a limit, a stop, a worker that refused to run it.
    Stopped {
        /// What its report says (`TIMEOUT`, `RESTART_LIMIT`, ...).
        code: &'static str,
        /// Why, for a person.
        detail: String,
        /// The exit code.
        exit: Exit,
    },
}

/// Every way the watchdog ends a run itself, with the code its report carries and the
/// exit code it ends with: one row each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// The run time limit was reached (while a worker ran, before one could start, or
    /// within the wait before the next).
    TimeLimit,
    /// A worker wrote more to its console than allowed.
    OutputLimit,
    /// The user stopped it (a second interrupt, or one while waiting to restart).
    User,
    /// Someone else recorded a cancel of the run.
    EndedElsewhere,
    /// A worker died and no replacement is allowed.
    RestartLimit,
    /// A package the run uses changed since it was recorded.
    PackageChanged,
    /// A worker exited without running the run; it exited with this code.
    WorkerError(Exit),
    /// A value the run recorded cannot be read back (this code says why).
    Unreadable(&'static str),
    /// Cleanup left processes or containers behind.
    Teardown,
}

impl Stop {
    /// The row: the report's code and the exit code.
    fn outcome(self) -> (&'static str, Exit) {
        match self {
            Stop::TimeLimit => ("TIMEOUT", Exit::Limit),
            Stop::OutputLimit => ("OUTPUT_LIMIT", Exit::Limit),
            Stop::User | Stop::EndedElsewhere => ("STOPPED", Exit::Cancelled),
            Stop::RestartLimit => ("RESTART_LIMIT", Exit::Limit),
            Stop::PackageChanged => ("PACKAGE_CHANGED", Exit::Failed),
            Stop::WorkerError(exit) => ("WORKER_ERROR", exit),
            Stop::Unreadable(code) => (code, Exit::Failed),
            Stop::Teardown => ("TEARDOWN_INCOMPLETE", Exit::Teardown),
        }
    }

    /// Why the watchdog stopped a running worker, as a row.
    fn of(why: StopReason) -> Stop {
        match why {
            StopReason::OutputLimit => Stop::OutputLimit,
            StopReason::Timeout => Stop::TimeLimit,
            StopReason::Stopped => Stop::User,
            StopReason::EndedElsewhere => Stop::EndedElsewhere,
        }
    }

    fn ending(self, detail: String) -> Step {
        let (code, exit) = self.outcome();
        Step::Done(WatchEnding::Stopped { code, detail, exit })
    }
}

impl StopReason {
    /// The code a launch stopped for this reason carries in the state file.
    pub fn code(self) -> &'static str {
        Stop::of(self).outcome().0
    }
}

/// A launched worker.
struct Launched {
    child: tokio::process::Child,
    /// Its process group (its pid): the one teardown kills.
    group: heddle_runners::ProcessGroup,
    /// Its owner token (its code nodes carry it), read while it existed.
    owner: Option<String>,
    launched_ms: u64,
}

/// What the watchdog does next.
enum Step {
    /// Start a worker.
    Launch,
    /// Watch the worker just started.
    Watch(Launched),
    /// Clean up after a worker that ended, and decide.
    Cleanup {
        group: heddle_runners::ProcessGroup,
        owner: Option<String>,
        ended: Ended,
    },
    /// Wait before the next worker.
    Backoff(Duration),
    /// The run ended.
    Done(WatchEnding),
}

/// The watchdog at work: its run's fixed parts and what it knows so far.
struct Watcher<'a> {
    target: &'a Target,
    state: WatchState,
    reopening: Option<u64>,
    signals: Signals,
}

impl Watcher<'_> {
    async fn watch(mut self) -> Result<(WatchState, WatchEnding), Error> {
        let mut step = self.leftovers().await;
        loop {
            step = match step {
                Step::Launch => self.launch()?,
                Step::Watch(launched) => self.running(launched).await?,
                Step::Cleanup {
                    group,
                    owner,
                    ended,
                } => self.cleanup(group, owner, ended).await?,
                Step::Backoff(wait) => self.backoff(wait).await?,
                Step::Done(ending) => return Ok((self.state, ending)),
            };
        }
    }

    /// Containers a dead watchdog's worker left for this run go before the first worker.
    async fn leftovers(&mut self) -> Step {
        if let Some(c) = &self.target.containers
            && self.state.launches > 0
        {
            let t = cleanup::teardown(None, None, &self.target.run, Some(c)).await;
            if !t.verified {
                return self.teardown_failed(&t);
            }
        }
        Step::Launch
    }

    /// Starting: the run may be over, out of time, or on changed packages; else a
    /// worker starts, reopening the asked-for pause while it is still open.
    fn launch(&mut self) -> Result<Step, Error> {
        let target = self.target;
        let view = target.view()?;
        if let Some(state) = recorded(&view, self.reopening) {
            return Ok(Step::Done(WatchEnding::Recorded(state)));
        }
        if self.state.remaining_at(now_ms()) == Some(0) {
            return Ok(Stop::TimeLimit.ending(
                "the run time limit was used up before another worker could start".into(),
            ));
        }
        if let Some(e) = packages::changed(&target.run, &target.packages, &target.package_store)? {
            return Ok(Stop::PackageChanged.ending(e.to_string()));
        }
        let pause = match &view.pause {
            Some(p) if Some(p.event) == self.reopening => Some(p.event),
            _ => None,
        };
        if pause.is_none() {
            self.reopening = None;
        }
        let sup = &mut self.state;
        sup.phase = WatchPhase::Starting;
        sup.backoff_ms = None;
        let now = now_ms();
        sup.count_from(now);
        let child = target.worker.spawn(pause).map_err(Error::io(format!(
            "starting a worker for run {}",
            target.run
        )))?;
        let group = heddle_runners::ProcessGroup::of_child(&child).map_err(Error::io(format!(
            "starting a worker for run {}",
            target.run
        )))?;
        let pid = group.id();
        // Read while the worker exists (unreaped, even dead it keeps its start time):
        // its code nodes carry this token.
        let owner = heddle_runners::ProcessOwner::of_pid(pid).map(|o| o.token());
        sup.launches += 1;
        sup.worker = Some(Worker {
            launch: sup.launches,
            pid,
            launched_ms: now,
        });
        sup.phase = WatchPhase::Running;
        sup.save(&target.store)?;
        tracing::info!(
            run_id = %target.run,
            "watchdog: worker {} running run {} (pid {pid})",
            sup.launches,
            target.run
        );
        Ok(Step::Watch(Launched {
            child,
            group,
            owner,
            launched_ms: now,
        }))
    }

    /// Running: the worker is watched until it ends or is stopped.
    async fn running(&mut self, l: Launched) -> Result<Step, Error> {
        let target = self.target;
        let deadline = self
            .state
            .remaining_at(now_ms())
            .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        let mut console: Box<dyn std::io::Write + Send> = match target.worker.log_format {
            crate::telemetry::LogFormat::Human => Box::new(std::io::stderr()),
            crate::telemetry::LogFormat::Json => Box::new(launch::WorkerLines::new(&target.run)),
        };
        let ended = launch::watch(
            l.child,
            self.state.limits.output_limit_bytes,
            deadline,
            &mut self.signals,
            target.ended_elsewhere()?,
            &mut *console,
        )
        .await
        .map_err(Error::io(format!(
            "watching the worker of run {}",
            target.run
        )))?;
        drop(console);
        let sup = &mut self.state;
        tracing::info!(
            run_id = %target.run,
            "watchdog: worker {} ({}) ended: {}",
            sup.launches,
            l.group,
            ended.describe()
        );
        sup.history.push(Launch {
            launch: sup.launches,
            pid: l.group.id(),
            launched_ms: l.launched_ms,
            ended_ms: now_ms(),
            exit: ended.describe(),
            stopped_for: ended.stopped_for.map(|s| s.code().to_string()),
            output_bytes: ended.output_bytes,
        });
        sup.worker = None;
        sup.phase = WatchPhase::Cleanup;
        sup.save(&target.store)?;
        Ok(Step::Cleanup {
            group: l.group,
            owner: l.owner,
            ended,
        })
    }

    /// Cleanup: everything the worker started is stopped and checked gone; then the log
    /// decides, and a worker that crashed is replaced within the limits.
    async fn cleanup(
        &mut self,
        group: heddle_runners::ProcessGroup,
        owner: Option<String>,
        ended: Ended,
    ) -> Result<Step, Error> {
        let target = self.target;
        let t = cleanup::teardown(
            Some(group),
            owner.as_deref(),
            &target.run,
            target.containers.as_ref(),
        )
        .await;
        let sup = &mut self.state;
        sup.cleanup_verified = Some(t.verified);
        sup.survivors = t.survivors.clone();
        sup.last_cleanup = Some(t.clone());
        if !t.unchecked.is_empty() {
            tracing::info!(
                run_id = %target.run,
                "watchdog: cleanup could not check: {}",
                t.unchecked.join("; ")
            );
        }
        if !t.verified {
            return Ok(self.teardown_failed(&t));
        }
        // After a verified cleanup, a recorded ending wins over a deadline or a stop that
        // came too late to matter; not over the output limit: what the worker said past
        // it (its report among it) was dropped, so the run cannot be reported whole.
        let view = target.view()?;
        if ended.stopped_for != Some(StopReason::OutputLimit)
            && let Some(state) = recorded(&view, self.reopening)
        {
            return Ok(Step::Done(WatchEnding::Recorded(state)));
        }
        let sup = &mut self.state;
        if let Some(why) = ended.stopped_for {
            let detail = match why {
                StopReason::OutputLimit => format!(
                    "worker {} wrote more than {} bytes to its console; it was stopped and not replaced",
                    sup.launches, sup.limits.output_limit_bytes
                ),
                StopReason::Timeout => format!(
                    "the run time limit ({} ms) was reached",
                    sup.limits.run_time_limit_ms.unwrap_or(0)
                ),
                StopReason::Stopped => {
                    "stopped by the user before the run recorded an ending".into()
                }
                StopReason::EndedElsewhere => {
                    "a cancel was recorded for the run by another process".into()
                }
            };
            return Ok(Stop::of(why).ending(detail));
        }
        if ended.interrupted {
            return Ok(Stop::User.ending("interrupted before the run recorded an ending".into()));
        }
        if !ended.crashed() {
            // It exited on its own without running the run: an error it printed (a
            // changed package, an unusable store, a recorded value it could not read
            // back). A replacement would do the same.
            if let Err(e) = target.recorded_values() {
                return Ok(Stop::Unreadable(e.code()).ending(e.to_string()));
            }
            let exit = match ended.status.code() {
                Some(c @ (1..=5 | 9)) => Exit::from_code(c),
                _ => Exit::Failed,
            };
            return Ok(Stop::WorkerError(exit).ending(format!(
                "the worker exited ({}) without running the run; see its error above",
                ended.describe()
            )));
        }
        if sup.restarts >= sup.limits.max_restarts {
            return Ok(Stop::RestartLimit.ending(format!(
                "worker {} died ({}) and the restart limit ({}) is reached",
                sup.launches,
                ended.describe(),
                sup.limits.max_restarts
            )));
        }
        sup.restarts += 1;
        let wait = sup.limits.backoff(sup.restarts);
        if sup
            .remaining_at(now_ms())
            .is_some_and(|left| left <= wait.as_millis() as u64)
        {
            return Ok(Stop::TimeLimit
                .ending("the run time limit falls within the wait before the next worker".into()));
        }
        sup.phase = WatchPhase::Backoff;
        sup.backoff_ms = Some(wait.as_millis() as u64);
        sup.save(&target.store)?;
        tracing::info!(
            run_id = %target.run,
            "watchdog: worker {} died ({}); replacement {} of {} in {} ms",
            sup.launches,
            ended.describe(),
            sup.restarts,
            sup.limits.max_restarts,
            wait.as_millis()
        );
        Ok(Step::Backoff(wait))
    }

    /// Backoff: the wait before a replacement, cut short by the user.
    async fn backoff(&mut self, wait: Duration) -> Result<Step, Error> {
        tokio::select! {
            _ = tokio::time::sleep(wait) => Ok(Step::Launch),
            _ = self.signals.recv() => {
                Ok(Stop::User.ending("stopped by the user while waiting to restart".into()))
            }
        }
    }

    fn teardown_failed(&mut self, t: &Teardown) -> Step {
        self.state.cleanup_verified = Some(false);
        self.state.survivors = t.survivors.clone();
        self.state.last_cleanup = Some(t.clone());
        Stop::Teardown.ending(format!(
            "cleanup left {}; no further worker was started and the run stays locked",
            t.survivors.join(", ")
        ))
    }
}

/// Whether the log holds the run's ending. A pause counts unless it is the one this
/// watchdog was asked to reopen and no worker has reopened yet.
fn recorded(view: &RunView, reopening: Option<u64>) -> Option<RunState> {
    match view.state {
        s if s.is_final() => Some(s),
        RunState::Paused if view.pause.as_ref().map(|p| p.event) != reopening => {
            Some(RunState::Paused)
        }
        _ => None,
    }
}
