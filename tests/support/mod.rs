//! Running the built `heddle` binary the way a user does, for the CLI test files.

#![allow(dead_code)] // each test file uses its own subset

pub mod http;
pub mod serve;
pub mod store;

/// The PostgreSQL server of the tests (a database per test), as the store's tests find
/// it: `HEDDLE_TEST_PG_URL` (scripts/test starts one), else one started for this binary
/// by scripts/pg-up. Its `both!` macro makes a test of each [`Backend`] from one body.
#[path = "../../host/store/tests/support/mod.rs"]
pub mod pg;
#[allow(unused_imports)] // each test file takes what it uses
pub use pg::{Backend, skip_pg};

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const OK: i32 = 0;
pub const FAILED: i32 = 1;
pub const INVALID: i32 = 2;
pub const CANCELLED: i32 = 3;
pub const SUSPENDED: i32 = 4;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The binary with the environment a test must not inherit cleared.
pub fn command(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_heddle"));
    c.current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    for k in [
        "HEDDLE_SUPERVISOR_ENDPOINT",
        "OPENAI_BASE_URL",
        "HEDDLE_SUPERVISOR_MODEL",
        "HEDDLE_SUPERVISOR_PRICE",
        "HEDDLE_SUPERVISOR_API_KEY",
        "OPENAI_API_KEY",
        // A store the test did not choose (every test names its own).
        "HEDDLE_STORE_URL",
        // Traces the test did not ask for (tests/telemetry.rs sets its own).
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "TRACEPARENT",
    ] {
        c.env_remove(k);
    }
    c
}

/// Runs in the repository root (where `examples/` is).
pub fn heddle(args: &[&str]) -> Output {
    heddle_in(&root(), args)
}

pub fn heddle_in(dir: &Path, args: &[&str]) -> Output {
    command(dir)
        .args(args)
        .output()
        .expect("the heddle binary starts")
}

/// Runs with `input` on standard input.
pub fn heddle_stdin(dir: &Path, args: &[&str], input: &[u8]) -> Output {
    let mut child = command(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the heddle binary starts");
    let mut stdin = child.stdin.take().expect("piped");
    // The run may stop reading early (that is what some tests check).
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().expect("the heddle binary ends")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed by a signal")
}

/// Asserts the exit code, showing both streams when it is wrong.
#[track_caller]
pub fn expect_code(o: &Output, want: i32) {
    assert_eq!(
        code(o),
        want,
        "exit code\n--- stdout\n{}\n--- stderr\n{}",
        stdout(o),
        stderr(o)
    );
}

#[track_caller]
pub fn no_panic(o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("panicked"), "panic:\n{e}");
    assert!(!e.contains("backtrace"), "unexpected backtrace:\n{e}");
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\n--- stderr\n{}",
            stdout(o),
            stderr(o)
        )
    })
}

/// Items parsed as JSON one by one; the second (`x`) fails with signature `json:parse`.
pub const PARSE_EACH: &str = r#"{"nodes": [
  {"id": "items", "type": "heddle.input", "properties": {"type": "list[str]", "value": ["1", "x", "3"]}},
  {"id": "each", "type": "heddle.foreach"},
  {"id": "parse", "type": "std.json.parse"},
  {"id": "gather", "type": "heddle.collect"},
  {"id": "numbers", "type": "heddle.output"}],
 "edges": [
  {"source": "items", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
  {"source": "each", "sourceHandle": "item", "target": "parse", "targetHandle": "text"},
  {"source": "parse", "sourceHandle": "value", "target": "gather", "targetHandle": "item"},
  {"source": "gather", "sourceHandle": "list", "target": "numbers", "targetHandle": "value"}]}"#;

/// One request a [`chat_server`] received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub head: String,
    pub body: String,
}

/// A chat completion whose message calls `tool` with `args` (a JSON text).
pub fn tool_call(tool: &str, args: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": format!("call_{tool}"), "type": "function", "function": {
                "name": tool, "arguments": args}}]}}],
        "usage": {"prompt_tokens": 500, "completion_tokens": 20, "total_tokens": 520}
    })
    .to_string()
}

/// An OpenAI-compatible chat-completions server on 127.0.0.1 answering the n-th request
/// with `replies[n]` (one connection per request). Returns its base URL and the requests.
pub fn chat_server(replies: Vec<String>) -> (String, std::sync::mpsc::Receiver<Seen>) {
    use std::io::{BufRead, BufReader, Read};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for reply in replies {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut len = 0usize;
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let _ = tx.send(Seen {
                head,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (url, rx)
}

/// `heddle run ... --supervise` against `url` with a priced test model and `key`.
pub fn supervised(dir: &Path, url: &str, key: &str, args: &[&str]) -> Output {
    command(dir)
        .args(args)
        .args(["--supervise"])
        .env("HEDDLE_SUPERVISOR_ENDPOINT", url)
        .env("HEDDLE_SUPERVISOR_MODEL", "test-model")
        .env("HEDDLE_SUPERVISOR_PRICE", "1.0,2.0")
        .env("HEDDLE_SUPERVISOR_API_KEY", key)
        .output()
        .expect("the heddle binary starts")
}

/// The `docker` command line with `args`: its stdout when it succeeded.
pub fn docker(args: &[&str]) -> Option<String> {
    let o = Command::new("docker").args(args).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Whether the Docker tests can run here: an engine with `image` built. Without them a
/// test skips loudly, or fails with `HEDDLE_REQUIRE_DOCKER` set (as CI sets it).
pub fn docker_image_ready(image: &str) -> bool {
    if docker(&["image", "inspect", image]).is_some() {
        return true;
    }
    assert!(
        std::env::var_os("HEDDLE_REQUIRE_DOCKER").is_none(),
        "no Docker engine or no {image} image (scripts/docker-up, scripts/build-images)"
    );
    eprintln!("SKIPPED: no Docker engine or image (HEDDLE_REQUIRE_DOCKER=1 fails instead)");
    false
}

/// The metrics `GET /metrics` answered with, as (name with labels) -> value.
pub fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Sums the samples of metric `name` whose labels include every one of `labels`.
pub fn sum(s: &std::collections::BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    s.iter()
        .filter(|(k, _)| {
            let (n, l) = k.split_once('{').unwrap_or((k.as_str(), ""));
            n == name && labels.iter().all(|want| l.contains(want))
        })
        .map(|(_, v)| v)
        .sum()
}
