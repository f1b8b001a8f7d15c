//! Heddle's durable run store: everything needed to continue a run after its process
//! died, on disk.
//!
//! A run is its exact graph document (bytes and sha256), the plan, the resolved inputs
//! (secrets by name only), the digests of every package it uses, its limits, and an
//! append-only event log of [`Record`]s with gapless per-run sequence numbers and a
//! checksum per record. The kernel never sees this crate: it writes through its journal
//! seam, and [`RunStore`] is the seam below: [`SqliteStore`] (one file, one host) and
//! [`PgStore`] (one database, several hosts, [`Fleet`]) implement it, and [`open`] picks
//! one from a [`StoreLocation`].

pub mod artifacts;
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
pub mod budget;
mod clock;
mod codec;
mod error;
#[doc(hidden)]
pub mod fault;
pub mod fleet;
pub mod header;
mod journal;
pub mod lease;
mod limits;
pub mod location;
pub mod lock;
pub mod log;
pub mod postgres;
mod rows;
mod schema;
pub mod secrets;
pub mod session;
pub mod spill;
mod sqlite;
pub mod status;

use std::collections::BTreeMap;

use heddle_core::{PlanSummary, Record, Value};
use serde::{Deserialize, Serialize};

pub use budget::{Budget, Exhausted, Spent};
pub use error::StoreError;
pub use fleet::Fleet;
/// Where a run's package came from (see [`PackagePin`]).
pub use heddle_core::package::PackageSource;
pub use journal::{DiedAttempt, DurableJournal, died_attempts};
pub use limits::{RunLimits, SuperviseMode, WatchdogLimits};
pub use location::{Store, StoreLocation, open};
pub use log::{LogCounters, RunLog, SyncWait};
pub use postgres::{PgOptions, PgStore};
pub use rows::Frames;
pub use schema::Upgrade;
pub use sqlite::SqliteStore;
pub use status::{RunState, RunView};

/// Where the store lives unless `[store] path` says otherwise (relative to the working
/// directory).
pub const DEFAULT_PATH: &str = ".heddle/runs.db";

/// Everything recorded when a run is created; resume uses exactly this, never the
/// mutable command line or files on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewRun {
    /// The graph path as the user gave it (for display only).
    pub graph_name: String,
    /// The graph document's exact bytes.
    pub graph_bytes: Vec<u8>,
    /// What the plan was (for inspection, the packages and kinds of node the run uses,
    /// and the nodes a finished run never ran).
    pub plan: PlanSummary,
    /// Resolved input values. Never secret values: see `secrets`.
    pub inputs: BTreeMap<String, Value>,
    /// Names of secrets the run may use; values are looked up again on every start.
    pub secrets: Vec<String>,
    /// Every package the run uses, by package name: its component's sha256 and, for a
    /// package fetched from a registry, where exactly (so another machine can fetch the
    /// same bytes).
    pub packages: BTreeMap<String, PackagePin>,
    /// Run limits and budgets (node timeout, dispatch budget, run time limit, …).
    pub limits: RunLimits,
}

/// A package a durable run uses. Stored as the bare sha256 when it did not come from a
/// registry (the form every run recorded before registries), else as
/// `{"sha256": …, "source": {…}}`; both are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackagePin {
    /// sha256 (hex) of the component.
    pub sha256: String,
    /// Where it was fetched from, when it came from a registry.
    pub source: Option<PackageSource>,
}

impl PackagePin {
    /// A package added from a directory: its digest only.
    pub fn digest(sha256: impl Into<String>) -> PackagePin {
        PackagePin {
            sha256: sha256.into(),
            source: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PinForm {
    Digest(String),
    Full {
        sha256: String,
        #[serde(default)]
        source: Option<PackageSource>,
    },
}

impl Serialize for PackagePin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.source {
            None => s.serialize_str(&self.sha256),
            Some(_) => PinForm::Full {
                sha256: self.sha256.clone(),
                source: self.source.clone(),
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for PackagePin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match PinForm::deserialize(d)? {
            PinForm::Digest(sha256) => PackagePin {
                sha256,
                source: None,
            },
            PinForm::Full { sha256, source } => PackagePin { sha256, source },
        })
    }
}

/// A stored run's fixed part, as created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunHeader {
    pub run_id: String,
    /// Milliseconds since the Unix epoch when the run was created.
    pub created_ms: u64,
    /// sha256 (hex) of `run.graph_bytes`.
    pub graph_sha256: String,
    #[serde(flatten)]
    pub run: NewRun,
}

/// One record as stored: its sequence number (gapless from 0 per run) and when it was
/// written (store clock, informational; order comes from `seq`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    pub seq: u64,
    pub at_ms: u64,
    #[serde(flatten)]
    pub record: Record,
}

/// A run's log as read back.
#[derive(Clone, Debug, Default)]
pub struct LogRead {
    pub records: Vec<Stored>,
    /// The last record failed its checksum (a write torn by a crash): it is treated as
    /// absent, and the next append overwrites its sequence number.
    pub torn_tail: Option<u64>,
}

