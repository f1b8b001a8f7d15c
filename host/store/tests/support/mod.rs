//! What the store's tests share: each backend, a fresh store of it per test, and ways to
//! damage what a store holds as a crash or a disk would.
//!
//! PostgreSQL: one server per test run, found at `HEDDLE_TEST_PG_URL` (scripts/test
//! starts it with `scripts/pg-up`); when that is unset, the first test that needs it
//! starts one with `scripts/pg-up` for this test binary (stopped when it exits). Every
//! test gets a database of its own. Under `CI=true` a test that cannot get a server
//! fails; elsewhere it fails too, unless `HEDDLE_SKIP_PG=1` says to skip it.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use heddle_store::{PgOptions, PgStore, RunStore, SqliteStore};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates `mod sqlite` and `mod postgres`, each with a `#[test]` per name calling
/// `name(Backend)`: one test body, both stores.
#[macro_export]
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name($crate::support::Backend::Sqlite) } )*
        }
        mod postgres {
            $( #[test] fn $name() {
                if $crate::support::skip_pg() { return; }
                super::$name($crate::support::Backend::Postgres)
            } )*
        }
    };
}

/// The cluster this binary started (when the environment named none).
struct Started {
    admin_url: String,
    data: PathBuf,
    bin: PathBuf,
}

/// The checkout's root (the store's tests and the binary's share this module).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("scripts/pg-up").exists())
        .expect("scripts/pg-up above the crate")
        .to_path_buf()
}

/// Runs `scripts/pg-up` (stopped once this process exits) and reads what it printed.
fn start_cluster() -> Result<Started, String> {
    let out = std::process::Command::new(repo_root().join("scripts/pg-up"))
        .arg("--until-exit")
        .arg(std::process::id().to_string())
        .output()
        .map_err(|e| format!("cannot run scripts/pg-up: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/pg-up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let var = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(str::to_string)
            .ok_or_else(|| format!("scripts/pg-up printed no {name}"))
    };
    Ok(Started {
        admin_url: var("HEDDLE_TEST_PG_URL")?,
        data: var("HEDDLE_TEST_PG_DATA")?.into(),
        bin: var("HEDDLE_TEST_PG_BIN")?.into(),
    })
}

/// The shared server's admin URL (its `postgres` database).
pub fn admin_url() -> String {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| match std::env::var("HEDDLE_TEST_PG_URL") {
        Ok(u) if !u.is_empty() => Ok(u),
        _ => start_cluster().map(|s| s.admin_url),
    })
    .clone()
    .unwrap_or_else(|e| panic!("no PostgreSQL server for the tests: {e}"))
}

/// Whether to skip a PostgreSQL test: only when asked (`HEDDLE_SKIP_PG=1`) and never
/// under CI.
pub fn skip_pg() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let asked = std::env::var("HEDDLE_SKIP_PG").is_ok_and(|v| v == "1");
    if asked && !ci {
        eprintln!("HEDDLE_SKIP_PG=1: PostgreSQL test skipped");
        return true;
    }
    false
}

/// A cluster of its own for a test that stops and starts the server (others would see
/// their connections drop): its admin URL, data directory and binaries.
pub struct OwnCluster {
    pub admin_url: String,
    pub data: PathBuf,
    pub bin: PathBuf,
}

impl OwnCluster {
    pub fn start() -> OwnCluster {
        let s = start_cluster().unwrap_or_else(|e| panic!("no PostgreSQL server: {e}"));
        OwnCluster {
            admin_url: s.admin_url,
            data: s.data,
            bin: s.bin,
        }
    }

