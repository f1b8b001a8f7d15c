//! Installing WASM packages: from a directory or an OCI registry, reviewed against the
//! operator's grants before they take effect; and fetching again, by the exact digests a
//! durable run recorded, the packages a resumed run needs that this machine lacks.
//!
//! Here rather than in a front end so that `heddle package add`, `heddle runs resume`,
//! a watchdog's worker and an embedder install the same way: one place reads
//! `[registry]` and `[trust]`, one place decides that an update asking for more
//! capabilities needs consent, one place checks that a refetched package is the bytes
//! the run recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use heddle_core::package::PackageSource;
use heddle_registry::{FetchOptions, PackageRef, RegistryError, RegistrySettings, Trust};
use heddle_store::PackagePin;
use heddle_wasm::{PackageError, WasmPackage};

use crate::Settings;
use crate::error::Error;
use crate::package_review::{Change, PackageInfo, review};

/// `Some` when `text` is a registry reference rather than a directory (an existing
/// directory always wins, so a local folder named like a reference stays a folder).
pub fn registry_reference(text: &str) -> Result<Option<PackageRef>, Error> {
    if Path::new(text).is_dir() {
        return Ok(None);
    }
    match heddle_registry::fetch::parse(text) {
        None => Ok(None),
        Some(r) => Ok(Some(r.map_err(Error::from)?)),
    }
}

impl Settings {
    /// `[registry]` of heddle.toml (defaults without one).
    pub fn registry(&self) -> Result<RegistrySettings, Error> {
        Ok(self
            .config
            .section::<RegistrySettings>("registry")?
            .unwrap_or_default())
    }

    /// `[trust]` of heddle.toml with its keys read (relative paths from the file's
    /// directory): which signers a fetched package must carry.
    pub fn trust(&self) -> Result<Trust, Error> {
        let section = self
            .config
            .section::<heddle_registry::TrustSettings>("trust")?
            .unwrap_or_default();
        Ok(Trust::load(&section, &self.config.base_dir())?)
    }

    /// What every fetch from a registry is held to: the config's size cap and trust.
    fn fetch_options(&self, allow_latest: bool) -> Result<FetchOptions, Error> {
        Ok(FetchOptions {
            allow_latest,
            max_component_bytes: self.wasm.wasm.max_component_bytes,
            trust: self.trust()?,
        })
    }
}

/// How [`add`] treats what it is given.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddOptions {
    /// Accept the tag `latest` (refused by default: the lockfile could not say what was
    /// reviewed).
    pub allow_latest: bool,
    /// Install an update that asks for capabilities the installed version did not.
    /// Without it such an update changes nothing and comes back as
    /// [`Added::NeedsConsent`].
    pub accept_new_capabilities: bool,
}

/// What [`add`] did.
#[derive(Debug)]
pub enum Added {
    /// Installed and pinned in the lockfile.
    Installed {
        /// The review of the installed package, with its source and what the update
        /// changed (`change`) when a version was installed before.
        info: Box<PackageInfo>,
        /// Where it is installed.
        dir: PathBuf,
        /// The lockfile that pins it.
        lockfile: PathBuf,
        /// Where it was fetched from, when it came from a registry.
        fetched: Option<PackageSource>,
    },
    /// An update asking for more capabilities than the installed version, refused for
    /// want of [`AddOptions::accept_new_capabilities`]; nothing was changed.
    NeedsConsent {
        /// The package's name.
        name: String,
        /// What the update would change.
        change: Box<Change>,
        /// Where it was fetched from, when it came from a registry.
        fetched: Option<PackageSource>,
    },
}

