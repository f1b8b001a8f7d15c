//! Settings resolved once: what the caller overrides (a command line's flags, an
//! embedder's choices) over `heddle.toml` over the defaults. This is the one place where
//! a flag and a configuration key meet (`flag.or(config)`), as ripgrep's `HiArgs` is:
//! everything downstream reads typed settings, never the file or the flags, and every
//! setting is checked here, before anything starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use heddle_runners::RunnersConfig;
use heddle_store::artifacts::ArtifactPolicy;
use heddle_store::session::Session;
use heddle_store::{Budget, RunStore, SqliteStore, StoreError, StoreLocation};
use heddle_wasm::{PackageStore, WasmConfig, WasmHost};
use serde::Deserialize;

use crate::config::{Config, MAX_TIME_LIMIT_MS};
use crate::error::{ConfigError, Error, Refused, refused};

/// Default store of installed packages, relative to the working directory.
pub const DEFAULT_PACKAGES_DIR: &str = ".heddle";

/// What the caller sets over the configuration file; `None` (or `false`) leaves the
/// file's setting, else the default.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// The configuration file (which must exist); default `./heddle.toml` when present.
    pub config: Option<PathBuf>,
    /// The directory of installed packages (over `[cli] packages_dir`).
    pub packages: Option<PathBuf>,
    /// Wall-clock limit per node invocation, in milliseconds (over `[run]
    /// node_timeout_ms`).
    pub node_timeout_ms: Option<u64>,
    /// Make runs durable (as `[store] durable = true` does).
    pub durable: bool,
    /// A server's settings (over `[serve]`).
    pub serve: ServeOverrides,
    /// How the command line writes its log lines (over `[telemetry] log_format`).
    pub log_format: Option<crate::telemetry::LogFormat>,
}

/// What a server's caller sets over `[serve]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServeOverrides {
    /// Who decides a failed invocation of a run created without a choice of its own.
    pub supervise: Option<Supervise>,
    /// How long an interactive escalation waits for a person, in milliseconds.
    pub decision_timeout_ms: Option<u64>,
    /// The length of the store's owner lease, in milliseconds.
    pub lease_ttl_ms: Option<u64>,
}

/// Who decides a failed node invocation of a run a server drives. Recorded with the
/// run, so whoever adopts or resumes it supervises it the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Supervise {
    /// Failures fail, as in an unsupervised `heddle run`.
    #[default]
    None,
    /// Each failure waits for a person's verdict through the API.
    Interactive,
}

impl Supervise {
    /// Its name, as the configuration, the API and the run's record spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Supervise::None => "none",
            Supervise::Interactive => "interactive",
        }
    }
}

/// The command line's own settings (`[cli]`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CliSection {
    /// Where installed packages and their lockfile live (default `.heddle`).
    #[serde(default)]
    packages_dir: Option<PathBuf>,
}

/// Every setting, checked.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The file they were read from (its path names it in messages).
    pub config: Config,
    /// The WASM engine, the packages' grants and where secret values come from.
    pub wasm: WasmConfig,
    /// Code nodes.
    pub runners: RunnersConfig,
    /// Where installed packages and their lockfile live.
    pub packages_dir: PathBuf,
    /// The run itself.
    pub run: RunSettings,
    /// Durable runs.
    pub store: StoreSettings,
    /// A server.
    pub serve: ServeSettings,
    /// Traces and the log format.
    pub telemetry: crate::telemetry::TelemetrySettings,
}

/// Settings of every run.
#[derive(Clone, Debug, Default)]
pub struct RunSettings {
    /// Wall-clock limit per node invocation; reaching it cancels the work. `None`: only
    /// the nodes' own limits.
    pub node_timeout: Option<Duration>,
}

impl Settings {
    /// Reads the configuration (`overrides.config`, else `./heddle.toml` when present)
    /// and resolves every setting over it, checked.
    pub fn load(overrides: &Overrides) -> Result<Settings, ConfigError> {
        let config = Config::load(overrides.config.as_deref())?;
        Settings::resolve(config, overrides)
    }

