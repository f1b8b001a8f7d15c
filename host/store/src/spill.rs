//! Values too large to travel inline: a node's output (or emitted value) whose JSON is
//! over the run's inline limit is stored as a content-addressed artifact of the run, and
//! the log record carries a reference in its place, serialized as
//! `{"$artifact":{"sha256":"<hex>","size":<bytes>}}`. The log stays small (every reader
//! of a record, the event feed among them, pays for its size), and the same bytes are
//! stored once however many records or reports point at them.
//!
//! A reference is recognised only as a whole top-level value of a record's `outputs` or
//! `emitted`. A node value that merely looks like one is spilled too, whatever its size,
//! so every reference in a log is one the store wrote: reading never mistakes a node's
//! data for a pointer.
//!
//! Whoever reads values back (recovery, `heddle runs show`, the final report) calls
//! [`resolve`], which replaces each reference by its bytes verified against the digest
//! (`TERMINAL_ARTIFACT` when missing or corrupt); the event feed sends references as
//! they are.

use std::sync::Arc;

use heddle_core::{Map, Occurrence, Record, Value};

use crate::artifacts::{ArtifactError, ArtifactPolicy, ArtifactRef};
use crate::{RunStore, StoreError, Stored};

/// The key of a reference object.
pub const KEY: &str = "$artifact";

/// Inline limit unless `[store] inline_output_bytes` says otherwise: large enough that
/// ordinary values never leave the log, small enough that a record stays cheap to read.
pub const DEFAULT_INLINE_BYTES: u64 = 64 << 10;

/// How a run's large values are stored.
#[derive(Clone, Debug)]
pub struct Spill {
    /// Values whose JSON is longer than this are stored as artifacts.
    pub inline_bytes: u64,
    /// The limits and known secrets every stored value is held to.
    pub policy: ArtifactPolicy,
}

impl Default for Spill {
    fn default() -> Spill {
        Spill {
            inline_bytes: DEFAULT_INLINE_BYTES,
            policy: ArtifactPolicy::default(),
        }
    }
}

impl ArtifactRef {
    /// The reference as a value, where the value it stands for would be.
    pub fn to_value(&self) -> Value {
        let mut inner = Map::new();
        inner.insert("sha256".into(), Value::str(self.sha256.as_str()));
        inner.insert(
            "size".into(),
            Value::Int(i64::try_from(self.size).unwrap_or(i64::MAX)),
        );
        let mut outer = Map::new();
        outer.insert(KEY.into(), Value::object(inner));
        Value::object(outer)
    }

    /// The reference `v` is, if it has a reference's shape.
    pub fn of_value(v: &Value) -> Option<ArtifactRef> {
        let outer = v.as_object().filter(|m| m.len() == 1)?;
        let inner = outer.get(KEY)?.as_object().filter(|m| m.len() == 2)?;
        let sha256 = inner.get("sha256")?.as_str()?;
        let size = u64::try_from(inner.get("size")?.as_i64()?).ok()?;
        Some(ArtifactRef {
            sha256: sha256.to_string(),
            size,
        })
    }
}

/// Whether `v` must leave the record: a reference lookalike always (see the module
/// docs), anything else when its JSON is longer than `limit`.
fn must_spill(v: &Value, limit: u64) -> bool {
    if let Some(m) = v.as_object()
        && m.len() == 1
        && m.contains_key(KEY)
    {
        return true;
    }
    // The bound is a walk without formatting: almost every value is decided by it, so a
    // record of small values costs no serialization here.
    json_len_bound(v) > limit && exact_json_len(v, limit) > limit
}

/// An upper bound of `v`'s JSON length (every string character as a `\u` escape).
fn json_len_bound(v: &Value) -> u64 {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Int(_) | Value::Float(_) => 32,
        Value::Str(s) => 2 + 6 * s.len() as u64,
        Value::Bytes(b) => 16 + (b.len() as u64).div_ceil(3) * 4,
        Value::List(l) => 2 + l.iter().map(|x| json_len_bound(x) + 1).sum::<u64>(),
        Value::Object(m) => {
            2 + m
                .iter()
                .map(|(k, x)| 4 + 6 * k.len() as u64 + json_len_bound(x))
                .sum::<u64>()
        }
    }
}

