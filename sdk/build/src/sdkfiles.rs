//! The per-language helper layers (sdk/python, sdk/js, sdk/c), embedded so that the
//! build works from any folder and the cache key changes when a helper changes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{BuildError, Language};

const PYTHON_INIT: &str = include_str!("../../python/heddle/__init__.py");
const JS_HELPER: &str = include_str!("../../js/heddle.js");
const C_SOURCE: &str = include_str!("../../c/heddle.c");
const C_HEADER: &str = include_str!("../../c/heddle.h");

pub fn fingerprint(language: Language) -> String {
    let parts: &[&str] = match language {
        Language::Python => &[PYTHON_INIT],
        Language::JavaScript => &[JS_HELPER],
        Language::C => &[C_SOURCE, C_HEADER],
        Language::Rust => &[],
    };
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write(path: &Path, text: &str) -> Result<(), BuildError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| BuildError::io(dir, e))?;
    }
    std::fs::write(path, text).map_err(|e| BuildError::io(path, e))
}

/// Writes the `heddle` Python package; returns the folder to put on the Python path.
pub fn write_python(work: &Path) -> Result<PathBuf, BuildError> {
    let root = work.join("sdk-python");
    write(&root.join("heddle/__init__.py"), PYTHON_INIT)?;
    Ok(root)
}

/// Writes `heddle.js` into the staged sources (the entry imports `./heddle.js`).
pub fn write_js(staged_src: &Path) -> Result<(), BuildError> {
    write(&staged_src.join("heddle.js"), JS_HELPER)
}

/// Writes `heddle.c`/`heddle.h`; returns their folder.
pub fn write_c(work: &Path) -> Result<PathBuf, BuildError> {
    let root = work.join("sdk-c");
    write(&root.join("heddle.c"), C_SOURCE)?;
    write(&root.join("heddle.h"), C_HEADER)?;
    Ok(root)
}
