//! How records are stored on disk: results in a compact binary body, everything else as
//! JSON text, both under the record's checksum; the records of one commit packed into
//! one row, each still under its own checksum; and logs written before either (schema
//! version 3, every body JSON; version 4, a row per record) still read back after the
//! store migrates.

use std::collections::BTreeMap;
use std::path::Path;

use heddle_core::{
    Decider, InvocationMetrics, Map, Occurrence, Origin, PlanSummary, PlannedNode, Record,
    RecordedAction, RecordedVerdict, Value,
};
use heddle_store::{
    Budget, NewRun, RunLimits, RunStore, SqliteStore, StoreError, SuperviseMode, WatchdogLimits,
};

fn new_run() -> NewRun {
    NewRun {
        graph_name: "g.json".into(),
        graph_bytes: b"{}".to_vec(),
        plan: PlanSummary::default(),
        inputs: BTreeMap::new(),
        secrets: Vec::new(),
        packages: BTreeMap::new(),
        limits: RunLimits::default(),
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
            http_requests: 3,
            http_bytes: 70_000,
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
    // One append each: a record that commits alone is a row of its own (records that
    // commit together share one: see the packed tests below).
    for (seq, r) in recs.iter().enumerate() {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), false)
            .unwrap();
    }
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
    for (seq, r) in recs.iter().enumerate() {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), true)
            .unwrap();
    }
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
    assert_eq!(user_version(&path), 8);
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

/// The rows of `run`'s log as stored: (key, kind column).
fn rows_of(path: &Path, run: &str) -> Vec<(i64, String)> {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut s = c
        .prepare("SELECT seq, kind FROM events WHERE run_id = ?1 ORDER BY seq")
        .unwrap();
    s.query_map([run], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Runs `statement` (an UPDATE or DELETE of `run`'s rows, `?1` the run id) on the file
/// directly, as damage from outside the store would.
fn edit_rows(path: &Path, run: &str, statement: &str) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute(statement, [run]).unwrap();
}

/// The schema version the file is marked with.
fn user_version(path: &Path) -> i64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// Keeps the first `len` bytes of the body of row `key`, as a write cut short would.
fn cut_row(path: &Path, run: &str, key: i64, len: i64) {
    let c = rusqlite::Connection::open(path).unwrap();
    let n = c
        .execute(
            "UPDATE events SET body = substr(body, 1, ?3) WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![run, key, len],
        )
        .unwrap();
    assert_eq!(n, 1, "no row {key}");
}

fn body_len(path: &Path, run: &str, key: i64) -> i64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row(
        "SELECT length(body) FROM events WHERE run_id = ?1 AND seq = ?2",
        rusqlite::params![run, key],
        |r| r.get(0),
    )
    .unwrap()
}

fn started(node: &str) -> Record {
    Record::Started {
        occurrence: Occurrence::new(node, "", 0),
    }
}

fn opened() -> Record {
    Record::Opened {
        epoch: 1,
        reason: heddle_core::OpenReason::Start,
        pid: 1,
        trace: None,
    }
}

/// A batch as the log writer commits it: the run opening, work records, then more.
fn batch() -> Vec<Record> {
    vec![
        opened(),
        dispatched("a"),
        started("a"),
        completed("a", awkward()),
        completed("b", Value::Int(2)),
        completed("c", Value::str("three")),
        started("d"),
    ]
}

fn records(store: &SqliteStore, run: &str, from: u64) -> Vec<Record> {
    store
        .read(run, from)
        .unwrap()
        .records
        .into_iter()
        .map(|s| s.record)
        .collect()
}

#[test]
fn records_committed_together_share_a_row_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let recs = batch();
    store.append(&id, epoch, 0, &recs, false).unwrap();
    // The lifecycle record keeps a row of its own (a listing reads those alone); the
    // work after it is one row, keyed by its last record.
    assert_eq!(
        rows_of(&path, &id),
        [(0, "opened".to_string()), (6, "packed".to_string())]
    );
    assert_eq!(records(&store, &id, 0), recs);
    // Read from inside the row: the records from there on, numbered as appended.
    let read = store.read(&id, 4).unwrap();
    assert_eq!(
        read.records.iter().map(|s| s.seq).collect::<Vec<_>>(),
        [4, 5, 6]
    );
    assert_eq!(records(&store, &id, 4), recs[4..]);
    assert_eq!(store.list().unwrap()[0].records, 7);
    assert_eq!(store.read_lifecycle(&id).unwrap().len(), 1);
    // The next append goes on after the row's last record, and a stale number is refused.
    assert!(matches!(
        store.append(&id, epoch, 6, &[started("e")], false),
        Err(StoreError::NotNext { next: 7, .. })
    ));
    store.append(&id, epoch, 7, &batch(), false).unwrap();
    let mut all = recs.clone();
    all.extend(batch());
    assert_eq!(records(&store, &id, 0), all);
}