/// `v`'s JSON length, counted without keeping the text and given up just past `limit`.
fn exact_json_len(v: &Value, limit: u64) -> u64 {
    struct Count {
        n: u64,
        stop: u64,
    }
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.n += b.len() as u64;
            if self.n > self.stop {
                return Err(std::io::Error::other("past the limit"));
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count { n: 0, stop: limit };
    // The only error is the counter's own stop.
    let _ = serde_json::to_writer(&mut c, v);
    c.n
}

/// `record` with every value that must not travel inline stored under `spill`'s policy
/// and replaced by its reference. Only results carry node values; other records are
/// returned as they are. Nothing is written when nothing must be spilled, nor when a
/// value holds a known secret, inline or not ([`crate::secrets`]: refused).
pub fn spill(
    store: &dyn RunStore,
    run: &str,
    spill: &Spill,
    record: Record,
) -> Result<Record, ArtifactError> {
    let Record::Completed {
        occurrence,
        mut outputs,
        mut emitted,
        metrics,
    } = record
    else {
        return Ok(record);
    };
    let secrets = &spill.policy.known_secrets;
    if !secrets.is_empty()
        && let Some((handle, _)) = outputs
            .iter()
            .chain(emitted.iter())
            .find(|(_, v)| crate::secrets::holds(v, secrets))
    {
        return Err(ArtifactError::SecretInValue {
            run: run.to_string(),
            node: occurrence.node.clone(),
            handle: handle.clone(),
        });
    }
    let stored = spill_values(
        store,
        run,
        spill,
        outputs.iter_mut().chain(emitted.iter_mut()).map(|(_, v)| v),
    )?;
    if stored {
        crate::fault::check(crate::fault::Boundary::AfterArtifact, &occurrence.node);
    }
    Ok(Record::Completed {
        occurrence,
        outputs,
        emitted,
        metrics,
    })
}

/// Replaces each of `values` that must not travel inline by a reference to its stored
/// copy: the same bytes are one artifact, so a value a result record already points at
/// costs nothing more. Returns whether any was stored.
pub fn spill_values<'a>(
    store: &dyn RunStore,
    run: &str,
    spill: &Spill,
    values: impl IntoIterator<Item = &'a mut Value>,
) -> Result<bool, ArtifactError> {
    let mut stored = false;
    for v in values {
        if must_spill(v, spill.inline_bytes) {
            *v = store_value(store, run, &spill.policy, v)?.to_value();
            stored = true;
        }
    }
    Ok(stored)
}

/// The artifacts a run refers to, as its store holds it: every reference in the results
/// of its stored log, and every reference inside a named artifact (a final report holds
/// its large output values as references, some to blobs no record points at: the value
/// of a built-in, which the log never records). Built only by [`Referenced::stored`],
/// from what the store reads back, never from records a caller has in hand: a copy whose
/// references were already replaced by their values ([`resolve`]) refers to nothing,
/// and sweeping by it deleted every artifact of the run (issue 27).
#[derive(Debug, Default)]
pub struct Referenced {
    digests: std::collections::HashSet<String>,
}

