//! A run's event stream as Server-Sent Events. Each event is one stored record, its
//! id the record's sequence number, so a client that reconnects with `Last-Event-ID`
//! continues exactly after what it saw. Between them, events without an id
//! (`escalation`) say an interactive escalation became pending or closed.
//!
//! One follower per running run reads what the log committed, masks and serializes
//! each record once and broadcasts that; any number of subscribers share the one
//! reader and the one serialization, so watchers cost the run a broadcast, not a store
//! read or a serialization each. A subscriber first reads its backlog from the store,
//! then takes the broadcast; a subscriber that falls behind reads the gap from the store.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use heddle_store::{RunStore, SqliteStore, StoreError, Stored};
use heddle_supervisor::interactive::Notice;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::host::Host;
use super::mask::Mask;

/// One record as every subscriber sends it: masked and serialized once.
pub struct Frame {
    pub seq: u64,
    kind: &'static str,
    data: String,
}

impl Frame {
    pub fn new(r: &Stored, mask: &Mask) -> Frame {
        Frame {
            seq: r.seq,
            kind: r.record.kind(),
            data: mask.to_string(r),
        }
    }

    fn event(&self) -> Event {
        Event::default()
            .id(self.seq.to_string())
            .event(self.kind)
            .data(&self.data)
    }
}

fn notice_event(n: &Notice, mask: &Mask) -> Event {
    Event::default().event("escalation").data(mask.to_string(n))
}

/// Records a slow subscriber may fall behind before it reads the gap from the store.
pub const CAPACITY: usize = 1024;

/// How often the follower looks for newly committed records.
const POLL: Duration = Duration::from_millis(20);

/// Reads run `run_id`'s log from `next` on as it is committed and broadcasts each
/// record, until `done` (the worker ended) and a last read found nothing more.
pub async fn follow(
    store: Arc<SqliteStore>,
    mask: Arc<Mask>,
    run_id: String,
    mut next: u64,
    feed: broadcast::Sender<Arc<Frame>>,
    done: CancellationToken,
) {
    loop {
        let finished = done.is_cancelled();
        match read(&store, &run_id, next).await {
            Ok(records) => {
                for r in records {
                    next = r.seq + 1;
                    // No subscriber is not an error: the record is on disk for later ones.
                    // Nor is serializing for none worth it.
                    if feed.receiver_count() > 0 {
                        let _ = feed.send(Arc::new(Frame::new(&r, &mask)));
                    }
                }
            }
            Err(e) => {
                eprintln!("warning: run {run_id}: the event feed stopped: {e}");
                return;
            }
        }
        if finished {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = done.cancelled() => {}
        }
    }
}

async fn read(
    store: &Arc<SqliteStore>,
    run_id: &str,
    from: u64,
) -> Result<Vec<Stored>, StoreError> {
    let store = store.clone();
    let run_id = run_id.to_string();
    tokio::task::spawn_blocking(move || store.read(&run_id, from).map(|r| r.records))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The SSE response for run `run_id` from record `from` on. The stream ends when the
/// run is not (or no longer) driven here and everything recorded was sent, or when the
/// server shuts down.
pub async fn stream(
    host: Arc<Host>,
    run_id: String,
    from: u64,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, StoreError> {
    // Subscribed before the backlog is read: a record committed after the read is
    // broadcast after this point, so nothing falls between the two.
    let mut live = host.feed(&run_id);
    let mut notices = host.notices(&run_id);
    let backlog = read(&host.store, &run_id, from).await?;
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut next = from;
        let mask = host.mask.clone();
        let send = |r: &Stored| tx.send(Frame::new(r, &mask).event());
        for r in &backlog {
            if send(r).await.is_err() {
                return;
            }
            next = r.seq + 1;
        }
        drop(backlog);
        let Some(live) = live.as_mut() else { return };
        loop {
            let got = tokio::select! {
                r = live.recv() => r,
                Some(n) = next_notice(&mut notices) => {
                    if tx.send(notice_event(&n, &mask)).await.is_err() {
                        return;
                    }
                    continue;
                }
                _ = host.shutdown.cancelled() => return,
                _ = tx.closed() => return,
            };
            let catch_up = match got {
                Ok(r) if r.seq < next => continue,
                Ok(r) if r.seq == next => {
                    if tx.send(r.event()).await.is_err() {
                        return;
                    }
                    next += 1;
                    continue;
                }
                // A gap (this subscriber lagged) or the end of the run: read the rest.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => false,
                Err(broadcast::error::RecvError::Closed) => true,
            };
            let Ok(records) = read(&host.store, &run_id, next).await else {
                return;
            };
            for r in &records {
                if send(r).await.is_err() {
                    return;
                }
                next = r.seq + 1;
            }
            if catch_up {
                return;
            }
        }
    });
    let events =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
        );
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
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
