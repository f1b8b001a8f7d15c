//! A running run's feed: what its subscribers ([`super::sse`]) share. One follower per
//! run reads what the log committed, masks and renders it as SSE text once per batch of
//! records, and keeps the batches in memory; every subscriber sends clones of those
//! buffers (no copy, no re-encoding, no store read of its own), from wherever it is in
//! the run's history. A watcher then costs the run nothing it does itself: the follower
//! reads the store a few times a second whatever the number of subscribers, and only
//! while there is at least one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use heddle_store::{RunStore, StoreError, Stored};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::coding::Coding;
use crate::gzip::Segment;
use crate::mask::Mask;

/// How much rendered history a run's feed keeps (its oldest batches go first): a
/// subscriber further behind than this, or joining later, reads what it misses from
/// the store. Far more than the whole log of most runs.
pub const KEEP_BYTES: usize = 32 << 20;

/// How soon the follower looks again after a read that found nothing: the latency of
/// the first record after a quiet spell.
const POLL: Duration = Duration::from_millis(20);

/// How long the follower lets records gather after a read that found some: a busy run
/// then reaches its subscribers as a few large writes a second, not one per record (a
/// page needs no more; a thousand subscribers woken for every record would cost the
/// run its cores).
const GATHER: Duration = Duration::from_millis(100);

/// Consecutive records rendered as SSE text, once for all subscribers.
pub struct Batch {
    first: u64,
    /// Where each record's text starts: record `first + i` at `starts[i]`.
    starts: Vec<usize>,
    text: Bytes,
    /// The whole text compressed, made once for every subscriber taking that coding.
    gzip: OnceLock<Segment>,
    zstd: OnceLock<Bytes>,
}

impl Batch {
    /// `records` (consecutive, in order) as one buffer; `None` for none.
    pub fn render(records: &[Stored], mask: &Mask) -> Option<Batch> {
        let first = records.first()?.seq;
        let mut text = Vec::new();
        let mut starts = Vec::with_capacity(records.len());
        for r in records {
            starts.push(text.len());
            // JSON text has no raw line breaks, so the record is one `data:` line.
            use std::io::Write as _;
            // Writing to a Vec cannot fail.
            write!(
                text,
                "id: {}\nevent: {}\ndata: {}\n\n",
                r.seq,
                r.record.kind(),
                data(r, mask)
            )
            .expect("writing to memory");
        }
        Some(Batch {
            first,
            starts,
            text: Bytes::from(text),
            gzip: OnceLock::new(),
            zstd: OnceLock::new(),
        })
    }

    /// The sequence number after its last record.
    pub fn end(&self) -> u64 {
        self.first + self.starts.len() as u64
    }

    /// Where record `seq`'s text starts (0 for a `seq` before the batch, the end for
    /// one after it).
    fn offset(&self, seq: u64) -> usize {
        match seq.checked_sub(self.first) {
            None => 0,
            Some(i) => self
                .starts
                .get(i as usize)
                .copied()
                .unwrap_or(self.text.len()),
        }
    }

    /// Its text from record `seq` on (all of it for a `seq` before it), sharing the
    /// buffer.
    pub fn from(&self, seq: u64) -> Bytes {
        self.text.slice(self.offset(seq)..)
    }

    /// Its text from record `seq` on, compressed: the whole batch's segment is made
    /// once and shared; a start inside the batch (a `Last-Event-ID` mid-history) is
    /// compressed for that one subscriber, so its stream begins at a record boundary.
    pub fn gzip_from(&self, seq: u64) -> Segment {
        match self.offset(seq) {
            0 => self.gzip().clone(),
            at => Segment::new(&self.text[at..]),
        }
    }

    fn gzip(&self) -> &Segment {
        self.gzip.get_or_init(|| Segment::new(&self.text))
    }

    /// Its text from record `seq` on as zstd: like [`Batch::gzip_from`], the whole
    /// batch's frame is made once and shared, a start inside the batch compressed apart.
    pub fn zstd_from(&self, seq: u64) -> Bytes {
        match self.offset(seq) {
            0 => self.zstd().clone(),
            at => crate::zstd::frame(&self.text[at..]),
        }
    }

    fn zstd(&self) -> &Bytes {
        self.zstd.get_or_init(|| crate::zstd::frame(&self.text))
    }

