//! `heddle worker RUN`: what a watchdog starts. It runs or recovers one stored run
//! exactly as `heddle runs resume` does (the stored graph, inputs and package digests,
//! never the command line), with its containers labelled with the run id so the
//! watchdog can find them after the worker is gone. Package digests are checked before
//! loading ([`crate::watchdog::packages`]) and, by the resume, on the bytes it loaded.

use crate::cli::WorkerArgs;
use crate::config::Config;
use crate::durable::StoreSection;
use crate::exit::Exit;

pub fn run(args: WorkerArgs) -> anyhow::Result<Exit> {
    heddle_runners::label_run(&args.run);
    let config = Config::load(args.env.config.as_deref())?;
    let section = StoreSection::load(&config)?;
    crate::execute::become_worker(section.path().to_path_buf());
    // Before anything is loaded: the installed bytes must still be the recorded ones.
    let store = crate::durable::existing(&section, &args.run)?;
    let header = store.header(&args.run)?;
    if let Some(e) = crate::watchdog::packages::changed(&args.run, &header.run.packages, &args.env)?
    {
        return Err(e.into());
    }
    crate::durable::resume(&section, &args.env, &args.run, args.pause, args.json)
}
