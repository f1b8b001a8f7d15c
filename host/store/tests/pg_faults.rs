//! The PostgreSQL store when the database goes away: killed and restarted under a run
//! log that keeps appending, and a connection black-holed (a partition) by a small TCP
//! proxy in the test. What is counted is what the database holds afterwards.
//!
//! The restart test stops its own cluster (scripts/pg-up), so that no other test's
//! connections drop with it.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use heddle_core::{Occurrence, Record};
use heddle_store::fleet::{Fleet, Wake};
use heddle_store::{PgOptions, PgStore, RunLog, RunStore};
use support::{Proxy, new_run, port_of, through};

fn started(node: &str, n: u32) -> Record {
    Record::Started {
        occurrence: Occurrence::new(node, "", n),
    }
}

/// Every record of `run` as `(node, n)`, in order, checking the numbering is gapless.
fn numbered(store: &dyn RunStore, run: &str) -> Vec<(String, u32)> {
    let read = store.read(run, 0).unwrap();
    assert_eq!(read.torn_tail, None);
    read.records
        .iter()
        .enumerate()
        .map(|(i, s)| {
            assert_eq!(s.seq, i as u64, "gapless");
            match &s.record {
                Record::Started { occurrence } => (occurrence.node.clone(), occurrence.n),
                r => panic!("unexpected {r:?}"),
            }
        })
        .collect()
}

/// A run log appending through a server that is killed (`pg_ctl -m immediate`, a
/// crash: fsync is on) and started again: the writer retries until the server is back,
/// every record lands exactly once, in order, and every synced append that returned Ok
/// is there. The listening connection comes back too: wake-ups flow again, after one
/// that says some may have been missed.
///
/// This is about a restart, not about a lease running out: the store's lease lasts far
/// longer than any restart (`pg_ctl` waits 60 s at most; a crash recovery under load
/// took 6 s here, longer than two thirds of the default 10 s TTL). What a lease lost
/// while the database was away looks like is
/// [`a_lease_lost_while_the_database_was_away_says_so`].
#[test]
fn a_server_restarted_under_a_run_log_loses_and_duplicates_nothing() {
    if support::skip_pg() {
        return;
    }
    let cluster = support::OwnCluster::start();
    let url = support::fresh_database_on(&cluster.admin_url);
    let store: Arc<dyn RunStore> = Arc::new(
        PgStore::open_with(
            &url,
            PgOptions {
                op_timeout: Duration::from_secs(5),
                lease_ttl: Duration::from_secs(600),
                ..PgOptions::default()
            },
        )
        .unwrap(),
    );
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let host = PgStore::open(&url).unwrap();
    let mut wakeups = host.subscribe().unwrap();
    let log = Arc::new(RunLog::start(store.clone(), &id, epoch, 0));
    const N: u32 = 600;
    let writer = {
        let log = log.clone();
        std::thread::spawn(move || {
            let mut acknowledged = Vec::new();
            for i in 0..N {
                if i % 20 == 0 {
                    let (seq, wait) = log.append_synced(started("w", i));
                    wait.wait()
                        .unwrap_or_else(|e| panic!("synced append {i}: {e:?}"));
                    acknowledged.push(seq);
                } else {
                    log.append(started("w", i));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            acknowledged
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    cluster.crash();
    std::thread::sleep(Duration::from_millis(700));
    cluster.start_again();
    let acknowledged = writer.join().unwrap();
    log.close().unwrap();
    assert!(log.error().is_none());

    let other = PgStore::open(&url).unwrap();
    let got = numbered(&other, &id);
    let want: Vec<(String, u32)> = (0..N).map(|i| ("w".to_string(), i)).collect();
    assert_eq!(got, want, "every record once, in order");
    assert!(acknowledged.iter().all(|&s| s < got.len() as u64));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // After each "missed" a new run is queued; the one queued after the listener is
    // back must wake it.
    let mut missed = false;
    let mut latest: Option<String> = None;
    let woken = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match wakeups.next().await {
                    Some(Wake::Missed) => {
                        missed = true;
                        let id = other.create_run(&new_run()).unwrap().run_id;
                        other.enqueue(&id).unwrap();
                        latest = Some(id);
                    }
                    Some(Wake::Work { run_id }) if Some(&run_id) == latest.as_ref() => {
                        return true;
                    }
                    Some(_) => {}
                    None => return false,
                }
            }
        })
        .await
        .expect("a wake-up after the restart")
    });
    assert!(missed && woken);
}

/// A store at `url` reached through a proxy of its own, with short timeouts (a lost
/// answer shows within a second), renewing its leases by itself or not.
fn behind_proxy(url: &str, keep_leases: bool) -> (Proxy, PgStore) {
    behind_proxy_with(
        url,
        PgOptions {
            keep_leases,
            ..PgOptions::default()
        },
    )
}

