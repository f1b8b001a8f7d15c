//! How a server holds the store whose runs it drives, the one seam between the server
//! and the store's kind. A store file has one owner at a time: every write checks its
//! owner lease, and a lost lease stops every write at once (SQLite keeps it in one row
//! of the store, [`heddle_store::lease`]). A PostgreSQL database is shared by any
//! number of hosts, each run leased on its own ([`heddle_store::Fleet`]).

use std::sync::Arc;
use std::time::Duration;

use heddle_runtime::Settings;
use heddle_store::lease::Owner;
use heddle_store::{Fleet, PgOptions, PgStore, RunStore, SqliteStore, StoreError, StoreLocation};

/// A store's owner lease.
pub trait Lease: Send + Sync {
    /// Makes this process the store's single owner for `ttl`, answering requests at
    /// `api`; refused ([`StoreError::Owned`], naming the holder) while another owner's
    /// lease binds.
    fn acquire(&self, api: &str, ttl: Duration) -> Result<Owner, StoreError>;

    /// Extends the lease by `ttl` from now; fails once it expired or another owner
    /// took it (the caller must stop: its writes are already refused).
    fn renew(&self, ttl: Duration) -> Result<u64, StoreError>;

    /// Gives the lease up (when still held).
    fn release(&self) -> Result<(), StoreError>;
}

impl Lease for SqliteStore {
    fn acquire(&self, api: &str, ttl: Duration) -> Result<Owner, StoreError> {
        self.acquire_lease(api, ttl)
    }

    fn renew(&self, ttl: Duration) -> Result<u64, StoreError> {
        self.renew_lease(ttl)
    }

    fn release(&self) -> Result<(), StoreError> {
        self.release_lease()
    }
}

/// How a server holds the store it serves.
#[derive(Clone)]
pub enum Ownership {
    /// A store file it owns alone, through the store's owner lease: every write of the
    /// file is this server's while it holds it.
    Alone(Arc<dyn Lease>),
    /// A database several hosts share ([`Fleet`]): each run is leased on its own (an
    /// owner epoch every append checks), runs are claimed from the store's queue, and a
    /// request about a run another host drives reaches it through the store.
    Shared(Arc<dyn Fleet>),
}

/// A store a server can own: its runs and how it holds them.
pub struct Ownable {
    /// The runs.
    pub runs: Arc<dyn RunStore>,
    /// Who writes them.
    pub ownership: Ownership,
    /// Where the store is, for reports (a file, or server, database and schema; never a
    /// password).
    pub target: String,
}

/// The run store of `settings` and how a server holds it: where a server's kind of
/// store is chosen. A store file is owned alone through its lease; a PostgreSQL
/// database is shared (this server registers as one of its hosts under
/// `[serve] host_id`, its runs' leases last `[serve] lease_ttl_ms`, renewed by the
/// server's own heartbeat).
pub fn open(settings: &Settings) -> Result<Ownable, heddle_runtime::Error> {
    match settings.store.location() {
        StoreLocation::Sqlite(_) => {
            let store = Arc::new(settings.store.open_sqlite()?);
            Ok(Ownable {
                target: store.path().display().to_string(),
                runs: store.clone(),
                ownership: Ownership::Alone(store),
            })
        }
        StoreLocation::Postgres(url) => {
            let store = Arc::new(PgStore::open_with(
                &url,
                PgOptions {
                    host_id: settings.serve.host_id.clone(),
                    lease_ttl: settings.serve.lease_ttl,
                    // The server renews its runs' leases itself (crate::fleet), so it
                    // sees each renewal's losses and stops those runs.
                    keep_leases: false,
                    ..PgOptions::default()
                },
            )?);
            Ok(Ownable {
                target: store.target().to_string(),
                runs: store.clone(),
                ownership: Ownership::Shared(store),
            })
        }
    }
}
