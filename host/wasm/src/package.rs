//! A loaded package: manifest, verified bytes, compiled component, prepared instance and
//! the node declarations it described.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use heddle_core::{
    CapabilityKind, CapabilityRequest, NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl,
    PortType,
};
use sha2::{Digest, Sha256};
use wasmtime::component::types::ComponentItem;

use crate::bindings::{
    NodePackagePre, Pre, WitCapabilityKind, WitCorrelation, WitNodeDecl, WitPortDecl,
};
use crate::deadline::{Deadline, race};
use crate::engine::WasmHost;
use crate::error::{PackageError, chain};
use crate::grants::{DEFAULT_FUEL, NodeGrant};
use crate::host_state::State;
use crate::manifest::Manifest;
use crate::text;
use crate::value::from_wit;

/// The `heddle:node` interface name, without version.
pub const WIT_INTERFACE: &str = "heddle:node/node";
/// The WIT version this host implements.
pub const WIT_VERSION: &str = "0.1.0";
/// Human form of the supported range, for refusal messages.
pub const WIT_SUPPORTED: &str = "0.1.x, 0.2.x";

/// The manifest's free text is the package's own words, shown at `package add`.
fn escape_manifest_text(m: &mut Manifest) {
    m.version = text::line(&m.version, text::SHORT);
    m.description = text::line(&m.description, text::DESCRIPTION);
    // Targets are checked, not escaped: one that needed escaping is refused
    // (`manifest::check_target`).
    for c in &mut m.capabilities {
        c.reason = text::line(&c.reason, text::REASON);
    }
}

/// Type and port names are identifiers the operator types and reads: printable, no
/// spaces, bounded.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.trim().is_empty() {
        return Err("must not be empty");
    }
    if name.len() > text::SHORT {
        return Err("is too long (at most 256 bytes)");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || text::is_invisible_format(c))
    {
        return Err("must not contain spaces, control or invisible formatting characters");
    }
    Ok(())
}

/// Whether a package built against `version` can run on this host: same major and
/// minor line (0.x minors are breaking by semver convention).
pub fn wit_version_supported(version: &str) -> bool {
    let mut it = version.split('.');
    matches!((it.next(), it.next()), (Some("0"), Some("1" | "2")))
}

/// Whether a package built against `version` (one [`wit_version_supported`] accepts)
/// is bound with the 0.2 bindings.
fn is_v0_2(version: &str) -> bool {
    version.starts_with("0.2.")
}

/// What the executor needs per node type beyond the public declaration.
#[derive(Clone, Debug)]
pub(crate) struct TypeInfo {
    pub streaming_input: bool,
    pub streaming_output: bool,
    pub reuse_instance: bool,
    pub outputs: Arc<[(Arc<str>, PortType)]>,
}

pub struct WasmPackage {
    pub manifest: Manifest,
    pub dir: PathBuf,
    /// sha256 of the component bytes, hex.
    pub digest: String,
    pub(crate) host: WasmHost,
    pub(crate) pre: Pre,
    decls: Vec<Arc<NodeDecl>>,
    pub(crate) info: HashMap<String, TypeInfo>,
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl std::fmt::Debug for WasmPackage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPackage")
            .field("name", &self.manifest.name)
            .field("version", &self.manifest.version)
            .field("digest", &self.digest)
            .finish()
    }
}

impl WasmPackage {
    /// Loads the package in `dir` without a lockfile check (validation before install).
    pub async fn load_dir(host: &WasmHost, dir: &Path) -> Result<WasmPackage, PackageError> {
        Self::load_checked(host, dir, |_, _| Ok(())).await
    }

    /// Loads the package in `dir`; `check(component_path, digest)` may refuse the bytes
    /// (the lockfile pin) before anything is compiled.
    pub(crate) async fn load_checked(
        host: &WasmHost,
        dir: &Path,
        check: impl FnOnce(&Path, &str) -> Result<(), PackageError>,
    ) -> Result<WasmPackage, PackageError> {
        let manifest = Manifest::read(dir)?;
        let path = manifest.component_path(dir);
        if !path.is_file() {
            return Err(PackageError::MissingComponent { path });
        }
        let limit = host.settings().max_component_bytes;
        let size = std::fs::metadata(&path)
            .map_err(|e| PackageError::io(&path, e))?
            .len();
        if size > limit {
            return Err(PackageError::ComponentTooLarge { path, size, limit });
        }
        let bytes = std::fs::read(&path).map_err(|e| PackageError::io(&path, e))?;
        let digest = sha256_hex(&bytes);
        check(&path, &digest)?;
        Self::load_bytes(host, manifest, dir.to_path_buf(), &bytes, digest, path).await
    }