    /// Resolves every setting from `config` with `overrides` over it.
    pub fn resolve(config: Config, overrides: &Overrides) -> Result<Settings, ConfigError> {
        let mut wasm = WasmConfig::from_toml_str(config.text()).map_err(|e| {
            ConfigError::new(format!(
                "{}: {}",
                config.display_path(),
                heddle_core::text::error_chain(&e)
            ))
        })?;
        for f in &mut wasm.wasm.http_ca_files {
            *f = config.resolve(f);
        }
        let runners: RunnersConfig = config.section("runners")?.unwrap_or_default();
        let cli: CliSection = config.section("cli")?.unwrap_or_default();
        let packages_dir = match (&overrides.packages, cli.packages_dir) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) => config.resolve(&p),
            (None, None) => PathBuf::from(DEFAULT_PACKAGES_DIR),
        };
        let run = RunSettings {
            node_timeout: overrides
                .node_timeout_ms
                .map(Duration::from_millis)
                .or(config.run.node_timeout()),
        };
        let mut store = StoreSettings::load(&config)?;
        store.durable |= overrides.durable;
        let serve = ServeSettings::load(&config, &overrides.serve)?;
        let telemetry = crate::telemetry::TelemetrySettings::load(&config, overrides.log_format)?;
        Ok(Settings {
            config,
            wasm,
            runners,
            packages_dir,
            run,
            store,
            serve,
            telemetry,
        })
    }

    /// The store of installed packages.
    pub fn package_store(&self) -> PackageStore {
        PackageStore::open(&self.packages_dir)
    }

    /// Starts the wasmtime engine (compile cache, epoch ticker). A compile the cache
    /// cannot serve takes seconds for a large package: it is logged (`compiling NAME
    /// (first use)…`), so a person waiting is told which.
    pub fn wasm_host(&self) -> Result<WasmHost, Error> {
        let host = WasmHost::new(self.wasm.wasm.clone()).map_err(|e| Error::Engine(Box::new(e)))?;
        host.on_compile(|name| tracing::info!("compiling {name} (first use)…"));
        Ok(host)
    }
}

/// `[store]` in heddle.toml, as read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    #[serde(default)]
    path: Option<PathBuf>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    durable: bool,
    #[serde(default)]
    max_dispatches: Option<u64>,
    #[serde(default)]
    time_limit_ms: Option<u64>,
    #[serde(default)]
    inline_output_bytes: Option<u64>,
    #[serde(default)]
    max_artifact_bytes: Option<u64>,
    #[serde(default)]
    max_run_artifact_bytes: Option<u64>,
}

/// SQLite's largest blob (its default `SQLITE_MAX_LENGTH`).
const MAX_BLOB_BYTES: u64 = 1_000_000_000;

/// The largest per-run artifact quota accepted (1 TiB): anything above is a typo.
const MAX_RUN_BYTES: u64 = 1 << 40;

/// Durable runs' settings (`[store]`), checked.
#[derive(Clone, Debug)]
pub struct StoreSettings {
    /// The run store file (default `.heddle/runs.db`, relative to the config file).
    pub path: PathBuf,
    /// A PostgreSQL store (`[store] url = "postgres://…"`), used over `path`; the
    /// `HEDDLE_STORE_URL` environment variable is used over both ([`Self::location`]).
    pub url: Option<String>,
    /// Every run is durable unless asked otherwise.
    pub durable: bool,
    /// The budget of every durable run that sets none of its own.
    pub max_dispatches: Option<u64>,
    /// The run time limit of every durable run that sets none of its own (ms).
    pub time_limit_ms: Option<u64>,
    /// A node output whose JSON is longer than this is stored as an artifact of the run
    /// (default 64 KiB).
    pub inline_output_bytes: u64,
    /// The largest one artifact (default 64 MiB) and all of one run's (256 MiB).
    pub artifacts: ArtifactPolicy,
}

impl Default for StoreSettings {
    fn default() -> StoreSettings {
        StoreSettings {
            path: PathBuf::from(heddle_store::DEFAULT_PATH),
            url: None,
            durable: false,
            max_dispatches: None,
            time_limit_ms: None,
            inline_output_bytes: heddle_store::spill::DEFAULT_INLINE_BYTES,
            artifacts: ArtifactPolicy::default(),
        }
    }
}

