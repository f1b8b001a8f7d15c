//! A directory laid out for durable-run tests, as a user would: `heddle.toml` grants
//! `./data` to the `files` package, allows subprocess code nodes and puts the run store
//! at `runs.db`; the graph, when there is one, is `g.json`. Effects are counted where
//! they land, in the lines `files.write_text` appended to `data/log.txt`, never in the
//! engine's own log.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[allow(unused_imports)]
pub use super::pg::Backend;
#[allow(unused_imports)] // each test file takes the codes it checks
pub use super::{INVALID, OK, SUSPENDED as PAUSED};
pub const BAD_STORE: i32 = 5;
pub const LIMIT: i32 = 6;
pub const LOCKED: i32 = 7;

pub const CONFIG: &str = r#"
[packages.files]
dirs = [{ host = "./data", guest = "/data", mode = "rw" }]

[runners]
allow_subprocess = true

[store]
path = "runs.db"
"#;

/// A constant line, appended to /data/log.txt by `w` (not retry-safe), then upper-cased
/// by `up` (retry-safe).
pub const CHAIN: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "one\n"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "path", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// Six items fanned out, each appended as a line by `w`, the byte counts collected.
pub const FANOUT: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": ["a\n", "b\n", "c\n", "d\n", "e\n", "f\n"]}},
    {"id": "each", "type": "heddle.foreach"},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "all", "type": "heddle.collect"},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
    {"source": "each", "sourceHandle": "item", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "bytes", "target": "all", "targetHandle": "item"},
    {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// `parse` fails (the text is not JSON), so `up` and the output never get an input:
/// the skip reasons a finished run records.
pub const FAILING_PARSE: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "not json {"}},
    {"id": "parse", "type": "std.json.parse"},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "parse", "targetHandle": "text"},
    {"source": "parse", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// Reads `/data/items.txt` (missing at first, so with `--supervise interactive` the run
/// waits for a person's retry while clients connect), splits it into lines and
/// upper-cases each one.
pub const WAITING_FAN: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/items.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "split", "type": "std.text.split", "properties": {"sep": "\n"}},
    {"id": "each", "type": "heddle.foreach"},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "all", "type": "heddle.collect"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "split", "targetHandle": "text"},
    {"source": "split", "sourceHandle": "parts", "target": "each", "targetHandle": "list"},
    {"source": "each", "sourceHandle": "item", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "all", "targetHandle": "item"},
    {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}]}"#;

/// A gate (`ship`) before the output: the run pauses there.
pub const GATED: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "notes"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "out", "targetHandle": "value"}
  ]
}"#;

pub struct StoreDir {
    dir: tempfile::TempDir,
    /// The database its runs are in (`[store] url`), on PostgreSQL; else `runs.db`.
    url: Option<String>,
}