/// Every cut of a packed row at the end of the log keeps exactly the records before the
/// cut and reports the first one after it as the torn tail; the next owner keeps those
/// and appends in the place of the rest.
#[test]
fn a_packed_row_cut_anywhere_keeps_the_records_before_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let recs = batch();
    let full = {
        let id = store.create_run(&new_run()).unwrap().run_id;
        let epoch = store.acquire(&id).unwrap();
        store.append(&id, epoch, 0, &recs, false).unwrap();
        body_len(&path, &id, 6)
    };
    let mut kept_before = 0;
    for len in 0..full {
        let id = store.create_run(&new_run()).unwrap().run_id;
        let epoch = store.acquire(&id).unwrap();
        store.append(&id, epoch, 0, &recs, false).unwrap();
        cut_row(&path, &id, 6, len);
        let read = store.read(&id, 0).unwrap();
        let kept = read.records.len();
        assert!(kept < recs.len(), "cut at {len} kept all");
        assert!(
            kept >= kept_before,
            "cut at {len} kept fewer than a shorter cut"
        );
        kept_before = kept;
        assert_eq!(read.torn_tail, Some(kept as u64), "cut at {len}");
        let back: Vec<Record> = read.records.into_iter().map(|s| s.record).collect();
        assert_eq!(back, recs[..kept], "cut at {len}");
        // Taken over: the torn records are gone, the ones before stay.
        let epoch = store.acquire(&id).unwrap();
        assert_eq!(store.read(&id, 0).unwrap().torn_tail, None, "cut at {len}");
        assert_eq!(records(&store, &id, 0), recs[..kept], "cut at {len}");
        store
            .append(&id, epoch, kept as u64, &recs[kept..], false)
            .unwrap();
        assert_eq!(records(&store, &id, 0), recs, "cut at {len}");
    }
    // A cut inside the last record's frame keeps all the others.
    assert_eq!(kept_before, recs.len() - 1);
}

