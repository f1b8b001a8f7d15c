//! A node's own `retry` allowance is exact across a crash: the attempts an earlier
//! process made count, so a recovery runs only the attempts left. The node reads a named
//! pipe (`files.read_text`, retry-safe, so it may retry): every attempt opens the pipe,
//! and the test's end of it counts the opens in a file, outside heddle; reading a pipe at
//! an offset then fails (`ESPIPE`), so every attempt fails.

mod support;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::FAILED;
use support::store::{StoreDir, expect, run_id, text};

/// `read` reads `/data/pipe` with two attempts in all; `backoff_ms` between them.
fn graph(backoff_ms: u64) -> String {
    format!(
        r#"{{"format": "heddle.graph", "version": 1, "nodes": [
  {{"id": "read", "type": "files.read_text", "properties": {{"path": "/data/pipe"}},
   "retry": {{"attempts": 2, "backoff_ms": {backoff_ms}}}}},
  {{"id": "out", "type": "heddle.output"}}],
 "edges": [{{"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}}]}}"#
    )
}

/// The writing end of `data/pipe`: each open by a reader (one attempt of `read`) is a
/// line in `opens.txt`. The writer keeps its end open until the reader closes (a write
/// then fails), so one reader is one open however long it keeps the pipe.
struct Pipe {
    fifo: PathBuf,
    log: PathBuf,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Pipe {
    fn new(env: &StoreDir) -> Pipe {
        let fifo = env.path().join("data/pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo failed");
        let log = env.path().join("opens.txt");
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (fifo, log, stop) = (fifo.clone(), log.clone(), stop.clone());
            std::thread::spawn(move || {
                loop {
                    // Blocks until a reader opens the other end.
                    let end = std::fs::OpenOptions::new().write(true).open(&fifo);
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let mut end = end.unwrap();
                    let mut opens = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log)
                        .unwrap();
                    opens.write_all(b"open\n").unwrap();
                    // The reader never reads (it fails first): writes fill the pipe until
                    // the reader closes and they fail with EPIPE. Non-blocking, so a
                    // full pipe is waited on here, where the stop is seen: the test's own
                    // open in `opens` is a reader too, and a writer blocked on a full pipe
                    // that it holds open would wait for it forever (a hang seen under load,
                    // when the writer had not yet seen the last attempt's close).
                    use std::os::fd::AsRawFd as _;
                    // SAFETY: fcntl on a descriptor this thread owns, adding O_NONBLOCK.
                    unsafe {
                        let fd = end.as_raw_fd();
                        let flags = libc::fcntl(fd, libc::F_GETFL);
                        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
                    }
                    loop {
                        match end.write(&[0; 4096]) {
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                if stop.load(Ordering::SeqCst) {
                                    return;
                                }
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            Err(_) => break,
                        }
                    }
                }
            })
        };
        Pipe {
            fifo,
            log,
            stop,
            writer: Some(writer),
        }
    }

    /// How many attempts opened the pipe, once nothing reads it any more.
    fn opens(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        // Our own open releases the writer waiting for a reader; it sees the stop.
        let _release = std::fs::File::open(&self.fifo).unwrap();
        self.writer.take().unwrap().join().unwrap();
        count(&self.log)
    }
}

fn count(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The run's retry verdicts and dispatches, as `runs show` reports them.
fn retries_and_dispatches(env: &StoreDir, id: &str) -> (usize, u64) {
    let show = env.show(id);
    let read = show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == "read")
        .unwrap_or_else(|| panic!("no occurrence of read: {show:#}"));
    let retries = read["verdicts"]
        .as_array()
        .map_or(0, |v| v.iter().filter(|v| v["verdict"] == "retry").count());
    (retries, show["dispatches"].as_u64().unwrap())
}

/// Aborted right after the policy's retry verdict: the recovery runs attempt 2 only.
#[test]
fn a_crash_after_the_retry_verdict_runs_only_the_attempts_left() {
    let env = StoreDir::with_graph(&graph(0));
    let pipe = Pipe::new(&env);
    let id = env.crash("after-verdict:read", &[]);
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, FAILED);
    assert!(
        text(&o).contains("ESPIPE") || text(&o).contains("os error 29"),
        "{}",
        text(&o)
    );
    assert_eq!(pipe.opens(), 2, "attempts in all (the allowance is 2)");
    assert_eq!(retries_and_dispatches(&env, &id), (1, 2));
}

/// SIGKILLed while it waits to retry (the verdict is on disk before the wait starts):
/// the recovery runs attempt 2 only, and the dispatch budget counts the retry once.
#[test]
fn a_kill_during_the_retry_backoff_runs_only_the_attempts_left() {
    let env = StoreDir::with_graph(&graph(600_000));
    let pipe = Pipe::new(&env);
    let (mut child, lines) = env.spawn(&["run", "--durable", "--max-dispatches", "2", "g.json"]);
    let mut id = None;
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(120))
            .expect("the run prints its id and the retry");
        if let Some(rest) = line.strip_prefix("durable run ") {
            id = rest.split_whitespace().next().map(str::to_string);
        }
        if line.contains("retrying in 600000 ms") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let id = id.expect("run id printed before the retry");
    let o = env.heddle(&["runs", "resume", &id]);
    // Attempt 2 fails like the first; a third dispatch would exceed the budget instead.
    expect(&o, FAILED);
    assert!(!text(&o).contains("dispatch budget"), "{}", text(&o));
    assert_eq!(pipe.opens(), 2, "attempts in all (the allowance is 2)");
    assert_eq!(retries_and_dispatches(&env, &id), (1, 2));
}

/// Without a crash the allowance is the same: the reference the crash tests compare to.
#[test]
fn an_uninterrupted_run_makes_both_attempts() {
    let env = StoreDir::with_graph(&graph(0));
    let pipe = Pipe::new(&env);
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, FAILED);
    assert_eq!(pipe.opens(), 2);
    assert_eq!(retries_and_dispatches(&env, &run_id(&o)), (1, 2));
}
