//! A running run's feed: one follower per run reads what the log committed, masks each
//! record and renders it as SSE text once, and broadcasts that; any number of
//! subscribers ([`super::sse`]) share the one reader and the one rendering, so a watcher
//! costs the run a broadcast and a write, not a store read or a serialization.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use heddle_store::{RunStore, SqliteStore, StoreError, Stored};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::mask::Mask;

/// Records a slow subscriber may fall behind before it reads the gap from the store
/// (a few seconds of a fast run: each is a pointer to a frame the run's feed renders
/// anyway).
pub const CAPACITY: usize = 16_384;

/// How often the follower looks for newly committed records.
const POLL: Duration = Duration::from_millis(20);

/// One record as every subscriber sends it: masked and rendered once.
pub struct Frame {
    pub seq: u64,
    pub text: Bytes,
}

impl Frame {
    pub fn new(r: &Stored, mask: &Mask) -> Frame {
        // JSON text has no raw line breaks, so the record is one `data:` line.
        let text = format!(
            "id: {}\nevent: {}\ndata: {}\n\n",
            r.seq,
            r.record.kind(),
            mask.to_string(r)
        );
        Frame {
            seq: r.seq,
            text: Bytes::from(text),
        }
    }
}

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
                    // Nor is rendering for none worth it.
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

/// The records of `run_id` from `from` on, read off the async threads.
pub async fn read(
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
