//! `heddle run GRAPH`: plans, runs with live progress, prints outputs or the JSON report.

use std::io::IsTerminal as _;
use std::sync::Arc;

use heddle_core::plan::InputError;
use heddle_core::{Event, EventKind, RunStatus};
use heddle_kernel::runtime::{Run, RunHandle, RunOptions};
use heddle_kernel::supervisor::{Bounded, Bounds, Policy, Replay, Supervisor};
use heddle_kernel::{KernelError, SecretRegistry};
use tokio::io::AsyncBufReadExt as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::cli::RunArgs;
use crate::exit::Exit;
use crate::inputs;
use crate::progress::{Mode, Progress};
use crate::providers::{Env, graph_types};
use crate::report::{NodeTimes, RunReport, human_summary};

pub fn run(args: RunArgs) -> anyhow::Result<Exit> {
    // Everything that can be wrong with the request is checked before anything runs, so
    // a usage mistake never costs a started node.
    let raw_inputs = args
        .inputs
        .iter()
        .map(|a| inputs::parse_arg(a))
        .collect::<Result<Vec<_>, _>>()?;
    let rt = crate::app::runtime()?;
    let doc = super::load_graph(&args.graph)?;
    let env = rt.block_on(Env::load(&args.env, Some(&graph_types(&doc))))?;
    let graph = args.graph.display().to_string();
    let plan = match heddle_core::plan::plan(&doc, &env.registry) {
        Ok(plan) => plan,
        // A script reading `--json` gets an object for a refused graph too, with every
        // problem as data, instead of nothing on stdout.
        Err(err) if args.json => {
            let summary = crate::app::bounded(&format!("{graph}: {err}"));
            let report = crate::report::InvalidReport::new(&graph, summary, &err.issues);
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(Exit::Invalid);
        }
        Err(err) => return Err(anyhow::Error::from(err).context(graph)),
    };
    let values = inputs::resolve(&plan, &graph, &raw_inputs)?;
    if let Some(name) = &args.stream {
        match plan.input(name) {
            Ok(s) if s.streaming => {}
            Ok(s) => {
                return Err(crate::usage!(
                    "--stream {name}: input `{name}` (node {}) is not a streaming input; set \"streaming\": true in its properties",
                    s.node_id
                ));
            }
            Err(_) => {
                return Err(crate::usage!(
                    "--stream {name}: {graph} has no input of that name"
                ));
            }
        }
    }

    let supervisor = supervisor(&args)?;
    let secrets = run_secrets(&env, supervisor.as_deref());
    let opts = RunOptions {
        secrets,
        supervisor,
        inputs: values,
        node_timeout: args
            .node_timeout_ms
            .map(std::time::Duration::from_millis)
            .or(env.config.run.node_timeout()),
        ..RunOptions::default()
    };
    let store = super::runs::StoreSection::load(&env.config)?;
    if args.watchdog.watchdog {
        return crate::watchdog::start(&args, &env, &store, &plan, &opts);
    }
    let durable = args.durable || store.durable;
    let budget = store.budget(durable, args.max_dispatches, args.time_limit_ms)?;
    let session = if durable {
        Some(super::runs::begin(
            &store,
            &env,
            &args.graph,
            &plan,
            &opts,
            budget,
        )?)
    } else {
        None
    };
    execute(
        rt,
        Execution {
            graph,
            plan,
            registry: &env.registry,
            opts,
            json: args.json,
            stream: args.stream.as_deref(),
            session,
        },
    )
}

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
        let progress = Progress::new(mode, total_nodes);
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
            super::runs::report_ending(&s.run_id, &ending, gate.as_deref());
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
        Some(p) => super::runs::planned_exit(p),
        None => Exit::for_status(result.status),
    };
    report.exit_code = exit.code();
    if let Some(s) = &session {
        // A watchdog's worker leaves its report in the store; elsewhere a no-op.
        crate::watchdog::worker::store_final_report(&s.run_id, &report, &secrets)?;
    }
    // A watchdog's worker leaves its report in the run store (above) and prints no
    // outputs: they are not console output, and its watchdog prints them verified.
    let worker = crate::watchdog::worker::is_worker();
    if json {
        if !worker {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    } else {
        if !worker {
            print!("{}", human_summary(&report));
        }
        match (&report.error, result.status) {
            (_, RunStatus::Cancelled) => {}
            (Some(err), _) => eprintln!("error: {}", crate::app::bounded(err)),
            (None, _) => {}
        }
        if let Some(s) = &report.suspend {
            eprintln!("suspended at node {}: {}", s.node_id, s.reason);
            if !durable && heddle_core::gate::GateAsk::from_state(&s.state).is_some() {
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

/// A line of `--stream` input the run could not take; the run is stopped (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("--stream {name}: line {line}: {problem}; the run was stopped")]
pub struct StreamLineError {
    name: String,
    line: u64,
    problem: String,
}

/// Every secret value the run could come to hold, registered before it starts: masking
/// then covers the first escalation, error and log line, not only those after a node
/// happened to read the secret. That is the literal `[secrets] values`, every secret
/// granted to a package, every variable under the secrets prefix (`HEDDLE_SECRET_*`),
/// and the supervisor's own credentials.
pub(crate) fn run_secrets(env: &Env, supervisor: Option<&dyn Supervisor>) -> Arc<SecretRegistry> {
    let registry = SecretRegistry::default();
    let source = &env.wasm_config.secrets;
    for v in source.values.values() {
        registry.register(v);
    }
    for grant in env.wasm_config.packages.values() {
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
    for v in supervisor.map(|s| s.secrets()).unwrap_or_default() {
        registry.register(&v);
    }
    Arc::new(registry)
}

/// The supervisor handle asked for on the command line, wrapped in its bounds; `None`
/// (no supervision, failures fail) unless `--policy`, `--replay` or `--supervise` is given.
fn supervisor(args: &RunArgs) -> anyhow::Result<Option<Arc<dyn Supervisor>>> {
    let inner: Arc<dyn Supervisor> = match (&args.policy, &args.replay) {
        (Some(p), _) => Arc::new(Policy::load(p)?),
        (None, Some(r)) => Arc::new(Replay::load(r)?),
        (None, None) if args.supervise => Arc::new(llm_supervisor(args)?),
        (None, None) => {
            if args.max_decisions.is_some() || args.max_retries.is_some() {
                return Err(crate::usage!(
                    "--max-decisions and --max-retries bound a supervisor: add --policy FILE, --replay REPORT or --supervise"
                ));
            }
            return Ok(None);
        }
    };
    let defaults = Bounds::default();
    let bounds = Bounds {
        max_decisions: args.max_decisions.unwrap_or(defaults.max_decisions),
        max_retries_per_node: args.max_retries.unwrap_or(defaults.max_retries_per_node),
        ..defaults
    };
    Ok(Some(Arc::new(Bounded::new(inner, bounds))))
}

/// The LLM agent from the environment and flags. Every configuration problem (no
/// endpoint, a model without a price, a bad ceiling) refuses the run before it starts:
/// an unpriced model cannot be held to the cost ceiling.
fn llm_supervisor(args: &RunArgs) -> anyhow::Result<heddle_supervisor::LlmSupervisor> {
    let mut cfg = heddle_supervisor::LlmConfig::from_env(args.supervisor_model.as_deref())
        .map_err(|e| crate::usage!("--supervise: {e}"))?;
    if let Some(cap) = args.supervisor_cost_cap {
        if !(cap.is_finite() && cap >= 0.0) {
            return Err(crate::usage!(
                "--supervisor-cost-cap: `{cap}` is not a non-negative number of USD"
            ));
        }
        cfg.cost_cap_usd = cap;
    }
    heddle_supervisor::LlmSupervisor::new(cfg).map_err(|e| crate::usage!("--supervise: {e}"))
}
