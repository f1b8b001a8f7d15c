//! `heddle serve` as a user runs it, for the server's test files: the real binary on a
//! free loopback port in a [`StoreDir`], and a small HTTP client with its token.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::store::StoreDir;

impl StoreDir {
    /// Starts `heddle serve` on a free loopback port and waits until it listens.
    pub fn serve(&self, fault: Option<&str>) -> Server {
        let env: Vec<(&str, &str)> = fault.map(|f| ("HEDDLE_FAULT", f)).into_iter().collect();
        self.serve_with(&[], &env)
    }

    /// [`StoreDir::serve`] with more arguments and environment variables.
    pub fn serve_with(&self, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = self.cmd(&["serve", "--listen", "127.0.0.1:0"]);
        cmd.args(args).envs(env.iter().copied());
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("heddle serve starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    log.lock().unwrap().push_str(&format!("{line}\n"));
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        let url = rest.split_whitespace().next().unwrap().to_string();
                        let _ = tx.send(url);
                    }
                }
            })
        };
        let Ok(url) = rx.recv() else {
            let status = child.wait().unwrap();
            panic!("heddle serve ended ({status}):\n{}", log.lock().unwrap());
        };
        let token = std::fs::read_to_string(self.path().join("serve.token"))
            .unwrap()
            .trim()
            .to_string();
        Server {
            child,
            url,
            token,
            log,
            reader: Some(reader),
        }
    }

    /// The path of the server's run store.
    pub fn store(&self) -> std::path::PathBuf {
        self.db()
    }
}

pub struct Server {
    pub child: Child,
    pub url: String,
    pub token: String,
    log: Arc<Mutex<String>>,
    pub reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: &str) {
        let s = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(s.success());
    }

    /// SIGTERM, and the exit code.
    pub fn stop(mut self) -> (i32, String) {
        self.signal("-TERM");
        let status = self.child.wait().unwrap();
        // The reader ends when the pipe closes with the process: the log is complete.
        self.reader.take().unwrap().join().unwrap();
        (status.code().unwrap_or(-1), self.log())
    }

    pub fn kill9(mut self) {
        self.signal("-KILL");
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub struct Api {
    pub http: reqwest::Client,
    pub url: String,
    pub token: String,
}

impl Api {
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
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("run {id} never escalated");
    }

    /// The id of run `id`'s first pending escalation, once there is one.
    pub async fn first_escalation(&self, id: &str) -> String {
        self.pending_escalations(id).await[0]["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Answers escalation `eid` of run `id` with a retry.
    pub async fn retry(&self, id: &str, eid: &str) {
        let (status, body) = self
            .call(
                "POST",
                &format!("/api/runs/{id}/escalations/{eid}"),
                Some(json!({"verdict": "retry"})),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
    }

    pub fn of(s: &Server) -> Api {
        Api {
            // A fresh connection per request: a refused oversized body closes its
            // connection, which a pooled client would try to reuse.
            // Every read bounded: a server that stops answering fails the test (its
            // panic names the request) instead of hanging it.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .read_timeout(std::time::Duration::from_secs(300))
                .build()
                .unwrap(),
            url: s.url.clone(),
            token: s.token.clone(),
        }
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
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

    /// The run's records as SSE events (id, kind, data) from `last_event_id` on, read
    /// until the stream ends (the run finished and everything was sent).
    pub async fn events(&self, id: &str, last_event_id: Option<u64>) -> Vec<(u64, String, Value)> {
        let mut r = self
            .http
            .get(format!("{}/api/runs/{id}/events", self.url))
            .bearer_auth(&self.token);
        if let Some(l) = last_event_id {
            r = r.header("Last-Event-ID", l.to_string());
        }
        let mut resp = r.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut text = String::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        parse_sse(&text)
    }

    /// The run's records as the page's stream reader makes them: each event's data with
    /// the `seq` and `kind` of its `id:` and `event:` lines put back.
    pub async fn records(&self, id: &str) -> Vec<Value> {
        let events = self.events(id, None).await;
        let records = events.into_iter().map(|(seq, kind, mut r)| {
            r["seq"] = json!(seq);
            r["kind"] = json!(kind);
            r
        });
        records.collect()
    }

    /// Waits for run `id` to finish; a reconcile pause (uncertain work after a crash) is
    /// resumed explicitly, which offers that work again. Returns the number of such
    /// re-offers. On a database several hosts share, a run whose host died is
    /// interrupted until another adopts it (its lease expired) and queued until one has
    /// a slot: waited for too.
    pub async fn drive_to_end(&self, id: &str) -> (Value, usize) {
        let (show, offered) = self.drive_to_end_offered(id).await;
        (show, offered.len())
    }

    /// [`Api::drive_to_end`], returning the occurrences offered again (each reconcile
    /// pause's), so a test bounds an item's repeated effects by that item's own
    /// re-offers, not by how many there were in all.
    pub async fn drive_to_end_offered(&self, id: &str) -> (Value, Vec<Value>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        let mut reoffers = Vec::new();
        loop {
            // The stream ends when no host drives the run any more; one that never ends
            // fails the test at the deadline instead of hanging it.
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if tokio::time::timeout(left, self.events(id, None))
                .await
                .is_err()
            {
                let show = self.show(id).await;
                panic!("run {id}: its event stream did not end within 300 s: {show:#}");
            }
            let show = self.show(id).await;
            match show["state"].as_str().unwrap() {
                "completed" | "failed" | "cancelled" => return (show, reoffers),
                "paused" if show["pause"]["why"] == "reconcile" => {
                    reoffers.push(show["pause"]["occurrence"].clone());
                    let pause = show["pause"]["event"].clone();
                    let (status, body) = self
                        .call(
                            "POST",
                            &format!("/api/runs/{id}/resume"),
                            Some(json!({ "pause": pause })),
                        )
                        .await;
                    assert_eq!(status, 202, "{body:#}");
                }
                // Waiting for a worker, a host, or between records: look again.
                "running" | "queued" | "interrupted" => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                other => panic!("run {id} is {other}: {show:#}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "run {id} made no progress: {show:#}"
            );
        }
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

/// An HTTP/1.1 chunked body's content.
pub fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = std::str::from_utf8(&body[..line]).unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        let rest = &body[line + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// A chunked response read whole off a raw socket: its head (lower-cased) and its body.
pub fn split_response(raw: &[u8]) -> (String, Vec<u8>) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    (head, dechunk(&raw[end + 4..]))
}

/// A zstd body as a strict decoder reads it: whole frames only, each frame's checksum
/// checked, nothing after the last.
pub fn unzstd(body: &[u8]) -> String {
    let text = zstd::stream::decode_all(body).expect("whole zstd frames whose checksums match");
    String::from_utf8(text).unwrap()
}

/// A gzip body as a strict decoder reads it: exactly one member, its CRC-32 and length
/// checked, nothing after it.
pub fn gunzip(body: &[u8]) -> String {
    use std::io::Read as _;
    let mut d = flate2::bufread::GzDecoder::new(body);
    let mut text = String::new();
    d.read_to_string(&mut text)
        .expect("a whole gzip stream whose trailer matches");
    assert!(d.into_inner().is_empty(), "bytes after the gzip member");
    text
}
