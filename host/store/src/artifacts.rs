//! Artifacts: content-addressed blobs (sha256) stored with a run, for what is too large
//! or too important to travel in an event or on a console (a run's final outputs).
//!
//! Each run's artifacts are deduplicated by digest; a per-artifact size limit and a
//! per-run total quota bound what a run can store (`STORAGE_LIMIT_EXCEEDED`), and
//! content holding a known secret value is refused, not redacted (`KNOWN_SECRET`): a
//! redacted copy would be stored as if it were the real bytes. Reading verifies the
//! bytes against their digest (`TERMINAL_ARTIFACT` when missing or corrupt).
//!
//! The bytes are stored in pieces of [`PIECE_BYTES`] (a row each, numbered from 0),
//! beside one row per artifact with its digest and size. A reader
//! ([`ArtifactReader`]) takes one piece at a time, each with a short statement of its
//! own, and hashes as it goes: a download of a 64 MiB value holds one piece, not the
//! value, and no transaction or connection stays open while a slow client reads. The
//! digest is checked before the last piece is handed out, so damaged bytes never reach
//! anyone as a whole. Pieces rather than SQLite's incremental blob I/O (which needs a
//! rowid table and keeps a read transaction open while the blob handle lives, pinning
//! the WAL for as long as a client takes) because the same layout serves PostgreSQL,
//! whose `bytea` is read whole.

use rusqlite::{OptionalExtension as _, params};

use crate::{SqliteStore, StoreError};

/// What a run may store.
#[derive(Clone, Debug)]
pub struct ArtifactPolicy {
    pub max_artifact_bytes: u64,
    pub max_run_bytes: u64,
    /// Values no artifact may contain (secrets the run can hold); empty ones are ignored.
    pub known_secrets: Vec<String>,
}

impl Default for ArtifactPolicy {
    fn default() -> ArtifactPolicy {
        ArtifactPolicy {
            max_artifact_bytes: 64 << 20,
            max_run_bytes: 256 << 20,
            known_secrets: Vec::new(),
        }
    }
}

/// How many bytes of an artifact one stored piece holds (the last one of an artifact
/// holds the rest): what a reader holds in memory at a time.
pub const PIECE_BYTES: usize = 256 << 10;

/// An artifact as its store holds it, read without its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredArtifact {
    pub sha256: String,
    /// The size recorded when it was stored.
    pub size: u64,
    /// The length of the pieces stored now (the size, unless pieces were lost or cut).
    pub stored: u64,
}

/// Reads one artifact piece by piece ([`crate::RunStore::artifact_piece`]), hashing as it
/// goes, and refuses to hand out the last piece unless the whole matches the digest:
/// a reader that sends pieces on (the server's artifact route) never completes a
/// damaged artifact.
#[derive(Debug)]
pub struct ArtifactReader {
    run: String,
    artifact: ArtifactRef,
    next: u64,
    read: u64,
    hash: sha2::Sha256,
    done: bool,
}

impl ArtifactReader {
    /// A reader of artifact `sha256` of `run`: `Missing` when it is not stored, `Cut`
    /// when what is stored is not its recorded size (no byte is read to find either).
    pub fn open<S: crate::RunStore + ?Sized>(
        store: &S,
        run: &str,
        sha256: &str,
    ) -> Result<ArtifactReader, ArtifactError> {
        let Some(found) = store.stored_artifact(run, sha256)? else {
            return Err(ArtifactError::Missing {
                run: run.to_string(),
                sha256: sha256.to_string(),
            });
        };
        if found.stored != found.size {
            return Err(ArtifactError::Cut {
                run: run.to_string(),
                sha256: sha256.to_string(),
                size: found.size,
                stored: found.stored,
            });
        }
        Ok(ArtifactReader {
            run: run.to_string(),
            artifact: ArtifactRef {
                sha256: sha256.to_string(),
                size: found.size,
            },
            next: 0,
            read: 0,
            hash: Default::default(),
            done: false,
        })
    }

    /// The artifact read: its digest and size (what a response declares as its length).
    pub fn artifact(&self) -> &ArtifactRef {
        &self.artifact
    }

