//! The writer of one run's log: sequence numbers, group commit, synced writes.
//!
//! Appends are numbered under one lock and queued to a writer thread, which commits
//! whatever has queued up in one transaction. A record that needs to be durable before
//! the caller goes on (the start of a node that is not retry-safe) makes its batch a
//! synced commit and the caller waits for it; everything else is committed without a
//! sync and the caller never waits. Because batches commit in order, the log on disk is
//! always a prefix of what was appended: a crash loses at most an unsynced tail, never
//! a record before one that survived.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use heddle_core::Record;
use tokio::sync::oneshot;

use crate::{RunStore, StoreError};

/// Most records committed in one transaction.
const MAX_BATCH: usize = 4096;

/// How long unsynced records wait for company before they are committed. Nobody waits
/// on them (a synced append or flush commits at once, taking them along), so waiting
/// costs no caller anything and turns a record-per-transaction trickle into one
/// transaction per window. A crash may lose the window: only retry-safe results and
/// dispatch records of work that had not started yet, which recovery runs again.
const GROUP_WINDOW: Duration = Duration::from_millis(2);

type Reply = oneshot::Sender<Result<(), Arc<StoreError>>>;

enum Cmd {
    Append {
        seq: u64,
        record: Record,
        reply: Option<Reply>,
    },
    Flush(Reply),
}

/// What a run log has written so far (this process only): the figures behind "a node
/// that is not retry-safe pays at most one synced write before it starts".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogCounters {
    /// Records committed.
    pub records: u64,
    /// Transactions committed (each a group of records).
    pub commits: u64,
    /// Of those, commits that waited for stable storage (fsync): every synced append
    /// and flush, several of them shared by one commit when they queued up together.
    pub synced_commits: u64,
    /// Appends a caller waited on (synced appends and flushes).
    pub waits: u64,
}

impl LogCounters {
    /// What was written between `earlier` and `self`.
    pub fn since(self, earlier: LogCounters) -> LogCounters {
        LogCounters {
            records: self.records - earlier.records,
            commits: self.commits - earlier.commits,
            synced_commits: self.synced_commits - earlier.synced_commits,
            waits: self.waits - earlier.waits,
        }
    }
}

/// [`LogCounters`] as the writer thread updates them.
#[derive(Default)]
struct Counting {
    records: AtomicU64,
    commits: AtomicU64,
    synced_commits: AtomicU64,
    waits: AtomicU64,
}

pub struct RunLog {
    run_id: String,
    epoch: u64,
    queue: Mutex<Queue>,
    failed: Arc<Mutex<Option<Arc<StoreError>>>>,
    counting: Arc<Counting>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The writer thread, woken only for what someone waits on (see [`GROUP_WINDOW`]).
    writer_thread: std::thread::Thread,
    /// The run's known secret values, masked out of every record ([`Self::keep_out`]).
    secrets: std::sync::OnceLock<heddle_core::supervise::Redactor>,
}

struct Queue {
    next: u64,
    tx: Option<mpsc::Sender<Cmd>>,
}

/// Completes when a synced append (and everything before it) is on disk.
#[must_use = "a synced append is only durable once waited for"]
pub struct SyncWait(oneshot::Receiver<Result<(), Arc<StoreError>>>);

impl SyncWait {
    /// Waits on the current thread (not from async code).
    pub fn wait(self) -> Result<(), StoreError> {
        flatten(self.0.blocking_recv())
    }

    pub async fn done(self) -> Result<(), StoreError> {
        flatten(self.0.await)
    }
}

fn flatten(
    r: Result<Result<(), Arc<StoreError>>, oneshot::error::RecvError>,
) -> Result<(), StoreError> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StoreError::WriterStopped(e)),
        Err(_) => Err(StoreError::WriterClosed),
    }
}

impl RunLog {
    /// Starts writing run `run_id` as owner `epoch` (from [`RunStore::acquire`]), with
    /// `next_seq` the first free sequence number.
    pub fn start(store: Arc<dyn RunStore>, run_id: &str, epoch: u64, next_seq: u64) -> RunLog {
        let (tx, rx) = mpsc::channel::<Cmd>();
        let failed = Arc::new(Mutex::new(None));
        let counting = Arc::new(Counting::default());
        let writer = {
            let run_id = run_id.to_string();
            let failed = failed.clone();
            let counting = counting.clone();
            std::thread::Builder::new()
                .name(format!("heddle-log-{run_id}"))
                .spawn(move || write_loop(store, run_id, epoch, next_seq, rx, failed, &counting))
                // Failing to start a thread means the process is out of resources;
                // nothing durable can happen then.
                .expect("spawn the run log writer thread")
        };
        RunLog {
            run_id: run_id.to_string(),
            epoch,
            queue: Mutex::new(Queue {
                next: next_seq,
                tx: Some(tx),
            }),
            failed,
            counting,
            writer_thread: writer.thread().clone(),
            writer: Mutex::new(Some(writer)),
            secrets: std::sync::OnceLock::new(),
        }
    }

