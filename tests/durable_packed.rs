//! Recovery when the records of one commit share a row of the log (schema 5): a crash
//! inside such a commit loses the whole batch and nothing before it, and a row torn in
//! the middle keeps the records before the tear. With the real binary and store;
//! effects counted where they land (lines in the granted file) or, for retry-safe work,
//! as results in the log.

mod support;

use heddle_store::RunStore as _;
use support::store::{StoreDir, expect, reference_outputs, run_id};

/// The store support's FANOUT with a retry-safe WASM node after the write: its results are group-committed,
/// so they share rows with the writes' records that sync them.
const FANOUT_UP: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": ["a\n", "b\n", "c\n", "d\n", "e\n", "f\n"]}},
    {"id": "each", "type": "heddle.foreach"},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "all", "type": "heddle.collect"},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
    {"source": "each", "sourceHandle": "item", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "path", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "all", "targetHandle": "item"},
    {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// Six items through two retry-safe WASM nodes: nothing outside the process, so any
/// prefix of its log is a state a crash can leave.
const PURE_FANOUT: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": ["a", "b", "c", "d", "e", "f"]}},
    {"id": "each", "type": "heddle.foreach"},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "low", "type": "std.text.case", "properties": {"mode": "lower"}},
    {"id": "all", "type": "heddle.collect"},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
    {"source": "each", "sourceHandle": "item", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "low", "targetHandle": "text"},
    {"source": "low", "sourceHandle": "text", "target": "all", "targetHandle": "item"},
    {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// Rows of the store's logs that hold several records.
fn packed_rows(d: &StoreDir) -> i64 {
    let db = rusqlite::Connection::open(d.db()).unwrap();
    db.query_row(
        "SELECT count(*) FROM events WHERE kind = 'packed'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn a_crash_inside_a_commit_of_several_records_loses_that_batch_only() {
    let reference = reference_outputs(FANOUT_UP);
    for n in [1, 4, 6] {
        let what = format!("mid-commit:up:{n}");
        let env = StoreDir::with_graph(FANOUT_UP);
        // Aborted inside the transaction holding up's n-th result, before its commit:
        // the batch (results and the writes' records that synced it) is all lost.
        let id = env.crash(&what, &[]);
        let (out, reoffers) = env.resume_until_done(&id, &reference, &what);
        assert_eq!(out, reference, "{what}");
        env.assert_fanout_effects(reoffers, &what);
        assert_eq!(env.show(&id)["state"], "completed", "{what}");
        // Every result of `up` recorded once.
        assert_eq!(env.records("completed", "up").len(), 6, "{what}");
        assert!(packed_rows(&env) > 0, "{what}: no row held several records");
    }
}

#[test]
fn a_run_whose_last_row_was_torn_mid_row_keeps_the_records_before_the_tear() {
    let reference = reference_outputs(PURE_FANOUT);
    let env = StoreDir::with_graph(PURE_FANOUT);
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, support::OK);
    let id = run_id(&o);
    // The log as a crash while writing its last row of results would leave it: the rows
    // after that one never written, its last record cut short.
    {
        let db = rusqlite::Connection::open(env.db()).unwrap();
        let key: i64 = db
            .query_row(
                "SELECT max(seq) FROM events WHERE run_id = ?1 AND kind = 'packed'",
                [&id],
                |r| r.get(0),
            )
            .unwrap();
        db.execute(
            "DELETE FROM events WHERE run_id = ?1 AND seq > ?2",
            rusqlite::params![id, key],
        )
        .unwrap();
        db.execute(
            "UPDATE events SET body = substr(body, 1, length(body) - 3)
             WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![id, key],
        )
        .unwrap();
    }
    let store = heddle_store::SqliteStore::open(&env.db()).unwrap();
    let torn = store.read(&id, 0).unwrap();
    let kept = torn.records.clone();
    let results_kept = kept
        .iter()
        .filter(|s| s.record.kind() == "completed")
        .count();
    assert!(results_kept > 0, "the row kept nothing: {kept:?}");
    assert_eq!(torn.torn_tail, Some(kept.len() as u64));
    drop(store);
    assert_eq!(env.show(&id)["state"], "interrupted");

    let (out, reoffers) = env.resume_until_done(&id, &reference, "torn mid-row");
    assert_eq!(out, reference);
    assert_eq!(reoffers, 0, "retry-safe work never asks");
    assert_eq!(env.show(&id)["state"], "completed");
    // The records before the tear are still there, unchanged, and were not run again:
    // one result per occurrence, the torn one recorded anew.
    let store = heddle_store::SqliteStore::open(&env.db()).unwrap();
    let after = store.read(&id, 0).unwrap();
    assert_eq!(after.torn_tail, None);
    assert_eq!(after.records[..kept.len()], kept[..]);
    assert_eq!(env.records("completed", "up").len(), 6);
    assert_eq!(env.records("completed", "low").len(), 6);
}
