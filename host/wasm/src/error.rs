//! Errors of package handling. Every variant names the package or file it is about, so
//! an operator can act on the message without reading code.

use std::path::PathBuf;

/// A cause kept whole (wasmtime's error type converts into this with its chain intact).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    #[error("{path}: malformed package manifest")]
    ManifestSyntax {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: malformed package manifest: {message}")]
    BadManifest { path: PathBuf, message: String },
    #[error(
        "{}: a package source folder, not a built package (its manifest has [build] or no `component`); build it first: `heddle package build {}`, then `heddle package add {}`",
        dir.display(), dir.display(), dir.join("dist").display()
    )]
    SourceDir { dir: PathBuf },
    #[error(
        "{path}: the component is {size} bytes, more than [wasm] max_component_bytes = {limit} allows"
    )]
    ComponentTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{path}: component file named by the manifest does not exist")]
    MissingComponent { path: PathBuf },
    #[error("{path}: not a valid WebAssembly component")]
    BadComponent {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error("{path}: component does not match the heddle:node WIT contract: {message}")]
    WitMismatch { path: PathBuf, message: String },
    #[error("{path}: component does not match the heddle:node WIT contract")]
    WitLink {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error(
        "{path}: built against heddle:node@{found}, which this host does not support (supported: heddle:node@{supported})"
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: String,
        supported: String,
    },
    /// The guest's failure in one line (`failure::classify`), as every guest failure
    /// is reported.
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
    #[error(
        "{path}: package name `{name}` is reserved for the first-party package built into heddle; rename the package"
    )]
    ReservedName { path: PathBuf, name: String },
    #[error(
        "{path}: package `{package}` declares node type `{type_name}`, which {owner} already defines; a package may not redefine an existing node type"
    )]
    TypeClash {
        path: PathBuf,
        package: String,
        type_name: String,
        owner: String,
    },
    #[error("`{name}` is not a package name (lowercase ascii letters, digits, `-` or `_`)")]
    BadName { name: String },
    #[error("{path}: package `{name}`: {message}")]
    BadLockEntry {
        path: PathBuf,
        name: String,
        message: String,
    },
    #[error(
        "package `{package}`: its grant in [packages.{package}] is pinned to sha256 {pinned}, but the installed component is {actual}; review the package and update the pin"
    )]
    GrantPinMismatch {
        package: String,
        pinned: String,
        actual: String,
    },
    #[error("package `{name}` is not installed (not in {lockfile})")]
    NotInstalled { name: String, lockfile: PathBuf },
    #[error("{path}: malformed lockfile")]
    BadLockfile {
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    #[error("configuration")]
    Config(#[source] toml::de::Error),
    #[error("line {line}: {message}")]
    ConfigAt { line: usize, message: String },
    #[error("granting directory {} as {guest}", host.display())]
    GrantDir {
        host: PathBuf,
        guest: String,
        #[source]
        source: BoxError,
    },
    #[error(
        "this heddle was built without its first-party packages (built: {built:?}); rebuild it without HEDDLE_SKIP_PLUGIN_BUILD"
    )]
    FirstPartyMissing { built: Vec<&'static str> },
    #[error("wasm engine: {what}")]
    Engine {
        what: &'static str,
        #[source]
        source: BoxError,
    },
}

impl PackageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PackageError::Io {
            path: path.into(),
            source,
        }
    }

    /// A file of an installed package that is not there (a re-install or remove may
    /// have moved it while it was being read).
    pub(crate) fn is_missing_file(&self) -> bool {
        match self {
            PackageError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            PackageError::MissingManifest { .. } | PackageError::MissingComponent { .. } => true,
            _ => false,
        }
    }

    /// Whether the error is about what the user pointed at (a directory that is not a
    /// good package: its manifest, component, WIT version, the declarations it made, names; a
    /// package not installed; a bad config section) rather than a failure of the
    /// machine or of installed bytes (changed since locked, I/O, the engine). The
    /// command line exits 2 for the first ("bad package directory"), 1 for the second.
    /// Every variant is listed, so a new one is classified where it is defined.
    pub fn is_bad_request(&self) -> bool {
        use PackageError as P;
        match self {
            P::MissingManifest { .. }
            | P::ManifestSyntax { .. }
            | P::BadManifest { .. }
            | P::SourceDir { .. }
            | P::ComponentTooLarge { .. }
            | P::MissingComponent { .. }
            | P::BadComponent { .. }
            | P::WitMismatch { .. }
            | P::WitLink { .. }
            | P::UnsupportedVersion { .. }
            | P::BadDecl { .. }
            | P::ReservedName { .. }
            | P::TypeClash { .. }
            | P::BadName { .. }
            | P::NotInstalled { .. }
            | P::Config(_)
            | P::ConfigAt { .. } => true,
            // The guest failed while describing itself (a trap, its deadline): what it
            // would have declared is unknown, as for any run of guest code that fails.
            P::Describe { .. }
            | P::Io { .. }
            | P::Changed { .. }
            | P::BadLockEntry { .. }
            | P::GrantPinMismatch { .. }
            | P::BadLockfile { .. }
            | P::GrantDir { .. }
            | P::FirstPartyMissing { .. }
            | P::Engine { .. } => false,
        }
    }

    pub(crate) fn engine(what: &'static str, source: impl Into<BoxError>) -> Self {
        PackageError::Engine {
            what,
            source: source.into(),
        }
    }
}

/// An error and its causes on one line (`a: b: c`), for the kernel's `NodeError`, whose
/// message is data that goes into the run report.
pub(crate) use heddle_core::text::error_chain as chain;
