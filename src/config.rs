//! `heddle.toml`: the operator's configuration.
//!
//! Each crate owns its section's schema (WASM packages and grants, code runners, the
//! supervisor); this module only finds the file, parses it once and hands each crate its
//! section, so an error names the file and the section it came from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::exit::UsageError;

/// The file read when `--config` is not given and it exists in the working directory.
pub const DEFAULT_FILE: &str = "heddle.toml";

/// Settings of the run itself (`[run]`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Wall-clock limit per node invocation, in milliseconds; reaching it cancels the work.
    #[serde(default)]
    pub node_timeout_ms: Option<u64>,
}

impl RunSection {
    pub fn node_timeout(&self) -> Option<Duration> {
        self.node_timeout_ms.map(Duration::from_millis)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Where it was read from; `None` when no file was found (all defaults).
    pub path: Option<PathBuf>,
    table: toml::Table,
    pub run: RunSection,
}

impl Config {
    /// Reads `explicit` (which must exist), else `./heddle.toml` when present, else
    /// returns the defaults.
    pub fn load(explicit: Option<&Path>) -> Result<Config, UsageError> {
        let path = match explicit {
            Some(p) => {
                if !p.exists() {
                    return Err(UsageError::new(format!(
                        "config file {} does not exist",
                        p.display()
                    )));
                }
                p.to_path_buf()
            }
            None => {
                let p = PathBuf::from(DEFAULT_FILE);
                if !p.is_file() {
                    return Ok(Config::default());
                }
                p
            }
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            UsageError::new(format!("cannot read config file {}: {e}", path.display()))
        })?;
        Self::parse(&text, &path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, UsageError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| UsageError::new(format!("{}: {e}", path.display())))?;
        let mut cfg = Config {
            path: Some(path.to_path_buf()),
            table,
            run: RunSection::default(),
        };
        cfg.run = cfg.section("run")?.unwrap_or_default();
        Ok(cfg)
    }

    /// Deserializes one top-level section, naming the file and section on error.
    pub fn section<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, UsageError> {
        let Some(v) = self.table.get(name) else {
            return Ok(None);
        };
        v.clone()
            .try_into()
            .map(Some)
            .map_err(|e: toml::de::Error| {
                UsageError::new(format!("{}: section [{name}]: {e}", self.display_path()))
            })
    }

    /// Deserializes the whole file, for crates whose sections sit at the top level
    /// (`[wasm]`, `[packages.<name>]`, `[secrets]`) and ignore the others.
    pub fn whole<T: DeserializeOwned>(&self) -> Result<T, UsageError> {
        toml::Value::Table(self.table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| UsageError::new(format!("{}: {e}", self.display_path())))
    }

    /// A path from the file, relative to the file's directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir().join(p)
        }
    }

    /// The directory relative paths in the file are resolved against.
    pub fn base_dir(&self) -> PathBuf {
        self.path
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."))
    }

    pub fn display_path(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "(defaults)".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_section_names_file_and_section() {
        let err =
            Config::parse("[run]\nnode_timeout_ms = \"x\"\n", Path::new("h.toml")).unwrap_err();
        assert!(err.message.contains("h.toml: section [run]"), "{err}");
        let cfg = Config::parse("[run]\nnode_timeout_ms = 5\n", Path::new("h.toml")).unwrap();
        assert_eq!(cfg.run.node_timeout(), Some(Duration::from_millis(5)));
    }
}
