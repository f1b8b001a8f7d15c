//! A server in this process, as `heddle serve` builds one: a [`Runtime`] on a
//! directory laid out as a user's (`heddle.toml` grants `./data` to the `files`
//! package, allows subprocess code nodes, puts the store at `runs.db`), its [`Host`] and
//! [`heddle_server::api::router`], driven with `tower`'s `oneshot` and no socket (axum's
//! `examples/testing`). Effects are counted where they land, in the lines
//! `files.write_text` appended to `data/log.txt`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use axum::response::Response;
use heddle_runtime::{Overrides, Runtime, ServeOverrides, Settings, Supervise};
use heddle_server::Host;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

/// `DATA` is the directory's `data`: a grant's host directory is relative to the
/// working directory, which a test shares with the others.
pub const CONFIG: &str = r#"
[packages.files]
dirs = [{ host = "DATA", guest = "/data", mode = "rw" }]

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

/// Reads `/data/ready.txt` (retry-safe): fails until the file exists.
pub const READ: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/ready.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

/// The PostgreSQL server of the tests (a database per test), as the store's tests find
/// it: `HEDDLE_TEST_PG_URL`, else one started for this binary.
#[path = "../../../store/tests/support/mod.rs"]
pub mod pg;

/// Which store a test's server keeps its runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Store {
    /// The directory's `runs.db`, owned by this server alone.
    #[default]
    File,
    /// A PostgreSQL database several hosts share (a fresh one).
    Shared,
    /// This database, shared with another test server (a second host).
    Joined(String),
}

/// One test body, generated as a test per store (`mod sqlite`, `mod postgres`): the
/// server's semantics hold on both.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::support::Store::File).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   if $crate::support::pg::skip_pg() { return; }
                   super::$name($crate::support::Store::Shared).await
               } )*
        }
    };
}

/// How a test's server is set up beyond the directory's `heddle.toml`.
#[derive(Default)]
pub struct Setup {
    /// Where its runs are.
    pub store: Store,
    /// The API token (another host's), instead of a new one.
    pub token: Option<String>,
    /// Runs executing at once (default 4).
    pub workers: Option<usize>,
    /// Lines appended to `heddle.toml`.
    pub config: &'static str,
    /// `--supervise`.
    pub supervise: Option<Supervise>,
    /// `--decision-timeout-ms`.
    pub decision_timeout_ms: Option<u64>,
    /// The largest JSON answer the router masks (default: the server's).
    pub max_json_bytes: Option<usize>,
    /// `--lease-ttl-ms` (default: the server's).
    pub lease_ttl_ms: Option<u64>,
    /// How often a host of a shared store looks for work whatever it was told (default:
    /// the server's, [`heddle_server::fleet::POLL`]).
    pub claim_poll: Option<Duration>,
}

/// One server's directory, runtime, host and router.
pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub host: Arc<Host>,
    router: Router,
    token: String,
    database: Option<String>,
}

impl TestServer {
    /// A server with the directory's defaults.
    pub async fn start() -> TestServer {
        TestServer::with(Setup::default()).await
    }

    /// A server with the directory's defaults on `store`.
    pub async fn on(store: Store) -> TestServer {
        TestServer::with(Setup {
            store,
            ..Setup::default()
        })
        .await
    }

    /// Another host on this server's database (a shared store), in a directory of its
    /// own.
    pub async fn second_host(&self) -> TestServer {
        self.second_host_with(Setup::default()).await
    }

    /// [`TestServer::second_host`] set up as `setup` says otherwise.
    pub async fn second_host_with(&self, setup: Setup) -> TestServer {
        TestServer::with(Setup {
            store: Store::Joined(self.database().expect("a shared store")),
            token: Some(self.token.clone()),
            ..setup
        })
        .await
    }

    /// The database its runs are in, on a shared store.
    pub fn database(&self) -> Option<String> {
        self.database.clone()
    }

