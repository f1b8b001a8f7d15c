//! `heddle.toml`: the operator's configuration.
//!
//! Each crate owns its section's schema (WASM packages and grants, code runners, the
//! supervisor); this module only finds the file, parses it once and hands each crate its
//! section, so an error names the file and the section it came from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::error::ConfigError;

/// The file read when `--config` is not given and it exists in the working directory.
pub const DEFAULT_FILE: &str = "heddle.toml";

/// Settings of the run itself (`[run]`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Wall-clock limit per node invocation, in milliseconds; reaching it cancels the work.
    #[serde(default)]
    pub node_timeout_ms: Option<u64>,
    /// How deep graph nodes may nest (a graph node in a graph node in …); default 8.
    #[serde(default)]
    pub max_graph_depth: Option<usize>,
}

/// The deepest nesting of graph nodes taken from `[run] max_graph_depth`: past it a
/// setting is a typo, and every level is a document read and expanded.
pub const MAX_GRAPH_DEPTH: usize = 64;

/// The longest run time limit taken (30 days), from `--time-limit-ms` or `[store]
/// time_limit_ms`: beyond it a limit is a typo, and the watchdog's clock arithmetic stays
/// far from overflow.
pub const MAX_TIME_LIMIT_MS: u64 = 30 * 24 * 3600 * 1000;

/// Range of a per-node timeout in milliseconds, from the flag or the file. Zero would
/// cancel every invocation before it started, or not, depending on the scheduler's
/// timing; the ceiling (30 days) catches a unit mistake.
pub const NODE_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1..=30 * 24 * 3600 * 1000;

impl RunSection {
    /// The per-invocation time limit the file sets, if any.
    pub fn node_timeout(&self) -> Option<Duration> {
        self.node_timeout_ms.map(Duration::from_millis)
    }

    /// How deep graph nodes may nest ([`heddle_core::compose::DEFAULT_MAX_DEPTH`] unless
    /// set).
    pub fn max_graph_depth(&self) -> usize {
        self.max_graph_depth
            .unwrap_or(heddle_core::compose::DEFAULT_MAX_DEPTH)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(d) = self.max_graph_depth
            && !(1..=MAX_GRAPH_DEPTH).contains(&d)
        {
            return Err(format!(
                "max_graph_depth = {d} is out of range (1..={MAX_GRAPH_DEPTH})"
            ));
        }
        match self.node_timeout_ms {
            Some(ms) if !NODE_TIMEOUT_MS.contains(&ms) => Err(format!(
                "node_timeout_ms = {ms} is out of range ({}..={} milliseconds)",
                NODE_TIMEOUT_MS.start(),
                NODE_TIMEOUT_MS.end()
            )),
            _ => Ok(()),
        }
    }
}

/// Every top-level section a `heddle.toml` may have, and who reads it. Anything else is
/// refused: a misspelt `[package.files]` would otherwise drop a grant without a word.
pub const SECTIONS: &[(&str, &str)] = &[
    ("run", "the run itself"),
    ("cli", "the command line"),
    ("wasm", "the WASM engine"),
    ("packages", "grants per WASM package"),
    ("secrets", "where secret values come from"),
    ("runners", "code nodes"),
    ("store", "durable runs"),
    ("serve", "heddle serve"),
    ("supervisor", "the LLM supervisor of --supervise"),
    ("telemetry", "traces and the log format"),
    (
        "registry",
        "OCI registries packages are fetched from and pushed to",
    ),
    (
        "trust",
        "publishers' keys package signatures are checked against",
    ),
];

/// The parsed `heddle.toml` (or the defaults when there is none): each crate's section is
/// deserialized from it on demand, naming the file and the section on error.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Where it was read from; `None` when no file was found (all defaults).
    pub path: Option<PathBuf>,
    table: toml::Table,
    /// The file's text: sections read from it whole keep their line numbers for errors.
    text: String,
    /// `[run]`, checked.
    pub run: RunSection,
}