impl Referenced {
    /// What `run`'s stored log and named artifacts refer to. `None` when a named
    /// artifact cannot be read back (missing, corrupt, not JSON where it should be):
    /// what it refers to is unknown, so nothing may be dropped.
    pub fn stored(store: &dyn RunStore, run: &str) -> Result<Option<Referenced>, StoreError> {
        let mut digests = std::collections::HashSet::new();
        for s in store.read(run, 0)?.records {
            if let Record::Completed {
                outputs, emitted, ..
            } = &s.record
            {
                digests.extend(
                    outputs
                        .iter()
                        .chain(emitted.iter())
                        .filter_map(|(_, v)| ArtifactRef::of_value(v).map(|r| r.sha256)),
                );
            }
        }
        for (_, named) in store.named_artifacts(run)? {
            let bytes = match store.get_artifact(run, &named) {
                Ok(b) => b,
                Err(ArtifactError::Store(e)) => return Err(e),
                Err(_) => return Ok(None),
            };
            // A named artifact that is not JSON holds no references.
            if let Ok(json) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                references_in(&json, &mut digests);
            }
        }
        Ok(Some(Referenced { digests }))
    }

    pub fn contains(&self, sha256: &str) -> bool {
        self.digests.contains(sha256)
    }

    /// Every digest referred to (a store that filters in its query takes them all).
    pub(crate) fn digests(&self) -> Vec<String> {
        self.digests.iter().cloned().collect()
    }
}

/// Every reference anywhere in `json` (keeping a lookalike too only keeps a blob).
fn references_in(json: &serde_json::Value, out: &mut std::collections::HashSet<String>) {
    match json {
        serde_json::Value::Object(m) => {
            if let Some(sha) = m
                .get(KEY)
                .filter(|_| m.len() == 1)
                .and_then(|r| r.get("sha256"))
                .and_then(|s| s.as_str())
            {
                out.insert(sha.to_string());
            }
            m.values().for_each(|v| references_in(v, out));
        }
        serde_json::Value::Array(l) => l.iter().for_each(|v| references_in(v, out)),
        _ => {}
    }
}

/// Drops the artifacts of `run` nothing refers to ([`Referenced::stored`]): blobs a
/// process committed for a record it never committed (a crash between the two), which
/// nothing can ever read and which would count against the run's quota for good. Only
/// the run's owner calls it, as it takes the run over. Returns the bytes freed.
pub fn sweep(store: &dyn RunStore, run: &str) -> Result<u64, StoreError> {
    match Referenced::stored(store, run)? {
        Some(referenced) => store.drop_unreferenced_artifacts(run, &referenced),
        None => Ok(0),
    }
}

/// Stores `v` (its compact JSON) as an artifact of `run`.
pub fn store_value(
    store: &dyn RunStore,
    run: &str,
    policy: &ArtifactPolicy,
    v: &Value,
) -> Result<ArtifactRef, ArtifactError> {
    // A value serializes to JSON without fail (maps have string keys).
    let bytes = serde_json::to_vec(v).expect("a value serializes");
    store.put_artifact(run, None, &bytes, policy)
}

/// The value `r` stands for, its bytes verified.
pub fn load_value(
    store: &dyn RunStore,
    run: &str,
    r: &ArtifactRef,
) -> Result<Value, ArtifactError> {
    let bytes = store.get_artifact(run, r)?;
    serde_json::from_slice(&bytes).map_err(|_| ArtifactError::Corrupt {
        run: run.to_string(),
        sha256: r.sha256.clone(),
        found: "bytes that are not a JSON value".into(),
    })
}

/// Replaces every reference among `values` by the value it refers to, each artifact
/// read and verified once.
pub fn resolve_values<'a>(
    store: &dyn RunStore,
    run: &str,
    values: impl IntoIterator<Item = &'a mut Value>,
) -> Result<(), ArtifactError> {
    let mut loaded: std::collections::HashMap<String, Value> = Default::default();
    for v in values {
        let Some(r) = ArtifactRef::of_value(v) else {
            continue;
        };
        *v = match loaded.get(&r.sha256) {
            Some(found) => found.clone(),
            None => {
                let found = load_value(store, run, &r)?;
                loaded.insert(r.sha256, found.clone());
                found
            }
        };
    }
    Ok(())
}

/// A value of a run's log whose artifact is missing or corrupt, and where it was.
#[derive(Debug)]
pub struct Unreadable {
    pub occurrence: Occurrence,
    pub handle: String,
    pub artifact: ArtifactRef,
    pub error: ArtifactError,
}

/// The key of the marker [`check_marking`] leaves where an unreadable value was.
pub const UNREADABLE: &str = "$unreadable";

