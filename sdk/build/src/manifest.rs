//! The source manifest is the package manifest `heddle-wasm` reads, plus an optional
//! `[build]` table for this tool. The built manifest is the same document with
//! `[build]` removed and the component file filled in, so authors keep one file.

use std::path::Path;

use crate::BuildError;

/// The key of the manifest that names the component file (heddle-wasm's format).
pub const COMPONENT_KEY: &str = "component";

pub struct SourceManifest {
    pub name: String,
    /// `[build] language`, when the author pins it.
    pub language: Option<String>,
    /// `[build] entry`: the module (Python) or file (JavaScript) to build from.
    pub entry: Option<String>,
    /// `graphs`: graph documents the package provides, relative to its folder; a build
    /// copies each into the output folder, where `heddle package add` and `push` read
    /// them.
    pub graphs: Vec<String>,
    doc: toml::Table,
}

impl SourceManifest {
    pub fn load(path: &Path) -> Result<SourceManifest, BuildError> {
        let text = std::fs::read_to_string(path).map_err(|e| BuildError::io(path, e))?;
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| BuildError::Manifest {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let bad = |message: String| BuildError::Manifest {
            path: path.to_path_buf(),
            message,
        };
        let name = match doc.get("name") {
            Some(toml::Value::String(s)) if valid_name(s) => s.clone(),
            Some(toml::Value::String(s)) => {
                return Err(bad(format!(
                    "name {s:?}: use lowercase letters, digits, '-' and '_'"
                )));
            }
            Some(_) => return Err(bad("name must be a string".into())),
            None => return Err(bad("missing `name`".into())),
        };
        let build = match doc.get("build") {
            None => None,
            Some(toml::Value::Table(t)) => Some(t),
            Some(_) => return Err(bad("[build] must be a table".into())),
        };
        let string_field = |key: &str| -> Result<Option<String>, BuildError> {
            match build.and_then(|b| b.get(key)) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(bad(format!("[build] {key} must be a string"))),
            }
        };
        let language = string_field("language")?;
        let entry = string_field("entry")?;
        let graphs = match doc.get("graphs") {
            None => Vec::new(),
            Some(toml::Value::Array(items)) => {
                let mut graphs = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        toml::Value::String(g) if inside(g) => graphs.push(g.clone()),
                        toml::Value::String(g) => {
                            return Err(bad(format!(
                                "graph `{g}` must be a relative path inside the package folder"
                            )));
                        }
                        _ => return Err(bad("`graphs` must list paths (strings)".into())),
                    }
                }
                graphs
            }
            Some(_) => return Err(bad("`graphs` must be a list of paths".into())),
        };
        Ok(SourceManifest {
            name,
            language,
            entry,
            graphs,
            doc,
        })
    }

    /// Writes the package manifest next to the built component.
    pub fn write_package_manifest(
        &self,
        _source: &Path,
        out: &Path,
        component_file: &str,
    ) -> Result<(), BuildError> {
        let mut doc = self.doc.clone();
        doc.remove("build");
        doc.insert(
            COMPONENT_KEY.into(),
            toml::Value::String(component_file.into()),
        );
        let text = toml::to_string_pretty(&doc).map_err(|e| BuildError::Manifest {
            path: out.to_path_buf(),
            message: e.to_string(),
        })?;
        std::fs::write(out, text).map_err(|e| BuildError::io(out, e))
    }
}

/// A path that stays inside the package folder: relative, with plain parts only (what
/// `heddle-wasm` requires of the built manifest's `graphs`).
fn inside(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && !p.is_absolute()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}
