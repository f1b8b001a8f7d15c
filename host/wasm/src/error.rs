//! Errors of package handling. Every variant names the package or file it is about, so
//! an operator can act on the message without reading code.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: missing package manifest (every package directory needs a heddle-package.toml)"
    )]
    MissingManifest { path: PathBuf },
    #[error("{path}: malformed package manifest: {message}")]
    BadManifest { path: PathBuf, message: String },
    #[error("{path}: component file named by the manifest does not exist")]
    MissingComponent { path: PathBuf },
    #[error("{path}: not a valid WebAssembly component: {message}")]
    BadComponent { path: PathBuf, message: String },
    #[error("{path}: component does not match the heddle:node WIT contract: {message}")]
    WitMismatch { path: PathBuf, message: String },
    #[error(
        "{path}: built against heddle:node@{found}, which this host does not support (supported: heddle:node@{supported})"
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: String,
        supported: String,
    },
    #[error("{path}: describe() failed: {message}")]
    Describe { path: PathBuf, message: String },
    #[error("{path}: node declaration `{type_name}` is invalid: {message}")]
    BadDecl {
        path: PathBuf,
        type_name: String,
        message: String,
    },
    #[error(
        "package `{name}`: {path} changed since it was locked (sha256 {actual}, lockfile {lockfile} pins {expected}); reinstall it if the change is intended"
    )]
    Changed {
        name: String,
        path: PathBuf,
        lockfile: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("package `{name}` is not installed (not in {lockfile})")]
    NotInstalled { name: String, lockfile: PathBuf },
    #[error("{path}: malformed lockfile: {message}")]
    BadLockfile { path: PathBuf, message: String },
    #[error("configuration: {0}")]
    Config(String),
    #[error("wasm engine: {0}")]
    Engine(String),
}

impl PackageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PackageError::Io {
            path: path.into(),
            source,
        }
    }
}
