//! The run's event bus: one ordered record of everything that happens, delivered to any
//! number of subscribers and retained (capped) for the run result.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use heddle_core::{EdgeStatus, Event, EventKind, NodeStatus, SkipReason, Value};
use tokio::sync::mpsc;

use crate::executor::{EventSink, Outputs};

/// An event as the kernel hands it over: built, or one of the frequent kinds by its
/// parts (shared ids, outputs not yet converted to a map). A draft is built into an
/// [`EventKind`] only when someone will see it: at once for a subscriber, else when the
/// retained record is read. A run nobody watches builds only the events its result
/// keeps, whatever its size.
pub(crate) enum Draft {
    Built(EventKind),
    Node {
        node_id: Arc<str>,
        node_type: Arc<str>,
        status: NodeStatus,
        result: Option<Outputs>,
        error: Option<String>,
        skip_reason: Option<SkipReason>,
    },
    Edge {
        edge_id: Arc<str>,
        status: EdgeStatus,
        counter: u64,
    },
    Output {
        node_id: Arc<str>,
        name: Arc<str>,
        value: Value,
    },
}

impl Draft {
    fn build(self) -> EventKind {
        match self {
            Draft::Built(kind) => kind,
            Draft::Node {
                node_id,
                node_type,
                status,
                result,
                error,
                skip_reason,
            } => EventKind::Node {
                node_id: String::from(&*node_id),
                node_type: String::from(&*node_type),
                status,
                result: result.map(|o| o.to_map()),
                error,
                skip_reason,
            },
            Draft::Edge {
                edge_id,
                status,
                counter,
            } => EventKind::Edge {
                edge_id: String::from(&*edge_id),
                status,
                counter,
            },
            Draft::Output {
                node_id,
                name,
                value,
            } => EventKind::Output {
                node_id: String::from(&*node_id),
                name: String::from(&*name),
                value,
            },
        }
    }
}

/// One retained event: built once a subscriber or the result needed it.
// A draft is kept in place, unboxed: boxing it would allocate once per event, which is
// what building events lazily is there to save (an invocation's figures make the
// largest draft a little over clippy's 200-byte line).
#[allow(clippy::large_enum_variant)]
enum Slot {
    Built(Arc<Event>),
    Draft { seq: u64, at_us: u64, draft: Draft },
}

impl Slot {
    /// The event, built in place the first time it is asked for.
    fn event(&mut self) -> Arc<Event> {
        let ev = match self {
            Slot::Built(e) => return e.clone(),
            Slot::Draft { seq, at_us, draft } => {
                // The draft is consumed here; the slot holds the built event from now on.
                let draft = std::mem::replace(draft, Draft::Built(PLACEHOLDER));
                Arc::new(Event {
                    seq: *seq,
                    at_us: *at_us,
                    kind: draft.build(),
                })
            }
        };
        *self = Slot::Built(ev.clone());
        ev
    }

    /// The event, owned: built straight from a draft nobody saw, else unwrapped from its
    /// `Arc` (copied only while a subscriber still holds it).
    fn into_event(self) -> Event {
        match self {
            Slot::Built(e) => Arc::try_unwrap(e).unwrap_or_else(|e| (*e).clone()),
            Slot::Draft { seq, at_us, draft } => Event {
                seq,
                at_us,
                kind: draft.build(),
            },
        }
    }
}

/// What a draft's slot holds for the instant between taking the draft and storing the
/// event built from it (allocates nothing).
const PLACEHOLDER: EventKind = EventKind::Run {
    status: heddle_core::RunStatus::Running,
    error: None,
};

struct BusState {
    next_seq: u64,
    /// A ring: dropping the oldest half moves nothing.
    retained: VecDeque<Slot>,
    dropped: u64,
    subscribers: Vec<mpsc::UnboundedSender<Arc<Event>>>,
    closed: bool,
}

/// Sequence numbers are assigned under the same lock that fans the event out, so every
/// subscriber sees the same gapless order. Events are per node state change, per output
/// value and per throttled edge update, never per routed message, so one lock is cheap.
pub struct EventBus {
    started: Instant,
    /// The wall-clock reading taken with `started`.
    origin: std::time::SystemTime,
    cap: usize,
    state: Mutex<BusState>,
}

