//! One run driven from this process, fresh or resumed: live progress, then the outputs or
//! the JSON report, and a durable run's ending recorded. `heddle run`, `heddle runs
//! resume`, a gate's approval and a watchdog's worker all end up here.
//!
//! A watchdog's worker prints no outputs: it leaves its report in the run store as an
//! artifact, and its watchdog reports the bytes it reads back verified.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use heddle_core::plan::InputError;
use heddle_core::{Event, EventKind, PauseReason, RunStatus};
use heddle_kernel::runtime::{Run, RunHandle, RunOptions};
use heddle_kernel::supervisor::Supervisor;
use heddle_kernel::{KernelError, SecretRegistry};
use heddle_store::artifacts::ArtifactPolicy;
use heddle_store::session::{self, Ending};
use tokio::io::AsyncBufReadExt as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::exit::{Exit, StreamLineError, bounded};
use crate::inputs;
use crate::progress::{Mode, Progress};
use crate::providers::Env;
use crate::report::{NodeTimes, RunReport, human_summary};

/// One run as the command line drives it, fresh or resumed.
pub(crate) struct Execution<'a> {
    pub graph: String,
    pub plan: heddle_core::plan::Plan,
    pub registry: &'a heddle_kernel::Registry,
    pub opts: RunOptions,
    pub json: bool,
    pub stream: Option<&'a str>,
    /// A durable run's session: its journal is attached and its ending recorded.
    pub session: Option<heddle_store::session::Session>,
}

