//! Ownership of runs among hosts sharing one store: leases, claims, hosts, commands and
//! wake-ups. The PostgreSQL store implements it for any number of hosts; the SQLite store
//! for the one host that owns its file.
//!
//! The rules (README, "Several hosts"):
//!
//! - **One owner per run.** A run's lease row names its owner host, an owner epoch and
//!   an expiry on the store's clock (never a host's). Taking a run (a claim, or
//!   [`crate::RunStore::acquire`]) raises the epoch; only the owner's epoch may append.
//! - **Fenced.** Every append checks the epoch and the expiry in its own transaction: a
//!   host that lost a run (paused past the TTL, partitioned, slow) never writes another
//!   record of it, even before another host takes it.
//! - **Renewed every third of the TTL** ([`Fleet::heartbeat`], which the PostgreSQL store
//!   runs by itself unless told not to), in one statement for all the host's runs. A
//!   renewal that finds a lease gone reports it lost ([`LostLease`]); the owner stops
//!   driving that run. One that could not reach the database is tried again within a
//!   second ([`renewal_retry`]), and a lease that expired meanwhile says so.
//! - **Expiry means claimable.** A run whose lease expired is claimed by the next host
//!   that asks ([`Fleet::claim`]), which continues it from its log; hosts that died are
//!   found this way, with no detector of their own.
//! - **Queued work** is claimed with `FOR UPDATE SKIP LOCKED`, so hosts claiming at once
//!   never wait for each other and never get the same run.
//! - **No run is stranded.** A run given back without an ending is queued
//!   ([`GiveBack::Queued`]), at once or, when taking it failed, after a pause that grows
//!   while it keeps failing ([`take_retry`]); only one that waits for a person (paused,
//!   its log damaged) is left idle. An idle run without an ending is never claimed.
//! - **Commands** (cancel, resume, answers) are rows any host writes without the lease;
//!   the owner carries each out and records its outcome.
//! - **Wake-ups** ([`Fleet::subscribe`]) say when to look again; they may be lost (a
//!   dropped listening connection says [`Wake::Missed`]), so a host polls as well.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::StoreError;

/// The first and the longest pause before a renewal that failed is tried again.
const RENEWAL_RETRY_FIRST: Duration = Duration::from_millis(100);
const RENEWAL_RETRY_MAX: Duration = Duration::from_secs(1);

/// The pause before the next renewal after one that failed to reach the database:
/// `last` is the pause before the failed one when it was a retry too (renewals every
/// `period`). From 100 ms, doubling, at most 1 s (or `period` when shorter). Waiting a
/// whole period after a failure loses a lease to an outage shorter than its TTL (one
/// that spans two renewals: a crash recovery under load took 6 s of a 10 s TTL);
/// retried so, a lease outlives an outage of up to two thirds of its TTL less a second.
pub fn renewal_retry(last: Option<Duration>, period: Duration) -> Duration {
    let max = RENEWAL_RETRY_MAX.min(period);
    match last {
        None => RENEWAL_RETRY_FIRST.min(max),
        Some(last) => (last * 2).min(max),
    }
}

/// The first and the longest pause before a run whose take failed is claimable again.
const TAKE_RETRY_FIRST: Duration = Duration::from_secs(1);
const TAKE_RETRY_MAX: Duration = Duration::from_secs(60);

/// The pause before a run is claimable again after the `failures`-th take of it failed in
/// a row (from 1): 1 s, doubling, at most a minute. A failure that lasts (a package this
/// host lacks, a database refusing a statement) is tried again now and then, never in a
/// loop; one that passes (a lock wait, a lost answer) costs a second.
pub fn take_retry(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (TAKE_RETRY_FIRST * 2u32.pow(doublings)).min(TAKE_RETRY_MAX)
}

