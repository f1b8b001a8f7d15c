//! Exit codes, and the one place that decides which error means which code.
//!
//! Scripts branch on these, so they are part of the interface and documented in the
//! README: a run that completed (0), failed (1), was refused before it started because
//! the graph or the command line was wrong (2), was cancelled (3) or suspended (4).

use heddle_core::graph::DocError;
use heddle_core::plan::{InputErrors, ValidationError};

pub use heddle_runtime::Exit;

/// A mistake in what the user asked for (bad `--input`, missing input value, missing
/// file, bad config), as opposed to a failure while doing it. Maps to [`Exit::Invalid`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct UsageError {
    pub message: String,
}

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        UsageError {
            message: message.into(),
        }
    }
}

pub use heddle_runtime::streams::StreamLineError;

pub use heddle_core::text::{ERROR_LINE_MAX_CHARS, bounded};

/// Shorthand for returning a [`UsageError`] from a function returning `anyhow::Result`.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        ::anyhow::Error::from($crate::exit::UsageError::new(format!($($arg)*)))
    };
}

/// The exit code for an error that ended a command. Looks through the whole chain of
/// causes, so a context message wrapped around a validation error still exits 2.
pub fn classify(err: &anyhow::Error) -> Exit {
    err.chain().find_map(class_of).unwrap_or(Exit::Failed)
}

/// The exit code `cause` decides, if it is one that decides one; a runtime error is
/// judged by the error it carries.
fn class_of(cause: &(dyn std::error::Error + 'static)) -> Option<Exit> {
    let cause = match cause.downcast_ref::<heddle_runtime::Error>() {
        Some(e) => e.cause(),
        None => cause,
    };
    if cause.is::<UsageError>()
        || cause.is::<StreamLineError>()
        || cause.is::<DocError>()
        || cause.is::<ValidationError>()
        || cause.is::<InputErrors>()
        || cause.is::<toml::de::Error>()
        || cause.is::<heddle_kernel::supervisor::PolicyError>()
        || cause.is::<heddle_kernel::supervisor::PolicyLoadError>()
        || cause.is::<heddle_kernel::supervisor::ReplayError>()
        || cause.is::<heddle_runtime::ConfigError>()
        || cause.is::<heddle_runtime::Refused>()
        || cause.is::<heddle_runtime::SecretInput>()
        || cause.is::<heddle_runtime::inputs::InputArgError>()
        || cause.is::<heddle_runtime::durable::reconcile::ReconcileError>()
    {
        return Some(Exit::Invalid);
    }
    if let Some(p) = cause.downcast_ref::<heddle_wasm::PackageError>() {
        // A package the user pointed at that is not one, or a name not installed:
        // a mistake in the request. Changed bytes and engine trouble are failures,
        // decided here whatever their causes are (a malformed lockfile's TOML error
        // does not make it the user's request).
        return Some(if p.is_bad_request() {
            Exit::Invalid
        } else {
            Exit::Failed
        });
    }
    if let Some(r) = cause.downcast_ref::<heddle_registry::RegistryError>() {
        use heddle_registry::ErrorClass as C;
        return Some(match r.class() {
            C::BadRequest => Exit::Invalid,
            C::Registry => Exit::Registry,
            C::Integrity => Exit::Integrity,
            C::Local => Exit::Failed,
        });
    }
    if let Some(b) = cause.downcast_ref::<heddle_package_build::BuildError>() {
        return Some(if b.is_bad_request() {
            Exit::Invalid
        } else {
            Exit::Failed
        });
    }
    if let Some(t) = cause.downcast_ref::<heddle_server::token::TokenError>() {
        // A token file others can read, or that is not a whole token: the operator's
        // to correct before the server starts.
        return Some(if t.is_bad_file() {
            Exit::Invalid
        } else {
            Exit::Failed
        });
    }
    if let Some(l) = cause.downcast_ref::<heddle_store::lock::LockError>() {
        use heddle_store::lock::LockError as L;
        return Some(match l {
            L::Locked { .. } | L::Stale { .. } | L::OwnerAlive { .. } => Exit::Locked,
            L::NotLocked { .. } => Exit::Invalid,
            L::Io { .. } => Exit::Failed,
        });
    }
    if let Some(s) = cause.downcast_ref::<heddle_store::StoreError>() {
        if s.is_bad_store() {
            return Some(Exit::Store);
        }
        if s.is_damaged_run() {
            return Some(Exit::Damaged);
        }
        if s.is_bad_request() {
            return Some(Exit::Invalid);
        }
    }
    if let Some(k) = cause.downcast_ref::<heddle_kernel::KernelError>() {
        use heddle_kernel::KernelError as K;
        if matches!(
            k,
            K::Invalid(_) | K::Inputs(_) | K::Input(_) | K::NotStreaming(_)
        ) {
            return Some(Exit::Invalid);
        }
    }
    None
}