/// Installs the package at `source`: a directory, or a registry reference fetched
/// first (checked against `[trust]`). An update of an installed package is compared
/// with it before anything changes.
pub async fn add(settings: &Settings, source: &str, opts: AddOptions) -> Result<Added, Error> {
    let store = settings.package_store();
    let host = settings.wasm_host()?;
    // The package staged: the directory itself, or a fetch (kept until the end).
    let fetched = match registry_reference(source)? {
        None => None,
        Some(reference) => Some(
            heddle_registry::fetch(
                source,
                &reference,
                &settings.registry()?,
                &settings.fetch_options(opts.allow_latest)?,
                store.root(),
            )
            .await?,
        ),
    };
    let (dir, origin) = match &fetched {
        Some(f) => (f.dir.clone(), Some(f.source.clone())),
        None => (PathBuf::from(source), None),
    };
    // A fetched package that will not load is the registry's artifact at fault: said
    // with the reference it came from.
    let in_registry = |e: PackageError| -> Error {
        match &fetched {
            Some(_) => RegistryError::Package {
                reference: source.to_string(),
                source: Box::new(e),
            }
            .into(),
            None => e.into(),
        }
    };
    let candidate = WasmPackage::load_dir(&host, &dir)
        .await
        .map_err(in_registry)?;
    let previous = store
        .list()
        .ok()
        .and_then(|l| l.into_iter().find(|e| e.name == candidate.name()));
    let mut change = None;
    if let Some(old_entry) = previous {
        let old = store.load(&host, &old_entry.name).await.ok();
        let c = Change::between(old.as_ref(), &old_entry, &candidate, origin.as_ref());
        if !c.capabilities_added.is_empty() && !opts.accept_new_capabilities {
            return Ok(Added::NeedsConsent {
                name: candidate.name().to_string(),
                change: Box::new(c),
                fetched: origin,
            });
        }
        change = Some(c);
    }
    drop(candidate);
    let pkg = store
        .install_from(&host, &dir, origin.clone())
        .await
        .map_err(in_registry)?;
    drop(fetched);
    let entry = store.list()?.into_iter().find(|e| e.name == pkg.name());
    let installed = entry
        .as_ref()
        .map(|e| store.entry_dir(e))
        .unwrap_or_default();
    let mut info = review(settings, &pkg, &pkg.digest);
    info.source = entry.and_then(|e| e.source);
    info.change = change;
    Ok(Added::Installed {
        info: Box::new(info),
        dir: installed,
        lockfile: store.lockfile_path(),
        fetched: origin,
    })
}

/// Installs, from their registries, the packages a durable run recorded that this
/// machine's package store lacks: exactly the manifest digest recorded (whose layer
/// must be the recorded component), checked against `[trust]` as any add is. Returns
/// the names installed. Packages added from a directory are left to the refusal at
/// load, which says what to add.
pub async fn fetch_missing(
    settings: &Settings,
    run: &str,
    recorded: &BTreeMap<String, PackagePin>,
) -> Result<Vec<String>, Error> {
    let store = settings.package_store();
    let installed: BTreeSet<String> = if store.lockfile_path().is_file() {
        store.list()?.into_iter().map(|e| e.name).collect()
    } else {
        BTreeSet::new()
    };
    let missing: Vec<(&String, &PackageSource, &str)> = recorded
        .iter()
        .filter(|(name, _)| !installed.contains(*name))
        .filter_map(|(name, pin)| Some((name, pin.source.as_ref()?, pin.sha256.as_str())))
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let registry = settings.registry()?;
    let opts = settings.fetch_options(false)?;
    let host = settings.wasm_host()?;
    let mut fetched_names = Vec::new();
    for (name, source, sha256) in missing {
        tracing::info!(
            run_id = %run,
            "run {run} uses package {name}, not installed here: fetching {} (manifest {})",
            source.reference,
            source.manifest_digest
        );
        fetch_one(settings, run, name, source, sha256, &registry, &opts, &host)
            .await
            .map_err(|e| Error::RunPackage {
                run: run.to_string(),
                package: name.clone(),
                reference: source.reference.clone(),
                source: Box::new(e),
            })?;
        fetched_names.push(name.clone());
    }
    Ok(fetched_names)
}

/// Fetches package `name` of run `run` by the manifest digest it recorded, checks that
/// its component is the recorded `sha256`, and installs it.
#[allow(clippy::too_many_arguments)] // One package of fetch_missing's loop, its context.
async fn fetch_one(
    settings: &Settings,
    run: &str,
    name: &str,
    source: &PackageSource,
    sha256: &str,
    registry: &RegistrySettings,
    opts: &FetchOptions,
    host: &heddle_wasm::WasmHost,
) -> Result<(), Error> {
    let store = settings.package_store();
    let fetched = heddle_registry::fetch_pinned(source, registry, opts, store.root()).await?;
    let in_registry = |e: PackageError| RegistryError::Package {
        reference: source.reference.clone(),
        source: Box::new(e),
    };
    // Checked before it is installed: a package that is not the recorded bytes
    // would make the resumed run a different run.
    let digest = WasmPackage::load_dir(host, &fetched.dir)
        .await
        .map_err(in_registry)?
        .digest;
    if digest != sha256 {
        return Err(RegistryError::DigestMismatch {
            reference: source.reference.clone(),
            what: format!("component of package {name} that run {run} recorded"),
            expected: sha256.to_string(),
            actual: digest,
        }
        .into());
    }
    store
        .install_from(host, &fetched.dir, Some(fetched.source.clone()))
        .await
        .map_err(in_registry)?;
    Ok(())
}
