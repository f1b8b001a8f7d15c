//! The run stores, each for real (SQLite files on disk, a PostgreSQL server): what they
//! keep, what they refuse, and how a log stays gapless and verifiable. Every test about
//! semantics runs against both (`both!`); the SQLite file's own refusals are at the end.

mod support;

use std::path::Path;
use std::sync::Arc;

use heddle_core::{Occurrence, OpenReason, Record, RunStatus, Value};
use heddle_store::{RunLog, RunState, RunStore, RunView, SqliteStore, StoreError};
use support::{Backend, Fresh, dispatched, new_run};

both!(
    keeps_the_run_exactly_and_lists_it,
    a_torn_last_record_is_absent_and_its_slot_reused,
    a_corrupt_record_before_the_end_quarantines_the_run,
    a_stale_owner_is_fenced_out,
    concurrent_appends_are_gapless_and_keep_each_writers_order,
    a_log_stops_at_its_first_failed_batch,
    a_synced_append_is_on_disk_when_it_returns,
    the_fold_reports_state_pause_and_uncertain_work,
    the_journal_applies_the_crash_table_from_the_log,
    the_lifecycle_records_give_the_state_the_whole_log_gives,
    records_committed_together_read_back_exactly,
    artifacts_are_stored_once_verified_on_read_and_bounded,
    a_damaged_run_header_is_refused_naming_the_run_and_field,
    one_of_concurrent_takers_wins_and_the_losers_write_nothing,
    a_cancel_request_is_seen_by_another_handle_and_leaves_the_log_alone,
    a_large_artifact_is_read_a_piece_at_a_time_and_never_completed_when_damaged,
    a_resume_withdraws_a_cancel_request_a_recovery_keeps,
);

fn keeps_the_run_exactly_and_lists_it(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let run = new_run();
    let h = store.create_run(&run).unwrap();
    assert_eq!(h.graph_sha256, heddle_store::sha256_hex(&run.graph_bytes));
    drop(store);
    // Another process (a fresh connection) reads the same thing back.
    let store = fresh.open();
    let back = store.header(&h.run_id).unwrap();
    assert_eq!(back, h);
    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].run_id, h.run_id);
    match store.header("nope") {
        Err(StoreError::UnknownRun(id)) => assert_eq!(id, "nope"),
        other => panic!("expected UnknownRun, got {other:?}"),
    }
}

/// Every read of a run's header verifies each field against the checksum stored with
/// it (issue 27 item 3): a changed byte in the stored limits, inputs, graph or its
/// checksums is refused as `HeaderCorrupt` naming the run and the field, and runs beside
/// it read as before.
fn a_damaged_run_header_is_refused_naming_the_run_and_field(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let untouched = store.create_run(&new_run()).unwrap();
    // (what is damaged, SQLite, PostgreSQL, the field named)
    let cases = [
        (
            "limits",
            "UPDATE runs SET limits = replace(limits, '10', '99') WHERE run_id = $RUN",
            "UPDATE runs SET limits = replace(limits, '10', '99') WHERE run_id = $RUN",
        ),
        (
            "inputs",
            "UPDATE runs SET inputs = replace(inputs, '3', '4') WHERE run_id = $RUN",
            "UPDATE runs SET inputs = replace(inputs, '3', '4') WHERE run_id = $RUN",
        ),
        (
            "graph_bytes",
            "UPDATE runs SET graph_bytes = CAST(replace(CAST(graph_bytes AS TEXT), 'nodes', 'nodez') AS BLOB)
             WHERE run_id = $RUN",
            "UPDATE runs SET graph_bytes =
                convert_to(replace(convert_from(graph_bytes, 'UTF8'), 'nodes', 'nodez'), 'UTF8')
             WHERE run_id = $RUN",
        ),
        (
            "header_sums",
            "UPDATE runs SET header_sums = NULL WHERE run_id = $RUN",
            "UPDATE runs SET header_sums = NULL WHERE run_id = $RUN",
        ),
    ];
    for (field, sqlite, postgres) in cases {
        let h = store.create_run(&new_run()).unwrap();
        assert_eq!(store.header(&h.run_id).unwrap(), h);
        fresh.tamper(&h.run_id, 0, sqlite, postgres);
        // Another process reading it, and this one, both refuse it.
        for s in [fresh.open(), store.clone()] {
            match s.header(&h.run_id) {
                Err(e @ StoreError::HeaderCorrupt { .. }) => {
                    assert!(e.is_damaged_run());
                    let StoreError::HeaderCorrupt { run, field: f, .. } = e else {
                        unreachable!()
                    };
                    assert_eq!((run.as_str(), f.as_str()), (h.run_id.as_str(), field));
                }
                other => panic!("{field}: expected a damaged header, got {other:?}"),
            }
        }
    }
    assert_eq!(store.header(&untouched.run_id).unwrap(), untouched);
}