/// Damage that is not a tear, or a tear with records after it, quarantines the run.
#[test]
fn a_packed_row_damaged_before_the_end_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let recs = batch();
    let fresh = || {
        let id = store.create_run(&new_run()).unwrap().run_id;
        let epoch = store.acquire(&id).unwrap();
        store.append(&id, epoch, 0, &recs, false).unwrap();
        (id, epoch)
    };
    // A byte of result b's value changed ("three" -> "thrEe" in c, the record at 5):
    // records after it in the row still verify, so it was altered, not torn.
    let (id, _) = fresh();
    edit_rows(&path, &id, "UPDATE events SET body = CAST(replace(body, CAST('three' AS BLOB), CAST('thrEe' AS BLOB)) AS BLOB)
             WHERE run_id = ?1 AND seq = 6");
    match store.read(&id, 0) {
        Err(StoreError::Corrupt { seq: 5, .. }) => {}
        other => panic!("expected record 5 to be corrupt, got {other:?}"),
    }
    // A packed row cut short with a row after it.
    let (id, epoch) = fresh();
    store.append(&id, epoch, 7, &[started("e")], false).unwrap();
    cut_row(&path, &id, 6, body_len(&path, &id, 6) - 3);
    match store.read(&id, 0) {
        Err(StoreError::Corrupt { seq: 6, .. }) => {}
        other => panic!("expected record 6 to be corrupt, got {other:?}"),
    }
    // A packed row whose record count was changed: its header does not verify.
    let (id, epoch) = fresh();
    store.append(&id, epoch, 7, &[started("e")], false).unwrap();
    edit_rows(
        &path,
        &id,
        "UPDATE events SET body = CAST(x'0105' || substr(body, 3) AS BLOB)
             WHERE run_id = ?1 AND seq = 6",
    );
    match store.read(&id, 0) {
        Err(StoreError::Corrupt { seq: 1, .. }) => {}
        other => panic!("expected record 1 to be corrupt, got {other:?}"),
    }
    // A missing packed row is a gap, found from its neighbours' numbers.
    let (id, epoch) = fresh();
    store.append(&id, epoch, 7, &recs, false).unwrap();
    edit_rows(
        &path,
        &id,
        "DELETE FROM events WHERE run_id = ?1 AND seq = 6",
    );
    match store.read(&id, 0) {
        Err(StoreError::Gap {
            expected: 1,
            found: 7,
            ..
        }) => {}
        other => panic!("expected a gap at 1, got {other:?}"),
    }
}

/// A version 4 store (a row per record, binary results) migrates in place: its rows
/// read back as they were, and the log goes on with packed rows after them.
#[test]
fn a_version_4_store_migrates_and_its_rows_read_as_one_record_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    // What heddle 4 wrote: a row per record, results binary. A record appended alone
    // is laid out exactly so; the file is then marked version 4.
    let old = batch();
    for (seq, r) in old.iter().enumerate() {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), false)
            .unwrap();
    }
    drop(store);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", 4).unwrap();
    }
    assert_eq!(rows_of(&path, &id).len(), old.len());
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(user_version(&path), 8);
    assert_eq!(records(&store, &id, 0), old);
    assert_eq!(records(&store, &id, 3), old[3..]);
    let epoch = store.acquire(&id).unwrap();
    store.append(&id, epoch, 7, &batch(), false).unwrap();
    let mut all = old.clone();
    all.extend(batch());
    assert_eq!(records(&store, &id, 0), all);
    assert_eq!(store.list().unwrap()[0].records, 14);
    assert_eq!(
        rows_of(&path, &id).last().unwrap(),
        &(13, "packed".to_string())
    );
}

/// What heddle 5 wrote: the same tables without `runs.header_sums` (this build's file
/// with the column dropped), marked version 5.
fn as_version_5(path: &Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch("ALTER TABLE runs DROP COLUMN header_sums;")
        .unwrap();
    c.pragma_update(None, "user_version", 5).unwrap();
}

/// Changes one byte of `run`'s stored `column` (a text or blob field of its header).
fn flip_header_byte(path: &Path, run: &str, column: &str, at: usize) {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut bytes: Vec<u8> = c
        .query_row(
            &format!("SELECT CAST({column} AS BLOB) FROM runs WHERE run_id = ?1"),
            [run],
            |r| r.get(0),
        )
        .unwrap();
    bytes[at] = if bytes[at] == b'5' { b'9' } else { b' ' };
    let kind: String = c
        .query_row(
            &format!("SELECT typeof({column}) FROM runs WHERE run_id = ?1"),
            [run],
            |r| r.get(0),
        )
        .unwrap();
    let sql = format!("UPDATE runs SET {column} = ?2 WHERE run_id = ?1");
    match kind.as_str() {
        "text" => c.execute(
            &sql,
            rusqlite::params![run, String::from_utf8(bytes).unwrap()],
        ),
        _ => c.execute(&sql, rusqlite::params![run, bytes]),
    }
    .unwrap();
}

fn damaged_field(store: &SqliteStore, run: &str) -> String {
    match store.header(run) {
        Err(StoreError::HeaderCorrupt { field, run: r, .. }) => {
            assert_eq!(r, run);
            field
        }
        other => panic!("expected a damaged header, got {other:?}"),
    }
}