    fn pg_ctl(&self, args: &[&str]) {
        let pg_ctl = self.bin.join("pg_ctl");
        // Postgres refuses root; scripts/pg-up ran it as `postgres`.
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
            c
        } else {
            std::process::Command::new(&pg_ctl)
        };
        let status = cmd
            .arg("-D")
            .arg(&self.data)
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run pg_ctl");
        assert!(status.success(), "pg_ctl {args:?} failed");
    }

    /// Kills the server as a crash would (`pg_ctl -m immediate stop`).
    pub fn crash(&self) {
        self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
    }

    /// Starts it again with the options it had (`restart` reads `postmaster.opts`),
    /// waiting until it accepts connections.
    pub fn start_again(&self) {
        let log = self.data.with_file_name("server.log");
        let log = log.to_string_lossy().to_string();
        self.pg_ctl(&["-w", "-t", "60", "-l", &log, "restart"]);
    }
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `admin`'s URL with database `db`.
pub fn with_db(admin: &str, db: &str) -> String {
    let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{db}")
}

/// Runs `f` with a connection to the server at `url` (a small runtime of its own).
fn with_client<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    rt().block_on(async move {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        let driver = tokio::spawn(conn);
        let out = f(&client).await;
        drop(client);
        let _ = driver.await;
        out
    })
}

/// Runs SQL statements on the server at `url`.
pub fn sql(url: &str, statements: &str) {
    with_client(url, async |c| {
        c.batch_execute(statements)
            .await
            .unwrap_or_else(|e| panic!("{statements}: {e:?}"))
    })
}

/// The rows of a query on the server at `url`, every column read as text.
pub fn query(url: &str, q: &str) -> Vec<Vec<Option<String>>> {
    with_client(url, async |c| {
        let msgs = c
            .simple_query(q)
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        msgs.into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect()
    })
}

/// Whether a client can connect to `url` (the server's refusal, else).
pub fn connects(url: &str) -> Result<(), String> {
    rt().block_on(async move {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let driver = tokio::spawn(conn);
        drop(client);
        let _ = driver.await;
        Ok(())
    })
}