fn refuses_unchanged(path: &Path, check: impl Fn(&StoreError) -> bool) {
    let before = std::fs::read(path).unwrap();
    let err = SqliteStore::open(path).err().expect("must be refused");
    assert!(check(&err), "unexpected error: {err}");
    assert!(err.is_bad_store());
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "error names the file: {err}"
    );
    assert_eq!(std::fs::read(path).unwrap(), before, "file changed");
    assert!(!path.with_extension("db-wal").exists());
}

#[test]
fn a_corrupt_file_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    std::fs::write(
        &path,
        b"this is not a database, just some text\n".repeat(200),
    )
    .unwrap();
    refuses_unchanged(&path, |e| matches!(e, StoreError::NotADatabase { .. }));
}

#[test]
fn a_foreign_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    refuses_unchanged(&path, |e| matches!(e, StoreError::Foreign { .. }));
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let id = {
        let s = SqliteStore::open(&path).unwrap();
        s.create_run(&new_run()).unwrap().run_id
    };
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        let v: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        c.pragma_update(None, "user_version", v + 1).unwrap();
        // Back to a single file so "unchanged" compares all of it.
        c.pragma_update(None, "journal_mode", "DELETE").unwrap();
    }
    refuses_unchanged(
        &path,
        |e| matches!(e, StoreError::NewerSchema { found, supported, .. } if found == &(supported + 1)),
    );
    // The refused open did not touch the run either.
    let c = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM runs WHERE run_id = ?1", [&id], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 1);
}

fn a_torn_last_record_is_absent_and_its_slot_reused(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    // One append each, so each record is a row of its own (the layout of a record that
    // commits alone, and of every version 4 store); packed rows: record_format.rs.
    for (seq, r) in [dispatched("a"), dispatched("b"), dispatched("c")]
        .iter()
        .enumerate()
    {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), true)
            .unwrap();
    }
    // Cut the last record short, as a crash in the middle of writing it would.
    fresh.cut_body(&id, 2, 10);
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), 2);
    assert_eq!(read.torn_tail, Some(2));
    // The next owner takes the slot of the torn record.
    let epoch = store.acquire(&id).unwrap();
    store
        .append(&id, epoch, 2, &[dispatched("c")], true)
        .unwrap();
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), 3);
    assert_eq!(read.torn_tail, None);
    assert_eq!(read.records[2].record, dispatched("c"));
}

fn a_corrupt_record_before_the_end_quarantines_the_run(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    // A row per record, as above.
    for (seq, r) in [dispatched("a"), dispatched("b"), dispatched("c")]
        .iter()
        .enumerate()
    {
        store
            .append(&id, epoch, seq as u64, std::slice::from_ref(r), true)
            .unwrap();
    }
    fresh.replace_in_body(&id, 0, "\"a\"", "\"x\"");
    match store.read(&id, 0) {
        Err(StoreError::Corrupt { seq: 0, run, .. }) => assert_eq!(run, id),
        other => panic!("expected Corrupt at 0, got {other:?}"),
    }
    // A missing record is a gap, never silently skipped.
    fresh.replace_in_body(&id, 0, "\"x\"", "\"a\"");
    fresh.delete_row(&id, 1);
    match store.read(&id, 0) {
        Err(StoreError::Gap {
            expected: 1,
            found: 2,
            ..
        }) => {}
        other => panic!("expected a gap at 1, got {other:?}"),
    }
}

