//! One run driven from this process, fresh or resumed, through the runtime's driver
//! ([`heddle_runtime::driver`]): live progress, stdin fed to a streaming input, the
//! signals, then the outputs or the JSON report, and a durable run's ending recorded
//! after the report is out. `heddle run`, `heddle runs resume`, a gate's approval and a
//! watchdog's worker all end up here.
//!
//! A watchdog's worker prints no outputs: it leaves its report in the run store as an
//! artifact, and its watchdog reports the bytes it reads back verified.

use std::io::IsTerminal as _;
use std::sync::Arc;

use heddle_core::{Event, EventKind, RunStatus};
use heddle_runtime::Drive;
use heddle_store::RunStore;
use heddle_store::session::Ending;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::exit::{Exit, bounded};
use crate::progress::{Mode, Progress};
use heddle_runtime::run_report::{NodeTimes, PlanFacts, RunReport, human_summary};
use heddle_runtime::streams::feed_streams;

/// One run as the command line drives it, fresh or resumed.
pub(crate) struct Execution<'a> {
    pub graph: String,
    pub registry: &'a heddle_kernel::Registry,
    pub drive: Drive,
    pub json: bool,
    pub stream: Option<&'a str>,
    /// A watchdog's worker: the run store its final report goes to. It prints no
    /// outputs (they are not console output: its watchdog prints them verified).
    pub worker_store: Option<Arc<dyn RunStore>>,
}

/// Runs with live progress, then prints the outputs or the JSON report.
pub(crate) fn execute(rt: tokio::runtime::Runtime, x: Execution<'_>) -> anyhow::Result<Exit> {
    let Execution {
        graph,
        registry,
        drive,
        json,
        stream,
        worker_store,
    } = x;
    let secrets = drive.secrets();
    let mode = if json {
        Mode::Quiet
    } else if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        Mode::Live
    } else {
        Mode::Plain
    };
    if mode != Mode::Quiet {
        for w in &drive.plan().warnings {
            eprintln!("warning: {w}");
        }
    }
    let total_nodes = drive.plan().nodes.len();
    // What the report adds from the plan, kept before the driver takes it.
    let facts = PlanFacts::of(drive.plan());
    let durable = drive.session().is_some();
    // Built from the plan before the driver takes it: it orders lines by the edges.
    let progress = Progress::new(mode, drive.plan());

    let (finished, times, stream_error) = rt.block_on(async {
        let prepared = drive.prepare(registry).await?;
        let events = prepared.subscribe();
        let control = prepared.control();
        // Registered before the run starts and is announced, so a signal sent after the
        // announcement is always handled here rather than by the default action.
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
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
        let running = prepared.start();
        let on_signal = {
            let ended_tx = ended_tx.clone();
            let printer = printer.clone();
            let control = control.clone();
            tokio::spawn(async move {
                let name = tokio::select! {
                    _ = sigint.recv() => "interrupted",
                    _ = sigterm.recv() => "terminated",
                };
                printer.line(&format!("{name}: cancelling the run…"));
                // A durable run stays resumable (it pauses); an in-memory one is
                // cancelled.
                control.interrupt();
                let _ = ended_tx.send(true);
                // A second signal while cancel is under way: leave at once.
                tokio::select! {
                    _ = sigint.recv() => {},
                    _ = sigterm.recv() => {},
                }
                std::process::exit(130);
            })
        };
        let on_time_limit = {
            let printer = printer.clone();
            tokio::spawn(async move {
                control.time_limit_reached().await;
                printer.line("run time limit reached: stopping the run…");
            })
        };

        let stream_error = feed_streams(
            running.handle(),
            stream.map(|name| (name, tokio::io::BufReader::new(tokio::io::stdin()))),
            ended_rx,
        )
        .await
        .err();
        if stream_error.is_some() {
            // Cancelled, not interrupted: the input was wrong, the run is over.
            running.handle().cancel();
        }
        let finished = running.finish().await;
        let _ = ended_tx.send(true);
        on_signal.abort();
        on_time_limit.abort();
        // The watcher ends when the event stream closes with the run.
        let (mut progress, times) = watcher.await?;
        let result = &finished.result;
        progress.finish(
            result.status,
            !result.interventions.is_empty(),
            result.wall_us,
        );
        anyhow::Ok((finished, times, stream_error))
    })?;
    // tokio reads stdin on a blocking thread that cannot be interrupted; a normal
    // shutdown would wait for a line that may never come (cancel with stdin open).
    rt.shutdown_background();

    let result = &finished.result;
    let mut report = RunReport::finished(&graph, &finished, &times, &facts);
    let gate = report.gate().map(str::to_string);
    let status = result.status;
    let run_id = finished.session().map(|s| s.run_id.clone());
    // A durable run's ending was decided when it ended and is recorded after the
    // report is out: a kill in between leaves a run that recovery finishes again, not a
    // recorded ending whose report was lost.
    let record = |finished: heddle_runtime::Finished| -> anyhow::Result<()> {
        if let (Some(ending), Some(run)) = (finished.blocking_record()?, &run_id) {
            report_ending(run, &ending, gate.as_deref());
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
            record(finished)?;
            return Ok(Exit::Invalid);
        }
        print!("{}", human_summary(&report));
        record(finished)?;
        return Err(e.into());
    }
    let exit = finished.exit();
    let worker = worker_store.is_some();
    if let (Some(store), Some(session)) = (&worker_store, finished.session()) {
        // A watchdog's worker leaves its report in the run store.
        heddle_runtime::report::store(&**store, session, serde_json::to_value(&report)?, &secrets)?;
    }
    if json {
        if !worker {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    } else {
        if !worker {
            print!("{}", human_summary(&report));
        }
        match (&report.error, status) {
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
    record(finished)?;
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

/// Says how a durable run ended and what to do next
/// ([`heddle_runtime::driver::ending_advice`]); the exit code of the README (paused =
/// suspended, 4).
pub fn report_ending(run_id: &str, ending: &Ending, gate: Option<&str>) -> Exit {
    if let Some(advice) = heddle_runtime::driver::ending_advice(run_id, ending, gate) {
        eprintln!("{advice}");
    }
    heddle_runtime::driver::ending_exit(ending)
}
