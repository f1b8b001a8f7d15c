//! `heddle worker RUN`: what a watchdog starts. It runs or recovers one stored run
//! exactly as `heddle runs resume` does (the stored graph, inputs and package digests,
//! never the command line), with its containers labelled with the run id so the
//! watchdog can find them after the worker is gone. Package digests are checked before
//! loading ([`super::packages`]) and, by the resume, on the bytes it loaded.

use std::path::PathBuf;
use std::sync::OnceLock;

use heddle_kernel::SecretRegistry;
use heddle_store::artifacts::ArtifactPolicy;

use crate::cli::WorkerArgs;
use crate::commands::runs::StoreSection;
use crate::config::Config;
use crate::exit::Exit;

/// The run store of the run this process works on as a worker; unset elsewhere.
static WORKER_STORE: OnceLock<PathBuf> = OnceLock::new();

pub fn run(args: WorkerArgs) -> anyhow::Result<Exit> {
    heddle_runners::label_run(&args.run);
    let config = Config::load(args.env.config.as_deref())?;
    let section = StoreSection::load(&config)?;
    let _ = WORKER_STORE.set(section.path().to_path_buf());
    // Before anything is loaded: the installed bytes must still be the recorded ones.
    let store = crate::commands::runs::existing(&section, &args.run)?;
    let header = store.header(&args.run)?;
    if let Some(e) = super::packages::changed(&args.run, &header.run.packages, &args.env)? {
        return Err(e.into());
    }
    crate::commands::runs::resume(&section, &args.env, &args.run, args.pause, args.json)
}

/// Whether this process is a watchdog's worker.
pub fn is_worker() -> bool {
    WORKER_STORE.get().is_some()
}

/// Stores a worker's final report once as the run's `final-report` artifact (refused
/// when it holds one of the run's secret values, or is over the storage limits), so the
/// watchdog reports bytes it read back verified from the store, not console output.
/// Does nothing outside a worker.
pub fn store_final_report(
    run: &str,
    report: &crate::report::RunReport,
    secrets: &SecretRegistry,
) -> anyhow::Result<()> {
    let Some(path) = WORKER_STORE.get() else {
        return Ok(());
    };
    let bytes = serde_json::to_vec_pretty(report)?;
    let policy = ArtifactPolicy {
        known_secrets: secrets.snapshot(),
        ..ArtifactPolicy::default()
    };
    heddle_store::SqliteStore::open(path)?.put_artifact(
        run,
        Some(super::FINAL_REPORT),
        &bytes,
        &policy,
    )?;
    Ok(())
}
