//! `heddle runs list | show | resume | status | unlock | approve | reject | cancel`: what
//! the run store records, and the commands that act on a recorded run. The durable-run
//! machinery they share with the watchdog and the server is in [`crate::durable`].

use heddle_store::session;
use heddle_store::status::Outcome;

use crate::cli::{RunsArgs, RunsCommand};
use crate::config::Config;
use crate::durable::{StoreSection, existing, gates, list_json, list_states, resume, show_json};
use crate::exit::Exit;

pub fn run(args: RunsArgs) -> anyhow::Result<Exit> {
    let config = Config::load(args.env.config.as_deref())?;
    let section = StoreSection::load(&config)?;
    match args.command {
        RunsCommand::List { json } => list(&section, json),
        RunsCommand::Show { run, json } => show(&section, &run, json),
        RunsCommand::Resume {
            run,
            pause,
            json,
            watchdog,
        } => {
            if watchdog.watchdog {
                return crate::watchdog::resume(&section, &args.env, &run, pause, json, &watchdog);
            }
            // A run a watchdog supervises (or a dead one left locked) is not taken over.
            crate::watchdog::refuse_if_locked(&section, &run)?;
            resume(&section, &args.env, &run, pause, json)
        }
        RunsCommand::Status { run, json } => crate::watchdog::status::run(&section, &run, json),
        RunsCommand::Unlock { run } => crate::watchdog::status::unlock(&section, &run),
        RunsCommand::Approve {
            run,
            gate,
            note,
            json,
        } => {
            // Approving runs the run on in this process: not one a watchdog holds.
            crate::watchdog::refuse_if_locked(&section, &run)?;
            let store = existing(&section, &run)?;
            gates::approve(store, &args.env, &run, &gate, note, json)
        }
        RunsCommand::Reject { run, gate, note } => {
            let store = existing(&section, &run)?;
            gates::reject(store, &run, &gate, &note, &known_secrets(&args.env)?)
        }
        RunsCommand::Cancel { run } => {
            let store = existing(&section, &run)?;
            session::cancel(store, &run, &known_secrets(&args.env)?)?;
            eprintln!("run {run} cancelled");
            Ok(Exit::Ok)
        }
    }
}

/// The secret values the configuration knows of: a command that ends a run without
/// running it writes to the log directly, and masks them out of what it writes (a
/// person's note may quote one).
fn known_secrets(env: &crate::cli::EnvArgs) -> anyhow::Result<Vec<String>> {
    let settings = crate::providers::Settings::load(env)?;
    Ok(crate::execute::known_secrets(&settings.wasm).snapshot())
}

fn list(section: &StoreSection, json: bool) -> anyhow::Result<Exit> {
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
            println!(
                "{}  {:<11}  {:>6} records  {}",
                s.run_id,
                state.as_str(),
                s.records,
                s.graph_name
            );
        }
    }
    Ok(Exit::Ok)
}

fn show(section: &StoreSection, run: &str, json: bool) -> anyhow::Result<Exit> {
    let store = existing(section, run)?;
    let (header, _, view) = session::inspect(&*store, run)?;
    if json {
        let v = show_json(&header, &view);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(Exit::Ok);
    }
    println!("run       {}", header.run_id);
    println!(
        "graph     {} (sha256 {})",
        header.run.graph_name, header.graph_sha256
    );
    let owner = view
        .owner_pid
        .map(|p| format!(" (owner pid {p}, epoch {})", view.epoch))
        .unwrap_or_default();
    println!("state     {}{owner}", view.state.as_str());
    if let Some(p) = &view.pause {
        println!(
            "pause     event {}: {}",
            p.event,
            serde_json::to_string(&p.reason)?
        );
    }
    if let Some(e) = &view.error {
        println!("error     {e}");
    }
    let budget = header.run.limits.budget;
    let of = |limit: Option<u64>| limit.map(|l| format!(" of {l}")).unwrap_or_default();
    println!(
        "progress  {} dispatches{}, {} ms executed{}, {} records, opened {} times",
        view.dispatches,
        of(budget.max_dispatches),
        view.execution_ms,
        of(budget.time_limit_ms),
        view.records,
        view.opens
    );
    for (node, u) in view.usage() {
        let state = serde_json::to_value(u.state)?;
        println!(
            "usage     {node}: {} (${:.6} from {} of {} calls)",
            state.as_str().unwrap_or_default(),
            u.cost_usd,
            u.receipts,
            u.calls
        );
    }
    for (occ, o) in &view.occurrences {
        let rejected = o
            .verdicts
            .iter()
            .any(|v| v.action == heddle_core::RecordedAction::Reject);
        let result = match &o.result {
            Some(Outcome::Completed { .. }) => "completed",
            Some(Outcome::Failed { .. }) => "failed",
            None if rejected => "cancelled (gate rejected)",
            None if o.started > 0 => "started, no result",
            None => "dispatched",
        };
        let safety = if o.retry_safe {
            "retry-safe"
        } else {
            "not retry-safe"
        };
        println!("  {occ:<30} {result:<20} starts {} ({safety})", o.started);
    }
    Ok(Exit::Ok)
}
