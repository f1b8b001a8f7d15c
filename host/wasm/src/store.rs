//! Installed packages and the lockfile that pins their bytes.
//!
//! Layout of a store directory:
//! ```text
//! <root>/heddle.lock                 pins (name, version, sha256 of component and manifest,
//!                                    node types, directory)
//! <root>/packages/<name>-<id>/       a copy of one installed package directory
//! <root>/.write-lock                 held by a writer for its whole read-modify-write
//! ```
//! A package is validated completely (manifest, component, WIT version, declarations,
//! no reserved name, no node type that already exists) before anything is copied, and
//! loading re-hashes the bytes against the lockfile. Every install gets a directory of
//! its own, written and synced before the lockfile switches to it: a run that starts
//! during a re-install loads the old package or the new one, never neither.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::engine::WasmHost;
use crate::error::PackageError;
use crate::first_party::FIRST_PARTY;
use crate::lockfile::{self, LOCKFILE, LockEntry, Lockfile};
use crate::manifest::{MANIFEST_FILE, Manifest, valid_package_name};
use crate::package::{WasmPackage, sha256_hex};

/// An outcome of [`PackageStore::verify`] for one package.
#[derive(Debug)]
pub struct VerifyReport {
    pub name: String,
    pub result: Result<(), PackageError>,
}

pub struct PackageStore {
    root: PathBuf,
}

/// How often a load follows a lockfile that moved on while it read (a re-install that
/// removed the directory it had just been told about).
const LOAD_ATTEMPTS: usize = 5;

impl PackageStore {
    pub fn open(root: impl Into<PathBuf>) -> Self {
        PackageStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn lockfile_path(&self) -> PathBuf {
        self.root.join(LOCKFILE)
    }

    fn packages_root(&self) -> PathBuf {
        self.root.join("packages")
    }

    /// The directory holding the installed package of `entry` (inside the store: the
    /// entry's directory name was checked when the lockfile was read).
    pub fn entry_dir(&self, entry: &LockEntry) -> PathBuf {
        self.packages_root().join(entry.dir_name())
    }

    pub fn read_lock(&self) -> Result<Lockfile, PackageError> {
        lockfile::read(&self.lockfile_path())
    }

    /// Validates the package in `src` completely, copies it into the store and pins its
    /// digests. Reinstalling a name replaces the previous version atomically.
    pub async fn install(&self, host: &WasmHost, src: &Path) -> Result<WasmPackage, PackageError> {
        self.install_from(host, src, None).await
    }

    /// [`PackageStore::install`] of a package fetched from a registry: the lock entry
    /// also pins `source` (whose layer digest must be the component's sha256).
    pub async fn install_from(
        &self,
        host: &WasmHost,
        src: &Path,
        source: Option<crate::lockfile::PackageSource>,
    ) -> Result<WasmPackage, PackageError> {
        // Full load first: a bad manifest, a component that does not match the WIT or an
        // unsupported version is refused naming the source file, before any copy. It
        // also compiles the package into the cache, so runs start at once.
        let pkg = WasmPackage::load_dir(host, src).await?;
        let m = &pkg.manifest;
        let manifest_src = src.join(MANIFEST_FILE);
        if FIRST_PARTY.contains(&m.name.as_str()) {
            return Err(PackageError::ReservedName {
                path: manifest_src,
                name: m.name.clone(),
            });
        }
        let mut taken = existing_types(host).await?;
        let manifest_bytes =
            std::fs::read(&manifest_src).map_err(|e| PackageError::io(&manifest_src, e))?;
        let component_src = m.component_path(src);
        let component_bytes =
            std::fs::read(&component_src).map_err(|e| PackageError::io(&component_src, e))?;
        let entry = LockEntry {
            name: m.name.clone(),
            version: m.version.clone(),
            component: m.component.clone(),
            sha256: sha256_hex(&component_bytes),
            manifest_sha256: sha256_hex(&manifest_bytes),
            node_types: pkg
                .declarations()
                .iter()
                .map(|d| d.type_name.clone())
                .collect(),
            dir: format!("{}-{}", m.name, lockfile::unique_suffix()),
            source,
        };
        if let Some(s) = &entry.source
            && s.layer_digest != format!("sha256:{}", entry.sha256)
        {
            return Err(PackageError::Changed {
                name: entry.name.clone(),
                path: component_src,
                lockfile: self.lockfile_path(),
                expected: s.layer_digest.clone(),
                actual: entry.sha256.clone(),
            });
        }

        // Staged whole and synced before anything points at it.
        let packages = self.packages_root();
        std::fs::create_dir_all(&packages).map_err(|e| PackageError::io(&packages, e))?;
        let staged = packages.join(format!(".staging-{}", lockfile::unique_suffix()));
        let written = stage(&staged, m, &manifest_bytes, &component_bytes);
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&staged);
            return Err(e);
        }