/// Where a run given back ([`Fleet::release`]) waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveBack {
    /// For a person: the run is paused or ended, or no host can drive it as it is (its
    /// log is damaged). Never claimed again until someone resumes or queues it.
    Idle,
    /// For any host, claimable once `after` passed: at once for a run a host stopped
    /// driving (shutting down, its driver failed), later for one whose take failed
    /// ([`take_retry`]).
    Queued { after: Duration },
}

impl GiveBack {
    /// Queued for the next host that claims.
    pub const QUEUED: GiveBack = GiveBack::Queued {
        after: Duration::ZERO,
    };
}

/// A host as the store knows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HostRow {
    pub host_id: String,
    pub hostname: String,
    pub pid: u32,
    /// Where the host takes requests.
    pub api: String,
    /// Milliseconds since the Unix epoch (store clock).
    pub started_ms: u64,
    pub last_seen_ms: u64,
    /// Its registration has not expired.
    pub alive: bool,
    /// Runs whose live lease it holds.
    pub runs: u64,
    /// Their ids, so an operator sees which runs a host drives (and which a dead
    /// host's expired leases left for adoption are no longer among them).
    pub run_ids: Vec<String>,
}

/// A run this host now owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub run_id: String,
    /// The owner epoch this host appends under.
    pub epoch: u64,
    /// The host whose lease had expired (the run is adopted), or `None` for queued work.
    pub adopted_from: Option<String>,
}

/// A lease a renewal found gone: its run is no longer this host's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLease {
    pub run_id: String,
    pub epoch: u64,
}

/// A run's lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    /// `idle`, `queued` or `running`.
    pub state: String,
    pub owner_host: Option<String>,
    pub epoch: u64,
    /// Milliseconds the lease has left (0: expired or none).
    pub left_ms: u64,
}

/// What a renewal did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// Leases renewed.
    pub renewed: usize,
    /// Leases found gone (also kept for [`Fleet::take_lost`] when the store renews by
    /// itself).
    pub lost: Vec<LostLease>,
}

/// A request for a run's owner.
#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    pub id: u64,
    pub run_id: String,
    /// What is asked (`cancel`, `resume`, …): the driver's vocabulary, not the store's.
    pub kind: String,
    pub body: serde_json::Value,
}

/// A reason to look at the store again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A run was queued.
    Work { run_id: String },
    /// A command was sent to a run's owner.
    Command { run_id: String, id: u64 },
    /// A command's outcome was recorded.
    CommandDone { id: u64 },
    /// A cancel of the run was requested ([`crate::RunStore::request_cancel`]).
    Cancel { run_id: String },
    /// Wake-ups may have been missed (the listening connection dropped, or this
    /// subscriber fell behind): poll.
    Missed,
}

/// The store's wake-ups as one subscriber receives them.
pub struct Wakeups(tokio::sync::broadcast::Receiver<Wake>);

impl Wakeups {
    /// The next wake-up; `None` once the store is gone.
    pub async fn next(&mut self) -> Option<Wake> {
        use tokio::sync::broadcast::error::RecvError;
        match self.0.recv().await {
            Ok(w) => Some(w),
            Err(RecvError::Lagged(_)) => Some(Wake::Missed),
            Err(RecvError::Closed) => None,
        }
    }

    /// A wake-up already received, without waiting.
    pub fn try_next(&mut self) -> Option<Wake> {
        use tokio::sync::broadcast::error::TryRecvError;
        match self.0.try_recv() {
            Ok(w) => Some(w),
            Err(TryRecvError::Lagged(_)) => Some(Wake::Missed),
            Err(_) => None,
        }
    }
}

/// Where wake-ups are handed to subscribers.
pub(crate) struct Hub(tokio::sync::broadcast::Sender<Wake>);

impl Hub {
    pub(crate) fn new() -> Hub {
        Hub(tokio::sync::broadcast::channel(1024).0)
    }

    pub(crate) fn send(&self, w: Wake) {
        // No subscriber: nobody to wake.
        let _ = self.0.send(w);
    }

    pub(crate) fn subscribe(&self) -> Wakeups {
        Wakeups(self.0.subscribe())
    }
}