    /// The next piece, `None` after the last. The last is handed out only once every
    /// byte matched the digest (`Corrupt` otherwise); pieces missing or longer than the
    /// size say `Cut`.
    pub fn next_piece<S: crate::RunStore + ?Sized>(
        &mut self,
        store: &S,
    ) -> Result<Option<Vec<u8>>, ArtifactError> {
        use sha2::Digest as _;
        if self.done {
            return Ok(None);
        }
        let size = self.artifact.size;
        let piece = if self.read < size {
            let found = store.artifact_piece(&self.run, &self.artifact.sha256, self.next)?;
            let piece = found
                .filter(|p| !p.is_empty() && self.read + p.len() as u64 <= size)
                .ok_or_else(|| ArtifactError::Cut {
                    run: self.run.clone(),
                    sha256: self.artifact.sha256.clone(),
                    size,
                    stored: self.read,
                })?;
            self.next += 1;
            self.read += piece.len() as u64;
            self.hash.update(&piece);
            Some(piece)
        } else {
            None
        };
        if self.read == size {
            self.done = true;
            let found = hex(&std::mem::take(&mut self.hash).finalize());
            if found != self.artifact.sha256 {
                return Err(ArtifactError::Corrupt {
                    run: self.run.clone(),
                    sha256: self.artifact.sha256.clone(),
                    found,
                });
            }
        }
        Ok(piece)
    }
}