/// [`behind_proxy`] with `opts` (their timeouts made short).
fn behind_proxy_with(url: &str, opts: PgOptions) -> (Proxy, PgStore) {
    let proxy = Proxy::start(port_of(url));
    let opts = PgOptions {
        op_timeout: Duration::from_millis(800),
        connect_timeout: Duration::from_millis(800),
        ..opts
    };
    let store = PgStore::open_with(&through(url, &proxy), opts).unwrap();
    (proxy, store)
}

/// A lease that expired while the database could not be reached says so when the store
/// refuses the next write, whichever comes first once the database is back: that write,
/// or the renewal that finds the lease gone. One that expired because nothing renewed
/// it (a process paused or starved) says that instead. (Renewals by hand here: each
/// step is one call, in a known order.)
#[test]
fn a_lease_lost_while_the_database_was_away_says_so() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let ttl = Duration::from_secs(1);
    let (proxy, store) = behind_proxy_with(
        &url,
        PgOptions {
            lease_ttl: ttl,
            keep_leases: false,
            ..PgOptions::default()
        },
    );
    let direct = PgStore::open(&url).unwrap();
    let runs: Vec<String> = (0..3)
        .map(|_| direct.create_run(&new_run()).unwrap().run_id)
        .collect();
    let epochs: Vec<u64> = runs.iter().map(|r| store.acquire(r).unwrap()).collect();
    // The database's clock took the leases before this one read it (same machine):
    // past this, they have expired.
    let expired_by = std::time::Instant::now() + ttl + Duration::from_millis(100);

    proxy.requests.store(true, Ordering::SeqCst);
    proxy.answers.store(true, Ordering::SeqCst);
    let e = store.heartbeat().unwrap_err();
    assert!(e.is_transient(), "{e}");
    std::thread::sleep(expired_by.saturating_duration_since(std::time::Instant::now()));
    proxy.requests.store(false, Ordering::SeqCst);
    proxy.answers.store(false, Ordering::SeqCst);

    // The write comes first: the renewals are still failing as far as it knows.
    let e = store
        .append(&runs[0], epochs[0], 0, &[started("a", 0)], true)
        .unwrap_err();
    assert!(e.is_lost_lease(), "{e}");
    assert!(e.to_string().contains("while the database was away"), "{e}");
    // The renewal comes first: it finds every lease gone, and what it saw stays said.
    let hb = store.heartbeat().unwrap();
    let mut lost: Vec<String> = hb.lost.into_iter().map(|l| l.run_id).collect();
    lost.sort();
    let mut all = runs.clone();
    all.sort();
    assert_eq!(lost, all);
    let e = store
        .append(&runs[1], epochs[1], 0, &[started("b", 0)], true)
        .unwrap_err();
    assert!(e.is_lost_lease(), "{e}");
    assert!(e.to_string().contains("while the database was away"), "{e}");

    // Taken again, and let expire with the database there all along.
    let epoch = store.acquire(&runs[2]).unwrap();
    let expired_by = std::time::Instant::now() + ttl + Duration::from_millis(100);
    std::thread::sleep(expired_by.saturating_duration_since(std::time::Instant::now()));
    let e = store
        .append(&runs[2], epoch, 0, &[started("c", 0)], true)
        .unwrap_err();
    assert!(e.is_lost_lease(), "{e}");
    assert!(e.to_string().contains("without renewal"), "{e}");
    assert!(!e.to_string().contains("database"), "{e}");

    for r in &runs {
        assert!(numbered(&direct, r).is_empty(), "nothing written");
    }
}