/// A run in a listing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: String,
    pub created_ms: u64,
    pub graph_name: String,
    /// Records in the log.
    pub records: u64,
}

/// Transactions a store handle committed ([`RunStore::commits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Commits {
    /// Transactions committed.
    pub commits: u64,
    /// Of those, commits that waited for stable storage (an fsync each; a commit that
    /// several writers shared counts once).
    pub synced: u64,
}

impl Commits {
    /// What was committed between `earlier` and `self`.
    pub fn since(self, earlier: Commits) -> Commits {
        Commits {
            commits: self.commits.saturating_sub(earlier.commits),
            synced: self.synced.saturating_sub(earlier.synced),
        }
    }
}

/// A durable run store. Implementations keep each run's log gapless and fenced: an
/// append succeeds only at the next sequence number and only for the current owner's
/// epoch, so a stale process can never interleave with the one that took over.
pub trait RunStore: Send + Sync {
    /// Records a new run and returns its header (with a fresh run id).
    fn create_run(&self, run: &NewRun) -> Result<RunHeader, StoreError>;

    /// The fixed part of a run, verified ([`header::verify`]): a field that does not
    /// match its checksum is [`StoreError::HeaderCorrupt`].
    fn header(&self, run_id: &str) -> Result<RunHeader, StoreError>;

    /// Every run, oldest first.
    fn list(&self) -> Result<Vec<RunSummary>, StoreError>;

    /// Takes ownership of a run for writing: raises its owner epoch and returns it.
    /// Appends under an older epoch are refused from then on.
    fn acquire(&self, run_id: &str) -> Result<u64, StoreError>;

    /// Takes a run over as the one taker that wins: in one transaction, only if its log
    /// still ends before `next` (the state the caller checked), raises its owner epoch and
    /// appends `opening(epoch)` (synced), the new owner's first records. Of several
    /// concurrent takers that checked the same state exactly one gets here; the others
    /// get [`StoreError::NotNext`] and change nothing (neither epoch nor log), so a loser
    /// never fences the winner out. Every take-over (resume, approve, cancel, a worker's,
    /// a server's) goes through this one check.
    ///
    /// A take-over whose records reopen a pause ([`withdraws_cancel`]: a person resumed
    /// it) withdraws any cancel request in the same transaction: one made before the
    /// pause was for the owner that paused, and the person's resume is the later word
    /// (a `heddle runs cancel` killed after asking once cancelled the resumed run).
    fn take_over(
        &self,
        run_id: &str,
        next: u64,
        opening: &dyn Fn(u64) -> Vec<Record>,
    ) -> Result<u64, StoreError>;

    /// Records a new run and takes it as its first owner: the run, its owner epoch and
    /// `opening(epoch)` (its first records), durable when this returns. The header and the
    /// epoch its log writes under. A store that can do both in one transaction does
    /// (one synced commit per new run instead of two); the default creates the run, then
    /// takes it over ([`RunStore::create_run`], [`RunStore::take_over`]). Either way
    /// nobody else can have taken a run that did not exist a moment before.
    fn create_and_take(
        &self,
        run: &NewRun,
        opening: &dyn Fn(u64) -> Vec<Record>,
    ) -> Result<(RunHeader, u64), StoreError> {
        let header = self.create_run(run)?;
        let epoch = self.take_over(&header.run_id, 0, opening)?;
        Ok((header, epoch))
    }

    /// What this handle has committed so far, where the store counts it (a store file:
    /// every transaction of its writing connection); `None` where it does not. What a
    /// bench divides by the runs it made.
    fn commits(&self) -> Option<Commits> {
        None
    }

    /// Asks whoever owns the run to cancel it (synced): the one way another process
    /// cancels a run a live process owns, whose log only that owner may write. The
    /// owner's driver polls [`RunStore::cancel_requested`] and cancels the run as a
    /// cancel of its own would (recorded, then ended). Asking twice is asking once.
    fn request_cancel(&self, run_id: &str) -> Result<(), StoreError>;

    /// Whether a cancel of the run was requested ([`RunStore::request_cancel`]).
    fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError>;

    /// What says whether the process that last took the run still drives it: a store
    /// file's runs are driven by processes of its machine ([`status::Liveness::Process`],
    /// the default); a store several hosts share answers from the run's lease.
    fn liveness(&self, _run_id: &str) -> Result<status::Liveness, StoreError> {
        Ok(status::Liveness::Process)
    }

    /// Gives up this handle's hold on the run it took at `epoch`, once it wrote its last
    /// record for now (an ending, a pause): on a store several hosts share the run's
    /// lease goes idle at once, so a person's resume or another host never waits for it
    /// to expire. A store file's runs have nothing to give up (the default).
    fn let_go(&self, _run_id: &str, _epoch: u64) -> Result<(), StoreError> {
        Ok(())
    }

