//! `heddle worker RUN`: what a watchdog starts. It runs or recovers one stored run
//! exactly as `heddle runs resume` does (the stored graph, inputs and package digests,
//! never the command line), with its containers labelled with the run id so the
//! watchdog can find them after the worker is gone, and leaves its final report in the
//! run store for the watchdog. Package digests are checked before loading
//! ([`heddle_runtime::watch::packages`]) and, by the resume, on the bytes it loaded.

use heddle_store::session;

use crate::cli::WorkerArgs;
use crate::exit::Exit;

pub fn run(args: WorkerArgs) -> anyhow::Result<Exit> {
    heddle_runners::label_run(&args.run);
    let settings = args.env.settings()?;
    crate::console::set_format(settings.telemetry.log_format);
    // Before anything is loaded: the installed bytes must still be the recorded ones.
    let store = settings.store.existing(&args.run)?;
    let header = store.header(&args.run)?;
    if let Some(e) = heddle_runtime::watch::packages::changed(
        &args.run,
        &header.run.packages,
        &settings.package_store(),
    )? {
        return Err(e.into());
    }
    let r = session::check_resume(&*store, &args.run, args.pause)?;
    crate::commands::runs::continue_run(settings, store, r, args.json, None, true)
}