    /// Loads a package embedded in the host; errors name it as `(built in)/<name>/…`.
    pub(crate) async fn load_embedded(
        host: &WasmHost,
        name: &str,
        manifest: &str,
        component: &[u8],
    ) -> Result<WasmPackage, PackageError> {
        let dir = PathBuf::from(format!("(built in)/{name}"));
        let manifest = Manifest::parse(manifest, &dir.join(crate::manifest::MANIFEST_FILE))?;
        let path = manifest.component_path(&dir);
        Self::load_bytes(host, manifest, dir, component, sha256_hex(component), path).await
    }

    /// Compiles (or reads from the cache) verified component bytes, checks the WIT
    /// version and link, and describes the node types. `path` names the component in
    /// errors.
    async fn load_bytes(
        host: &WasmHost,
        mut manifest: Manifest,
        dir: PathBuf,
        bytes: &[u8],
        digest: String,
        path: PathBuf,
    ) -> Result<WasmPackage, PackageError> {
        escape_manifest_text(&mut manifest);
        if !host.is_cached(&digest) {
            host.notify_compile(&manifest.name);
        }
        let component = host.compile(bytes, &digest, &path)?;

        // Version negotiation from the export name, before any type matching, so a
        // package of another WIT line gets a message about versions, not about types.
        let ty = component.component_type();
        let mut found = None;
        let mut names = Vec::new();
        for (name, item) in ty.exports(host.engine()) {
            names.push(name.to_string());
            if let Some(v) = name
                .strip_prefix(WIT_INTERFACE)
                .and_then(|r| r.strip_prefix('@'))
                && matches!(item.ty, ComponentItem::ComponentInstance(_))
            {
                found = Some(v.to_string());
            }
        }
        let Some(version) = found else {
            return Err(PackageError::WitMismatch {
                path,
                message: format!(
                    "it does not export `{WIT_INTERFACE}@{WIT_VERSION}` (exports: {})",
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(", ")
                    }
                ),
            });
        };
        if !wit_version_supported(&version) {
            return Err(PackageError::UnsupportedVersion {
                path,
                found: version,
                supported: WIT_SUPPORTED.into(),
            });
        }
        let link = |e: wasmtime::Error| PackageError::WitLink {
            path: path.clone(),
            source: e.into(),
        };
        let pre = host
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(link)?;
        let pre = if is_v0_2(&version) {
            Pre::V0_2(crate::bindings::v0_2::NodePackagePre::new(pre).map_err(link)?)
        } else {
            Pre::V0_1(NodePackagePre::new(pre).map_err(link)?)
        };

