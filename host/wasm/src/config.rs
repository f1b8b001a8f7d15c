//! The operator's configuration of the WASM host: engine settings, per-package grants and
//! the secret source. Read from `heddle.toml` (sections `[wasm]`, `[packages.<name>]`,
//! `[secrets]`); see the crate README for the full schema. What a grant means is
//! [`crate::grants`]' business.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::PackageError;
use crate::grants::PackageGrant;

/// Inline value cap per port value (bigger data should travel by reference).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1 << 20;
/// Default `[wasm] max_component_bytes`: 256 MiB, ten times the largest interpreter
/// component measured (sdk/README.md).
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// What a value over [`EngineSettings::max_value_bytes`] tells the operator to do: the
/// limit is the operator's (it bounds what a guest hands the host in one value), so the
/// error says where it is set and what it is now, rather than leaving a run to fail or
/// wait on a decision with no way forward in sight.
pub(crate) fn value_limit_hint(max_value_bytes: usize) -> String {
    format!(
        "raise `max_value_bytes` in the `[wasm]` section of heddle.toml (now {max_value_bytes}, at most 1073741824) to let larger values through, or pass the data by reference (a file in a granted directory)"
    )
}

/// Guest log output kept per invocation (log import + stdout + stderr together).
pub const DEFAULT_LOG_CAP_BYTES: usize = 64 << 10;
/// Wall-clock limit of an invocation of a package without its own `timeout_ms`: fuel
/// bounds computing, this bounds waiting (a WASI sleep burns no fuel). Time spent
/// waiting for input or for downstream backpressure does not count.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Time `describe()` may take when a package is loaded or installed.
pub const DEFAULT_DESCRIBE_TIMEOUT_MS: u64 = 10_000;

/// Largest body of an outgoing HTTP request, and of its response (16 MiB): larger data
/// should be streamed (`http.stream`) or travel by reference.
pub const DEFAULT_MAX_HTTP_BODY_BYTES: u64 = 16 << 20;
/// Time an outgoing HTTP request may take, connection to last byte (never past the
/// invocation's own deadline).
pub const DEFAULT_HTTP_TIMEOUT_MS: u64 = 30_000;
/// Time resolving and connecting (TLS included) may take.
pub const DEFAULT_HTTP_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Requests one invocation may have in flight at once.
pub const DEFAULT_HTTP_MAX_CONCURRENT: usize = 16;

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
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    /// Where compiled components are cached; default `$XDG_CACHE_HOME/heddle/wasm`
    /// (or `~/.cache/heddle/wasm`).
    pub cache_dir: Option<PathBuf>,
    /// Use the pooling instance allocator (falls back to on-demand with a warning when
    /// the machine cannot reserve its address space).
    pub pooling: bool,
    /// Meter fuel. Turning it off removes per-invocation CPU budgets.
    pub fuel: bool,
    /// Largest linear memory any package may be granted, in MiB (pool slot size; 1 to
    /// 65536).
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 1, 65_536>")]
    pub max_memory_mb: u64,
    /// Concurrent instances the pool holds (1 to 65536: the pool reserves address
    /// space and counts tables and core instances as multiples of it).
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u32, 1, 65_536>")]
    pub pool_instances: u32,
    /// 1 byte to 1 GiB.
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, usize, 1, 1_073_741_824>")]
    pub max_value_bytes: usize,
    /// 0 to 1 GiB.
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, usize, 0, 1_073_741_824>")]
    pub log_cap_bytes: usize,
    /// Wall-clock limit per invocation for packages whose grant sets no `timeout_ms`
    /// (0 = none; at most 604800000, a week). See [`DEFAULT_TIMEOUT_MS`].
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 0, 604_800_000>")]
    pub default_timeout_ms: u64,
    /// The largest component a package may have, in bytes (1 to 4294967296): checked
    /// before a component is read at install, and against a registry layer's size
    /// before it is fetched. Python and JavaScript components are 12-20 MB.
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 1, 4_294_967_296>")]
    pub max_component_bytes: u64,
    /// Time `describe()` may take at load and install (1 to 604800000).
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 1, 604_800_000>")]
    pub describe_timeout_ms: u64,
    /// Largest body of an outgoing HTTP request and of its response, in bytes (0 to
    /// 4 GiB); past it the request fails (`HTTP-request-body-size`,
    /// `HTTP-response-body-size`).
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 0, 4_294_967_296>")]
    pub max_http_body_bytes: u64,
    /// Time one outgoing HTTP request may take, in ms, from resolving its host to the
    /// last byte of its response (1 to 604800000); the invocation's deadline ends it
    /// sooner.
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 1, 604_800_000>")]
    pub http_timeout_ms: u64,
    /// Time resolving, connecting and the TLS handshake may take, in ms (1 to
    /// 604800000).
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, u64, 1, 604_800_000>")]
    pub http_connect_timeout_ms: u64,
    /// Requests one invocation may have in flight at once (1 to 1024); one more is
    /// refused (`connection-limit-reached`).
    #[serde(deserialize_with = "heddle_core::ranged::int::<_, usize, 1, 1024>")]
    pub http_max_concurrent: usize,
    /// PEM files of certificate authorities trusted for HTTPS besides the system's
    /// roots (a private CA; tests' own).
    pub http_ca_files: Vec<PathBuf>,
}

