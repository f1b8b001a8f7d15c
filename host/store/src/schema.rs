//! The SQLite schema, its version and its migrations.
//!
//! The file says what it is in its header: `application_id` marks it as a Heddle run
//! store and `user_version` is the schema version. Both are read before anything is
//! written, so opening a foreign, corrupt or newer file changes nothing in it.

use std::path::Path;

use rusqlite::Connection;

use crate::StoreError;
use crate::header::HeaderRow;

/// "HDRS" (Heddle run store) in the SQLite header's application id.
pub const APPLICATION_ID: i64 = 0x4844_5253;

/// Migrations in order; the schema version is how many have been applied (this build
/// writes and understands all of them). Never edit
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
    // 5: a row may hold several records (`kind` = 'packed', keyed by the last one it
    // holds; see rows.rs). No table changes either: rows of a version 4 store are
    // single records and read as before, and the version makes an older heddle refuse
    // the file instead of calling its packed rows corrupt.
    "-- rows may hold several records",
    // 6: the run header's checksums (`runs.header_sums`, see header.rs), one CRC-32 per
    // field: the column is added and the rows a version 5 store holds get theirs by
    // [`checksum_headers`], in Rust.
    "-- run headers are checksummed",
    // 7: requests to cancel a run, for its live owner to see and carry out (see
    // `RunStore::request_cancel`): the owner's epoch fences everyone else out of the
    // log, so a request from another process is kept beside it.
    "CREATE TABLE IF NOT EXISTS cancel_requests (
        run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
        requested_ms INTEGER NOT NULL,
        pid INTEGER NOT NULL
    ) WITHOUT ROWID;",
    // 8: an artifact's bytes in pieces of `artifacts::PIECE_BYTES`, a row each (a rowid
    // table: large rows belong in one, and its key index stays small), read a piece at
    // a time instead of whole; the bytes a version 7 store holds are cut into pieces and
    // the column that held them whole is dropped by [`cut_artifacts`], in Rust.
    "CREATE TABLE IF NOT EXISTS artifact_pieces (
        run_id TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        n INTEGER NOT NULL,
        bytes BLOB NOT NULL,
        PRIMARY KEY (run_id, sha256, n)
    );",
];

/// The version whose upgrade checksums the run headers already stored.
const HEADER_SUMS: i64 = 6;

/// The version whose upgrade cuts the artifacts already stored into pieces.
const ARTIFACT_PIECES: i64 = 8;

/// Moves the bytes of every artifact still held whole (`artifacts.bytes`, before
/// version 8) into pieces of [`crate::artifacts::PIECE_BYTES`], and drops the column.
/// Nothing to do on a file that has no such column. One artifact at a time, each read
/// once: cutting in SQL (`substr` per piece) reads the whole blob again for every piece,
/// 30 s for one 48 MiB artifact where this takes well under a second.
fn cut_artifacts(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let whole: bool = tx.query_row(
        "SELECT count(*) FROM pragma_table_info('artifacts') WHERE name = 'bytes'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !whole {
        return Ok(());
    }
    let keys: Vec<(String, String)> = tx
        .prepare("SELECT run_id, sha256 FROM artifacts WHERE size > 0")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut read = tx.prepare("SELECT bytes FROM artifacts WHERE run_id = ?1 AND sha256 = ?2")?;
    let mut piece = tx.prepare(
        "INSERT INTO artifact_pieces (run_id, sha256, n, bytes) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (run, sha256) in &keys {
        let bytes: Vec<u8> = read.query_row(rusqlite::params![run, sha256], |r| r.get(0))?;
        for (n, bytes) in bytes.chunks(crate::artifacts::PIECE_BYTES).enumerate() {
            piece.execute(rusqlite::params![run, sha256, n as i64, bytes])?;
        }
    }
    drop((read, piece));
    tx.execute_batch("ALTER TABLE artifacts DROP COLUMN bytes;")
}

/// What opening a store changed in it: it was brought from schema `from` to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    pub from: i64,
    pub to: i64,
    /// Runs whose header got its checksums on this upgrade, computed over the header
    /// as it was then (only the graph's recorded sha256 vouches for what came before).
    pub headers_checksummed: u64,
}

impl std::fmt::Display for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "upgraded from schema version {} to {}",
            self.from, self.to
        )?;
        if self.from < HEADER_SUMS && self.to >= HEADER_SUMS {
            write!(
                f,
                "; checksummed the stored headers of {} run(s) as they are now (before this, only each graph's sha256 was recorded)",
                self.headers_checksummed
            )?;
        }
        Ok(())
    }
}

