//! What a watchdog is doing, written beside the run store after every change so
//! `heddle runs status` in another process can read it without asking the watchdog
//! (`<store>.watchdog/<run>.json`, replaced atomically). The run's progress itself is in
//! the event log; this holds only what the log cannot know: workers, restarts, backoff,
//! time used, cleanup.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::limits::WatchLimits;
use crate::error::Error;

/// Where a watchdog is with its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchPhase {
    /// A worker is being started.
    Starting,
    /// A worker runs the run.
    Running,
    /// The last worker is gone; what it started is being stopped and checked.
    Cleanup,
    /// Waiting before a replacement worker.
    Backoff,
    /// Settled: the run recorded a pause (the run time is frozen).
    Paused,
    /// The run recorded that it completed.
    Completed,
    /// The run recorded that it failed.
    Failed,
    /// The run recorded that it was cancelled.
    Cancelled,
    /// Ended by the watchdog (a limit, a stop, a worker that refused): see `code`.
    Stopped,
}

impl WatchPhase {
    /// The watchdog is (or was, if it died) in the middle of the run.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            WatchPhase::Starting | WatchPhase::Running | WatchPhase::Cleanup | WatchPhase::Backoff
        )
    }
}

/// The worker being watched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worker {
    /// Which launch this is, from 1 (across the run's watchdogs).
    pub launch: u32,
    /// Its process id (and process group id).
    pub pid: u32,
    /// When it was started (ms since the epoch).
    pub launched_ms: u64,
}

/// How one worker launch ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// Which launch it was, from 1.
    pub launch: u32,
    /// Its process id.
    pub pid: u32,
    /// When it was started and when it ended (ms since the epoch).
    pub launched_ms: u64,
    /// When it ended (ms since the epoch).
    pub ended_ms: u64,
    /// `exit N`, `signal N`.
    pub exit: String,
    /// Why the watchdog stopped it, when it did (`OUTPUT_LIMIT`, `TIMEOUT`, `STOPPED`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_for: Option<String>,
    /// Bytes it wrote to its console.
    pub output_bytes: u64,
}

/// What a watchdog knows of its run, as its state file holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WatchState {
    /// The run watched.
    pub run_id: String,
    /// The watchdog's process (the last one to watch the run).
    pub watchdog_pid: u32,
    /// Where it is.
    pub phase: WatchPhase,
    /// What it holds the run to.
    pub limits: WatchLimits,
    /// The worker running now.
    pub worker: Option<Worker>,
    /// Workers started, across the run's watchdogs.
    pub launches: u32,
    /// Replacements after a crash, across the run's watchdogs.
    pub restarts: u32,
    /// The wait before the next replacement, while backing off.
    pub backoff_ms: Option<u64>,
    /// Run time used before `counting_since_ms` (banked at each settled pause).
    pub elapsed_ms: u64,
    /// When the current stretch of run time began (ms since the epoch); `None` while the
    /// run time is frozen.
    pub counting_since_ms: Option<u64>,
    /// `None` until a worker has been cleaned up; then whether the last cleanup removed
    /// everything it looked for.
    pub cleanup_verified: Option<bool>,
    /// What the last cleanup could not remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<String>,
    /// What the last cleanup stopped, removed and could not check.
    #[serde(default)]
    pub last_cleanup: Option<super::cleanup::Teardown>,
    /// How the watched run ended when the watchdog ended it (`TIMEOUT`, ...).
    pub code: Option<String>,
    /// Why, for a person.
    pub detail: Option<String>,
    /// Every launch that ended, in order.
    #[serde(default)]
    pub history: Vec<Launch>,
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl WatchState {
    /// A run not watched before, held to `limits`, watched by this process.
    pub fn new(run_id: &str, limits: WatchLimits) -> WatchState {
        WatchState {
            run_id: run_id.to_string(),
            watchdog_pid: std::process::id(),
            phase: WatchPhase::Starting,
            limits,
            worker: None,
            launches: 0,
            restarts: 0,
            backoff_ms: None,
            elapsed_ms: 0,
            counting_since_ms: None,
            cleanup_verified: None,
            survivors: Vec::new(),
            last_cleanup: None,
            code: None,
            detail: None,
            history: Vec::new(),
        }
    }

    /// Where `run`'s state file is for the store at `store`.
    pub fn path(store: &Path, run: &str) -> PathBuf {
        heddle_store::lock::watchdog_dir(store).join(format!("{run}.json"))
    }

    /// The last state written for `run`, if a watchdog ever supervised it.
    pub fn load(store: &Path, run: &str) -> Result<Option<WatchState>, Error> {
        let path = WatchState::path(store, run);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(|source| {
                Error::StateFile {
                    path: path.clone(),
                    source,
                }
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()))(e)),
        }
    }

    /// Writes the state (a temporary file renamed over the old one, so a reader never
    /// sees half of it).
    pub fn save(&self, store: &Path) -> Result<(), Error> {
        let path = WatchState::path(store, &self.run_id);
        let tmp = path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(Error::io(format!("writing {}", path.display())))
    }

    /// Run time used by `now` (ms since the epoch).
    pub fn elapsed_at(&self, now: u64) -> u64 {
        self.elapsed_ms + self.counting_since_ms.map_or(0, |s| now.saturating_sub(s))
    }

    /// Run time left by `now`; `None` without a limit.
    pub fn remaining_at(&self, now: u64) -> Option<u64> {
        self.limits
            .run_time_limit_ms
            .map(|l| l.saturating_sub(self.elapsed_at(now)))
    }

    /// Starts counting run time (at a worker launch), unless it already counts.
    pub fn count_from(&mut self, now: u64) {
        self.counting_since_ms.get_or_insert(now);
    }

    /// Banks the run time of a watchdog that died mid-run: up to the last moment it
    /// wrote down (a worker launch or end), not up to now: the time nobody supervised
    /// the run is not its run time.
    pub fn bank_dead_watchdog(&mut self) {
        let last = self
            .history
            .iter()
            .map(|l| l.ended_ms)
            .chain(self.worker.iter().map(|w| w.launched_ms))
            .chain(self.counting_since_ms)
            .max();
        if let Some(last) = last {
            self.freeze(last);
        }
    }

    /// Stops counting (a settled pause or the end) and banks the stretch.
    pub fn freeze(&mut self, now: u64) {
        self.elapsed_ms = self.elapsed_at(now);
        self.counting_since_ms = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_time_counts_from_a_launch_and_freezes_at_a_pause() {
        let mut s = WatchState::new(
            "r",
            WatchLimits {
                run_time_limit_ms: Some(1_000),
                ..WatchLimits::default()
            },
        );
        assert_eq!(s.elapsed_at(5_000), 0);
        s.count_from(5_000);
        s.count_from(5_100); // a replacement does not restart the count
        assert_eq!(s.elapsed_at(5_300), 300);
        s.freeze(5_300);
        // Paused: nothing is spent however long it waits.
        assert_eq!(s.remaining_at(90_000), Some(700));
        s.count_from(90_000);
        assert_eq!(s.remaining_at(90_800), Some(0));
    }

    #[test]
    fn the_state_file_round_trips_beside_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("runs.db");
        std::fs::write(&store, b"").unwrap();
        assert_eq!(WatchState::load(&store, "r").unwrap(), None);
        let mut s = WatchState::new("r", WatchLimits::default());
        s.phase = WatchPhase::Backoff;
        s.save(&store).unwrap();
        assert_eq!(WatchState::load(&store, "r").unwrap(), Some(s));
    }
}
