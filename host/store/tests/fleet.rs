//! Hosts sharing a store (the fleet): claims, leases, fencing, commands and wake-ups.
//! What holds for one host runs against both stores; what needs several hosts (expiry,
//! adoption, racing claims, host ids) runs against PostgreSQL, each "host" a store
//! handle of its own with its own connections.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use heddle_store::fleet::{Fleet, Wake};
use heddle_store::{PgOptions, PgStore, RunStore, StoreError};
use support::{Backend, Fresh, dispatched, new_run};

both!(
    queued_runs_are_claimed_once_and_handed_back,
    commands_reach_the_owner_and_their_outcomes_the_sender,
);

fn queued_runs_are_claimed_once_and_handed_back(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open_store();
    let (runs, fleet) = (store.runs(), store.fleet());
    // Only a registered host claims.
    assert!(matches!(fleet.claim(1), Err(StoreError::HostLost { .. })));
    fleet.register("http://127.0.0.1:1").unwrap();
    let ids: Vec<String> = (0..5)
        .map(|_| runs.create_run(&new_run()).unwrap().run_id)
        .collect();
    for id in &ids {
        fleet.enqueue(id).unwrap();
        // Queueing twice queues once.
        fleet.enqueue(id).unwrap();
    }
    let first = fleet.claim(3).unwrap();
    let rest = fleet.claim(10).unwrap();
    assert_eq!(first.len(), 3);
    assert_eq!(rest.len(), 2);
    assert!(fleet.claim(10).unwrap().is_empty());
    let claimed: HashSet<&str> = first
        .iter()
        .chain(&rest)
        .map(|c| c.run_id.as_str())
        .collect();
    assert_eq!(claimed, ids.iter().map(String::as_str).collect());
    // The claim's epoch is the one appends go under.
    let c = &first[0];
    assert_eq!(fleet.lease(&c.run_id).unwrap().state, "running");
    runs.append(&c.run_id, c.epoch, 0, &[dispatched("a")], true)
        .unwrap();
    // Handed back for another host, it is claimed again under a higher epoch.
    fleet.release(&c.run_id, c.epoch, true).unwrap();
    assert_eq!(fleet.lease(&c.run_id).unwrap().state, "queued");
    let again = fleet.claim(10).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].run_id, c.run_id);
    assert!(again[0].epoch > c.epoch);
    assert!(matches!(
        runs.append(&c.run_id, c.epoch, 1, &[dispatched("b")], true),
        Err(StoreError::Fenced { .. })
    ));
    // Released as ended, it is nobody's work.
    fleet.release(&c.run_id, again[0].epoch, false).unwrap();
    assert_eq!(fleet.lease(&c.run_id).unwrap().state, "idle");
    assert!(fleet.claim(10).unwrap().is_empty());
    // Releasing what is not held says so.
    assert!(matches!(
        fleet.release(&c.run_id, again[0].epoch, false),
        Err(StoreError::RunLeaseLost { .. })
    ));
    assert!(matches!(
        fleet.enqueue("nope"),
        Err(StoreError::UnknownRun(_))
    ));
    // A graceful shutdown hands every held run back to the queue.
    fleet.deregister(true).unwrap();
    fleet.register("http://127.0.0.1:1").unwrap();
    assert_eq!(fleet.claim(10).unwrap().len(), 4);
}

