//! How records are stored on disk: results in a compact binary body, everything else as
//! JSON text, both under the record's checksum; and logs written before the binary form
//! (schema version 3, every body JSON) still read back after the store migrates.

use std::collections::BTreeMap;
use std::path::Path;

use heddle_core::{InvocationMetrics, Map, Occurrence, Record, Value};
use heddle_store::{NewRun, RunStore, SqliteStore, StoreError};

fn new_run() -> NewRun {
    NewRun {
        graph_name: "g.json".into(),
        graph_bytes: b"{}".to_vec(),
        plan: serde_json::Value::Null,
        inputs: BTreeMap::new(),
        secrets: Vec::new(),
        packages: BTreeMap::new(),
        limits: serde_json::Value::Null,
    }
}

fn completed(node: &str, v: Value) -> Record {
    Record::Completed {
        occurrence: Occurrence::new(node, "each:item=3", 1),
        outputs: vec![("result".into(), v)],
        emitted: vec![("line".into(), Value::str("x"))],
        metrics: InvocationMetrics {
            wall_us: 12,
            fuel: Some(3456),
            peak_memory_bytes: Some(65536),
            cost_usd: 0.5,
            cost_reports: 1,
            assets: vec!["file:/data/a".into()],
        },
    }
}

fn dispatched(node: &str) -> Record {
    Record::Dispatched {
        occurrence: Occurrence::new(node, "", 0),
        retry_safe: false,
    }
}

/// A value with everything JSON would not give back as it was.
fn awkward() -> Value {
    let mut lookalike = Map::new();
    lookalike.insert("$bytes".into(), Value::str("AAE="));
    Value::list(vec![
        Value::Int(i64::MIN),
        Value::Float(2.0),
        Value::Float(f64::NEG_INFINITY),
        Value::Bytes(vec![0u8, 1, 255].into()),
        Value::object(lookalike),
        Value::str("ünïcode"),
        Value::Null,
        Value::Bool(false),
    ])
}

fn body_types(path: &Path, run: &str) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut s = c
        .prepare("SELECT kind, typeof(body) FROM events WHERE run_id = ?1 ORDER BY seq")
        .unwrap();
    s.query_map([run], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn results_are_binary_other_records_json_and_both_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let recs = [dispatched("a"), completed("a", awkward())];
    store.append(&id, epoch, 0, &recs, false).unwrap();
    assert_eq!(
        body_types(&path, &id),
        [
            ("dispatched".to_string(), "text".to_string()),
            ("completed".to_string(), "blob".to_string())
        ]
    );
    // Another connection reads the same records back.
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.torn_tail, None);
    let back: Vec<Record> = read.records.into_iter().map(|s| s.record).collect();
    assert_eq!(back, recs);
}

#[test]
fn a_torn_binary_result_is_absent_at_the_end_and_corrupt_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let recs = [
        completed("a", Value::Int(1)),
        completed("b", Value::Int(2)),
        completed("c", awkward()),
    ];
    store.append(&id, epoch, 0, &recs, true).unwrap();
    let cut = |seq: i64| {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute(
            "UPDATE events SET body = substr(body, 1, 10) WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![id, seq],
        )
        .unwrap();
    };
    // Cut the last result short, as a crash in the middle of writing it would.
    cut(2);
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), 2);
    assert_eq!(read.torn_tail, Some(2));
    // The next owner takes its slot.
    let epoch = store.acquire(&id).unwrap();
    store.append(&id, epoch, 2, &recs[2..], true).unwrap();
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.torn_tail, None);
    assert_eq!(read.records[2].record, recs[2]);

    // A result cut short before the end is corruption, not a torn tail.
    cut(0);
    match store.read(&id, 0) {
        Err(StoreError::Corrupt { seq: 0, .. }) => {}
        other => panic!("expected record 0 to be corrupt, got {other:?}"),
    }
}

/// The checksum of a stored record as every schema version computes it: the run, the
/// sequence number (little-endian), the kind and the body's bytes.
fn crc(run: &str, seq: u64, kind: &str, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(run.as_bytes());
    h.update(&seq.to_le_bytes());
    h.update(kind.as_bytes());
    h.update(body);
    h.finalize()
}

#[test]
fn a_version_3_store_with_json_results_migrates_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    drop(store);
    // What heddle wrote before results were binary: every body JSON text, version 3
    // (its tables are the same).
    let old = [dispatched("a"), completed("a", Value::Int(7))];
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        for (seq, r) in old.iter().enumerate() {
            let body = serde_json::to_string(r).unwrap();
            c.execute(
                "INSERT INTO events (run_id, seq, at_ms, kind, body, crc) VALUES (?1, ?2, 0, ?3, ?4, ?5)",
                rusqlite::params![id, seq as i64, r.kind(), body, crc(&id, seq as u64, r.kind(), body.as_bytes()) as i64],
            )
            .unwrap();
        }
        c.pragma_update(None, "user_version", 3).unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let c = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
    let back: Vec<Record> = store
        .read(&id, 0)
        .unwrap()
        .records
        .into_iter()
        .map(|s| s.record)
        .collect();
    assert_eq!(back, old);
    // The log continues with binary results after the JSON ones.
    let epoch = store.acquire(&id).unwrap();
    let next = completed("b", Value::Int(8));
    store
        .append(&id, epoch, 2, std::slice::from_ref(&next), true)
        .unwrap();
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), 3);
    assert_eq!(read.records[2].record, next);
    assert_eq!(body_types(&path, &id)[1].1, "text");
    assert_eq!(body_types(&path, &id)[2].1, "blob");
}
