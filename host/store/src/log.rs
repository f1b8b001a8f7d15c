//! The writer of one run's log: sequence numbers, group commit, synced writes.
//!
//! Appends are numbered and encoded under one lock, on the appending thread, into the
//! batch a writer thread commits next in one transaction. A record that needs to be
//! durable before the caller goes on (the start of a node that is not retry-safe) makes
//! its batch a synced commit and the caller waits for it; everything else is committed
//! without a sync and the caller never waits. Because batches commit in order, the log on
//! disk is always a prefix of what was appended: a crash loses at most an unsynced tail,
//! never a record before one that survived. A batch the store cannot take for a moment
//! (a database connection that dropped) is retried with backoff before the log gives up
//! ([`RETRY_FOR`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use heddle_core::Record;
use tokio::sync::oneshot;

use crate::{Frames, RunStore, StoreError};

/// Records that make a batch due before its window ends (a batch holds more when the
/// writer was busy committing the one before).
const MAX_BATCH: usize = 4096;

/// How long unsynced records wait for company before they are committed. Nobody waits
/// on them (a synced append or flush commits at once, taking them along), so waiting
/// costs no caller anything and turns a record-per-transaction trickle into one
/// transaction per window. A crash may lose the window: only retry-safe results and
/// dispatch records of work that had not started yet, which recovery runs again.
const GROUP_WINDOW: Duration = Duration::from_millis(2);

/// How long the writer keeps retrying a batch the store could not take for a moment
/// ([`StoreError::is_transient`]: a dropped connection, a restarting server). Past it
/// the log stops with the error; a store whose lease ran out meanwhile refuses the
/// batch for good before then (the lease lasts [`crate::lease::TTL`]).
const RETRY_FOR: Duration = Duration::from_secs(30);

/// The first and the longest pause between retries.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

type Reply = oneshot::Sender<Result<(), Arc<StoreError>>>;

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
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The writer thread, woken when a window opens and for what someone waits on (see
    /// [`GROUP_WINDOW`]).
    writer_thread: std::thread::Thread,
    /// The run's known secret values, masked out of every record ([`Self::keep_out`]).
    secrets: std::sync::OnceLock<heddle_core::supervise::Redactor>,
}

/// What the appending threads and the writer share.
struct Shared {
    queue: Mutex<Queue>,
    counting: Counting,
}