/// `bytes` as lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Where an artifact is: its digest and size.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArtifactRef {
    pub sha256: String,
    pub size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error(
        "run {run}: an artifact of {size} bytes is over the per-artifact limit of {limit} bytes; STORAGE_LIMIT_EXCEEDED"
    )]
    TooLarge { run: String, size: u64, limit: u64 },
    #[error(
        "run {run}: storing {size} more bytes would pass the run's artifact quota ({used} of {quota} bytes used); STORAGE_LIMIT_EXCEEDED"
    )]
    Quota {
        run: String,
        size: u64,
        used: u64,
        quota: u64,
    },
    /// Which secret is never said.
    #[error("run {run}: the artifact contains a known secret value and was refused; KNOWN_SECRET")]
    KnownSecret { run: String },
    /// A node value (inline or not): see [`crate::secrets`]. Which secret is never said.
    #[error(
        "run {run}: output `{handle}` of node {node} holds a known secret value and was refused (a durable run's log never stores one; pass secrets by name); KNOWN_SECRET"
    )]
    SecretInValue {
        run: String,
        node: String,
        handle: String,
    },
    #[error("run {run}: artifact {sha256} is missing; TERMINAL_ARTIFACT")]
    Missing { run: String, sha256: String },
    /// Stored pieces that do not add up to the artifact's size (lost, cut or added).
    #[error(
        "run {run}: artifact {sha256} is corrupt: {stored} of its {size} bytes are stored; TERMINAL_ARTIFACT"
    )]
    Cut {
        run: String,
        sha256: String,
        size: u64,
        stored: u64,
    },
    #[error(
        "run {run}: artifact {sha256} is corrupt (its bytes hash to {found}); TERMINAL_ARTIFACT"
    )]
    Corrupt {
        run: String,
        sha256: String,
        found: String,
    },
    /// A value of a run's log that could not be read back (`source`: missing or
    /// corrupt), named by where it was.
    #[error("node {node}, output `{handle}`")]
    InValue {
        node: String,
        handle: String,
        #[source]
        source: Box<ArtifactError>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ArtifactError {
    /// The code a report carries.
    pub fn code(&self) -> &'static str {
        match self {
            ArtifactError::TooLarge { .. } | ArtifactError::Quota { .. } => {
                "STORAGE_LIMIT_EXCEEDED"
            }
            ArtifactError::KnownSecret { .. } | ArtifactError::SecretInValue { .. } => {
                "KNOWN_SECRET"
            }
            ArtifactError::Missing { .. }
            | ArtifactError::Cut { .. }
            | ArtifactError::Corrupt { .. } => "TERMINAL_ARTIFACT",
            ArtifactError::Store(_) => "RUN_STORAGE",
            ArtifactError::InValue { source, .. } => source.code(),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

impl From<ArtifactError> for StoreError {
    fn from(e: ArtifactError) -> StoreError {
        match e {
            ArtifactError::Store(s) => s,
            e => StoreError::Artifact(Box::new(e)),
        }
    }
}

/// What every store checks before it stores `bytes` for `run`: the per-artifact limit and
/// known secrets. Returns the bytes' digest.
pub(crate) fn admit(
    run: &str,
    bytes: &[u8],
    policy: &ArtifactPolicy,
) -> Result<String, ArtifactError> {
    let size = bytes.len() as u64;
    if size > policy.max_artifact_bytes {
        return Err(ArtifactError::TooLarge {
            run: run.to_string(),
            size,
            limit: policy.max_artifact_bytes,
        });
    }
    if policy
        .known_secrets
        .iter()
        .any(|s| contains(bytes, s.as_bytes()))
    {
        return Err(ArtifactError::KnownSecret {
            run: run.to_string(),
        });
    }
    Ok(crate::sha256_hex(bytes))
}

/// The run's quota, checked for `size` new bytes when `used` are stored already.
pub(crate) fn within_quota(
    run: &str,
    used: u64,
    size: u64,
    policy: &ArtifactPolicy,
) -> Result<(), ArtifactError> {
    if used + size > policy.max_run_bytes {
        return Err(ArtifactError::Quota {
            run: run.to_string(),
            size,
            used,
            quota: policy.max_run_bytes,
        });
    }
    Ok(())
}

impl SqliteStore {
    /// Stores `bytes` for `run` under the policy (once: the same bytes again cost
    /// nothing) and, with `name`, points that name at them.
    pub fn put_artifact(
        &self,
        run: &str,
        name: Option<&str>,
        bytes: &[u8],
        policy: &ArtifactPolicy,
    ) -> Result<ArtifactRef, ArtifactError> {
        let size = bytes.len() as u64;
        let sha256 = admit(run, bytes, policy)?;
        self.with_db(|db| -> Result<(), ArtifactError> {
            let tx = rusqlite::Transaction::new_unchecked(
                db,
                rusqlite::TransactionBehavior::Immediate,
            )
            .map_err(StoreError::sql("storing an artifact"))?;
            // The same rule as every other write: not while a server owns the store.
            self.check_write(&tx)?;
            let exists: Option<i64> = tx
                .query_row(
                    "SELECT size FROM artifacts WHERE run_id = ?1 AND sha256 = ?2",
                    params![run, sha256],
                    |r| r.get(0),
                )
                .optional()
                .map_err(StoreError::sql("storing an artifact"))?;
            if exists.is_none() {
                let used: i64 = tx
                    .query_row(
                        "SELECT COALESCE(SUM(size), 0) FROM artifacts WHERE run_id = ?1",
                        params![run],
                        |r| r.get(0),
                    )
                    .map_err(StoreError::sql("storing an artifact"))?;
                within_quota(run, used as u64, size, policy)?;
                tx.execute(
                    "INSERT INTO artifacts (run_id, sha256, size) VALUES (?1, ?2, ?3)",
                    params![run, sha256, size as i64],
                )
                .map_err(StoreError::sql("storing an artifact"))?;
                let mut piece = tx
                    .prepare_cached(
                        "INSERT INTO artifact_pieces (run_id, sha256, n, bytes) VALUES (?1, ?2, ?3, ?4)",
                    )
                    .map_err(StoreError::sql("storing an artifact"))?;
                for (n, bytes) in bytes.chunks(PIECE_BYTES).enumerate() {
                    piece
                        .execute(params![run, sha256, n as i64, bytes])
                        .map_err(StoreError::sql("storing an artifact"))?;
                }
            }
            if let Some(name) = name {
                tx.execute(
                    "INSERT OR REPLACE INTO artifact_names (run_id, name, sha256) VALUES (?1, ?2, ?3)",
                    params![run, name, sha256],
                )
                .map_err(StoreError::sql("naming an artifact"))?;
            }
            tx.commit().map_err(StoreError::sql("storing an artifact"))?;
            Ok(())
        })?;
        Ok(ArtifactRef { sha256, size })
    }

    /// Deletes the artifacts of `run` that neither a name nor `referenced` keeps
    /// ([`crate::spill::sweep`] says why and when); returns the bytes freed.
    pub fn drop_unreferenced_artifacts(
        &self,
        run: &str,
        referenced: &crate::spill::Referenced,
    ) -> Result<u64, StoreError> {
        self.with_db(|db| {
            let what = "dropping unreferenced artifacts";
            let tx =
                rusqlite::Transaction::new_unchecked(db, rusqlite::TransactionBehavior::Immediate)
                    .map_err(StoreError::sql(what))?;
            self.check_write(&tx)?;
            let orphans: Vec<(String, i64)> = {
                let mut q = tx
                    .prepare(
                        "SELECT a.sha256, a.size FROM artifacts a WHERE a.run_id = ?1
                         AND NOT EXISTS (SELECT 1 FROM artifact_names n
                                         WHERE n.run_id = a.run_id AND n.sha256 = a.sha256)",
                    )
                    .map_err(StoreError::sql(what))?;
                q.query_map(params![run], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(StoreError::sql(what))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(StoreError::sql(what))?
            };
            let mut freed = 0;
            for (sha256, size) in orphans {
                if referenced.contains(&sha256) {
                    continue;
                }
                tx.execute(
                    "DELETE FROM artifacts WHERE run_id = ?1 AND sha256 = ?2",
                    params![run, sha256],
                )
                .map_err(StoreError::sql(what))?;
                tx.execute(
                    "DELETE FROM artifact_pieces WHERE run_id = ?1 AND sha256 = ?2",
                    params![run, sha256],
                )
                .map_err(StoreError::sql(what))?;
                freed += size as u64;
            }
            tx.commit().map_err(StoreError::sql(what))?;
            Ok(freed)
        })
    }

    /// Every name of `run`'s artifacts and what it points at, by name.
    pub fn named_artifacts(&self, run: &str) -> Result<Vec<(String, ArtifactRef)>, StoreError> {
        self.with_reader(|db| {
            let what = "reading artifact names";
            let mut q = db
                .prepare(
                    "SELECT n.name, n.sha256, a.size FROM artifact_names n
                     LEFT JOIN artifacts a ON a.run_id = n.run_id AND a.sha256 = n.sha256
                     WHERE n.run_id = ?1 ORDER BY n.name",
                )
                .map_err(StoreError::sql(what))?;
            q.query_map(params![run], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    ArtifactRef {
                        sha256: r.get(1)?,
                        size: r.get::<_, Option<i64>>(2)?.unwrap_or(0) as u64,
                    },
                ))
            })
            .map_err(StoreError::sql(what))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::sql(what))
        })
    }

    /// The artifact `name` of `run` points at, if any.
    pub fn named_artifact(
        &self,
        run: &str,
        name: &str,
    ) -> Result<Option<ArtifactRef>, ArtifactError> {
        let found = self.with_reader(|db| {
            db.query_row(
                "SELECT n.sha256, a.size FROM artifact_names n
                 LEFT JOIN artifacts a ON a.run_id = n.run_id AND a.sha256 = n.sha256
                 WHERE n.run_id = ?1 AND n.name = ?2",
                params![run, name],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?)),
            )
            .optional()
            .map_err(StoreError::sql("reading an artifact name"))
        })?;
        Ok(found.map(|(sha256, size)| ArtifactRef {
            sha256,
            size: size.unwrap_or(0) as u64,
        }))
    }

    /// Piece `n` of artifact `sha256` of `run` ([`crate::RunStore::artifact_piece`]).
    pub fn artifact_piece(
        &self,
        run: &str,
        sha256: &str,
        n: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.with_reader(|db| {
            db.prepare_cached(
                "SELECT bytes FROM artifact_pieces WHERE run_id = ?1 AND sha256 = ?2 AND n = ?3",
            )
            .and_then(|mut q| {
                q.query_row(params![run, sha256, n as i64], |r| r.get(0))
                    .optional()
            })
            .map_err(StoreError::sql("reading an artifact"))
        })
    }

    /// The stored artifacts of `run` (only `sha256` with it), without their bytes:
    /// `length` reads a blob's length from its row's header, not its content.
    pub fn stored_artifacts_of(
        &self,
        run: &str,
        sha256: Option<&str>,
    ) -> Result<Vec<StoredArtifact>, StoreError> {
        self.with_reader(|db| {
            db.prepare_cached(
                "SELECT a.sha256, a.size,
                        (SELECT coalesce(sum(length(p.bytes)), 0) FROM artifact_pieces p
                         WHERE p.run_id = a.run_id AND p.sha256 = a.sha256)
                 FROM artifacts a WHERE a.run_id = ?1 AND (?2 IS NULL OR a.sha256 = ?2)
                 ORDER BY a.sha256",
            )
            .and_then(|mut q| {
                q.query_map(params![run, sha256], |r| {
                    Ok(StoredArtifact {
                        sha256: r.get(0)?,
                        size: r.get::<_, i64>(1)? as u64,
                        stored: r.get::<_, i64>(2)? as u64,
                    })
                })?
                .collect()
            })
            .map_err(StoreError::sql("reading what artifacts are stored"))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{NewRun, RunStore as _};

    /// A store in a fresh directory holding one empty run (shared with other modules' tests).
    pub(crate) fn store() -> (tempfile::TempDir, SqliteStore, String) {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("runs.db")).unwrap();
        let h = s
            .create_run(&NewRun {
                graph_name: "g".into(),
                graph_bytes: b"{}".to_vec(),
                plan: Default::default(),
                inputs: Default::default(),
                secrets: vec![],
                packages: Default::default(),
                limits: Default::default(),
            })
            .unwrap();
        (dir, s, h.run_id)
    }
}