    /// Compresses it now in `coding`, if that is one, so that its subscribers share the
    /// work instead of the first of them doing it while the others wait.
    fn encode(&self, coding: Coding) {
        match coding {
            Coding::Identity => {}
            Coding::Gzip => {
                self.gzip();
            }
            Coding::Zstd => {
                self.zstd();
            }
        }
    }
}

/// A record's `data:` text: the record, masked, without the `seq` and `kind` its
/// event's `id:` and `event:` lines already carry (a sixth of a typical record's text,
/// and of its compressed bytes; clients put them back from those lines).
fn data(r: &Stored, mask: &Mask) -> String {
    // A record serializes with its kind first: `{"kind":"K"` then `,…}` or `}`.
    let record = mask.to_string(&r.record);
    let tag = format!("{{\"kind\":\"{}\"", r.record.kind());
    if let Some(rest) = record.strip_prefix(&tag) {
        return format!("{{\"at_ms\":{}{rest}", r.at_ms);
    }
    // Only when masking changed the tag (a secret spelled like a kind).
    let mut v = mask.to_value(r);
    if let Some(o) = v.as_object_mut() {
        o.shift_remove("seq");
        o.shift_remove("kind");
    }
    v.to_string()
}

/// What a subscriber at record `from` is to do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Take {
    /// Send what was appended to the output; continue at the record given.
    Sent(u64),
    /// Wait for the feed to grow.
    Wait,
    /// The records from `from` on are not held (dropped to bound memory): read them
    /// from the store, then continue here.
    Missing,
    /// The feed stopped short of the log's end (the run ended with no subscriber left
    /// to follow it, or a read failed): the rest is in the store, and nothing follows.
    Rest,
    /// Everything was sent; the run is no longer driven here.
    End,
}

/// The rendered history of one run this server drives.
pub struct Feed {
    history: Mutex<History>,
    /// Told whenever the history grows or ends.
    tip: watch::Sender<()>,
    subscribers: AtomicUsize,
    /// Those of them by coding (`coding as usize`): while a compressed coding has one,
    /// the follower compresses each batch in it as it renders it (once, for all).
    by_coding: [AtomicUsize; 3],
    /// Wakes an idle follower when a first subscriber arrives.
    joined: Notify,
}

struct History {
    batches: VecDeque<Arc<Batch>>,
    /// The first record held.
    base: u64,
    /// The record after the last one held: where the follower reads next.
    next: u64,
    bytes: usize,
    /// `Some(complete)` once the follower stopped; complete when it read to the log's
    /// end after the run's worker ended.
    ended: Option<bool>,
}

impl Default for Feed {
    fn default() -> Self {
        Feed {
            history: Mutex::new(History {
                batches: VecDeque::new(),
                base: 0,
                next: 0,
                bytes: 0,
                ended: None,
            }),
            tip: watch::Sender::new(()),
            subscribers: AtomicUsize::new(0),
            by_coding: Default::default(),
            joined: Notify::new(),
        }
    }
}

impl Feed {
    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        // Nothing panics while holding it; a poisoned lock still holds whole batches.
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many subscribers it has now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// A new subscriber taking `coding`, counted until it is dropped.
    pub fn subscribe(self: &Arc<Self>, coding: Coding) -> Subscription {
        self.by_coding[coding as usize].fetch_add(1, Ordering::SeqCst);
        if self.subscribers.fetch_add(1, Ordering::SeqCst) == 0 {
            self.joined.notify_one();
        }
        Subscription {
            tip: self.tip.subscribe(),
            feed: self.clone(),
            coding,
        }
    }

    /// Appends the batches holding records `from..` to `out` (the first may start
    /// before `from`: [`Batch::from`], [`Batch::gzip_from`] and [`Batch::zstd_from`] cut
    /// it).
    pub fn take(&self, from: u64, out: &mut Vec<Arc<Batch>>) -> Take {
        let h = self.history();
        if from < h.base {
            return Take::Missing;
        }
        if from >= h.next {
            return match h.ended {
                None => Take::Wait,
                Some(true) => Take::End,
                Some(false) => Take::Rest,
            };
        }
        let at = h.batches.partition_point(|b| b.end() <= from);
        out.extend(h.batches.range(at..).cloned());
        Take::Sent(h.next)
    }