fn a_stale_owner_is_fenced_out(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let old = store.acquire(&id).unwrap();
    store
        .append(&id, old, 0, &[dispatched("a")], false)
        .unwrap();
    let new = store.acquire(&id).unwrap();
    assert!(new > old);
    match store.append(&id, old, 1, &[dispatched("b")], true) {
        Err(StoreError::Fenced { ours, current, .. }) => assert_eq!((ours, current), (old, new)),
        other => panic!("expected Fenced, got {other:?}"),
    }
    match store.append(&id, new, 5, &[dispatched("b")], true) {
        Err(StoreError::NotNext {
            seq: 5, next: 1, ..
        }) => {}
        other => panic!("expected NotNext, got {other:?}"),
    }
    assert_eq!(store.read(&id, 0).unwrap().records.len(), 1);
}

fn concurrent_appends_are_gapless_and_keep_each_writers_order(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let log = Arc::new(RunLog::start(store.clone(), &id, epoch, 0));
    const THREADS: usize = 8;
    const PER: u32 = 150;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..PER {
                    let r = Record::Started {
                        occurrence: Occurrence::new(format!("t{t}"), "", i),
                    };
                    if i % 25 == 0 {
                        let (_, wait) = log.append_synced(r);
                        wait.wait().unwrap();
                    } else {
                        log.append(r);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    log.close().unwrap();
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), THREADS * PER as usize);
    let mut next = [0u32; THREADS];
    for (i, s) in read.records.iter().enumerate() {
        assert_eq!(s.seq, i as u64, "gapless");
        let Record::Started { occurrence } = &s.record else {
            panic!("unexpected {:?}", s.record)
        };
        let t: usize = occurrence.node[1..].parse().unwrap();
        assert_eq!(occurrence.n, next[t], "writer {t} out of order");
        next[t] += 1;
    }
}

/// A log whose batch the store refuses (another process took the run over) stops: the
/// waiter of that batch, everyone after it and `close` are told why, and nothing
/// appended after the refused batch reaches the store.
fn a_log_stops_at_its_first_failed_batch(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let log = RunLog::start(store.clone(), &id, epoch, 0);
    let (_, wait) = log.append_synced(dispatched("a"));
    wait.wait().unwrap();
    let newer = store.acquire(&id).unwrap();
    log.append(dispatched("b"));
    let (_, wait) = log.append_synced(dispatched("c"));
    let fenced = |e: &StoreError| {
        matches!(e, StoreError::WriterStopped(e)
            if matches!(**e, StoreError::Fenced { ours, current, .. } if (ours, current) == (epoch, newer)))
    };
    let e = wait.wait().unwrap_err();
    assert!(fenced(&e), "{e:?}");
    assert!(matches!(
        log.error().as_deref(),
        Some(StoreError::Fenced { .. })
    ));
    // After the failure every wait fails at once, and nothing more is written.
    log.append(dispatched("d"));
    let (_, wait) = log.append_synced(dispatched("e"));
    assert!(fenced(&wait.wait().unwrap_err()));
    assert!(fenced(&log.flush().wait().unwrap_err()));
    assert!(fenced(&log.close().unwrap_err()));
    let read = store.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), 1);
    assert_eq!(read.records[0].record, dispatched("a"));
    assert_eq!(log.counters().records, 1);
}

fn a_synced_append_is_on_disk_when_it_returns(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let log = RunLog::start(store.clone(), &id, epoch, 0);
    log.append(dispatched("a"));
    let (seq, wait) = log.append_synced(Record::Started {
        occurrence: Occurrence::new("a", "", 0),
    });
    wait.wait().unwrap();
    assert_eq!(seq, 1);
    // Seen by a separate connection, as by another process, while the log is open.
    let other = fresh.open();
    let read = other.read(&id, 0).unwrap();
    assert_eq!(read.records.len(), 2);
    drop(log);
}

