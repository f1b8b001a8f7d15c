//! `[serve]` in heddle.toml: the server's settings as data, each overridden by the flag
//! of the same name. Checked before the lease is taken, like every other setting.

use std::time::Duration;

use serde::Deserialize;

use crate::cli::{ServeArgs, Supervise};
use crate::config::Config;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeSection {
    #[serde(default)]
    supervise: Option<Supervise>,
    #[serde(default)]
    decision_timeout_ms: Option<u64>,
    #[serde(default)]
    lease_ttl_ms: Option<u64>,
}

/// What the server runs with: the flags, else `[serve]`, else the defaults.
pub struct Settings {
    pub supervise: Supervise,
    pub decision_timeout: Duration,
    pub lease_ttl: Duration,
}

const DEFAULT_LEASE_TTL_MS: u64 = 10_000;
const LEASE_TTL_MS: std::ops::RangeInclusive<u64> = 1000..=600_000;

impl Settings {
    pub fn load(config: &Config, args: &ServeArgs) -> anyhow::Result<Settings> {
        let s: ServeSection = config.section("serve")?.unwrap_or_default();
        let file = config.display_path();
        if s.decision_timeout_ms == Some(0) {
            return Err(crate::usage!(
                "{file}: section [serve]: decision_timeout_ms = 0: a person needs at least 1 ms"
            ));
        }
        if let Some(t) = s.lease_ttl_ms.filter(|t| !LEASE_TTL_MS.contains(t)) {
            return Err(crate::usage!(
                "{file}: section [serve]: lease_ttl_ms = {t}: expected 1000 to 600000"
            ));
        }
        let default_decision = heddle_supervisor::interactive::DEFAULT_DECISION_TIMEOUT;
        Ok(Settings {
            supervise: args.supervise.or(s.supervise).unwrap_or_default(),
            decision_timeout: args
                .decision_timeout_ms
                .or(s.decision_timeout_ms)
                .map_or(default_decision, Duration::from_millis),
            lease_ttl: Duration::from_millis(
                args.lease_ttl_ms
                    .or(s.lease_ttl_ms)
                    .unwrap_or(DEFAULT_LEASE_TTL_MS),
            ),
        })
    }
}
