//! The store-wide ownership a server holds while it drives a store's runs: at most one
//! owner writes a store at a time, every write checks it, and a lost lease stops every
//! write at once. The one seam between the server and the store's kind: SQLite keeps
//! it in one row of the store ([`heddle_store::lease`]).

use std::sync::Arc;
use std::time::Duration;

use heddle_runtime::StoreSettings;
use heddle_store::lease::Owner;
use heddle_store::{RunStore, SqliteStore, StoreError};

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

/// A store a server can own: its runs and its lease.
pub struct Ownable {
    /// The runs.
    pub runs: Arc<dyn RunStore>,
    /// Who writes them.
    pub lease: Arc<dyn Lease>,
}

/// The run store of `settings` with its lease: where a server's kind of store is chosen.
/// A PostgreSQL store is refused ([`StoreSettings::open_sqlite`]): a server owns its
/// whole store through this one lease, and the per-run leases several hosts share on
/// one database ([`heddle_store::Fleet`]) are not driven by a server yet.
pub fn open(settings: &StoreSettings) -> Result<Ownable, heddle_runtime::Error> {
    let store = Arc::new(settings.open_sqlite()?);
    Ok(Ownable {
        runs: store.clone(),
        lease: store,
    })
}
