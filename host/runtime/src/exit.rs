//! Exit codes: what a `heddle` process ends with, documented in the README because
//! scripts branch on them. They live in the library because they are also a protocol
//! between processes: a watchdog reads its worker's exit code ([`crate::watch`]) and
//! reports the same codes an unwatched run would.

use std::process::ExitCode;

use heddle_core::RunStatus;

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
    /// A watched run was stopped by one of its watchdog's limits (run time, restarts,
    /// worker output), or a durable run's budget ran out (dispatch budget, run time
    /// limit; the run ended failed); the report's `code` or the message says which.
    Limit = 6,
    /// Another watchdog supervises the run, or a dead one left its lock
    /// (`heddle runs unlock`). Nothing was started.
    Locked = 7,
    /// A watched run's worker left processes or containers the watchdog could not
    /// remove; no further worker was started and the lock is kept.
    Teardown = 8,
    /// A stored run is damaged: a field of its header (graph document, plan, inputs,
    /// limits, package digests) or a record of its log fails its checksum, or the log
    /// has a gap (`RUN_DAMAGED`). The run is quarantined: nothing of it was run, nothing
    /// was changed.
    Damaged = 9,
    /// A package registry could not be used: unreachable, too slow, credentials
    /// refused, the package not there, or an answer that is not the OCI distribution
    /// protocol. Nothing was installed.
    Registry = 10,
    /// A fetched package is not what it claims to be: a digest that does not match its
    /// bytes, or a signature missing, untrusted or over other bytes. Nothing was
    /// installed.
    Integrity = 11,
}

impl Exit {
    /// The process exit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The code of a run that ended with `status` (a run still running when it was
    /// reported failed).
    pub fn for_status(status: RunStatus) -> Exit {
        match status {
            RunStatus::Completed => Exit::Ok,
            RunStatus::Failed | RunStatus::Running => Exit::Failed,
            RunStatus::Cancelled => Exit::Cancelled,
            RunStatus::Suspended => Exit::Suspended,
        }
    }
}

impl Exit {
    /// The exit a process's code `code` stands for (anything unknown is a failure): how
    /// a watchdog reads its worker's exit.
    pub fn from_code(code: i32) -> Exit {
        match code {
            0 => Exit::Ok,
            2 => Exit::Invalid,
            3 => Exit::Cancelled,
            4 => Exit::Suspended,
            5 => Exit::Store,
            6 => Exit::Limit,
            7 => Exit::Locked,
            8 => Exit::Teardown,
            9 => Exit::Damaged,
            10 => Exit::Registry,
            11 => Exit::Integrity,
            _ => Exit::Failed,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}
