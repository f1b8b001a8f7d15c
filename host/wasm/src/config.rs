//! The operator's configuration of the WASM host: engine settings, per-package grants and
//! the secret source. Read from `heddle.toml` (sections `[wasm]`, `[packages.<name>]`,
//! `[secrets]`); see the crate README for the full schema.
//!
//! Grants live here and nowhere else: a package's manifest only *asks*, and a graph can
//! only *narrow* what is written here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use heddle_core::NodeLimits;
use heddle_core::graph::AccessLevel;
use serde::{Deserialize, Serialize};

use crate::error::PackageError;

/// Default fuel per invocation: about a second of tight compute, far more than real
/// data-transform nodes use, small enough that a runaway loop ends quickly.
pub const DEFAULT_FUEL: u64 = 10_000_000_000;
pub const DEFAULT_MEMORY_MB: u64 = 256;
/// Inline value cap per port value (bigger data should travel by reference).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1 << 20;
/// Guest log output kept per invocation (log import + stdout + stderr together).
pub const DEFAULT_LOG_CAP_BYTES: usize = 64 << 10;
/// Wall-clock limit of an invocation of a package without its own `timeout_ms`: fuel
/// bounds computing, this bounds waiting (a WASI sleep burns no fuel). Time spent
/// waiting for input or for downstream backpressure does not count.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Time `describe()` may take when a package is loaded or installed.
pub const DEFAULT_DESCRIBE_TIMEOUT_MS: u64 = 10_000;

/// The WASM sections of `heddle.toml`. Unknown top-level sections are ignored so the
/// same file can be handed over whole.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WasmConfig {
    #[serde(default)]
    pub wasm: EngineSettings,
    /// Grants per package name.
    #[serde(default)]
    pub packages: BTreeMap<String, PackageGrant>,
    #[serde(default)]
    pub secrets: SecretsConfig,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Where compiled components are cached; default `$XDG_CACHE_HOME/heddle/wasm`
    /// (or `~/.cache/heddle/wasm`).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Use the pooling instance allocator (falls back to on-demand with a warning when
    /// the machine cannot reserve its address space).
    #[serde(default = "yes")]
    pub pooling: bool,
    /// Meter fuel. Turning it off removes per-invocation CPU budgets.
    #[serde(default = "yes")]
    pub fuel: bool,
    /// Largest linear memory any package may be granted, in MiB (pool slot size).
    #[serde(default = "default_max_memory")]
    pub max_memory_mb: u64,
    /// Concurrent instances the pool holds.
    #[serde(default = "default_pool_instances")]
    pub pool_instances: u32,
    #[serde(default = "default_max_value")]
    pub max_value_bytes: usize,
    #[serde(default = "default_log_cap")]
    pub log_cap_bytes: usize,
    /// Wall-clock limit per invocation for packages whose grant sets no `timeout_ms`
    /// (0 = none). See [`DEFAULT_TIMEOUT_MS`].
    #[serde(default = "default_timeout")]
    pub default_timeout_ms: u64,
    /// Time `describe()` may take at load and install.
    #[serde(default = "default_describe_timeout")]
    pub describe_timeout_ms: u64,
}

fn yes() -> bool {
    true
}
fn default_max_memory() -> u64 {
    1024
}
fn default_pool_instances() -> u32 {
    256
}
fn default_max_value() -> usize {
    DEFAULT_MAX_VALUE_BYTES
}
fn default_log_cap() -> usize {
    DEFAULT_LOG_CAP_BYTES
}
fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}
fn default_describe_timeout() -> u64 {
    DEFAULT_DESCRIBE_TIMEOUT_MS
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            cache_dir: None,
            pooling: true,
            fuel: true,
            max_memory_mb: default_max_memory(),
            pool_instances: default_pool_instances(),
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            log_cap_bytes: DEFAULT_LOG_CAP_BYTES,
            default_timeout_ms: DEFAULT_TIMEOUT_MS,
            describe_timeout_ms: DEFAULT_DESCRIBE_TIMEOUT_MS,
        }
    }
}

/// What the operator grants one package (`[packages.<name>]`). Everything absent is
/// denied.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PackageGrant {
    /// Fuel budget per invocation (default [`DEFAULT_FUEL`]).
    #[serde(default)]
    pub fuel: Option<u64>,
    /// Linear memory limit per instance, MiB (default 256).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// Wall-clock limit per invocation, ms (default `[wasm] default_timeout_ms`).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub dirs: Vec<DirGrant>,
    /// Names of host environment variables the package may read.
    #[serde(default)]
    pub env: Vec<String>,
    /// Names of secrets the package may read with `get-secret`.
    #[serde(default)]
    pub secrets: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DirGrant {
    /// Directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it (e.g. `/data`).
    pub guest: String,
    #[serde(default)]
    pub mode: DirMode,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DirMode {
    #[default]
    Ro,
    Rw,
}

/// Where secret values come from (`[secrets]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsConfig {
    /// Secret `NAME` is read from the host env var `<env_prefix>NAME`.
    #[serde(default = "default_prefix")]
    pub env_prefix: String,
    /// Literal values (development only; they win over the environment).
    #[serde(default)]
    pub values: BTreeMap<String, String>,
}

