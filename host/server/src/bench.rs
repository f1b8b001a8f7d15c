//! Runs per second through the server (`heddle bench --shape api-runs`): a server built
//! as `heddle serve` builds one (its API and its runs on runtimes of their own, the
//! store's owner lease, the router with its token, a loopback socket), a run store on
//! disk (a scratch SQLite file, or a PostgreSQL database), and `clients` HTTP clients
//! each creating small durable runs with `POST /api/runs` one after another, as fast as
//! the answers come. Each run is a 3-node WASM graph (an input, three `std.math.arith`
//! nodes adding 1, an output).
//!
//! A round creates `runs` runs and ends when the last of them has ended (the server
//! drives at most `workers` at once, as `heddle serve --workers` says; the rest wait for
//! a slot). It reports runs completed per second over the round (from the first request
//! to the last run's ending), the create latency as a client sees it (request written to
//! answer read: p50, p99, max), what the store committed per run (transactions, and of
//! them those that waited for the disk) and the server's CPU time per run (the whole
//! process less the clients' thread). Every run is checked: the round's runs must all
//! end completed (the server's `heddle_runs_ended_total`), and the last one's output is
//! read back through the API.
//!
//! The clients are as cheap as a client can be, so the figures are the server's: one
//! thread, one event loop, raw HTTP/1.1 on a keep-alive connection per client.
//!
//! A measuring hook, not the server's API: compiled only with the `bench` feature.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use heddle_kernel::bench::CpuTime;
use heddle_runtime::{Overrides, Runtime, Settings};
use heddle_store::{Commits, RunStore};
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::{Host, Server};

/// The shape's name in figures and on the command line.
pub const SHAPE: &str = "api-runs";