    /// Masks `secrets` out of every record appended from now on (see
    /// [`crate::secrets`]); only the first call counts. Every record of a run goes
    /// through here, so no path into the log can forget it.
    pub fn keep_out(&self, secrets: Vec<String>) {
        if let Some(r) = crate::secrets::redactor(&secrets) {
            let _ = self.secrets.set(r);
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The first error the writer hit; after it nothing more is written.
    pub fn error(&self) -> Option<Arc<StoreError>> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn push(&self, record: Record, reply: Option<Reply>) -> u64 {
        let record = match self.secrets.get() {
            Some(r) => crate::secrets::mask_record(r, record),
            None => record,
        };
        let waited_on = reply.is_some();
        let seq = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let seq = q.next;
            q.next += 1;
            if let Some(tx) = &q.tx {
                // A send fails only when the writer stopped after an error; the error is
                // reported to waiters and by `error()`, and the reply sender dropping
                // here tells a waiter the same.
                let _ = tx.send(Cmd::Append { seq, record, reply });
            }
            seq
        };
        if waited_on {
            self.writer_thread.unpark();
        }
        seq
    }

    /// Appends a record that may be group-committed; returns its sequence number
    /// without waiting for the disk.
    pub fn append(&self, record: Record) -> u64 {
        self.push(record, None)
    }

    /// Appends a record that must be on disk before the caller goes on; wait on the
    /// returned handle.
    pub fn append_synced(&self, record: Record) -> (u64, SyncWait) {
        let (tx, rx) = oneshot::channel();
        let seq = self.push(record, Some(tx));
        (seq, SyncWait(rx))
    }

    /// Makes everything appended so far durable.
    pub fn flush(&self) -> SyncWait {
        let (tx, rx) = oneshot::channel();
        let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match &q.tx {
            Some(s) => {
                let _ = s.send(Cmd::Flush(tx));
            }
            None => drop(tx),
        }
        drop(q);
        self.writer_thread.unpark();
        SyncWait(rx)
    }

    /// What this log has committed so far.
    pub fn counters(&self) -> LogCounters {
        let c = &self.counting;
        LogCounters {
            records: c.records.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            synced_commits: c.synced_commits.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
        }
    }

    /// The next sequence number to be assigned.
    pub fn next_seq(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).next
    }

    /// Flushes, stops the writer and reports whether everything was written.
    pub fn close(&self) -> Result<(), StoreError> {
        let tx = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tx
            .take();
        let Some(tx) = tx else { return Ok(()) };
        let (rtx, rrx) = oneshot::channel();
        let _ = tx.send(Cmd::Flush(rtx));
        drop(tx);
        self.writer_thread.unpark();
        let r = flatten(rrx.blocking_recv());
        if let Some(w) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.join();
        }
        r
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn write_loop(
    store: Arc<dyn RunStore>,
    run_id: String,
    epoch: u64,
    mut next: u64,
    rx: mpsc::Receiver<Cmd>,
    failed: Arc<Mutex<Option<Arc<StoreError>>>>,
    counting: &Counting,
) {
    let mut records = Vec::new();
    let mut replies = Vec::new();
    while let Ok(first) = rx.recv() {
        let base = next;
        // Queues one command; true when a caller waits for the batch to be on disk.
        let take = |cmd: Cmd, records: &mut Vec<Record>, replies: &mut Vec<Reply>| match cmd {
            Cmd::Append { seq, record, reply } => {
                debug_assert_eq!(seq, base + records.len() as u64, "appends arrive in order");
                records.push(record);
                reply.map(|r| replies.push(r)).is_some()
            }
            Cmd::Flush(r) => {
                replies.push(r);
                true
            }
        };
        let mut sync = take(first, &mut records, &mut replies);
        let deadline = Instant::now() + GROUP_WINDOW;
        loop {
            // Whatever is queued goes along; then the window is waited out unless a
            // caller is waiting for this batch. The writer parks rather than waits on
            // the channel, so plain appends do not wake it one by one (a thread switch
            // per record costs more than writing it); a waited-on append unparks it.
            while records.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => sync |= take(cmd, &mut records, &mut replies),
                    Err(_) => break,
                }
            }
            let now = Instant::now();
            if sync || records.len() >= MAX_BATCH || now >= deadline {
                break;
            }
            std::thread::park_timeout(deadline - now);
        }
        let result = store.append(&run_id, epoch, next, &records, sync);
        match result {
            Ok(()) => {
                next += records.len() as u64;
                counting
                    .records
                    .fetch_add(records.len() as u64, Ordering::Relaxed);
                // A flush with nothing queued commits nothing (the store skips it).
                let committed = !records.is_empty();
                counting
                    .commits
                    .fetch_add(u64::from(committed), Ordering::Relaxed);
                counting
                    .synced_commits
                    .fetch_add(u64::from(committed && sync), Ordering::Relaxed);
                counting
                    .waits
                    .fetch_add(replies.len() as u64, Ordering::Relaxed);
                records.clear();
                for r in replies.drain(..) {
                    let _ = r.send(Ok(()));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                for r in replies.drain(..) {
                    let _ = r.send(Err(e.clone()));
                }
                // Nothing after a failed batch may be written: the log would have a hole.
                while let Ok(cmd) = rx.recv() {
                    match cmd {
                        Cmd::Append { reply: Some(r), .. } | Cmd::Flush(r) => {
                            let _ = r.send(Err(e.clone()));
                        }
                        Cmd::Append { reply: None, .. } => {}
                    }
                }
                return;
            }
        }
    }
}
