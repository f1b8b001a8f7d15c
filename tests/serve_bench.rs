//! Measurements of `heddle serve` against the targets, not timed tests (nothing
//! is asserted about a time; they print figures for the README):
//!
//! `cargo test --release --workspace --test serve_bench -- --ignored --nocapture`
//!
//! - a run's throughput (records per second) with 1,000 SSE subscribers on it against
//!   none (target: at most 10% lower);
//! - how long `POST /api/runs` takes to answer with the run id (target: 50 ms).
//!
//! `HEDDLE_BENCH_ITEMS` sets the items the measured run fans out (default 20,000: a run
//! of seconds, not a blip the scheduler's noise decides); `HEDDLE_BENCH_ROUNDS` the
//! rounds (default 5); `HEDDLE_BENCH_CLIENT_NICE` the subscribers' thread's nice value
//! (default 0); `HEDDLE_BENCH_ENCODING` what the subscribers accept: `browser` (default:
//! what Chromium sends, `gzip, deflate, br, zstd`; the server answers zstd), `gzip` (as
//! browsers without zstd) or `identity`.
//!
//! Every subscriber reads all its bytes; [`VERIFIED`] of them keep them, and after the
//! run (outside the measured CPU) their streams are de-chunked, decoded (by strict
//! decoders: gzip's CRC and length, every zstd frame's checksum checked) and compared
//! with the stored log: every record once, in order, nothing else. The decoding's CPU is
//! printed apart. The run's values may be larger than the default `[wasm]` limit (the
//! items file is read whole): the bench's `heddle.toml` raises it.

mod support;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::serve::*;
use support::store::*;

/// What the subscribers send as `Accept-Encoding`, and the coding the server is to
/// answer with (`None`: plain text).
#[derive(Clone, Copy)]
struct Encoding {
    accept: &'static str,
    coding: Option<&'static str>,
}

impl Encoding {
    fn from_env() -> Encoding {
        let (accept, coding) = match std::env::var("HEDDLE_BENCH_ENCODING").as_deref() {
            Err(_) | Ok("browser") => ("gzip, deflate, br, zstd", Some("zstd")),
            Ok("gzip") => ("gzip", Some("gzip")),
            Ok("identity") => ("identity", None),
            Ok(other) => panic!("HEDDLE_BENCH_ENCODING: browser, gzip or identity, not {other}"),
        };
        Encoding { accept, coding }
    }
}

const SUBSCRIBERS: usize = 1000;

/// Subscribers whose streams are decoded and checked against the stored log.
const VERIFIED: usize = 10;

fn env_or(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
        .unwrap_or(default)
}

/// What the subscribers saw: how many got the whole stream (the chunked body's end, and
/// for plain text the `finished` record before it), the bytes they read and the whole
/// responses of the first [`VERIFIED`].
#[derive(Default)]
struct Seen {
    ended: usize,
    bytes: u64,
    kept: Vec<Vec<u8>>,
}

/// `n` subscribers to run `id`'s events, as cheap a client as can be so that what is
/// measured is the server: one thread (at `nice`), one event loop over non-blocking
/// sockets, one read buffer for all, raw HTTP. Each reads its stream to the end (the
/// server closes it after the run's last record). `connected` counts the streams
/// answered.
fn spawn_subscribers(
    addr: String,
    token: String,
    id: String,
    n: usize,
    nice: i32,
    encoding: Encoding,
    connected: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        // SAFETY: gettid and setpriority touch no memory.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let accept = encoding.accept;
        let request: Rc<[u8]> = format!(
            "GET /api/runs/{id}/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\naccept-encoding: {accept}\r\nconnection: close\r\n\r\n"
        )
        .into_bytes()
        .into();
        let buf = Rc::new(RefCell::new(vec![0u8; 256 << 10]));
        tokio::task::LocalSet::new().block_on(&rt, async {
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    tokio::task::spawn_local(subscribe(
                        addr.clone(),
                        request.clone(),
                        buf.clone(),
                        encoding.coding.is_some(),
                        i < VERIFIED,
                        connected.clone(),
                    ))
                })
                .collect();
            let mut seen = Seen::default();
            for t in tasks {
                let (ended, bytes, kept) = t.await.unwrap();
                seen.ended += ended as usize;
                seen.bytes += bytes;
                seen.kept.extend(kept);
            }
            seen
        })
    })
}

