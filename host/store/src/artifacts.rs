//! Artifacts: content-addressed blobs (sha256) stored with a run, for what is too large
//! or too important to travel in an event or on a console (a run's final outputs).
//!
//! Each run's artifacts are deduplicated by digest; a per-artifact size limit and a
//! per-run total quota bound what a run can store (`STORAGE_LIMIT_EXCEEDED`), and
//! content holding a known secret value is refused, not redacted (`KNOWN_SECRET`): a
//! redacted copy would be stored as if it were the real bytes. Reading verifies the
//! bytes against their digest (`TERMINAL_ARTIFACT` when missing or corrupt).

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
            ArtifactError::Missing { .. } | ArtifactError::Corrupt { .. } => "TERMINAL_ARTIFACT",
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

/// The bytes found for `artifact` (`None`: nothing stored), verified against its digest.
pub(crate) fn verified(
    run: &str,
    artifact: &ArtifactRef,
    bytes: Option<Vec<u8>>,
) -> Result<Vec<u8>, ArtifactError> {
    let Some(bytes) = bytes else {
        return Err(ArtifactError::Missing {
            run: run.to_string(),
            sha256: artifact.sha256.clone(),
        });
    };
    let found = crate::sha256_hex(&bytes);
    if found != artifact.sha256 {
        return Err(ArtifactError::Corrupt {
            run: run.to_string(),
            sha256: artifact.sha256.clone(),
            found,
        });
    }
    Ok(bytes)
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
                    "INSERT INTO artifacts (run_id, sha256, size, bytes) VALUES (?1, ?2, ?3, ?4)",
                    params![run, sha256, size as i64, bytes],
                )
                .map_err(StoreError::sql("storing an artifact"))?;
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

    /// The bytes of `artifact`, verified against its digest.
    pub fn get_artifact(
        &self,
        run: &str,
        artifact: &ArtifactRef,
    ) -> Result<Vec<u8>, ArtifactError> {
        let bytes: Option<Vec<u8>> = self.with_reader(|db| {
            db.query_row(
                "SELECT bytes FROM artifacts WHERE run_id = ?1 AND sha256 = ?2",
                params![run, artifact.sha256],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::sql("reading an artifact"))
        })?;
        verified(run, artifact, bytes)
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
