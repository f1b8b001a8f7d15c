//! A watched run's limits: checked before anything starts, recorded with the run (a
//! resume keeps them), and turned into the backoff between replacement workers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Refused, refused};

/// Combined stdout and stderr one worker launch may write; over it the worker is
/// stopped and not replaced (`OUTPUT_LIMIT`). Fixed: a worker's console is for people,
/// results travel through the run store.
pub const OUTPUT_LIMIT_BYTES: u64 = 1_000_000;

/// Variables every worker gets from the watchdog's environment (when set); anything
/// else only when named with `--env NAME`. Beyond what finds programs and scratch space,
/// the worker must look where its watchdog looks: `XDG_CACHE_HOME` so it loads packages
/// from the compile cache the user's runs fill (without it every worker recompiled
/// every package into another cache under `HOME`), and `DOCKER_HOST` so its code nodes
/// start containers on the engine the watchdog's cleanup searches. Neither is a secret.
pub const BASE_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "TMPDIR",
    "TMP",
    "TEMP",
    "XDG_CACHE_HOME",
    "DOCKER_HOST",
];

/// What a watchdog holds its run to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchLimits {
    /// Replacement workers allowed after crashes.
    pub max_restarts: u32,
    /// Wait before the first replacement; doubles per restart up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    /// The longest wait between replacements.
    pub backoff_max_ms: u64,
    /// The run's time limit (its budget's `time_limit_ms`) on the watchdog's clock:
    /// worker execution plus backoff, frozen while the run is paused; `None`: no limit.
    pub run_time_limit_ms: Option<u64>,
    /// Console bytes one launch may write ([`OUTPUT_LIMIT_BYTES`]).
    pub output_limit_bytes: u64,
}

impl Default for WatchLimits {
    fn default() -> WatchLimits {
        WatchLimits {
            max_restarts: 3,
            backoff_initial_ms: 100,
            backoff_max_ms: 5_000,
            run_time_limit_ms: None,
            output_limit_bytes: OUTPUT_LIMIT_BYTES,
        }
    }
}

impl WatchLimits {
    /// The limits asked for (`--max-restarts`, `--backoff-initial-ms`,
    /// `--backoff-max-ms`) over the defaults. An initial wait above the default
    /// maximum raises the maximum; a maximum given below the initial wait is refused.
    pub fn asked(
        max_restarts: Option<u32>,
        backoff_initial_ms: Option<u64>,
        backoff_max_ms: Option<u64>,
    ) -> Result<WatchLimits, Refused> {
        let d = WatchLimits::default();
        let l = WatchLimits {
            max_restarts: max_restarts.unwrap_or(d.max_restarts),
            backoff_initial_ms: backoff_initial_ms.unwrap_or(d.backoff_initial_ms),
            backoff_max_ms: backoff_max_ms
                .unwrap_or(d.backoff_max_ms.max(backoff_initial_ms.unwrap_or(0))),
            ..d
        };
        if l.backoff_max_ms < l.backoff_initial_ms {
            return Err(refused!(
                "--backoff-max-ms {} is below --backoff-initial-ms {}: the longest wait cannot be shorter than the first",
                l.backoff_max_ms,
                l.backoff_initial_ms
            ));
        }
        Ok(l)
    }

    /// The limits a stored run was recorded with (the defaults for a run recorded
    /// without a watchdog).
    pub fn stored(limits: &heddle_store::RunLimits) -> Result<WatchLimits, serde_json::Error> {
        match &limits.watchdog {
            None => Ok(WatchLimits::default()),
            Some(w) => w.read(),
        }
    }

    /// Records them in a new run's limits, where [`WatchLimits::stored`] finds them.
    pub fn record(&self, limits: &mut heddle_store::RunLimits) -> Result<(), serde_json::Error> {
        limits.watchdog = Some(heddle_store::WatchdogLimits::new(self)?);
        Ok(())
    }

    /// The wait before replacement number `restart` (from 1).
    pub fn backoff(&self, restart: u32) -> Duration {
        let doublings = restart.saturating_sub(1).min(32);
        let ms = self
            .backoff_initial_ms
            .saturating_mul(1u64 << doublings)
            .min(self.backoff_max_ms);
        Duration::from_millis(ms)
    }
}

/// Refuses names passed on to the worker (`--env NAME`) that cannot be environment
/// variables. Only what precedes a `=` is echoed: what follows may be the secret itself.
pub fn check_env_names(names: &[String]) -> Result<(), Refused> {
    for n in names {
        if n.is_empty() || n.contains('=') || n.contains('\0') {
            let name = n.split(['=', '\0']).next().unwrap_or_default();
            return Err(refused!(
                "--env `{}`: not an environment variable name (give the name only, no `=VALUE`; the value is read from this environment)",
                heddle_core::text::clip(name, heddle_core::text::ECHO_MAX_CHARS)
            ));
        }
    }
    Ok(())
}

/// The worker's environment: the base variables, the standard OpenTelemetry ones (so a
/// worker exports where its watchdog would, under the same `TRACEPARENT`) and the named
/// ones that are set here. Read at each start or resume, never stored.
pub fn worker_env(named: &[String]) -> Vec<(String, std::ffi::OsString)> {
    BASE_ENV
        .iter()
        .chain(crate::telemetry::PASSED_TO_WORKERS)
        .map(|s| s.to_string())
        .chain(named.iter().cloned())
        .filter_map(|k| std::env::var_os(&k).map(|v| (k, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maximum_below_the_initial_wait_and_a_bad_env_name_are_refused() {
        let e = WatchLimits::asked(None, Some(500), Some(100))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--backoff-max-ms 100"), "{e}");
        // An initial wait above the default maximum raises the default maximum.
        let l = WatchLimits::asked(None, Some(9_000), None).unwrap();
        assert_eq!(l.backoff_max_ms, 9_000);
        let e = check_env_names(&["KEY=secret".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--env `KEY`"), "{e}");
        assert!(!e.contains("secret"), "the value is never echoed: {e}");
    }

    #[test]
    fn backoff_doubles_from_the_initial_wait_up_to_the_maximum() {
        let l = WatchLimits {
            backoff_initial_ms: 100,
            backoff_max_ms: 1_000,
            ..WatchLimits::default()
        };
        let waits: Vec<u64> = (1..=6).map(|r| l.backoff(r).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(l.backoff(u32::MAX).as_millis(), 1_000);
    }
}