/// One subscriber: whether its stream ended whole, its bytes, and with `keep` the
/// whole response.
async fn subscribe(
    addr: String,
    request: Rc<[u8]>,
    buf: Rc<RefCell<Vec<u8>>>,
    compressed: bool,
    keep: bool,
    connected: Arc<AtomicUsize>,
) -> (bool, u64, Option<Vec<u8>>) {
    use tokio::io::AsyncWriteExt as _;
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request).await.unwrap();
    // The last bytes read: the end of the stream is checked there, once.
    const TAIL: usize = 4096;
    let mut tail = Vec::with_capacity(2 * TAIL);
    let mut bytes = 0u64;
    let mut kept = Vec::new();
    loop {
        s.readable().await.unwrap();
        let mut buf = buf.borrow_mut();
        let n = match s.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("reading the event stream: {e}"),
        };
        if bytes == 0 {
            assert!(
                buf.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            );
            connected.fetch_add(1, Ordering::SeqCst);
        }
        bytes += n as u64;
        if keep {
            kept.extend_from_slice(&buf[..n]);
        }
        tail.extend_from_slice(&buf[n.saturating_sub(TAIL)..n]);
        if tail.len() > 2 * TAIL {
            tail.drain(..tail.len() - TAIL);
        }
    }
    // The chunked body ended; plain text with the last record (what a compressed
    // stream's last chunk holds, the decoded streams check).
    let ended = tail.ends_with(b"\r\n0\r\n\r\n")
        && (compressed || String::from_utf8_lossy(&tail).contains("event: finished"));
    (ended, bytes, keep.then_some(kept))
}

/// A stream's text without what only a live subscriber gets (escalation notices,
/// keep-alive comments): what remains is its records' events.
fn records_only(text: &str) -> String {
    text.split_inclusive("\n\n")
        .filter(|block| !block.starts_with("event: escalation\n") && !block.starts_with(':'))
        .collect()
}

/// Each kept response decoded and compared, byte for byte, with `plain`: the stored log
/// as a client gets it in plain text once the run ended. The CPU it took.
fn verify(seen: &Seen, encoding: Encoding, plain: &str) -> u64 {
    let cpu = cpu_ms("self");
    for raw in &seen.kept {
        let (head, body) = split_response(raw);
        let coding = head
            .lines()
            .find_map(|l| l.strip_prefix("content-encoding: "));
        assert_eq!(coding, encoding.coding, "{head}");
        let text = match coding {
            None => String::from_utf8(body).unwrap(),
            Some("gzip") => gunzip(&body),
            Some("zstd") => unzstd(&body),
            Some(other) => panic!("no decoder for {other}"),
        };
        // A whole comparison, cheap beside parsing every record again: the same
        // records, in order, each once, nothing else.
        assert!(
            records_only(&text) == plain,
            "a subscriber's stream is not the stored log"
        );
    }
    cpu_ms("self") - cpu
}

