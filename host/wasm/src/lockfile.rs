//! `heddle.lock`: the pins of the installed packages. Read with every entry validated
//! (a lockfile is a file anyone may edit: its names become paths), written atomically
//! (unique temp file, fsync, rename) while the store's write lock is held.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::PackageError;
use crate::manifest::valid_package_name;

pub const LOCKFILE: &str = "heddle.lock";
/// Locked exclusively by every writer of a store for its whole read-modify-write, so
/// concurrent `package add` and `remove` never lose each other's entry.
const WRITE_LOCK: &str = ".write-lock";

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
    /// The package's directory under `<store>/packages/`: each install gets a new one,
    /// so a re-install switches atomically with the lockfile. Empty in lockfiles written
    /// before: the directory is then the package name.
    #[serde(default)]
    pub dir: String,
    /// Where the package was fetched from, when it came from a registry (absent for a
    /// directory added from disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PackageSource>,
}

pub use heddle_core::package::PackageSource;

impl LockEntry {
    /// Whether a graph using `wanted` types may need this package.
    pub(crate) fn may_provide(&self, wanted: &BTreeSet<String>) -> bool {
        self.node_types.is_empty() || self.node_types.iter().any(|t| wanted.contains(t))
    }

    /// The directory name under `<store>/packages/`.
    pub fn dir_name(&self) -> &str {
        if self.dir.is_empty() {
            &self.name
        } else {
            &self.dir
        }
    }

    /// Refuses an entry whose name or paths could reach outside the store.
    fn check(&self, lockfile: &Path) -> Result<(), PackageError> {
        let bad = |message: String| PackageError::BadLockEntry {
            path: lockfile.to_path_buf(),
            name: self.name.clone(),
            message,
        };
        if !valid_package_name(&self.name) {
            return Err(bad(
                "not a package name (lowercase ascii letters, digits, `-` or `_`)".into(),
            ));
        }
        if !is_plain_name(self.dir_name()) {
            return Err(bad(format!(
                "directory `{}` is not a plain name inside the store",
                self.dir_name()
            )));
        }
        let c = Path::new(&self.component);
        if self.component.is_empty() || !c.components().all(|p| matches!(p, Component::Normal(_))) {
            return Err(bad(format!(
                "component `{}` is not a relative path inside the package directory",
                self.component
            )));
        }
        if let Some(s) = &self.source {
            for (what, d) in [
                ("manifest_digest", &s.manifest_digest),
                ("layer_digest", &s.layer_digest),
            ] {
                if !is_sha256_digest(d) {
                    return Err(bad(format!("source {what} `{d}` is not sha256:<64 hex>")));
                }
            }
            if s.layer_digest != format!("sha256:{}", self.sha256) {
                return Err(bad(format!(
                    "source layer_digest {} is not the component's sha256 {}",
                    s.layer_digest, self.sha256
                )));
            }
        }
        Ok(())
    }
}

/// `sha256:` and 64 lowercase hex digits.
fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// One normal path component, not hidden (the store's own files start with `.`).
pub(crate) fn is_plain_name(s: &str) -> bool {
    let mut it = Path::new(s).components();
    matches!((it.next(), it.next()), (Some(Component::Normal(_)), None))
        && !s.starts_with('.')
        && !s.contains(['/', '\\'])
}

/// Reads and validates the lockfile at `path`; a missing file is an empty store.
pub(crate) fn read(path: &Path) -> Result<Lockfile, PackageError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Lockfile::default()),
        Err(e) => return Err(PackageError::io(path, e)),
    };
    let lock: Lockfile = toml::from_str(&text).map_err(|e| PackageError::BadLockfile {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let mut seen = BTreeSet::new();
    for e in &lock.packages {
        e.check(path)?;
        if !seen.insert(e.name.as_str()) {
            return Err(PackageError::BadLockEntry {
                path: path.to_path_buf(),
                name: e.name.clone(),
                message: "listed twice".into(),
            });
        }
    }
    Ok(lock)
}

/// A name no other writer, in this process or another, uses at the same time.
pub(crate) fn unique_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes `lock` to `path` so a reader sees the old file or the new one, whole, even
/// across a crash: unique temp file, fsync, rename, fsync of the directory.
pub(crate) fn write(path: &Path, lock: &Lockfile) -> Result<(), PackageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut text = String::from(
        "# Pinned node packages. Written by heddle; loading refuses bytes that differ.\n",
    );
    text.push_str(
        &toml::to_string(lock).map_err(|e| PackageError::BadLockfile {
            path: path.to_path_buf(),
            source: e.into(),
        })?,
    );
    let tmp = dir.join(format!(".{LOCKFILE}.{}.tmp", unique_suffix()));
    write_synced(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        PackageError::io(path, e)
    })?;
    sync_dir(dir)
}

/// Creates `path` (never overwriting) with `bytes`, flushed to disk.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), PackageError> {
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| PackageError::io(path, e))?;
    f.write_all(bytes).map_err(|e| PackageError::io(path, e))?;
    f.sync_all().map_err(|e| PackageError::io(path, e))
}

/// Makes a rename in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), PackageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| PackageError::io(dir, e))
}

/// The store's write lock, held until dropped.
pub(crate) struct WriteGuard {
    _file: File,
}

/// Waits for, then takes, the write lock of the store at `root` (created if needed).
pub(crate) fn lock_store(root: &Path) -> Result<WriteGuard, PackageError> {
    std::fs::create_dir_all(root).map_err(|e| PackageError::io(root, e))?;
    let path: PathBuf = root.join(WRITE_LOCK);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| PackageError::io(&path, e))?;
    file.lock().map_err(|e| PackageError::io(&path, e))?;
    Ok(WriteGuard { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_stay_inside_the_store() {
        assert!(is_plain_name("std-0a1b2c"));
        for bad in ["", ".", "..", "../x", "a/b", "/abs", ".hidden", "a\\b"] {
            assert!(!is_plain_name(bad), "{bad:?} accepted");
        }
    }
}