        let mut pkg = WasmPackage {
            manifest,
            dir,
            digest,
            host: host.clone(),
            pre,
            decls: Vec::new(),
            info: HashMap::new(),
        };
        let (raw, controlled) = pkg.describe(&path).await?;
        pkg.set_decls(raw, &controlled, &path)?;
        pkg.manifest
            .check_concurrency(&pkg.dir.join(crate::manifest::MANIFEST_FILE), |t| {
                pkg.info.contains_key(t)
            })?;
        Ok(pkg)
    }

    /// The declarations, and the type names a 0.2 package declares controlled.
    async fn describe(&self, path: &Path) -> Result<(Vec<WitNodeDecl>, Vec<String>), PackageError> {
        let fail = |message: String| PackageError::Describe {
            path: path.to_path_buf(),
            message,
        };
        let mut store = self.fresh_store().map_err(|e| fail(chain(&e)))?;
        let limit = self.host.settings().describe_timeout_ms;
        let deadline = Deadline::new(Some(Instant::now() + Duration::from_millis(limit)), None);
        store.data_mut().describe_deadline = Some(deadline.clone());
        let call = async {
            let inst = self
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| ("instantiation failed: ", e))?;
            let decls = inst.call_describe(&mut store).await.map_err(|e| ("", e))?;
            let controlled = inst
                .call_controlled(&mut store)
                .await
                .map_err(|e| ("controlled(): ", e))?;
            Ok((decls, controlled))
        };
        // Raced, so a describe() waiting in WASI cannot hang `package add` or a load.
        let outcome = race(call, &deadline, None).await;
        let stopped = || {
            fail(format!(
                "did not finish within {limit} ms ([wasm] describe_timeout_ms); the guest was stopped"
            ))
        };
        match outcome {
            Err(_) => Err(stopped()),
            Ok(_) if store.data().interrupt.is_some() => Err(stopped()),
            Ok(Ok(decls)) => Ok(decls),
            Ok(Err((what, e))) => {
                let tail = store
                    .data()
                    .log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .stderr_tail();
                let max = crate::engine::hostcall_limit(self.host.settings());
                Err(fail(format!(
                    "{what}{}",
                    crate::failure::classify(&e).message(max, &tail)
                )))
            }
        }
    }

    /// A store with nothing granted and the default fuel budget.
    fn fresh_store(&self) -> Result<wasmtime::Store<State>, PackageError> {
        let mut store = self
            .host
            .new_store(&NodeGrant::nothing(self.host.settings().max_memory_mb))?;
        if self.host.settings().fuel {
            store
                .set_fuel(DEFAULT_FUEL)
                .map_err(|e| PackageError::engine("setting fuel", e))?;
        }
        Ok(store)
    }

    fn set_decls(
        &mut self,
        raw: Vec<WitNodeDecl>,
        controlled: &[String],
        path: &Path,
    ) -> Result<(), PackageError> {
        if let Some(unknown) = controlled
            .iter()
            .find(|c| !raw.iter().any(|d| &d.type_name == *c))
        {
            return Err(PackageError::BadDecl {
                path: path.to_path_buf(),
                type_name: text::line(unknown, text::SHORT),
                message: "is listed by controlled() but not described".into(),
            });
        }
        let origin = heddle_core::Origin::Package {
            name: self.manifest.name.clone(),
            version: self.manifest.version.clone(),
        };
        for d in raw {
            let bad = |message: String| PackageError::BadDecl {
                path: path.to_path_buf(),
                type_name: d.type_name.clone(),
                message,
            };
            if let Err(why) = check_name(&d.type_name) {
                return Err(PackageError::BadDecl {
                    path: path.to_path_buf(),
                    type_name: text::line(&d.type_name, text::SHORT),
                    message: format!("type name {why}"),
                });
            }
            if self.info.contains_key(&d.type_name) {
                return Err(bad("declared twice".into()));
            }
            if d.streaming_input && d.streaming_output {
                return Err(bad(
                    "a node is either streaming-input or streaming-output".into()
                ));
            }
            let ports = |ps: &[WitPortDecl], what: &str| -> Result<Vec<PortDecl>, PackageError> {
                ps.iter()
                    .map(|p| {
                        check_name(&p.name).map_err(|why| bad(format!("{what} name {why}")))?;
                        let ty: PortType = p
                            .type_
                            .parse()
                            .map_err(|e| bad(format!("{what} `{}`: {e}", p.name)))?;
                        let default =
                            match &p.default {
                                Some(v) => Some(from_wit(v.clone()).map_err(|e| {
                                    bad(format!("{what} `{}` default: {e}", p.name))
                                })?),
                                None => None,
                            };
                        Ok(PortDecl {
                            name: p.name.clone(),
                            ty,
                            required: p.required,
                            default,
                            description: text::line(&p.description, text::REASON),
                        })
                    })
                    .collect()
            };
            let inputs = ports(&d.inputs, "input")?;
            let properties = ports(&d.properties, "property")?;
            let mut outputs = Vec::new();
            for o in &d.outputs {
                check_name(&o.name).map_err(|why| bad(format!("output name {why}")))?;
                let ty: PortType = o
                    .type_
                    .parse()
                    .map_err(|e| bad(format!("output `{}`: {e}", o.name)))?;
                let correlation = match o.correlation {
                    WitCorrelation::Single => OutputCorrelation::Single,
                    WitCorrelation::Iteration => OutputCorrelation::Iteration { group: None },
                    WitCorrelation::Chunk => OutputCorrelation::Chunk,
                    WitCorrelation::Aggregate => OutputCorrelation::Aggregate,
                };
                outputs.push(OutputDecl {
                    name: o.name.clone(),
                    ty,
                    correlation,
                    description: text::line(&o.description, text::REASON),
                });
            }
            let capabilities = d
                .capabilities
                .iter()
                .map(|c| {
                    crate::manifest::check_target(&c.target).map_err(bad)?;
                    Ok(CapabilityRequest {
                        kind: match c.kind {
                            WitCapabilityKind::FilesRead => CapabilityKind::FilesRead,
                            WitCapabilityKind::FilesWrite => CapabilityKind::FilesWrite,
                            WitCapabilityKind::Env => CapabilityKind::Env,
                            WitCapabilityKind::Secret => CapabilityKind::Secret,
                            WitCapabilityKind::Network => CapabilityKind::Network,
                        },
                        target: c.target.clone(),
                        reason: text::line(&c.reason, text::REASON),
                    })
                })
                .collect::<Result<Vec<_>, PackageError>>()?;
            let is_controlled = controlled.contains(&d.type_name);
            if is_controlled && (d.streaming_input || d.streaming_output) {
                return Err(bad(
                    "a controlled node runs once per control event and cannot also stream".into(),
                ));
            }
            let mode = if d.streaming_input {
                NodeMode::StreamingInput
            } else if d.streaming_output {
                NodeMode::StreamingOutput
            } else if is_controlled {
                NodeMode::Controlled
            } else {
                NodeMode::Buffered
            };
            let info = TypeInfo {
                streaming_input: d.streaming_input,
                streaming_output: d.streaming_output,
                reuse_instance: d.reuse_instance,
                outputs: outputs
                    .iter()
                    .map(|o| (Arc::from(o.name.as_str()), o.ty.clone()))
                    .collect(),
            };
            self.info.insert(d.type_name.clone(), info);
            let concurrency = self
                .manifest
                .concurrency
                .get(&d.type_name)
                .copied()
                .unwrap_or(1);
            self.decls.push(Arc::new(NodeDecl {
                type_name: d.type_name,
                title: text::line(&d.title, text::SHORT),
                description: text::block(&d.description, text::DESCRIPTION),
                inputs,
                outputs,
                properties,
                retry_safe: d.retry_safe,
                mode,
                concurrency,
                is_join: false,
                capabilities,
                origin: origin.clone(),
                ..Default::default()
            }));
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    /// Creates a store with default limits and instantiates the component, then drops
    /// both: the per-invocation cost paid before any node code runs. For benchmarks.
    #[doc(hidden)]
    pub async fn instantiate_only(&self) -> Result<(), PackageError> {
        let mut store = self.fresh_store()?;
        self.pre
            .instantiate_async(&mut store)
            .await
            .map(drop)
            .map_err(|e| PackageError::engine("instantiating", e))
    }

    /// The names of the component's exports and imports (`heddle:node/node@0.1.0`,
    /// `wasi:io/streams@0.2.6`, …): the world a registry artifact's config records.
    pub fn world(&self) -> (Vec<String>, Vec<String>) {
        let ty = self.pre.instance_pre().component().component_type();
        let engine = self.host.engine();
        let exports = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
        let imports = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
        (exports, imports)
    }

    pub fn declarations(&self) -> &[Arc<NodeDecl>] {
        &self.decls
    }

    /// Capabilities requested by the manifest and by the declarations, for display at
    /// install time (what to grant and why).
    pub fn requested_capabilities(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for c in &self.manifest.capabilities {
            out.entry(format!("{:?} {}", c.kind, c.target))
                .or_default()
                .push(c.reason.clone());
        }
        for d in &self.decls {
            for c in &d.capabilities {
                out.entry(format!("{:?} {}", c.kind, c.target))
                    .or_default()
                    .push(format!("{}: {}", d.type_name, c.reason));
            }
        }
        out
    }
}