/// Computes the header checksums of every run that has none (all of them, on the
/// upgrade to version 6), over the fields as stored. Returns how many.
fn checksum_headers(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<u64> {
    let has_column: bool = tx.query_row(
        "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'header_sums'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_column {
        tx.execute_batch("ALTER TABLE runs ADD COLUMN header_sums TEXT;")?;
    }
    let rows: Vec<(String, HeaderRow)> = {
        let mut q = tx.prepare(&format!(
            "SELECT run_id, {} FROM runs WHERE header_sums IS NULL",
            crate::header::COLUMNS
        ))?;
        q.query_map([], |r| Ok((r.get(0)?, crate::sqlite::header_row(r, 1)?)))?
            .collect::<Result<_, _>>()?
    };
    for (run_id, row) in &rows {
        tx.execute(
            "UPDATE runs SET header_sums = ?2 WHERE run_id = ?1",
            rusqlite::params![run_id, row.sums(run_id)],
        )?;
    }
    Ok(rows.len() as u64)
}

/// Checks what the file is and brings an older schema up to date. A fresh (empty) file
/// is initialized; anything else must carry our application id and a version we know.
/// Returns what an upgrade changed, if the file was brought up to date.
pub fn prepare(conn: &mut Connection, path: &Path) -> Result<Option<Upgrade>, StoreError> {
    prepare_with(conn, path, MIGRATIONS)
}

/// [`prepare`] by a heddle that knows `migrations` (a prefix of [`MIGRATIONS`]): how
/// the tests see what an older build does with a file this one wrote.
fn prepare_with(
    conn: &mut Connection,
    path: &Path,
    migrations: &[&str],
) -> Result<Option<Upgrade>, StoreError> {
    let supported = migrations.len() as i64;
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
    } else if version > supported {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported,
        });
    }
    if version == supported && app == APPLICATION_ID {
        return Ok(None);
    }
    let open = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let tx = conn.transaction().map_err(open)?;
    let mut headers_checksummed = 0;
    for (i, m) in migrations.iter().enumerate().skip(version as usize) {
        tx.execute_batch(m).map_err(open)?;
        if i as i64 + 1 == HEADER_SUMS {
            headers_checksummed = checksum_headers(&tx).map_err(open)?;
        }
        if i as i64 + 1 == ARTIFACT_PIECES {
            cut_artifacts(&tx).map_err(open)?;
        }
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(open)?;
    tx.pragma_update(None, "user_version", supported)
        .map_err(open)?;
    tx.commit().map_err(open)?;
    // A new file was created, not upgraded.
    Ok((version > 0).then_some(Upgrade {
        from: version,
        to: supported,
        headers_checksummed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heddle that knows schema 4 (one record per row) refuses a file this build
    /// wrote, naming both versions, and leaves it as it was.
    #[test]
    fn an_older_heddle_refuses_a_newer_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let mut c = Connection::open(&path).unwrap();
        prepare(&mut c, &path).unwrap();
        let before = std::fs::read(&path).unwrap();
        match prepare_with(&mut c, &path, &MIGRATIONS[..4]) {
            Err(StoreError::NewerSchema {
                found,
                supported: 4,
                ..
            }) if found == MIGRATIONS.len() as i64 => {}
            other => panic!("expected the newer-schema refusal, got {other:?}"),
        }
        drop(c);
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    /// A version 7 store kept each artifact whole in `artifacts.bytes`: opened by this
    /// build, its artifacts are cut into pieces that read back whole and one at a
    /// time (an empty one, a one-piece one and one of three pieces), and the column
    /// that held them whole is gone.
    #[test]
    fn a_version_7_store_migrates_its_artifacts_into_pieces() {
        use crate::RunStore as _;
        use crate::artifacts::{ArtifactReader, ArtifactRef, PIECE_BYTES};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let big: Vec<u8> = (0..2 * PIECE_BYTES + 9).map(|i| (i % 241) as u8).collect();
        let all: [&[u8]; 3] = [&big, b"{\"a\":1}", b""];
        {
            let mut c = Connection::open(&path).unwrap();
            prepare_with(&mut c, &path, &MIGRATIONS[..7]).unwrap();
            // The artifacts alone: their run's row is not what this is about.
            c.pragma_update(None, "foreign_keys", false).unwrap();
            for bytes in all {
                c.execute(
                    "INSERT INTO artifacts (run_id, sha256, size, bytes) VALUES ('r', ?1, ?2, ?3)",
                    rusqlite::params![crate::sha256_hex(bytes), bytes.len() as i64, bytes],
                )
                .unwrap();
            }
        }
        let store = crate::SqliteStore::open(&path).unwrap();
        assert_eq!(store.upgrade().map(|u| (u.from, u.to)), Some((7, 8)));
        for bytes in all {
            let a = ArtifactRef {
                sha256: crate::sha256_hex(bytes),
                size: bytes.len() as u64,
            };
            assert!(store.get_artifact("r", &a).unwrap() == bytes);
            let mut r = ArtifactReader::open(&store, "r", &a.sha256).unwrap();
            let mut sizes = Vec::new();
            while let Some(p) = r.next_piece(&store).unwrap() {
                sizes.push(p.len());
            }
            let want: Vec<usize> = bytes.chunks(PIECE_BYTES).map(<[u8]>::len).collect();
            assert_eq!(sizes, want);
        }
        let c = Connection::open(&path).unwrap();
        let has_bytes: i64 = c
            .query_row(
                "SELECT count(*) FROM pragma_table_info('artifacts') WHERE name = 'bytes'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(has_bytes, 0);
    }
}