fn the_fold_reports_state_pause_and_uncertain_work(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let a = Occurrence::new("a", "", 0);
    let b = Occurrence::new("b", "", 0);
    let recs = vec![
        Record::Opened {
            epoch,
            reason: OpenReason::Start,
            pid: u32::MAX,
            trace: None,
        },
        // Retry-safe work is recorded by its result alone.
        Record::Completed {
            occurrence: a.clone(),
            outputs: vec![("out".into(), Value::Int(1))],
            emitted: Vec::new(),
            metrics: Default::default(),
        },
        Record::Dispatched {
            occurrence: b.clone(),
            retry_safe: false,
        },
        Record::Started {
            occurrence: b.clone(),
        },
    ];
    store.append(&id, epoch, 0, &recs, true).unwrap();
    let read = store.read(&id, 0).unwrap();
    let v = RunView::fold(&read.records, |_| false);
    assert_eq!(v.state, RunState::Interrupted);
    assert_eq!(v.dispatches, 2);
    assert!(v.occurrences[&a].retry_safe);
    let uncertain: Vec<_> = v
        .uncertain()
        .map(|(o, v)| (o.clone(), v.retry_safe))
        .collect();
    assert_eq!(uncertain, vec![(b.clone(), false)]);
    let v = RunView::fold(&read.records, |_| true);
    assert_eq!(v.state, RunState::Running);
    store
        .append(
            &id,
            epoch,
            4,
            &[
                Record::Paused {
                    pause: heddle_core::PauseReason::Reconcile { occurrence: b },
                },
                Record::Finished {
                    status: RunStatus::Suspended,
                    error: None,
                },
            ],
            true,
        )
        .unwrap();
    let v = RunView::fold(&store.read(&id, 0).unwrap().records, |_| true);
    assert_eq!(v.state, RunState::Paused);
    assert_eq!(v.pause.as_ref().map(|p| p.event), Some(4));
}

/// The crash table (README, "Durable runs") as the kernel sees it through the journal.
fn the_journal_applies_the_crash_table_from_the_log(b: Backend) {
    use heddle_kernel::{Journal, Prior};
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let occ = |n: &str| Occurrence::new(n, "", 0);
    let disp = |n: &str, safe| Record::Dispatched {
        occurrence: occ(n),
        retry_safe: safe,
    };
    let start = |n: &str| Record::Started { occurrence: occ(n) };
    let recs = vec![
        disp("done", false),
        start("done"),
        Record::Completed {
            occurrence: occ("done"),
            outputs: vec![("out".into(), Value::Int(7))],
            emitted: Vec::new(),
            metrics: Default::default(),
        },
        disp("queued", false),
        disp("safe", true),
        start("safe"),
        disp("unsafe", false),
        start("unsafe"),
        disp("skipped", true),
        start("skipped"),
        Record::Verdict {
            occurrence: occ("skipped"),
            verdict: heddle_core::RecordedVerdict::new(heddle_core::RecordedAction::Skip)
                .with_error("boom"),
            decided_by: heddle_core::Decider::Supervisor,
        },
        // Uncertain work a person answered: it completed with these outputs, or skip it.
        disp("answered", false),
        start("answered"),
        Record::Reconciled {
            occurrence: occ("answered"),
            answer: heddle_core::ReconcileAnswer::Completed,
            by: "alice".into(),
            note: "it is done".into(),
        },
        Record::Completed {
            occurrence: occ("answered"),
            outputs: vec![("out".into(), Value::Int(9))],
            emitted: Vec::new(),
            metrics: Default::default(),
        },
        disp("dropped", false),
        start("dropped"),
        Record::Reconciled {
            occurrence: occ("dropped"),
            answer: heddle_core::ReconcileAnswer::Skipped,
            by: "bob".into(),
            note: "not needed".into(),
        },
    ];
    store.append(&id, epoch, 0, &recs, true).unwrap();
    let records = store.read(&id, 0).unwrap().records;
    let log = Arc::new(RunLog::start(
        store.clone(),
        &id,
        epoch,
        records.len() as u64,
    ));
    let j = heddle_store::DurableJournal::new(log.clone(), &records, &|_| false);
    assert!(
        matches!(j.prior(&occ("done")), Prior::Completed { outputs, .. } if outputs.get("out") == Some(&Value::Int(7)))
    );
    assert_eq!(j.prior(&occ("queued")), Prior::Redo { started: 0 });
    // Started once before the crash: the re-run is its second attempt.
    assert_eq!(j.prior(&occ("safe")), Prior::Redo { started: 1 });
    assert_eq!(j.prior(&occ("unsafe")), Prior::Uncertain);
    assert_eq!(
        j.prior(&occ("skipped")),
        Prior::Skipped {
            error: "boom".into(),
            reason: heddle_core::SkipReason::Supervisor,
        }
    );
    assert!(
        matches!(j.prior(&occ("answered")), Prior::Completed { outputs, .. } if outputs.get("out") == Some(&Value::Int(9)))
    );
    assert!(matches!(
        j.prior(&occ("dropped")),
        Prior::Skipped {
            reason: heddle_core::SkipReason::Reconciled,
            ..
        }
    ));
    // Answered work is no longer uncertain, even when a resume offers the pause again.
    let v = RunView::fold(&records, |_| false);
    let uncertain: Vec<&str> = v.uncertain().map(|(o, _)| o.node.as_str()).collect();
    assert_eq!(uncertain, ["safe", "skipped", "unsafe"]);
    assert_eq!(
        v.occurrences[&occ("dropped")]
            .reconciled
            .as_ref()
            .map(|r| r.by.as_str()),
        Some("bob")
    );
    let j2 = heddle_store::DurableJournal::new(log.clone(), &records, &|o| o.node == "dropped");
    assert!(matches!(j2.prior(&occ("dropped")), Prior::Skipped { .. }));
    assert_eq!(j.prior(&occ("never")), Prior::Fresh);
    // Only an explicit resume re-offers the uncertain occurrence.
    let j = heddle_store::DurableJournal::new(log, &records, &|o| o.node == "unsafe");
    assert_eq!(j.prior(&occ("unsafe")), Prior::Redo { started: 1 });
}