struct Queue {
    /// The next sequence number to hand out.
    next: u64,
    /// Records appended and not yet taken by the writer, encoded.
    pending: Frames,
    /// When the first of `pending` was appended: its group window's start.
    since: Option<Instant>,
    /// Callers waiting until `pending` (and everything before) is on disk.
    replies: Vec<Reply>,
    /// Someone waits: the writer commits `pending` at once, synced.
    sync: bool,
    /// `close` was called: nothing more is taken, the writer ends after `pending`.
    closed: bool,
    /// The first error; after it nothing more is written.
    failed: Option<Arc<StoreError>>,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Nothing in the queue is left half-updated by a panic (pushes roll back), so a
        // poisoned lock is still usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
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
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                next: next_seq,
                pending: Frames::new(run_id, next_seq),
                since: None,
                replies: Vec::new(),
                sync: false,
                closed: false,
                failed: None,
            }),
            counting: Counting::default(),
        });
        let writer = {
            let shared = shared.clone();
            let spare = Frames::new(run_id, next_seq);
            std::thread::Builder::new()
                .name(format!("heddle-log-{run_id}"))
                .spawn(move || write_loop(store, epoch, &shared, spare))
                // Failing to start a thread means the process is out of resources;
                // nothing durable can happen then.
                .expect("spawn the run log writer thread")
        };
        RunLog {
            run_id: run_id.to_string(),
            epoch,
            shared,
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
        self.shared.queue().failed.clone()
    }

    /// Numbers `record` and encodes it into the next batch. The record is dropped here,
    /// on the appending thread, after the lock is released: its memory never crosses to
    /// the writer.
    fn push(&self, record: Record, reply: Option<Reply>) -> u64 {
        let record = match self.secrets.get() {
            Some(r) => crate::secrets::mask_record(r, record),
            None => record,
        };
        let mut q = self.shared.queue();
        let seq = q.next;
        q.next += 1;
        if let Some(e) = &q.failed {
            if let Some(r) = reply {
                let _ = r.send(Err(e.clone()));
            }
            return seq;
        }
        if q.closed {
            // The reply sender dropping tells a waiter the log is closed.
            return seq;
        }
        if let Err(e) = q.pending.push(&record) {
            // Nothing after a record that cannot be written may be: the log would have a
            // hole. What came before is still committed.
            let e = Arc::new(e);
            q.failed = Some(e.clone());
            if let Some(r) = reply {
                let _ = r.send(Err(e));
            }
            drop(q);
            self.writer_thread.unpark();
            return seq;
        }
        let opens = q.since.is_none();
        if opens {
            q.since = Some(Instant::now());
        }
        let waited_on = reply.is_some();
        if let Some(r) = reply {
            q.replies.push(r);
            q.sync = true;
        }
        let full = q.pending.len() >= MAX_BATCH;
        drop(q);
        // The writer sleeps until a window opens; after that it wakes when the window
        // ends, so plain appends inside one do not wake it one by one (a thread switch
        // per record costs more than writing it).
        if opens || waited_on || full {
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
        self.wait_for_pending(tx, false);
        SyncWait(rx)
    }

    /// Has `reply` answered once everything appended so far is on disk (at once when
    /// the log failed; dropped, which a waiter reads as closed, when it was closed).
    /// With `close`, nothing is taken after it and the writer ends.
    fn wait_for_pending(&self, reply: Reply, close: bool) {
        let mut q = self.shared.queue();
        if let Some(e) = &q.failed {
            let _ = reply.send(Err(e.clone()));
        } else if !q.closed {
            q.replies.push(reply);
            q.sync = true;
        }
        q.closed |= close;
        drop(q);
        self.writer_thread.unpark();
    }

    /// What this log has committed so far.
    pub fn counters(&self) -> LogCounters {
        let c = &self.shared.counting;
        LogCounters {
            records: c.records.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            synced_commits: c.synced_commits.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
        }
    }

    /// The next sequence number to be assigned.
    pub fn next_seq(&self) -> u64 {
        self.shared.queue().next
    }

    /// Flushes, stops the writer and reports whether everything was written.
    pub fn close(&self) -> Result<(), StoreError> {
        let Some(w) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let (tx, rx) = oneshot::channel();
        self.wait_for_pending(tx, true);
        let r = flatten(rx.blocking_recv());
        let _ = w.join();
        r
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Commits `batch`, retrying with backoff while the store fails it for a moment. The
/// batch stays the same, records appended meanwhile queue behind it, and nobody waiting
/// on it is answered before it commits or the log stops: a lost connection never drops
/// a record silently. A retry of a batch whose first attempt committed with its answer
/// lost succeeds without writing it twice (the store recognizes its own rows).
fn append_retrying(
    store: &dyn RunStore,
    epoch: u64,
    batch: &Frames,
    sync: bool,
) -> Result<(), StoreError> {
    let started = Instant::now();
    let mut pause = RETRY_FIRST;
    loop {
        match store.append_frames(epoch, batch, sync) {
            Err(e) if e.is_transient() && started.elapsed() + pause < RETRY_FOR => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(RETRY_MAX);
            }
            r => return r,
        }
    }
}

/// Told of every commit of every run log of this process: how long it took (retries
/// included) and whether it waited for stable storage. A server's metrics set it.
type CommitObserver = Box<dyn Fn(std::time::Duration, bool) + Send + Sync>;

static COMMITS: std::sync::OnceLock<CommitObserver> = std::sync::OnceLock::new();

/// Has `f` told of every commit of every run log of this process from now on (the
/// first call only): its duration and whether it was synced.
pub fn observe_commits(f: impl Fn(std::time::Duration, bool) + Send + Sync + 'static) {
    let _ = COMMITS.set(Box::new(f));
}

/// The writer thread: waits for a batch to be due, takes it (leaving `spare`, emptied, in
/// its place) and commits it, until the log is closed or fails.
fn write_loop(store: Arc<dyn RunStore>, epoch: u64, shared: &Shared, mut spare: Frames) {
    let mut replies = Vec::new();
    loop {
        let mut q = shared.queue();
        // A batch is due when someone waits, when it is full, when its window ended,
        // and at the end; until then the writer parks (see `push`).
        let wait = if q.sync || q.closed || q.failed.is_some() || q.pending.len() >= MAX_BATCH {
            None
        } else {
            match q.since {
                None => Some(None),
                Some(t) => GROUP_WINDOW.checked_sub(t.elapsed()).map(Some),
            }
        };
        if let Some(timeout) = wait {
            drop(q);
            match timeout {
                Some(t) if !t.is_zero() => std::thread::park_timeout(t),
                Some(_) => {}
                None => std::thread::park(),
            }
            continue;
        }
        let next = q.next;
        spare.clear(next);
        let mut batch = std::mem::replace(&mut q.pending, spare);
        std::mem::swap(&mut replies, &mut q.replies);
        let sync = std::mem::take(&mut q.sync);
        q.since = None;
        let ending = q.closed || q.failed.is_some();
        drop(q);
        let timed = COMMITS.get().map(|f| (f, std::time::Instant::now()));
        let result = append_retrying(&*store, epoch, &batch, sync);
        match result {
            Ok(()) => {
                if let Some((f, t0)) = timed.filter(|_| !batch.is_empty()) {
                    f(t0.elapsed(), sync);
                }
                let c = &shared.counting;
                c.records.fetch_add(batch.len() as u64, Ordering::Relaxed);
                // A flush with nothing queued commits nothing (the store skips it).
                let committed = !batch.is_empty();
                c.commits.fetch_add(u64::from(committed), Ordering::Relaxed);
                c.synced_commits
                    .fetch_add(u64::from(committed && sync), Ordering::Relaxed);
                c.waits.fetch_add(replies.len() as u64, Ordering::Relaxed);
                for r in replies.drain(..) {
                    let _ = r.send(Ok(()));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                let mut q = shared.queue();
                q.failed.get_or_insert_with(|| e.clone());
                // Nothing after a failed batch may be written: the log would have a hole.
                replies.append(&mut q.replies);
                drop(q);
                for r in replies.drain(..) {
                    let _ = r.send(Err(e.clone()));
                }
                return;
            }
        }
        if ending {
            // A record that could not be encoded stopped the log: whoever waits on
            // anything after what was just committed is told so.
            let mut q = shared.queue();
            if let Some(e) = q.failed.clone() {
                for r in q.replies.drain(..) {
                    let _ = r.send(Err(e.clone()));
                }
            }
            return;
        }
        batch.clear(0);
        spare = batch;
    }
}