/// A black-holed connection: an append neither hangs nor reports itself written. It
/// fails as the store being unreachable within the operation timeout, and the database
/// holds nothing of it. When only the answer is lost (the append committed), appending
/// the same records again succeeds without writing them twice. And a run log whose
/// connection is black-holed for a while retries until it is back, losing nothing.
#[test]
fn a_black_holed_connection_fails_appends_as_unreachable_and_never_as_written() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let (proxy, store) = behind_proxy(&url, true);
    let store: Arc<dyn RunStore> = Arc::new(store);
    let direct = PgStore::open(&url).unwrap();
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    store
        .append(&id, epoch, 0, &[started("a", 0)], true)
        .unwrap();

    // Both ways black-holed: nothing reaches the server.
    proxy.requests.store(true, Ordering::SeqCst);
    proxy.answers.store(true, Ordering::SeqCst);
    let e = store
        .append(&id, epoch, 1, &[started("a", 1)], true)
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
    assert_eq!(numbered(&direct, &id).len(), 1, "nothing written");

    // Healed, the next append goes through (on a new connection: the old one was
    // dropped, its state unknown).
    proxy.requests.store(false, Ordering::SeqCst);
    proxy.answers.store(false, Ordering::SeqCst);
    store
        .append(&id, epoch, 1, &[started("a", 1)], true)
        .unwrap();

    // Only the answers lost, on a connection that works up to then: the append
    // commits, the caller is told it failed.
    proxy.answers.store(true, Ordering::SeqCst);
    let e = store
        .append(&id, epoch, 2, &[started("a", 2)], true)
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_eq!(
        numbered(&direct, &id).len(),
        3,
        "the request reached the server"
    );
    // Healed: the same append again finds its rows and succeeds; nothing is doubled,
    // and a different record at that place is still refused.
    proxy.answers.store(false, Ordering::SeqCst);
    store
        .append(&id, epoch, 2, &[started("a", 2)], true)
        .unwrap();
    assert!(
        store
            .append(&id, epoch, 2, &[started("x", 9)], true)
            .is_err()
    );
    let want: Vec<(String, u32)> = (0..3).map(|i| ("a".to_string(), i)).collect();
    assert_eq!(numbered(&direct, &id), want);

    // A run log behind a connection black-holed for a while: it retries, and every
    // record lands once.
    let log = RunLog::start(store.clone(), &id, epoch, 3);
    log.append(started("a", 3));
    log.flush().wait().unwrap();
    proxy.requests.store(true, Ordering::SeqCst);
    proxy.answers.store(true, Ordering::SeqCst);
    log.append(started("a", 4));
    let (_, wait) = log.append_synced(started("a", 5));
    std::thread::sleep(Duration::from_secs(3));
    proxy.requests.store(false, Ordering::SeqCst);
    proxy.answers.store(false, Ordering::SeqCst);
    wait.wait().unwrap();
    log.close().unwrap();
    let want: Vec<(String, u32)> = (0..6).map(|i| ("a".to_string(), i)).collect();
    assert_eq!(numbered(&direct, &id), want);
}

/// A take-over that committed but whose answer was lost (the connection black-holed
/// right after its `COMMIT` left) is tried again once the database answers, and the
/// retry recognises the take-over as its own: it succeeds at the epoch it took, with
/// its opening records written once, instead of reading as another process's.
#[test]
fn a_take_over_whose_answer_was_lost_is_recognised_as_its_own_on_retry() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let (proxy, store) = behind_proxy(&url, false);
    let direct = PgStore::open(&url).unwrap();
    let id = direct.create_run(&new_run()).unwrap().run_id;
    proxy.cut_at_commit.store(true, Ordering::SeqCst);
    let healer = {
        let (answers, cut) = (proxy.answers.clone(), proxy.cut_at_commit.clone());
        std::thread::spawn(move || {
            // Until the first COMMIT went by, then a while longer.
            while !answers.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            cut.store(false, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(2));
            answers.store(false, Ordering::SeqCst);
        })
    };
    let opening = |epoch| vec![started("open", epoch as u32)];
    let epoch = store.take_over(&id, 0, &opening).unwrap();
    healer.join().unwrap();
    assert_eq!(
        numbered(&direct, &id),
        [("open".to_string(), epoch as u32)],
        "the opening records once, for the epoch taken"
    );
    let lease = direct.lease(&id).unwrap();
    assert_eq!(lease.epoch, epoch);
    assert_eq!(lease.owner_host.as_deref(), Some(store.host_id()));
}

/// A transaction cut off by a partition before its `COMMIT` (the server keeps it open,
/// its client silent, the connection looking alive) holds the run's lease row no longer
/// than the store's operation timeout: the server ends it, and another process takes
/// the run. Left open, the row stays locked for as long as the connection looks alive,
/// and claims (`SKIP LOCKED`) pass the run by: nobody adopts it.
#[test]
fn a_transaction_cut_off_before_its_commit_holds_no_lease_past_the_operation_timeout() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let (proxy, store) = behind_proxy(&url, false);
    let direct = PgStore::open(&url).unwrap();
    let id = direct.create_run(&new_run()).unwrap().run_id;
    proxy.cut_before_commit.store(true, Ordering::SeqCst);
    // Its BEGIN, lock and UPDATE reach the server; its COMMIT does not.
    let e = store.acquire(&id).unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(
        proxy.requests.load(Ordering::SeqCst),
        "the partition began at the COMMIT"
    );
    // Waits on the row lock until the server ends the silent transaction (800 ms),
    // well within this store's own operation timeout (10 s).
    let epoch = direct.acquire(&id).unwrap();
    assert_eq!(epoch, 1, "the cut-off take-over never committed");
    assert_eq!(
        direct.lease(&id).unwrap().owner_host.as_deref(),
        Some(direct.host_id())
    );
}