impl EventBus {
    /// A bus retaining at most `cap` events for the run result (at least 2: when full,
    /// the oldest half is dropped). Subscribers get every event whatever the cap.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(EventBus {
            started: Instant::now(),
            origin: std::time::SystemTime::now(),
            cap: cap.max(2),
            state: Mutex::new(BusState {
                next_seq: 0,
                retained: VecDeque::new(),
                dropped: 0,
                subscribers: Vec::new(),
                closed: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BusState> {
        // A panic while holding the lock leaves a consistent Vec; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stamps `kind` with the next sequence number and the run's clock and hands it to
    /// every subscriber.
    pub fn publish(&self, kind: EventKind) {
        self.publish_draft(Draft::Built(kind));
    }

    pub(crate) fn publish_draft(&self, draft: Draft) {
        let at_us = self.now_us();
        let mut st = self.lock();
        self.push(&mut st, at_us, draft);
    }

    /// Publishes `drafts` in order, leaving the vector empty (its room kept for the
    /// next ones): one clock reading and one lock for all of them, so a caller with many
    /// events at once (the runner's inline nodes) pays those per batch, not per event.
    /// They all carry the time of this call.
    pub(crate) fn publish_all(&self, drafts: &mut Vec<Draft>) {
        if drafts.is_empty() {
            return;
        }
        let at_us = self.now_us();
        let mut st = self.lock();
        for draft in drafts.drain(..) {
            self.push(&mut st, at_us, draft);
        }
    }

    /// The wall-clock time events' `at_us` count from (when the bus was made).
    pub fn origin(&self) -> std::time::SystemTime {
        self.origin
    }

    /// Microseconds since the bus was made (just before its run starts): the clock every
    /// event is stamped by, and the run's own wall time, so no event reads later than
    /// the run's end.
    pub(crate) fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn push(&self, st: &mut BusState, at_us: u64, draft: Draft) {
        if st.closed {
            return;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        if st.retained.len() >= self.cap {
            let half = st.retained.len() / 2;
            st.retained.drain(..half);
            st.dropped += half as u64;
        }
        let mut slot = Slot::Draft { seq, at_us, draft };
        if !st.subscribers.is_empty() {
            let ev = slot.event();
            st.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        }
        st.retained.push_back(slot);
    }

    /// A new subscriber first receives every retained event, then every later one. Once
    /// the bus is closed it receives the retained record and its stream ends: a caller
    /// that subscribes after starting a run sees the whole run however fast it ended.
    pub fn subscribe(&self) -> EventStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        for slot in &mut st.retained {
            let _ = tx.send(slot.event());
        }
        if !st.closed {
            st.subscribers.push(tx);
        }
        EventStream { rx }
    }

    /// Ends every subscription (after the final run event) and says how many events were
    /// dropped. The record stays here, unbuilt, for late subscribers until
    /// [`EventBus::take_record`] hands it to the run result.
    pub fn close(&self) -> u64 {
        let mut st = self.lock();
        st.closed = true;
        st.subscribers.clear();
        st.dropped
    }

    /// Moves the retained record out (it is the run result's): kept here too, every event
    /// would be built, copied for the result and freed twice. Drafts nobody saw are
    /// built straight into owned events; one a subscriber still holds is copied. Called
    /// once the bus is closed and the run's handle is done with it.
    pub fn take_record(&self) -> Vec<Event> {
        let mut st = self.lock();
        std::mem::take(&mut st.retained)
            .into_iter()
            .map(Slot::into_event)
            .collect()
    }
}

impl EventSink for EventBus {
    fn emit(&self, event: EventKind) {
        self.publish(event);
    }
}

/// One subscription to a run's events. Ends (`None`) after the run's final event.
pub struct EventStream {
    rx: mpsc::UnboundedReceiver<Arc<Event>>,
}

impl EventStream {
    /// The next event, waiting for it; `None` once the run's final event was seen.
    pub async fn next(&mut self) -> Option<Arc<Event>> {
        self.rx.recv().await
    }

    /// The next event if one is already waiting.
    pub fn try_next(&mut self) -> Option<Arc<Event>> {
        self.rx.try_recv().ok()
    }

    /// Blocks the calling (non-async) thread until the next event.
    pub fn blocking_next(&mut self) -> Option<Arc<Event>> {
        self.rx.blocking_recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::{LogLevel, RunStatus};

    fn log(i: usize) -> EventKind {
        EventKind::Log {
            node_id: "n".into(),
            level: LogLevel::Info,
            message: i.to_string(),
        }
    }

    #[test]
    fn every_subscriber_gets_every_event_in_order_and_cap_drops_oldest_half() {
        let bus = EventBus::new(10);
        let mut early = bus.subscribe();
        for i in 0..5 {
            bus.publish(log(i));
        }
        let mut late = bus.subscribe();
        for i in 5..25 {
            bus.publish(log(i));
        }
        bus.publish(EventKind::Run {
            status: RunStatus::Completed,
            error: None,
        });
        let dropped = bus.close();
        // Closed, the bus still gives the whole record to a late subscriber.
        let mut after: Vec<u64> = Vec::new();
        let mut closed_stream = bus.subscribe();
        while let Some(e) = closed_stream.blocking_next() {
            after.push(e.seq);
        }
        let retained = bus.take_record();
        assert_eq!(after, retained.iter().map(|e| e.seq).collect::<Vec<_>>());
        let mut seqs = Vec::new();
        while let Some(e) = early.try_next() {
            seqs.push(e.seq);
        }
        assert_eq!(seqs, (0..26).collect::<Vec<_>>());
        let mut late_seqs = Vec::new();
        while let Some(e) = late.try_next() {
            late_seqs.push(e.seq);
        }
        assert_eq!(late_seqs, (0..26).collect::<Vec<_>>());
        assert!(retained.len() <= 10);
        assert_eq!(retained.len() as u64 + dropped, 26);
        assert_eq!(retained.last().unwrap().seq, 25);
        // Gapless within what is retained.
        for w in retained.windows(2) {
            assert_eq!(w[0].seq + 1, w[1].seq);
        }
        // Nothing published after the close is recorded; once taken, the record is the
        // result's alone.
        bus.publish(log(99));
        assert!(bus.take_record().is_empty());
    }

    #[test]
    fn drafts_read_the_same_as_built_events_whenever_they_are_built() {
        let draft = |i: u64| Draft::Node {
            node_id: Arc::from("n"),
            node_type: Arc::from("t"),
            status: NodeStatus::Completed,
            result: Some(Outputs::one("value", Value::Int(i as i64))),
            error: None,
            skip_reason: None,
        };
        let built = |i: u64| EventKind::Node {
            node_id: "n".into(),
            node_type: "t".into(),
            status: NodeStatus::Completed,
            result: Some([("value".to_string(), Value::Int(i as i64))].into()),
            error: None,
            skip_reason: None,
        };
        let bus = EventBus::new(100);
        // Built by the late subscriber (0), for the early one at once (1), by close (2).
        bus.publish_draft(draft(0));
        let mut early = bus.subscribe();
        bus.publish_draft(draft(1));
        let mut late = bus.subscribe();
        drop(early.try_next());
        bus.publish_draft(Draft::Edge {
            edge_id: Arc::from("e"),
            status: EdgeStatus::Active,
            counter: 2,
        });
        bus.close();
        let retained = bus.take_record();
        let kinds: Vec<EventKind> = retained.iter().map(|e| e.kind.clone()).collect();
        let edge = EventKind::Edge {
            edge_id: "e".into(),
            status: EdgeStatus::Active,
            counter: 2,
        };
        assert_eq!(kinds, vec![built(0), built(1), edge.clone()]);
        let mut seen = Vec::new();
        while let Some(e) = late.try_next() {
            seen.push((e.seq, e.kind.clone()));
        }
        assert_eq!(seen, vec![(0, built(0)), (1, built(1)), (2, edge)]);
        let rest: Vec<u64> = std::iter::from_fn(|| early.try_next())
            .map(|e| e.seq)
            .collect();
        assert_eq!(rest, vec![1, 2]);
    }
}