impl Unreadable {
    /// `missing` or `corrupt`.
    pub fn problem(&self) -> &'static str {
        match self.error {
            ArtifactError::Missing { .. } => "missing",
            _ => "corrupt",
        }
    }

    /// `{"$unreadable":{"sha256","size","problem"}}`, where the value would be.
    fn marker(&self) -> Value {
        let mut inner = Map::new();
        inner.insert("sha256".into(), Value::str(self.artifact.sha256.as_str()));
        inner.insert(
            "size".into(),
            Value::Int(i64::try_from(self.artifact.size).unwrap_or(i64::MAX)),
        );
        inner.insert("problem".into(), Value::str(self.problem()));
        let mut outer = Map::new();
        outer.insert(UNREADABLE.into(), Value::object(inner));
        Value::object(outer)
    }
}

/// What [`resolve_with`] does with a reference.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Readable {
    /// Reads it back verified and replaces it by the value.
    Inline,
    /// Leaves it as it is, once the store says its artifact is there whole (its size
    /// and the length of its stored pieces, no byte read: a run with many large values
    /// is shown without reading them; the digest is checked whenever they are read).
    Keep,
}

/// Replaces every reference in `records`' results by the value it refers to (each
/// artifact read and verified once), or with [`Readable::Keep`] only verifies it; one
/// that is missing or corrupt is handed to `unreadable`, which says what stands in its
/// place or fails.
fn resolve_with(
    store: &dyn RunStore,
    run: &str,
    records: &mut [Stored],
    readable: Readable,
    mut unreadable: impl FnMut(Unreadable) -> Result<Value, ArtifactError>,
) -> Result<(), ArtifactError> {
    // Per digest read intact: its value (`None` when it is kept as a reference).
    let mut loaded: std::collections::HashMap<String, Option<Value>> = Default::default();
    // What the store holds, by digest, for references kept as they are.
    let listed: std::collections::HashMap<String, crate::artifacts::StoredArtifact> = match readable
    {
        Readable::Keep => store
            .stored_artifacts(run)?
            .into_iter()
            .map(|a| (a.sha256.clone(), a))
            .collect(),
        Readable::Inline => Default::default(),
    };
    for s in records.iter_mut() {
        let Record::Completed {
            occurrence,
            outputs,
            emitted,
            ..
        } = &mut s.record
        else {
            continue;
        };
        for (handle, v) in outputs.iter_mut().chain(emitted.iter_mut()) {
            let Some(r) = ArtifactRef::of_value(v) else {
                continue;
            };
            if let Some(found) = loaded.get(&r.sha256) {
                if let Some(found) = found {
                    *v = found.clone();
                }
                continue;
            }
            let found = match readable {
                Readable::Keep => whole(&listed, run, &r.sha256).map(|()| None),
                Readable::Inline => load_value(store, run, &r).map(Some),
            };
            *v = match found {
                Ok(None) => {
                    loaded.insert(r.sha256, None);
                    continue;
                }
                Ok(Some(found)) => {
                    loaded.insert(r.sha256, Some(found.clone()));
                    found
                }
                Err(
                    e @ (ArtifactError::Missing { .. }
                    | ArtifactError::Cut { .. }
                    | ArtifactError::Corrupt { .. }),
                ) => unreadable(Unreadable {
                    occurrence: occurrence.clone(),
                    handle: handle.clone(),
                    artifact: r,
                    error: e,
                })?,
                Err(e) => return Err(e),
            };
        }
    }
    Ok(())
}

/// Whether `listed` (a run's stored artifacts) holds `sha256` whole: stored, its pieces
/// adding up to its size.
fn whole(
    listed: &std::collections::HashMap<String, crate::artifacts::StoredArtifact>,
    run: &str,
    sha256: &str,
) -> Result<(), ArtifactError> {
    match listed.get(sha256) {
        None => Err(ArtifactError::Missing {
            run: run.to_string(),
            sha256: sha256.to_string(),
        }),
        Some(a) if a.stored != a.size => Err(ArtifactError::Cut {
            run: run.to_string(),
            sha256: sha256.to_string(),
            size: a.size,
            stored: a.stored,
        }),
        Some(_) => Ok(()),
    }
}

