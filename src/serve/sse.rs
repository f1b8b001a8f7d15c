//! A run's event stream as Server-Sent Events. Each event is one stored record, its
//! id the record's sequence number, so a client that reconnects with `Last-Event-ID`
//! continues exactly after what it saw. Between them, events without an id
//! (`escalation`) say an interactive escalation became pending or closed.
//!
//! Subscribers share a running run's feed ([`super::feed`]). A subscriber writes every
//! event it has waiting in one chunk (one write for many events when the run is faster
//! than the connection), first its backlog from the store, then the broadcast; a
//! subscriber that falls behind reads the gap from the store, in turn with the others.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use heddle_store::{SqliteStore, StoreError, Stored};
use heddle_supervisor::interactive::Notice;
use tokio::sync::{broadcast, mpsc};

use super::feed::{Frame, read};
use super::host::Host;
use super::mask::Mask;

/// Least time between two chunks to one subscriber while the run is busy: whatever the
/// run records meanwhile goes out together. A page needs no more than a few updates a
/// second; a thousand subscribers woken for every record would cost the run its cores.
const GAP: Duration = Duration::from_millis(100);

/// An idle stream sends a comment this often, so proxies and clients keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Bytes one chunk gathers before it is written.
const CHUNK: usize = 64 << 10;

/// Store reads subscribers make at once (their backlogs and gaps). Each holds the store's
/// connection while it reads; a thousand at once would queue the run's own writes and
/// the lease heartbeat behind them (the lease would expire: every write would stop).
static SUBSCRIBER_READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

fn notice_text(n: &Notice, mask: &Mask) -> Bytes {
    Bytes::from(format!(
        "event: escalation\ndata: {}\n\n",
        mask.to_string(n)
    ))
}

/// [`read`] for a subscriber, in turn with the others.
async fn read_turn(
    store: &Arc<SqliteStore>,
    run_id: &str,
    from: u64,
) -> Result<Vec<Stored>, StoreError> {
    // A static semaphore nobody closes.
    let _turn = SUBSCRIBER_READS.acquire().await.expect("never closed");
    read(store, run_id, from).await
}

/// Gathers what a subscriber sends into chunks of about [`CHUNK`] bytes.
struct Batch {
    buf: Vec<u8>,
    tx: mpsc::Sender<Bytes>,
    /// When the last chunk went out.
    sent: Option<tokio::time::Instant>,
}

impl Batch {
    /// Adds `text`; writes the chunk once it is full. `Err` when the client is gone.
    async fn push(&mut self, text: &Bytes) -> Result<(), ()> {
        self.buf.extend_from_slice(text);
        if self.buf.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.sent = Some(tokio::time::Instant::now());
        self.tx.send(chunk).await.map_err(|_| ())
    }

    async fn records(&mut self, records: &[Stored], mask: &Mask, next: &mut u64) -> Result<(), ()> {
        for r in records {
            if r.seq < *next {
                continue;
            }
            self.push(&Frame::new(r, mask).text).await?;
            *next = r.seq + 1;
        }
        Ok(())
    }
}

/// The SSE response for run `run_id` from record `from` on. The stream ends when the
/// run is not (or no longer) driven here and everything recorded was sent, or when the
/// server shuts down.
pub async fn stream(host: Arc<Host>, run_id: String, from: u64) -> Result<Response, StoreError> {
    // Subscribed before the backlog is read: a record committed after the read is
    // broadcast after this point, so nothing falls between the two.
    let live = host.feed(&run_id);
    let (waiting, notices) = host.notices(&run_id).unzip();
    let backlog = read_turn(&host.store, &run_id, from).await?;
    // Small: a connection slower than the run holds the sender here, and what the run
    // records meanwhile waits in the broadcast to go out in one chunk.
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    tokio::spawn(async move {
        let mut out = Batch {
            buf: Vec::new(),
            tx,
            sent: None,
        };
        let start = Start {
            next: from,
            backlog,
            waiting: waiting.unwrap_or_default(),
        };
        let _ = subscriber(&host, &run_id, start, live, notices, &mut out).await;
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (Ok::<_, Infallible>(c), rx))
    });
    let resp = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(chunks))
        // Two constant, valid headers: the builder cannot fail.
        .expect("a valid response");
    Ok(resp)
}

