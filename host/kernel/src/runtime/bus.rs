//! The run's event bus: one ordered record of everything that happens, delivered to any
//! number of subscribers and retained (capped) for the run result.
//!
//! Two kinds of subscriber read it: a stream ([`EventBus::subscribe`]: every event,
//! shared as an `Arc`, through a channel, for a reader on another task: the progress
//! view, the server's feed) and an observer ([`EventBus::observe`]: the kinds it asked
//! for, borrowed, where they are published, for a reader that only folds them into
//! something of its own: the run's spans and metrics). An observer costs the run no
//! allocation, no channel and no wake-up per event, and a kind nobody asked for is not
//! even built.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use heddle_core::plan::{NodeIdx, Plan};
use heddle_core::{EdgeStatus, Event, EventKind, InvocationMetrics, NodeStatus, SkipReason, Value};
use tokio::sync::mpsc;

use crate::executor::{EventSink, Outputs};

/// An event as the kernel hands it over: built, or one of the frequent kinds by its
/// parts (shared ids, outputs not yet converted to a map). A draft is built into an
/// [`EventKind`] only when someone will see it: at once for a subscriber, else when the
/// retained record is read. A run nobody watches builds only the events its result
/// keeps, whatever its size.
///
/// Every draft is moved a few times on its way into the record (into the caller's batch,
/// the slot, the ring), so it is kept small enough to move without a call to `memcpy`
/// (a slot of at most 128 bytes): a built event is boxed (an event built at once already
/// allocates its text), as is an actor's last outputs (one per node that ends, not per
/// message), and a node run inline names its node by plan index. An invocation's figures
/// are a draft of their own: one allocation (the figures), where the built event takes
/// its id and key as strings and would have to be boxed besides.
pub(crate) enum Draft {
    Built(Box<EventKind>),
    Invocation {
        node_id: Arc<str>,
        key: Arc<str>,
        attempt: u32,
        timed_out: bool,
        span_id: Option<heddle_core::trace::SpanId>,
        detail: Box<InvocationDetail>,
    },
    /// A node run inline by the runner (see `inline`): its `running` or `completed`
    /// event, its id and type read from the plan when built.
    Inline {
        node: NodeIdx,
        status: NodeStatus,
        result: Option<Outputs>,
    },
    Node {
        node_id: Arc<str>,
        node_type: Arc<str>,
        status: NodeStatus,
        result: Option<Box<Outputs>>,
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

/// What an [`Draft::Invocation`] holds boxed: the figures and, when the attempt
/// failed, why.
pub(crate) struct InvocationDetail {
    pub metrics: InvocationMetrics,
    pub error: Option<String>,
    pub signature: Option<String>,
}

impl Draft {
    /// Its kind, as [`Kinds`] counts it, without building it.
    fn kinds(&self) -> Kinds {
        match self {
            Draft::Built(kind) => Kinds::of(kind),
            Draft::Inline { .. } | Draft::Node { .. } => Kinds::NODE,
            Draft::Invocation { .. } => Kinds::INVOCATION,
            Draft::Edge { .. } => Kinds::EDGE,
            Draft::Output { .. } => Kinds::OUTPUT,
        }
    }

    fn build(self, plan: &Plan) -> EventKind {
        match self {
            Draft::Built(kind) => *kind,
            Draft::Invocation {
                node_id,
                key,
                attempt,
                timed_out,
                span_id,
                detail,
            } => {
                let InvocationDetail {
                    metrics,
                    error,
                    signature,
                } = *detail;
                EventKind::Invocation {
                    node_id: String::from(&*node_id),
                    key: String::from(&*key),
                    metrics,
                    error,
                    attempt,
                    timed_out,
                    signature,
                    span_id,
                }
            }
            Draft::Inline {
                node,
                status,
                result,
            } => {
                let n = &plan.nodes[node as usize];
                EventKind::Node {
                    node_id: String::from(&*n.id),
                    node_type: String::from(&*n.node_type),
                    status,
                    result: result.map(|o| o.to_map()),
                    error: None,
                    skip_reason: None,
                }
            }
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
    /// The event, borrowed, built in place (unshared) the first time it is asked for:
    /// what an observer reads. A later [`Slot::event`] moves it into its `Arc`.
    fn peek(&mut self, plan: &Plan) -> (u64, u64, &EventKind) {
        match self {
            Slot::Built(e) => (e.seq, e.at_us, &e.kind),
            Slot::Draft { seq, at_us, draft } => {
                if !matches!(draft, Draft::Built(_)) {
                    let d = std::mem::replace(draft, PLACEHOLDER);
                    *draft = Draft::Built(Box::new(d.build(plan)));
                }
                let Draft::Built(kind) = draft else {
                    unreachable!("built just above")
                };
                (*seq, *at_us, kind)
            }
        }
    }

    /// The event, built in place the first time it is asked for.
    fn event(&mut self, plan: &Plan) -> Arc<Event> {
        let ev = match self {
            Slot::Built(e) => return e.clone(),
            Slot::Draft { seq, at_us, draft } => {
                // The draft is consumed here; the slot holds the built event from now on.
                let draft = std::mem::replace(draft, PLACEHOLDER);
                Arc::new(Event {
                    seq: *seq,
                    at_us: *at_us,
                    kind: draft.build(plan),
                })
            }
        };
        *self = Slot::Built(ev.clone());
        ev
    }

    /// The event, owned: built straight from a draft nobody saw, else unwrapped from its
    /// `Arc` (copied only while a subscriber still holds it).
    fn into_event(self, plan: &Plan) -> Event {
        match self {
            Slot::Built(e) => Arc::try_unwrap(e).unwrap_or_else(|e| (*e).clone()),
            Slot::Draft { seq, at_us, draft } => Event {
                seq,
                at_us,
                kind: draft.build(plan),
            },
        }
    }
}

/// What a draft's slot holds for the instant between taking the draft and storing the
/// event built from it (allocates nothing).
const PLACEHOLDER: Draft = Draft::Inline {
    node: 0,
    status: NodeStatus::Running,
    result: None,
};

/// A set of event kinds: what an observer asks for ([`EventBus::observe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kinds(u8);

impl Kinds {
    /// No event.
    pub const NONE: Kinds = Kinds(0);
    /// [`EventKind::Run`].
    pub const RUN: Kinds = Kinds(1);
    /// [`EventKind::Node`].
    pub const NODE: Kinds = Kinds(1 << 1);
    /// [`EventKind::Output`].
    pub const OUTPUT: Kinds = Kinds(1 << 2);
    /// [`EventKind::Edge`].
    pub const EDGE: Kinds = Kinds(1 << 3);
    /// [`EventKind::Log`].
    pub const LOG: Kinds = Kinds(1 << 4);
    /// [`EventKind::Invocation`].
    pub const INVOCATION: Kinds = Kinds(1 << 5);
    /// [`EventKind::Escalation`].
    pub const ESCALATION: Kinds = Kinds(1 << 6);
    /// [`EventKind::Decision`].
    pub const DECISION: Kinds = Kinds(1 << 7);
    /// Every event.
    pub const ALL: Kinds = Kinds(u8::MAX);

    /// The kind of `kind`.
    pub fn of(kind: &EventKind) -> Kinds {
        match kind {
            EventKind::Run { .. } => Kinds::RUN,
            EventKind::Node { .. } => Kinds::NODE,
            EventKind::Output { .. } => Kinds::OUTPUT,
            EventKind::Edge { .. } => Kinds::EDGE,
            EventKind::Log { .. } => Kinds::LOG,
            EventKind::Invocation { .. } => Kinds::INVOCATION,
            EventKind::Escalation { .. } => Kinds::ESCALATION,
            EventKind::Decision { .. } => Kinds::DECISION,
        }
    }

    /// Whether the two sets share a kind.
    pub fn meets(self, other: Kinds) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::ops::BitOr for Kinds {
    type Output = Kinds;
    fn bitor(self, other: Kinds) -> Kinds {
        Kinds(self.0 | other.0)
    }
}

/// An event as an observer reads it: borrowed from the bus for the call.
#[derive(Clone, Copy, Debug)]
pub struct EventRef<'a> {
    /// As [`Event::seq`].
    pub seq: u64,
    /// As [`Event::at_us`].
    pub at_us: u64,
    /// As [`Event::kind`].
    pub kind: &'a EventKind,
}

/// A subscriber that reads the kinds of events it asked for where they are published
/// ([`EventBus::observe`]), in the run's order, borrowed.
///
/// It is called with the bus's lock held, on whichever thread published the event (an
/// actor's): it must be quick, never block, and never publish to the bus. A panic
/// removes it (the run goes on); it is then dropped without [`Observer::closed`].
pub trait Observer: Send {
    /// An event of a kind it asked for.
    fn event(&mut self, event: EventRef<'_>);
    /// The run's record is closed: no event follows. It is dropped right after.
    fn closed(&mut self) {}
}

struct Observing {
    kinds: Kinds,
    observer: Box<dyn Observer>,
}

impl Observing {
    /// Hands it `slot`'s event if it asked for its kind; false when it panicked (it is
    /// then to be removed).
    fn offer(&mut self, kinds: Kinds, slot: &mut Slot, plan: &Plan) -> bool {
        if !self.kinds.meets(kinds) {
            return true;
        }
        let (seq, at_us, kind) = slot.peek(plan);
        let observer = &mut self.observer;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            observer.event(EventRef { seq, at_us, kind })
        }))
        .is_ok()
    }
}

/// One subscription, in the order they were made.
enum Subscriber {
    /// Every event, shared, through a channel ([`EventBus::subscribe`]).
    Stream(mpsc::UnboundedSender<Arc<Event>>),
    /// The kinds it asked for, borrowed ([`EventBus::observe`]).
    Observer(Observing),
}

impl Subscriber {
    fn kinds(&self) -> Kinds {
        match self {
            Subscriber::Stream(_) => Kinds::ALL,
            Subscriber::Observer(o) => o.kinds,
        }
    }
}

struct BusState {
    next_seq: u64,
    /// A ring: dropping the oldest half moves nothing.
    retained: VecDeque<Slot>,
    dropped: u64,
    subscribers: Vec<Subscriber>,
    /// The kinds some subscriber reads: the others stay drafts.
    wanted: Kinds,
    closed: bool,
}

impl BusState {
    fn wanted(&self) -> Kinds {
        self.subscribers
            .iter()
            .fold(Kinds::NONE, |k, s| k | s.kinds())
    }
}

/// Sequence numbers are assigned under the same lock that fans the event out, so every
/// subscriber sees the same gapless order. Events are per node state change, per output
/// value and per throttled edge update, never per routed message, so one lock is cheap.
pub struct EventBus {
    /// The run's plan: what drafts that name a node by index are built from.
    plan: Arc<Plan>,
    started: Instant,
    /// The wall-clock reading taken with `started`.
    origin: std::time::SystemTime,
    cap: usize,
    state: Mutex<BusState>,
}

impl EventBus {
    /// A bus for a run of `plan` retaining at most `cap` events for the run result (at
    /// least 2: when full, the oldest half is dropped). Subscribers get every event
    /// whatever the cap.
    pub(crate) fn new(cap: usize, plan: Arc<Plan>) -> Arc<Self> {
        Arc::new(EventBus {
            plan,
            started: Instant::now(),
            origin: std::time::SystemTime::now(),
            cap: cap.max(2),
            state: Mutex::new(BusState {
                next_seq: 0,
                retained: VecDeque::new(),
                dropped: 0,
                subscribers: Vec::new(),
                wanted: Kinds::NONE,
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
        self.publish_draft(Draft::Built(Box::new(kind)));
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
        let kinds = draft.kinds();
        let mut slot = Slot::Draft { seq, at_us, draft };
        // An event no observer asked for and no stream reads stays a draft.
        if st.wanted.meets(kinds) {
            let before = st.subscribers.len();
            // Shared (built into its `Arc`) once, for the streams, if there are any.
            let mut shared: Option<Arc<Event>> = None;
            st.subscribers.retain_mut(|s| match s {
                Subscriber::Stream(tx) => {
                    let ev = shared.get_or_insert_with(|| slot.event(&self.plan));
                    tx.send(ev.clone()).is_ok()
                }
                Subscriber::Observer(o) => o.offer(kinds, &mut slot, &self.plan),
            });
            if st.subscribers.len() != before {
                st.wanted = st.wanted();
            }
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
            let _ = tx.send(slot.event(&self.plan));
        }
        if !st.closed {
            st.subscribers.push(Subscriber::Stream(tx));
            st.wanted = Kinds::ALL;
        }
        EventStream { rx }
    }

    /// Has `observer` read every event of `kinds`: first the retained ones, then each as
    /// it is published (see [`Observer`]). Once the bus is closed it reads the retained
    /// record and is closed at once.
    pub fn observe(&self, kinds: Kinds, observer: Box<dyn Observer>) {
        let mut st = self.lock();
        let mut o = Observing { kinds, observer };
        for slot in &mut st.retained {
            let k = match slot {
                Slot::Built(e) => Kinds::of(&e.kind),
                Slot::Draft { draft, .. } => draft.kinds(),
            };
            if !o.offer(k, slot, &self.plan) {
                return;
            }
        }
        if st.closed {
            o.observer.closed();
        } else {
            st.subscribers.push(Subscriber::Observer(o));
            st.wanted = st.wanted();
        }
    }

    /// Ends every subscription (after the final run event) and says how many events were
    /// dropped. The record stays here, unbuilt, for late subscribers until
    /// [`EventBus::take_record`] hands it to the run result.
    pub fn close(&self) -> u64 {
        let mut st = self.lock();
        st.closed = true;
        st.wanted = Kinds::NONE;
        for s in std::mem::take(&mut st.subscribers) {
            if let Subscriber::Observer(mut o) = s {
                let _ =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| o.observer.closed()));
            }
        }
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
            .map(|slot| slot.into_event(&self.plan))
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

    /// A bus for a plan of two pass-through nodes, `m` and `n` (`n` at index 1).
    fn test_bus(cap: usize) -> Arc<EventBus> {
        let doc = heddle_core::GraphBuilder::new()
            .node("m", "heddle.passthrough")
            .node("n", "heddle.passthrough")
            .build();
        let plan = heddle_core::plan::plan(&doc, &crate::Registry::with_builtins()).unwrap();
        assert_eq!(&*plan.nodes[1].id, "n");
        EventBus::new(cap, Arc::new(plan))
    }

    fn log(i: usize) -> EventKind {
        EventKind::Log {
            node_id: "n".into(),
            level: LogLevel::Info,
            message: i.to_string(),
        }
    }

    #[test]
    fn every_subscriber_gets_every_event_in_order_and_cap_drops_oldest_half() {
        let bus = test_bus(10);
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
            result: Some(Box::new(Outputs::one("value", Value::Int(i as i64)))),
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
        let bus = test_bus(100);
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
        let metrics = InvocationMetrics {
            wall_us: 7,
            fuel: Some(9),
            ..Default::default()
        };
        bus.publish_draft(Draft::Invocation {
            node_id: Arc::from("n"),
            key: Arc::from("0"),
            attempt: 2,
            timed_out: true,
            span_id: Some(heddle_core::trace::SpanId([1; 8])),
            detail: Box::new(InvocationDetail {
                metrics: metrics.clone(),
                error: Some("boom".into()),
                signature: Some("x:y".into()),
            }),
        });
        bus.close();
        let retained = bus.take_record();
        let kinds: Vec<EventKind> = retained.iter().map(|e| e.kind.clone()).collect();
        let edge = EventKind::Edge {
            edge_id: "e".into(),
            status: EdgeStatus::Active,
            counter: 2,
        };
        let invocation = EventKind::Invocation {
            node_id: "n".into(),
            key: "0".into(),
            metrics,
            error: Some("boom".into()),
            attempt: 2,
            timed_out: true,
            signature: Some("x:y".into()),
            span_id: Some(heddle_core::trace::SpanId([1; 8])),
        };
        assert_eq!(
            kinds,
            vec![built(0), built(1), edge.clone(), invocation.clone()]
        );
        let mut seen = Vec::new();
        while let Some(e) = late.try_next() {
            seen.push((e.seq, e.kind.clone()));
        }
        assert_eq!(
            seen,
            vec![(0, built(0)), (1, built(1)), (2, edge), (3, invocation)]
        );
        let rest: Vec<u64> = std::iter::from_fn(|| early.try_next())
            .map(|e| e.seq)
            .collect();
        assert_eq!(rest, vec![1, 2, 3]);
    }

    #[test]
    fn inline_drafts_read_as_the_node_events_of_their_plan_node_by_every_path() {
        let inline = |status, v: Option<i64>| Draft::Inline {
            node: 1,
            status,
            result: v.map(|v| Outputs::one("value", Value::Int(v))),
        };
        let built = |status, v: Option<i64>| EventKind::Node {
            node_id: "n".into(),
            node_type: "heddle.passthrough".into(),
            status,
            result: v.map(|v| [("value".to_string(), Value::Int(v))].into()),
            error: None,
            skip_reason: None,
        };
        let bus = test_bus(100);
        // 0 is built when the record is taken, 1 for an observer, 2 for a stream.
        bus.publish_all(&mut vec![inline(NodeStatus::Running, None)]);
        let (o, list, _) = seen();
        bus.observe(Kinds::NODE, Box::new(o));
        bus.publish_all(&mut vec![inline(NodeStatus::Completed, Some(4))]);
        let mut stream = bus.subscribe();
        bus.publish_draft(inline(NodeStatus::Completed, Some(5)));
        bus.close();
        let want = [
            built(NodeStatus::Running, None),
            built(NodeStatus::Completed, Some(4)),
            built(NodeStatus::Completed, Some(5)),
        ];
        let streamed: Vec<EventKind> = std::iter::from_fn(|| stream.try_next())
            .map(|e| e.kind.clone())
            .collect();
        assert_eq!(streamed, want);
        let observed: Vec<EventKind> = list
            .lock()
            .unwrap()
            .iter()
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(observed, want);
        let record: Vec<EventKind> = bus.take_record().into_iter().map(|e| e.kind).collect();
        assert_eq!(record, want);
    }

    #[test]
    fn a_slot_moves_without_a_memcpy_call() {
        // Every event is moved several times on its way into the record; at most 128
        // bytes, a move is a few register copies (x86-64's inline limit), beyond it a
        // call to `memcpy` (most of what publishing an inline node's events cost when
        // slots were 224 bytes).
        use std::mem::size_of;
        assert!(size_of::<Slot>() <= 128, "{}", size_of::<Slot>());
        assert!(
            size_of::<Draft>() < size_of::<EventKind>(),
            "{}",
            size_of::<Draft>()
        );
    }

    /// What an observer read: each event's seq and kind.
    type Read = Arc<Mutex<Vec<(u64, EventKind)>>>;

    /// Records what it reads, in a list the test keeps, and whether it was closed.
    struct Seen(Read, Arc<Mutex<bool>>);

    impl Observer for Seen {
        fn event(&mut self, e: EventRef<'_>) {
            if matches!(e.kind, EventKind::Log { message, .. } if message == "panic") {
                panic!("an observer's bug");
            }
            self.0.lock().unwrap().push((e.seq, e.kind.clone()));
        }
        fn closed(&mut self) {
            *self.1.lock().unwrap() = true;
        }
    }

    fn seen() -> (Seen, Read, Arc<Mutex<bool>>) {
        let (list, closed) = Default::default();
        (Seen(Arc::clone(&list), Arc::clone(&closed)), list, closed)
    }

    #[test]
    fn an_observer_reads_its_kinds_in_order_and_unwanted_drafts_stay_unbuilt() {
        let bus = test_bus(100);
        bus.publish(log(0));
        let (o, list, closed) = seen();
        bus.observe(Kinds::LOG | Kinds::RUN, Box::new(o));
        let mut stream = bus.subscribe();
        bus.publish_draft(Draft::Edge {
            edge_id: Arc::from("e"),
            status: EdgeStatus::Active,
            counter: 1,
        });
        bus.publish(log(2));
        drop(stream.try_next());
        drop(stream);
        // Nobody reads edges now (the stream is gone once a send finds it so).
        bus.publish_draft(Draft::Edge {
            edge_id: Arc::from("e"),
            status: EdgeStatus::Completed,
            counter: 2,
        });
        bus.publish_draft(Draft::Edge {
            edge_id: Arc::from("e"),
            status: EdgeStatus::Completed,
            counter: 3,
        });
        {
            let st = bus.lock();
            assert!(matches!(
                st.retained.back(),
                Some(Slot::Draft {
                    draft: Draft::Edge { counter: 3, .. },
                    ..
                })
            ));
        }
        bus.publish(EventKind::Run {
            status: RunStatus::Completed,
            error: None,
        });
        assert!(!*closed.lock().unwrap());
        bus.close();
        assert!(*closed.lock().unwrap());
        let seqs: Vec<u64> = list.lock().unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![0, 2, 5]);
        // What it read is what the record says.
        let record = bus.take_record();
        for (seq, kind) in list.lock().unwrap().iter() {
            assert_eq!(&record[*seq as usize].kind, kind);
        }
        assert_eq!(record.len(), 6);
    }

    #[test]
    fn a_panicking_observer_is_removed_and_a_late_one_reads_the_record() {
        let bus = test_bus(100);
        let (o, list, closed) = seen();
        bus.observe(Kinds::ALL, Box::new(o));
        bus.publish(log(0));
        bus.publish(EventKind::Log {
            node_id: "n".into(),
            level: LogLevel::Info,
            message: "panic".into(),
        });
        bus.publish(log(2));
        bus.close();
        assert_eq!(list.lock().unwrap().len(), 1);
        assert!(!*closed.lock().unwrap());
        let (late, list, closed) = seen();
        bus.observe(Kinds::LOG, Box::new(late));
        assert_eq!(list.lock().unwrap().len(), 1, "stops at the panic again");
        assert!(!*closed.lock().unwrap());
        let (late, list, closed) = seen();
        bus.observe(Kinds::RUN, Box::new(late));
        assert!(list.lock().unwrap().is_empty());
        assert!(*closed.lock().unwrap());
    }
}