impl StoreSettings {
    /// `[store]` of `config`, refused (naming the setting) when an artifact limit is
    /// zero, beyond what the store can hold, or inconsistent with another.
    fn load(config: &Config) -> Result<StoreSettings, ConfigError> {
        let s: StoreSection = config.section("store")?.unwrap_or_default();
        let defaults = ArtifactPolicy::default();
        let artifacts = ArtifactPolicy {
            max_artifact_bytes: s.max_artifact_bytes.unwrap_or(defaults.max_artifact_bytes),
            max_run_bytes: s.max_run_artifact_bytes.unwrap_or(defaults.max_run_bytes),
            known_secrets: Vec::new(),
        };
        let inline = s
            .inline_output_bytes
            .unwrap_or(heddle_store::spill::DEFAULT_INLINE_BYTES);
        let check = |name: &str, n: u64, max: u64, why: &str| {
            if (1..=max).contains(&n) {
                Ok(())
            } else {
                Err(ConfigError::new(format!(
                    "[store] {name} = {n}: give 1 to {max} bytes ({why})"
                )))
            }
        };
        check(
            "max_artifact_bytes",
            artifacts.max_artifact_bytes,
            MAX_BLOB_BYTES,
            "the largest value the run store can hold",
        )?;
        check(
            "max_run_artifact_bytes",
            artifacts.max_run_bytes,
            MAX_RUN_BYTES,
            "1 TiB",
        )?;
        if artifacts.max_artifact_bytes > artifacts.max_run_bytes {
            return Err(ConfigError::new(format!(
                "[store] max_artifact_bytes = {} is over max_run_artifact_bytes = {}: one artifact cannot be larger than all of a run's",
                artifacts.max_artifact_bytes, artifacts.max_run_bytes
            )));
        }
        check(
            "inline_output_bytes",
            inline,
            artifacts.max_artifact_bytes,
            "at most max_artifact_bytes, so every value that leaves the log fits in an artifact",
        )?;
        Ok(StoreSettings {
            path: match s.path {
                Some(p) => config.resolve(&p),
                None => PathBuf::from(heddle_store::DEFAULT_PATH),
            },
            url: s.url.filter(|u| !u.is_empty()),
            durable: s.durable,
            max_dispatches: s.max_dispatches,
            time_limit_ms: s.time_limit_ms,
            inline_output_bytes: inline,
            artifacts,
        })
    }

    /// The run store file. With a PostgreSQL store ([`Self::location`]) the file itself
    /// is not used, but its directory still holds what is local to this machine
    /// (watchdog locks and state, the server's token).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the runs are: `HEDDLE_STORE_URL` when set, else `[store] url`, else the
    /// file at [`Self::path`].
    pub fn location(&self) -> StoreLocation {
        StoreLocation::resolve(self.url.as_deref(), Some(&self.path))
    }

    /// Opens the run store, creating it when there is none (a PostgreSQL database's
    /// tables are created in it on first use).
    pub fn open(&self) -> Result<Arc<dyn RunStore>, StoreError> {
        let store = heddle_store::open(&self.location())?;
        if let heddle_store::Store::Sqlite(s) = &store {
            said_upgrade(s);
        }
        Ok(store.runs())
    }

    /// The store file, opened; an older schema brought up to date is said. Refused when
    /// the runs are in PostgreSQL: what calls this (`heddle serve`, through its store
    /// lease) owns a whole store from one process, which several hosts on one database
    /// do not do yet.
    pub fn open_sqlite(&self) -> Result<SqliteStore, Error> {
        let path = match self.location() {
            StoreLocation::Sqlite(p) => p,
            StoreLocation::Postgres(_) => {
                return Err(refused!(
                    "run store {}: `heddle serve` keeps its runs in one SQLite file for now; several hosts on one PostgreSQL database are the next step (issue 29). Serve from a store file (unset HEDDLE_STORE_URL and [store] url), or use `heddle run --durable` and `heddle runs …` with this database",
                    self.location()
                )
                .into());
            }
        };
        let store = SqliteStore::open(&path)?;
        said_upgrade(&store);
        Ok(store)
    }

    /// Opens a store that must already exist: reading or resuming never creates a
    /// store file. (A PostgreSQL database is always there: it is opened.)
    pub fn open_existing(&self) -> Result<Option<Arc<dyn RunStore>>, StoreError> {
        if let StoreLocation::Sqlite(p) = self.location()
            && !p.exists()
        {
            return Ok(None);
        }
        Ok(Some(self.open()?))
    }

    /// The existing store holding `run`; an unknown run when there is no store.
    pub fn existing(&self, run: &str) -> Result<Arc<dyn RunStore>, Error> {
        self.open_existing()?.ok_or_else(|| Error::NoStore {
            path: self.path().to_path_buf(),
            source: StoreError::UnknownRun(run.to_string()),
        })
    }

    /// The budget of a new durable run: what the run asks for, else `[store]`'s. One
    /// range however the time limit is given (a flag, a request to the API, the file).
    pub fn budget(
        &self,
        max_dispatches: Option<u64>,
        time_limit_ms: Option<u64>,
    ) -> Result<Budget, Refused> {
        let (limit, source) = match time_limit_ms {
            Some(ms) => (Some(ms), "time_limit_ms"),
            None => (self.time_limit_ms, "[store] time_limit_ms"),
        };
        if let Some(ms) = limit
            && !(1..=MAX_TIME_LIMIT_MS).contains(&ms)
        {
            return Err(refused!(
                "{source} = {ms}: a run's time limit is 1 to {MAX_TIME_LIMIT_MS} ms (30 days)"
            ));
        }
        Ok(Budget {
            max_dispatches: max_dispatches.or(self.max_dispatches),
            time_limit_ms: limit,
        })
    }

