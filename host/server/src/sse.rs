//! A run's event stream as Server-Sent Events. Each event is one stored record, its
//! id the record's sequence number, so a client that reconnects with `Last-Event-ID`
//! continues exactly after what it saw. Between them, events without an id
//! (`escalation`) say an interactive escalation became pending or closed.
//!
//! A subscriber of a run driven here sends the buffers of the run's feed
//! ([`crate::feed`]): the HTTP connection asks for its next chunk when it can write
//! one, and gets everything the feed holds past what it sent, so a slow connection
//! writes more at a time and never holds up the run or the other subscribers. Only the
//! history the feed no longer holds, or the log of a run not driven here, is read from
//! the store, in turn with the other subscribers.
//!
//! A request whose `Accept-Encoding` takes zstd or gzip gets the stream compressed
//! ([`crate::coding`] picks which): each batch of the feed is compressed once for all
//! subscribers taking that coding. A zstd connection sends the shared frames and nothing
//! else (`zstd`); a gzip one adds the gzip header and, when the stream ends, the
//! trailer (`gzip`). Browsers (`fetch`, `EventSource`; Chromium takes zstd, the
//! others gzip), `curl --compressed` and HTTP clients decode it as they read; each
//! compressed piece is complete, so a client decodes every record as soon as it arrives.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use heddle_store::{StoreError, Stored};
use heddle_supervisor::interactive::Notice;
use tokio::sync::broadcast;

use crate::coding::Coding;
use crate::feed::{Batch, Subscription, Take, read};
use crate::gzip::{self, Gzip, Segment};
use crate::host::Host;
use crate::mask::Mask;
use crate::zstd;

/// An idle stream sends a comment this often, so proxies and clients keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Records rendered into one chunk when history is read from the store.
const RECORDS_PER_CHUNK: usize = 512;

/// Store reads subscribers make at once (history the feed does not hold). Each holds
/// the store's connection while it reads; a thousand at once would queue the run's own
/// writes and the lease heartbeat behind them (the lease would expire: every write
/// would stop).
static SUBSCRIBER_READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

fn notice_text(n: &Notice, mask: &Mask) -> Bytes {
    Bytes::from(format!(
        "event: escalation\ndata: {}\n\n",
        mask.to_string(n)
    ))
}

/// How a subscriber's bytes go on the wire.
enum Wire {
    Identity,
    Gzip(Gzip),
    Zstd,
}

impl Wire {
    /// The wire for `coding`, and its first bytes if it has any.
    fn start(coding: Coding) -> (Wire, Option<Bytes>) {
        match coding {
            Coding::Identity => (Wire::Identity, None),
            Coding::Zstd => (Wire::Zstd, None),
            Coding::Gzip => {
                let (g, header) = Gzip::start();
                (Wire::Gzip(g), Some(header))
            }
        }
    }

    /// Batch `b`'s text from record `from` on.
    fn batch(&mut self, b: &Batch, from: u64) -> Bytes {
        match self {
            Wire::Identity => b.from(from),
            Wire::Gzip(g) => g.carry(&b.gzip_from(from)),
            Wire::Zstd => b.zstd_from(from),
        }
    }

    /// Text of this subscriber's own (a notice).
    fn text(&mut self, text: Bytes) -> Bytes {
        match self {
            Wire::Identity => text,
            Wire::Gzip(g) => g.carry(&Segment::new(&text)),
            Wire::Zstd => zstd::frame(&text),
        }
    }

    fn keep_alive(&mut self) -> Bytes {
        match self {
            Wire::Identity => Bytes::from_static(b":\n\n"),
            Wire::Gzip(g) => g.carry(&gzip::KEEP_ALIVE),
            Wire::Zstd => zstd::KEEP_ALIVE.clone(),
        }
    }

    /// The stream's last bytes, if its encoding has any; the wire is plain after.
    fn finish(&mut self) -> Option<Bytes> {
        match std::mem::replace(self, Wire::Identity) {
            Wire::Identity | Wire::Zstd => None,
            Wire::Gzip(g) => Some(g.finish()),
        }
    }
}

