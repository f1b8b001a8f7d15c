//! `heddle runs list | show | resume | status | unlock | approve | reject | cancel`: what
//! the run store records, and the commands that act on a recorded run. The durable-run
//! machinery they share with the watchdog and the server is in
//! [`heddle_runtime::durable`].

use std::sync::Arc;

use heddle_runtime::durable::reconcile::{self, Answer, Given};
use heddle_runtime::durable::{
    Decision, Reopen, Reopening, gates, list_json, list_line, list_states, show_json, show_text,
};
use heddle_runtime::watch::refuse_if_locked;
use heddle_runtime::{Runtime, Settings};
use heddle_store::RunStore;
use heddle_store::session::{self, Resumption};

use crate::cli::{RunsArgs, RunsCommand};
use crate::console::say_run;
use crate::execute::{Execution, execute, report_ending};
use crate::exit::Exit;

pub fn run(args: RunsArgs) -> anyhow::Result<Exit> {
    let settings = args.env.settings()?;
    crate::console::set_format(settings.telemetry.log_format);
    let section = &settings.store;
    match args.command {
        RunsCommand::List { json } => list(&settings, json),
        RunsCommand::Show { run, json } => show(&settings, &run, json),
        RunsCommand::Resume {
            run,
            pause,
            completed_with,
            skip,
            note,
            by,
            json,
            watchdog,
        } => {
            if watchdog.watchdog {
                return crate::commands::watch::resume(
                    &settings, &args.env, &run, pause, json, &watchdog,
                );
            }
            // Read before anything else: a file that is not an outputs object is the
            // command line's mistake, whatever the run's state.
            let answer = match (completed_with, skip) {
                (Some(path), _) => Some(Answer::Completed(reconcile::read_outputs(&path)?)),
                (None, true) => Some(Answer::Skip),
                (None, false) => None,
            };
            // A run a watchdog watches (or a dead one left locked) is not taken over.
            refuse_if_locked(&settings, &run)?;
            let store = section.existing(&run)?;
            // Everything is checked before the run is taken over, so a refused resume
            // writes nothing.
            let r = session::check_resume(&*store, &run, pause)?;
            let decision = match answer {
                Some(answer) => {
                    let given = Given {
                        answer,
                        by: by.unwrap_or_else(reconcile::login_name),
                        note: note.unwrap_or_default(),
                    };
                    Some(Decision::Reconcile(reconcile::reconciliation(&r, given)?))
                }
                None => None,
            };
            continue_run(settings, store, r, json, decision, false)
        }
        RunsCommand::Status { run, json } => crate::commands::watch::status(&settings, &run, json),
        RunsCommand::Unlock { run } => {
            section.existing(&run)?.header(&run)?;
            let pid = heddle_store::lock::unlock(section.path(), &run)?;
            eprintln!("released the lock of run {run} left by pid {pid} (gone)");
            Ok(Exit::Ok)
        }
        RunsCommand::Approve {
            run,
            gate,
            note,
            json,
        } => {
            // Approving runs the run on in this process: not one a watchdog holds.
            refuse_if_locked(&settings, &run)?;
            let store = section.existing(&run)?;
            let (r, _, approval) = gates::approval(&*store, &run, &gate, note)?;
            // Said by `continue_run` once the approval is on disk, not before.
            continue_run(
                settings,
                store,
                r,
                json,
                Some(Decision::Approve(approval)),
                false,
            )
        }
        RunsCommand::Reject { run, gate, note } => {
            let store = section.existing(&run)?;
            // The run's span is sent from here: this process records its ending.
            let watch = heddle_runtime::telemetry::Watch::exporting(&settings.telemetry);
            let reason = gates::record_rejection(
                store,
                &run,
                &gate,
                &note,
                &known_secrets(&settings),
                &watch,
            )?;
            eprintln!("run {run} cancelled: {reason}");
            Ok(Exit::Ok)
        }
        RunsCommand::Cancel { run } => cancel(&settings, &run),
    }
}

/// How long `runs cancel` waits for a live owner to carry its request out before it
/// says the request is recorded and leaves the owner to it.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Cancels `run` wherever it is ([`cancel_run`]): one nobody drives is taken over and
/// recorded cancelled; a live owner (a process, a host) is asked through the store and
/// cancels the run itself, which this waits for, up to [`CANCEL_WAIT`].
fn cancel(settings: &Settings, run: &str) -> anyhow::Result<Exit> {
    use heddle_runtime::durable::cancel::{Cancelled, cancel_run};
    let store = settings.store.existing(run)?;
    let secrets = known_secrets(settings);
    let mut asked = |owner: &str| eprintln!("asked the owner of run {run} ({owner}) to cancel it");
    // A run nobody drives is ended here, and its span sent from here.
    let watch = heddle_runtime::telemetry::Watch::exporting(&settings.telemetry);
    match cancel_run(&store, run, &secrets, CANCEL_WAIT, &mut asked, &watch)? {
        Cancelled::Ended => {
            // A run whose host was killed outright leaves its containers (a server's)
            // behind; its owner, when it ended the run itself, left none.
            heddle_runtime::durable::Leftovers::new(settings.runners.docker_host.clone(), run)
                .blocking_remove();
            eprintln!("run {run} cancelled")
        }
        Cancelled::Asked { owner } => eprintln!(
            "the cancel of run {run} is recorded; its owner ({owner}) has not ended the run yet and will when it sees the request"
        ),
    }
    Ok(Exit::Ok)
}

