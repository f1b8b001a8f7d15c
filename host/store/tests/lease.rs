//! The store's owner lease on real files: one owner at a time, a lost lease stops that
//! owner's writes at once, and a writer without the lease is refused while one binds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use heddle_core::{Occurrence, Record};
use heddle_store::{NewRun, RunStore, SqliteStore, StoreError};

fn new_run() -> NewRun {
    NewRun {
        graph_name: "g.json".into(),
        graph_bytes: br#"{"nodes":[],"edges":[]}"#.to_vec(),
        plan: Default::default(),
        inputs: BTreeMap::new(),
        secrets: Vec::new(),
        packages: BTreeMap::new(),
        limits: Default::default(),
    }
}

fn dispatched(node: &str) -> Record {
    Record::Dispatched {
        occurrence: Occurrence::new(node, "", 0),
        retry_safe: true,
    }
}

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(&dir.join("runs.db")).unwrap()
}

const LONG: Duration = Duration::from_secs(600);

#[test]
fn a_second_owner_is_refused_naming_the_first_until_it_releases() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let b = open(dir.path());
    let held = a.acquire_lease("http://127.0.0.1:1", LONG).unwrap();
    assert_eq!(held.pid, std::process::id());
    assert_eq!(b.owner().unwrap().as_ref(), Some(&held));

    let err = b.acquire_lease("http://127.0.0.1:2", LONG).unwrap_err();
    let StoreError::Owned { owner, .. } = &err else {
        panic!("expected Owned, got {err}");
    };
    assert_eq!(**owner, held);
    let msg = err.to_string();
    assert!(msg.contains(&format!("pid {}", held.pid)), "{msg}");
    assert!(msg.contains(&held.owner_id), "{msg}");
    assert!(msg.contains("http://127.0.0.1:1"), "{msg}");

    // A heartbeat keeps it; releasing frees it and the next owner's epoch is higher.
    a.renew_lease(LONG).unwrap();
    a.release_lease().unwrap();
    assert_eq!(b.owner().unwrap(), None);
    let next = b.acquire_lease("http://127.0.0.1:2", LONG).unwrap();
    assert_eq!(next.epoch, held.epoch + 1);
}

#[test]
fn a_writer_without_the_lease_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = open(dir.path());
    let cli = open(dir.path());
    let h = cli.create_run(&new_run()).unwrap();
    let epoch = cli.acquire(&h.run_id).unwrap();
    cli.append(&h.run_id, epoch, 0, &[dispatched("a")], true)
        .unwrap();

    server.acquire_lease("http://127.0.0.1:9", LONG).unwrap();
    for (what, r) in [
        ("create", cli.create_run(&new_run()).map(|_| ())),
        ("acquire", cli.acquire(&h.run_id).map(|_| ())),
        (
            "append",
            cli.append(&h.run_id, epoch, 1, &[dispatched("b")], true),
        ),
    ] {
        match r {
            Err(StoreError::Owned { owner, .. }) => assert_eq!(owner.api, "http://127.0.0.1:9"),
            other => panic!("{what}: expected Owned, got {other:?}"),
        }
    }
    assert_eq!(cli.list().unwrap().len(), 1);
    assert_eq!(cli.read(&h.run_id, 0).unwrap().records.len(), 1);

    // The owner itself writes.
    let e = server.acquire(&h.run_id).unwrap();
    server
        .append(&h.run_id, e, 1, &[dispatched("b")], true)
        .unwrap();
    server.release_lease().unwrap();
    // Released: the command line writes again (its run epoch was fenced meanwhile).
    let e = cli.acquire(&h.run_id).unwrap();
    cli.append(&h.run_id, e, 2, &[dispatched("c")], true)
        .unwrap();
}

#[test]
fn a_lost_lease_stops_every_write_of_its_holder_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let old = open(dir.path());
    let new = open(dir.path());
    let h = old.create_run(&new_run()).unwrap();
    // A lease of no length has expired by the time it is used: the holder's heartbeat
    // failed. Nothing it writes counts from then on, even before anyone else takes over.
    old.acquire_lease("http://old", Duration::ZERO).unwrap();
    let lost = |r: Result<(), StoreError>, what: &str| match r {
        Err(StoreError::LeaseLost { why, .. }) => why,
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    };
    let why = lost(old.acquire(&h.run_id).map(|_| ()), "acquire");
    assert!(why.contains("expired"), "{why}");
    lost(old.create_run(&new_run()).map(|_| ()), "create");
    lost(old.renew_lease(LONG).map(|_| ()), "renew");

    // Another owner takes the store; the old one's writes name it.
    let taker = new.acquire_lease("http://new", LONG).unwrap();
    let why = lost(
        old.append(&h.run_id, 0, 0, &[dispatched("a")], true),
        "append",
    );
    assert!(why.contains(&taker.owner_id), "{why}");
    assert_eq!(new.read(&h.run_id, 0).unwrap().records.len(), 0);
    let e = new.acquire(&h.run_id).unwrap();
    new.append(&h.run_id, e, 0, &[dispatched("a")], true)
        .unwrap();
}

#[test]
fn the_lease_of_a_process_that_died_on_this_host_does_not_bind() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    // A server killed with SIGKILL leaves its row behind, unexpired.
    let db = rusqlite::Connection::open(dir.path().join("runs.db")).unwrap();
    db.execute(
        "INSERT INTO owner (id, owner_id, pid, host, api, epoch, expires_ms)
         VALUES (1, 'gone', ?1, ?2, 'http://gone', 7, ?3)",
        rusqlite::params![dead as i64, heddle_store::lease::host_name(), i64::MAX / 2],
    )
    .unwrap();
    assert_eq!(store.owner().unwrap(), None);
    let next = store.acquire_lease("http://here", LONG).unwrap();
    assert_eq!(next.epoch, 8);

    // The same row on another host is not known dead: it binds until it expires.
    store.release_lease().unwrap();
    db.execute(
        "UPDATE owner SET host = 'elsewhere', pid = ?1, expires_ms = ?2",
        rusqlite::params![dead as i64, i64::MAX / 2],
    )
    .unwrap();
    assert!(matches!(
        store.acquire_lease("http://here", LONG),
        Err(StoreError::Owned { .. })
    ));
}
