//! Built components keyed by a hash of every input of the build, so a repeated test
//! run or CLI build skips the 30–70 s interpreter snapshot.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{BuildError, Language, Toolchains};

/// Folders of a package source that are outputs or tool state, never inputs.
const SKIP_DIRS: &[&str] = &["dist", "target", "node_modules", "__pycache__", ".git"];

pub fn key(
    language: Language,
    src: &Path,
    wit: &Path,
    toolchains: &Toolchains,
) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    h.update(b"heddle-package-build v1\0");
    h.update(language.name().as_bytes());
    h.update(b"\0");
    h.update(toolchains.version_tag(language).as_bytes());
    h.update(b"\0");
    h.update(crate::sdkfiles::fingerprint(language).as_bytes());
    hash_tree(&mut h, "src", src)?;
    hash_tree(&mut h, "wit", wit)?;
    Ok(h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn hash_tree(h: &mut Sha256, label: &str, root: &Path) -> Result<(), BuildError> {
    let mut files = Vec::new();
    walk(root, root, &mut files)?;
    files.sort();
    for rel in files {
        let path = root.join(&rel);
        let bytes = std::fs::read(&path).map_err(|e| BuildError::io(&path, e))?;
        h.update(label.as_bytes());
        h.update(b"\0");
        h.update(rel.to_string_lossy().as_bytes());
        h.update(b"\0");
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), BuildError> {
    for entry in std::fs::read_dir(dir).map_err(|e| BuildError::io(dir, e))? {
        let entry = entry.map_err(|e| BuildError::io(dir, e))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let ft = entry.file_type().map_err(|e| BuildError::io(&path, e))?;
        if ft.is_dir() {
            if !SKIP_DIRS.contains(&name.as_ref()) {
                walk(root, &path, out)?;
            }
        } else if ft.is_file() {
            // Invariant: `path` was found under `root` by this walk.
            out.push(
                path.strip_prefix(root)
                    .expect("walked path is under root")
                    .to_path_buf(),
            );
        }
    }
    Ok(())
}

/// Copies into the cache through a temporary name, so a reader never sees half a file.
pub fn store(built: &Path, cache_file: &Path) -> Result<(), BuildError> {
    let dir = cache_file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| BuildError::io(dir, e))?;
    let tmp = cache_file.with_extension(format!("tmp{}", std::process::id()));
    std::fs::copy(built, &tmp).map_err(|e| BuildError::io(&tmp, e))?;
    std::fs::rename(&tmp, cache_file).map_err(|e| BuildError::io(cache_file, e))
}
