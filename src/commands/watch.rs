//! `heddle run --watchdog` and `heddle runs resume --watchdog`: the flags checked,
//! the runtime's watchdog ([`heddle_runtime::watch`]) started with this binary's
//! `heddle worker` as its worker, and what it reports printed; `heddle runs status`.

use heddle_core::plan::Plan;
use heddle_kernel::runtime::RunOptions;
use heddle_runtime::durable::Reopening;
use heddle_runtime::watch::launch::WorkerCommand;
use heddle_runtime::watch::limits::{WatchLimits, worker_env};
use heddle_runtime::watch::{Watch, WatchEnding, WatchReport};
use heddle_runtime::{Runtime, Settings};
use heddle_store::lock::LockState;

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
    env_names(&wd.env_vars)?;
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

/// The limits asked for on the command line over the defaults. Ranges are clap's (zero
/// and absurd values never get here); what spans two flags is checked here.
fn limits(a: &WatchdogArgs) -> anyhow::Result<WatchLimits> {
    let d = WatchLimits::default();
    let l = WatchLimits {
        max_restarts: a.max_restarts.unwrap_or(d.max_restarts),
        backoff_initial_ms: a.backoff_initial_ms.unwrap_or(d.backoff_initial_ms),
        backoff_max_ms: a
            .backoff_max_ms
            .unwrap_or(d.backoff_max_ms.max(a.backoff_initial_ms.unwrap_or(0))),
        run_time_limit_ms: None,
        output_limit_bytes: d.output_limit_bytes,
    };
    if l.backoff_max_ms < l.backoff_initial_ms {
        return Err(crate::usage!(
            "--backoff-max-ms {} is below --backoff-initial-ms {}: the longest wait cannot be shorter than the first",
            l.backoff_max_ms,
            l.backoff_initial_ms
        ));
    }
    env_names(&a.env_vars)?;
    Ok(l)
}

/// Refuses `--env` names that cannot be environment variables, naming the flag.
fn env_names(names: &[String]) -> anyhow::Result<()> {
    for n in names {
        if n.is_empty() || n.contains('=') || n.contains('\0') {
            // Only what precedes a `=` is echoed: what follows may be the secret itself.
            let name = n.split(['=', '\0']).next().unwrap_or_default();
            return Err(crate::usage!(
                "--env `{}`: not an environment variable name (give the name only, no `=VALUE`; the value is read from this environment)",
                heddle_core::text::clip(name, heddle_core::text::ECHO_MAX_CHARS)
            ));
        }
    }
    Ok(())
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
    let s = &r.state;
    if json {
        println!("{}", serde_json::to_string_pretty(&r.json())?);
    } else if let Some(outputs) = r
        .worker_report
        .as_ref()
        .and_then(|w| serde_json::from_value(w["outputs"].clone()).ok())
    {
        // The summary an unwatched run prints, from the verified report.
        let skipped: Vec<heddle_runtime::run_report::SkippedNode> = r
            .worker_report
            .as_ref()
            .and_then(|w| serde_json::from_value(w["skipped"].clone()).ok())
            .unwrap_or_default();
        print!(
            "{}{}",
            heddle_runtime::run_report::outputs_summary(&outputs),
            heddle_runtime::run_report::skipped_summary(&skipped)
        );
    }
    let verified = match s.cleanup_verified {
        Some(true) => "cleanup verified",
        Some(false) => "cleanup NOT verified",
        None => "no worker ran",
    };
    match &r.ending {
        WatchEnding::Recorded(state) => say_run(
            &format!(
                "watchdog: run {run} {} ({} launches, {} restarts, {verified})",
                state.as_str(),
                s.launches,
                s.restarts
            ),
            run,
        ),
        WatchEnding::Stopped { code, detail, .. } => say_run(
            &format!(
                "watchdog: run {run} stopped: {code}: {detail} ({} launches, {} restarts, {verified})",
                s.launches, s.restarts
            ),
            run,
        ),
    }
    if r.exit == Exit::Suspended {
        match &r.gate {
            Some(g) => say_run(
                &format!(
                    "run {run} waits at gate {g}; approve with: heddle runs approve {run} {g} [--note TEXT], or reject with: heddle runs reject {run} {g} --note TEXT"
                ),
                run,
            ),
            None => say_run(
                &format!("run {run} paused; resume with: heddle runs resume --watchdog {run}"),
                run,
            ),
        }
    }
    Ok(r.exit)
}