/// A version 5 store (headers without checksums) migrates in place: the upgrade says it
/// checksummed every stored header, which then reads back as it was. From then on a
/// flipped byte in the stored graph, limits or inputs is refused, naming the run and the
/// field, and a header damaged before the upgrade is still caught by its graph digest.
#[test]
fn a_version_5_store_migrates_and_its_run_headers_are_verified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let run = NewRun {
        graph_bytes: br#"{"nodes":[]}"#.to_vec(),
        limits: RunLimits {
            budget: Budget {
                max_dispatches: Some(5),
                ..Budget::default()
            },
            ..RunLimits::default()
        },
        inputs: BTreeMap::from([("n".to_string(), Value::Int(5))]),
        ..new_run()
    };
    let a = store.create_run(&run).unwrap();
    let b = store.create_run(&run).unwrap();
    assert!(store.upgrade().is_none(), "a new file is not an upgrade");
    drop(store);
    as_version_5(&path);
    // Damaged while still version 5: nothing vouches for it but the graph's digest.
    flip_header_byte(&path, &b.run_id, "graph_bytes", 1);

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(user_version(&path), 8);
    let up = store.upgrade().expect("the upgrade is reported").clone();
    assert_eq!((up.from, up.to, up.headers_checksummed), (5, 8, 2));
    assert!(
        up.to_string()
            .contains("checksummed the stored headers of 2 run(s)"),
        "{up}"
    );
    assert_eq!(store.header(&a.run_id).unwrap(), a);
    assert_eq!(damaged_field(&store, &b.run_id), "graph_bytes");
    drop(store);
    assert!(SqliteStore::open(&path).unwrap().upgrade().is_none());

    for (column, at, field) in [
        ("limits", r#"{"max_dispatches":"#.len(), "limits"),
        ("inputs", 1, "inputs"),
        ("graph_sha256", 0, "graph_sha256"),
        ("header_sums", 0, "header_sums"),
    ] {
        let c = tempfile::tempdir().unwrap();
        let copy = c.path().join("runs.db");
        std::fs::copy(&path, &copy).unwrap();
        flip_header_byte(&copy, &a.run_id, column, at);
        let before = std::fs::read(&copy).unwrap();
        let store = SqliteStore::open(&copy).unwrap();
        assert_eq!(damaged_field(&store, &a.run_id), field, "{column}");
        drop(store);
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            before,
            "{column}: nothing written"
        );
    }
}

// What is stored as JSON text and was once assembled from JSON bags: verdicts, and a
// run's plan and limits. Each literal below is what heddle wrote before these were
// typed (taken from runs of the real binary: `heddle run --durable` with a `retry`
// policy, a `--policy` skip, a gate approved and one rejected, `--watchdog`, and a run
// created through `heddle serve`). The tests prove that what is written now is the
// same text to the byte, and that the old text reads back to the same record.

/// Verdicts as each writer stored them: the node's own `retry` policy, a supervisor's
/// retry (with and without a decider's note), skip and end_stream, and a person's
/// answer to a gate.
const VERDICTS: &[&str] = &[
    r#"{"kind":"verdict","occurrence":{"node":"parse","key":"each:item=1"},"verdict":{"verdict":"retry","attempt":1,"error":"invalid JSON: expected value at line 1 column 1"},"decided_by":"retry_policy"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"fetch"},"verdict":{"verdict":"retry"},"decided_by":"supervisor"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"fetch","n":2},"verdict":{"verdict":"retry","note":"upstream is back"},"decided_by":"supervisor"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"parse","key":"each:item=1"},"verdict":{"verdict":"skip","error":"invalid JSON: expected value at line 1 column 1"},"decided_by":"supervisor"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"parse"},"verdict":{"verdict":"skip","error":"boom","note":"not needed this week"},"decided_by":"supervisor"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"sum"},"verdict":{"verdict":"end_stream","error":"overflow"},"decided_by":"supervisor"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"approve_release"},"verdict":{"verdict":"approve","note":"looks ok"},"decided_by":"user"}"#,
    r#"{"kind":"verdict","occurrence":{"node":"approve_release"},"verdict":{"verdict":"reject","note":"not today"},"decided_by":"user"}"#,
];