impl StoreDir {
    /// The directory without a graph (the server's tests post theirs).
    pub fn new() -> StoreDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("heddle.toml"), CONFIG).unwrap();
        StoreDir { dir, url: None }
    }

    /// The directory with `graph` as `g.json`.
    pub fn with_graph(graph: &str) -> StoreDir {
        StoreDir::with_graph_on(Backend::Sqlite, graph)
    }

    /// The directory with its runs on `backend`: `runs.db`, or a fresh database on the
    /// tests' PostgreSQL server (`[store] url`; the `[store] path` it also names is then
    /// never created). One test body, run on each store by `both!`, checks that the
    /// semantics do not depend on the store.
    pub fn on(backend: Backend) -> StoreDir {
        let mut d = StoreDir::new();
        if backend == Backend::Postgres {
            d.use_database(super::pg::fresh_database());
        }
        d
    }

    /// [`StoreDir::on`] with `graph` as `g.json`.
    pub fn with_graph_on(backend: Backend, graph: &str) -> StoreDir {
        let d = StoreDir::on(backend);
        std::fs::write(d.path().join("g.json"), graph).unwrap();
        d
    }

    /// Puts the runs in the database at `url` (`[store] url`, beside the path).
    pub fn use_database(&mut self, url: String) {
        let config = self.path().join("heddle.toml");
        let toml = std::fs::read_to_string(&config).unwrap();
        let toml = toml.replacen(
            "path = \"runs.db\"\n",
            &format!("path = \"runs.db\"\nurl = \"{url}\"\n"),
            1,
        );
        assert!(
            toml.contains(&url),
            "no `[store] path` to put the URL beside"
        );
        std::fs::write(config, toml).unwrap();
        self.url = Some(url);
    }

    /// Which store its runs are in.
    pub fn backend(&self) -> Backend {
        match self.url {
            Some(_) => Backend::Postgres,
            None => Backend::Sqlite,
        }
    }

    /// The database its runs are in, on PostgreSQL.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The same directory with the operator's cap of one invocation at a time on the
    /// `files` package: a fan-out into `files.write_text` runs its items one after
    /// another, as a node that declares nothing does.
    pub fn one_at_a_time(self) -> StoreDir {
        let path = self.path().join("heddle.toml");
        let config = std::fs::read_to_string(&path).unwrap().replacen(
            "[packages.files]\n",
            "[packages.files]\nconcurrency = 1\n",
            1,
        );
        std::fs::write(path, config).unwrap();
        self
    }

    /// The same directory with `text` added to its heddle.toml (another grant).
    pub fn with_config(self, text: &str) -> StoreDir {
        let path = self.path().join("heddle.toml");
        let mut config = std::fs::read_to_string(&path).unwrap();
        config.push_str(text);
        std::fs::write(path, config).unwrap();
        self
    }

    /// A directory with `examples/control-nodes` installed (a WASM controller,
    /// `demo.each_word`, and the node it drives, `demo.shout`) and its graph as `g.json`.
    pub fn with_control_nodes() -> StoreDir {
        let graph =
            std::fs::read_to_string(super::root().join("examples/control-nodes/graph.json"))
                .unwrap();
        StoreDir::with_packages(&graph, &[control_nodes()])
    }

    /// [`StoreDir::with_graph`] with the built packages `dists` installed
    /// (`heddle package add`).
    pub fn with_packages(graph: &str, dists: &[&Path]) -> StoreDir {
        let env = StoreDir::with_graph(graph);
        for dist in dists {
            let o = env.heddle(&["package", "add", dist.to_str().unwrap()]);
            expect(&o, OK);
        }
        env
    }

    /// `heddle ARGS` here, with no fault armed.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = super::command(self.path());
        c.args(args).env_remove("HEDDLE_FAULT");
        c
    }

    pub fn heddle(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("heddle starts")
    }

    /// A process whose stderr lines arrive on the returned channel as they are printed.
    pub fn spawn(&self, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
        let mut child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }

    /// `heddle run --durable g.json ARGS` aborted at the write-ahead boundary `fault`;
    /// returns the run id.
    pub fn crash(&self, fault: &str, args: &[&str]) -> String {
        let o = self
            .cmd(&["run", "--durable", "g.json"])
            .args(args)
            .env("HEDDLE_FAULT", fault)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), None, "not aborted:\n{}", text(&o));
        run_id(&o)
    }

    /// `heddle run --durable g.json` killed with SIGKILL after `delay`; returns the run
    /// id, or `None` when it died before the run was recorded (then nothing may have
    /// run, which this checks).
    pub fn run_killed_after(&self, delay: Duration) -> Option<String> {
        let mut child = self
            .cmd(&["run", "--durable", "g.json"])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        let id = super::stderr(&o).lines().find_map(run_id_in);
        if id.is_none() {
            assert!(
                self.lines().is_empty(),
                "effects before the run was recorded"
            );
        }
        id
    }

    /// Lines the provider side wrote.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path().join("data/log.txt"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// What a recovered FANOUT run must have done: every item written (nothing lost),
    /// and no item written twice except by a re-offer the user asked for explicitly.
    pub fn assert_fanout_effects(&self, reoffers: usize, what: &str) {
        let mut lines = self.lines();
        let total = lines.len();
        lines.sort();
        lines.dedup();
        assert_eq!(lines, ["a", "b", "c", "d", "e", "f"], "{what}: lost work");
        assert!(
            total - 6 <= reoffers,
            "{what}: {} repeated effects with {reoffers} explicit re-offers",
            total - 6
        );
    }

    /// The run store file.
    pub fn db(&self) -> PathBuf {
        self.path().join("runs.db")
    }

    /// The `kind` records in every run of the store, read through the store as another
    /// process would (a result's stored body is binary, and records committed together
    /// share a row), large values left as the references the log holds.
    pub fn records_of(&self, kind: &str) -> Vec<heddle_core::Record> {
        let store = self.open_store();
        let mut out = Vec::new();
        for run in store.list().unwrap() {
            for s in store.read(&run.run_id, 0).unwrap().records {
                if s.record.kind() == kind {
                    out.push(s.record);
                }
            }
        }
        out
    }

    /// The run store, opened as another process would (either kind).
    pub fn open_store(&self) -> std::sync::Arc<dyn heddle_store::RunStore> {
        match &self.url {
            None => std::sync::Arc::new(heddle_store::SqliteStore::open(&self.db()).unwrap()),
            Some(url) => heddle_store::location::open(&heddle_store::StoreLocation::parse(url))
                .unwrap()
                .runs(),
        }
    }

    /// Whether the store holds `needle` anywhere, as bytes: the SQLite file and its
    /// write-ahead log, or every row of the database's tables (as text), so a test can
    /// check that a secret never reached it.
    pub fn store_holds(&self, needle: &str) -> bool {
        match &self.url {
            None => ["runs.db", "runs.db-wal"].iter().any(|f| {
                std::fs::read(self.path().join(f))
                    .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            }),
            Some(url) => {
                let tables = super::pg::query(
                    url,
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'heddle'",
                );
                tables.iter().any(|t| {
                    let t = t[0].as_deref().unwrap();
                    // Bytes as text and as hex, so a bytea column is searched too.
                    let hex: String = needle.bytes().map(|b| format!("{b:02x}")).collect();
                    let q = format!(
                        "SELECT count(*) FROM heddle.{t} r WHERE strpos(r::text, '{needle}') > 0 OR strpos(r::text, '{hex}') > 0"
                    );
                    super::pg::query(url, &q)[0][0].as_deref() != Some("0")
                })
            }
        }
    }

    /// The `kind` records about `node` in every run of the store ([`Self::records_of`]),
    /// as JSON.
    pub fn records(&self, kind: &str, node: &str) -> Vec<String> {
        self.records_of(kind)
            .into_iter()
            .filter(|r| r.occurrence().is_some_and(|o| o.node == node))
            .map(|r| serde_json::to_string(&r).unwrap())
            .collect()
    }

    /// Resumes run `id` until it completes, explicitly re-offering the uncertain work of
    /// every reconcile pause (the user's decision, so it may repeat an effect); returns
    /// the outputs and how many re-offers it took. A run the killed process had already
    /// finished ends with `reference` (its outputs are not printed again).
    pub fn resume_until_done(
        &self,
        id: &str,
        reference: &serde_json::Value,
        what: &str,
    ) -> (serde_json::Value, usize) {
        let mut reoffers = 0;
        let mut pause: Option<u64> = None;
        for _ in 0..20 {
            let event = pause.map(|e| e.to_string());
            let mut args = vec!["runs", "resume", id, "--json"];
            if let Some(e) = &event {
                args.extend(["--pause", e.as_str()]);
            }
            let o = self.heddle(&args);
            match o.status.code() {
                Some(OK) => return (report(&o)["outputs"].clone(), reoffers),
                Some(PAUSED) => {
                    pause = Some(pause_event(&o));
                    reoffers += 1;
                }
                Some(INVALID) if super::stderr(&o).contains("is completed") => {
                    return (reference.clone(), reoffers);
                }
                _ => panic!("{what}: {}", text(&o)),
            }
        }
        panic!("{what}: no progress in 20 resumes");
    }

    /// `heddle runs show ID --json`.
    pub fn show(&self, id: &str) -> serde_json::Value {
        let o = self.heddle(&["runs", "show", id, "--json"]);
        expect(&o, OK);
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// `heddle runs status ID --json`.
    pub fn status(&self, id: &str) -> serde_json::Value {
        let o = self.heddle(&["runs", "status", id, "--json"]);
        expect(&o, OK);
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

/// Outputs of an uninterrupted durable run of `graph` in a fresh directory: what every
/// crashed and recovered run must end with.
pub fn reference_outputs(graph: &str) -> serde_json::Value {
    let env = StoreDir::with_graph(graph);
    let o = env.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    report(&o)["outputs"].clone()
}

/// The event id of the pause a paused command reported.
pub fn pause_event(o: &Output) -> u64 {
    let e = super::stderr(o);
    let rest = e
        .split("paused at event ")
        .nth(1)
        .unwrap_or_else(|| panic!("no pause reported:\n{}", text(o)));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// Everything a process said, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "--- status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
pub fn expect(o: &Output, code: i32) {
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
}

/// The JSON report on stdout.
pub fn report(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)))
}

