//! The SQLite schema, its version and its migrations.
//!
//! The file says what it is in its header: `application_id` marks it as a Heddle run
//! store and `user_version` is the schema version. Both are read before anything is
//! written, so opening a foreign, corrupt or newer file changes nothing in it.

use std::path::Path;

use rusqlite::Connection;

use crate::StoreError;

/// "HDRS" (Heddle run store) in the SQLite header's application id.
pub const APPLICATION_ID: i64 = 0x4844_5253;

/// Migrations in order; the schema version is how many have been applied. Never edit
/// one that has shipped: add the next.
const MIGRATIONS: &[&str] = &[
    // 1: runs and their event logs.
    "CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL,
        graph_name TEXT NOT NULL,
        graph_bytes BLOB NOT NULL,
        graph_sha256 TEXT NOT NULL,
        plan TEXT NOT NULL,
        inputs TEXT NOT NULL,
        secrets TEXT NOT NULL,
        packages TEXT NOT NULL,
        limits TEXT NOT NULL,
        owner_epoch INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE events (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        seq INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        crc INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;",
    // 2: the store's owner lease (one row; see lease.rs).
    "CREATE TABLE owner (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        owner_id TEXT NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        api TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL
    );",
    // 3: content-addressed artifacts per run, and names pointing at them.
    "CREATE TABLE artifacts (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        sha256 TEXT NOT NULL,
        size INTEGER NOT NULL,
        bytes BLOB NOT NULL,
        PRIMARY KEY (run_id, sha256)
    ) WITHOUT ROWID;
    CREATE TABLE artifact_names (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        name TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        PRIMARY KEY (run_id, name)
    ) WITHOUT ROWID;",
    // 4: a result's body may be binary (a BLOB in `events.body`; see codec.rs). No
    // table changes: the version alone makes an older heddle, which reads every body as
    // JSON text, refuse the file instead of calling its results corrupt.
    "-- result bodies may be binary",
];

/// The schema version this build writes and understands.
pub const VERSION: i64 = MIGRATIONS.len() as i64;

/// Checks what the file is and brings an older schema up to date. A fresh (empty) file
/// is initialized; anything else must carry our application id and a version we know.
pub fn prepare(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let not_db = |source| StoreError::NotADatabase {
        path: path.to_path_buf(),
        source,
    };
    // The first read of the header is where a corrupt or non-SQLite file shows.
    let app: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(not_db)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(not_db)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(not_db)?;
    if app == 0 && version == 0 && tables == 0 {
        // A new file: claim it.
    } else if app != APPLICATION_ID {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            found: app,
        });
    } else if version > VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    if version == VERSION && app == APPLICATION_ID {
        return Ok(());
    }
    let open = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let tx = conn.transaction().map_err(open)?;
    for m in &MIGRATIONS[version as usize..] {
        tx.execute_batch(m).map_err(open)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(open)?;
    tx.pragma_update(None, "user_version", VERSION)
        .map_err(open)?;
    tx.commit().map_err(open)
}