/// The verdict records [`VERDICTS`] holds, built as their writers build them.
fn verdicts() -> Vec<Record> {
    use RecordedAction::*;
    let v =
        |node: &str, key: &str, n: u32, verdict: RecordedVerdict, by: Decider| Record::Verdict {
            occurrence: Occurrence::new(node, key, n),
            verdict,
            decided_by: by,
        };
    let parse_error = "invalid JSON: expected value at line 1 column 1";
    let note = |n: &str| Some(n.to_string());
    vec![
        v(
            "parse",
            "each:item=1",
            0,
            RecordedVerdict {
                attempt: Some(1),
                ..RecordedVerdict::new(Retry).with_error(parse_error)
            },
            Decider::RetryPolicy,
        ),
        v(
            "fetch",
            "",
            0,
            RecordedVerdict::new(Retry).with_note(None),
            Decider::Supervisor,
        ),
        v(
            "fetch",
            "",
            2,
            RecordedVerdict::new(Retry).with_note(note("upstream is back")),
            Decider::Supervisor,
        ),
        v(
            "parse",
            "each:item=1",
            0,
            RecordedVerdict::new(Skip).with_error(parse_error),
            Decider::Supervisor,
        ),
        v(
            "parse",
            "",
            0,
            RecordedVerdict::new(Skip)
                .with_error("boom")
                .with_note(note("not needed this week")),
            Decider::Supervisor,
        ),
        v(
            "sum",
            "",
            0,
            RecordedVerdict::new(EndStream).with_error("overflow"),
            Decider::Supervisor,
        ),
        v(
            "approve_release",
            "",
            0,
            RecordedVerdict::new(Approve).with_note(note("looks ok")),
            Decider::User,
        ),
        v(
            "approve_release",
            "",
            0,
            RecordedVerdict::new(Reject).with_note(note("not today")),
            Decider::User,
        ),
    ]
}

/// The text body of single row `key`.
fn text_body(path: &Path, run: &str, key: i64) -> String {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row(
        "SELECT body FROM events WHERE run_id = ?1 AND seq = ?2",
        rusqlite::params![run, key],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn verdicts_are_stored_as_before_and_old_ones_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let recs = verdicts();
    for (seq, r) in recs.iter().enumerate() {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), false)
            .unwrap();
    }
    for (seq, text) in VERDICTS.iter().enumerate() {
        assert_eq!(&text_body(&path, &id, seq as i64), text, "record {seq}");
    }
    assert_eq!(records(&store, &id, 0), recs);

    // The same text written by an older heddle (a row per record, version 4) reads back
    // as the same records.
    let old = store.create_run(&new_run()).unwrap().run_id;
    drop(store);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        for (seq, body) in VERDICTS.iter().enumerate() {
            let crc = crc(&old, seq as u64, "verdict", body.as_bytes());
            c.execute(
                "INSERT INTO events (run_id, seq, at_ms, kind, body, crc) VALUES (?1, ?2, 0, 'verdict', ?3, ?4)",
                rusqlite::params![old, seq as i64, body, crc as i64],
            )
            .unwrap();
        }
        c.pragma_update(None, "user_version", 4).unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(records(&store, &old, 0), recs);
}

/// Plans as stored: built-in, package and code nodes.
const PLAN: &str = r#"{"nodes":[{"id":"items","type":"heddle.input","retry_safe":false,"origin":"builtin"},{"id":"parse","type":"std.json.parse","retry_safe":true,"origin":"package:std@0.1.0"},{"id":"sh","type":"code.bash","retry_safe":false,"origin":"code"},{"id":"numbers","type":"heddle.output","retry_safe":false,"origin":"builtin"}],"edges":3}"#;

