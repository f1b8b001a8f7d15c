//! What the store's tests share: each backend, a fresh store of it per test, and ways to
//! damage what a store holds as a crash or a disk would.
//!
//! PostgreSQL: one server per test run, found at `HEDDLE_TEST_PG_URL` (scripts/test
//! starts it with `scripts/pg-up`); when that is unset, the first test that needs it
//! starts one with `scripts/pg-up` for this test binary (stopped when it exits). Every
//! test gets a database of its own. Under `CI=true` a test that cannot get a server
//! fails; elsewhere it fails too, unless `HEDDLE_SKIP_PG=1` says to skip it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
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