/// The run id `durable run ID (store …)` printed before anything runs.
pub fn run_id(o: &Output) -> String {
    let e = super::stderr(o);
    e.lines()
        .find_map(run_id_in)
        .unwrap_or_else(|| panic!("no run id printed:\n{}", text(o)))
}

pub fn run_id_in(line: &str) -> Option<String> {
    line.strip_prefix("durable run ")
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_string)
}

pub fn sigkill(pid: i32) {
    // SAFETY: kill(2) touches no memory; a process already gone is fine.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Waits for a line matching `f` (a generous bound so a slow machine does not fail
/// the test; nothing is asserted about the time).
pub fn wait_line<T>(rx: &mpsc::Receiver<String>, mut f: impl FnMut(&str) -> Option<T>) -> T {
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the process printed the expected line");
        if let Some(t) = f(&line) {
            return t;
        }
    }
}

/// Pseudo-random numbers for kill moments, seeded from the clock, or from
/// `HEDDLE_TEST_SEED` to replay a failed round; the seed is printed with the test's output.
pub fn kill_moments() -> impl FnMut() -> u64 {
    moments(seed())
}

/// The seed of a randomized test: `HEDDLE_TEST_SEED` to replay a failed round, else the
/// clock; printed with the test's output.
pub fn seed() -> u64 {
    let seed = std::env::var("HEDDLE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (replay with HEDDLE_TEST_SEED={seed})");
    seed
}

/// Pseudo-random numbers from `seed` (a linear congruential generator: the same seed,
/// the same numbers).
pub fn moments(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    }
}

/// `examples/control-nodes` built as a user builds it (`heddle package build`), once
/// per test process; its `dist` folder.
pub fn control_nodes() -> &'static Path {
    static DIST: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIST.get_or_init(|| {
        let src = super::root().join("examples/control-nodes");
        let o = super::heddle(&["package", "build", src.to_str().unwrap()]);
        expect(&o, OK);
        src.join("dist")
    })
}
