//! `heddle run --watchdog` and `heddle runs resume --watchdog`: the flags checked,
//! the runtime's watchdog ([`heddle_runtime::watch`]) started with this binary's
//! `heddle worker` as its worker, and what it reports printed; `heddle runs status`.

use heddle_core::plan::Plan;
use heddle_kernel::runtime::RunOptions;
use heddle_runtime::durable::Reopening;
use heddle_runtime::watch::launch::WorkerCommand;
use heddle_runtime::watch::limits::{WatchLimits, check_env_names, worker_env};
use heddle_runtime::watch::{Watch, WatchReport};
use heddle_runtime::{Runtime, Settings};

use crate::cli::{EnvArgs, RunArgs, WatchdogArgs};
use crate::console::say_run;
use crate::exit::Exit;

/// `heddle run --watchdog GRAPH`: records the run with its limits and watches it.
pub fn start(
    args: &RunArgs,
    runtime: &Runtime,
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
    let store = &runtime.settings().store;
    let budget = store.budget(args.max_dispatches, args.time_limit_ms)?;
    let limits = limits(&args.watchdog)?;
    let bytes = heddle_runtime::durable::read_graph(&args.graph)?;
    let worker = worker_command(
        None,
        args.json,
        &args.env,
        &args.watchdog,
        runtime.settings().telemetry.log_format,
    )?;
    let (header, watch) = Watch::create(
        runtime,
        args.graph.display().to_string(),
        bytes,
        plan,
        opts,
        budget,
        limits,
        worker,
    )?;
    say_run(
        &format!(
            "durable run {} (store {})",
            header.run_id,
            store.path().display()
        ),
        &header.run_id,
    );
    let run = header.run_id.clone();
    report(watch.run()?, &run, args.json)
}

/// `heddle runs resume --watchdog RUN`: the run keeps the limits, run time and restart
/// count it was recorded with.
pub fn resume(
    settings: &Settings,
    env: &EnvArgs,
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
    check_env_names(&wd.env_vars)?;
    let worker = worker_command(Some(run), json, env, wd, settings.telemetry.log_format)?;
    let (how, watch) = Watch::resume(settings, run, pause, worker)?;
    match how {
        Reopening::Resume { pause } => {
            say_run(&format!("resuming run {run} at pause event {pause}"), run)
        }
        Reopening::Start | Reopening::Recover => {
            say_run(&format!("recovering interrupted run {run}"), run)
        }
    }
    report(watch.run()?, run, json)
}

/// The limits asked for on the command line over the defaults.
fn limits(a: &WatchdogArgs) -> anyhow::Result<WatchLimits> {
    let l = WatchLimits::asked(a.max_restarts, a.backoff_initial_ms, a.backoff_max_ms)?;
    check_env_names(&a.env_vars)?;
    Ok(l)
}

/// `heddle worker RUN` of this binary, with the flags that find the same configuration
/// and packages and the watchdog's log format; `run` is filled in once the run has an id.
fn worker_command(
    run: Option<&str>,
    json: bool,
    env: &EnvArgs,
    wd: &WatchdogArgs,
    log_format: heddle_runtime::telemetry::LogFormat,
) -> anyhow::Result<WorkerCommand> {
    Ok(WorkerCommand {
        exe: std::env::current_exe()?,
        run: run.unwrap_or_default().to_string(),
        json,
        config: env.config.clone(),
        packages: env.packages.clone(),
        log_format,
        env: worker_env(&wd.env_vars),
    })
}

/// Prints how a watched run ended: its report (the worker's verified one, or the
/// watchdog's view) and the watchdog's last line; the exit code it ends with.
fn report(r: WatchReport, run: &str, json: bool) -> anyhow::Result<Exit> {
    if json {
        println!("{}", serde_json::to_string_pretty(&r.json())?);
    } else {
        print!("{}", r.outputs_text());
    }
    for line in r.ending_lines(run) {
        say_run(&line, run);
    }
    Ok(r.exit)
}

/// `heddle runs status RUN`: read from any process, never taking the run over.
pub fn status(settings: &Settings, run: &str, json: bool) -> anyhow::Result<Exit> {
    let st = heddle_runtime::watch::status::inspect(settings, run)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st.json)?);
    } else {
        print!("{}", st.text(run));
    }
    Ok(Exit::Ok)
}
