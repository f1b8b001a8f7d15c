//! A supervised run's limits: checked before anything starts, recorded with the run (a
//! resume keeps them), and turned into the backoff between replacement workers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cli::WatchdogArgs;

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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Replacement workers allowed after crashes.
    pub max_restarts: u32,
    /// Wait before the first replacement; doubles per restart up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// The run's time limit (its budget's `time_limit_ms`) on the watchdog's clock:
    /// worker execution plus backoff, frozen while the run is paused; `None`: no limit.
    pub run_time_limit_ms: Option<u64>,
    pub output_limit_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_restarts: 3,
            backoff_initial_ms: 100,
            backoff_max_ms: 5_000,
            run_time_limit_ms: None,
            output_limit_bytes: OUTPUT_LIMIT_BYTES,
        }
    }
}

impl Limits {
    /// The limits asked for on the command line over the defaults. Ranges are clap's
    /// (zero and absurd values never get here); what spans two flags is checked here.
    pub fn from_args(a: &WatchdogArgs) -> anyhow::Result<Limits> {
        let d = Limits::default();
        let l = Limits {
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

    /// The limits a stored run was recorded with (the defaults for a run recorded
    /// without a watchdog).
    pub fn stored(limits: &heddle_store::RunLimits) -> anyhow::Result<Limits> {
        match &limits.watchdog {
            None => Ok(Limits::default()),
            Some(w) => Ok(w.read()?),
        }
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

/// Refuses `--env` names that cannot be environment variables, naming the flag.
pub fn env_names(names: &[String]) -> anyhow::Result<()> {
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

/// The worker's environment: the base variables and the named ones that are set here.
/// Read at each start or resume, never stored.
pub fn worker_env(named: &[String]) -> Vec<(String, std::ffi::OsString)> {
    BASE_ENV
        .iter()
        .map(|s| s.to_string())
        .chain(named.iter().cloned())
        .filter_map(|k| std::env::var_os(&k).map(|v| (k, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_initial_wait_up_to_the_maximum() {
        let l = Limits {
            backoff_initial_ms: 100,
            backoff_max_ms: 1_000,
            ..Limits::default()
        };
        let waits: Vec<u64> = (1..=6).map(|r| l.backoff(r).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(l.backoff(u32::MAX).as_millis(), 1_000);
    }

    #[test]
    fn a_maximum_below_the_initial_wait_and_a_bad_env_name_are_refused() {
        let a = WatchdogArgs {
            watchdog: true,
            backoff_initial_ms: Some(500),
            backoff_max_ms: Some(100),
            ..WatchdogArgs::default()
        };
        let e = Limits::from_args(&a).unwrap_err().to_string();
        assert!(e.contains("--backoff-max-ms 100"), "{e}");
        // An initial wait above the default maximum raises the default maximum.
        let a = WatchdogArgs {
            watchdog: true,
            backoff_initial_ms: Some(9_000),
            ..WatchdogArgs::default()
        };
        assert_eq!(Limits::from_args(&a).unwrap().backoff_max_ms, 9_000);
        let a = WatchdogArgs {
            watchdog: true,
            env_vars: vec!["KEY=secret".into()],
            ..WatchdogArgs::default()
        };
        let e = Limits::from_args(&a).unwrap_err().to_string();
        assert!(e.contains("--env `KEY`"), "{e}");
        assert!(!e.contains("secret"), "the value is never echoed: {e}");
    }
}