    /// Appends the encoded records `frames` (of the run and from the sequence number they
    /// name) in one transaction. Refused unless their first is the next sequence number
    /// and `epoch` the current owner's. With `sync` the records (and everything before
    /// them) are on stable storage when this returns; without, they may be lost to a
    /// power failure but never reordered or half-written.
    fn append_frames(&self, epoch: u64, frames: &Frames, sync: bool) -> Result<(), StoreError>;

    /// [`RunStore::append_frames`] of `records` at `first_seq..` of `run_id`'s log.
    fn append(
        &self,
        run_id: &str,
        epoch: u64,
        first_seq: u64,
        records: &[Record],
        sync: bool,
    ) -> Result<(), StoreError> {
        self.append_frames(epoch, &Frames::of(run_id, first_seq, records)?, sync)
    }

    /// The run's log from sequence number `from` on, every record's checksum verified.
    /// Large values are references ([`spill`]); [`spill::resolve`] reads them back.
    fn read(&self, run_id: &str, from: u64) -> Result<LogRead, StoreError>;

    /// The records that decide a run's state (opened, paused, resumed, finished:
    /// [`status::LIFECYCLE`]), in order, each checksum verified, a torn last record left
    /// out as [`RunStore::read`] leaves it out. What a listing folds: listing many long
    /// runs then reads a few records per run, not every invocation's.
    fn read_lifecycle(&self, run_id: &str) -> Result<Vec<Stored>, StoreError>;

    /// Stores `bytes` as an artifact of `run_id` under `policy` (once per content) and,
    /// with `name`, points that name at them.
    fn put_artifact(
        &self,
        run_id: &str,
        name: Option<&str>,
        bytes: &[u8],
        policy: &artifacts::ArtifactPolicy,
    ) -> Result<artifacts::ArtifactRef, artifacts::ArtifactError>;

    /// Deletes the artifacts of `run_id` that no name keeps and `referenced` does not
    /// hold; returns the bytes freed. [`spill::sweep`] is the caller: it decides what
    /// is referenced from the stored log.
    fn drop_unreferenced_artifacts(
        &self,
        run_id: &str,
        referenced: &spill::Referenced,
    ) -> Result<u64, StoreError>;

    /// The names of `run_id`'s artifacts (a final report) and what each points at.
    fn named_artifacts(
        &self,
        run_id: &str,
    ) -> Result<Vec<(String, artifacts::ArtifactRef)>, StoreError>;

    /// Piece `index` (from 0) of an artifact of `run_id` as stored: its bytes are kept
    /// in pieces of [`artifacts::PIECE_BYTES`] (the last one shorter), so a reader holds
    /// one piece at a time and no statement or transaction stays open between pieces.
    /// Not verified: [`artifacts::ArtifactReader`] reads the pieces in order and checks
    /// the digest before it hands out the last. `None` past the end, or for an artifact
    /// that is not stored.
    fn artifact_piece(
        &self,
        run_id: &str,
        sha256: &str,
        index: u64,
    ) -> Result<Option<Vec<u8>>, StoreError>;

    /// What is stored of artifact `sha256` of `run_id` (its recorded size, and the
    /// length of its stored pieces), read without its bytes; `None` when it is not
    /// stored.
    fn stored_artifact(
        &self,
        run_id: &str,
        sha256: &str,
    ) -> Result<Option<artifacts::StoredArtifact>, StoreError>;

    /// [`RunStore::stored_artifact`] of every artifact of `run_id`, read without their
    /// bytes: what a display checks to list missing or damaged values without reading
    /// them back.
    fn stored_artifacts(&self, run_id: &str) -> Result<Vec<artifacts::StoredArtifact>, StoreError>;

    /// The bytes of an artifact of `run_id`, verified against its digest: every piece,
    /// in order ([`artifacts::ArtifactReader`]).
    fn get_artifact(
        &self,
        run_id: &str,
        artifact: &artifacts::ArtifactRef,
    ) -> Result<Vec<u8>, artifacts::ArtifactError> {
        let mut reader = artifacts::ArtifactReader::open(self, run_id, &artifact.sha256)?;
        let mut out = Vec::with_capacity(reader.artifact().size.min(1 << 30) as usize);
        while let Some(piece) = reader.next_piece(self)? {
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }

    /// The artifact `name` of `run_id` points at, if any.
    fn named_artifact(
        &self,
        run_id: &str,
        name: &str,
    ) -> Result<Option<artifacts::ArtifactRef>, artifacts::ArtifactError> {
        Ok(self
            .named_artifacts(run_id)?
            .into_iter()
            .find_map(|(n, a)| (n == name).then_some(a)))
    }
}

/// Whether a take-over's `opening` records reopen a pause (a person's resume, approval
/// or answer): then the cancel requests made before it are withdrawn with it
/// ([`RunStore::take_over`]). A recovery of a run whose owner died keeps them: the
/// cancel was asked of a run that was running, and nobody decided anything since.
pub fn withdraws_cancel(opening: &[Record]) -> bool {
    opening.iter().any(|r| matches!(r, Record::Resumed { .. }))
}

/// sha256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    artifacts::hex(&sha2::Sha256::digest(bytes))
}