        let replaced = {
            let _guard = lockfile::lock_store(&self.root)?;
            let mut lock = self.read_lock()?;
            for other in lock.packages.iter().filter(|e| e.name != entry.name) {
                for t in &other.node_types {
                    taken
                        .entry(t.clone())
                        .or_insert_with(|| format!("installed package `{}`", other.name));
                }
            }
            if let Some(clash) = entry.node_types.iter().find(|t| taken.contains_key(*t)) {
                let _ = std::fs::remove_dir_all(&staged);
                return Err(PackageError::TypeClash {
                    path: manifest_src,
                    package: entry.name.clone(),
                    type_name: clash.clone(),
                    owner: taken[clash].clone(),
                });
            }
            let dest = self.entry_dir(&entry);
            std::fs::rename(&staged, &dest).map_err(|e| PackageError::io(&dest, e))?;
            lockfile::sync_dir(&packages)?;
            let old = lock.packages.iter().position(|e| e.name == entry.name);
            let replaced = old.map(|i| lock.packages.remove(i));
            lock.packages.push(entry.clone());
            lock.packages.sort_by(|a, b| a.name.cmp(&b.name));
            lockfile::write(&self.lockfile_path(), &lock)?;
            replaced
        };
        // After the switch: a run that read the old lockfile and finds its directory
        // gone reads the lockfile again (see `load`).
        if let Some(old) = replaced {
            let _ = std::fs::remove_dir_all(self.entry_dir(&old));
        }
        self.load(host, &entry.name).await
    }

    pub fn list(&self) -> Result<Vec<LockEntry>, PackageError> {
        Ok(self.read_lock()?.packages)
    }

    pub fn remove(&self, name: &str) -> Result<(), PackageError> {
        check_name(name)?;
        let removed = {
            let _guard = lockfile::lock_store(&self.root)?;
            let mut lock = self.read_lock()?;
            let Some(i) = lock.packages.iter().position(|p| p.name == name) else {
                return Err(PackageError::NotInstalled {
                    name: name.into(),
                    lockfile: self.lockfile_path(),
                });
            };
            let removed = lock.packages.remove(i);
            lockfile::write(&self.lockfile_path(), &lock)?;
            removed
        };
        let dir = self.entry_dir(&removed);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| PackageError::io(&dir, e))?;
        }
        Ok(())
    }

    fn entry(&self, name: &str) -> Result<LockEntry, PackageError> {
        check_name(name)?;
        self.read_lock()?
            .packages
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| PackageError::NotInstalled {
                name: name.into(),
                lockfile: self.lockfile_path(),
            })
    }

    /// Checks the bytes on disk of `entry` against its pins without compiling.
    fn check_pins(&self, entry: &LockEntry) -> Result<(), PackageError> {
        let dir = self.entry_dir(entry);
        self.check_manifest_pin(entry, &dir)?;
        let m = Manifest::read(&dir)?;
        let cpath = m.component_path(&dir);
        let cbytes = std::fs::read(&cpath).map_err(|e| PackageError::io(&cpath, e))?;
        self.compare(entry, &cpath, &entry.sha256, &sha256_hex(&cbytes))
    }

    fn check_manifest_pin(&self, entry: &LockEntry, dir: &Path) -> Result<(), PackageError> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|e| PackageError::io(&path, e))?;
        self.compare(entry, &path, &entry.manifest_sha256, &sha256_hex(&bytes))
    }

    fn compare(
        &self,
        entry: &LockEntry,
        path: &Path,
        expected: &str,
        actual: &str,
    ) -> Result<(), PackageError> {
        if expected == actual {
            Ok(())
        } else {
            Err(PackageError::Changed {
                name: entry.name.clone(),
                path: path.to_path_buf(),
                lockfile: self.lockfile_path(),
                expected: expected.into(),
                actual: actual.into(),
            })
        }
    }

    /// Re-hashes every installed package against the lockfile.
    pub fn verify(&self) -> Result<Vec<VerifyReport>, PackageError> {
        Ok(self
            .read_lock()?
            .packages
            .iter()
            .map(|e| VerifyReport {
                name: e.name.clone(),
                result: self.check_pins(e),
            })
            .collect())
    }

    /// Loads an installed package, refusing bytes that differ from the lockfile.
    pub async fn load(&self, host: &WasmHost, name: &str) -> Result<WasmPackage, PackageError> {
        let mut entry = self.entry(name)?;
        let mut attempt = 1;
        loop {
            match self.load_entry(host, &entry).await {
                Err(e) if e.is_missing_file() && attempt < LOAD_ATTEMPTS => {
                    // Re-installed or removed while we read: follow the lockfile.
                    let now = self.entry(name)?;
                    if now == entry {
                        return Err(e);
                    }
                    entry = now;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn load_entry(
        &self,
        host: &WasmHost,
        entry: &LockEntry,
    ) -> Result<WasmPackage, PackageError> {
        let dir = self.entry_dir(entry);
        self.check_manifest_pin(entry, &dir)?;
        // The component is hashed from the same bytes that get compiled.
        WasmPackage::load_checked(host, &dir, |path, digest| {
            self.compare(entry, path, &entry.sha256, digest)
        })
        .await
    }

    /// Loads every installed package.
    pub async fn load_all(&self, host: &WasmHost) -> Result<Vec<WasmPackage>, PackageError> {
        self.load_providing(host, None).await
    }

    /// Loads the installed packages that declare one of the `wanted` node types (all
    /// of them when `None`): a run compiles only what its graph uses.
    pub async fn load_providing(
        &self,
        host: &WasmHost,
        wanted: Option<&BTreeSet<String>>,
    ) -> Result<Vec<WasmPackage>, PackageError> {
        let mut out = Vec::new();
        for e in self.read_lock()?.packages {
            if wanted.is_none_or(|w| e.may_provide(w)) {
                out.push(self.load(host, &e.name).await?);
            }
        }
        Ok(out)
    }
}

/// A package name given on a command line: refused before it becomes a path.
fn check_name(name: &str) -> Result<(), PackageError> {
    if valid_package_name(name) {
        Ok(())
    } else {
        Err(PackageError::BadName { name: name.into() })
    }
}

/// The node types that exist without any installed package: the built-ins and the
/// first-party packages', each with who defines it.
async fn existing_types(host: &WasmHost) -> Result<BTreeMap<String, String>, PackageError> {
    let mut taken = BTreeMap::new();
    for d in heddle_kernel::builtins::declarations() {
        taken.insert(d.type_name.clone(), "the built-in node types".to_string());
    }
    for p in crate::first_party::load(host).await? {
        for d in p.declarations() {
            taken.insert(
                d.type_name.clone(),
                format!("the first-party package `{}`", p.name()),
            );
        }
    }
    Ok(taken)
}

/// Writes a package's manifest and component into the new directory `dir`, synced.
fn stage(
    dir: &Path,
    m: &Manifest,
    manifest_bytes: &[u8],
    component_bytes: &[u8],
) -> Result<(), PackageError> {
    std::fs::create_dir_all(dir).map_err(|e| PackageError::io(dir, e))?;
    lockfile::write_synced(&dir.join(MANIFEST_FILE), manifest_bytes)?;
    let component = m.component_path(dir);
    if let Some(parent) = component.parent() {
        std::fs::create_dir_all(parent).map_err(|e| PackageError::io(parent, e))?;
    }
    lockfile::write_synced(&component, component_bytes)?;
    lockfile::sync_dir(dir)
}