    fn push(&self, batch: Batch) {
        let mut h = self.history();
        if h.batches.is_empty() {
            h.base = batch.first;
        }
        h.next = batch.end();
        h.bytes += batch.text.len();
        h.batches.push_back(Arc::new(batch));
        while h.bytes > KEEP_BYTES && h.batches.len() > 1 {
            // Just checked: more than one.
            let old = h.batches.pop_front().expect("a batch");
            h.bytes -= old.text.len();
            h.base = old.end();
        }
        drop(h);
        self.tip.send_replace(());
    }

    /// Drops the history: nobody subscribes, and a run nobody watches holds no memory
    /// for it. The next subscriber's arrival reads it again, once for all who join.
    fn forget(&self) {
        let mut h = self.history();
        h.batches.clear();
        (h.base, h.next, h.bytes) = (0, 0, 0);
    }

    fn end(&self, complete: bool) {
        self.history().ended = Some(complete);
        self.tip.send_replace(());
    }
}

/// A subscriber's hold on a feed: counted while it lives, told when the feed changes.
pub struct Subscription {
    /// The feed subscribed to.
    pub feed: Arc<Feed>,
    tip: watch::Receiver<()>,
    coding: Coding,
}

impl Subscription {
    /// Marks the feed's current state seen: a later [`Subscription::changed`] waits for
    /// anything after it. Call before [`Feed::take`], so nothing falls between the two.
    pub fn seen(&mut self) {
        self.tip.borrow_and_update();
    }

    /// Waits until the feed grew or ended since [`Subscription::seen`].
    pub async fn changed(&mut self) {
        // The feed holds the sender and this holds the feed: it cannot close.
        let _ = self.tip.changed().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.feed.by_coding[self.coding as usize].fetch_sub(1, Ordering::SeqCst);
        self.feed.subscribers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Follows run `run_id`'s log into `feed` while anyone subscribes, from its first
/// record (one read for every subscriber joining late), until `done` (the worker
/// ended) and a last read found the rest. When the last subscriber leaves, the history
/// goes with it.
pub async fn follow(
    feed: Arc<Feed>,
    store: Arc<dyn RunStore>,
    mask: Arc<Mask>,
    run_id: String,
    done: CancellationToken,
) {
    let mut next = 0;
    let complete = loop {
        let finished = done.is_cancelled();
        if feed.subscribers.load(Ordering::SeqCst) == 0 {
            // Nobody can subscribe once the worker ended (the run left the host's
            // list first): nothing more to read for anyone.
            if finished {
                break false;
            }
            feed.forget();
            next = 0;
            tokio::select! {
                _ = feed.joined.notified() => {}
                _ = done.cancelled() => {}
            }
            continue;
        }
        let records = match read(&store, &run_id, next).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(run_id = %run_id, "run {run_id}: the event feed stopped: {e}");
                break false;
            }
        };
        let gather = match Batch::render(&records, &mask) {
            Some(b) => {
                for c in Coding::COMPRESSED {
                    if feed.by_coding[c as usize].load(Ordering::SeqCst) > 0 {
                        b.encode(c);
                    }
                }
                next = b.end();
                feed.push(b);
                GATHER
            }
            None => POLL,
        };
        if finished {
            break true;
        }
        tokio::select! {
            _ = tokio::time::sleep(gather) => {}
            _ = done.cancelled() => {}
        }
    };
    feed.end(complete);
}

