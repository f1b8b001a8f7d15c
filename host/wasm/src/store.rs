//! Installed packages and the lockfile that pins their bytes.
//!
//! Layout of a store directory:
//! ```text
//! <root>/heddle.lock              pins (name, version, sha256 of component and manifest)
//! <root>/packages/<name>/         a copy of the installed package directory
//! ```
//! A package is validated completely (manifest, component, WIT version, declarations)
//! before anything is copied, and loading re-hashes the bytes against the lockfile.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::WasmHost;
use crate::error::PackageError;
use crate::manifest::{MANIFEST_FILE, Manifest};
use crate::package::{WasmPackage, sha256_hex};

pub const LOCKFILE: &str = "heddle.lock";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Lockfile {
    pub version: u32,
    #[serde(rename = "package")]
    pub packages: Vec<LockEntry>,
}

/// An empty lockfile of the current format (serde fills absent keys from here).
impl Default for Lockfile {
    fn default() -> Self {
        Lockfile {
            version: 1,
            packages: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LockEntry {
    pub name: String,
    pub version: String,
    /// Component file, relative to the package directory.
    pub component: String,
    /// sha256 of the component bytes.
    pub sha256: String,
    /// sha256 of the manifest (its capability requests are part of what was reviewed).
    pub manifest_sha256: String,
    /// The node types the package declared at install, so a run loads (and compiles)
    /// only the packages its graph uses. Empty in lockfiles written before it existed:
    /// such a package is always loaded.
    #[serde(default)]
    pub node_types: Vec<String>,
}

impl LockEntry {
    /// Whether a graph using `wanted` types may need this package.
    fn may_provide(&self, wanted: &BTreeSet<String>) -> bool {
        self.node_types.is_empty() || self.node_types.iter().any(|t| wanted.contains(t))
    }
}

/// An outcome of [`PackageStore::verify`] for one package.
#[derive(Debug)]
pub struct VerifyReport {
    pub name: String,
    pub result: Result<(), PackageError>,
}

pub struct PackageStore {
    root: PathBuf,
}

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

    pub fn package_dir(&self, name: &str) -> PathBuf {
        self.root.join("packages").join(name)
    }

    pub fn read_lock(&self) -> Result<Lockfile, PackageError> {
        let path = self.lockfile_path();
        if !path.exists() {
            return Ok(Lockfile::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| PackageError::io(&path, e))?;
        toml::from_str(&text).map_err(|e| PackageError::BadLockfile {
            path,
            source: e.into(),
        })
    }

    fn write_lock(&self, lock: &Lockfile) -> Result<(), PackageError> {
        let path = self.lockfile_path();
        std::fs::create_dir_all(&self.root).map_err(|e| PackageError::io(&self.root, e))?;
        let mut text = String::from(
            "# Pinned node packages. Written by heddle; loading refuses bytes that differ.\n",
        );
        text.push_str(
            &toml::to_string(lock).map_err(|e| PackageError::BadLockfile {
                path: path.clone(),
                source: e.into(),
            })?,
        );
        let tmp = path.with_extension("lock.tmp");
        std::fs::write(&tmp, text).map_err(|e| PackageError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| PackageError::io(&path, e))
    }

    /// Validates the package in `src` completely, copies it into the store and pins its
    /// digests. Reinstalling a name replaces the previous version.
    pub async fn install(&self, host: &WasmHost, src: &Path) -> Result<WasmPackage, PackageError> {
        // Full load first: a bad manifest, a component that does not match the WIT or an
        // unsupported version is refused naming the source file, before any copy.
        let pkg = WasmPackage::load_dir(host, src).await?;
        let m = &pkg.manifest;
        let manifest_src = src.join(MANIFEST_FILE);
        let manifest_bytes =
            std::fs::read(&manifest_src).map_err(|e| PackageError::io(&manifest_src, e))?;
        let component_src = m.component_path(src);
        let component_bytes =
            std::fs::read(&component_src).map_err(|e| PackageError::io(&component_src, e))?;

        let dest = self.package_dir(&m.name);
        if dest.exists() {
            std::fs::remove_dir_all(&dest).map_err(|e| PackageError::io(&dest, e))?;
        }
        let dest_component = m.component_path(&dest);
        if let Some(parent) = dest_component.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PackageError::io(parent, e))?;
        }
        std::fs::write(dest.join(MANIFEST_FILE), &manifest_bytes)
            .map_err(|e| PackageError::io(dest.join(MANIFEST_FILE), e))?;
        std::fs::write(&dest_component, &component_bytes)
            .map_err(|e| PackageError::io(&dest_component, e))?;

        let mut lock = self.read_lock()?;
        lock.packages.retain(|p| p.name != m.name);
        lock.packages.push(LockEntry {
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
        });
        lock.packages.sort_by(|a, b| a.name.cmp(&b.name));
        self.write_lock(&lock)?;
        self.load(host, &m.name).await
    }

    pub fn list(&self) -> Result<Vec<LockEntry>, PackageError> {
        Ok(self.read_lock()?.packages)
    }

    pub fn remove(&self, name: &str) -> Result<(), PackageError> {
        let mut lock = self.read_lock()?;
        let before = lock.packages.len();
        lock.packages.retain(|p| p.name != name);
        if lock.packages.len() == before {
            return Err(PackageError::NotInstalled {
                name: name.into(),
                lockfile: self.lockfile_path(),
            });
        }
        self.write_lock(&lock)?;
        let dir = self.package_dir(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| PackageError::io(&dir, e))?;
        }
        Ok(())
    }

    fn entry(&self, name: &str) -> Result<LockEntry, PackageError> {
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
        let dir = self.package_dir(&entry.name);
        let manifest_path = dir.join(MANIFEST_FILE);
        let mbytes =
            std::fs::read(&manifest_path).map_err(|e| PackageError::io(&manifest_path, e))?;
        self.compare(
            entry,
            &manifest_path,
            &entry.manifest_sha256,
            &sha256_hex(&mbytes),
        )?;
        let m = Manifest::read(&dir)?;
        let cpath = m.component_path(&dir);
        let cbytes = std::fs::read(&cpath).map_err(|e| PackageError::io(&cpath, e))?;
        self.compare(entry, &cpath, &entry.sha256, &sha256_hex(&cbytes))
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
        let entry = self.entry(name)?;
        let dir = self.package_dir(name);
        let manifest_path = dir.join(MANIFEST_FILE);
        let mbytes =
            std::fs::read(&manifest_path).map_err(|e| PackageError::io(&manifest_path, e))?;
        self.compare(
            &entry,
            &manifest_path,
            &entry.manifest_sha256,
            &sha256_hex(&mbytes),
        )?;
        // The component is hashed from the same bytes that get compiled.
        WasmPackage::load_checked(host, &dir, |path, digest| {
            self.compare(&entry, path, &entry.sha256, digest)
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