/// Runs with live progress, then prints the outputs or the JSON report.
pub(crate) fn execute(rt: tokio::runtime::Runtime, x: Execution<'_>) -> anyhow::Result<Exit> {
    let Execution {
        graph,
        plan,
        registry,
        mut opts,
        json,
        stream,
        session,
    } = x;
    if let Some(s) = &session {
        opts.journal = Some(s.journal.clone());
    }
    let secrets = opts.secrets.clone();
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mode = if json {
        Mode::Quiet
    } else if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        Mode::Live
    } else {
        Mode::Plain
    };
    if mode != Mode::Quiet {
        for w in &plan.warnings {
            eprintln!("warning: {w}");
        }
    }
    let total_nodes = plan.nodes.len();
    let durable = session.is_some();
    // The run time limit's clock: execution left from when this process took the run.
    let time_budget = session
        .as_ref()
        .and_then(|s| Some((s.time_left()?, s.budget.time_limit_ms?, s.journal.clone())));

    let (result, times, stream_error) = rt.block_on(async {
        let run = Run::new(plan, registry, opts)?;
        let events = run.subscribe();
        // Registered before the run starts and is announced, so a signal sent after the
        // announcement is always handled here rather than by the default action.
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let progress = Progress::new(mode, run.plan());
        let printer = progress.printer();
        // Flips to true when the run is over or being cancelled: stops reading stdin.
        let (ended_tx, ended_rx) = watch::channel(false);
        let ended_tx = Arc::new(ended_tx);
        let watcher = tokio::spawn(watch_events(events, progress, ended_tx.clone()));

        let on_ctrl_c = if durable {
            "Ctrl-C stops it, resumable"
        } else {
            "Ctrl-C cancels"
        };
        printer.line(&format!(
            "running {graph}: {total_nodes} nodes ({on_ctrl_c})"
        ));
        let handle = run.start();
        let canceller = handle.canceller();
        let on_signal = {
            let ended_tx = ended_tx.clone();
            let printer = printer.clone();
            let interrupted = interrupted.clone();
            tokio::spawn(async move {
                let name = tokio::select! {
                    _ = sigint.recv() => "interrupted",
                    _ = sigterm.recv() => "terminated",
                };
                printer.line(&format!("{name}: cancelling the run…"));
                interrupted.store(true, std::sync::atomic::Ordering::SeqCst);
                canceller.cancel();
                let _ = ended_tx.send(true);
                // A second signal while cancel is under way: leave at once.
                tokio::select! {
                    _ = sigint.recv() => {},
                    _ = sigterm.recv() => {},
                }
                std::process::exit(130);
            })
        };

        let time_limit = time_budget.map(|(left, limit_ms, journal)| {
            let canceller = handle.canceller();
            let printer = printer.clone();
            tokio::spawn(async move {
                tokio::time::sleep(left).await;
                journal.exhaust(heddle_store::Exhausted::Time { limit_ms });
                printer.line("run time limit reached: stopping the run…");
                canceller.cancel();
            })
        });

        let stream_error = feed_streams(&handle, stream, ended_rx).await.err();
        if stream_error.is_some() {
            handle.cancel();
        }
        let result = handle.wait().await;
        let _ = ended_tx.send(true);
        on_signal.abort();
        if let Some(t) = time_limit {
            t.abort();
        }
        // The watcher ends when the event stream closes with the run.
        let (mut progress, times) = watcher.await?;
        progress.finish(
            result.status,
            !result.interventions.is_empty(),
            result.wall_us,
        );
        anyhow::Ok((result, times, stream_error))
    })?;
    // tokio reads stdin on a blocking thread that cannot be interrupted; a normal
    // shutdown would wait for a line that may never come (cancel with stdin open).
    rt.shutdown_background();

    // A durable run's ending is decided now and recorded after the report is out: a
    // kill in between leaves a run that recovery finishes again, not a recorded ending
    // whose report was lost.
    let planned = session.as_ref().map(|s| {
        heddle_store::session::plan_ending(
            s,
            &result,
            interrupted.load(std::sync::atomic::Ordering::SeqCst),
        )
    });
    let mut report = RunReport::build(&graph, &result, &times);
    let gate = report
        .suspend
        .as_ref()
        .filter(|s| heddle_core::gate::GateAsk::from_state(&s.state).is_some())
        .map(|s| s.node_id.clone());
    let record = |planned: Option<heddle_store::session::Planned>| -> anyhow::Result<()> {
        if let (Some(s), Some(p)) = (&session, planned) {
            let ending = heddle_store::session::record_ending(s, p)?;
            report_ending(&s.run_id, &ending, gate.as_deref());
        }
        Ok(())
    };
    if let Some(e) = stream_error {
        // The input was wrong, not the graph: the report says so and the exit code is
        // the one for a refused request.
        if json {
            report.error = Some(e.to_string());
            report.exit_code = Exit::Invalid.code();
            println!("{}", serde_json::to_string_pretty(&report)?);
            record(planned)?;
            return Ok(Exit::Invalid);
        }
        print!("{}", human_summary(&report));
        record(planned)?;
        return Err(e.into());
    }
    let exit = match &planned {
        Some(p) => planned_exit(p),
        None => Exit::for_status(result.status),
    };
    report.exit_code = exit.code();
    if let Some(s) = &session {
        // A watchdog's worker leaves its report in the store; elsewhere a no-op.
        store_final_report(&s.run_id, &report, &s.spill, &secrets)?;
    }
    // A watchdog's worker leaves its report in the run store (above) and prints no
    // outputs: they are not console output, and its watchdog prints them verified.
    let worker = is_worker();
    if json {
        if !worker {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    } else {
        if !worker {
            print!("{}", human_summary(&report));
        }
        match (&report.error, result.status) {
            // A suspension is no error, and it is said once: here, or by the pause a
            // durable run records (`report_ending`, with what to do next).
            (_, RunStatus::Cancelled | RunStatus::Suspended) => {}
            (Some(err), _) => eprintln!("error: {}", bounded(err)),
            (None, _) => {}
        }
        if let Some(s) = report.suspend.as_ref().filter(|_| !durable) {
            eprintln!("suspended at node {}: {}", s.node_id, s.reason);
            if heddle_core::gate::GateAsk::from_state(&s.state).is_some() {
                eprintln!(
                    "answering gate {} (heddle runs approve | reject) needs a durable run: run the graph again with --durable",
                    s.node_id
                );
            }
        }
    }
    // stdout is handed over before the ending is recorded (see above).
    std::io::Write::flush(&mut std::io::stdout())?;
    record(planned)?;
    Ok(exit)
}