/// The defaults of every `[wasm]` key (serde fills absent keys from here).
impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            cache_dir: None,
            pooling: true,
            fuel: true,
            max_memory_mb: 1024,
            pool_instances: 256,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            log_cap_bytes: DEFAULT_LOG_CAP_BYTES,
            default_timeout_ms: DEFAULT_TIMEOUT_MS,
            describe_timeout_ms: DEFAULT_DESCRIBE_TIMEOUT_MS,
            max_http_body_bytes: DEFAULT_MAX_HTTP_BODY_BYTES,
            http_timeout_ms: DEFAULT_HTTP_TIMEOUT_MS,
            http_connect_timeout_ms: DEFAULT_HTTP_CONNECT_TIMEOUT_MS,
            http_max_concurrent: DEFAULT_HTTP_MAX_CONCURRENT,
            http_ca_files: Vec::new(),
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
        }
    }
}

/// Where secret values come from (`[secrets]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsConfig {
    /// Secret `NAME` is read from the host env var `<env_prefix>NAME`.
    pub env_prefix: String,
    /// Literal values (development only; they win over the environment).
    pub values: BTreeMap<String, String>,
}

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            env_prefix: "HEDDLE_SECRET_".into(),
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
    /// Parses the WASM sections out of a whole `heddle.toml` text and checks what one
    /// key cannot check alone ([`WasmConfig::check`]), naming the line.
    pub fn from_toml_str(text: &str) -> Result<Self, PackageError> {
        let config: WasmConfig = toml::from_str(text).map_err(PackageError::Config)?;
        config.check(text)?;
        Ok(config)
    }

    /// What holds across keys of the grants: each `network_auth` destination lies inside
    /// the package's `network`, no two of them overlap (one request gets one injected
    /// header), and each names a secret that is set and fits in a header. `text` is the
    /// file the config was read from, to name the line.
    pub fn check(&self, text: &str) -> Result<(), PackageError> {
        for (package, grant) in &self.packages {
            let auths: Vec<_> = grant.network_auth.iter().collect();
            for (i, (dest, auth)) in auths.iter().enumerate() {
                let line = line_of(text, auth.secret.span().start);
                let bad = |message: String| PackageError::ConfigAt { line, message };
                let here = format!("[packages.{package}.network_auth] \"{dest}\"");
                if !grant.network.iter().any(|d| d.covers(dest)) {
                    return Err(bad(format!(
                        "{here}: the destination is not inside the package's `network` grant; add it there first"
                    )));
                }
                if let Some((other, _)) = auths[..i]
                    .iter()
                    .find(|(o, _)| o.covers(dest) || dest.covers(o))
                {
                    return Err(bad(format!(
                        "{here} overlaps \"{other}\": a request would match both; grant headers to destinations that do not overlap"
                    )));
                }
                let name = auth.secret.get_ref();
                let Some(value) = self.secrets.lookup(name) else {
                    return Err(bad(format!(
                        "{here}: the secret `{name}` is not set (neither in [secrets] values nor as the environment variable {}{name})",
                        self.secrets.env_prefix
                    )));
                };
                if http::HeaderValue::from_str(&auth.value(&value)).is_err() {
                    return Err(bad(format!(
                        "{here}: the value of secret `{name}` cannot be sent in a header (it holds a control character)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The grant of `package`, or the empty (deny-everything) grant.
    pub fn grant(&self, package: &str) -> PackageGrant {
        self.packages.get(package).cloned().unwrap_or_default()
    }

    /// The grant of the package `package` whose component has sha256 `digest`: refused
    /// when the grant is pinned to other bytes.
    pub fn grant_for(&self, package: &str, digest: &str) -> Result<PackageGrant, PackageError> {
        let grant = self.grant(package);
        match &grant.sha256 {
            Some(pinned) if !pinned.eq_ignore_ascii_case(digest) => {
                Err(PackageError::GrantPinMismatch {
                    package: package.into(),
                    pinned: pinned.clone(),
                    actual: digest.into(),
                })
            }
            _ => Ok(grant),
        }
    }
}

/// The 1-based line of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.get(..at).map_or(0, |t| t.matches('\n').count()) + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::DirMode;

    /// Settings that become pool sizes, byte sizes and deadlines are refused out of
    /// range when heddle.toml is read (the pool multiplied 1e9 instances and panicked).
    #[test]
    fn absurd_engine_and_grant_numbers_are_refused_when_read() {
        for (text, key) in [
            ("[wasm]\npool_instances = 1000000000\n", "pool_instances"),
            ("[wasm]\npool_instances = 0\n", "pool_instances"),
            (
                "[wasm]\nmax_memory_mb = 9007199254740991\n",
                "max_memory_mb",
            ),
            ("[packages.p]\nmemory_mb = 9007199254740991\n", "memory_mb"),
            (
                "[packages.p]\ntimeout_ms = 9223372036854775807\n",
                "timeout_ms",
            ),
        ] {
            // The key and range are in the TOML error the config error keeps as its source.
            let err = WasmConfig::from_toml_str(text).unwrap_err();
            let source = std::error::Error::source(&err).map(ToString::to_string);
            let e = format!("{err}: {}", source.unwrap_or_default());
            assert!(e.contains(key) && e.contains("from "), "{text}: {e}");
        }
        let ok = WasmConfig::from_toml_str("[wasm]\npool_instances = 65536\n").unwrap();
        assert_eq!(ok.wasm.pool_instances, 65_536);
        assert_eq!(
            ok.wasm.max_memory_mb,
            EngineSettings::default().max_memory_mb
        );
    }

    fn message(e: &PackageError) -> String {
        let source = std::error::Error::source(e).map(ToString::to_string);
        format!("{e}: {}", source.unwrap_or_default())
    }

    /// A bad network grant is refused when heddle.toml is read, naming the line.
    #[test]
    fn bad_network_grants_are_refused_naming_the_line() {
        let auth = |dest: &str, rest: &str| {
            format!(
                "[packages.p]\nnetwork = [\"https://a.com\"]\n[packages.p.network_auth]\n\"{dest}\" = {{ {rest} }}\n"
            )
        };
        for (text, line, needle) in [
            (
                "[packages.p]\nnetwork = [\"ftp://x.com\"]\n".to_string(),
                2,
                "scheme",
            ),
            (
                "[packages.p]\n\nnetwork = [\"https://api.*.example.com\"]\n".into(),
                3,
                "first label",
            ),
            (
                "[packages.p]\nnetwork = [\"https://a.com:70000\"]\n".into(),
                2,
                "out of range",
            ),
            (
                "[packages.p]\nnetwork = [\"a.com\"]\n".into(),
                2,
                "no scheme",
            ),
            (
                auth(
                    "https://a.com",
                    "header = \"Authorization\", secret = \"NET_TEST_UNSET\"",
                ),
                4,
                "secret `NET_TEST_UNSET` is not set",
            ),
            (
                auth("https://b.com", "header = \"x-key\", secret = \"K\""),
                4,
                "not inside the package's `network`",
            ),
            (
                auth("https://a.com", "header = \"Host\", secret = \"K\""),
                4,
                "sets this header itself",
            ),
            (
                auth(
                    "https://a.com",
                    "header = \"x-key\", secret = \"K\", format = \"Bearer\"",
                ),
                4,
                "exactly once",
            ),
            (
                auth("https://a.com:99999", "header = \"x-key\", secret = \"K\""),
                4,
                "out of range",
            ),
        ] {
            let e = WasmConfig::from_toml_str(&text).unwrap_err();
            let m = message(&e);
            assert!(
                m.contains(&format!("line {line}")) && m.contains(needle),
                "{text}\n=> {m}"
            );
        }
        let good = auth(
            "https://a.com",
            "header = \"x-key\", secret = \"K\", format = \"key={}\"",
        ) + "[secrets.values]\nK = \"v\"\n";
        let c = WasmConfig::from_toml_str(&good).unwrap();
        let (dest, a) = c.grant("p").network_auth.into_iter().next().unwrap();
        assert_eq!(dest.to_string(), "https://a.com");
        assert_eq!(
            (a.header.as_str(), a.value("v").as_str()),
            ("x-key", "key=v")
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