impl Config {
    /// Reads `explicit` (which must exist), else `./heddle.toml` when present, else
    /// returns the defaults.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let path = match explicit {
            Some(p) => {
                if !p.exists() {
                    return Err(ConfigError::new(format!(
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
            ConfigError::new(format!("cannot read config file {}: {e}", path.display()))
        })?;
        Self::parse(&text, &path)
    }

    /// Parses `text` as the configuration file at `path` (named in errors, and the base
    /// of the relative paths in it); refuses unknown top-level sections by name.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::new(format!("{}: {e}", path.display())))?;
        let unknown: Vec<String> = table
            .keys()
            .filter(|k| !SECTIONS.iter().any(|(name, _)| name == k))
            .map(|k| {
                format!(
                    "`{}`",
                    heddle_core::text::clip(k, heddle_core::text::ECHO_MAX_CHARS)
                )
            })
            .collect();
        if !unknown.is_empty() {
            let known: Vec<&str> = SECTIONS.iter().map(|(name, _)| *name).collect();
            return Err(ConfigError::new(format!(
                "{}: unknown top-level {} {} (known sections: {})",
                path.display(),
                if unknown.len() == 1 {
                    "section"
                } else {
                    "sections"
                },
                unknown.join(", "),
                known.join(", ")
            )));
        }
        let mut cfg = Config {
            path: Some(path.to_path_buf()),
            table,
            text: text.to_string(),
            run: RunSection::default(),
        };
        cfg.run = cfg.section("run")?.unwrap_or_default();
        cfg.run
            .check()
            .map_err(|m| ConfigError::new(format!("{}: section [run]: {m}", cfg.display_path())))?;
        Ok(cfg)
    }

    /// Deserializes one top-level section, naming the file and section on error.
    pub fn section<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ConfigError> {
        let Some(v) = self.table.get(name) else {
            return Ok(None);
        };
        v.clone()
            .try_into()
            .map(Some)
            .map_err(|e: toml::de::Error| {
                ConfigError::new(format!("{}: section [{name}]: {e}", self.display_path()))
            })
    }

    /// Deserializes the whole file, for crates whose sections sit at the top level
    /// (`[wasm]`, `[packages.<name>]`, `[secrets]`) and ignore the others. Read from the
    /// text, so an error names the line.
    pub fn whole<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(&self.text)
            .map_err(|e: toml::de::Error| ConfigError::new(format!("{}: {e}", self.display_path())))
    }

    /// The file's text (empty without a file).
    pub fn text(&self) -> &str {
        &self.text
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

    /// The file's path as errors name it (`(defaults)` without a file).
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
        assert!(err.to_string().contains("h.toml: section [run]"), "{err}");
        let cfg = Config::parse("[run]\nnode_timeout_ms = 5\n", Path::new("h.toml")).unwrap();
        assert_eq!(cfg.run.node_timeout(), Some(Duration::from_millis(5)));
        let err = Config::parse("[run]\nnode_timeout_ms = 0\n", Path::new("h.toml")).unwrap_err();
        assert!(
            err.to_string()
                .contains("node_timeout_ms = 0 is out of range"),
            "{err}"
        );
    }

    #[test]
    fn max_graph_depth_defaults_to_eight_and_is_refused_outside_one_to_sixty_four() {
        let cfg = Config::parse("[run]\n", Path::new("h.toml")).unwrap();
        assert_eq!(cfg.run.max_graph_depth(), 8);
        for ok in [1, 9, 64] {
            let cfg = Config::parse(
                &format!("[run]\nmax_graph_depth = {ok}\n"),
                Path::new("h.toml"),
            )
            .unwrap();
            assert_eq!(cfg.run.max_graph_depth(), ok);
        }
        for bad in [0, 65] {
            let err = Config::parse(
                &format!("[run]\nmax_graph_depth = {bad}\n"),
                Path::new("h.toml"),
            )
            .unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("max_graph_depth = {bad} is out of range (1..=64)")),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_sections_are_refused_by_name() {
        // `[package.files]` for `[packages.files]`: the grant must not vanish silently.
        let err = Config::parse(
            "[package.files]\ndirs = []\n[runners]\n",
            Path::new("h.toml"),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("h.toml: unknown top-level section `package`"),
            "{err}"
        );
        assert!(err.to_string().contains("packages"), "{err}");
        let err = Config::parse("typo = 1\n", Path::new("h.toml")).unwrap_err();
        assert!(err.to_string().contains("`typo`"), "{err}");
        for (name, _) in SECTIONS {
            Config::parse(&format!("[{name}]\n"), Path::new("h.toml")).unwrap();
        }
    }
}
