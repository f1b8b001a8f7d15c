//! `heddle-package.toml`: what a package directory says about itself.

use std::path::{Path, PathBuf};

use heddle_core::CapabilityKind;
use serde::{Deserialize, Serialize};

use crate::error::PackageError;

pub const MANIFEST_FILE: &str = "heddle-package.toml";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Package name: the key of its grants in the operator config and of its lock entry.
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    /// Where the package's sources are (a URL), shown at install and published as the
    /// `org.opencontainers.image.source` annotation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The component file, relative to the package directory.
    pub component: String,
    /// Capabilities the package asks for, with reasons (shown at install; granting is
    /// the operator's decision).
    #[serde(default)]
    pub capabilities: Vec<ManifestCapability>,
    /// How many invocations of a node type may run at the same time (by type name, 1 to
    /// [`MAX_CONCURRENCY`]): the package's word that its invocations are independent
    /// (`NodeDecl::concurrency`). A type not listed runs one invocation at a time.
    #[serde(default)]
    pub concurrency: std::collections::BTreeMap<String, u32>,
    /// Graph documents the package provides, relative to its directory: a graph node
    /// names one with `"package": NAME, "graph": PATH`. Each must parse as a graph;
    /// `package add` copies them with the component.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graphs: Vec<String>,
}

/// The most invocations of one node a manifest may let run at once: each holds a WASM
/// instance (a slot of the engine's pool, 256 by default) while it runs.
pub const MAX_CONCURRENCY: u32 = 128;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ManifestCapability {
    pub kind: CapabilityKind,
    #[serde(default)]
    pub target: String,
    pub reason: String,
}

/// A path that stays inside the package directory: relative, with plain parts only.
fn inside(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && !p.is_absolute()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Package names: what grants are keyed by and what the store's directories are named
/// after, so nothing that could be a path (`..`, `/`) or surprise a reader.
pub fn valid_package_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// A capability's target (a directory, an env var or secret name, a host pattern) is
/// what the operator's grant is matched against and what `package add` shows them: like
/// a name, it is refused when it holds a control or invisible formatting character (it
/// would not be the text the operator reads) or is longer than a name may be.
pub(crate) fn check_target(target: &str) -> Result<(), String> {
    if target
        .chars()
        .any(|c| c.is_control() || crate::text::is_invisible_format(c))
    {
        return Err(format!(
            "capability target {} must not contain control or invisible formatting characters",
            crate::text::line(target, crate::text::SHORT)
        ));
    }
    if target.len() > crate::text::SHORT {
        return Err(format!(
            "capability target {}… is too long (at most {} bytes)",
            crate::text::line(target, 64),
            crate::text::SHORT
        ));
    }
    Ok(())
}

impl Manifest {
    /// Reads and checks the manifest of the package in `dir`.
    pub fn read(dir: &Path) -> Result<Manifest, PackageError> {
        let path = dir.join(MANIFEST_FILE);
        if !path.is_file() {
            return Err(PackageError::MissingManifest { path });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| PackageError::io(&path, e))?;
        // A source folder's manifest has `[build]`, or no `component` yet and nothing
        // else wrong: say what to do instead of "unknown field `build`". A manifest that
        // is wrong in another way too (`version = 3`) is reported as malformed, naming
        // that, since building would not help.
        if let Ok(mut table) = text.parse::<toml::Table>() {
            let source_dir = table.contains_key("build")
                || (!table.contains_key("component") && {
                    table.insert("component".into(), "built.wasm".into());
                    table
                        .try_into::<Manifest>()
                        .is_ok_and(|m| m.check(&path).is_ok())
                });
            if source_dir {
                return Err(PackageError::SourceDir {
                    dir: dir.to_path_buf(),
                });
            }
        }
        Manifest::parse(&text, &path)
    }

    /// Parses and checks manifest text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, PackageError> {
        let m: Manifest = toml::from_str(text).map_err(|source| PackageError::ManifestSyntax {
            path: path.to_path_buf(),
            source,
        })?;
        m.check(path)?;
        Ok(m)
    }

    fn check(&self, path: &Path) -> Result<(), PackageError> {
        let bad = |message: String| PackageError::BadManifest {
            path: path.to_path_buf(),
            message,
        };
        if !valid_package_name(&self.name) {
            return Err(bad(format!(
                "name `{}` must be non-empty lowercase ascii letters, digits, `-` or `_`",
                self.name
            )));
        }
        if self.version.trim().is_empty() {
            return Err(bad("version is empty".into()));
        }
        if !inside(&self.component) {
            return Err(bad(format!(
                "component `{}` must be a relative path inside the package directory",
                self.component
            )));
        }
        for g in &self.graphs {
            if !inside(g) {
                return Err(bad(format!(
                    "graph `{g}` must be a relative path inside the package directory"
                )));
            }
        }
        for c in &self.capabilities {
            check_target(&c.target).map_err(bad)?;
        }
        Ok(())
    }

    /// Checks the manifest's `concurrency` against the types the component declares.
    pub(crate) fn check_concurrency(
        &self,
        path: &Path,
        declared: impl Fn(&str) -> bool,
    ) -> Result<(), PackageError> {
        for (type_name, n) in &self.concurrency {
            let bad = |message: String| PackageError::BadManifest {
                path: path.to_path_buf(),
                message: format!("concurrency.\"{type_name}\" = {n}: {message}"),
            };
            if !(1..=MAX_CONCURRENCY).contains(n) {
                return Err(bad(format!("give 1 to {MAX_CONCURRENCY}")));
            }
            if !declared(type_name) {
                return Err(bad("the component declares no such node type".into()));
            }
        }
        Ok(())
    }

    /// Reads and checks each graph the manifest lists in the package directory `dir`:
    /// its path and exact bytes, refused naming the file when it is missing or not a
    /// graph document.
    pub fn read_graphs(&self, dir: &Path) -> Result<Vec<(String, Vec<u8>)>, PackageError> {
        let mut out = Vec::with_capacity(self.graphs.len());
        for g in &self.graphs {
            let path = dir.join(g);
            let bytes = std::fs::read(&path).map_err(|e| PackageError::io(&path, e))?;
            let text = std::str::from_utf8(&bytes).map_err(|e| PackageError::BadManifest {
                path: path.clone(),
                message: format!("graph `{g}` is not UTF-8 text: {e}"),
            })?;
            heddle_core::GraphDoc::parse(text, &path.display().to_string()).map_err(|e| {
                PackageError::BadManifest {
                    path: path.clone(),
                    message: format!("graph `{g}` is not a graph document: {e}"),
                }
            })?;
            out.push((g.clone(), bytes));
        }
        Ok(out)
    }

    pub fn component_path(&self, dir: &Path) -> PathBuf {
        dir.join(&self.component)
    }
}