fn commands_reach_the_owner_and_their_outcomes_the_sender(b: Backend) {
    let fresh = Fresh::new(b);
    let store = fresh.open_store();
    let (runs, fleet) = (store.runs(), store.fleet());
    fleet.register("http://127.0.0.1:1").unwrap();
    let id = runs.create_run(&new_run()).unwrap().run_id;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut wakeups = fleet.subscribe().unwrap();
    // Waits (bounded, so a lost wake-up fails the test instead of hanging it) for the
    // first wake-up that is not `Missed`.
    let mut next = || {
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    match wakeups.next().await {
                        Some(Wake::Missed) => continue,
                        other => return other,
                    }
                }
            })
            .await
            .expect("a wake-up")
        })
    };
    fleet.enqueue(&id).unwrap();
    assert_eq!(next(), Some(Wake::Work { run_id: id.clone() }));
    let claimed = fleet.claim(1).unwrap();
    let epoch = claimed[0].epoch;

    let cancel = fleet
        .send_command(&id, "cancel", &serde_json::json!({"by": "alice"}))
        .unwrap();
    assert_eq!(
        next(),
        Some(Wake::Command {
            run_id: id.clone(),
            id: cancel
        })
    );
    let pending = fleet.pending_commands(&id).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].kind, "cancel");
    assert_eq!(pending[0].body, serde_json::json!({"by": "alice"}));
    assert_eq!(fleet.command_outcome(cancel).unwrap(), None);
    // Only the owner's epoch records an outcome.
    assert!(matches!(
        fleet.finish_command(&id, epoch + 1, cancel, &serde_json::json!("late")),
        Err(StoreError::Fenced { .. })
    ));
    fleet
        .finish_command(&id, epoch, cancel, &serde_json::json!({"recorded": 7}))
        .unwrap();
    assert_eq!(next(), Some(Wake::CommandDone { id: cancel }));
    assert_eq!(
        fleet.command_outcome(cancel).unwrap(),
        Some(serde_json::json!({"recorded": 7}))
    );
    assert!(fleet.pending_commands(&id).unwrap().is_empty());
    assert!(matches!(
        fleet.send_command("nope", "cancel", &serde_json::Value::Null),
        Err(StoreError::UnknownRun(_))
    ));
    assert!(matches!(
        fleet.command_outcome(cancel + 100),
        Err(StoreError::UnknownCommand(_))
    ));
}

/// A host of its own on the test's database: a handle with its own id and connections,
/// renewing nothing by itself (the tests renew, or let leases lapse, by hand).
fn host(fresh: &Fresh, id: &str, ttl: Duration) -> PgStore {
    let h = fresh.open_pg(PgOptions {
        host_id: Some(id.into()),
        lease_ttl: ttl,
        keep_leases: false,
        ..support::pg_options()
    });
    h.register(&format!("http://{id}")).unwrap();
    h
}

fn wait_until_expired(store: &PgStore, run: &str) {
    for _ in 0..600 {
        if store.lease(run).unwrap().left_ms == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the lease of {run} never expired");
}

/// A host whose lease expired (it stopped renewing: paused, partitioned, dead) writes
/// nothing more, even before anyone takes over; another host claims the run as an
/// adoption under a higher epoch; the old host's appends are refused and leave the log
/// as it was, and its next renewal reports the lease lost.
#[test]
fn an_expired_lease_fences_its_holder_and_the_run_is_adopted() {
    if support::skip_pg() {
        return;
    }
    let fresh = Fresh::new(Backend::Postgres);
    // Long enough that nothing below stalls past it before the test lets it lapse.
    let a = host(&fresh, "host-a", Duration::from_secs(5));
    let b = host(&fresh, "host-b", Duration::from_secs(60));
    let id = a.create_run(&new_run()).unwrap().run_id;
    a.enqueue(&id).unwrap();
    let mine = a.claim(10).unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].adopted_from, None);
    let old = mine[0].epoch;
    a.append(&id, old, 0, &[dispatched("x")], true).unwrap();
    // B cannot take a run whose lease is live.
    assert!(b.claim(10).unwrap().is_empty());
    assert!(matches!(b.acquire(&id), Err(StoreError::RunOwned { .. })));
    // Nor take it over though the log is as B checked it: refused before writing (the
    // log stays A's one record, checked below), the epoch still A's.
    let opening = |epoch| {
        vec![heddle_core::Record::Opened {
            epoch,
            reason: heddle_core::OpenReason::Recover,
            pid: 2,
            trace: None,
        }]
    };
    assert!(matches!(
        b.take_over(&id, 1, &opening),
        Err(StoreError::RunOwned { .. })
    ));
    assert_eq!(b.lease(&id).unwrap().epoch, old);

    wait_until_expired(&b, &id);
    // Nobody took it yet, and still A may not write.
    assert!(matches!(
        a.append(&id, old, 1, &[dispatched("y")], true),
        Err(StoreError::RunLeaseLost { .. })
    ));
    let adopted = b.claim(10).unwrap();
    assert_eq!(adopted.len(), 1);
    assert_eq!(adopted[0].adopted_from.as_deref(), Some("host-a"));
    let new = adopted[0].epoch;
    assert!(new > old);
    match a.append(&id, old, 1, &[dispatched("y")], true) {
        Err(StoreError::Fenced { ours, current, .. }) => assert_eq!((ours, current), (old, new)),
        other => panic!("expected Fenced, got {other:?}"),
    }
    let hb = a.heartbeat().unwrap();
    assert_eq!(
        hb.lost,
        vec![heddle_store::fleet::LostLease {
            run_id: id.clone(),
            epoch: old
        }]
    );
    // The log is what A wrote while it held the run, and B continues it.
    assert_eq!(b.read(&id, 0).unwrap().records.len(), 1);
    b.append(&id, new, 1, &[dispatched("z")], true).unwrap();
    assert_eq!(b.read(&id, 0).unwrap().records.len(), 2);
    let hosts = b.hosts().unwrap();
    let b_row = hosts.iter().find(|h| h.host_id == "host-b").unwrap();
    assert!(b_row.alive);
    assert_eq!(b_row.runs, 1);
}