    /// Sets how `session` stores its large values: this store's inline limit and
    /// artifact limits, and `secrets` (the run's secret values), which no stored value
    /// may hold.
    pub fn configure(&self, session: &Session, secrets: &heddle_kernel::SecretRegistry) {
        session.configure(self.spill(secrets));
    }

    /// How a run's values are stored under this store's limits, `secrets` (the run's
    /// secret values) refused in any of them.
    pub fn spill(&self, secrets: &heddle_kernel::SecretRegistry) -> heddle_store::spill::Spill {
        heddle_store::spill::Spill {
            inline_bytes: self.inline_output_bytes,
            policy: ArtifactPolicy {
                known_secrets: secrets.snapshot(),
                ..self.artifacts.clone()
            },
        }
    }
}

/// Says an older store file brought up to date (a person should know their store file
/// was rewritten, and from which version).
fn said_upgrade(store: &SqliteStore) {
    if let Some(u) = store.upgrade() {
        tracing::info!("run store {}: {u}", store.path().display());
    }
}

/// `[serve]` in heddle.toml, as read.
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

const DEFAULT_LEASE_TTL_MS: u64 = 10_000;
const LEASE_TTL_MS: std::ops::RangeInclusive<u64> = 1000..=600_000;

/// What a server runs with.
#[derive(Clone, Copy, Debug)]
pub struct ServeSettings {
    /// Who decides the failures of a run created without a choice of its own (default
    /// nobody: they fail).
    pub supervise: Supervise,
    /// How long an interactive escalation waits for a person (default 10 minutes).
    pub decision_timeout: Duration,
    /// The store's owner lease, renewed every third of it (default 10 s).
    pub lease_ttl: Duration,
}

impl ServeSettings {
    fn load(config: &Config, over: &ServeOverrides) -> Result<ServeSettings, ConfigError> {
        let s: ServeSection = config.section("serve")?.unwrap_or_default();
        let file = config.display_path();
        if s.decision_timeout_ms == Some(0) {
            return Err(ConfigError::new(format!(
                "{file}: section [serve]: decision_timeout_ms = 0: a person needs at least 1 ms"
            )));
        }
        if let Some(t) = s.lease_ttl_ms.filter(|t| !LEASE_TTL_MS.contains(t)) {
            return Err(ConfigError::new(format!(
                "{file}: section [serve]: lease_ttl_ms = {t}: expected 1000 to 600000"
            )));
        }
        let default_decision = heddle_supervisor::interactive::DEFAULT_DECISION_TIMEOUT;
        Ok(ServeSettings {
            supervise: over.supervise.or(s.supervise).unwrap_or_default(),
            decision_timeout: over
                .decision_timeout_ms
                .or(s.decision_timeout_ms)
                .map_or(default_decision, Duration::from_millis),
            lease_ttl: Duration::from_millis(
                over.lease_ttl_ms
                    .or(s.lease_ttl_ms)
                    .unwrap_or(DEFAULT_LEASE_TTL_MS),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(toml: &str) -> StoreSettings {
        let config = Config::parse(toml, Path::new("/cfg/heddle.toml")).unwrap();
        StoreSettings::load(&config).unwrap()
    }

    /// `[store] url` is used over `[store] path` (`HEDDLE_STORE_URL` over both, which
    /// `StoreLocation::resolve` tests; the test environment sets none), and what owns a
    /// whole store file (`heddle serve`) refuses a database as a request it cannot do
    /// yet, before connecting anywhere.
    #[test]
    fn a_store_url_is_used_over_the_path_and_a_file_only_owner_refuses_it() {
        let url = "postgres://h@127.0.0.1:1/db";
        let s = store(&format!("[store]\npath = \"runs.db\"\nurl = \"{url}\"\n"));
        assert_eq!(s.location(), StoreLocation::Postgres(url.into()));
        match s.open_sqlite() {
            Err(Error::Refused(r)) => assert!(
                r.to_string()
                    .contains("several hosts on one PostgreSQL database are the next step"),
                "{r}"
            ),
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        }
        let s = store("[store]\npath = \"runs.db\"\n");
        assert_eq!(s.location(), StoreLocation::Sqlite("/cfg/runs.db".into()));
        assert_eq!(
            store("").location(),
            StoreLocation::Sqlite(heddle_store::DEFAULT_PATH.into())
        );
    }
}
