//! Supervised local runs (`heddle run --watchdog`, `heddle runs resume --watchdog`).
//!
//! This process becomes the run's watchdog: it records the run, holds the run's process
//! lock, and runs it in a worker process (`heddle worker RUN`, the same binary) that it
//! waits for. A worker that dies without a recorded ending is cleaned up after (its
//! process group, its code nodes, the run's containers), and a replacement recovers the
//! run from its event log, within the limits ([`limits`]). Every decision is taken from
//! the log, never from a worker's exit code alone: a worker that recorded its ending
//! ended the run whatever happened to it afterwards.

pub mod cleanup;
mod ending;
pub mod launch;
pub mod limits;
pub mod packages;
pub mod state;
pub mod status;

use std::path::PathBuf;

use heddle_core::plan::Plan;
use heddle_kernel::runtime::RunOptions;
use heddle_store::lock::{LockState, ProcessLock};
use heddle_store::session;
use heddle_store::status::{RunState, RunView, pid_alive};

use crate::cli::{EnvArgs, RunArgs, WatchdogArgs};
use crate::durable::StoreSection;
use crate::exit::Exit;
use crate::providers::Env;
use cleanup::{Containers, Teardown};
use ending::{exit_from, finish};
use launch::{Signals, StopReason, WorkerCommand};
use limits::Limits;
use state::{Launch, Phase, Supervision, Worker, now_ms};

/// `heddle run --watchdog GRAPH`: records the run with its limits and supervises it.
pub fn start(
    args: &RunArgs,
    env: &Env,
    store: &StoreSection,
    plan: &Plan,
    opts: &RunOptions,
) -> anyhow::Result<Exit> {
    for (given, flag) in [
        (args.stream.is_some(), "--stream"),
        (args.policy.is_some(), "--policy"),
        (args.replay.is_some(), "--replay"),
        (args.supervise, "--supervise"),
    ] {
        if given {
            return Err(crate::usage!(
                "{flag} cannot be used with --watchdog: a worker recovers the run from the run store alone"
            ));
        }
    }
    let budget = store.budget(true, args.max_dispatches, args.time_limit_ms)?;
    // One time limit: the budget's, which every worker's session enforces on the run's
    // recorded execution time, and the watchdog on its own clock (backoff included), so
    // a worker that overruns it is stopped from outside.
    let limits = Limits {
        run_time_limit_ms: budget.time_limit_ms,
        ..Limits::from_args(&args.watchdog)?
    };
    let mut run = crate::durable::new_run(env, &args.graph, plan, opts, budget)?;
    run.limits.watchdog = Some(heddle_store::WatchdogLimits::new(&limits)?);
    let header = store.open()?.create_run(&run)?;
    eprintln!(
        "durable run {} (store {})",
        header.run_id,
        store.path().display()
    );
    // Nobody else knows the id yet, so the lock is free; taken before any worker.
    let lock = ProcessLock::acquire(store.path(), &header.run_id)?;
    let target = Target {
        store: store.path().to_path_buf(),
        run: header.run_id.clone(),
        containers: containers(&run.plan, env),
        worker: worker_command(&header.run_id, args.json, &args.env, &args.watchdog)?,
        packages: run.packages.clone(),
        env: args.env.clone(),
    };
    supervise(target, Supervision::new(&header.run_id, limits), lock, None)
}