/// Replaces every reference in `records`' results by the value it refers to; a
/// missing or corrupt one fails, naming the node and output it belongs to
/// (`TERMINAL_ARTIFACT`).
pub fn resolve(
    store: &dyn RunStore,
    run: &str,
    records: &mut [Stored],
) -> Result<(), ArtifactError> {
    resolve_with(store, run, records, Readable::Inline, |u| {
        Err(ArtifactError::InValue {
            node: u.occurrence.node,
            handle: u.handle,
            source: Box::new(u.error),
        })
    })
}

/// For a reader that shows a run rather than running it on: every reference is left a
/// reference (the values are fetched by whoever shows them, so the run's shown size
/// does not grow with its values) once the store says its artifact is there whole,
/// without reading it (the digest is checked when it is fetched); a missing or cut one
/// is replaced by a marker (`{"$unreadable":{"sha256","size","problem"}}`) and listed,
/// so the rest of the run can still be shown. Store errors still fail.
pub fn check_marking(
    store: &dyn RunStore,
    run: &str,
    records: &mut [Stored],
) -> Result<Vec<Unreadable>, ArtifactError> {
    let mut out = Vec::new();
    resolve_with(store, run, records, Readable::Keep, |u| {
        let marker = u.marker();
        out.push(u);
        Ok(marker)
    })?;
    Ok(out)
}

/// Checks that every artifact `run`'s log refers to is there and intact.
pub fn verify(store: &dyn RunStore, run: &str) -> Result<(), ArtifactError> {
    let mut records = store.read(run, 0)?.records;
    resolve(store, run, &mut records)
}

/// A run's spill settings shared by its journal, set once by whoever knows the run's
/// secrets; [`Spill::default`] until then.
#[derive(Clone)]
pub struct Spiller {
    store: Arc<dyn RunStore>,
    run: String,
    spill: Arc<std::sync::OnceLock<Spill>>,
}

impl Spiller {
    pub fn new(store: Arc<dyn RunStore>, run: &str) -> Spiller {
        Spiller {
            store,
            run: run.to_string(),
            spill: Default::default(),
        }
    }

    /// Sets the run's inline limit and artifact policy; only the first call counts.
    pub fn configure(&self, spill: Spill) {
        let _ = self.spill.set(spill);
    }

    /// The artifact policy the run's values are held to.
    pub fn policy(&self) -> &ArtifactPolicy {
        &self.settings().policy
    }

    fn settings(&self) -> &Spill {
        static DEFAULT: std::sync::OnceLock<Spill> = std::sync::OnceLock::new();
        self.spill
            .get()
            .unwrap_or_else(|| DEFAULT.get_or_init(Spill::default))
    }

    pub fn spill(&self, record: Record) -> Result<Record, ArtifactError> {
        spill(&*self.store, &self.run, self.settings(), record)
    }