    pub async fn with(setup: Setup) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let config = dir.path().join("heddle.toml");
        let data = dir.path().join("data");
        let base = CONFIG.replace("DATA", data.to_str().unwrap());
        std::fs::write(&config, format!("{base}{}", setup.config)).unwrap();
        let database = match &setup.store {
            Store::File => None,
            // The helper runs a small runtime of its own: off this one's threads.
            Store::Shared => Some(
                tokio::task::spawn_blocking(pg::fresh_database)
                    .await
                    .unwrap(),
            ),
            Store::Joined(url) => Some(url.clone()),
        };
        let settings = Settings::load(&Overrides {
            config: Some(config),
            packages: Some(dir.path().join(".heddle")),
            store: database.clone(),
            serve: ServeOverrides {
                supervise: setup.supervise,
                decision_timeout_ms: setup.decision_timeout_ms,
                lease_ttl_ms: setup.lease_ttl_ms,
                host_id: None,
            },
            ..Overrides::default()
        })
        .unwrap();
        let runtime = Arc::new(Runtime::load(settings, None).await.unwrap());
        let store = heddle_server::lease::open(runtime.settings()).unwrap();
        let host = match store.ownership {
            heddle_server::lease::Ownership::Alone(_) => Arc::new(Host::new(
                store.runs,
                runtime.clone(),
                setup.workers.unwrap_or(4),
                tokio::runtime::Handle::current(),
            )),
            heddle_server::lease::Ownership::Shared(fleet) => {
                // Registered and claiming, as `Server::activate` makes a host.
                let f = fleet.clone();
                tokio::task::spawn_blocking(move || f.register("in-process"))
                    .await
                    .unwrap()
                    .unwrap();
                let host = Arc::new(Host::shared(
                    store.runs,
                    fleet,
                    runtime.clone(),
                    setup.workers.unwrap_or(4),
                    tokio::runtime::Handle::current(),
                ));
                tokio::spawn(heddle_server::fleet::serve_polling(
                    host.clone(),
                    "in-process".into(),
                    runtime.settings().serve.lease_ttl,
                    setup.claim_poll.unwrap_or(heddle_server::fleet::POLL),
                ));
                host
            }
        };
        let token_path = heddle_server::token::path_for(runtime.settings().store.path());
        if let Some(t) = &setup.token {
            // Hosts of one database answer to one token (an operator copies the file).
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&token_path)
                .unwrap();
            std::io::Write::write_all(&mut f, format!("{t}\n").as_bytes()).unwrap();
        }
        let (token, _) = heddle_server::token::load_or_create(&token_path).unwrap();
        let router = heddle_server::api::router_bounded(
            host.clone(),
            token.clone(),
            setup
                .max_json_bytes
                .unwrap_or(heddle_server::mask::MAX_MASKED_BODY),
        );
        TestServer {
            dir,
            host,
            router,
            token: token.as_str().to_string(),
            database,
        }
    }

    /// The runs its store holds (either kind).
    pub fn stored_runs(&self) -> Vec<heddle_store::RunSummary> {
        self.host.store.list().unwrap()
    }

    /// The file the run store is in.
    pub fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("runs.db")
    }

    /// The run store, as another reader of it would use it (either kind).
    pub fn store(&self) -> Arc<dyn heddle_store::RunStore> {
        self.host.store.clone()
    }

    /// Runs `sqlite` on the store file or `postgres` on the database (schema `heddle`),
    /// with `$SHA` replaced by `sha` quoted: how a test damages what the store holds,
    /// on either kind of store.
    pub async fn tamper(&self, sha: &str, sqlite: &str, postgres: &str) {
        let quoted = format!("'{sha}'");
        match &self.database {
            None => {
                let db = rusqlite::Connection::open(self.db()).unwrap();
                db.busy_timeout(Duration::from_secs(10)).unwrap();
                db.execute_batch(&sqlite.replace("$SHA", &quoted)).unwrap();
            }
            Some(url) => {
                let (url, s) = (url.clone(), postgres.replace("$SHA", &quoted));
                // The helper runs a small runtime of its own: off this one's threads.
                tokio::task::spawn_blocking(move || {
                    pg::sql(&url, &format!("SET search_path = heddle; {s}"))
                })
                .await
                .unwrap();
            }
        }
    }

    /// Lines the provider side wrote.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("data/log.txt"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// A request with the bearer token.
    pub fn request(&self, method: &str, path: &str) -> axum::http::request::Builder {
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
    }

    /// `req` answered by the router.
    pub async fn send(&self, req: Request<Body>) -> Response {
        let what = format!("{} {}", req.method(), req.uri());
        bounded(&what, self.router.clone().oneshot(req))
            .await
            .unwrap()
    }

    /// The status and body (JSON, else the text as a string) of `method path` with
    /// `body`.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = self.request(method, path);
        let req = match body {
            Some(b) => req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        };
        let resp = self.send(req.unwrap()).await;
        let status = resp.status().as_u16();
        let bytes = body_bytes(resp).await;
        let text = String::from_utf8_lossy(&bytes).to_string();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn create(&self, graph: &str) -> String {
        let graph: Value = serde_json::from_str(graph).unwrap();
        let (status, body) = self
            .call("POST", "/api/runs", Some(json!({ "graph": graph })))
            .await;
        assert_eq!(status, 201, "{body:#}");
        body["run_id"].as_str().unwrap().to_string()
    }

    pub async fn show(&self, id: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/api/runs/{id}"), None).await;
        assert_eq!(status, 200, "{body:#}");
        body
    }

    pub async fn runs(&self) -> Vec<Value> {
        let (status, body) = self.call("GET", "/api/runs", None).await;
        assert_eq!(status, 200, "{body:#}");
        body.as_array().unwrap().clone()
    }

    /// The run's event stream as text, read until it ends (the run is no longer driven
    /// here and everything was sent), from after `last_event_id` when given.
    pub async fn stream(&self, id: &str, last_event_id: Option<&str>) -> String {
        let mut req = self.request("GET", &format!("/api/runs/{id}/events"));
        if let Some(l) = last_event_id {
            req = req.header("last-event-id", l);
        }
        let resp = self.send(req.body(Body::empty()).unwrap()).await;
        assert_eq!(resp.status().as_u16(), 200);
        String::from_utf8(body_bytes(resp).await.to_vec()).unwrap()
    }

    /// The run's records as SSE events (id, kind, data), as [`TestServer::stream`]
    /// reads them.
    pub async fn events(&self, id: &str, last_event_id: Option<u64>) -> Vec<(u64, String, Value)> {
        let last = last_event_id.map(|l| l.to_string());
        parse_sse(&self.stream(id, last.as_deref()).await)
    }

    /// Waits for run `id` to finish (its stream ends when it is no longer driven here;
    /// a run queued for a worker slot or between records is read again).
    pub async fn ended(&self, id: &str) -> Value {
        for _ in 0..50 {
            let _ = self.stream(id, None).await;
            let show = self.show(id).await;
            match show["state"].as_str().unwrap() {
                "completed" | "failed" | "cancelled" | "paused" => return show,
                "running" | "queued" => tokio::time::sleep(Duration::from_millis(20)).await,
                other => panic!("run {id} is {other}: {show:#}"),
            }
        }
        panic!("run {id} made no progress");
    }

    /// Waits (a generous bound, nothing asserted about the time) until run `id` has a
    /// pending escalation, and returns the list.
    pub async fn pending_escalations(&self, id: &str) -> Vec<Value> {
        for _ in 0..3000 {
            let (status, body) = self
                .call("GET", &format!("/api/runs/{id}/escalations"), None)
                .await;
            assert_eq!(status, 200, "{body:#}");
            let list = body["escalations"].as_array().unwrap().clone();
            if !list.is_empty() {
                return list;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("run {id} never escalated");
    }

    /// A person's answer to escalation `eid` of run `id`.
    pub async fn answer(&self, id: &str, eid: &str, body: Value) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/api/runs/{id}/escalations/{eid}"),
            Some(body),
        )
        .await
    }
}

/// A response's whole body.
pub async fn body_bytes(resp: Response) -> bytes::Bytes {
    bounded("reading a response's body", resp.into_body().collect())
        .await
        .unwrap()
        .to_bytes()
}

/// How long a test waits for anything at all (a generous bound; nothing is asserted
/// about the time): past it, the test fails naming what it waited for instead of
/// hanging.
pub const WAIT: Duration = Duration::from_secs(300);

/// `f`, or a panic naming `what` once it took [`WAIT`].
pub async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, f).await {
        Ok(t) => t,
        Err(_) => panic!("no answer in {WAIT:?}: {what}"),
    }
}

pub fn parse_sse(text: &str) -> Vec<(u64, String, Value)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let (mut id, mut kind, mut data) = (None, None, None);
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.parse::<u64>().unwrap());
            } else if let Some(v) = line.strip_prefix("event: ") {
                kind = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str::<Value>(v).unwrap());
            }
        }
        if let (Some(id), Some(kind), Some(data)) = (id, kind, data) {
            out.push((id, kind, data));
        }
    }
    out
}

pub fn graph(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}
