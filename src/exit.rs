//! Exit codes, and the one place that decides which error means which code.
//!
//! Scripts branch on these, so they are part of the interface and documented in the
//! README: a run that completed (0), failed (1), was refused before it started because
//! the graph or the command line was wrong (2), was cancelled (3) or suspended (4).

use std::process::ExitCode;

use heddle_core::RunStatus;
use heddle_core::graph::DocError;
use heddle_core::plan::{InputErrors, ValidationError};

/// What a `heddle` invocation ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The run completed, or the command did what it was asked.
    Ok = 0,
    /// The run failed, or the command could not do what it was asked (a package whose
    /// bytes changed, an engine that would not start).
    Failed = 1,
    /// Nothing was run: the graph is invalid or unreadable, an input value is missing
    /// or malformed, or the command line is wrong. Same code clap uses for usage errors.
    Invalid = 2,
    /// The run was cancelled (Ctrl-C).
    Cancelled = 3,
    /// The run suspended, waiting for something outside it (human in the loop), or a
    /// durable run paused (resume it with `heddle runs resume`).
    Suspended = 4,
    /// The run store cannot be used: corrupt, not a Heddle run store, or written by a
    /// newer Heddle. Nothing was changed in it.
    Store = 5,
    /// A supervised run was stopped by one of its watchdog's limits (run time, restarts,
    /// worker output), or a durable run's budget ran out (dispatch budget, run time
    /// limit; the run ended failed); the report's `code` or the message says which.
    Limit = 6,
    /// Another watchdog supervises the run, or a dead one left its lock
    /// (`heddle runs unlock`). Nothing was started.
    Locked = 7,
    /// A supervised run's worker left processes or containers the watchdog could not
    /// remove; no further worker was started and the lock is kept.
    Teardown = 8,
    /// A stored run is damaged: a field of its header (graph document, plan, inputs,
    /// limits, package digests) or a record of its log fails its checksum, or the log
    /// has a gap (`RUN_DAMAGED`). The run is quarantined: nothing of it was run, nothing
    /// was changed.
    Damaged = 9,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn for_status(status: RunStatus) -> Exit {
        match status {
            RunStatus::Completed => Exit::Ok,
            RunStatus::Failed | RunStatus::Running => Exit::Failed,
            RunStatus::Cancelled => Exit::Cancelled,
            RunStatus::Suspended => Exit::Suspended,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

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

/// A line of `--stream` input the run could not take; the run is stopped (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("--stream {name}: line {line}: {problem}; the run was stopped")]
pub struct StreamLineError {
    pub(crate) name: String,
    pub(crate) line: u64,
    pub(crate) problem: String,
}

/// Longest line of an error the CLI prints. Errors quote what the user wrote (node ids,
/// handles, values); a 10 MB id must not make a 10 MB error, whichever library wrote it.
pub const ERROR_LINE_MAX_CHARS: usize = 2000;

/// `text` with every line clipped to [`ERROR_LINE_MAX_CHARS`].
pub fn bounded(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(1 << 16));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&heddle_core::text::clip(line, ERROR_LINE_MAX_CHARS));
    }
    out
}

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
    for cause in err.chain() {
        if cause.is::<UsageError>()
            || cause.is::<StreamLineError>()
            || cause.is::<DocError>()
            || cause.is::<ValidationError>()
            || cause.is::<InputErrors>()
            || cause.is::<toml::de::Error>()
            || cause.is::<heddle_kernel::supervisor::PolicyError>()
            || cause.is::<heddle_kernel::supervisor::PolicyLoadError>()
            || cause.is::<heddle_kernel::supervisor::ReplayError>()
        {
            return Exit::Invalid;
        }
        if let Some(p) = cause.downcast_ref::<heddle_wasm::PackageError>() {
            // A package the user pointed at that is not one, or a name not installed:
            // a mistake in the request. Changed bytes and engine trouble are failures,
            // decided here whatever their causes are (a malformed lockfile's TOML error
            // does not make it the user's request).
            return if p.is_bad_request() {
                Exit::Invalid
            } else {
                Exit::Failed
            };
        }
        if let Some(l) = cause.downcast_ref::<heddle_store::lock::LockError>() {
            use heddle_store::lock::LockError as L;
            return match l {
                L::Locked { .. } | L::Stale { .. } | L::OwnerAlive { .. } => Exit::Locked,
                L::NotLocked { .. } => Exit::Invalid,
                L::Io { .. } => Exit::Failed,
            };
        }
        if let Some(s) = cause.downcast_ref::<heddle_store::StoreError>() {
            if s.is_bad_store() {
                return Exit::Store;
            }
            if s.is_damaged_run() {
                return Exit::Damaged;
            }
            if s.is_bad_request() {
                return Exit::Invalid;
            }
        }
        if let Some(k) = cause.downcast_ref::<heddle_kernel::KernelError>() {
            use heddle_kernel::KernelError as K;
            if matches!(
                k,
                K::Invalid(_) | K::Inputs(_) | K::Input(_) | K::NotStreaming(_)
            ) {
                return Exit::Invalid;
            }
        }
    }
    Exit::Failed
}
