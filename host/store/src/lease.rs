//! The store's owner lease: at most one long-lived owner (`heddle serve`) writes a store.
//!
//! The lease is one row: the owner's id, process, host, API address, an epoch raised by
//! every acquisition, and an expiry its heartbeat pushes forward. Every write
//! transaction of the store checks the row under SQLite's write lock (see
//! [`check_write`]), so the rule holds across processes without trusting anyone's clock
//! for more than the expiry:
//!
//! - a store whose lease this handle holds writes only while the row still carries its
//!   epoch and has not expired: a lost lease (expired, or taken by another owner) stops
//!   every write at once, before any watcher notices;
//! - a handle without the lease (the command line) writes only while nobody holds a live
//!   lease, so `heddle run --durable` against a served store is refused.
//!
//! The run logs' own epochs still fence a run that a new owner adopted; the lease adds
//! the store-wide rule in front of them.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};
use serde::Serialize;

use crate::StoreError;
use crate::clock::now_ms;
use crate::status::pid_alive;

/// How long a lease lasts without a heartbeat. The owner renews it every third of this.
pub const TTL: Duration = Duration::from_secs(10);

/// The holder of a store's lease, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// Random per activation, so two activations of the same process differ.
    pub owner_id: String,
    pub pid: u32,
    pub host: String,
    /// Where the owner takes requests (e.g. `http://127.0.0.1:8080`), for the error a
    /// refused writer gets.
    pub api: String,
    pub epoch: u64,
    /// Milliseconds since the Unix epoch.
    pub expires_ms: u64,
}

impl Owner {
    /// Whether this lease still binds others at `now_ms`: unexpired, and its process not
    /// known dead. A process on this host that no longer exists cannot renew, so its
    /// lease is not waited out (a `kill -9`'d server is replaced at once).
    fn binds(&self, now_ms: u64) -> bool {
        self.expires_ms > now_ms && (self.host != host_name() || pid_alive(self.pid))
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heddle serve (owner {}, pid {} on host {}, lease epoch {})",
            self.owner_id, self.pid, self.host, self.epoch
        )
    }
}

/// This machine's name, as the lease records it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn read_owner(db: &Connection) -> Result<Option<Owner>, rusqlite::Error> {
    // Cached: every append checks the owner, and parsing the query again each time
    // cost more than running it.
    db.prepare_cached("SELECT owner_id, pid, host, api, epoch, expires_ms FROM owner WHERE id = 1")?
        .query_row([], |r| {
            Ok(Owner {
                owner_id: r.get(0)?,
                pid: r.get::<_, i64>(1)? as u32,
                host: r.get(2)?,
                api: r.get(3)?,
                epoch: r.get::<_, i64>(4)? as u64,
                expires_ms: r.get::<_, i64>(5)? as u64,
            })
        })
        .optional()
}

/// The store-wide write rule, checked inside every write transaction of the store at
/// `path`. `held` is the lease epoch the writing handle holds (0: none).
pub(crate) fn check_write(db: &Connection, path: &Path, held: u64) -> Result<(), StoreError> {
    let owner = read_owner(db).map_err(StoreError::sql("checking the store's owner"))?;
    let now = now_ms();
    match owner {
        Some(o) if held != 0 => {
            if o.epoch != held {
                Err(lease_lost(path, held, format!("{o} took the store over")))
            } else if o.expires_ms <= now {
                Err(lease_lost(
                    path,
                    held,
                    "it expired without a heartbeat".into(),
                ))
            } else {
                Ok(())
            }
        }
        None if held != 0 => Err(lease_lost(path, held, "its record is gone".into())),
        Some(o) if o.binds(now) => Err(StoreError::Owned {
            path: path.to_path_buf(),
            owner: Box::new(o),
        }),
        _ => Ok(()),
    }
}

fn lease_lost(path: &Path, epoch: u64, why: String) -> StoreError {
    StoreError::LeaseLost {
        path: path.to_path_buf(),
        epoch,
        why,
    }
}

/// The live owner of the store, if any (an expired lease, or one whose process on this
/// host is gone, is none).
pub(crate) fn live_owner(db: &Connection) -> Result<Option<Owner>, StoreError> {
    let o = read_owner(db).map_err(StoreError::sql("reading the store's owner"))?;
    Ok(o.filter(|o| o.binds(now_ms())))
}

/// Makes the caller the single owner of the store at `path` for `ttl`, answering
/// requests at `api`. Refused with [`StoreError::Owned`] (naming the holder) while
/// another owner's lease binds.
pub(crate) fn acquire(
    db: &mut Connection,
    path: &Path,
    api: &str,
    ttl: Duration,
) -> Result<Owner, StoreError> {
    let tx = db
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(StoreError::sql("acquiring the store's lease"))?;
    let now = now_ms();
    let current = read_owner(&tx).map_err(StoreError::sql("acquiring the store's lease"))?;
    if let Some(o) = &current
        && o.binds(now)
    {
        return Err(StoreError::Owned {
            path: path.to_path_buf(),
            owner: Box::new(o.clone()),
        });
    }
    let owner = Owner {
        owner_id: random_id(),
        pid: std::process::id(),
        host: host_name(),
        api: api.to_string(),
        epoch: current.map_or(1, |o| o.epoch + 1),
        expires_ms: now + ttl.as_millis() as u64,
    };
    tx.execute(
        "INSERT OR REPLACE INTO owner (id, owner_id, pid, host, api, epoch, expires_ms)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            owner.owner_id,
            owner.pid as i64,
            owner.host,
            owner.api,
            owner.epoch as i64,
            owner.expires_ms as i64
        ],
    )
    .map_err(StoreError::sql("acquiring the store's lease"))?;
    tx.commit()
        .map_err(StoreError::sql("acquiring the store's lease"))?;
    Ok(owner)
}

/// The heartbeat of the lease `held` (0: none): extends it by `ttl` from now. Fails with
/// [`StoreError::LeaseLost`] once the lease expired or another owner took it; the caller
/// must stop (its writes are already refused).
pub(crate) fn renew(
    db: &mut Connection,
    path: &Path,
    held: u64,
    ttl: Duration,
) -> Result<u64, StoreError> {
    if held == 0 {
        return Err(lease_lost(path, 0, "this process never held it".into()));
    }
    let tx = db
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(StoreError::sql("renewing the store's lease"))?;
    check_write(&tx, path, held)?;
    let expires = now_ms() + ttl.as_millis() as u64;
    tx.execute(
        "UPDATE owner SET expires_ms = ?1 WHERE id = 1",
        [expires as i64],
    )
    .map_err(StoreError::sql("renewing the store's lease"))?;
    tx.commit()
        .map_err(StoreError::sql("renewing the store's lease"))?;
    Ok(expires)
}

/// Gives up the lease `held` (0: none held, nothing to do). The epoch stays recorded so
/// the next owner's is higher.
pub(crate) fn release(db: &Connection, held: u64) -> Result<(), StoreError> {
    if held == 0 {
        return Ok(());
    }
    db.execute(
        "UPDATE owner SET expires_ms = 0 WHERE id = 1 AND epoch = ?1",
        [held as i64],
    )
    .map_err(StoreError::sql("releasing the store's lease"))?;
    Ok(())
}

/// 64 random bits in hex, from the standard library's per-process random keys.
fn random_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:016x}", h.finish())
}