/// `heddle runs resume --watchdog RUN`: the run keeps the limits, run time and restart
/// count it was recorded with.
pub fn resume(
    section: &StoreSection,
    env_args: &EnvArgs,
    run: &str,
    pause: Option<u64>,
    json: bool,
    wd: &WatchdogArgs,
) -> anyhow::Result<Exit> {
    for (given, flag) in [
        (wd.max_restarts.is_some(), "--max-restarts"),
        (wd.backoff_initial_ms.is_some(), "--backoff-initial-ms"),
        (wd.backoff_max_ms.is_some(), "--backoff-max-ms"),
    ] {
        if given {
            return Err(crate::usage!(
                "{flag}: a resumed run keeps the limits it was recorded with"
            ));
        }
    }
    limits::env_names(&wd.env_vars)?;
    let store = crate::durable::existing(section, run)?;
    store.header(run)?;
    let lock = ProcessLock::acquire(section.path(), run)?;
    // Refusals (finished, live, another pause) come before anything is written.
    let r = session::check_resume(&*store, run, pause)?;
    crate::durable::refuse_interactive(&r.header)?;
    let limits = Limits::stored(&r.header.run.limits)?;
    let mut sup = match Supervision::load(section.path(), run)? {
        Some(mut s) => {
            s.watchdog_pid = std::process::id();
            s.phase = Phase::Starting;
            s.code = None;
            s.detail = None;
            s.backoff_ms = None;
            s.worker = None;
            s.limits = limits;
            s
        }
        None => Supervision::new(run, limits),
    };
    // A dead watchdog's stretch never reached a settled pause: it stays spent up to the
    // last state it wrote.
    sup.bank_dead_watchdog();
    let runners = crate::providers::Settings::load(env_args)?.runners;
    let target = Target {
        store: section.path().to_path_buf(),
        run: run.to_string(),
        containers: r.header.run.plan.has_code_nodes().then(|| Containers {
            docker_host: runners.docker_host.clone(),
        }),
        worker: worker_command(run, json, env_args, wd)?,
        packages: r.header.run.packages.clone(),
        env: env_args.clone(),
    };
    match &r.pause {
        Some(p) => eprintln!("resuming run {run} at pause event {}", p.event),
        None => eprintln!("recovering interrupted run {run}"),
    }
    supervise(target, sup, lock, r.pause.map(|p| p.event))
}

/// Refuses to take over a run a watchdog holds, or one a dead watchdog left locked.
pub fn refuse_if_locked(section: &StoreSection, run: &str) -> anyhow::Result<()> {
    let path = heddle_store::lock::lock_path(section.path(), run);
    if !path.exists() {
        return Ok(());
    }
    match heddle_store::lock::inspect(section.path(), run)? {
        LockState::Free => Ok(()),
        LockState::Held { pid } => Err(heddle_store::lock::LockError::Locked {
            run: run.to_string(),
            pid,
            path,
        }
        .into()),
        LockState::Stale { pid } => Err(heddle_store::lock::LockError::Stale {
            run: run.to_string(),
            pid,
            path,
        }
        .into()),
    }
}

fn worker_command(
    run: &str,
    json: bool,
    env: &EnvArgs,
    wd: &WatchdogArgs,
) -> anyhow::Result<WorkerCommand> {
    Ok(WorkerCommand {
        exe: std::env::current_exe()?,
        run: run.to_string(),
        json,
        config: env.config.clone(),
        packages: env.packages.clone(),
        env: limits::worker_env(&wd.env_vars),
    })
}

fn containers(plan: &heddle_core::PlanSummary, env: &Env) -> Option<Containers> {
    plan.has_code_nodes().then(|| Containers {
        docker_host: env.runners_config.docker_host.clone(),
    })
}

/// One supervised run's fixed parts.
struct Target {
    store: PathBuf,
    run: String,
    containers: Option<Containers>,
    worker: WorkerCommand,
    /// The package digests the run was recorded with, and where packages are found.
    packages: std::collections::BTreeMap<String, String>,
    env: EnvArgs,
}

/// How the run ended, as the watchdog reports it.
enum Ending {
    /// The run recorded its ending (or a pause).
    Recorded(RunState),
    /// The watchdog ended it: a limit, a stop, a worker that refused to run it.
    Stopped {
        code: &'static str,
        detail: String,
        exit: Exit,
    },
}

fn store_view(target: &Target) -> anyhow::Result<RunView> {
    let store = heddle_store::SqliteStore::open(&target.store)?;
    let read = heddle_store::RunStore::read(&store, &target.run, 0)?;
    Ok(RunView::fold(&read.records, pid_alive))
}

/// Whether every value the run's log refers to is there and intact.
fn recorded_values(target: &Target) -> Result<(), heddle_store::artifacts::ArtifactError> {
    let store = heddle_store::SqliteStore::open(&target.store)?;
    heddle_store::spill::verify(&store, &target.run)
}

