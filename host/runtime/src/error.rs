//! What the runtime refuses or fails with. Each kind says who is to act: a
//! [`ConfigError`] or a [`Refused`] request is the caller's to correct (nothing ran and
//! nothing was written: the command line exits 2, the API answers 4xx), the others are
//! failures of the store, a package, the kernel or the machine, carried as their own
//! crates' types so a caller can tell them apart.

use std::path::PathBuf;

use heddle_store::StoreError;
use heddle_store::artifacts::ArtifactError;
use heddle_store::lock::LockError;

/// The operator's configuration cannot be used: `heddle.toml` is missing (when named),
/// unreadable or malformed, names an unknown section, or a setting is out of range. The
/// message names the file and section.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> ConfigError {
        ConfigError {
            message: message.into(),
        }
    }
}

/// A request refused before anything was written: a stored run that cannot be taken
/// over as asked (it waits at a gate, a person supervises it through a server, its
/// stored graph is unreadable), a gate the run does not wait at, a budget out of range,
/// a graph file that cannot be read. The message says what to do instead.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    message: String,
}

impl Refused {
    pub(crate) fn new(message: impl Into<String>) -> Refused {
        Refused {
            message: message.into(),
        }
    }
}

/// Shorthand for a [`Refused`] with a formatted message.
macro_rules! refused {
    ($($arg:tt)*) => {
        $crate::error::Refused::new(format!($($arg)*))
    };
}
pub(crate) use refused;

/// An input of a new durable run holding a known secret value.
#[derive(Debug, thiserror::Error)]
#[error(
    "input `{input}` holds a known secret value, which a durable run never stores (its inputs are recorded and fed to its nodes again on every resume): grant the secret to the package that needs it and refer to it by name; KNOWN_SECRET; nothing was recorded"
)]
pub struct SecretInput {
    /// The input's external name.
    pub input: String,
}

/// Everything the runtime's operations fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The request was refused; nothing was written.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// A new durable run's input holds a secret; nothing was recorded.
    #[error(transparent)]
    SecretInput(#[from] SecretInput),
    /// A person's answer to a reconcile pause cannot be taken; nothing was written.
    #[error(transparent)]
    Reconcile(Box<crate::durable::reconcile::ReconcileError>),
    /// The graph document is unreadable or malformed.
    #[error(transparent)]
    Graph(#[from] heddle_core::graph::DocError),
    /// Planning refused the graph named `graph`; the source lists every problem.
    #[error("{graph}")]
    Plan {
        /// The graph's path or name.
        graph: String,
        /// Every problem, at once.
        #[source]
        source: heddle_core::plan::ValidationError,
    },
    /// The run store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A run was asked for where there is no run store.
    #[error("no run store at {}", path.display())]
    NoStore {
        /// Where the store would be.
        path: PathBuf,
        /// The run asked for, unknown.
        #[source]
        source: StoreError,
    },
    /// A run's process lock (a watchdog holds it, or a dead one left it).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A stored value (an artifact) is missing, corrupt or over a limit.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The WASM engine would not start.
    #[error("starting the WASM engine")]
    Engine(#[source] Box<heddle_wasm::PackageError>),
    /// A WASM package would not load.
    #[error("loading the WASM packages (first-party and installed in {})", dir.display())]
    Packages {
        /// The package store looked in.
        dir: PathBuf,
        /// Which package, and why.
        #[source]
        source: Box<heddle_wasm::PackageError>,
    },
    /// A package operation outside loading (the package store's lockfile, a listing).
    #[error(transparent)]
    Package(Box<heddle_wasm::PackageError>),
    /// Two providers declare the same node type.
    #[error(transparent)]
    Registry(#[from] heddle_kernel::RegistryError),
    /// A package registry refused, failed, or sent what its digests or signatures do
    /// not vouch for; nothing was installed.
    #[error(transparent)]
    Fetch(Box<heddle_registry::RegistryError>),
    /// The kernel refused the run.
    #[error(transparent)]
    Kernel(#[from] heddle_kernel::KernelError),
    /// A policy file for the supervisor cannot be read or is malformed.
    #[error(transparent)]
    PolicyFile(#[from] heddle_kernel::supervisor::PolicyLoadError),
    /// A policy document for the supervisor is malformed.
    #[error(transparent)]
    Policy(#[from] heddle_kernel::supervisor::PolicyError),
    /// A recorded run's decisions cannot be replayed.
    #[error(transparent)]
    Replay(#[from] heddle_kernel::supervisor::ReplayError),
    /// A file or process operation of the runtime's own (`what` says which).
    #[error("{what}")]
    Io {
        /// What was being done, naming the file or process.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A watchdog's state file is unreadable.
    #[error("{}: unreadable", path.display())]
    StateFile {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: serde_json::Error,
    },
    /// A package a durable run recorded, missing from this machine's package store,
    /// could not be fetched again from its registry (registry away, digest mismatch,
    /// untrusted): said with the run and the package, since whoever reads it (a person
    /// resuming, a server's log) must know which run waits for which package. Nothing
    /// of the run was taken over or written.
    #[error(
        "run {run} uses package {package} ({reference}), which is not installed here and could not be fetched again; the run is left as it was"
    )]
    RunPackage {
        /// The run.
        run: String,
        /// The package's name.
        package: String,
        /// The registry reference it was recorded with.
        reference: String,
        /// Why the fetch failed.
        #[source]
        source: Box<Error>,
    },
    /// A watched run's recorded watchdog limits are unreadable.
    #[error("run {run}: its recorded watchdog limits are unreadable")]
    RecordedLimits {
        /// The run.
        run: String,
        /// What is wrong with them.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// The error whose type says what kind of failure this is: the other crate's error
    /// it carries (a variant that adds context keeps it in its message), else this one.
    /// What a caller classifying errors by type looks at (the command line's exit codes,
    /// the API's statuses).
    pub fn cause(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            Error::Config(e) => e,
            Error::Refused(e) => e,
            Error::SecretInput(e) => e,
            Error::Reconcile(e) => &**e,
            Error::Graph(e) => e,
            Error::Plan { source, .. } => source,
            Error::Store(e) | Error::NoStore { source: e, .. } => e,
            Error::Lock(e) => e,
            Error::Artifact(e) => e,
            Error::Engine(e) | Error::Packages { source: e, .. } | Error::Package(e) => &**e,
            Error::Registry(e) => e,
            Error::Fetch(e) => &**e,
            Error::RunPackage { source, .. } => source.cause(),
            Error::Kernel(e) => e,
            Error::PolicyFile(e) => e,
            Error::Policy(e) => e,
            Error::Replay(e) => e,
            Error::Io { .. } | Error::StateFile { .. } | Error::RecordedLimits { .. } => self,
        }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

impl From<crate::durable::reconcile::ReconcileError> for Error {
    fn from(e: crate::durable::reconcile::ReconcileError) -> Error {
        Error::Reconcile(Box::new(e))
    }
}

impl From<heddle_registry::RegistryError> for Error {
    fn from(e: heddle_registry::RegistryError) -> Error {
        Error::Fetch(Box::new(e))
    }
}

impl From<heddle_wasm::PackageError> for Error {
    fn from(e: heddle_wasm::PackageError) -> Error {
        Error::Package(Box::new(e))
    }
}

/// A result of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;