/// The graph every run is: `x` (an int input) → `a` → `b` → `c` (each a WASM
/// `std.math.arith` adding 1) → `out`.
pub const GRAPH: &str = r#"{
  "format": "heddle.graph", "version": 1, "name": "api-runs",
  "nodes": [
    {"id": "x", "type": "heddle.input", "properties": {"type": "int"}},
    {"id": "a", "type": "std.math.arith", "properties": {"op": "add", "b": 1}},
    {"id": "b", "type": "std.math.arith", "properties": {"op": "add", "b": 1}},
    {"id": "c", "type": "std.math.arith", "properties": {"op": "add", "b": 1}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "x", "sourceHandle": "value", "target": "a", "targetHandle": "a"},
    {"source": "a", "sourceHandle": "result", "target": "b", "targetHandle": "a"},
    {"source": "b", "sourceHandle": "result", "target": "c", "targetHandle": "a"},
    {"source": "c", "sourceHandle": "result", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// How the shape is measured.
#[derive(Clone, Debug)]
pub struct ApiOptions {
    /// Clients creating runs at once, each waiting for its answer before the next.
    pub clients: usize,
    /// Runs created per round.
    pub runs: usize,
    /// Measured rounds after one warm-up round; the median (by runs per second) is
    /// reported.
    pub rounds: usize,
    /// Runs the server executes at once (`heddle serve --workers`).
    pub workers: usize,
    /// The runs' runtime worker threads (default: one per core).
    pub threads: Option<usize>,
    /// A PostgreSQL database (`postgres://…`) to keep the runs in instead of a scratch
    /// SQLite file; the bench's runs are left there.
    pub store: Option<String>,
}

impl Default for ApiOptions {
    fn default() -> ApiOptions {
        ApiOptions {
            clients: 8,
            runs: 1000,
            rounds: 3,
            workers: 4,
            threads: None,
            store: None,
        }
    }
}

/// The figures of the median round.
#[derive(Debug, Serialize)]
pub struct ApiFigures {
    /// [`SHAPE`].
    pub shape: &'static str,
    /// `debug` or `release`: which build measured.
    pub build: &'static str,
    /// `sqlite` (a file on this machine's disk) or `postgres`.
    pub store: &'static str,
    /// Clients creating runs at once.
    pub clients: usize,
    /// The server's worker slots.
    pub workers: usize,
    /// Runs created (and completed) in the round.
    pub runs: usize,
    /// Measured rounds.
    pub rounds: usize,
    /// Nodes per run (WASM nodes: 3).
    pub nodes: usize,
    /// From the first request to the last run's ending, in microseconds.
    pub wall_us: u64,
    /// Runs completed per second of `wall_us`.
    pub runs_per_sec: f64,
    /// Create latency as a client sees it (request written to answer read), median, in
    /// microseconds.
    pub create_p50_us: u64,
    /// The same, 99th percentile.
    pub create_p99_us: u64,
    /// The same, the slowest.
    pub create_max_us: u64,
    /// Store transactions per run over the round (every write: creation, the log, its
    /// ending, the lease); `null` where the store does not count them (PostgreSQL).
    pub commits_per_run: Option<f64>,
    /// Of those, commits that waited for the disk (fsync), per run.
    pub synced_commits_per_run: Option<f64>,
    /// The server's CPU time per run (the process less the clients' thread), in
    /// microseconds.
    pub cpu_us_per_run: Option<f64>,
    /// The server's CPU time / wall time.
    pub cores_busy: Option<f64>,
    /// The process's peak resident set size so far, in KiB.
    pub peak_rss_kib: Option<u64>,
}

impl ApiFigures {
    /// As `heddle bench --shape api-runs` prints them: two lines.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let mut out = String::new();
        let ms = |us: u64| us as f64 / 1e3;
        let per_run = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.2}"));
        let _ = writeln!(
            out,
            "{:<11} {} store, {} clients, {} workers, {} runs of {} WASM nodes  wall {:.1} ms  {:.0} runs/s  create p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            self.shape,
            self.store,
            self.clients,
            self.workers,
            self.runs,
            self.nodes,
            ms(self.wall_us),
            self.runs_per_sec,
            ms(self.create_p50_us),
            ms(self.create_p99_us),
            ms(self.create_max_us),
        );
        let _ = writeln!(
            out,
            "{:<11} per run: {} commits, {} synced; cpu {} µs ({} cores busy)  peak RSS {}",
            "",
            per_run(self.commits_per_run),
            per_run(self.synced_commits_per_run),
            self.cpu_us_per_run
                .map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
            self.cores_busy
                .map_or_else(|| "n/a".into(), |v| format!("{v:.2}")),
            self.peak_rss_kib
                .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "n/a".into()),
        );
        out
    }
}

