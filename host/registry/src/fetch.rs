//! Fetching a package from a registry into a staging directory (checked layout,
//! verified digests) for the package store to install, and pushing one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use heddle_wasm::{MANIFEST_FILE, Manifest, PackageSource, WasmPackage};

use crate::artifact::{self, ANNOTATION_DESCRIPTION, ANNOTATION_SOURCE, ANNOTATION_VERSION};
use crate::client::{Client, MAX_DOCUMENT_BYTES, OCI_MANIFEST};
use crate::error::RegistryError;
use crate::reference::PackageRef;
use crate::resolve::{RegistrySettings, Target, resolve};

/// How a fetch may go.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Take `:latest` (or, for a wkg spec without a version, the newest version).
    pub allow_latest: bool,
    /// The largest component taken (`[wasm] max_component_bytes`).
    pub max_component_bytes: u64,
    /// The publishers' keys signatures are checked against (`[trust]`).
    pub trust: crate::sign::Trust,
}

/// A fetched package, staged in a directory of its own (removed when this is dropped).
pub struct Fetched {
    /// The package directory: manifest and component, as `PackageStore::install` takes it.
    pub dir: PathBuf,
    /// What the lockfile pins about where it came from.
    pub source: PackageSource,
    /// The manifest's annotations (version, description, source).
    pub annotations: BTreeMap<String, String>,
    /// Whether the package manifest came with the artifact (pushed by Heddle) or was
    /// made from its annotations (pushed by another tool).
    pub had_manifest: bool,
    _staging: tempfile::TempDir,
}

/// Parses `typed` as a registry reference; `None` when it is not one (a directory).
pub fn parse(typed: &str) -> Option<Result<PackageRef, RegistryError>> {
    PackageRef::parse(typed)
}

/// Fetches the package `typed` names into a staging directory under `staging_root`
/// (the package store's root: same file system, so the install's copy stays local).
pub async fn fetch(
    typed: &str,
    reference: &PackageRef,
    settings: &RegistrySettings,
    opts: &FetchOptions,
    staging_root: &Path,
) -> Result<Fetched, RegistryError> {
    let mut target = resolve(typed, reference, settings, opts.allow_latest).await?;
    fetch_target(typed, &mut target, settings, opts, staging_root).await
}

/// Fetches exactly the manifest `manifest_digest` of the repository a lockfile entry
/// names (what a durable run recorded), whatever its tags say now.
pub async fn fetch_pinned(
    source: &PackageSource,
    settings: &RegistrySettings,
    opts: &FetchOptions,
    staging_root: &Path,
) -> Result<Fetched, RegistryError> {
    let typed = format!(
        "{}{}/{}@{}",
        crate::reference::OCI_SCHEME,
        source.registry,
        source.repository,
        source.manifest_digest
    );
    let reference = PackageRef::parse(&typed).unwrap_or_else(|| {
        Err(RegistryError::BadReference {
            text: typed.clone(),
            message: "not an oci:// reference".into(),
        })
    })?;
    let mut fetched = fetch(&typed, &reference, settings, opts, staging_root).await?;
    // The lockfile keeps naming the reference as first typed.
    fetched.source.reference = source.reference.clone();
    if fetched.source.layer_digest != source.layer_digest {
        return Err(RegistryError::DigestMismatch {
            reference: typed,
            what: "component layer".into(),
            expected: source.layer_digest.clone(),
            actual: fetched.source.layer_digest.clone(),
        });
    }
    Ok(fetched)
}