/// Ownership of runs among the hosts of one store (see the module's rules).
pub trait Fleet: Send + Sync {
    /// Who this handle's leases name.
    fn host_id(&self) -> &str;

    /// Registers this host (answering at `api`). Refused with
    /// [`StoreError::HostIdTaken`] while another live host holds the id.
    fn register(&self, api: &str) -> Result<(), StoreError>;

    /// Renews this host's registration and every lease it holds; reports the leases it
    /// found gone. [`StoreError::HostLost`] when the registration itself is gone.
    fn heartbeat(&self) -> Result<Heartbeat, StoreError>;

    /// Leases found lost by renewals this handle ran by itself, since the last call.
    fn take_lost(&self) -> Vec<LostLease>;

    /// Gives back every run this host holds (`requeue`: for another host to continue;
    /// else idle) and ends its registration: a graceful shutdown.
    fn deregister(&self, requeue: bool) -> Result<(), StoreError>;

    /// Every host the store knows, alive or not.
    fn hosts(&self) -> Result<Vec<HostRow>, StoreError>;

    /// Where the store is, for operators (a file, or server, database and schema; never
    /// a password).
    fn target(&self) -> String;

    /// Queues `run_id` for any host (wakes them). A run already queued or running
    /// stays as it is.
    fn enqueue(&self, run_id: &str) -> Result<(), StoreError>;

    /// Takes up to `n` runs that need an owner: queued ones whose pause
    /// ([`GiveBack::Queued`]) passed, and running ones whose lease expired (adopted).
    /// Needs a live registration.
    fn claim(&self, n: usize) -> Result<Vec<Claimed>, StoreError>;

    /// Gives run `run_id` (held under `epoch`) back, to wait as `back` says.
    /// [`StoreError::RunLeaseLost`] when it was not held.
    fn release(&self, run_id: &str, epoch: u64, back: GiveBack) -> Result<(), StoreError>;

    /// Gives run `run_id` back ([`Fleet::release`]) at whatever epoch this handle holds
    /// it now, if it holds it; from here on it is not renewed, whatever the database
    /// answers (a hand-back that cannot reach it leaves the lease to expire, never one
    /// renewed for a run nobody here drives).
    fn hand_back(&self, run_id: &str, back: GiveBack) -> Result<(), StoreError>;

    /// Stops renewing run `run_id`'s lease held under `epoch` (the run was stopped here
    /// as lost: a host that fenced itself after a TTL without renewal, or whose driver
    /// found its lease gone): it expires, and another host adopts the run. Renewed on,
    /// a lease the database still counted live would keep the run from everyone with
    /// nobody driving it. Touches nothing but this handle.
    fn stop_renewing(&self, run_id: &str, epoch: u64);

    /// The run's lease as stored.
    fn lease(&self, run_id: &str) -> Result<LeaseRow, StoreError>;

    /// Asks the run's owner to do `kind` (`body` its details); returns the command's id.
    fn send_command(
        &self,
        run_id: &str,
        kind: &str,
        body: &serde_json::Value,
    ) -> Result<u64, StoreError>;

    /// Commands for `run_id` not carried out yet, oldest first.
    fn pending_commands(&self, run_id: &str) -> Result<Vec<Command>, StoreError>;

    /// Records that the owner (under `epoch`) carried out command `id`, with `outcome`.
    /// Fenced like an append.
    fn finish_command(
        &self,
        run_id: &str,
        epoch: u64,
        id: u64,
        outcome: &serde_json::Value,
    ) -> Result<(), StoreError>;

    /// The outcome of command `id`, once its owner recorded one.
    fn command_outcome(&self, id: u64) -> Result<Option<serde_json::Value>, StoreError>;

    /// Wake-ups for new work and commands committed from now on (or a `Missed`, when
    /// they cannot be had: poll then).
    fn subscribe(&self) -> Result<Wakeups, StoreError>;
}