enum Woke {
    Record(Result<Arc<Frame>, broadcast::error::RecvError>),
    Text(Bytes),
}

/// What a subscriber sends before the live feed: the records from `next` on that were
/// committed when it subscribed, and the escalations then waiting.
struct Start {
    next: u64,
    backlog: Vec<Stored>,
    waiting: Vec<Notice>,
}

/// One subscriber's loop; `Err` when its client went away.
async fn subscriber(
    host: &Host,
    run_id: &str,
    start: Start,
    mut live: Option<broadcast::Receiver<Arc<Frame>>>,
    mut notices: Option<broadcast::Receiver<Notice>>,
    out: &mut Batch,
) -> Result<(), ()> {
    let mask = host.mask.clone();
    let Start {
        mut next,
        backlog,
        waiting,
    } = start;
    out.records(&backlog, &mask, &mut next).await?;
    drop(backlog);
    for n in &waiting {
        out.push(&notice_text(n, &mask)).await?;
    }
    let Some(live) = live.as_mut() else {
        return out.flush().await;
    };
    loop {
        out.flush().await?;
        if let Some(at) = out.sent.take() {
            tokio::select! {
                _ = tokio::time::sleep_until(at + GAP) => {}
                _ = host.shutdown.cancelled() => return Ok(()),
                _ = out.tx.closed() => return Err(()),
            }
        }
        let woke = tokio::select! {
            r = live.recv() => Woke::Record(r),
            Some(n) = next_notice(&mut notices) => Woke::Text(notice_text(&n, &mask)),
            _ = tokio::time::sleep(KEEP_ALIVE) => Woke::Text(Bytes::from_static(b":\n\n")),
            _ = host.shutdown.cancelled() => return Ok(()),
            _ = out.tx.closed() => return Err(()),
        };
        let got = match woke {
            Woke::Record(r) => r,
            Woke::Text(t) => {
                out.push(&t).await?;
                continue;
            }
        };
        // Everything already waiting goes out with it, in one chunk.
        let mut got = Some(got);
        while let Some(r) = got.take().or_else(|| match live.try_recv() {
            Err(broadcast::error::TryRecvError::Empty) => None,
            Ok(f) => Some(Ok(f)),
            Err(broadcast::error::TryRecvError::Lagged(n)) => {
                Some(Err(broadcast::error::RecvError::Lagged(n)))
            }
            Err(broadcast::error::TryRecvError::Closed) => {
                Some(Err(broadcast::error::RecvError::Closed))
            }
        }) {
            let catch_up = match r {
                Ok(f) if f.seq < next => continue,
                Ok(f) if f.seq == next => {
                    out.push(&f.text).await?;
                    next += 1;
                    continue;
                }
                // A gap (this subscriber lagged) or the end of the run: read the rest.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => false,
                Err(broadcast::error::RecvError::Closed) => true,
            };
            out.flush().await?;
            let records = read_turn(&host.store, run_id, next).await.map_err(|_| ())?;
            out.records(&records, &mask, &mut next).await?;
            if catch_up {
                return out.flush().await;
            }
            break;
        }
    }
}

/// The next notice of a run's desk; `None` (never ready in a `select!` branch that
/// needs `Some`) once there is no desk or it closed. A lagging subscriber skips what it
/// missed: a notice only says "fetch the list again", and the next one says it too.
async fn next_notice(rx: &mut Option<broadcast::Receiver<Notice>>) -> Option<Notice> {
    let r = rx.as_mut()?;
    loop {
        match r.recv().await {
            Ok(n) => return Some(n),
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => {
                *rx = None;
                return None;
            }
        }
    }
}
