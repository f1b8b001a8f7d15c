//! What can go wrong with a run store. Every variant names the file or the run (and
//! record) it is about, and keeps the underlying error as its source.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: not a Heddle run store: the file is not an SQLite database, or it is corrupt", path.display())]
    NotADatabase {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: not a Heddle run store: a foreign SQLite database (application id {found:#x})", path.display())]
    Foreign { path: PathBuf, found: i64 },
    #[error(
        "{}: the run store has schema version {found}, newer than this heddle supports ({supported}); use a newer heddle",
        path.display()
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{}: cannot open the run store", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: cannot create the run store's directory", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no run `{0}` in the run store")]
    UnknownRun(String),
    #[error(
        "run {run}: record {seq} is corrupt ({detail}); the run is quarantined, nothing was run"
    )]
    Corrupt {
        run: String,
        seq: u64,
        detail: String,
    },
    /// A field of the run's stored header (graph document, plan, inputs, limits, …) does
    /// not match its checksum (see [`crate::header`]).
    #[error(
        "run {run}: the stored run is damaged: its `{field}` is not as recorded ({detail}); the run is quarantined, nothing was run or changed; RUN_DAMAGED"
    )]
    HeaderCorrupt {
        run: String,
        field: String,
        detail: String,
    },
    #[error("run {run}: the event log has a gap: expected record {expected}, found {found}")]
    Gap {
        run: String,
        expected: u64,
        found: u64,
    },
    #[error(
        "run {run}: append at record {seq} refused: the next record is {next} (another process appended)"
    )]
    NotNext { run: String, seq: u64, next: u64 },
    #[error(
        "run {run}: another process took the run over (owner epoch {current}, this process holds {ours}); this process stops writing"
    )]
    Fenced {
        run: String,
        ours: u64,
        current: u64,
    },
    #[error("run store: {op}")]
    Sql {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("run {run}: cannot encode record {seq}")]
    Encode {
        run: String,
        seq: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error("run {run}: stored {what} is unreadable")]
    Decode {
        run: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("run {run} is {state}: only a paused or interrupted run can be resumed")]
    NotResumable { run: String, state: &'static str },
    #[error("run {run} is live (owner process {pid}); stop it first or wait for it")]
    Live { run: String, pid: u32 },
    /// Another taker won the run between this one's check and its take-over (see
    /// [`crate::RunStore::take_over`]); nothing of this one was written.
    #[error(
        "run {run} was taken over by another process while this one prepared to (it is now {now}); nothing was changed"
    )]
    TakenOver { run: String, now: String },
    #[error("run {run}: Resume expected pause event \"{expected}\" but found \"{found}\"")]
    PauseMismatch {
        run: String,
        expected: String,
        found: String,
    },
    #[error(
        "run {run}: package {package} changed since the run started (recorded sha256 {recorded}, now {current}); resume refuses to run different code"
    )]
    PackageChanged {
        run: String,
        package: String,
        recorded: String,
        current: String,
    },
    #[error("run {run} uses package {package} {what}")]
    PackageMissing {
        run: String,
        package: String,
        /// Its digest, which package store lacks it, and what installs those bytes.
        what: String,
    },
    #[error("run {run} has already ended ({state}); nothing to cancel")]
    AlreadyEnded { run: String, state: &'static str },
    #[error(
        "{}: the run store is owned by {owner}; send runs to its API instead: {}/api/runs",
        path.display(), owner.api
    )]
    Owned {
        path: PathBuf,
        owner: Box<crate::lease::Owner>,
    },
    #[error(
        "{}: this process lost the run store's owner lease (epoch {epoch}): {why}; it stops writing",
        path.display()
    )]
    LeaseLost {
        path: PathBuf,
        epoch: u64,
        why: String,
    },
    /// A `postgres://` URL that cannot be used (`url` has its password masked).
    #[error("run store URL `{url}` is not usable: {detail}")]
    BadUrl { url: String, detail: String },
    /// The PostgreSQL server said no, or could not be reached, when the store opened.
    #[error("{target}: cannot open the run store: {why}")]
    Connect {
        target: String,
        why: crate::postgres::ConnectFailure,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The schema the store uses holds something that is not a Heddle run store.
    #[error(
        "{target}: schema `{schema}` is not a Heddle run store ({detail}); nothing was changed. Point [store] url at another database, or give Heddle a schema of its own"
    )]
    ForeignSchema {
        target: String,
        schema: String,
        detail: String,
    },
    #[error(
        "{target}: the run store (schema `{schema}`) has schema version {found}, newer than this heddle supports ({supported}); use a newer heddle"
    )]
    NewerPgSchema {
        target: String,
        schema: String,
        found: i64,
        supported: i64,
    },
    /// A PostgreSQL statement failed for a reason other than the connection.
    #[error("run store: {op}")]
    Pg {
        op: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The database could not be reached while doing `op` (connection refused or lost,
    /// or no answer within the store's operation timeout). Nothing was reported
    /// written: an append that failed so may or may not have committed, and a retry of
    /// the same records finds out ([`crate::RunStore::append_frames`]).
    #[error("{target}: the run store is unreachable while {op}")]
    Unavailable {
        target: String,
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another live host registered under the same id.
    #[error(
        "{target}: host id `{host_id}` is taken by a live host (process {pid} on {hostname}, lease for {left_ms} ms more); give each host its own id"
    )]
    HostIdTaken {
        target: String,
        host_id: String,
        hostname: String,
        pid: u32,
        left_ms: u64,
    },
    /// This host's registration expired or was taken by another process with the same
    /// id: it must stop claiming and driving runs.
    #[error("{target}: host `{host_id}` is no longer registered ({why}); it stops claiming runs")]
    HostLost {
        target: String,
        host_id: String,
        why: String,
    },
    /// The run's lease is held by another live host.
    #[error(
        "run {run} is owned by host `{host}` (lease epoch {epoch}, {left_ms} ms left); send the request to a host's API, or wait for the lease to expire"
    )]
    RunOwned {
        run: String,
        host: String,
        epoch: u64,
        left_ms: u64,
    },
    /// The run's lease this process held expired (no renewal in time) or went to another
    /// host: nothing more of it is written.
    #[error("run {run}: this process's lease (epoch {epoch}) is lost: {why}; it stops writing")]
    RunLeaseLost {
        run: String,
        epoch: u64,
        why: String,
    },
    #[error("no command {0} in the run store")]
    UnknownCommand(u64),
    /// A synced write's commit, which it shared with other writes queued at the same
    /// time, failed: none of them is stored.
    #[error("{op}: the commit it shared with other writes failed: {message}")]
    GroupCommit { op: &'static str, message: String },
    #[error("the run log stopped writing after an error")]
    WriterStopped(#[source] std::sync::Arc<StoreError>),
    #[error("the run log writer is gone (the log was closed)")]
    WriterClosed,
    /// A value the log refers to could not be stored or read back.
    #[error(transparent)]
    Artifact(Box<crate::artifacts::ArtifactError>),
}

impl StoreError {
    /// The code a report carries when there is one (`TERMINAL_ARTIFACT`, …).
    pub fn code(&self) -> Option<&'static str> {
        match self {
            StoreError::Artifact(e) => Some(e.code()),
            _ => None,
        }
    }

    pub(crate) fn sql(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |source| StoreError::Sql { op, source }
    }

    /// The store file itself cannot be used (corrupt, foreign, too new): a problem with
    /// what the user pointed at rather than with a run.
    /// The request named something that is not there or not in the right state (an
    /// unknown run, a run that is not paused, the wrong pause): a mistake in what was
    /// asked, refused before anything was written.
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            StoreError::UnknownRun(_)
                | StoreError::UnknownCommand(_)
                | StoreError::NotResumable { .. }
                | StoreError::Live { .. }
                | StoreError::TakenOver { .. }
                | StoreError::Owned { .. }
                | StoreError::PauseMismatch { .. }
                | StoreError::AlreadyEnded { .. }
                | StoreError::RunOwned { .. }
                | StoreError::PackageMissing { .. }
        )
    }

    /// A stored run failed its checks (its header or a record does not match its
    /// checksum, its log has a gap): quarantined, nothing of it runs.
    pub fn is_damaged_run(&self) -> bool {
        matches!(
            self,
            StoreError::HeaderCorrupt { .. } | StoreError::Corrupt { .. } | StoreError::Gap { .. }
        )
    }

    /// The store could not be reached for a moment (a dropped connection, a server
    /// restarting, no answer in time): the same call may succeed later. Everything else
    /// is final.
    /// This process no longer owns the run it was writing: another took it over (a
    /// higher epoch) or its lease expired unrenewed. Nothing more of the run is written
    /// by this process; its owner (if any) is someone else.
    pub fn is_lost_lease(&self) -> bool {
        match self {
            StoreError::Fenced { .. } | StoreError::RunLeaseLost { .. } => true,
            StoreError::WriterStopped(e) => e.is_lost_lease(),
            _ => false,
        }
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    pub fn is_bad_store(&self) -> bool {
        matches!(
            self,
            StoreError::NotADatabase { .. }
                | StoreError::Foreign { .. }
                | StoreError::NewerSchema { .. }
                | StoreError::BadUrl { .. }
                | StoreError::Connect { .. }
                | StoreError::ForeignSchema { .. }
                | StoreError::NewerPgSchema { .. }
                | StoreError::HostIdTaken { .. }
        )
    }
}