/// Limits as stored: a budget and a node timeout (`heddle run --durable`), none of
/// them, the watchdog's (`heddle run --watchdog`), the server's supervision, and the
/// trace of a run the server queued under a caller's `traceparent`.
const LIMITS: &[&str] = &[
    r#"{"max_dispatches":10,"time_limit_ms":60000,"node_timeout_ms":5000}"#,
    r#"{"node_timeout_ms":null}"#,
    r#"{"node_timeout_ms":null,"watchdog":{"max_restarts":2,"backoff_initial_ms":100,"backoff_max_ms":5000,"run_time_limit_ms":null,"output_limit_bytes":1000000}}"#,
    r#"{"time_limit_ms":300,"node_timeout_ms":null,"supervise":"interactive"}"#,
    r#"{"node_timeout_ms":null,"supervise":"none"}"#,
    r#"{"node_timeout_ms":null,"supervise":{"policy":{"document":"[[rule]]\nverdict = \"skip\"\n"}}}"#,
    r#"{"node_timeout_ms":null,"supervise":{"llm":{"model":"gpt-4o-mini"}}}"#,
    r#"{"node_timeout_ms":null,"supervise":{"llm":{}}}"#,
    r#"{"node_timeout_ms":null,"supervise":"none","trace":{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","parent":"00f067aa0ba902b7","span":"b7ad6b7169203331","sampled":true}}"#,
];

/// The plan [`PLAN`] holds, built as its writer builds it.
fn plan() -> PlanSummary {
    let node = |id: &str, ty: &str, retry_safe: bool, origin: Origin| PlannedNode {
        id: id.into(),
        node_type: ty.into(),
        retry_safe,
        origin,
    };
    PlanSummary {
        nodes: vec![
            node("items", "heddle.input", false, Origin::Builtin),
            node(
                "parse",
                "std.json.parse",
                true,
                Origin::Package {
                    name: "std".into(),
                    version: "0.1.0".into(),
                },
            ),
            node("sh", "code.bash", false, Origin::Code),
            node("numbers", "heddle.output", false, Origin::Builtin),
        ],
        edges: 3,
        ..PlanSummary::default()
    }
}

/// The limits [`LIMITS`] holds, built as their writers build them.
fn limits() -> Vec<RunLimits> {
    let budget = |max_dispatches, time_limit_ms| Budget {
        max_dispatches,
        time_limit_ms,
    };
    // The watchdog's own limits, which the store keeps as the watchdog encodes them.
    let watchdog = WatchdogLimits::new(&serde_json::json!({
        "max_restarts": 2, "backoff_initial_ms": 100, "backoff_max_ms": 5000,
        "run_time_limit_ms": null, "output_limit_bytes": 1000000
    }))
    .unwrap();
    vec![
        RunLimits {
            budget: budget(Some(10), Some(60000)),
            node_timeout_ms: Some(5000),
            ..RunLimits::default()
        },
        RunLimits::default(),
        RunLimits {
            watchdog: Some(watchdog),
            ..RunLimits::default()
        },
        RunLimits {
            budget: budget(None, Some(300)),
            supervise: Some(SuperviseMode::Interactive),
            ..RunLimits::default()
        },
        RunLimits {
            supervise: Some(SuperviseMode::None),
            ..RunLimits::default()
        },
        RunLimits {
            supervise: Some(SuperviseMode::Policy {
                document: "[[rule]]\nverdict = \"skip\"\n".into(),
            }),
            ..RunLimits::default()
        },
        RunLimits {
            supervise: Some(SuperviseMode::Llm {
                model: Some("gpt-4o-mini".into()),
                endpoint: None,
            }),
            ..RunLimits::default()
        },
        RunLimits {
            supervise: Some(SuperviseMode::Llm {
                model: None,
                endpoint: None,
            }),
            ..RunLimits::default()
        },
        RunLimits {
            supervise: Some(SuperviseMode::None),
            trace: Some(queued_trace()),
            ..RunLimits::default()
        },
    ]
}

/// The trace of the queued run in [`LIMITS`].
fn queued_trace() -> heddle_core::trace::RunTrace {
    heddle_core::trace::RunTrace {
        trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".parse().unwrap(),
        parent: Some("00f067aa0ba902b7".parse().unwrap()),
        span: "b7ad6b7169203331".parse().unwrap(),
        sampled: true,
    }
}