fn default_prefix() -> String {
    "HEDDLE_SECRET_".into()
}

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            env_prefix: default_prefix(),
            values: BTreeMap::new(),
        }
    }
}

impl SecretsConfig {
    pub fn lookup(&self, name: &str) -> Option<String> {
        if let Some(v) = self.values.get(name) {
            return Some(v.clone());
        }
        std::env::var(format!("{}{name}", self.env_prefix)).ok()
    }
}

impl WasmConfig {
    /// Parses the WASM sections out of a whole `heddle.toml` text.
    pub fn from_toml_str(text: &str) -> Result<Self, PackageError> {
        toml::from_str(text).map_err(|e| PackageError::Config(e.to_string()))
    }

    /// The grant of `package`, or the empty (deny-everything) grant.
    pub fn grant(&self, package: &str) -> PackageGrant {
        self.packages.get(package).cloned().unwrap_or_default()
    }
}

/// The effective sandbox of one node: the package grant narrowed by the graph's
/// `NodeLimits`. Narrowing only ever removes authority.
#[derive(Clone, Debug, PartialEq)]
pub struct Sandbox {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub timeout_ms: Option<u64>,
    pub dirs: Vec<DirGrant>,
    pub env: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
}

impl Sandbox {
    pub fn new(grant: &PackageGrant, engine: &EngineSettings, limits: Option<&NodeLimits>) -> Self {
        let ceiling = engine.max_memory_mb.max(1);
        let memory_mb = grant.memory_mb.unwrap_or(DEFAULT_MEMORY_MB).min(ceiling);
        let mut s = Sandbox {
            fuel: grant.fuel.unwrap_or(DEFAULT_FUEL),
            memory_bytes: (memory_mb as usize) << 20,
            timeout_ms: grant.timeout_ms,
            dirs: grant.dirs.clone(),
            env: grant.env.iter().cloned().collect(),
            secrets: grant.secrets.iter().cloned().collect(),
        };
        let Some(l) = limits else { return s };
        if let Some(f) = l.fuel {
            s.fuel = s.fuel.min(f);
        }
        if let Some(t) = l.timeout_ms {
            s.timeout_ms = Some(s.timeout_ms.map_or(t, |g| g.min(t)));
        }
        match l.files {
            Some(AccessLevel::None) => s.dirs.clear(),
            Some(AccessLevel::Read) => {
                for d in &mut s.dirs {
                    d.mode = DirMode::Ro;
                }
            }
            Some(AccessLevel::Write) | None => {}
        }
        if let Some(env) = &l.env {
            let keep: BTreeSet<String> = env.iter().cloned().collect();
            s.env.retain(|e| keep.contains(e));
        }
        if let Some(sec) = &l.secrets {
            let keep: BTreeSet<String> = sec.iter().cloned().collect();
            s.secrets.retain(|e| keep.contains(e));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_limits_narrow_never_widen() {
        let grant = PackageGrant {
            fuel: Some(1000),
            dirs: vec![DirGrant {
                host: "/tmp".into(),
                guest: "/data".into(),
                mode: DirMode::Ro,
            }],
            env: vec!["A".into()],
            secrets: vec!["S".into()],
            ..Default::default()
        };
        let limits = NodeLimits {
            fuel: Some(5000),
            files: Some(AccessLevel::Write),
            env: Some(vec!["A".into(), "B".into()]),
            secrets: Some(vec!["T".into()]),
            timeout_ms: Some(10),
        };
        let s = Sandbox::new(&grant, &EngineSettings::default(), Some(&limits));
        assert_eq!(s.fuel, 1000, "fuel can only be lowered");
        assert_eq!(
            s.dirs[0].mode,
            DirMode::Ro,
            "write cannot widen a read-only grant"
        );
        assert_eq!(s.env.len(), 1);
        assert!(
            s.secrets.is_empty(),
            "narrowing to an ungranted secret grants nothing"
        );
        assert_eq!(s.timeout_ms, Some(10));
        let none = NodeLimits {
            files: Some(AccessLevel::None),
            ..Default::default()
        };
        assert!(
            Sandbox::new(&grant, &EngineSettings::default(), Some(&none))
                .dirs
                .is_empty()
        );
    }

    #[test]
    fn parses_operator_toml() {
        let c = WasmConfig::from_toml_str(
            r#"
            [run]
            node_timeout_ms = 5
            [wasm]
            pooling = false
            [packages.files]
            fuel = 100
            dirs = [{ host = "/srv/data", guest = "/data", mode = "rw" }]
            secrets = ["API_KEY"]
            [secrets.values]
            API_KEY = "k"
            "#,
        )
        .unwrap();
        assert!(!c.wasm.pooling);
        assert_eq!(c.grant("files").dirs[0].mode, DirMode::Rw);
        assert_eq!(c.grant("other"), PackageGrant::default());
        assert_eq!(c.secrets.lookup("API_KEY").as_deref(), Some("k"));
    }
}