/// `heddle runs status RUN`: read from any process, never taking the run over.
pub fn status(settings: &Settings, run: &str, json: bool) -> anyhow::Result<Exit> {
    let st = heddle_runtime::watch::status::inspect(settings, run)?;
    let v = &st.json;
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
        return Ok(Exit::Ok);
    }
    let alive = |a: bool| if a { "alive" } else { "gone" };
    println!("run        {run}");
    println!("phase      {}", st.phase);
    println!("lock       {}", describe_lock(st.lock));
    if let Some(s) = &st.state {
        println!(
            "watchdog   pid {} ({})",
            s.watchdog_pid,
            alive(st.watchdog_alive)
        );
        match &s.worker {
            Some(w) => println!(
                "worker     pid {} ({}), launch {}",
                w.pid,
                alive(st.worker_alive),
                w.launch
            ),
            None => println!("worker     none"),
        }
        println!(
            "restarts   {} of {} ({} launches){}",
            s.restarts,
            s.limits.max_restarts,
            s.launches,
            s.backoff_ms
                .map(|b| format!(", backing off {b} ms"))
                .unwrap_or_default()
        );
        println!(
            "time       {} ms used, {}",
            st.elapsed_ms.unwrap_or(0),
            st.remaining_ms
                .map_or("no limit".to_string(), |r| format!("{r} ms left"))
        );
        println!(
            "cleanup    {}",
            match s.cleanup_verified {
                None => "not yet".to_string(),
                Some(true) => "verified".to_string(),
                Some(false) => format!("NOT verified: {}", s.survivors.join(", ")),
            }
        );
        if let (Some(c), Some(d)) = (&s.code, &s.detail) {
            println!("ended      {c}: {d}");
        }
    }
    println!(
        "progress   {} dispatches, {} active, {} uncertain",
        st.dispatches,
        v["active"].as_array().map_or(0, Vec::len),
        v["uncertain"].as_array().map_or(0, Vec::len)
    );
    for a in v["active"].as_array().into_iter().flatten() {
        println!(
            "  active   {} {} ({} ms)",
            a["node"].as_str().unwrap_or_default(),
            a["position"].as_str().unwrap_or_default(),
            a["elapsed_ms"]
        );
    }
    Ok(Exit::Ok)
}

fn describe_lock(l: LockState) -> String {
    match l {
        LockState::Free => "free".into(),
        LockState::Held { pid } => format!("held by pid {pid}"),
        LockState::Stale { pid } => {
            format!("STALE: pid {pid} died holding it; check, then `heddle runs unlock`")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maximum_below_the_initial_wait_and_a_bad_env_name_are_refused() {
        let a = WatchdogArgs {
            watchdog: true,
            backoff_initial_ms: Some(500),
            backoff_max_ms: Some(100),
            ..WatchdogArgs::default()
        };
        let e = limits(&a).unwrap_err().to_string();
        assert!(e.contains("--backoff-max-ms 100"), "{e}");
        // An initial wait above the default maximum raises the default maximum.
        let a = WatchdogArgs {
            watchdog: true,
            backoff_initial_ms: Some(9_000),
            ..WatchdogArgs::default()
        };
        assert_eq!(limits(&a).unwrap().backoff_max_ms, 9_000);
        let a = WatchdogArgs {
            watchdog: true,
            env_vars: vec!["KEY=secret".into()],
            ..WatchdogArgs::default()
        };
        let e = limits(&a).unwrap_err().to_string();
        assert!(e.contains("--env `KEY`"), "{e}");
        assert!(!e.contains("secret"), "the value is never echoed: {e}");
    }
}