/// Drives the progress view and gathers node timings until the event stream ends.
async fn watch_events(
    mut events: heddle_kernel::EventStream,
    mut progress: Progress,
    ended: Arc<watch::Sender<bool>>,
) -> (Progress, NodeTimes) {
    let mut times = NodeTimes::default();
    while let Some(ev) = events.next().await {
        let ev: &Event = &ev;
        times.observe(ev);
        progress.on_event(ev);
        if let EventKind::Run { status, .. } = &ev.kind
            && *status != RunStatus::Running
        {
            let _ = ended.send(true);
        }
    }
    (progress, times)
}

/// Streaming inputs stay open while the run is live. The one named by `--stream` is
/// fed from stdin line by line; every other one is closed at once (after the value given
/// with `--input`, which the kernel already pushed), so the run can finish.
///
/// A line that is not UTF-8 or does not fit the input's type is never dropped: the
/// stream stops there and the error names the line, so a total computed from half the
/// input cannot pass for the real one.
async fn feed_streams(
    handle: &RunHandle,
    from_stdin: Option<&str>,
    mut ended: watch::Receiver<bool>,
) -> Result<(), StreamLineError> {
    let plan = handle.plan();
    for s in plan.inputs().iter().filter(|s| s.streaming) {
        if Some(&*s.name) == from_stdin {
            continue;
        }
        let _ = handle.finish_input(&s.name).await;
    }
    let Some(name) = from_stdin else {
        return Ok(());
    };
    let ty = plan.input(name).map(|s| s.ty.clone()).unwrap_or_default();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    let outcome = loop {
        buf.clear();
        let read = tokio::select! {
            r = stdin.read_until(b'\n', &mut buf) => r,
            _ = ended.wait_for(|e| *e) => break Ok(()),
        };
        match read {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => {
                break Err(StreamLineError {
                    name: name.to_string(),
                    line: line_no + 1,
                    problem: format!("standard input could not be read: {e}"),
                });
            }
        }
        line_no += 1;
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let fail = |problem: String| StreamLineError {
            name: name.to_string(),
            line: line_no,
            problem,
        };
        let Ok(text) = std::str::from_utf8(line) else {
            break Err(fail("the line is not valid UTF-8".into()));
        };
        let v = inputs::interpret(text, &ty, false);
        match handle.push_input(name, v).await {
            Ok(()) => {}
            Err(KernelError::Input(InputError::Type { reason, .. })) => {
                break Err(fail(format!(
                    "`{}` does not fit the input's type {ty}: {reason}",
                    heddle_core::text::clip(text, heddle_core::text::ECHO_MAX_CHARS)
                )));
            }
            // The run is over (completed, failed or cancelled): nobody reads further.
            Err(_) => break Ok(()),
        }
    };
    // A bad line must not end the stream normally: downstream would take what came
    // before it for the whole input. The caller cancels the run instead.
    if outcome.is_ok() {
        let _ = handle.finish_input(name).await;
    }
    outcome
}

/// Every secret value the run could come to hold, registered before it starts: masking
/// then covers the first escalation, error and log line, not only those after a node
/// happened to read the secret. That is the literal `[secrets] values`, every secret
/// granted to a package, every variable under the secrets prefix (`HEDDLE_SECRET_*`),
/// and the supervisor's own credentials.
pub(crate) fn run_secrets(env: &Env, supervisor: Option<&dyn Supervisor>) -> Arc<SecretRegistry> {
    let registry = known_secrets(&env.wasm_config);
    for v in supervisor.map(|s| s.secrets()).unwrap_or_default() {
        registry.register(&v);
    }
    registry
}