/// A listing folds only the lifecycle records, and gets the state a fold of the whole log
/// gives at every stage: running or interrupted, paused, resumed, finished; a torn last
/// lifecycle record is left out as `read` leaves it out, and a corrupt one before the end
/// is refused.
fn the_lifecycle_records_give_the_state_the_whole_log_gives(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let store = &*store;
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let whole = |store: &dyn RunStore| {
        RunView::fold(
            &store.read(&id, 0).unwrap().records,
            heddle_store::status::pid_alive,
        )
        .state
    };
    let listed = |store: &dyn RunStore| heddle_store::status::state_of(store, &id).unwrap();
    let mut seq = 0;
    let mut append = |recs: &[Record]| {
        store.append(&id, epoch, seq, recs, true).unwrap();
        seq += recs.len() as u64;
    };
    let opened = |pid| Record::Opened {
        epoch,
        reason: OpenReason::Start,
        pid,
        trace: None,
    };
    // This process owns it: running. Work records in between change nothing.
    append(&[opened(std::process::id()), dispatched("a"), dispatched("b")]);
    assert_eq!(listed(store), RunState::Running);
    assert_eq!(listed(store), whole(store));
    let b = Occurrence::new("b", "", 0);
    append(&[
        Record::Started {
            occurrence: b.clone(),
        },
        Record::Paused {
            pause: heddle_core::PauseReason::Reconcile { occurrence: b },
        },
    ]);
    assert_eq!(listed(store), RunState::Paused);
    assert_eq!(listed(store), whole(store));
    // Resumed by an owner that is gone: interrupted.
    append(&[
        Record::Resumed { pause: 4 },
        opened(u32::MAX),
        dispatched("c"),
    ]);
    assert_eq!(listed(store), RunState::Interrupted);
    assert_eq!(listed(store), whole(store));
    append(&[Record::Finished {
        status: RunStatus::Completed,
        error: None,
    }]);
    assert_eq!(listed(store), RunState::Completed);
    assert_eq!(listed(store), whole(store));
    let lifecycle = store.read_lifecycle(&id).unwrap();
    assert_eq!(lifecycle.len(), 5, "{lifecycle:?}");

    // The ending torn (the crash came while writing it): absent, as in a full read.
    let last = seq - 1;
    let cut = |seq: u64| fresh.cut_body(&id, seq as i64, 10);
    cut(last);
    assert_eq!(store.read(&id, 0).unwrap().torn_tail, Some(last));
    assert_eq!(listed(store), RunState::Interrupted);
    assert_eq!(listed(store), whole(store));
    // A lifecycle record corrupt before the end is refused, as the full read refuses it.
    cut(4);
    assert!(matches!(
        store.read_lifecycle(&id),
        Err(StoreError::Corrupt { seq: 4, .. })
    ));
    assert!(store.read(&id, 0).is_err());
}