/// A run queued on a shared store is recorded with the trace it was created under, and
/// no process has opened it yet: that trace is the one its first owner continues; once
/// an `opened` record carries a trace, that one is.
#[test]
fn a_queued_runs_trace_is_found_before_any_process_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("runs.db")).unwrap();
    let run = NewRun {
        limits: RunLimits {
            trace: Some(queued_trace()),
            ..RunLimits::default()
        },
        ..new_run()
    };
    let id = store.create_run(&run).unwrap().run_id;
    let header = store.header(&id).unwrap();
    let read = store.read(&id, 0).unwrap().records;
    assert!(read.is_empty());
    assert_eq!(
        heddle_store::session::recorded_trace(&header, &read),
        Some(queued_trace())
    );
    let plain = store.create_run(&new_run()).unwrap().run_id;
    let header = store.header(&plain).unwrap();
    assert_eq!(heddle_store::session::recorded_trace(&header, &[]), None);
}

/// A run header's text columns as stored.
fn header_text(path: &Path, run: &str) -> (String, String) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row(
        "SELECT plan, limits FROM runs WHERE run_id = ?1",
        [run],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[test]
fn plans_and_limits_are_stored_as_before_and_old_ones_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    for (text, limits) in LIMITS.iter().zip(limits()) {
        let run = NewRun {
            plan: plan(),
            limits,
            ..new_run()
        };
        let h = store.create_run(&run).unwrap();
        assert_eq!(
            header_text(&path, &h.run_id),
            (PLAN.to_string(), text.to_string())
        );
        assert_eq!(store.header(&h.run_id).unwrap().run, run);
    }

    // The same text written by an older heddle (a version 5 store, from before header
    // checksums) reads back as the same header once the store is upgraded.
    drop(store);
    for (text, limits) in LIMITS.iter().zip(limits()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let id = SqliteStore::open(&path)
            .unwrap()
            .create_run(&new_run())
            .unwrap()
            .run_id;
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute(
            "UPDATE runs SET plan = ?2, limits = ?3 WHERE run_id = ?1",
            rusqlite::params![id, PLAN, text],
        )
        .unwrap();
        drop(c);
        as_version_5(&path);
        let h = SqliteStore::open(&path).unwrap().header(&id).unwrap();
        assert_eq!((h.run.plan, h.run.limits), (plan(), limits));
    }
}

/// A person's answers to a reconcile pause, as stored: JSON text like every record but
/// a result, the completion followed by the result holding the outputs they supplied
/// (a result record, binary, like any other).
const ANSWERS: &[&str] = &[
    r#"{"kind":"reconciled","occurrence":{"node":"send","key":"each:item=2"},"answer":"completed","by":"alice","note":"the mail is in the sent folder"}"#,
    r#"{"kind":"reconciled","occurrence":{"node":"charge","n":1},"answer":"skipped","by":"bob","note":"the payment provider shows no charge"}"#,
];

#[test]
fn reconcile_answers_are_json_text_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let recs = [
        Record::Reconciled {
            occurrence: Occurrence::new("send", "each:item=2", 0),
            answer: heddle_core::ReconcileAnswer::Completed,
            by: "alice".into(),
            note: "the mail is in the sent folder".into(),
        },
        Record::Reconciled {
            occurrence: Occurrence::new("charge", "", 1),
            answer: heddle_core::ReconcileAnswer::Skipped,
            by: "bob".into(),
            note: "the payment provider shows no charge".into(),
        },
    ];
    for (seq, r) in recs.iter().enumerate() {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), false)
            .unwrap();
    }
    for (seq, text) in ANSWERS.iter().enumerate() {
        assert_eq!(&text_body(&path, &id, seq as i64), text, "record {seq}");
    }
    assert_eq!(records(&store, &id, 0), recs);
    // Written together with the result holding the supplied outputs (as a take-over
    // writes them): one packed row, each record under its own checksum.
    let result = completed("send", awkward());
    store
        .append(&id, epoch, 2, &[recs[0].clone(), result.clone()], true)
        .unwrap();
    assert_eq!(
        records(&store, &id, 2),
        [recs[0].clone(), result],
        "an answer and its result read back as written"
    );
}