async fn fetch_target(
    typed: &str,
    target: &mut Target,
    settings: &RegistrySettings,
    opts: &FetchOptions,
    staging_root: &Path,
) -> Result<Fetched, RegistryError> {
    let client = Client::new(target.endpoint.clone(), settings.timeout(), false)?;
    if target.newest {
        let tags = client.tags().await?;
        let newest = tags
            .iter()
            .filter_map(|t| semver::Version::parse(t).ok())
            .filter(|v| v.pre.is_empty())
            .max()
            .ok_or_else(|| RegistryError::NotFound {
                reference: typed.to_string(),
                registry: target.oci.registry.clone(),
                what: format!("no version tag among {} tags", tags.len()),
            })?;
        target.oci.tag = Some(newest.to_string());
    }
    let oci = &target.oci;
    let (manifest_bytes, manifest_digest) = client.manifest(oci.manifest_reference()).await?;
    if let Some(pinned) = &oci.digest
        && pinned != &manifest_digest
    {
        return Err(RegistryError::DigestMismatch {
            reference: typed.to_string(),
            what: "manifest".into(),
            expected: pinned.clone(),
            actual: manifest_digest,
        });
    }
    let checked = artifact::check_manifest(typed, &manifest_bytes, opts.max_component_bytes)?;
    // Who signed it is settled before its bytes are fetched.
    let signer = crate::sign::verify(&client, &manifest_digest, &opts.trust).await?;
    let config_bytes = client
        .blob(
            "config",
            &checked.manifest.config.digest,
            MAX_DOCUMENT_BYTES,
        )
        .await?;
    let config = artifact::check_config(typed, &config_bytes, &checked.layer)?;
    let annotations = checked.manifest.annotations.clone().unwrap_or_default();

    std::fs::create_dir_all(staging_root).map_err(|e| RegistryError::io(staging_root, e))?;
    let staging = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(staging_root)
        .map_err(|e| RegistryError::io(staging_root, e))?;
    let dir = staging.path().join("package");
    std::fs::create_dir(&dir).map_err(|e| RegistryError::io(&dir, e))?;
    let layer_file = staging.path().join("layer.wasm");
    client
        .blob_to_file(
            "component layer",
            &checked.layer.digest,
            checked.layer.size,
            &layer_file,
        )
        .await?;

    let had_manifest = config.heddle_package.is_some();
    let manifest_text = match config.heddle_package {
        Some(t) => t,
        None => synthesized_manifest(oci, &annotations),
    };
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest = Manifest::parse(&manifest_text, &manifest_path).map_err(|source| {
        RegistryError::Package {
            reference: typed.to_string(),
            source: Box::new(source),
        }
    })?;
    std::fs::write(&manifest_path, manifest_text.as_bytes())
        .map_err(|e| RegistryError::io(&manifest_path, e))?;
    stage_graphs(typed, &manifest, config.heddle_graphs, &dir)?;
    let component = manifest.component_path(&dir);
    if let Some(parent) = component.parent() {
        std::fs::create_dir_all(parent).map_err(|e| RegistryError::io(parent, e))?;
    }
    std::fs::rename(&layer_file, &component).map_err(|e| RegistryError::io(&component, e))?;

    Ok(Fetched {
        dir,
        source: PackageSource {
            reference: typed.to_string(),
            registry: oci.registry.clone(),
            repository: oci.repository.clone(),
            manifest_digest,
            layer_digest: checked.layer.digest.clone(),
            signer,
        },
        annotations,
        had_manifest,
        _staging: staging,
    })
}

/// Writes the graph documents the config carries into the staged package `dir`: exactly
/// those the manifest lists, each at its path (the manifest's check keeps it inside the
/// package). One listed but not carried, or carried but not listed, refuses the artifact;
/// the install that follows parses each as a graph.
fn stage_graphs(
    typed: &str,
    manifest: &Manifest,
    mut carried: BTreeMap<String, String>,
    dir: &Path,
) -> Result<(), RegistryError> {
    let incomplete = |message: String| RegistryError::NotWasm {
        reference: typed.to_string(),
        message,
    };
    for g in &manifest.graphs {
        let Some(text) = carried.remove(g) else {
            return Err(incomplete(format!(
                "its manifest lists the graph `{g}`, which the artifact does not carry (config `heddleGraphs`); push it again with a Heddle that carries graphs"
            )));
        };
        let path = dir.join(g);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| RegistryError::io(parent, e))?;
        }
        std::fs::write(&path, text.as_bytes()).map_err(|e| RegistryError::io(&path, e))?;
    }
    if let Some(extra) = carried.keys().next() {
        return Err(incomplete(format!(
            "it carries the graph `{extra}`, which its manifest does not list"
        )));
    }
    Ok(())
}

/// The manifest of a component pushed by another tool (wkg): named after the
/// repository's last component, versioned by its annotation or tag, no capability
/// requests of its own (its node types still declare theirs).
fn synthesized_manifest(
    oci: &crate::reference::OciRef,
    annotations: &BTreeMap<String, String>,
) -> String {
    let last = oci.repository.rsplit('/').next().unwrap_or(&oci.repository);
    let name: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let version = annotations
        .get(ANNOTATION_VERSION)
        .cloned()
        .or_else(|| oci.tag.clone())
        .unwrap_or_else(|| "unversioned".into());
    let mut doc = toml::Table::new();
    doc.insert("name".into(), name.clone().into());
    doc.insert("version".into(), version.into());
    if let Some(d) = annotations.get(ANNOTATION_DESCRIPTION) {
        doc.insert("description".into(), d.clone().into());
    }
    doc.insert("component".into(), format!("{name}.wasm").into());
    // Invariant: a table of strings serializes.
    toml::to_string(&doc).expect("manifest serializes")
}

/// What a push wrote.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// `oci://REGISTRY/REPOSITORY:TAG`.
    pub location: String,
    pub manifest_digest: String,
    pub layer_digest: String,
}