/// The single host of an SQLite store. The store's owner lease (`lease.rs`) already
/// makes one process the only writer of the file, so there is nobody to share a queue or
/// a command with: both live in that process, and run leases are the per-run epochs
/// every append checks. A restarted host finds its interrupted runs in their logs, as
/// before.
#[derive(Default)]
pub(crate) struct Local {
    state: Mutex<LocalState>,
}

#[derive(Default)]
struct LocalState {
    registered: Option<String>,
    /// Queued runs, each with when it is claimable.
    queue: VecDeque<(String, Instant)>,
    /// Runs claimed through the queue, by epoch.
    held: HashMap<String, u64>,
    commands: Vec<(Command, Option<serde_json::Value>)>,
}

impl Local {
    fn state(&self) -> std::sync::MutexGuard<'_, LocalState> {
        // Every update below is a single step: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Fleet for crate::SqliteStore {
    fn host_id(&self) -> &str {
        "local"
    }

    fn target(&self) -> String {
        self.path().display().to_string()
    }

    fn register(&self, api: &str) -> Result<(), StoreError> {
        let owner = self.acquire_lease(api, crate::lease::TTL)?;
        self.local.state().registered = Some(owner.owner_id);
        Ok(())
    }

    fn heartbeat(&self) -> Result<Heartbeat, StoreError> {
        if self.local.state().registered.is_some() {
            self.renew_lease(crate::lease::TTL)?;
        }
        Ok(Heartbeat {
            renewed: self.local.state().held.len(),
            lost: Vec::new(),
        })
    }

    fn take_lost(&self) -> Vec<LostLease> {
        Vec::new()
    }

    fn deregister(&self, requeue: bool) -> Result<(), StoreError> {
        {
            let mut s = self.local.state();
            let held: Vec<String> = s.held.drain().map(|(r, _)| r).collect();
            if requeue {
                let now = Instant::now();
                s.queue.extend(held.into_iter().map(|r| (r, now)));
            }
            s.registered = None;
        }
        self.release_lease()
    }

    fn hosts(&self) -> Result<Vec<HostRow>, StoreError> {
        let mut run_ids: Vec<String> = self.local.state().held.keys().cloned().collect();
        run_ids.sort();
        let runs = run_ids.len() as u64;
        Ok(self
            .owner()?
            .map(|o| HostRow {
                host_id: "local".into(),
                hostname: o.host,
                pid: o.pid,
                api: o.api,
                started_ms: 0,
                last_seen_ms: o
                    .expires_ms
                    .saturating_sub(crate::lease::TTL.as_millis() as u64),
                alive: true,
                runs,
                run_ids,
            })
            .into_iter()
            .collect())
    }

    fn enqueue(&self, run_id: &str) -> Result<(), StoreError> {
        crate::RunStore::header(self, run_id)?;
        let mut s = self.local.state();
        if !s.queue.iter().any(|(r, _)| r == run_id) && !s.held.contains_key(run_id) {
            s.queue.push_back((run_id.to_string(), Instant::now()));
        }
        drop(s);
        self.hub.send(Wake::Work {
            run_id: run_id.to_string(),
        });
        Ok(())
    }

    fn claim(&self, n: usize) -> Result<Vec<Claimed>, StoreError> {
        if self.local.state().registered.is_none() {
            return Err(StoreError::HostLost {
                target: self.path().display().to_string(),
                host_id: "local".into(),
                why: "it is not registered".into(),
            });
        }
        let mut out = Vec::new();
        loop {
            if out.len() >= n {
                break;
            }
            let run = {
                let mut s = self.local.state();
                let now = Instant::now();
                match s.queue.iter().position(|(_, at)| *at <= now) {
                    Some(i) => s.queue.remove(i).map(|(r, _)| r),
                    None => None,
                }
            };
            let Some(run) = run else {
                break;
            };
            let epoch = crate::RunStore::acquire(self, &run)?;
            self.local.state().held.insert(run.clone(), epoch);
            out.push(Claimed {
                run_id: run,
                epoch,
                adopted_from: None,
            });
        }
        Ok(out)
    }

