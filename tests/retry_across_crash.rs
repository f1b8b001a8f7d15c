//! A node's own `retry` allowance is exact across a crash: the attempts an earlier
//! process made count, so a recovery runs only the attempts left. The node reads a named
//! pipe (`files.read_text`, retry-safe, so it may retry): every attempt opens the pipe,
//! and the kernel's inotify counts the opens, outside heddle; reading a pipe at an
//! offset then fails (`ESPIPE`), so every attempt fails.

mod support;

use std::fs::File;
use std::io::Read as _;
use std::os::fd::{AsRawFd as _, FromRawFd as _};
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

/// `data/pipe`, held open read-write by the test so that an attempt's open never waits
/// for a writer, and watched by inotify: every open and close of it is an event the
/// kernel queues before the process can exit, so counting opens after the run counts
/// the attempts exactly, however close together they came (a writer seeing readers come
/// and go could merge two).
struct Pipe {
    /// Keeps a writer on the pipe; opened before the watch, so not counted.
    _held: File,
    events: File,
}

impl Pipe {
    fn new(env: &StoreDir) -> Pipe {
        let fifo = env.path().join("data/pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo failed");
        // Read-write: a FIFO opened so never blocks, and it is a writer for every reader.
        let held = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        // SAFETY: plain syscalls; the descriptor returned is owned by `events` below.
        let events = unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(
                fd >= 0,
                "inotify_init1: {}",
                std::io::Error::last_os_error()
            );
            let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
            // Closes are watched only so that two opens are never queued back to back:
            // inotify merges an event identical to the one queued before it.
            let wd =
                libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_OPEN | libc::IN_CLOSE_NOWRITE);
            assert!(
                wd >= 0,
                "inotify_add_watch: {}",
                std::io::Error::last_os_error()
            );
            File::from_raw_fd(fd)
        };
        Pipe {
            _held: held,
            events,
        }
    }

    /// How many times the pipe was opened since the watch began.
    fn opens(mut self) -> usize {
        let mut buf = [0u8; 4096];
        let mut opens = 0;
        loop {
            match self.events.read(&mut buf) {
                Ok(n) => {
                    // struct inotify_event: wd i32, mask u32, cookie u32, len u32, name.
                    let mut at = 0;
                    while at + 16 <= n {
                        let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                        let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap());
                        assert_eq!(mask & libc::IN_Q_OVERFLOW, 0, "inotify queue overflowed");
                        if mask & libc::IN_OPEN != 0 {
                            opens += 1;
                        }
                        at += 16 + len as usize;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return opens,
                Err(e) => panic!(
                    "reading inotify events from fd {}: {e}",
                    self.events.as_raw_fd()
                ),
            }
        }
    }
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
