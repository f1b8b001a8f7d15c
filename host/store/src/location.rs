//! Where a run store is, and opening it: the one place `[store] url`, `[store] path` and
//! `HEDDLE_STORE_URL` become a store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Fleet, PgOptions, PgStore, RunStore, SqliteStore, StoreError};

/// The environment variable that points every heddle process at one store, over the
/// configuration file.
pub const STORE_URL_ENV: &str = "HEDDLE_STORE_URL";

/// Where a run store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// An SQLite file (one host).
    Sqlite(PathBuf),
    /// A PostgreSQL database (`postgres://…`; several hosts).
    Postgres(String),
}

impl StoreLocation {
    /// `postgres://…` or `postgresql://…` is a database, `sqlite:PATH` or anything else
    /// a file path.
    pub fn parse(s: &str) -> StoreLocation {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            StoreLocation::Postgres(s.to_string())
        } else {
            StoreLocation::Sqlite(PathBuf::from(s.strip_prefix("sqlite:").unwrap_or(s)))
        }
    }

    /// The store a process uses: `HEDDLE_STORE_URL` when set, else `[store] url`, else
    /// `[store] path`, else [`crate::DEFAULT_PATH`].
    pub fn resolve(url: Option<&str>, path: Option<&Path>) -> StoreLocation {
        let env = std::env::var(STORE_URL_ENV).ok().filter(|s| !s.is_empty());
        match (env.as_deref().or(url), path) {
            (Some(u), _) => StoreLocation::parse(u),
            (None, Some(p)) => StoreLocation::Sqlite(p.to_path_buf()),
            (None, None) => StoreLocation::Sqlite(PathBuf::from(crate::DEFAULT_PATH)),
        }
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Sqlite(p) => write!(f, "{}", p.display()),
            StoreLocation::Postgres(u) => f.write_str(&crate::postgres::masked(u)),
        }
    }
}

/// An open run store of either kind.
#[derive(Clone)]
pub enum Store {
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PgStore>),
}

impl Store {
    /// The store as the run log and sessions use it.
    pub fn runs(&self) -> Arc<dyn RunStore> {
        match self {
            Store::Sqlite(s) => s.clone(),
            Store::Postgres(s) => s.clone(),
        }
    }

    /// The store as hosts share it.
    pub fn fleet(&self) -> Arc<dyn Fleet> {
        match self {
            Store::Sqlite(s) => s.clone(),
            Store::Postgres(s) => s.clone(),
        }
    }

    /// Where it is, for reports (no password).
    pub fn describe(&self) -> String {
        match self {
            Store::Sqlite(s) => s.path().display().to_string(),
            Store::Postgres(s) => s.target().to_string(),
        }
    }
}

/// Opens the store at `location` (PostgreSQL with the default options).
pub fn open(location: &StoreLocation) -> Result<Store, StoreError> {
    open_with(location, PgOptions::default())
}

/// Opens the store at `location`, a PostgreSQL one with `pg`.
pub fn open_with(location: &StoreLocation, pg: PgOptions) -> Result<Store, StoreError> {
    Ok(match location {
        StoreLocation::Sqlite(p) => Store::Sqlite(Arc::new(SqliteStore::open(p)?)),
        StoreLocation::Postgres(url) => Store::Postgres(Arc::new(PgStore::open_with(url, pg)?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_is_a_database_url_or_a_path() {
        assert_eq!(
            StoreLocation::parse("postgres://u@h/db"),
            StoreLocation::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            StoreLocation::parse("postgresql://h"),
            StoreLocation::Postgres("postgresql://h".into())
        );
        assert_eq!(
            StoreLocation::parse("sqlite:.heddle/runs.db"),
            StoreLocation::Sqlite(".heddle/runs.db".into())
        );
        assert_eq!(
            StoreLocation::parse("/var/runs.db"),
            StoreLocation::Sqlite("/var/runs.db".into())
        );
        assert_eq!(
            StoreLocation::Postgres("postgres://u:hunter2@h/db".into()).to_string(),
            "postgres://u:***@h/db"
        );
    }
}