/// `opened` records as stored: a start by a process that traces nothing (what every
/// heddle wrote before runs were traced), a traced start under a caller's span, a
/// traced start of a trace of its own, and a recovery (which records no trace: the
/// first one recorded is the run's).
const OPENED: &[&str] = &[
    r#"{"kind":"opened","epoch":1,"reason":"start","pid":4242}"#,
    r#"{"kind":"opened","epoch":2,"reason":"start","pid":4242,"trace":{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","parent":"00f067aa0ba902b7","span":"b7ad6b7169203331","sampled":true}}"#,
    r#"{"kind":"opened","epoch":3,"reason":"start","pid":7,"trace":{"trace_id":"0af7651916cd43dd8448eb211c80319c","span":"00000000000000ff","sampled":false}}"#,
    r#"{"kind":"opened","epoch":4,"reason":"recover","pid":8}"#,
];

/// The records [`OPENED`] holds, built as their writer builds them.
fn opened_records() -> Vec<Record> {
    use heddle_core::OpenReason::{Recover, Start};
    use heddle_core::trace::RunTrace;
    let trace = |t: &str, parent: Option<&str>, span: &str, sampled| RunTrace {
        trace_id: t.parse().unwrap(),
        parent: parent.map(|p| p.parse().unwrap()),
        span: span.parse().unwrap(),
        sampled,
    };
    vec![
        Record::Opened {
            epoch: 1,
            reason: Start,
            pid: 4242,
            trace: None,
        },
        Record::Opened {
            epoch: 2,
            reason: Start,
            pid: 4242,
            trace: Some(trace(
                "4bf92f3577b34da6a3ce929d0e0e4736",
                Some("00f067aa0ba902b7"),
                "b7ad6b7169203331",
                true,
            )),
        },
        Record::Opened {
            epoch: 3,
            reason: Start,
            pid: 7,
            trace: Some(trace(
                "0af7651916cd43dd8448eb211c80319c",
                None,
                "00000000000000ff",
                false,
            )),
        },
        Record::Opened {
            epoch: 4,
            reason: Recover,
            pid: 8,
            trace: None,
        },
    ]
}

/// A run's trace rides on its `opened` record (JSON, so a heddle from before traces
/// reads such a record as it always did, the field unknown to it ignored); a record
/// written before runs were traced reads back as carrying none, and the trace the
/// log records is the first one carried.
#[test]
fn opened_records_carry_the_trace_and_old_ones_read_back_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let recs = opened_records();
    for (seq, r) in recs.iter().enumerate() {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), false)
            .unwrap();
    }
    for (seq, text) in OPENED.iter().enumerate() {
        assert_eq!(&text_body(&path, &id, seq as i64), text, "record {seq}");
    }
    let read = store.read(&id, 0).unwrap().records;
    let header = store.header(&id).unwrap();
    assert_eq!(
        heddle_store::session::recorded_trace(&header, &read),
        match &recs[1] {
            Record::Opened { trace, .. } => *trace,
            _ => unreachable!(),
        }
    );
    assert_eq!(
        heddle_store::session::recorded_trace(&header, &read[..1]),
        None
    );

    let old = store.create_run(&new_run()).unwrap().run_id;
    drop(store);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        for (seq, body) in OPENED.iter().enumerate() {
            let crc = crc(&old, seq as u64, "opened", body.as_bytes());
            c.execute(
                "INSERT INTO events (run_id, seq, at_ms, kind, body, crc) VALUES (?1, ?2, 0, 'opened', ?3, ?4)",
                rusqlite::params![old, seq as i64, body, crc as i64],
            )
            .unwrap();
        }
        c.pragma_update(None, "user_version", 4).unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(records(&store, &old, 0), recs);
}