/// A login role of the shared server that must give its password (`scram-sha-256`),
/// where every other role is trusted: scripts/pg-up writes its line first in
/// `pg_hba.conf`; on a cluster started without it the line is put there here (once; the
/// tests own the throwaway cluster) and the configuration reloaded, waited for until a
/// wrong password is refused.
/// Returns the role and its password, for tests of a refused password.
pub fn password_role() -> (String, String) {
    const ROLE: &str = "heddle_pw";
    const PASSWORD: &str = "right-horse-battery";
    let admin = admin_url();
    sql(
        &admin,
        &format!(
            "DO $$ BEGIN CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}';
             EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        ),
    );
    let rules = query(
        &admin,
        &format!("SELECT count(*) FROM pg_hba_file_rules WHERE '{ROLE}' = ANY(user_name)"),
    );
    if rules[0][0].as_deref() == Some("0") {
        let file = query(&admin, "SHOW hba_file")[0][0].clone().unwrap();
        let old = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        // Written in place: the file keeps its owner (the server's user) and mode.
        std::fs::write(
            &file,
            format!("host all {ROLE} 127.0.0.1/32 scram-sha-256\n{old}"),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}"));
        sql(&admin, "SELECT pg_reload_conf()");
    }
    // The reload is a signal: wait (bounded) until the server asks for the password.
    let (base, db) = admin.rsplit_once('/').unwrap();
    let after = base.rsplit_once('@').map_or(base, |(_, h)| h);
    let wrong = format!("postgres://{ROLE}:not-it@{after}/{db}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while connects(&wrong).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never asked {ROLE} for a password"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (ROLE.into(), PASSWORD.into())
}

/// A run to create in a test: every part of the header holds something.
pub fn new_run() -> heddle_store::NewRun {
    heddle_store::NewRun {
        graph_name: "g.json".into(),
        graph_bytes: br#"{"nodes":[],"edges":[]}"#.to_vec(),
        plan: heddle_core::PlanSummary {
            nodes: vec![heddle_core::PlannedNode {
                id: "a".into(),
                node_type: "std.json.parse".into(),
                retry_safe: true,
                origin: heddle_core::Origin::Package {
                    name: "std".into(),
                    version: "0.1.0".into(),
                },
            }],
            edges: 0,
            ..Default::default()
        },
        inputs: std::collections::BTreeMap::from([("n".to_string(), heddle_core::Value::Int(3))]),
        secrets: vec!["API_KEY".into()],
        packages: std::collections::BTreeMap::from([(
            "std".to_string(),
            heddle_store::PackagePin::digest("ab".repeat(32)),
        )]),
        limits: heddle_store::RunLimits {
            budget: heddle_store::Budget {
                max_dispatches: Some(10),
                time_limit_ms: None,
            },
            ..Default::default()
        },
    }
}

/// A retry-safe dispatch of `node`.
pub fn dispatched(node: &str) -> heddle_core::Record {
    heddle_core::Record::Dispatched {
        occurrence: heddle_core::Occurrence::new(node, "", 0),
        retry_safe: true,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A fresh database on the shared server; its URL.
pub fn fresh_database() -> String {
    fresh_database_on(&admin_url())
}

/// A fresh database on the server at `admin`; its URL.
pub fn fresh_database_on(admin: &str) -> String {
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let db = format!(
        "heddle_t_{}_{}_{n}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    sql(admin, &format!("CREATE DATABASE {db}"));
    with_db(admin, &db)
}

/// Options for tests: leases renewed by the store, a short operation timeout.
pub fn pg_options() -> PgOptions {
    PgOptions {
        op_timeout: std::time::Duration::from_secs(20),
        ..PgOptions::default()
    }
}

/// A fresh, empty store of `backend`.
pub struct Fresh {
    pub backend: Backend,
    /// SQLite: the file's directory (deleted with this).
    dir: Option<tempfile::TempDir>,
    /// Where it is: the SQLite file, or the database URL.
    pub location: String,
}

impl Fresh {
    pub fn new(backend: Backend) -> Fresh {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let location = dir.path().join(".heddle/runs.db").display().to_string();
                Fresh {
                    backend,
                    dir: Some(dir),
                    location,
                }
            }
            Backend::Postgres => Fresh {
                backend,
                dir: None,
                location: fresh_database(),
            },
        }
    }

    /// A handle on the store (another process's, when called again).
    pub fn open(&self) -> Arc<dyn RunStore> {
        match self.backend {
            Backend::Sqlite => Arc::new(SqliteStore::open(Path::new(&self.location)).unwrap()),
            Backend::Postgres => Arc::new(self.open_pg(pg_options())),
        }
    }

    /// A handle of either kind, as `heddle_store::open` gives it (the fleet too).
    pub fn open_store(&self) -> heddle_store::Store {
        heddle_store::location::open_with(
            &heddle_store::StoreLocation::parse(&self.location),
            pg_options(),
        )
        .unwrap()
    }

    pub fn open_pg(&self, opts: PgOptions) -> PgStore {
        assert_eq!(self.backend, Backend::Postgres);
        PgStore::open_with(&self.location, opts).unwrap()
    }

    /// Runs `sqlite` on the SQLite file or `postgres` on the database (schema `heddle`),
    /// with `$RUN` and `$SEQ` replaced: how a test damages what the store holds.
    pub fn tamper(&self, run: &str, seq: i64, sqlite: &str, postgres: &str) {
        match self.backend {
            Backend::Sqlite => {
                let c = rusqlite::Connection::open(&self.location).unwrap();
                let s = sqlite
                    .replace("$RUN", &format!("'{run}'"))
                    .replace("$SEQ", &seq.to_string());
                c.execute_batch(&s).unwrap();
            }
            Backend::Postgres => {
                let s = postgres
                    .replace("$RUN", &format!("'{run}'"))
                    .replace("$SEQ", &seq.to_string());
                sql(&self.location, &format!("SET search_path = heddle; {s}"));
            }
        }
    }

    /// Cuts the body of `run`'s row keyed `seq` to its first `len` bytes (a torn write).
    pub fn cut_body(&self, run: &str, seq: i64, len: i64) {
        let sqlite = format!(
            "UPDATE events SET body = substr(body, 1, {len}) WHERE run_id = $RUN AND seq = $SEQ"
        );
        let postgres = format!(
            "UPDATE events SET body = substr(body, 1, {len}) WHERE run_id = $RUN AND seq = $SEQ"
        );
        self.tamper(run, seq, &sqlite, &postgres);
    }

    /// Replaces `from` by `to` in the JSON body of `run`'s row keyed `seq`.
    pub fn replace_in_body(&self, run: &str, seq: i64, from: &str, to: &str) {
        let sqlite = format!(
            "UPDATE events SET body = replace(body, '{from}', '{to}') WHERE run_id = $RUN AND seq = $SEQ"
        );
        let postgres = format!(
            "UPDATE events SET body = convert_to(replace(convert_from(body, 'UTF8'), '{from}', '{to}'), 'UTF8')
             WHERE run_id = $RUN AND seq = $SEQ"
        );
        self.tamper(run, seq, &sqlite, &postgres);
    }

    /// Deletes `run`'s row keyed `seq`.
    pub fn delete_row(&self, run: &str, seq: i64) {
        let s = "DELETE FROM events WHERE run_id = $RUN AND seq = $SEQ";
        self.tamper(run, seq, s, s);
    }
}

/// A TCP proxy to `upstream` whose two directions can each be black-holed: bytes are
/// read and dropped, and a close waits for the partition to heal, as a partition looks
/// to both ends.
pub struct Proxy {
    pub port: u16,
    /// Drop what the client sends.
    pub requests: Arc<AtomicBool>,
    /// Drop what the server answers.
    pub answers: Arc<AtomicBool>,
    /// Drop every answer from the next `COMMIT` a client sends on (the commit reaches
    /// the server, its answer never reaches the client).
    pub cut_at_commit: Arc<AtomicBool>,
    /// Black-hole both ways from the next `COMMIT` a client sends, that one included
    /// (the server is left with a transaction open, its client gone silent).
    pub cut_before_commit: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(AtomicBool::new(false));
        let cut_at_commit = Arc::new(AtomicBool::new(false));
        let cut_before_commit = Arc::new(AtomicBool::new(false));
        let (rq, an) = (requests.clone(), answers.clone());
        let (cut, before) = (cut_at_commit.clone(), cut_before_commit.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                pipe(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    rq.clone(),
                    Some(AtCommit {
                        after: cut.clone(),
                        before: before.clone(),
                        answers: an.clone(),
                    }),
                );
                pipe(server, client, an.clone(), None);
            }
        });
        Proxy {
            port,
            requests,
            answers,
            cut_at_commit,
            cut_before_commit,
        }
    }
}