    /// [`spill_values`] under the run's settings.
    pub fn spill_values<'a>(
        &self,
        values: impl IntoIterator<Item = &'a mut Value>,
    ) -> Result<bool, ArtifactError> {
        spill_values(&*self.store, &self.run, self.settings(), values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::{InvocationMetrics, Occurrence};

    fn completed(outputs: Vec<(String, Value)>) -> Record {
        Record::Completed {
            occurrence: Occurrence::new("n", "", 0),
            outputs,
            emitted: Vec::new(),
            metrics: InvocationMetrics::default(),
        }
    }

    #[test]
    fn large_values_and_lookalikes_leave_the_record_and_come_back_verified() {
        let (_dir, store, run) = crate::artifacts::tests::store();
        let settings = Spill {
            inline_bytes: 100,
            policy: ArtifactPolicy::default(),
        };
        let big = Value::str("é".repeat(60)); // 120 bytes of UTF-8, 122 of JSON
        let lookalike = ArtifactRef {
            sha256: "0".repeat(64),
            size: 1,
        }
        .to_value();
        let small = Value::list(vec![Value::Int(1); 20]);
        let record = completed(vec![
            ("big".into(), big.clone()),
            ("fake".into(), lookalike.clone()),
            ("small".into(), small.clone()),
        ]);
        let spilled = spill(&store, &run, &settings, record.clone()).unwrap();
        let Record::Completed { outputs, .. } = &spilled else {
            unreachable!()
        };
        let big_ref = ArtifactRef::of_value(&outputs[0].1).expect("a reference");
        assert_eq!(big_ref.size, 122);
        assert!(ArtifactRef::of_value(&outputs[1].1).is_some());
        assert_ne!(outputs[1].1, lookalike, "the lookalike is stored, not kept");
        assert_eq!(outputs[2].1, small);
        // Exactly at the limit stays inline.
        assert!(!must_spill(&Value::str("x".repeat(98)), 100));
        assert!(must_spill(&Value::str("x".repeat(99)), 100));

        let mut read = vec![Stored {
            seq: 0,
            at_ms: 0,
            record: spilled,
        }];
        resolve(&store, &run, &mut read).unwrap();
        assert_eq!(read[0].record, record);

        // A known secret in a large value is refused, not stored.
        let secret = Spill {
            inline_bytes: 10,
            policy: ArtifactPolicy {
                known_secrets: vec!["hunter2".into()],
                ..ArtifactPolicy::default()
            },
        };
        let e = spill(
            &store,
            &run,
            &secret,
            completed(vec![("v".into(), Value::str("xxxxhunter2xxxx"))]),
        )
        .unwrap_err();
        assert_eq!(e.code(), "KNOWN_SECRET");
    }

    /// The sweep keeps what the stored log refers to and what a named artifact (a final
    /// report) refers to, drops the rest, and drops nothing while a named artifact
    /// cannot be read (what it refers to is unknown).
    #[test]
    fn the_sweep_keeps_what_the_stored_log_and_named_artifacts_refer_to() {
        use crate::RunStore as _;
        let (_dir, store, run) = crate::artifacts::tests::store();
        let settings = Spill {
            inline_bytes: 10,
            policy: ArtifactPolicy::default(),
        };
        let logged = spill(
            &store,
            &run,
            &settings,
            completed(vec![("v".into(), Value::str("logged value"))]),
        )
        .unwrap();
        let epoch = store.acquire(&run).unwrap();
        store
            .append(&run, epoch, 0, std::slice::from_ref(&logged), true)
            .unwrap();
        let policy = ArtifactPolicy::default();
        let in_report = store_value(&store, &run, &policy, &Value::str("reported value")).unwrap();
        let orphan = store_value(&store, &run, &policy, &Value::str("orphaned value")).unwrap();
        let report = serde_json::json!({"outputs": {"out": [in_report.to_value().to_json()]}});
        store
            .put_artifact(
                &run,
                Some("final-report"),
                report.to_string().as_bytes(),
                &policy,
            )
            .unwrap();
        let present = |r: &ArtifactRef| store.get_artifact(&run, r).is_ok();

        assert_eq!(sweep(&store, &run).unwrap(), orphan.size);
        assert!(!present(&orphan));
        let Record::Completed { outputs, .. } = &logged else {
            unreachable!()
        };
        assert!(present(&ArtifactRef::of_value(&outputs[0].1).unwrap()));
        assert!(present(&in_report));

        // A damaged report: nothing is dropped, not even a new orphan.
        let orphan = store_value(&store, &run, &policy, &Value::str("another orphan")).unwrap();
        store.with_db(|db| {
            db.execute(
                "UPDATE artifact_pieces SET bytes = x'00' WHERE sha256 =
                 (SELECT sha256 FROM artifact_names WHERE name = 'final-report')",
                [],
            )
            .unwrap();
        });
        assert_eq!(sweep(&store, &run).unwrap(), 0);
        assert!(present(&orphan) && present(&in_report));
    }
}