/// A check of whether someone else (`heddle runs cancel`) ended the run since the last
/// check: reads only the records written since, looking for a cancel or an ending the
/// worker did not write.
fn ended_elsewhere(target: &Target) -> anyhow::Result<impl FnMut() -> bool + use<>> {
    use heddle_store::RunStore as _;
    let store = heddle_store::SqliteStore::open(&target.store)?;
    let run = target.run.clone();
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

fn supervise(
    target: Target,
    sup: Supervision,
    lock: ProcessLock,
    reopening: Option<u64>,
) -> anyhow::Result<Exit> {
    // One thread: the worker is forked from the thread whose exit kills it (see
    // `WorkerCommand::spawn`), and that must be the watchdog's main thread.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (sup, ending) = match rt.block_on(supervise_async(&target, sup, reopening)) {
        Ok(done) => done,
        Err(e) => {
            // A worker may have been running and nothing was cleaned up after it: the
            // lock stays (stale once this process exits) for someone to check.
            lock.retain();
            return Err(e);
        }
    };
    finish(&target, sup, ending, lock)
}

async fn supervise_async(
    target: &Target,
    mut sup: Supervision,
    mut reopening: Option<u64>,
) -> anyhow::Result<(Supervision, Ending)> {
    let mut signals = Signals::new()?;
    // Containers a dead watchdog's worker left for this run go before the first worker.
    if let Some(c) = &target.containers
        && sup.launches > 0
    {
        let t = cleanup::teardown(None, None, &target.run, Some(c)).await;
        if !t.verified {
            let ending = teardown_failed(&mut sup, &t);
            return Ok((sup, ending));
        }
    }
    loop {
        let view = store_view(target)?;
        if let Some(state) = recorded(&view, reopening) {
            return Ok((sup, Ending::Recorded(state)));
        }
        if sup.remaining_at(now_ms()) == Some(0) {
            return Ok(stopped(
                sup,
                "TIMEOUT",
                "the run time limit was used up before another worker could start".into(),
                Exit::Limit,
            ));
        }
        if let Some(e) = packages::changed(&target.run, &target.packages, &target.env)? {
            return Ok(stopped(sup, "PACKAGE_CHANGED", e.to_string(), Exit::Failed));
        }
        // Reopen the asked-for pause while it is still open; otherwise recover.
        let pause = match &view.pause {
            Some(p) if Some(p.event) == reopening => Some(p.event),
            _ => None,
        };
        if pause.is_none() {
            reopening = None;
        }
        sup.phase = Phase::Starting;
        sup.backoff_ms = None;
        let now = now_ms();
        sup.count_from(now);
        let child = target.worker.spawn(pause)?;
        let pid = child.id().unwrap_or(0);
        // Read while the worker exists (unreaped, even dead it keeps its start time):
        // its code nodes carry this token.
        let owner = heddle_runners::Owner::of_pid(pid).map(|o| o.token());
        sup.launches += 1;
        sup.worker = Some(Worker {
            launch: sup.launches,
            pid,
            launched_ms: now,
        });
        sup.phase = Phase::Running;
        sup.save(&target.store)?;
        eprintln!(
            "watchdog: worker {} running run {} (pid {pid})",
            sup.launches, target.run
        );
        let deadline = sup
            .remaining_at(now_ms())
            .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
        let ended = launch::supervise(
            child,
            sup.limits.output_limit_bytes,
            deadline,
            &mut signals,
            ended_elsewhere(target)?,
        )
        .await?;
        eprintln!(
            "watchdog: worker {} ({}) ended: {}",
            sup.launches,
            pid,
            ended.describe()
        );
        sup.history.push(Launch {
            launch: sup.launches,
            pid,
            launched_ms: now,
            ended_ms: now_ms(),
            exit: ended.describe(),
            stopped_for: ended.stopped_for.map(|s| s.code().to_string()),
            output_bytes: ended.output_bytes,
        });
        sup.worker = None;
        sup.phase = Phase::Cleanup;
        sup.save(&target.store)?;
        let t = cleanup::teardown(
            Some(pid as i32),
            owner.as_deref(),
            &target.run,
            target.containers.as_ref(),
        )
        .await;
        sup.cleanup_verified = Some(t.verified);
        sup.survivors = t.survivors.clone();
        sup.last_cleanup = Some(t.clone());
        if !t.unchecked.is_empty() {
            eprintln!(
                "watchdog: cleanup could not check: {}",
                t.unchecked.join("; ")
            );
        }
        if !t.verified {
            let ending = teardown_failed(&mut sup, &t);
            return Ok((sup, ending));
        }
        // After a verified cleanup, a recorded ending wins over a deadline or a stop that
        // came too late to matter; not over the output limit: what the worker said past
        // it (its report among it) was dropped, so the run cannot be reported whole.
        let view = store_view(target)?;
        if ended.stopped_for != Some(StopReason::OutputLimit)
            && let Some(state) = recorded(&view, reopening)
        {
            return Ok((sup, Ending::Recorded(state)));
        }
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
            let exit = match why {
                StopReason::Stopped | StopReason::EndedElsewhere => Exit::Cancelled,
                _ => Exit::Limit,
            };
            return Ok(stopped(sup, why.code(), detail, exit));
        }
        if ended.interrupted {
            return Ok(stopped(
                sup,
                "STOPPED",
                "interrupted before the run recorded an ending".into(),
                Exit::Cancelled,
            ));
        }
        if !ended.crashed() {
            // It exited on its own without running the run: an error it printed (a
            // changed package, an unusable store, a recorded value it could not read
            // back). A replacement would do the same.
            if let Err(e) = recorded_values(target) {
                return Ok(stopped(sup, e.code(), e.to_string(), Exit::Failed));
            }
            let exit = match ended.status.code() {
                Some(c @ 1..=5) => exit_from(c),
                _ => Exit::Failed,
            };
            return Ok(stopped(
                sup,
                "WORKER_ERROR",
                format!(
                    "the worker exited ({}) without running the run; see its error above",
                    ended.describe()
                ),
                exit,
            ));
        }
        if sup.restarts >= sup.limits.max_restarts {
            let detail = format!(
                "worker {} died ({}) and the restart limit ({}) is reached",
                sup.launches,
                ended.describe(),
                sup.limits.max_restarts
            );
            return Ok(stopped(sup, "RESTART_LIMIT", detail, Exit::Limit));
        }
        sup.restarts += 1;
        let wait = sup.limits.backoff(sup.restarts);
        if sup
            .remaining_at(now_ms())
            .is_some_and(|left| left <= wait.as_millis() as u64)
        {
            return Ok(stopped(
                sup,
                "TIMEOUT",
                "the run time limit falls within the wait before the next worker".into(),
                Exit::Limit,
            ));
        }
        sup.phase = Phase::Backoff;
        sup.backoff_ms = Some(wait.as_millis() as u64);
        sup.save(&target.store)?;
        eprintln!(
            "watchdog: worker {} died ({}); replacement {} of {} in {} ms",
            sup.launches,
            ended.describe(),
            sup.restarts,
            sup.limits.max_restarts,
            wait.as_millis()
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = signals.recv() => {
                return Ok(stopped(sup, "STOPPED", "stopped by the user while waiting to restart".into(), Exit::Cancelled));
            }
        }
    }
}

fn stopped(
    sup: Supervision,
    code: &'static str,
    detail: String,
    exit: Exit,
) -> (Supervision, Ending) {
    (sup, Ending::Stopped { code, detail, exit })
}

fn teardown_failed(sup: &mut Supervision, t: &Teardown) -> Ending {
    sup.cleanup_verified = Some(false);
    sup.survivors = t.survivors.clone();
    sup.last_cleanup = Some(t.clone());
    Ending::Stopped {
        code: "TEARDOWN_INCOMPLETE",
        detail: format!(
            "cleanup left {}; no further worker was started and the run stays locked",
            t.survivors.join(", ")
        ),
        exit: Exit::Teardown,
    }
}