/// The store renews by itself every third of the TTL: a run held well past its TTL
/// still takes appends, and its host stays alive.
#[test]
fn the_store_renews_its_leases_by_itself() {
    if support::skip_pg() {
        return;
    }
    let fresh = Fresh::new(Backend::Postgres);
    let a = fresh.open_pg(PgOptions {
        host_id: Some("keeper".into()),
        lease_ttl: Duration::from_secs(4),
        ..support::pg_options()
    });
    a.register("http://keeper").unwrap();
    let id = a.create_run(&new_run()).unwrap().run_id;
    let epoch = a.acquire(&id).unwrap();
    // Over two TTLs: only renewals (every third of it) keep the lease.
    std::thread::sleep(Duration::from_secs(9));
    a.append(&id, epoch, 0, &[dispatched("x")], true).unwrap();
    assert!(a.lease(&id).unwrap().left_ms > 0);
    assert!(a.hosts().unwrap().iter().all(|h| h.alive));
    assert!(a.take_lost().is_empty());
}

/// A host id belongs to one live registration; a second process with the same id is
/// refused, naming the first. Once the first deregisters, the id is free.
#[test]
fn a_host_id_taken_by_a_live_host_is_refused() {
    if support::skip_pg() {
        return;
    }
    let fresh = Fresh::new(Backend::Postgres);
    let a = host(&fresh, "same", Duration::from_secs(60));
    let b = fresh.open_pg(PgOptions {
        host_id: Some("same".into()),
        keep_leases: false,
        ..support::pg_options()
    });
    let e = b.register("http://b").unwrap_err();
    match &e {
        StoreError::HostIdTaken { host_id, pid, .. } => {
            assert_eq!(host_id, "same");
            assert_eq!(*pid, std::process::id());
        }
        other => panic!("expected HostIdTaken, got {other:?}"),
    }
    assert!(e.is_bad_store());
    assert!(e.to_string().contains("`same`"), "{e}");
    // Registering again is the first host's own business.
    a.register("http://a").unwrap();
    assert!(matches!(b.claim(1), Err(StoreError::HostLost { .. })));
    a.deregister(true).unwrap();
    b.register("http://b").unwrap();
    assert!(!a.hosts().unwrap().is_empty());
}

/// Two hosts racing to claim 1,000 queued runs, each from its own connections: every
/// run is claimed exactly once.
#[test]
fn two_hosts_racing_to_claim_a_thousand_runs_claim_each_once() {
    if support::skip_pg() {
        return;
    }
    let fresh = Fresh::new(Backend::Postgres);
    let setup = host(&fresh, "setup", Duration::from_secs(60));
    let mut ids = HashSet::new();
    for _ in 0..1000 {
        let id = setup.create_run(&new_run()).unwrap().run_id;
        setup.enqueue(&id).unwrap();
        ids.insert(id);
    }
    let hosts: Vec<Arc<PgStore>> = ["racer-1", "racer-2"]
        .iter()
        .map(|n| Arc::new(host(&fresh, n, Duration::from_secs(60))))
        .collect();
    let started = std::time::Instant::now();
    let claims: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .iter()
            .map(|h| {
                s.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let got = h.claim(10).unwrap();
                        if got.is_empty() {
                            return mine;
                        }
                        mine.extend(got.into_iter().map(|c| c.run_id));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    let all: Vec<&String> = claims.iter().flatten().collect();
    let distinct: HashSet<&String> = all.iter().copied().collect();
    assert_eq!(all.len(), 1000, "claimed {} times for 1000 runs", all.len());
    assert_eq!(distinct.len(), 1000);
    assert!(distinct.iter().all(|id| ids.contains(*id)));
    eprintln!(
        "claims: 1000 runs by 2 hosts in {elapsed:?} ({:.0}/s; {} and {})",
        1000.0 / elapsed.as_secs_f64(),
        claims[0].len(),
        claims[1].len()
    );
}
