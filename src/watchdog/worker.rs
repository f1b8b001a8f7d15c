//! `heddle worker RUN`: what a watchdog starts. It runs or recovers one stored run
//! exactly as `heddle runs resume` does (the stored graph, inputs and package digests,
//! never the command line), with its containers labelled with the run id so the
//! watchdog can find them after the worker is gone. Package digests are checked before
//! loading ([`super::packages`]) and, by the resume, on the bytes it loaded.

use crate::cli::WorkerArgs;
use crate::commands::runs::StoreSection;
use crate::config::Config;
use crate::exit::Exit;

pub fn run(args: WorkerArgs) -> anyhow::Result<Exit> {
    heddle_runners::label_run(&args.run);
    let config = Config::load(args.env.config.as_deref())?;
    let section = StoreSection::load(&config)?;
    // Before anything is loaded: the installed bytes must still be the recorded ones.
    let store = crate::commands::runs::existing(&section, &args.run)?;
    let header = store.header(&args.run)?;
    if let Some(e) = super::packages::changed(&args.run, &header.run.packages, &args.env)? {
        return Err(e.into());
    }
    crate::commands::runs::resume(&section, &args.env, &args.run, args.pause, args.json)
}