/// The secret values the configuration knows of (all of [`run_secrets`] but the
/// supervisor's): what a command that writes a person's text into a run's log (a
/// rejection's note) masks out of it, without loading any package.
pub(crate) fn known_secrets(wasm: &heddle_wasm::WasmConfig) -> Arc<SecretRegistry> {
    let registry = SecretRegistry::default();
    let source = &wasm.secrets;
    for v in source.values.values() {
        registry.register(v);
    }
    for grant in wasm.packages.values() {
        for name in &grant.secrets {
            if let Some(v) = source.lookup(name) {
                registry.register(&v);
            }
        }
    }
    if !source.env_prefix.is_empty() {
        for (k, v) in std::env::vars_os() {
            if k.to_string_lossy().starts_with(&source.env_prefix)
                && let Some(v) = v.to_str()
            {
                registry.register(v);
            }
        }
    }
    Arc::new(registry)
}

/// The exit code a planned ending will have (the README's: paused = suspended, 4; a
/// spent budget = 6).
pub fn planned_exit(planned: &session::Planned) -> Exit {
    match planned {
        session::Planned::Pause(_) => Exit::Suspended,
        session::Planned::Finish { status, .. } => Exit::for_status(*status),
        session::Planned::Exhausted { .. } => Exit::Limit,
    }
}

/// Says how a durable run ended and what to do next; the exit code of the README
/// (paused = suspended, 4).
/// A run paused at gate `gate` is answered, not resumed: the message says how.
pub fn report_ending(run_id: &str, ending: &Ending, gate: Option<&str>) -> Exit {
    match ending {
        Ending::Finished(status) => Exit::for_status(*status),
        Ending::Paused { event, reason } => {
            let why = match reason {
                PauseReason::Interrupted => "interrupted".to_string(),
                PauseReason::Reconcile { occurrence } => format!(
                    "node {occurrence} started and its result was never recorded; it is not retry-safe, so whether its effect happened is unknown"
                ),
                PauseReason::Suspend { node, reason } => format!("node {node} suspended: {reason}"),
                PauseReason::Budget { detail } => detail.clone(),
            };
            match gate {
                Some(g) => eprintln!(
                    "run {run_id} paused at event {event} ({why}); approve with: heddle runs approve {run_id} {g} [--note TEXT], or reject with: heddle runs reject {run_id} {g} --note TEXT"
                ),
                None => eprintln!(
                    "run {run_id} paused at event {event} ({why}); resume with: heddle runs resume {run_id}"
                ),
            }
            Exit::Suspended
        }
        Ending::Exhausted(e) => {
            eprintln!("run {run_id} ended: {e}");
            Exit::Limit
        }
    }
}

/// The name of the artifact in which a worker leaves its final report.
pub const FINAL_REPORT: &str = "final-report";

/// The run store of the run this process works on as a watchdog's worker; unset
/// elsewhere.
static WORKER_STORE: OnceLock<PathBuf> = OnceLock::new();

/// Marks this process as the worker of a run in the store at `path`.
pub fn become_worker(path: PathBuf) {
    let _ = WORKER_STORE.set(path);
}

/// Whether this process is a watchdog's worker.
pub fn is_worker() -> bool {
    WORKER_STORE.get().is_some()
}

/// Stores a worker's final report once as the run's `final-report` artifact (refused
/// when it holds one of the run's secret values, or is over the storage limits), so the
/// watchdog reports bytes it read back verified from the store, not console output.
/// Output values over the inline limit are references in it, to the artifacts their
/// nodes' results already point at (stored once, counted once against the quota).
/// Does nothing outside a worker.
pub fn store_final_report(
    run: &str,
    report: &RunReport,
    spill: &heddle_store::spill::Spiller,
    secrets: &SecretRegistry,
) -> anyhow::Result<()> {
    let Some(path) = WORKER_STORE.get() else {
        return Ok(());
    };
    let mut report = serde_json::to_value(report)?;
    crate::report::map_output_values(&mut report, |vs| {
        spill.spill_values(vs.iter_mut()).map(|_| ())
    })?;
    let bytes = serde_json::to_vec_pretty(&report)?;
    // The run's limits; the secrets as the run holds them now.
    let policy = ArtifactPolicy {
        known_secrets: secrets.snapshot(),
        ..spill.policy().clone()
    };
    heddle_store::SqliteStore::open(path)?.put_artifact(
        run,
        Some(FINAL_REPORT),
        &bytes,
        &policy,
    )?;
    Ok(())
}
