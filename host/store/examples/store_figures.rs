//! Figures for the two stores through the run log's writer (group commit as the kernel
//! uses it), and claims per second on PostgreSQL. A measurement, not a test:
//!
//! ```sh
//! eval "$(scripts/pg-up --until-exit $$)"
//! cargo run -p heddle-store --example store_figures -- "$HEDDLE_TEST_PG_URL"
//! ```
//!
//! Per store: results from 4 threads (unsynced appends, one flush at the end), in a
//! burst and paced as a run's nodes would deliver them: records per second and records
//! per commit (the group-commit batch); then
//! synced appends one after another (a start that is not retry-safe): appends per
//! second. On PostgreSQL: 1,000 queued runs claimed in batches of 10 by 1, 2 and 3
//! hosts, each with its own connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use heddle_core::{InvocationMetrics, Occurrence, Record, Value};
use heddle_store::fleet::Fleet;
use heddle_store::{NewRun, PgOptions, PgStore, RunLog, RunStore, SqliteStore};

fn new_run() -> NewRun {
    NewRun {
        graph_name: "figures".into(),
        graph_bytes: b"{}".to_vec(),
        plan: Default::default(),
        inputs: Default::default(),
        secrets: Vec::new(),
        packages: Default::default(),
        limits: Default::default(),
    }
}

fn result(t: usize, i: usize) -> Record {
    Record::Completed {
        occurrence: Occurrence::new(format!("n{t}"), "", i as u32),
        outputs: vec![("out".into(), Value::Int(i as i64))],
        emitted: Vec::new(),
        metrics: InvocationMetrics {
            wall_us: 40,
            ..Default::default()
        },
    }
}

/// `threads` appending `per` results each, `pace` apart (none: as fast as they can).
fn stream(
    store: Arc<dyn RunStore>,
    threads: usize,
    per: usize,
    pace: Option<Duration>,
) -> (Duration, u64, u64) {
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let log = Arc::new(RunLog::start(store.clone(), &id, epoch, 0));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let log = log.clone();
            s.spawn(move || {
                for i in 0..per {
                    log.append(result(t, i));
                    if let Some(p) = pace {
                        std::thread::sleep(p);
                    }
                }
            });
        }
    });
    log.flush().wait().unwrap();
    let elapsed = t0.elapsed();
    let c = log.counters();
    log.close().unwrap();
    assert_eq!(store.read(&id, 0).unwrap().records.len(), threads * per);
    (elapsed, c.records, c.commits)
}

fn synced(store: Arc<dyn RunStore>, n: usize) -> Duration {
    let id = store.create_run(&new_run()).unwrap().run_id;
    let epoch = store.acquire(&id).unwrap();
    let log = RunLog::start(store, &id, epoch, 0);
    let t0 = Instant::now();
    for i in 0..n {
        let (_, wait) = log.append_synced(result(0, i));
        wait.wait().unwrap();
    }
    let d = t0.elapsed();
    log.close().unwrap();
    d
}

fn report(name: &str, store: Arc<dyn RunStore>) {
    let (threads, per) = (4, 5_000);
    let (d, records, commits) = stream(store.clone(), threads, per, None);
    println!(
        "{name}: burst of {} results from {threads} threads: {:.0} records/s, {commits} commits, {:.1} records per commit",
        records,
        records as f64 / d.as_secs_f64(),
        records as f64 / commits.max(1) as f64
    );
    let pace = Duration::from_micros(200);
    let (d, records, commits) = stream(store.clone(), threads, 2_000, Some(pace));
    println!(
        "{name}: paced stream of {records} results from {threads} threads (one per {pace:?} each): {:.0} records/s, {commits} commits, {:.1} records per commit",
        records as f64 / d.as_secs_f64(),
        records as f64 / commits.max(1) as f64
    );
    let n = 300;
    let d = synced(store, n);
    println!(
        "{name}: {n} synced appends one after another: {:.0}/s ({:.2} ms each)",
        n as f64 / d.as_secs_f64(),
        d.as_secs_f64() * 1000.0 / n as f64
    );
}

fn claims(url: &str, hosts: usize) {
    let db = format!(
        "heddle_claims_{}_{hosts}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let admin = PgStore::open(url).unwrap();
    drop(admin);
    let base = url.rsplit_once('/').unwrap().0;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(conn);
        c.batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
        drop(c);
        let _ = driver.await;
    });
    let url = format!("{base}/{db}");
    let opts = |id: String| PgOptions {
        host_id: Some(id),
        keep_leases: false,
        lease_ttl: Duration::from_secs(600),
        ..PgOptions::default()
    };
    let setup = PgStore::open_with(&url, opts("setup".into())).unwrap();
    for _ in 0..1000 {
        let id = setup.create_run(&new_run()).unwrap().run_id;
        setup.enqueue(&id).unwrap();
    }
    let claimers: Vec<PgStore> = (0..hosts)
        .map(|h| {
            let s = PgStore::open_with(&url, opts(format!("claimer-{h}"))).unwrap();
            s.register("http://figures").unwrap();
            s
        })
        .collect();
    let t0 = Instant::now();
    let counts: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = claimers
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut n = 0;
                    loop {
                        let got = c.claim(10).unwrap().len();
                        if got == 0 {
                            return n;
                        }
                        n += got;
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let d = t0.elapsed();
    let total: usize = counts.iter().sum();
    assert_eq!(total, 1000, "each run claimed once");
    println!(
        "postgres: 1000 queued runs claimed by {hosts} host(s) in batches of 10: {:.0} claims/s ({counts:?})",
        1000.0 / d.as_secs_f64()
    );
}

fn main() {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("HEDDLE_TEST_PG_URL").ok())
        .expect("a PostgreSQL URL (argument or HEDDLE_TEST_PG_URL)");
    let dir = tempfile::tempdir().unwrap();
    report(
        "sqlite",
        Arc::new(SqliteStore::open(&dir.path().join("runs.db")).unwrap()),
    );
    report("postgres", Arc::new(PgStore::open(&url).unwrap()));
    for hosts in 1..=3 {
        claims(&url, hosts);
    }
}