    fn release(&self, run_id: &str, epoch: u64, back: GiveBack) -> Result<(), StoreError> {
        let mut s = self.local.state();
        if s.held.get(run_id) != Some(&epoch) {
            return Err(StoreError::RunLeaseLost {
                run: run_id.to_string(),
                epoch,
                why: "this host does not hold it".into(),
            });
        }
        s.held.remove(run_id);
        if let GiveBack::Queued { after } = back {
            s.queue
                .push_back((run_id.to_string(), Instant::now() + after));
        }
        Ok(())
    }

    fn hand_back(&self, run_id: &str, back: GiveBack) -> Result<(), StoreError> {
        let held = self.local.state().held.get(run_id).copied();
        match held {
            Some(epoch) => self.release(run_id, epoch, back),
            None => Ok(()),
        }
    }

    fn stop_renewing(&self, run_id: &str, epoch: u64) {
        let mut s = self.local.state();
        if s.held.get(run_id) == Some(&epoch) {
            s.held.remove(run_id);
        }
    }

    fn lease(&self, run_id: &str) -> Result<LeaseRow, StoreError> {
        crate::RunStore::header(self, run_id)?;
        let s = self.local.state();
        let state = if let Some(e) = s.held.get(run_id) {
            return Ok(LeaseRow {
                state: "running".into(),
                owner_host: Some("local".into()),
                epoch: *e,
                left_ms: crate::lease::TTL.as_millis() as u64,
            });
        } else if s.queue.iter().any(|(r, _)| r == run_id) {
            "queued"
        } else {
            "idle"
        };
        Ok(LeaseRow {
            state: state.into(),
            owner_host: None,
            epoch: 0,
            left_ms: 0,
        })
    }

    fn send_command(
        &self,
        run_id: &str,
        kind: &str,
        body: &serde_json::Value,
    ) -> Result<u64, StoreError> {
        crate::RunStore::header(self, run_id)?;
        let mut s = self.local.state();
        let id = s.commands.len() as u64 + 1;
        s.commands.push((
            Command {
                id,
                run_id: run_id.to_string(),
                kind: kind.to_string(),
                body: body.clone(),
            },
            None,
        ));
        drop(s);
        self.hub.send(Wake::Command {
            run_id: run_id.to_string(),
            id,
        });
        Ok(id)
    }

    fn pending_commands(&self, run_id: &str) -> Result<Vec<Command>, StoreError> {
        Ok(self
            .local
            .state()
            .commands
            .iter()
            .filter(|(c, done)| c.run_id == run_id && done.is_none())
            .map(|(c, _)| c.clone())
            .collect())
    }

    fn finish_command(
        &self,
        run_id: &str,
        epoch: u64,
        id: u64,
        outcome: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut s = self.local.state();
        if let Some(held) = s.held.get(run_id)
            && *held != epoch
        {
            return Err(StoreError::Fenced {
                run: run_id.to_string(),
                ours: epoch,
                current: *held,
            });
        }
        let Some((_, done)) = s
            .commands
            .iter_mut()
            .find(|(c, _)| c.id == id && c.run_id == run_id)
        else {
            return Err(StoreError::UnknownCommand(id));
        };
        done.get_or_insert_with(|| outcome.clone());
        drop(s);
        self.hub.send(Wake::CommandDone { id });
        Ok(())
    }

    fn command_outcome(&self, id: u64) -> Result<Option<serde_json::Value>, StoreError> {
        let s = self.local.state();
        match s.commands.iter().find(|(c, _)| c.id == id) {
            Some((_, done)) => Ok(done.clone()),
            None => Err(StoreError::UnknownCommand(id)),
        }
    }

    fn subscribe(&self) -> Result<Wakeups, StoreError> {
        Ok(self.hub.subscribe())
    }
}
