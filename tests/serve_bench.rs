//! Measurements of `heddle serve` against the issue's targets, not timed tests (nothing
//! is asserted about a time; they print figures for the README):
//!
//! `cargo test --workspace --test serve_bench -- --ignored --nocapture`
//!
//! - a run's throughput (records per second) with 1,000 SSE subscribers on it against
//!   none (target: at most 10% lower);
//! - how long `POST /api/runs` takes to answer with the run id (target: 50 ms).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::serve::*;
use support::store::*;

/// Items fanned out once the run goes on.
const ITEMS: usize = 2000;

/// Reads `/data/items.txt` (missing at first, so the run waits for a person's retry
/// while subscribers connect), splits it into lines and upper-cases each one.
const FAN: &str = r#"{"format": "heddle.graph", "version": 1,
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

async fn escalation(api: &Api, id: &str) -> String {
    loop {
        let (_, body) = api
            .call("GET", &format!("/api/runs/{id}/escalations"), None)
            .await;
        if let Some(e) = body["escalations"].as_array().and_then(|l| l.first()) {
            return e["id"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One subscriber over raw TCP (as cheap a client as can be, so the measurement is of
/// the server): sends the request, reads the stream to its end (the server closes it
/// after the run's last record) and counts the subscribers whose stream ended with
/// the `finished` record.
async fn subscribe(
    addr: String,
    token: String,
    id: String,
    connected: Arc<AtomicUsize>,
    saw_end: Arc<AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "GET /api/runs/{id}/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 << 10];
    // The last bytes seen: the end of the stream is checked there, once.
    let mut tail = Vec::with_capacity(8 << 10);
    let mut first = true;
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        if first {
            assert!(
                buf.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            );
            connected.fetch_add(1, Ordering::SeqCst);
            first = false;
        }
        if n >= 4096 {
            tail.clear();
            tail.extend_from_slice(&buf[n - 4096..n]);
        } else {
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 8192 {
                tail.drain(..tail.len() - 4096);
            }
        }
    }
    let text = String::from_utf8_lossy(&tail);
    if text.contains("event: finished") {
        saw_end.fetch_add(1, Ordering::SeqCst);
    }
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

/// The run's records per second from the person's verdict to its ending, by the
/// records' own timestamps (the server's clock).
fn throughput(api: &Api, id: &str) -> (usize, u64) {
    let events = rt().block_on(api.events(id, None));
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

fn one_run(subscribers: usize) -> (usize, u64) {
    let env = StoreDir::new();
    let server = env.serve_with(&["--supervise", "interactive"], &[]);
    let api = Arc::new(Api {
        http: reqwest::Client::builder().build().unwrap(),
        url: server.url.clone(),
        token: server.token.clone(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = rt.block_on(async {
        let (status, body) = api
            .call(
                "POST",
                "/api/runs",
                Some(json!({"graph": serde_json::from_str::<Value>(FAN).unwrap()})),
            )
            .await;
        assert_eq!(status, 201, "{body:#}");
        body["run_id"].as_str().unwrap().to_string()
    });
    let eid = rt.block_on(escalation(&api, &id));
    let connected = Arc::new(AtomicUsize::new(0));
    let saw_end = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..subscribers)
        .map(|_| {
            rt.spawn(subscribe(
                api.url.trim_start_matches("http://").to_string(),
                api.token.clone(),
                id.clone(),
                connected.clone(),
                saw_end.clone(),
            ))
        })
        .collect();
    while connected.load(Ordering::SeqCst) < subscribers {
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines: Vec<String> = (0..ITEMS).map(|i| format!("item {i}")).collect();
    std::fs::write(env.path().join("data/items.txt"), lines.join("\n")).unwrap();
    let server_pid = server.pid().to_string();
    let (server_cpu, own_cpu) = (cpu_ms(&server_pid), cpu_ms("self"));
    rt.block_on(async {
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{id}/escalations/{eid}"),
                Some(json!({"verdict": "retry"})),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        for t in tasks {
            t.await.unwrap();
        }
    });
    if subscribers > 0 {
        eprintln!(
            "  cpu until every subscriber had the end: server {} ms, subscribers' process {} ms",
            cpu_ms(&server_pid) - server_cpu,
            cpu_ms("self") - own_cpu
        );
    }
    assert_eq!(
        saw_end.load(Ordering::SeqCst),
        subscribers,
        "every subscriber saw the end"
    );
    let (show, _) = rt.block_on(api.drive_to_end(&id));
    assert_eq!(show["state"], "completed", "{show:#}");
    let r = throughput(&api, &id);
    drop(server);
    r
}

#[test]
#[ignore]
fn sse_subscribers_against_run_throughput() {
    let mut rows = Vec::new();
    for round in 0..5 {
        for subs in [0, 1000] {
            let (records, ms) = one_run(subs);
            let rate = records as f64 * 1000.0 / ms.max(1) as f64;
            eprintln!(
                "round {round}: {subs:>4} subscribers: {records} records in {ms} ms = {rate:.0} records/s"
            );
            rows.push((subs, rate));
        }
    }
    let median = |subs: usize| {
        let mut v: Vec<f64> = rows.iter().filter(|r| r.0 == subs).map(|r| r.1).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (none, many) = (median(0), median(1000));
    eprintln!(
        "median: 0 subscribers {none:.0} records/s, 1000 subscribers {many:.0} records/s ({:.2}x)",
        many / none
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
