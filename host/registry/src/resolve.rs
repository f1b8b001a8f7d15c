//! From a typed reference to a repository to talk to: an `oci://` reference names it
//! directly; a wkg spec `namespace:name@version` is resolved exactly as `wkg` resolves
//! it (its `config.toml`: package overrides, namespace registries, the default
//! registry, the built-in `wasi` and `ba` fallbacks; then the registry's
//! `/.well-known/wasm-pkg/registry.json`, or metadata inlined in the config), so one
//! setup serves both tools. Credentials come from the same places, in wkg's order:
//! `WKG_REGISTRY_<REGISTRY>_AUTH_BEARER`, the config's `[registry."R".oci] auth`, then
//! what `docker login` keeps in docker's `config.json` (or its credential helper).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use wasm_pkg_common::config::{Config as WkgConfig, RegistryMapping};
use wasm_pkg_common::metadata::{REGISTRY_METADATA_PATH, RegistryMetadata};
use wasm_pkg_common::registry::Registry;

use crate::client::{Credentials, Endpoint};
use crate::error::RegistryError;
use crate::reference::{OciRef, PackageRef};

/// `[registry]` in heddle.toml.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrySettings {
    /// Registries (`host:port`) reached over plain HTTP: test and private registries
    /// only. Any other is reached over HTTPS, whatever wkg's config says.
    pub insecure: Vec<String>,
    /// Time one fetch or push may take in all, in milliseconds (1 to 3600000).
    pub timeout_ms: u64,
    /// wkg's configuration file (default `$XDG_CONFIG_HOME/wasm-pkg/config.toml`).
    pub wkg_config: Option<PathBuf>,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            insecure: Vec::new(),
            timeout_ms: 120_000,
            wkg_config: None,
        }
    }
}

impl RegistrySettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.clamp(1, 3_600_000))
    }

    fn is_insecure(&self, registry: &str) -> bool {
        self.insecure.iter().any(|r| r == registry)
    }
}

/// A resolved reference: where to fetch it and, for a wkg spec without a version,
/// that the newest version is wanted.
#[derive(Clone, Debug)]
pub struct Target {
    pub oci: OciRef,
    pub endpoint: Endpoint,
    /// No version was given (`--allow-latest`): take the highest semver tag.
    pub newest: bool,
}