/// The secret values the configuration knows of: a command that ends a run without
/// running it writes to the log directly, and masks them out of what it writes (a
/// person's note may quote one).
fn known_secrets(settings: &Settings) -> Vec<String> {
    heddle_runtime::secrets::known_secrets(&settings.wasm).snapshot()
}

/// Takes a checked run over and runs it on from its log, with the gates its log
/// approved open, and `decision` (a gate approved now, an answer to its reconcile
/// pause) recorded first; a watchdog's `worker` leaves its final report in the run's
/// store.
pub(crate) fn continue_run(
    settings: Settings,
    store: Arc<dyn RunStore>,
    r: Resumption,
    json: bool,
    decision: Option<Decision>,
    worker: bool,
) -> anyhow::Result<Exit> {
    let run = r.header.run_id.clone();
    heddle_runtime::durable::refuse_interactive(&r.header)?;
    let doc = heddle_runtime::durable::stored_graph(&r.header)?;
    if decision.is_none() {
        gates::refuse_resume_at_gate(&r)?;
    }
    let rt = heddle_runtime::tokio_runtime(None)?;
    // A package the run used that this machine's store lacks, fetched from a registry:
    // exactly the recorded bytes are fetched again before anything loads.
    let runtime = rt.block_on(Runtime::load_for_run(settings, &r.header, &doc))?;
    // A run created through the API with a policy or the LLM agent as its supervisor
    // is supervised the same way here; built before anything is written.
    let recorded = heddle_runtime::supervision::recorded(
        &runtime.settings().config,
        &heddle_runtime::durable::supervise_of(&r.header),
    )?;
    let reopened = runtime.blocking_reopen(store.clone(), &r, &doc, decision.as_ref())?;
    // Only now: a process killed after these lines has the decision in the log.
    match &decision {
        Some(Decision::Approve(a)) => say_run(
            &format!("gate \"{}\" of run {run} approved", a.title()),
            &run,
        ),
        Some(Decision::Reconcile(a)) => {
            let said = match a.answer() {
                Answer::Completed(_) => "completed with the outputs given",
                Answer::Skip => "skipped",
            };
            say_run(
                &format!("recorded: {} of run {run} {said}", a.occurrence()),
                &run,
            );
        }
        None => {}
    }
    match reopened.how {
        Reopening::Resume { pause } => {
            say_run(&format!("resuming run {run} at pause event {pause}"), &run)
        }
        Reopening::Start => say_run(&format!("starting run {run}"), &run),
        Reopening::Recover => say_run(&format!("recovering interrupted run {run}"), &run),
    }
    match reopened.run {
        Reopen::Ended(ending) => Ok(report_ending(&run, &ending, None)),
        Reopen::Ready(mut drive) => {
            if let Some(handle) = recorded {
                drive.supervise(handle);
            }
            execute(
                rt,
                Execution {
                    graph: r.header.run.graph_name.clone(),
                    registry: runtime.registry(),
                    drive: *drive,
                    json,
                    stream: None,
                    worker_store: worker.then_some(store),
                },
            )
        }
    }
}

fn list(settings: &Settings, json: bool) -> anyhow::Result<Exit> {
    let section = &settings.store;
    let Some(store) = section.open_existing()? else {
        if json {
            println!("[]");
        } else {
            eprintln!("no runs (no run store at {})", section.path().display());
        }
        return Ok(Exit::Ok);
    };
    let rows = list_states(&*store)?;
    if json {
        let v: Vec<_> = rows.iter().map(|(s, state)| list_json(s, *state)).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for (s, state) in rows {
            println!("{}", list_line(&s, state));
        }
    }
    Ok(Exit::Ok)
}

fn show(settings: &Settings, run: &str, json: bool) -> anyhow::Result<Exit> {
    let store = settings.store.existing(run)?;
    let (header, _, view) = session::inspect(&*store, run)?;
    if json {
        let v = show_json(&header, &view);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", show_text(&header, &view));
    }
    Ok(Exit::Ok)
}