/// Pushes the package in `dir` (already loaded and checked as `pkg`) to `typed`.
pub async fn push(
    pkg: &WasmPackage,
    dir: &Path,
    typed: &str,
    reference: &PackageRef,
    settings: &RegistrySettings,
    allow_latest: bool,
    key: Option<&crate::sign::SigningKey>,
) -> Result<Pushed, RegistryError> {
    let target = resolve(typed, reference, settings, allow_latest).await?;
    let Some(tag) = target.oci.tag.clone() else {
        return Err(RegistryError::BadReference {
            text: typed.to_string(),
            message: "a push needs a tag (oci://REGISTRY/NAMESPACE/NAME:VERSION)".into(),
        });
    };
    if target.oci.digest.is_some() {
        return Err(RegistryError::BadReference {
            text: typed.to_string(),
            message: "a push names a tag, not a digest (the digest is what the push makes)".into(),
        });
    }
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest_text = std::fs::read_to_string(&manifest_path)
        .map_err(|e| RegistryError::io(&manifest_path, e))?;
    let component_path = pkg.manifest.component_path(dir);
    let component =
        std::fs::read(&component_path).map_err(|e| RegistryError::io(&component_path, e))?;
    let (exports, imports) = pkg.world();
    let m = &pkg.manifest;
    // The graphs the package provides travel with it, checked as `install` checks them.
    let graphs = m
        .read_graphs(dir)
        .map_err(|source| RegistryError::Package {
            reference: typed.to_string(),
            source: Box::new(source),
        })?
        .into_iter()
        .map(|(path, bytes)| {
            // Invariant: `read_graphs` refuses a document that is not UTF-8.
            (path, String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect();
    let mut annotations = BTreeMap::from([(ANNOTATION_VERSION.to_string(), m.version.clone())]);
    if !m.description.is_empty() {
        annotations.insert(ANNOTATION_DESCRIPTION.into(), m.description.clone());
    }
    if !m.source.is_empty() {
        annotations.insert(ANNOTATION_SOURCE.into(), m.source.clone());
    }
    let title = component_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("{}.wasm", m.name));
    let (config, manifest) = artifact::build(
        &component,
        artifact::ComponentWorld {
            exports,
            imports,
            target: None,
        },
        &manifest_text,
        graphs,
        &title,
        annotations,
        artifact::created_now(),
    );
    if config.len() as u64 > MAX_DOCUMENT_BYTES {
        // A puller reads no larger config: refused here, before anything is pushed.
        return Err(RegistryError::TooLarge {
            reference: typed.to_string(),
            what: format!(
                "config ({} bytes: the package manifest and its graph documents)",
                config.len()
            ),
            limit: MAX_DOCUMENT_BYTES,
            hint: "; a package's graphs travel in its config, which a registry client reads whole",
        });
    }
    let layer_digest = crate::client::sha256_digest(&component);
    let config_digest = crate::client::sha256_digest(&config);
    let client = Client::new(target.endpoint.clone(), settings.timeout(), true)?;
    client
        .push_blob("the component layer", &layer_digest, component.into())
        .await?;
    client
        .push_blob("the config", &config_digest, config.into())
        .await?;
    let manifest_digest = client.push_manifest(&tag, OCI_MANIFEST, manifest).await?;
    if let Some(key) = key {
        crate::sign::push_signature(&client, &manifest_digest, key).await?;
    }
    Ok(Pushed {
        location: target.oci.to_string(),
        manifest_digest,
        layer_digest,
    })
}

/// Signs the package `typed` names, as it is in the registry now: its manifest is
/// fetched and checked to be a Wasm artifact, and its digest signed.
pub async fn sign(
    typed: &str,
    reference: &PackageRef,
    settings: &RegistrySettings,
    allow_latest: bool,
    key: &crate::sign::SigningKey,
) -> Result<Pushed, RegistryError> {
    let target = resolve(typed, reference, settings, allow_latest).await?;
    let client = Client::new(target.endpoint.clone(), settings.timeout(), true)?;
    let (bytes, manifest_digest) = client.manifest(target.oci.manifest_reference()).await?;
    if let Some(pinned) = &target.oci.digest
        && pinned != &manifest_digest
    {
        return Err(RegistryError::DigestMismatch {
            reference: typed.to_string(),
            what: "manifest".into(),
            expected: pinned.clone(),
            actual: manifest_digest,
        });
    }
    let checked = artifact::check_manifest(typed, &bytes, u64::MAX)?;
    crate::sign::push_signature(&client, &manifest_digest, key).await?;
    Ok(Pushed {
        location: target.oci.to_string(),
        manifest_digest,
        layer_digest: checked.layer.digest,
    })
}