/// Why the measurement stopped.
#[derive(Debug, thiserror::Error)]
pub enum ApiBenchError {
    /// Options out of range.
    #[error("{0}")]
    Options(String),
    /// The scratch directory, a runtime or a socket failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The settings, the runtime or the store would not load.
    #[error(transparent)]
    Runtime(#[from] heddle_runtime::Error),
    /// The settings would not load.
    #[error(transparent)]
    Config(#[from] heddle_runtime::ConfigError),
    /// The server would not start or stop.
    #[error(transparent)]
    Server(#[from] crate::Error),
    /// The server answered something else than the bench expects.
    #[error("{0}")]
    Answer(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ApiBenchError {
    let what = what.into();
    move |source| ApiBenchError::Io { what, source }
}

/// Measures the shape: starts the server, runs a warm-up round and `opts.rounds`
/// measured rounds, stops the server and removes its scratch directory. Blocks: call it
/// outside any async runtime.
pub fn measure(opts: &ApiOptions) -> Result<ApiFigures, ApiBenchError> {
    if opts.clients == 0 || opts.runs == 0 || opts.rounds == 0 || opts.workers == 0 {
        return Err(ApiBenchError::Options(
            "clients, runs, rounds and workers must each be at least 1".into(),
        ));
    }
    let scratch = std::env::temp_dir().join(format!("heddle-api-bench-{}", std::process::id()));
    let r = measure_in(opts, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    r
}

fn measure_in(opts: &ApiOptions, scratch: &std::path::Path) -> Result<ApiFigures, ApiBenchError> {
    std::fs::create_dir_all(scratch).map_err(io(format!("creating {}", scratch.display())))?;
    let config = scratch.join("heddle.toml");
    // A store file of its own, on disk, as `heddle serve` keeps one.
    let db = scratch.join("runs.db");
    std::fs::write(
        &config,
        format!("[store]\npath = {:?}\n", db.to_string_lossy()),
    )
    .map_err(io(format!("writing {}", config.display())))?;
    let settings = Settings::load(&Overrides {
        config: Some(config),
        packages: Some(scratch.join("packages")),
        store: opts.store.clone(),
        ..Overrides::default()
    })?;
    // As `heddle serve`: the API's requests and the runs on runtimes of their own.
    let api = crate::api_runtime().map_err(io("starting the API's runtime"))?;
    let runs =
        heddle_runtime::tokio_runtime(opts.threads).map_err(io("starting the runs' runtime"))?;
    let server = api.block_on(async {
        let runtime = Arc::new(Runtime::load(settings, None).await?);
        let store = crate::lease::open(runtime.settings())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("listening on loopback"))?;
        Ok::<_, ApiBenchError>(
            Server::activate(
                runtime,
                store,
                listener,
                opts.workers,
                runs.handle().clone(),
            )
            .await?,
        )
    })?;
    let target = Target {
        addr: server
            .url()
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| ApiBenchError::Answer(format!("the server's address: {e}")))?,
        token: server.token().as_str().to_string(),
        host: server.host().clone(),
    };
    // The clients on a thread of their own, outside both of the server's runtimes.
    let client_opts = opts.clone();
    let measured = std::thread::Builder::new()
        .name("heddle-bench-clients".into())
        .spawn(move || rounds(&target, &client_opts))
        .map_err(io("starting the clients' thread"))?
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    let stopped = api.block_on(server.shutdown(Duration::from_secs(10)));
    runs.shutdown_timeout(Duration::from_millis(100));
    api.shutdown_timeout(Duration::from_millis(100));
    let mut rounds = measured?;
    stopped?;
    rounds.sort_by(|a, b| a.runs_per_sec.total_cmp(&b.runs_per_sec));
    let median = rounds.swap_remove(rounds.len() / 2);
    Ok(median.figures(opts))
}

/// Where the clients send their requests, and the host whose runs they wait for.
struct Target {
    addr: std::net::SocketAddr,
    token: String,
    host: Arc<Host>,
}

/// One round's figures.
struct Round {
    wall: Duration,
    runs_per_sec: f64,
    /// Create latencies, sorted.
    latencies: Vec<Duration>,
    commits: Option<Commits>,
    cpu: Option<Duration>,
}

impl Round {
    fn figures(self, opts: &ApiOptions) -> ApiFigures {
        let n = opts.runs as f64;
        let at = |q: f64| {
            let i = ((self.latencies.len() as f64 * q).ceil() as usize).saturating_sub(1);
            self.latencies[i.min(self.latencies.len() - 1)].as_micros() as u64
        };
        ApiFigures {
            shape: SHAPE,
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            store: if opts.store.is_some() {
                "postgres"
            } else {
                "sqlite"
            },
            clients: opts.clients,
            workers: opts.workers,
            runs: opts.runs,
            rounds: opts.rounds,
            nodes: 3,
            wall_us: self.wall.as_micros() as u64,
            runs_per_sec: self.runs_per_sec,
            create_p50_us: at(0.5),
            create_p99_us: at(0.99),
            create_max_us: at(1.0),
            commits_per_run: self.commits.map(|c| c.commits as f64 / n),
            synced_commits_per_run: self.commits.map(|c| c.synced as f64 / n),
            cpu_us_per_run: self.cpu.map(|c| c.as_secs_f64() * 1e6 / n),
            cores_busy: self
                .cpu
                .map(|c| c.as_secs_f64() / self.wall.as_secs_f64().max(1e-9)),
            peak_rss_kib: peak_rss_kib(),
        }
    }
}

/// The warm-up round (first compilations, connections, the store's first pages), then
/// the measured ones.
fn rounds(target: &Target, opts: &ApiOptions) -> Result<Vec<Round>, ApiBenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("starting the clients' runtime"))?;
    rt.block_on(async {
        let warm_up = (opts.runs / 10).max(opts.clients * 4);
        round(target, opts.clients, warm_up).await?;
        let mut out = Vec::with_capacity(opts.rounds);
        for _ in 0..opts.rounds {
            out.push(round(target, opts.clients, opts.runs).await?);
        }
        Ok(out)
    })
}

/// `n` runs created by `clients` clients; ends when the last has ended, checked to have
/// completed.
async fn round(target: &Target, clients: usize, n: usize) -> Result<Round, ApiBenchError> {
    let store: &Arc<dyn RunStore> = &target.host.store;
    let mut metrics = Client::connect(target).await?;
    let ended_before = ended_runs(&mut metrics).await?;
    let commits0 = store.commits();
    let cpu0 = CpuTime::now();
    let own0 = thread_cpu();
    let t0 = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let next = next.clone();
        let mut client = Client::connect(target).await?;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut last = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, ApiBenchError>((latencies, last));
                }
                let body = format!(r#"{{"graph": {GRAPH}, "inputs": {{"x": {i}}}}}"#);
                let t = Instant::now();
                let (status, answer) = client
                    .call("POST", "/api/runs", Some(body.as_bytes()))
                    .await?;
                latencies.push(t.elapsed());
                if status != 201 {
                    return Err(ApiBenchError::Answer(format!(
                        "POST /api/runs answered {status}: {}",
                        String::from_utf8_lossy(&answer)
                    )));
                }
                last = Some((i, answer));
            }
        }));
    }
    let mut latencies = Vec::with_capacity(n);
    let mut last = None;
    for t in tasks {
        let (l, a) = t
            .await
            .map_err(|e| ApiBenchError::Answer(e.to_string()))??;
        latencies.extend(l);
        last = last.max(a);
    }
    // Every run created; the round ends with the last one's ending: once none is
    // driven here (cheap to ask), by the server's count of ended runs (on a shared
    // store a run may wait in its queue, driven by nobody yet).
    let deadline = Instant::now() + Duration::from_secs(300);
    let ended = loop {
        if target.host.driving().is_empty() {
            let ended = ended_runs(&mut metrics).await?;
            if ended.all() >= ended_before.all() + n as u64 {
                break ended;
            }
        }
        if Instant::now() > deadline {
            return Err(ApiBenchError::Answer(format!(
                "runs still not ended after 300 s: {:?}",
                target.host.load()
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let wall = t0.elapsed();
    let own = thread_cpu().zip(own0).map(|(a, b)| a.saturating_sub(b));
    let cpu = CpuTime::used_since(cpu0)
        .map(|c| c.total())
        .map(|c| c.saturating_sub(own.unwrap_or_default()));
    let commits = store.commits().zip(commits0).map(|(a, b)| a.since(b));
    let completed = ended.completed - ended_before.completed;
    if completed != n as u64 || ended.other != ended_before.other {
        return Err(ApiBenchError::Answer(format!(
            "{n} runs created, {completed} completed and {} ended otherwise (heddle_runs_ended_total)",
            ended.other - ended_before.other
        )));
    }
    if let Some((i, answer)) = last {
        check_output(&mut metrics, i, &answer).await?;
    }
    latencies.sort();
    Ok(Round {
        wall,
        runs_per_sec: n as f64 / wall.as_secs_f64(),
        latencies,
        commits,
        cpu,
    })
}

/// The runs that ended in the server so far, by the server's own count.
#[derive(Clone, Copy, Default)]
struct Ended {
    completed: u64,
    other: u64,
}

impl Ended {
    fn all(self) -> u64 {
        self.completed + self.other
    }
}

async fn ended_runs(client: &mut Client) -> Result<Ended, ApiBenchError> {
    let (status, text) = client.call("GET", "/metrics", None).await?;
    if status != 200 {
        return Err(ApiBenchError::Answer(format!(
            "GET /metrics answered {status}"
        )));
    }
    let mut ended = Ended::default();
    for line in String::from_utf8_lossy(&text).lines() {
        let Some(rest) = line.strip_prefix("heddle_runs_ended_total{") else {
            continue;
        };
        let n = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        if rest.contains("outcome=\"completed\"") {
            ended.completed += n;
        } else {
            ended.other += n;
        }
    }
    Ok(ended)
}

/// The run the answer names ended completed with its input plus 3.
async fn check_output(client: &mut Client, i: usize, answer: &[u8]) -> Result<(), ApiBenchError> {
    let created: serde_json::Value = serde_json::from_slice(answer)
        .map_err(|e| ApiBenchError::Answer(format!("POST /api/runs answered: {e}")))?;
    let id = created["run_id"].as_str().unwrap_or_default();
    let (status, shown) = client.call("GET", &format!("/api/runs/{id}"), None).await?;
    let shown: serde_json::Value = serde_json::from_slice(&shown).unwrap_or_default();
    let text = shown.to_string();
    let want = format!("{}", i + 3);
    if status != 200 || shown["state"] != "completed" || !text.contains(&want) {
        return Err(ApiBenchError::Answer(format!(
            "run {id} (input {i}) is not completed with output {want}: {status} {}",
            heddle_core::text::bounded(&text)
        )));
    }
    Ok(())
}

/// A keep-alive HTTP/1.1 connection to the server, as raw as a client gets.
struct Client {
    stream: TcpStream,
    head: String,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(t: &Target) -> Result<Client, ApiBenchError> {
        let stream = TcpStream::connect(t.addr)
            .await
            .map_err(io(format!("connecting to {}", t.addr)))?;
        stream
            .set_nodelay(true)
            .map_err(io("setting TCP_NODELAY"))?;
        Ok(Client {
            stream,
            head: format!("Host: {}\r\nAuthorization: Bearer {}\r\n", t.addr, t.token),
            buf: Vec::with_capacity(8192),
        })
    }

    /// Sends a request and reads its whole answer: status and body.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), ApiBenchError> {
        let mut req = format!("{method} {path} HTTP/1.1\r\n{}", self.head).into_bytes();
        if let Some(b) = body {
            req.extend_from_slice(
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .as_bytes(),
            );
            req.extend_from_slice(b);
        } else {
            req.extend_from_slice(b"\r\n");
        }
        let broken = |e| ApiBenchError::Io {
            what: format!("{method} {path}"),
            source: e,
        };
        self.stream.write_all(&req).await.map_err(broken)?;
        // The head.
        let end = loop {
            if let Some(p) = find(&self.buf, b"\r\n\r\n") {
                break p;
            }
            self.fill().await.map_err(broken)?;
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
        self.buf.drain(..end + 4);
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| ApiBenchError::Answer(format!("not an HTTP answer: {head}")))?;
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_ascii_lowercase())
            })
        };
        let body = if let Some(len) = header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|_| ApiBenchError::Answer(format!("content-length {len}")))?;
            while self.buf.len() < len {
                self.fill().await.map_err(broken)?;
            }
            self.buf.drain(..len).collect()
        } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            loop {
                let line_end = loop {
                    if let Some(p) = find(&self.buf, b"\r\n") {
                        break p;
                    }
                    self.fill().await.map_err(broken)?;
                };
                let size_text = String::from_utf8_lossy(&self.buf[..line_end]).to_string();
                let size =
                    usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| ApiBenchError::Answer(format!("chunk size {size_text}")))?;
                self.buf.drain(..line_end + 2);
                while self.buf.len() < size + 2 {
                    self.fill().await.map_err(broken)?;
                }
                body.extend(self.buf.drain(..size));
                self.buf.drain(..2);
                if size == 0 {
                    break body;
                }
            }
        } else {
            Vec::new()
        };
        Ok((status, body))
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// CPU time of the calling thread (Linux): the clients' own, taken out of the server's.
fn thread_cpu() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getrusage only writes the struct we pass; all-zero is a valid rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
            return None;
        }
        let d = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        Some(d(ru.ru_utime) + d(ru.ru_stime))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Peak resident set size of this process (VmHWM), in KiB (Linux only).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