/// What a client's `COMMIT` does to the proxy ([`Proxy::cut_at_commit`],
/// [`Proxy::cut_before_commit`]); `answers` is the other direction's switch.
struct AtCommit {
    after: Arc<AtomicBool>,
    before: Arc<AtomicBool>,
    answers: Arc<AtomicBool>,
}

/// Copies `from` to `to`, dropping everything while `drop_all`; with `at_commit`, a chunk
/// holding `COMMIT` while one of its switches is armed black-holes what it says.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    drop_all: Arc<AtomicBool>,
    at_commit: Option<AtCommit>,
) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if drop_all.load(Ordering::SeqCst) {
                continue;
            }
            if let Some(c) = &at_commit
                && buf[..n].windows(6).any(|w| w == b"COMMIT")
            {
                if c.before.load(Ordering::SeqCst) {
                    drop_all.store(true, Ordering::SeqCst);
                    c.answers.store(true, Ordering::SeqCst);
                    continue;
                }
                if c.after.load(Ordering::SeqCst) {
                    c.answers.store(true, Ordering::SeqCst);
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        // A close does not cross a partition either: it reaches the other end once the
        // partition heals.
        while drop_all.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// The port in `url`.
pub fn port_of(url: &str) -> u16 {
    let after = url.rsplit_once('@').map_or(url, |(_, h)| h);
    let hostport = after.split('/').next().unwrap();
    hostport.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// `url` through `proxy`.
pub fn through(url: &str, proxy: &Proxy) -> String {
    url.replacen(
        &format!(":{}/", port_of(url)),
        &format!(":{}/", proxy.port),
        1,
    )
}