/// The SSE response for run `run_id` from record `from` on, compressed when the
/// request's headers take it. The stream ends when the run is not (or no longer) driven
/// here and everything recorded was sent, or when the server shuts down.
pub async fn stream(
    host: Arc<Host>,
    run_id: String,
    from: u64,
    request: &HeaderMap,
) -> Result<Response, StoreError> {
    let coding = Coding::negotiate(request);
    let feed = host.feed(&run_id, coding);
    let (waiting, notices) = host.notices(&run_id).unzip();
    let (wire, first) = Wire::start(coding);
    let out: VecDeque<Bytes> = first.into_iter().collect();
    let mut sub = Subscriber {
        mask: host.mask.clone(),
        host,
        run_id,
        next: from,
        feed,
        notices,
        out,
        wire,
        taken: Vec::new(),
        ended: false,
    };
    for n in waiting.unwrap_or_default() {
        let text = notice_text(&n, &sub.mask);
        let bytes = sub.wire.text(text);
        sub.out.push_back(bytes);
    }
    if sub.feed.is_none() {
        // Not driven here: its log as it is (and an unknown run is a 404, not an
        // empty stream).
        sub.history().await?;
        sub.ended = true;
    }
    let chunks = futures_util::stream::unfold(sub, |mut sub| async move {
        let chunk = sub.next_chunk().await?;
        Some((Ok::<_, Infallible>(chunk), sub))
    });
    let mut resp = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header(header::VARY, "accept-encoding")
        .body(Body::from_stream(chunks))
        // Constant, valid headers: the builder cannot fail.
        .expect("a valid response");
    if let Some(value) = coding.header() {
        resp.headers_mut().insert(header::CONTENT_ENCODING, value);
    }
    Ok(resp)
}

/// One subscriber's stream: dropped (unsubscribing) when its connection ends.
struct Subscriber {
    host: Arc<Host>,
    mask: Arc<Mask>,
    run_id: String,
    /// The next record to send.
    next: u64,
    /// The run's feed, while a worker of this server drives it.
    feed: Option<Subscription>,
    notices: Option<broadcast::Receiver<Notice>>,
    /// Chunks ready to send, in order.
    out: VecDeque<Bytes>,
    wire: Wire,
    /// The feed's batches taken, to be put on the wire (kept for its allocation).
    taken: Vec<Arc<Batch>>,
    /// Nothing more comes after `out` (but the wire's last bytes).
    ended: bool,
}

impl Subscriber {
    /// The next chunk to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(c) = self.out.pop_front() {
                return Some(c);
            }
            if self.ended {
                if self.drain_notices() {
                    continue;
                }
                return self.wire.finish();
            }
            if self.follow().await.is_err() {
                // The store failed a read: end the stream (whole, at a record); the
                // client reconnects with `Last-Event-ID` and is told why if it persists.
                self.ended = true;
            }
        }
    }

    /// Puts the notices already sent on the wire before the stream ends, and says
    /// whether there were any. A notice is sent before what it causes is recorded (a
    /// decision that timed out, then the run's failure), but the feed's end can be taken
    /// before the notice is: without this a client that saw an escalation pending would
    /// never see it close.
    fn drain_notices(&mut self) -> bool {
        let Some(rx) = self.notices.as_mut() else {
            return false;
        };
        let mut any = false;
        loop {
            match rx.try_recv() {
                Ok(n) => {
                    let text = notice_text(&n, &self.mask);
                    self.out.push_back(self.wire.text(text));
                    any = true;
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => break,
            }
        }
        // Drained once: what is sent after the end belongs to no stream of this run.
        self.notices = None;
        any
    }

    /// Fills `out` from the feed, or waits for something to send.
    async fn follow(&mut self) -> Result<(), StoreError> {
        // Only a subscriber with a feed is not ended.
        let sub = self.feed.as_mut().expect("a feed");
        sub.seen();
        let take = sub.feed.take(self.next, &mut self.taken);
        match take {
            Take::Sent(next) => {
                for b in self.taken.drain(..) {
                    self.out.push_back(self.wire.batch(&b, self.next));
                }
                self.next = next;
                return Ok(());
            }
            Take::Missing => return self.history().await,
            Take::Rest => {
                self.ended = true;
                return self.history().await;
            }
            Take::End => {
                self.ended = true;
                return Ok(());
            }
            Take::Wait => {}
        }
        // Notices first: a notice goes out before the records of what it caused.
        tokio::select! {
            biased;
            Some(n) = next_notice(&mut self.notices) => {
                let text = notice_text(&n, &self.mask);
                self.out.push_back(self.wire.text(text));
            }
            _ = sub.changed() => {}
            _ = tokio::time::sleep(KEEP_ALIVE) => self.out.push_back(self.wire.keep_alive()),
            _ = self.host.shutdown.cancelled() => self.ended = true,
        }
        Ok(())
    }

    /// The records from `next` on that the log holds now, read from the store in turn
    /// with the other subscribers.
    async fn history(&mut self) -> Result<(), StoreError> {
        let records = {
            // A static semaphore nobody closes.
            let _turn = SUBSCRIBER_READS.acquire().await.expect("never closed");
            read(&self.host.store, &self.run_id, self.next).await?
        };
        self.push_records(&records);
        Ok(())
    }

    fn push_records(&mut self, records: &[Stored]) {
        let fresh = records.partition_point(|r| r.seq < self.next);
        for part in records[fresh..].chunks(RECORDS_PER_CHUNK) {
            if let Some(b) = Batch::render(part, &self.mask) {
                self.next = b.end();
                self.out.push_back(self.wire.batch(&b, 0));
            }
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