/// The records of `run_id` from `from` on, read off the async threads.
pub async fn read(
    store: &Arc<dyn RunStore>,
    run_id: &str,
    from: u64,
) -> Result<Vec<Stored>, StoreError> {
    let store = store.clone();
    let run_id = run_id.to_string();
    tokio::task::spawn_blocking(move || store.read(&run_id, from).map(|r| r.records))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::{Record, RunStatus};

    fn records(seqs: std::ops::Range<u64>) -> Vec<Stored> {
        seqs.map(|seq| Stored {
            seq,
            at_ms: seq,
            record: Record::Resumed { pause: seq },
        })
        .collect()
    }

    /// What a subscriber at `from` is sent, as text.
    fn take(feed: &Feed, from: u64) -> (Take, Vec<Bytes>) {
        let mut batches = Vec::new();
        let t = feed.take(from, &mut batches);
        (t, batches.iter().map(|b| b.from(from)).collect())
    }

    fn text(out: &[Bytes]) -> String {
        out.iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .collect()
    }

    fn ids(out: &[Bytes]) -> Vec<u64> {
        text(out)
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .map(|s| s.parse().unwrap())
            .collect()
    }

    #[test]
    fn a_subscriber_anywhere_in_the_history_gets_each_later_record_once_in_order() {
        let mask = Mask::new(vec![]);
        let feed = Arc::new(Feed::default());
        feed.push(Batch::render(&records(0..3), &mask).unwrap());
        feed.push(Batch::render(&records(3..7), &mask).unwrap());
        for from in 0..7 {
            let (t, out) = take(&feed, from);
            assert_eq!(t, Take::Sent(7));
            assert_eq!(ids(&out), (from..7).collect::<Vec<_>>());
        }
        assert_eq!(take(&feed, 7), (Take::Wait, vec![]));
        feed.end(true);
        assert_eq!(take(&feed, 7), (Take::End, vec![]));
    }

    #[test]
    fn a_forgotten_history_is_read_again_from_the_start_for_whoever_waits() {
        let mask = Mask::new(vec![]);
        let feed = Arc::new(Feed::default());
        feed.push(Batch::render(&records(0..5), &mask).unwrap());
        feed.forget();
        assert_eq!(take(&feed, 3).0, Take::Wait);
        feed.push(Batch::render(&records(0..6), &mask).unwrap());
        let (t, out) = take(&feed, 3);
        assert_eq!(t, Take::Sent(6));
        assert_eq!(ids(&out), vec![3, 4, 5]);
    }

    #[test]
    fn every_subscriber_shares_the_one_rendered_buffer() {
        let mask = Mask::new(vec![]);
        let feed = Arc::new(Feed::default());
        feed.push(Batch::render(&records(0..4), &mask).unwrap());
        let (a, b) = (take(&feed, 0).1, take(&feed, 2).1);
        // The later subscriber's text is a tail of the same allocation.
        let (a, b) = (&a[0], &b[0]);
        assert_eq!(a.as_ptr() as usize + a.len(), b.as_ptr() as usize + b.len());
    }

    #[test]
    fn compressed_subscribers_share_one_compressed_batch_and_a_start_inside_it_is_cut_at_a_record()
    {
        use std::io::Read as _;
        let mask = Mask::new(vec![]);
        let feed = Arc::new(Feed::default());
        feed.push(Batch::render(&records(0..4), &mask).unwrap());
        let mut batches = Vec::new();
        feed.take(0, &mut batches);
        let b = &batches[0];
        let (x, y) = (b.gzip_from(0), b.gzip_from(0));
        assert_eq!(x.bytes.as_ptr(), y.bytes.as_ptr(), "compressed once");
        let (x, y) = (b.zstd_from(0), b.zstd_from(0));
        assert_eq!(x.as_ptr(), y.as_ptr(), "compressed once");
        for from in 0..4 {
            let (mut g, head) = crate::gzip::Gzip::start();
            let mut bytes = head.to_vec();
            bytes.extend_from_slice(&g.carry(&b.gzip_from(from)));
            bytes.extend_from_slice(&g.finish());
            let mut text = String::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_string(&mut text)
                .unwrap();
            assert_eq!(text.as_bytes(), &b.from(from)[..]);
            assert!(text.starts_with(&format!("id: {from}\n")), "{text}");
            let text = zstd::stream::decode_all(&b.zstd_from(from)[..]).unwrap();
            assert_eq!(text, &b.from(from)[..]);
        }
    }

    #[test]
    fn history_beyond_the_bound_is_dropped_oldest_first_and_read_from_the_store() {
        let mask = Mask::new(vec![]);
        let feed = Arc::new(Feed::default());
        let one = Batch::render(&records(0..1), &mask).unwrap().text.len();
        let per_batch = 1000;
        let batches = KEEP_BYTES / (one * per_batch) + 2;
        for i in 0..batches as u64 {
            let seqs = i * per_batch as u64..(i + 1) * per_batch as u64;
            feed.push(Batch::render(&records(seqs), &mask).unwrap());
        }
        assert_eq!(take(&feed, 0).0, Take::Missing);
        let end = batches as u64 * per_batch as u64;
        let (t, out) = take(&feed, end - 1);
        assert_eq!(t, Take::Sent(end));
        assert_eq!(ids(&out), vec![end - 1]);
        feed.end(false);
        assert_eq!(take(&feed, end).0, Take::Rest);
    }

    #[test]
    fn a_record_renders_as_its_masked_json_tree_would_without_seq_and_kind() {
        use heddle_core::{InvocationMetrics, Occurrence, Value};
        let stored = |seq, record| Stored {
            seq,
            at_ms: 1_796_095_521_458 + seq,
            record,
        };
        let records = [
            stored(0, Record::CancelRequested),
            stored(
                1,
                Record::Completed {
                    occurrence: Occurrence::new("up", "each:item=7", 2),
                    outputs: vec![
                        ("text".into(), Value::str("ITEM \"7\"\n\u{1}é")),
                        ("f".into(), Value::Float(0.1)),
                        ("nan".into(), Value::Float(f64::NAN)),
                        ("b".into(), Value::Bytes(vec![0u8, 255].into())),
                    ],
                    emitted: vec![("item".into(), Value::Int(-3))],
                    metrics: InvocationMetrics {
                        wall_us: 24,
                        fuel: Some(9827),
                        ..Default::default()
                    },
                },
            ),
            stored(
                2,
                Record::Finished {
                    status: RunStatus::Failed,
                    error: Some("the password is hunter2, or \"hunter2\"".into()),
                },
            ),
        ];
        let secret_sets: [&[&str]; 4] = [
            &[],
            &["hunter2", "a\"b"],
            // Escaped control characters beside raw non-ASCII; a key; a kind (the tag
            // itself masked).
            &["\"7\"\n\u{1}é", "wall_us"],
            &["completed"],
        ];
        for secrets in secret_sets {
            let mask = Mask::new(secrets.iter().map(|s| s.to_string()).collect());
            for r in &records {
                let mut tree = mask.to_value(r);
                let o = tree.as_object_mut().unwrap();
                o.shift_remove("seq");
                o.shift_remove("kind");
                let text = data(r, &mask);
                assert_eq!(text, tree.to_string());
                // Decoded, no string or key holds a secret.
                let decoded: serde_json::Value = serde_json::from_str(&text).unwrap();
                let mut strings = vec![];
                let mut stack = vec![&decoded];
                while let Some(v) = stack.pop() {
                    match v {
                        serde_json::Value::String(s) => strings.push(s.clone()),
                        serde_json::Value::Array(a) => stack.extend(a),
                        serde_json::Value::Object(m) => {
                            strings.extend(m.keys().cloned());
                            stack.extend(m.values());
                        }
                        _ => {}
                    }
                }
                for s in secrets {
                    assert!(!strings.iter().any(|x| x.contains(s)), "{s:?} in {text}");
                }
            }
        }
    }

    #[test]
    fn a_secret_json_escapes_is_still_masked() {
        let mask = Mask::new(vec!["pass\"word\\".into()]);
        let r = Stored {
            seq: 0,
            at_ms: 0,
            record: Record::Finished {
                status: RunStatus::Failed,
                error: Some("it was pass\"word\\ all along".into()),
            },
        };
        let t = data(&r, &mask);
        assert_eq!(
            t,
            "{\"at_ms\":0,\"status\":\"failed\",\"error\":\"it was «redacted» all along\"}"
        );
    }

    #[test]
    fn records_are_masked_when_rendered() {
        let mask = Mask::new(vec!["hunter2".into()]);
        let r = Stored {
            seq: 0,
            at_ms: 0,
            record: Record::Finished {
                status: RunStatus::Failed,
                error: Some("the password is hunter2".into()),
            },
        };
        let b = Batch::render(&[r], &mask).unwrap();
        let t = std::str::from_utf8(&b.text).unwrap();
        assert!(!t.contains("hunter2"), "{t}");
        assert_eq!(
            t,
            "id: 0\nevent: finished\ndata: {\"at_ms\":0,\"status\":\"failed\",\"error\":\"the password is «redacted»\"}\n\n"
        );
    }
}