/// CPU time (user + system) process `pid` used so far, in ms.
fn cpu_ms(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name in parentheses: fields 14 and 15 (utime, stime) in ticks.
    let rest = stat.rsplit(')').next().unwrap();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    ticks * 1000 / hz
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The run's records per second from the person's verdict to its ending, by the
/// records' own timestamps (the server's clock).
fn throughput(events: &[(u64, String, Value)]) -> (usize, u64) {
    let start = events
        .iter()
        .find(|(_, k, _)| k == "verdict")
        .expect("the retry verdict")
        .2["at_ms"]
        .as_u64()
        .unwrap();
    let end = events.last().unwrap().2["at_ms"].as_u64().unwrap();
    let n = events
        .iter()
        .filter(|(_, _, d)| d["at_ms"].as_u64().unwrap() >= start)
        .count();
    (n, end - start)
}

struct Round {
    records: usize,
    ms: u64,
    /// The server's CPU from the verdict until the run ended and every subscriber had
    /// all of it.
    server_cpu_ms: u64,
    /// The subscribers' (this process's) CPU over the same time.
    client_cpu_ms: u64,
    /// Decoding and checking the kept streams afterwards.
    verify_cpu_ms: u64,
    seen: Seen,
    /// The plain text of the log, as sent to one subscriber without compression.
    text_bytes: u64,
}

/// One run of `items` items with `subscribers` live on it from before it goes on.
fn one_run(items: usize, subscribers: usize, nice: i32, encoding: Encoding) -> Round {
    let env = StoreDir::new();
    let config = env.path().join("heddle.toml");
    let mut toml = std::fs::read_to_string(&config).unwrap();
    toml.push_str("\n[wasm]\nmax_value_bytes = 268435456\n");
    std::fs::write(&config, toml).unwrap();
    let server = env.serve_with(&["--supervise", "interactive"], &[]);
    let api = Api::of(&server);
    // One runtime for every request: a client's connections live on it.
    let rt = rt();
    let id = rt.block_on(async {
        let (status, body) = api
            .call(
                "POST",
                "/api/runs",
                Some(json!({"graph": serde_json::from_str::<Value>(WAITING_FAN).unwrap()})),
            )
            .await;
        assert_eq!(status, 201, "{body:#}");
        body["run_id"].as_str().unwrap().to_string()
    });
    // The run waits for a person's retry: the subscribers join a live run.
    let eid = rt.block_on(api.first_escalation(&id));
    let connected = Arc::new(AtomicUsize::new(0));
    let client = spawn_subscribers(
        api.url.trim_start_matches("http://").to_string(),
        api.token.clone(),
        id.clone(),
        subscribers,
        nice,
        encoding,
        connected.clone(),
    );
    while connected.load(Ordering::SeqCst) < subscribers {
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines: Vec<String> = (0..items).map(|i| format!("item {i}")).collect();
    std::fs::write(env.path().join("data/items.txt"), lines.join("\n")).unwrap();
    let server_pid = server.pid().to_string();
    let (server_cpu, client_cpu) = (cpu_ms(&server_pid), cpu_ms("self"));
    rt.block_on(api.retry(&id, &eid));
    let seen = client.join().unwrap();
    let (show, _) = rt.block_on(api.drive_to_end(&id));
    let server_cpu_ms = cpu_ms(&server_pid) - server_cpu;
    let client_cpu_ms = cpu_ms("self") - client_cpu;
    assert_eq!(show["state"], "completed", "{show:#}");
    assert_eq!(seen.ended, subscribers, "every subscriber saw the end");
    // The stored log as a client reads the finished run (plain text).
    let plain = rt.block_on(async {
        let resp = api
            .http
            .get(format!("{}/api/runs/{id}/events", api.url))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        resp.text().await.unwrap()
    });
    let log = parse_sse(&plain);
    let text_bytes = plain.len() as u64;
    let verify_cpu_ms = verify(&seen, encoding, &plain);
    let (records, ms) = throughput(&log);
    drop(server);
    Round {
        records,
        ms,
        server_cpu_ms,
        client_cpu_ms,
        verify_cpu_ms,
        seen,
        text_bytes,
    }
}

#[test]
#[ignore]
fn sse_subscribers_against_run_throughput() {
    let items = env_or("HEDDLE_BENCH_ITEMS", 20_000) as usize;
    let rounds = env_or("HEDDLE_BENCH_ROUNDS", 5);
    let nice = env_or("HEDDLE_BENCH_CLIENT_NICE", 0) as i32;
    let encoding = Encoding::from_env();
    eprintln!(
        "{items} items, {SUBSCRIBERS} subscribers (accept-encoding: {}; the server answers {}) on one thread at nice {nice}, {VERIFIED} decoded and checked; load average {}",
        encoding.accept,
        encoding.coding.unwrap_or("plain text"),
        load_average()
    );
    let mut rows = Vec::new();
    for round in 0..rounds {
        for subs in [0, SUBSCRIBERS] {
            let r = one_run(items, subs, nice, encoding);
            let rate = r.records as f64 * 1000.0 / r.ms.max(1) as f64;
            let per = r.seen.bytes / subs.max(1) as u64;
            let ratio = r.text_bytes as f64 / per.max(1) as f64;
            eprintln!(
                "round {round}: {subs:>4} subscribers: {} records in {} ms = {rate:.0} records/s; cpu: server {} ms, client {} ms (+{} ms decoding {} streams after); {} MB to the subscribers, {:.2} MB each ({:.2} MB of text, {:.1}x); load {}",
                r.records,
                r.ms,
                r.server_cpu_ms,
                r.client_cpu_ms,
                r.verify_cpu_ms,
                r.seen.kept.len(),
                r.seen.bytes >> 20,
                per as f64 / (1 << 20) as f64,
                r.text_bytes as f64 / (1 << 20) as f64,
                if subs > 0 { ratio } else { 0.0 },
                load_average()
            );
            rows.push((subs, rate, r.server_cpu_ms + r.client_cpu_ms));
        }
    }
    let median = |subs: usize| {
        let mut v: Vec<f64> = rows.iter().filter(|r| r.0 == subs).map(|r| r.1).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (none, many) = (median(0), median(SUBSCRIBERS));
    // Each round's pair ran back to back: their ratio holds when the machine's speed
    // drifts between rounds.
    let mut ratios: Vec<f64> = rows.chunks(2).map(|p| p[1].1 / p[0].1).collect();
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    // On a machine other work loads, the CPU the same run costs is steadier than its
    // wall time: what the subscribers add, server and client together, per pair.
    let mut extra: Vec<f64> = rows
        .chunks(2)
        .map(|p| p[1].2 as f64 / p[0].2 as f64)
        .collect();
    extra.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "cpu (server + client) with {SUBSCRIBERS} subscribers against none, per pair: {extra:.2?}, median {:.2}x",
        extra[extra.len() / 2]
    );
    eprintln!(
        "median: 0 subscribers {none:.0} records/s, {SUBSCRIBERS} subscribers {many:.0} records/s ({:.2}x); rounds' ratios {ratios:.2?}, median {:.2}x",
        many / none,
        ratios[ratios.len() / 2]
    );
}

#[test]
#[ignore]
fn created_run_id_latency() {
    let env = StoreDir::new();
    let server = env.serve(None);
    let api = Api::of(&server);
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(support::root().join("examples/quickstart.json")).unwrap(),
    )
    .unwrap();
    let mut ms = Vec::new();
    rt().block_on(async {
        for _ in 0..30 {
            let body = json!({"graph": doc, "inputs": {"text": "a  b c"}});
            let t = Instant::now();
            let (status, created) = api.call("POST", "/api/runs", Some(body)).await;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(status, 201, "{created:#}");
        }
    });
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "POST /api/runs -> run id, ms over 30: median {:.1}, p90 {:.1}, max {:.1}",
        ms[15], ms[27], ms[29]
    );
}