/// wkg's `[registry."R".oci]` table.
#[derive(Default, Deserialize)]
struct OciBackend {
    auth: Option<Auth>,
    protocol: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Auth {
    Base64(String),
    UsernamePassword { username: String, password: String },
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciMetadata {
    registry: Option<String>,
    namespace_prefix: Option<String>,
}

async fn wkg_config(typed: &str, settings: &RegistrySettings) -> Result<WkgConfig, RegistryError> {
    let bad = |message: String| RegistryError::WkgConfig {
        reference: typed.to_string(),
        message,
    };
    match &settings.wkg_config {
        Some(path) => {
            let mut c = WkgConfig::default();
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            c.merge(
                WkgConfig::from_toml(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?,
            );
            Ok(c)
        }
        None => WkgConfig::global_defaults().await.map_err(|e| {
            bad(format!(
                "{}: {e}",
                WkgConfig::global_config_path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ))
        }),
    }
}

/// Resolves `r` (typed as `typed`).
pub async fn resolve(
    typed: &str,
    r: &PackageRef,
    settings: &RegistrySettings,
    allow_latest: bool,
) -> Result<Target, RegistryError> {
    let config = wkg_config(typed, settings).await?;
    match r {
        PackageRef::Oci(oci) => {
            if oci.is_latest() && !allow_latest {
                return Err(RegistryError::Latest {
                    reference: typed.to_string(),
                });
            }
            let backend = match oci.registry.parse::<Registry>() {
                Ok(reg) => backend(typed, &config, &reg)?,
                Err(_) => OciBackend::default(),
            };
            let endpoint = endpoint(typed, settings, &oci.registry, &oci.repository, &backend)?;
            Ok(Target {
                oci: oci.clone(),
                endpoint,
                newest: false,
            })
        }
        PackageRef::Wkg(spec) => {
            if spec.version.is_none() && !allow_latest {
                return Err(RegistryError::Latest {
                    reference: typed.to_string(),
                });
            }
            let package = &spec.package;
            let registry = config.resolve_registry(package).ok_or_else(|| {
                RegistryError::UnknownNamespace {
                    reference: typed.to_string(),
                    namespace: package.namespace().to_string(),
                    hint: format!(
                        "set default_registry or [namespace_registries] in {}, as for wkg",
                        settings
                            .wkg_config
                            .clone()
                            .or_else(WkgConfig::global_config_path)
                            .map(|p| p.display().to_string())
                            .unwrap_or_else(|| "wkg's config.toml".into())
                    ),
                }
            })?;
            let inline = config
                .package_registry_override(package)
                .or_else(|| config.namespace_registry(package.namespace()))
                .and_then(|m| match m {
                    RegistryMapping::Custom(c) => Some(c.metadata.clone()),
                    RegistryMapping::Registry(_) => None,
                });
            let metadata = match inline {
                Some(m) => m,
                None => fetch_metadata(typed, registry, settings).await?,
            };
            let oci_meta: OciMetadata = metadata
                .protocol_config("oci")
                .map_err(|e| RegistryError::WkgConfig {
                    reference: typed.to_string(),
                    message: format!("registry metadata of {registry}: {e}"),
                })?
                .unwrap_or_default();
            let oci_registry = oci_meta.registry.unwrap_or_else(|| registry.to_string());
            let repository = format!(
                "{}{}/{}",
                oci_meta.namespace_prefix.unwrap_or_default(),
                package.namespace(),
                package.name()
            );
            let backend = backend(typed, &config, registry)?;
            let endpoint = endpoint(typed, settings, &oci_registry, &repository, &backend)?;
            Ok(Target {
                oci: OciRef {
                    registry: oci_registry,
                    repository,
                    tag: spec.version.as_ref().map(|v| v.to_string()),
                    digest: None,
                },
                endpoint,
                newest: spec.version.is_none(),
            })
        }
    }
}

fn backend(
    typed: &str,
    config: &WkgConfig,
    registry: &Registry,
) -> Result<OciBackend, RegistryError> {
    match config.registry_config(registry) {
        Some(rc) => rc
            .backend_config::<OciBackend>("oci")
            .map(Option::unwrap_or_default)
            .map_err(|e| RegistryError::WkgConfig {
                reference: typed.to_string(),
                message: format!("[registry.\"{registry}\".oci]: {e}"),
            }),
        None => Ok(OciBackend::default()),
    }
}

fn endpoint(
    typed: &str,
    settings: &RegistrySettings,
    registry: &str,
    repository: &str,
    backend: &OciBackend,
) -> Result<Endpoint, RegistryError> {
    let insecure = settings.is_insecure(registry);
    if backend.protocol.as_deref() == Some("http") && !insecure {
        return Err(RegistryError::Insecure {
            reference: typed.to_string(),
            registry: registry.to_string(),
        });
    }
    Ok(Endpoint {
        registry: registry.to_string(),
        repository: repository.to_string(),
        insecure,
        credentials: credentials(typed, registry, backend)?,
        reference: typed.to_string(),
    })
}

fn credentials(
    typed: &str,
    registry: &str,
    backend: &OciBackend,
) -> Result<Credentials, RegistryError> {
    let sanitized: String = registry
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if let Ok(token) = std::env::var(format!("WKG_REGISTRY_{sanitized}_AUTH_BEARER"))
        && !token.is_empty()
    {
        return Ok(Credentials::Bearer(token));
    }
    match &backend.auth {
        None => docker_credentials(typed, registry),
        Some(Auth::UsernamePassword { username, password }) => Ok(Credentials::Basic {
            username: username.clone(),
            password: password.clone(),
        }),
        Some(Auth::Base64(b64)) => {
            use base64::Engine as _;
            let bad = || RegistryError::WkgConfig {
                reference: typed.to_string(),
                message: format!(
                    "[registry.\"{registry}\".oci] auth is not base64 of user:password"
                ),
            };
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim_end_matches('='))
                .or_else(|_| {
                    base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode(b64.trim_end_matches('='))
                })
                .map_err(|_| bad())?;
            let text = String::from_utf8(raw).map_err(|_| bad())?;
            let (u, p) = text.split_once(':').ok_or_else(bad)?;
            Ok(Credentials::Basic {
                username: u.into(),
                password: p.into(),
            })
        }
    }
}

/// What `docker login` (or a credential helper it names) keeps for `registry` in
/// docker's `config.json` (`$DOCKER_CONFIG`, else `~/.docker`): wkg's own fallback when
/// its config has no credentials, looked up by the registry's name and then by its
/// `https://` URL, as wkg does. None kept (or no docker config): anonymous.
fn docker_credentials(typed: &str, registry: &str) -> Result<Credentials, RegistryError> {
    use docker_credential::{CredentialRetrievalError as E, DockerCredential};
    for server in [registry.to_string(), format!("https://{registry}")] {
        match docker_credential::get_credential(&server) {
            Ok(DockerCredential::UsernamePassword(username, password)) => {
                return Ok(Credentials::Basic { username, password });
            }
            Ok(DockerCredential::IdentityToken(_)) => {
                return Err(RegistryError::DockerCredentials {
                    reference: typed.to_string(),
                    registry: registry.to_string(),
                    message: "docker's config.json holds an identity token for it, which heddle cannot exchange; log in with a username and password (or a token as the password), or set WKG_REGISTRY_<REGISTRY>_AUTH_BEARER".into(),
                });
            }
            // Nothing kept for this name: the next, or anonymous.
            Err(E::ConfigNotFound | E::ConfigReadError | E::NoCredentialConfigured) => {}
            Err(e) => {
                return Err(RegistryError::DockerCredentials {
                    reference: typed.to_string(),
                    registry: registry.to_string(),
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(Credentials::Anonymous)
}

/// `https://R/.well-known/wasm-pkg/registry.json` (plain HTTP for a registry listed
/// insecure); absent (404) means the defaults, as for wkg.
async fn fetch_metadata(
    typed: &str,
    registry: &Registry,
    settings: &RegistrySettings,
) -> Result<RegistryMetadata, RegistryError> {
    let name = registry.to_string();
    let scheme = if settings.is_insecure(&name) {
        "http"
    } else {
        "https"
    };
    let url = format!("{scheme}://{name}{REGISTRY_METADATA_PATH}");
    let unreachable = |message: String| RegistryError::Unreachable {
        reference: typed.to_string(),
        registry: name.clone(),
        message,
    };
    let client = reqwest::Client::builder()
        .connect_timeout(settings.timeout().min(Duration::from_secs(30)))
        .build()
        .map_err(|e| unreachable(e.to_string()))?;
    let get = async {
        let mut resp =
            client.get(&url).send().await.map_err(|e| {
                unreachable(format!("{url}: {}", heddle_core::text::error_chain(&e)))
            })?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(RegistryMetadata::default());
        }
        if !resp.status().is_success() {
            return Err(RegistryError::Protocol {
                reference: typed.to_string(),
                registry: name.clone(),
                what: REGISTRY_METADATA_PATH.into(),
                message: format!("{}", resp.status()),
            });
        }
        let mut body = Vec::new();
        while let Some(c) = resp.chunk().await.map_err(|e| unreachable(e.to_string()))? {
            body.extend_from_slice(&c);
            if body.len() > 1 << 20 {
                return Err(RegistryError::TooLarge {
                    reference: typed.to_string(),
                    what: format!("registry metadata {url}"),
                    limit: 1 << 20,
                    hint: "",
                });
            }
        }
        serde_json::from_slice(&body).map_err(|e| RegistryError::Protocol {
            reference: typed.to_string(),
            registry: name.clone(),
            what: REGISTRY_METADATA_PATH.into(),
            message: format!("not registry metadata: {e}"),
        })
    };
    tokio::time::timeout(settings.timeout(), get)
        .await
        .map_err(|_| RegistryError::Timeout {
            reference: typed.to_string(),
            registry: name.clone(),
            limit_ms: settings.timeout_ms,
        })?
}