/// A value with everything JSON would not give back as it was.
fn awkward() -> Value {
    let mut lookalike = heddle_core::Map::new();
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

/// Records that commit together (results binary, others JSON, a lifecycle record in
/// between) read back exactly, from the start and from inside a packed row.
fn records_committed_together_read_back_exactly(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let completed = |n: &str| Record::Completed {
        occurrence: Occurrence::new(n, "each:item=3", 1),
        outputs: vec![("result".into(), awkward())],
        emitted: vec![("line".into(), Value::str("x"))],
        metrics: heddle_core::InvocationMetrics {
            wall_us: 12,
            fuel: Some(3456),
            peak_memory_bytes: Some(65536),
            cost_usd: 0.5,
            cost_reports: 1,
            assets: vec!["file:/data/a".into()],
            ..Default::default()
        },
    };
    let batch = vec![
        dispatched("a"),
        completed("a"),
        completed("b"),
        Record::Opened {
            epoch,
            reason: OpenReason::Start,
            pid: 1,
            trace: None,
        },
        dispatched("c"),
        completed("c"),
        Record::Started {
            occurrence: Occurrence::new("d", "", 0),
        },
    ];
    store.append(&id, epoch, 0, &batch, true).unwrap();
    let read = |from| -> Vec<Record> {
        store
            .read(&id, from)
            .unwrap()
            .records
            .into_iter()
            .map(|s| s.record)
            .collect()
    };
    assert_eq!(read(0), batch);
    assert_eq!(read(1), batch[1..]);
    assert_eq!(read(5), batch[5..]);
    let seqs: Vec<u64> = store
        .read(&id, 2)
        .unwrap()
        .records
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(seqs, vec![2, 3, 4, 5, 6]);
    assert_eq!(store.list().unwrap()[0].records, batch.len() as u64);
}

fn artifacts_are_stored_once_verified_on_read_and_bounded(b: Backend) {
    use heddle_store::artifacts::{ArtifactError, ArtifactPolicy, ArtifactRef};
    let fresh = Fresh::new(b);
    let s = fresh.open();
    let run = s.create_run(&new_run()).unwrap().run_id;
    let policy = ArtifactPolicy {
        max_artifact_bytes: 10,
        max_run_bytes: 15,
        known_secrets: vec!["hunter2".into(), String::new()],
    };
    let a = s
        .put_artifact(&run, Some("final"), b"0123456789", &policy)
        .unwrap();
    assert_eq!(a.size, 10);
    assert_eq!(s.named_artifact(&run, "final").unwrap(), Some(a.clone()));
    assert_eq!(s.named_artifact(&run, "other").unwrap(), None);
    assert_eq!(s.get_artifact(&run, &a).unwrap(), b"0123456789");
    // The same bytes again cost no quota.
    s.put_artifact(&run, None, b"0123456789", &policy).unwrap();
    for (bytes, code) in [
        (&b"abcdefgh"[..], "STORAGE_LIMIT_EXCEEDED"),
        (b"01234567890", "STORAGE_LIMIT_EXCEEDED"),
        (b"xhunter2x", "KNOWN_SECRET"),
    ] {
        let e = s.put_artifact(&run, None, bytes, &policy).unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
    // An unreferenced, unnamed artifact is dropped; a named one stays.
    let loose = s.put_artifact(&run, None, b"abc", &policy).unwrap();
    let freed = s
        .drop_unreferenced_artifacts(&run, &Default::default())
        .unwrap();
    assert_eq!(freed, 3);
    assert!(matches!(
        s.get_artifact(&run, &loose).unwrap_err(),
        ArtifactError::Missing { .. }
    ));
    assert_eq!(s.get_artifact(&run, &a).unwrap(), b"0123456789");
    // Bytes changed in the store are caught on read: cut short, or the same length.
    fresh.tamper(
        &run,
        0,
        "UPDATE artifact_pieces SET bytes = x'00'",
        "UPDATE artifact_pieces SET bytes = '\\x00'::bytea",
    );
    let e = s.get_artifact(&run, &a).unwrap_err();
    assert!(matches!(e, ArtifactError::Cut { .. }), "{e}");
    assert_eq!(e.code(), "TERMINAL_ARTIFACT", "{e}");
    fresh.tamper(
        &run,
        0,
        "UPDATE artifact_pieces SET bytes = CAST('012345678:' AS BLOB)",
        "UPDATE artifact_pieces SET bytes = '012345678:'::bytea",
    );
    let e = s.get_artifact(&run, &a).unwrap_err();
    assert!(matches!(e, ArtifactError::Corrupt { .. }), "{e}");
    let gone = ArtifactRef {
        sha256: "00".into(),
        size: 0,
    };
    assert!(matches!(
        s.get_artifact(&run, &gone).unwrap_err(),
        ArtifactError::Missing { .. }
    ));
}

/// Of takers that checked the same state of a run, on handles of their own (as
/// processes have), exactly one takes it over; each loser is refused before writing
/// anything: the epoch and the log are the winner's alone, and the winner writes on.
/// (Each taker's handle goes away after its turn, handing back what it holds, as a
/// process that ended does: a live owner is refused otherwise, see `fleet.rs`.)
fn one_of_concurrent_takers_wins_and_the_losers_write_nothing(b: Backend) {
    let fresh = Arc::new(Fresh::new(b));
    let store = fresh.open();
    let id = store.create_run(&new_run()).unwrap().run_id;
    {
        let first = fresh.open();
        let epoch = first.acquire(&id).unwrap();
        first
            .append(&id, epoch, 0, &[dispatched("a")], true)
            .unwrap();
    }
    for trial in 0..10u64 {
        let next = store.read(&id, 0).unwrap().records.len() as u64;
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let takers: Vec<_> = (0..4u32)
            .map(|pid| {
                let (fresh, id, barrier) = (fresh.clone(), id.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let store = fresh.open();
                    barrier.wait();
                    let r = store.take_over(&id, next, &|epoch| {
                        vec![Record::Opened {
                            epoch,
                            reason: OpenReason::Recover,
                            pid,
                            trace: None,
                        }]
                    });
                    // Every taker's turn is over before the winner writes on.
                    barrier.wait();
                    if let Ok(epoch) = r {
                        // The winner's epoch is the current one: it writes on, unfenced.
                        store
                            .append(&id, epoch, next + 1, &[dispatched("b")], true)
                            .unwrap();
                    }
                    r
                })
            })
            .collect();
        let results: Vec<_> = takers.into_iter().map(|t| t.join().unwrap()).collect();
        let won: Vec<u64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(won.len(), 1, "trial {trial}: {results:?}");
        for r in &results {
            if let Err(e) = r {
                assert!(
                    matches!(e, StoreError::NotNext { seq, next: found, .. } if *seq == next && *found == next + 1),
                    "trial {trial}: {e:?}"
                );
            }
        }
        let records = store.read(&id, 0).unwrap().records;
        assert_eq!(
            records.len() as u64,
            next + 2,
            "trial {trial}: one opening and the winner's record"
        );
        assert!(
            matches!(records[next as usize].record, Record::Opened { epoch, .. } if epoch == won[0]),
            "trial {trial}"
        );
    }
}

/// A cancel request is kept beside the log (whose owner alone writes it), seen from
/// another handle, asked for once however often it is asked, and refused for a run
/// that is not there.
fn a_cancel_request_is_seen_by_another_handle_and_leaves_the_log_alone(b: Backend) {
    let fresh = Fresh::new(b);
    let owner = fresh.open();
    let id = owner.create_run(&new_run()).unwrap().run_id;
    let epoch = owner.acquire(&id).unwrap();
    owner
        .append(&id, epoch, 0, &[dispatched("a")], true)
        .unwrap();
    assert!(!owner.cancel_requested(&id).unwrap());
    let other = fresh.open();
    other.request_cancel(&id).unwrap();
    other.request_cancel(&id).unwrap();
    assert!(owner.cancel_requested(&id).unwrap());
    // The owner is not fenced: its epoch and log are untouched.
    owner
        .append(&id, epoch, 1, &[dispatched("b")], true)
        .unwrap();
    assert!(matches!(
        other.request_cancel("nope"),
        Err(StoreError::UnknownRun(_))
    ));
}

/// An artifact larger than a piece is stored in pieces and read one at a time (never
/// whole), its digest checked as they are read: damaged bytes in a piece before the
/// last are found before the last piece is handed out, so a reader that passes pieces
/// on (the server's download) never completes a damaged artifact; a lost piece is found
/// from the sizes alone, without reading a byte.
fn a_large_artifact_is_read_a_piece_at_a_time_and_never_completed_when_damaged(b: Backend) {
    use heddle_store::artifacts::{ArtifactError, ArtifactPolicy, ArtifactReader, PIECE_BYTES};
    let fresh = Fresh::new(b);
    let s = fresh.open();
    let run = s.create_run(&new_run()).unwrap().run_id;
    let bytes: Vec<u8> = (0..2 * PIECE_BYTES + 17)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let a = s
        .put_artifact(&run, None, &bytes, &ArtifactPolicy::default())
        .unwrap();
    let small = s
        .put_artifact(&run, None, b"tiny", &ArtifactPolicy::default())
        .unwrap();
    let listed = s.stored_artifacts(&run).unwrap();
    assert_eq!(listed.len(), 2);
    for l in &listed {
        let want = if l.sha256 == a.sha256 { &a } else { &small };
        assert_eq!((l.size, l.stored), (want.size, want.size), "{l:?}");
    }
    let read = |s: &dyn RunStore| {
        let mut r = ArtifactReader::open(s, &run, &a.sha256).map_err(|e| (Vec::new(), e))?;
        assert_eq!(r.artifact(), &a);
        let mut pieces = Vec::new();
        loop {
            match r.next_piece(s) {
                Ok(Some(p)) => pieces.push(p),
                Ok(None) => return Ok(pieces),
                Err(e) => return Err((pieces, e)),
            }
        }
    };
    let pieces = read(&*s).map_err(|(_, e)| e).unwrap();
    assert_eq!(
        pieces.iter().map(Vec::len).collect::<Vec<_>>(),
        [PIECE_BYTES, PIECE_BYTES, 17]
    );
    assert!(pieces.concat() == bytes);
    assert!(s.get_artifact(&run, &a).unwrap() == bytes);

    // The middle piece changed, its length kept: the last piece is withheld.
    fresh.tamper(
        &run,
        0,
        &format!("UPDATE artifact_pieces SET bytes = zeroblob({PIECE_BYTES}) WHERE n = 1"),
        &format!(
            "UPDATE artifact_pieces SET bytes = decode(repeat('00', {PIECE_BYTES}), 'hex') WHERE n = 1"
        ),
    );
    let Err((handed, e)) = read(&*s) else {
        panic!("a damaged artifact read whole")
    };
    assert!(matches!(e, ArtifactError::Corrupt { .. }), "{e}");
    assert_eq!(handed.len(), 2, "the last piece was handed out");
    // A lost piece shows in the sizes: refused before a byte is read.
    fresh.tamper(
        &run,
        0,
        "DELETE FROM artifact_pieces WHERE n = 2",
        "DELETE FROM artifact_pieces WHERE n = 2",
    );
    let l = s
        .stored_artifact(&run, &a.sha256)
        .unwrap()
        .expect("still listed");
    assert_eq!(l.stored, 2 * PIECE_BYTES as u64);
    assert!(matches!(
        ArtifactReader::open(&*s, &run, &a.sha256).unwrap_err(),
        ArtifactError::Cut { .. }
    ));
    // Dropping it drops its pieces.
    let freed = s
        .drop_unreferenced_artifacts(&run, &Default::default())
        .unwrap();
    assert_eq!(freed, a.size + small.size);
    assert!(s.stored_artifacts(&run).unwrap().is_empty());
    assert_eq!(s.artifact_piece(&run, &a.sha256, 0).unwrap(), None);
}

/// A take-over that reopens a pause (a person's resume) withdraws the cancel requests
/// made before it; a recovery's keeps them.
fn a_resume_withdraws_a_cancel_request_a_recovery_keeps(b: Backend) {
    let fresh = Fresh::new(b);
    let s = fresh.open();
    let run = s.create_run(&new_run()).unwrap().run_id;
    let opened = |reason| Record::Opened {
        epoch: 0,
        reason,
        pid: std::process::id(),
        trace: None,
    };
    s.take_over(&run, 0, &|_| vec![opened(OpenReason::Start)])
        .unwrap();
    s.request_cancel(&run).unwrap();
    s.take_over(&run, 1, &|_| vec![opened(OpenReason::Recover)])
        .unwrap();
    assert!(s.cancel_requested(&run).unwrap(), "a recovery keeps it");
    s.take_over(&run, 2, &|_| {
        vec![opened(OpenReason::Resume), Record::Resumed { pause: 1 }]
    })
    .unwrap();
    assert!(!s.cancel_requested(&run).unwrap(), "a resume withdraws it");
}
