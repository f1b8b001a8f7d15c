//! One run's spans, built from its events: a `heddle.node` span per invocation attempt
//! the kernel reports (every attempt of a traced run but the native built-ins'), one
//! per node that never ran (outcome `skipped`, with why), one per attempt a dead owner
//! left (outcome `died`), all children of the run's `heddle.run` span, which is sent
//! when the run's ending is recorded.
//!
//! Every text an attribute or an event carries (ids, keys, errors, notes) is masked
//! against the run's secret values, as the server's event feed masks what it sends (a
//! run with no secret has nothing to mask: its texts are written as they are).
//!
//! The consumer is an observer of the run's event bus ([`heddle_kernel::Observer`]):
//! it reads the kinds of events it needs (no edges, outputs or logs) where the kernel
//! publishes them, borrowed, so a traced run pays no event allocation, channel or
//! wake-up per invocation. Spans are written as OTLP protobuf as they are read
//! ([`super::proto`]): an attempt that succeeded costs its bytes in a batch (the
//! parts every span of the run or of the node has alike encoded once), handed to the
//! exporter many spans at a time, or a moment after the first by the run's flusher
//! task. Only a failed attempt's span is held as parts, for the escalation and verdict
//! that may follow.
//!
//! The same consumer counts the run's invocations, escalations and verdicts when the
//! process keeps metrics ([`super::Metrics`]); a run is watched when either is on.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use heddle_core::supervise::{RedactLimits, Redactor};
use heddle_core::trace::{RunTrace, SpanId, Traced};
use heddle_core::{
    Decider, EventKind, NodeStatus, Occurrence, OpenReason, PauseReason, ReconcileAnswer, Record,
    RecordedAction, RunStatus, SkipReason,
};
use heddle_kernel::{EventRef, Kinds, Observer};
use heddle_store::{DiedAttempt, Stored};
use opentelemetry::KeyValue;
use opentelemetry::trace::Event;

use super::proto::{self, Attr, Head, SpanWriter, nanos};
use super::{Metrics, Telemetry};

/// Span and attribute names (the README's "Watching Heddle in production" lists them).
pub(crate) mod names {
    pub const RUN: &str = "heddle.run";
    pub const NODE: &str = "heddle.node";
    pub const RUN_ID: &str = "heddle.run.id";
    pub const GRAPH_NAME: &str = "heddle.graph.name";
    pub const GRAPH_DIGEST: &str = "heddle.graph.digest";
    pub const RUN_OUTCOME: &str = "heddle.run.outcome";
    pub const RUN_DURABLE: &str = "heddle.run.durable";
    pub const NODE_ID: &str = "heddle.node.id";
    pub const NODE_TYPE: &str = "heddle.node.type";
    pub const ATTEMPT: &str = "heddle.node.attempt";
    pub const KEY: &str = "heddle.node.key";
    pub const FUEL: &str = "heddle.node.fuel";
    pub const MEMORY: &str = "heddle.node.memory_bytes";
    pub const COST: &str = "heddle.node.cost_usd";
    pub const OUTCOME: &str = "heddle.node.outcome";
    pub const SIGNATURE: &str = "heddle.node.signature";
    pub const SKIP_REASON: &str = "heddle.node.skip_reason";
    pub const ERROR: &str = "heddle.node.error";
}

/// What a run's span says about it besides its outcome.
#[derive(Clone, Debug)]
pub(crate) struct RunInfo {
    /// A durable run's id (an in-memory run has none).
    pub run_id: Option<String>,
    pub graph_name: String,
    /// The sha256 of the graph's bytes, when known (a durable run records it).
    pub graph_digest: Option<String>,
    /// When the run was created: its span's start.
    pub created: SystemTime,
}

/// How a run is watched in this process (its spans, its metrics): given to its driver
/// by the runtime.
pub(crate) struct RunTracing {
    /// Where its spans go, and their ids; `None` when nothing is exported.
    spans: Option<(Arc<Telemetry>, Arc<Traced>)>,
    metrics: Option<Arc<Metrics>>,
    info: RunInfo,
    /// The run span's events from its log (what earlier processes and this one's
    /// opening recorded: recoveries, resumes, pauses, gate answers, cancels).
    history: Vec<Event>,
    /// Attempts the previous owner started and died with, and when it was last heard
    /// of (the last record it wrote): reported as died under the run span.
    died: Vec<DiedAttempt>,
    died_until: SystemTime,
    /// Masks every text the spans and labels carry.
    mask: Masker,
}

/// The run's secret values, masked out of every text a span or a label carries.
#[derive(Clone)]
struct Masker {
    redactor: Arc<Redactor>,
    /// Whether there is any secret to mask: none, and every text is written as it is
    /// (the redactor would copy it unchanged).
    any: bool,
}

impl Masker {
    fn new(secrets: Vec<String>) -> Masker {
        let any = secrets.iter().any(|s| !s.is_empty());
        Masker {
            redactor: Arc::new(Redactor::new(secrets, RedactLimits::default())),
            any,
        }
    }

    /// `s` masked, borrowed when there is nothing to mask.
    fn m<'a>(&self, s: &'a str) -> Cow<'a, str> {
        if self.any {
            Cow::Owned(self.redactor.mask(s))
        } else {
            Cow::Borrowed(s)
        }
    }

    fn mask(&self, s: &str) -> String {
        self.m(s).into_owned()
    }
}

/// A run being traced: its consumer observes the run's events.
pub(crate) struct RunSpan {
    tracing: RunTracing,
    /// What the consumer saw, once the run's events ended.
    end: tokio::sync::oneshot::Receiver<RunSpanEnd>,
    /// Hands the spans written over a moment after the first ([`flusher`]).
    flusher: Option<(Arc<Outbox>, tokio::task::JoinHandle<()>)>,
}

/// What the consumer saw of the run: its final status and the run span's events.
pub(crate) struct RunSpanEnd {
    events: Vec<Event>,
    status: Option<(RunStatus, Option<String>)>,
}

/// A time `ms` milliseconds after the epoch.
pub(crate) fn at_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

impl RunTracing {
    /// The watching of a run: its spans sent to `spans` (the exporter and the run's
    /// ids) when its trace is sampled, counted in `metrics`; `None` when neither is on
    /// (a run sampled out in a process without metrics is not watched at all).
    pub fn new(
        spans: Option<(Arc<Telemetry>, Arc<Traced>)>,
        metrics: Option<Arc<Metrics>>,
        info: RunInfo,
        secrets: &heddle_kernel::SecretRegistry,
    ) -> Option<RunTracing> {
        let spans = spans.filter(|(_, t)| t.run.sampled);
        if spans.is_none() && metrics.is_none() {
            return None;
        }
        Some(RunTracing {
            spans,
            metrics,
            info,
            history: Vec::new(),
            died: Vec::new(),
            died_until: SystemTime::now(),
            mask: Masker::new(secrets.snapshot()),
        })
    }

    /// The metrics it counts in, if any.
    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    /// Adds what `records` (the log before this process took the run) say to the run
    /// span, and the attempts the owner before died with.
    pub fn with_history(mut self, records: &[Stored]) -> RunTracing {
        self.history = history(records, &self.mask.redactor);
        self.died = heddle_store::died_attempts(records);
        if let Some(last) = records.last() {
            self.died_until = at_ms(last.at_ms);
        }
        self
    }

    /// Adds an event of this process's opening (its resume, its recovery, the gate
    /// answer it recorded) to the run span; its texts are masked.
    pub fn event(&mut self, name: &'static str, attributes: Vec<KeyValue>) {
        let attributes = attributes
            .into_iter()
            .map(|kv| match &kv.value {
                opentelemetry::Value::String(s) => {
                    KeyValue::new(kv.key, self.mask.mask(s.as_str()))
                }
                _ => kv,
            })
            .collect();
        self.history
            .push(Event::new(name, SystemTime::now(), attributes, 0));
    }

    /// Adds the answer this process records to a reconcile pause to the run span (as
    /// [`RunTracing::with_history`] adds those an earlier owner recorded).
    pub fn reconciled(&mut self, occurrence: &Occurrence, answer: ReconcileAnswer) {
        let attributes = reconciled_attributes(occurrence, answer, &self.mask.redactor);
        self.history
            .push(Event::new(RECONCILED, SystemTime::now(), attributes, 0));
    }

    /// Starts observing the events of `run` (not started yet: it sees every event).
    /// On the current tokio runtime.
    pub fn start(self, run: &heddle_kernel::Run) -> RunSpan {
        let types = run
            .plan()
            .nodes
            .iter()
            .map(|n| (n.id.clone(), n.node_type.clone()))
            .collect();
        let mut c = self.consumer(types, run.origin());
        for d in &self.died {
            c.died(d, self.died_until);
        }
        let flusher = c
            .outbox
            .clone()
            .map(|o| (o.clone(), tokio::spawn(flusher(o))));
        // What spans and metrics read: never an edge, an output or a log line.
        let mut kinds = Kinds::INVOCATION | Kinds::ESCALATION | Kinds::DECISION | Kinds::RUN;
        if c.spans.is_some() {
            kinds = kinds | Kinds::NODE;
        }
        let (tx, end) = tokio::sync::oneshot::channel();
        run.observe(
            kinds,
            Box::new(Observed {
                consumer: c,
                done: Some(tx),
            }),
        );
        RunSpan {
            tracing: self,
            end,
            flusher,
        }
    }

    /// The consumer of the run's events, for nodes of `types` (id to type).
    fn consumer(&self, types: HashMap<Arc<str>, Arc<str>>, origin: SystemTime) -> Consumer {
        // Each node's id and type masked once, not at each of its invocations.
        let masked = |s: &Arc<str>| match self.mask.m(s) {
            Cow::Borrowed(_) => s.clone(),
            Cow::Owned(m) => Arc::from(m),
        };
        let spans = self
            .spans
            .as_ref()
            .filter(|(_, t)| t.run.sampled)
            .map(|(tel, t)| (tel.clone(), t.run));
        let run_id = self.info.run_id.as_deref().map(|r| self.mask.mask(r));
        let nodes = types
            .iter()
            .map(|(id, ty)| {
                let mut names = NodeNames {
                    id: masked(id),
                    ty: masked(ty),
                    attrs: Vec::new(),
                };
                if spans.is_some() {
                    // The attributes each of its spans starts with, encoded once.
                    let mut a = Vec::new();
                    node_attrs(&mut Encoded(&mut a), run_id.as_deref(), Some(&names), "");
                    names.attrs = a;
                }
                (id.clone(), names)
            })
            .collect();
        let head = spans.as_ref().map_or_else(Vec::new, |(_, t)| {
            proto::head_template(t.trace_id.0, t.span.0, names::NODE, t.sampled)
        });
        Consumer {
            outbox: spans.as_ref().map(|(t, _)| {
                Arc::new(Outbox {
                    telemetry: t.clone(),
                    batch: Mutex::new(Batch::default()),
                    wake: tokio::sync::Notify::new(),
                    closed: AtomicBool::new(false),
                })
            }),
            spans,
            metrics: self.metrics.clone(),
            graph: self.mask.mask(&self.info.graph_name),
            run_id,
            origin: nanos(origin),
            nodes,
            head,
            mask: self.mask.clone(),
            pending: HashMap::new(),
            events: Vec::new(),
            status: None,
        }
    }

    /// Sends what is left to send of a durable run whose ending was recorded without a
    /// driver (a cancel or a rejected gate of a run nobody drove), read back from its
    /// whole log `records`, and counts its ending: the attempts an owner that died
    /// left (died), the nodes the ending skipped, and the run span with every event of
    /// the log (the rejection, the cancel). A log without an ending sends nothing.
    /// `types` are the run's node types by id (from its recorded plan).
    pub fn ended_in_log(self, records: &[Stored], types: HashMap<Arc<str>, Arc<str>>) {
        let Some(end) = records
            .iter()
            .rposition(|s| matches!(s.record, Record::Finished { .. }))
        else {
            return;
        };
        let Record::Finished { status, error } = &records[end].record else {
            return;
        };
        // The records written with the ending, in the same batch: a person's decision,
        // the cancel, the nodes it skipped. What is before is the run as its last owner
        // left it.
        let batch = records[..end]
            .iter()
            .rposition(|s| !ending_batch(&s.record))
            .map_or(0, |i| i + 1);
        let mut t = self.with_history(&records[..batch]);
        t.history = history(&records[..end], &t.mask.redactor);
        let mut c = t.consumer(types, SystemTime::now());
        for d in &t.died {
            c.died(d, t.died_until);
        }
        for s in &records[batch..end] {
            if let Record::Skipped { node, reason } = &s.record {
                c.skipped(node, Some(reason), at_ms(s.at_ms));
            }
        }
        c.end();
        t.send(RunSpanEnd {
            events: Vec::new(),
            status: Some((*status, error.clone())),
        });
    }

    /// Sends the span of a run that never started (refused, or cancelled before its
    /// turn), with `status` and `error`.
    pub fn unrun(self, status: RunStatus, error: Option<String>) {
        self.send(RunSpanEnd {
            events: Vec::new(),
            status: Some((status, error)),
        });
    }

    /// Counts a durable run that stopped resumable (paused): its span waits for the
    /// process that ends it.
    pub fn paused(self) {
        if let Some(m) = &self.metrics {
            m.runs_ended.with_label_values(&["paused"]).inc();
        }
    }

    /// Sends the run span, ended now, and counts the run's ending.
    fn send(self, end: RunSpanEnd) {
        if let (Some(m), Some((status, _))) = (&self.metrics, &end.status) {
            m.runs_ended.with_label_values(&[status.as_str()]).inc();
        }
        let Some((telemetry, traced)) = self.spans.as_ref().filter(|(_, t)| t.run.sampled) else {
            return;
        };
        let m = |s: &str| self.mask.mask(s);
        let mut attributes = vec![
            KeyValue::new(names::GRAPH_NAME, m(&self.info.graph_name)),
            KeyValue::new(names::RUN_DURABLE, self.info.run_id.is_some()),
        ];
        if let Some(id) = &self.info.run_id {
            attributes.push(KeyValue::new(names::RUN_ID, m(id)));
        }
        if let Some(d) = &self.info.graph_digest {
            attributes.push(KeyValue::new(names::GRAPH_DIGEST, d.clone()));
        }
        let mut error = None;
        if let Some((s, e)) = &end.status {
            attributes.push(KeyValue::new(names::RUN_OUTCOME, s.as_str()));
            if let Some(e) = e {
                error = Some(m(e));
            } else if *s == RunStatus::Failed {
                error = Some("failed".into());
            }
        }
        let mut events: Vec<Event> = self.history.into_iter().chain(end.events).collect();
        events.sort_by_key(|e| e.timestamp);
        let trace = traced.run;
        let span = Held {
            span_id: trace.span,
            start: self.info.created,
            end: SystemTime::now(),
            attributes,
            events,
            error,
        };
        let mut batch = Vec::new();
        span.write(&trace, trace.parent, names::RUN, &mut batch);
        telemetry.send(batch, 1);
    }
}

impl RunSpan {
    /// Waits for the consumer (the run's events have ended: the run did) and keeps
    /// what it saw until the ending is known.
    pub async fn finish(self) -> (RunTracing, RunSpanEnd) {
        let end = match self.end.await {
            Ok(end) => end,
            // It panicked (a bug): the run span goes without what it saw.
            Err(_) => RunSpanEnd {
                events: Vec::new(),
                status: None,
            },
        };
        if let Some((outbox, f)) = self.flusher {
            // Closed by the consumer's end already, unless that panicked. The flusher
            // holds the exporter: it is gone before this returns, so that dropping the
            // process's last handle on the exporter (which waits for its last spans)
            // is never left to a task a process that exits does not drop.
            outbox.close();
            let _ = f.await;
        }
        (self.tracing, end)
    }
}

impl RunTracing {
    /// Sends the run span of a run that ended with `status` (`None`: with what the
    /// kernel reported), `error` over the kernel's.
    pub fn ended(self, mut end: RunSpanEnd, status: Option<(RunStatus, Option<String>)>) {
        if status.is_some() {
            end.status = status;
        }
        self.send(end);
    }
}

/// Whether `record` is one a cancel or a rejection of a run nobody drives writes with
/// its ending ([`heddle_store::session::end_cancelled`]): a person's decision, the
/// cancel, a node skipped.
fn ending_batch(record: &Record) -> bool {
    matches!(
        record,
        Record::Skipped { .. }
            | Record::CancelRequested
            | Record::Verdict {
                decided_by: Decider::User,
                ..
            }
    )
}

/// The run span's events in `records`.
fn history(records: &[Stored], r: &Redactor) -> Vec<Event> {
    records
        .iter()
        .filter_map(|s| {
            let (name, attributes) = match &s.record {
                Record::Opened {
                    reason: OpenReason::Recover,
                    epoch,
                    pid,
                    ..
                } => (
                    "heddle.run.recovered",
                    vec![
                        KeyValue::new("heddle.run.epoch", *epoch as i64),
                        KeyValue::new("process.pid", i64::from(*pid)),
                    ],
                ),
                Record::Opened {
                    reason: OpenReason::Resume,
                    epoch,
                    pid,
                    ..
                } => (
                    "heddle.run.resumed",
                    vec![
                        KeyValue::new("heddle.run.epoch", *epoch as i64),
                        KeyValue::new("process.pid", i64::from(*pid)),
                    ],
                ),
                Record::Paused { pause } => {
                    ("heddle.run.paused", pause_attributes(pause, r, s.seq))
                }
                Record::Verdict {
                    occurrence,
                    verdict,
                    decided_by: Decider::User,
                } => {
                    let name = match verdict.action {
                        RecordedAction::Approve => "heddle.gate.approved",
                        RecordedAction::Reject => "heddle.gate.rejected",
                        _ => return None,
                    };
                    let mut a = vec![KeyValue::new(names::NODE_ID, r.mask(&occurrence.node))];
                    if let Some(n) = verdict.note.as_deref().filter(|n| !n.is_empty()) {
                        a.push(KeyValue::new("heddle.gate.note", r.mask(n)));
                    }
                    (name, a)
                }
                Record::Reconciled {
                    occurrence, answer, ..
                } => (RECONCILED, reconciled_attributes(occurrence, *answer, r)),
                Record::CancelRequested => ("heddle.run.cancel_requested", Vec::new()),
                _ => return None,
            };
            Some(Event::new(name, at_ms(s.at_ms), attributes, 0))
        })
        .collect()
}

/// The run span's event for a person's answer to a reconcile pause.
const RECONCILED: &str = "heddle.run.reconciled";

/// What [`RECONCILED`] says: the invocation answered for and the answer.
fn reconciled_attributes(
    occurrence: &Occurrence,
    answer: ReconcileAnswer,
    r: &Redactor,
) -> Vec<KeyValue> {
    let answer = match answer {
        ReconcileAnswer::Completed => "completed",
        ReconcileAnswer::Skipped => "skipped",
    };
    vec![
        KeyValue::new(names::NODE_ID, r.mask(&occurrence.node)),
        KeyValue::new(names::KEY, r.mask(&occurrence.key)),
        KeyValue::new("heddle.reconcile.answer", answer),
    ]
}

fn pause_attributes(pause: &PauseReason, r: &Redactor, seq: u64) -> Vec<KeyValue> {
    let mut a = vec![KeyValue::new("heddle.pause.event", seq as i64)];
    match pause {
        PauseReason::Interrupted => a.push(KeyValue::new("heddle.pause.reason", "interrupted")),
        PauseReason::Reconcile { occurrence } => {
            a.push(KeyValue::new("heddle.pause.reason", "reconcile"));
            a.push(KeyValue::new(names::NODE_ID, r.mask(&occurrence.node)));
            a.push(KeyValue::new(names::KEY, r.mask(&occurrence.key)));
        }
        PauseReason::Suspend { node, reason } => {
            a.push(KeyValue::new("heddle.pause.reason", "suspend"));
            a.push(KeyValue::new(names::NODE_ID, r.mask(node)));
            a.push(KeyValue::new("heddle.pause.detail", r.mask(reason)));
        }
        PauseReason::Budget { detail } => {
            a.push(KeyValue::new("heddle.pause.reason", "budget"));
            a.push(KeyValue::new("heddle.pause.detail", r.mask(detail)));
        }
    }
    a
}

/// A span kept as parts until it is sent: a run span, or a node span of the rarer
/// kinds (a failed attempt waiting for its escalation and verdict, a skipped node, a
/// died attempt). Its name and parent are given when it is written.
struct Held {
    span_id: SpanId,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
    events: Vec<Event>,
    /// Its status: an error, with this message; `None`: unset.
    error: Option<String>,
}

impl Held {
    /// Appends the span, named `name` under `parent` in `trace`, to `batch`.
    fn write(&self, trace: &RunTrace, parent: Option<SpanId>, name: &str, batch: &mut Vec<u8>) {
        let mut w = SpanWriter::new(
            batch,
            &Head {
                trace_id: trace.trace_id.0,
                span_id: self.span_id.0,
                parent: parent.map(|p| p.0),
                // The run span's parent is the caller's (remote); a node span's is the
                // run span.
                remote_parent: parent.is_some() && name == names::RUN,
                sampled: trace.sampled,
                name,
                start: self.start,
                end: self.end,
            },
        );
        for kv in &self.attributes {
            proto::with_value(&kv.value, |v| w.attr(kv.key.as_str(), v));
        }
        for e in &self.events {
            w.event(e);
        }
        if let Some(e) = &self.error {
            w.status(proto::STATUS_ERROR, e);
        }
        w.finish();
    }
}

/// Where a span's attributes go: written straight into its encoding, or kept as
/// parts ([`Held`]); the same code says what they are either way.
trait Attrs {
    fn put(&mut self, key: &'static str, value: Attr<'_>);
}

impl Attrs for SpanWriter<'_> {
    fn put(&mut self, key: &'static str, value: Attr<'_>) {
        self.attr(key, value);
    }
}

/// Attributes encoded as a span's (field 9) into a buffer, to be
/// [`SpanWriter::raw`]-appended to many spans.
struct Encoded<'a>(&'a mut Vec<u8>);

impl Attrs for Encoded<'_> {
    fn put(&mut self, key: &'static str, value: Attr<'_>) {
        proto::attribute(self.0, 9, key, value);
    }
}

/// The attributes every node span has: run, node id and type (`node`: its masked
/// names; else `id`, masked, is all there is).
fn node_attrs(a: &mut impl Attrs, run_id: Option<&str>, node: Option<&NodeNames>, id: &str) {
    if let Some(r) = run_id {
        a.put(names::RUN_ID, Attr::Str(r));
    }
    match node {
        Some(n) => {
            a.put(names::NODE_ID, Attr::Str(&n.id));
            a.put(names::NODE_TYPE, Attr::Str(&n.ty));
        }
        None => a.put(names::NODE_ID, Attr::Str(id)),
    }
}

impl Attrs for Vec<KeyValue> {
    fn put(&mut self, key: &'static str, value: Attr<'_>) {
        self.push(match value {
            Attr::Str(s) => KeyValue::new(key, s.to_string()),
            Attr::Int(i) => KeyValue::new(key, i),
            Attr::Bool(b) => KeyValue::new(key, b),
            Attr::F64(f) => KeyValue::new(key, f),
        });
    }
}

/// A node's id and type as its spans and labels carry them (masked).
struct NodeNames {
    id: Arc<str>,
    ty: Arc<str>,
    /// The attributes each of its spans starts with ([`node_attrs`]), encoded (spans
    /// only).
    attrs: Vec<u8>,
}

/// Spans a run's batch holds at most: it is handed to the exporter at this many, else
/// [`FLUSH`] after its first span.
const HAND_OVER: usize = 256;

/// How long a span waits in its run's batch, at most, before the flusher hands the
/// batch over (the exporter gathers its requests over 200 ms anyway).
const FLUSH: Duration = Duration::from_millis(5);

/// Spans a run's consumer wrote and has not handed to the exporter yet: written by
/// the consumer as the run's events are published, handed over by it once there are
/// [`HAND_OVER`], or by the run's [`flusher`] a moment after the first (a run that
/// ends or goes quiet does not keep its last spans).
struct Outbox {
    telemetry: Arc<Telemetry>,
    batch: Mutex<Batch>,
    /// Told when a span joins an empty batch, and when the consumer ended.
    wake: tokio::sync::Notify,
    /// The consumer ended (it handed over its last spans): the flusher stops.
    closed: AtomicBool,
}

#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    spans: usize,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one span that `write` writes at the end of the batch.
    fn write(&self, write: impl FnOnce(&mut Vec<u8>)) {
        let mut b = self.lock();
        write(&mut b.bytes);
        b.spans += 1;
        if b.spans >= HAND_OVER {
            self.hand_over_locked(&mut b);
        } else if b.spans == 1 {
            self.wake.notify_one();
        }
    }

    fn hand_over(&self) {
        let mut b = self.lock();
        self.hand_over_locked(&mut b);
    }

    fn hand_over_locked(&self, b: &mut Batch) {
        if b.spans == 0 {
            return;
        }
        let room = b.bytes.len();
        let bytes = std::mem::replace(&mut b.bytes, Vec::with_capacity(room));
        self.telemetry.send(bytes, b.spans);
        b.spans = 0;
    }

    /// The consumer ended: hands over what is left and stops the flusher.
    fn close(&self) {
        self.hand_over();
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// Hands a run's batch over [`FLUSH`] after a span joined it empty, until the run's
/// consumer ended.
async fn flusher(out: Arc<Outbox>) {
    loop {
        out.wake.notified().await;
        if out.closed.load(Ordering::Acquire) {
            return;
        }
        tokio::time::sleep(FLUSH).await;
        out.hand_over();
    }
}

/// The consumer as the run's bus holds it: fed every event of the kinds it asked for,
/// it says what it saw once the bus closes (or is dropped with its run).
struct Observed {
    consumer: Consumer,
    done: Option<tokio::sync::oneshot::Sender<RunSpanEnd>>,
}

impl Observed {
    fn end(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(self.consumer.end());
        }
    }
}

impl Observer for Observed {
    fn event(&mut self, e: EventRef<'_>) {
        let at = self
            .consumer
            .origin
            .saturating_add(e.at_us.saturating_mul(1000));
        self.consumer.on(e.kind, at);
    }

    fn closed(&mut self) {
        self.end();
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        // A run dropped unfinished, or this consumer's own bug: what it has is sent.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.end()));
    }
}

/// Reads a run's events and sends its node spans as they end.
struct Consumer {
    /// Where spans go and the run's trace; `None`: nothing is sent (no exporter, or
    /// the caller's trace is not sampled).
    spans: Option<(Arc<Telemetry>, RunTrace)>,
    /// The spans written, until handed over (spans only).
    outbox: Option<Arc<Outbox>>,
    metrics: Option<Arc<Metrics>>,
    /// The graph's name, masked (a label, when asked for).
    graph: String,
    /// Masked.
    run_id: Option<String>,
    /// When the run's event clock started, in nanoseconds since the epoch.
    origin: u64,
    /// By node id.
    nodes: HashMap<Arc<str>, NodeNames>,
    /// What every node span of the run has alike, encoded ([`proto::head_template`]).
    head: Vec<u8>,
    mask: Masker,
    /// Failed attempts' spans held for the escalation and verdict that may follow, by
    /// node: sent once decided, or when the node moves on.
    pending: HashMap<String, Vec<Pending>>,
    /// The run span's events seen in the stream.
    events: Vec<Event>,
    status: Option<(RunStatus, Option<String>)>,
}

/// The time `ns` nanoseconds after the epoch.
fn time_ns(ns: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)
}

struct Pending {
    key: String,
    span: Held,
    escalated: bool,
}

impl Consumer {
    /// The run's events ended: sends the spans still held and hands over the batch;
    /// what it saw of the run.
    fn end(&mut self) -> RunSpanEnd {
        let pending: Vec<Pending> = self.pending.drain().flat_map(|(_, v)| v).collect();
        for p in pending {
            self.send(p.span);
        }
        if let Some(o) = &self.outbox {
            o.close();
        }
        RunSpanEnd {
            events: std::mem::take(&mut self.events),
            status: self.status.take(),
        }
    }

    fn m<'a>(&self, s: &'a str) -> Cow<'a, str> {
        self.mask.m(s)
    }

    /// Writes a node span kept as parts into the batch.
    fn send(&mut self, span: Held) {
        if let (Some((_, trace)), Some(out)) = (&self.spans, &self.outbox) {
            out.write(|batch| span.write(trace, Some(trace.span), names::NODE, batch));
        }
    }

    /// A span id of this process's (spans only).
    fn new_span_id(&self) -> SpanId {
        self.spans
            .as_ref()
            .map_or(SpanId([1; 8]), |(t, _)| t.span_id())
    }

    /// Counts what `kind` says in the metrics.
    fn count(&self, kind: &EventKind) {
        let Some(m) = &self.metrics else { return };
        match kind {
            EventKind::Invocation {
                node_id,
                metrics,
                error,
                timed_out,
                ..
            } => {
                let wall = Duration::from_micros(metrics.wall_us);
                let outcome = outcome(error.is_some(), *timed_out);
                if metrics.http_requests > 0 {
                    m.http(metrics.http_requests, metrics.http_bytes);
                }
                if m.labelled() {
                    let masked;
                    let (node, ty) = match self.nodes.get(node_id.as_str()) {
                        Some(n) => (&*n.id, &*n.ty),
                        None => {
                            masked = self.m(node_id);
                            (&*masked, "")
                        }
                    };
                    let values = m.label_values(node, ty, &self.graph);
                    m.invocation(outcome, wall, &values);
                } else {
                    m.invocation(outcome, wall, &[]);
                }
            }
            EventKind::Escalation { escalation, .. } => {
                let kind = escalation
                    .pointer("/failure/kind")
                    .and_then(|k| k.as_str())
                    .unwrap_or("unknown");
                m.escalation(kind);
            }
            EventKind::Decision {
                verdict,
                decided_by,
                ..
            } => {
                let action = verdict
                    .get("action")
                    .and_then(|v| v.as_str())
                    .unwrap_or("unknown");
                m.verdict(action, decided_by);
            }
            _ => {}
        }
    }

    /// The attributes every node span has: run, node id and type.
    fn base(&self, node: &str, a: &mut impl Attrs) {
        match self.nodes.get(node) {
            Some(n) => node_attrs(a, self.run_id.as_deref(), Some(n), ""),
            None => node_attrs(a, self.run_id.as_deref(), None, &self.m(node)),
        }
    }

    /// The attributes of an invocation attempt's span after [`Consumer::base`]'s;
    /// `error` is masked.
    #[allow(clippy::too_many_arguments)] // the parts of one invocation event, borrowed
    fn invocation(
        &self,
        a: &mut impl Attrs,
        key: &str,
        metrics: &heddle_core::InvocationMetrics,
        error: Option<&str>,
        attempt: u32,
        timed_out: bool,
        signature: Option<&str>,
    ) {
        a.put(names::ATTEMPT, Attr::Int(i64::from(attempt)));
        a.put(names::KEY, Attr::Str(&self.m(key)));
        if let Some(f) = metrics.fuel {
            a.put(names::FUEL, Attr::Int(f as i64));
        }
        if let Some(b) = metrics.peak_memory_bytes {
            a.put(names::MEMORY, Attr::Int(b as i64));
        }
        if metrics.cost_reports > 0 {
            a.put(names::COST, Attr::F64(metrics.cost_usd));
        }
        a.put(
            names::OUTCOME,
            Attr::Str(outcome(error.is_some(), timed_out)),
        );
        if let Some(s) = signature {
            a.put(names::SIGNATURE, Attr::Str(&self.m(s)));
        }
        if let Some(e) = error {
            a.put(names::ERROR, Attr::Str(e));
        }
    }

    /// Reads one event, published at `at_ns` (nanoseconds since the epoch).
    fn on(&mut self, kind: &EventKind, at_ns: u64) {
        self.count(kind);
        let at = time_ns(at_ns);
        if self.spans.is_none() {
            if let EventKind::Run { status, error } = kind
                && *status != RunStatus::Running
            {
                self.status = Some((*status, error.clone()));
            }
            return;
        }
        match kind {
            EventKind::Invocation {
                node_id,
                key,
                metrics,
                error,
                attempt,
                timed_out,
                signature,
                span_id,
            } => {
                if !self.pending.is_empty() {
                    self.flush(node_id, Some(key));
                }
                let span_id = span_id.unwrap_or_else(|| self.new_span_id());
                let start_ns = at_ns.saturating_sub(metrics.wall_us.saturating_mul(1000));
                let signature = signature.as_deref();
                let Some(error) = error else {
                    // The common case: written straight into the batch, from what every
                    // span of the run and of the node has alike.
                    let Some(out) = &self.outbox else { return };
                    out.write(|batch| {
                        let mut w =
                            SpanWriter::templated(batch, &self.head, span_id.0, start_ns, at_ns);
                        match self.nodes.get(node_id.as_str()) {
                            Some(n) => w.raw(&n.attrs),
                            None => self.base(node_id, &mut w),
                        }
                        self.invocation(
                            &mut w, key, metrics, None, *attempt, *timed_out, signature,
                        );
                        w.finish();
                    });
                    return;
                };
                let error = self.mask.mask(error);
                let mut attributes = Vec::with_capacity(12);
                self.base(node_id, &mut attributes);
                self.invocation(
                    &mut attributes,
                    key,
                    metrics,
                    Some(&error),
                    *attempt,
                    *timed_out,
                    signature,
                );
                let span = Held {
                    span_id,
                    start: time_ns(start_ns),
                    end: at,
                    attributes,
                    events: Vec::new(),
                    error: Some(error),
                };
                self.pending
                    .entry(node_id.clone())
                    .or_default()
                    .push(Pending {
                        key: key.clone(),
                        span,
                        escalated: false,
                    });
            }
            EventKind::Escalation {
                node_id,
                escalation,
            } => {
                let key = escalation
                    .get("invocation_key")
                    .and_then(|k| k.as_str())
                    .unwrap_or("");
                let mut a = Vec::new();
                if let Some(sig) = escalation.get("failure_signature").and_then(|s| s.as_str()) {
                    a.push(KeyValue::new(names::SIGNATURE, self.mask.mask(sig)));
                }
                if let Some(allowed) = escalation.get("allowed_actions") {
                    a.push(KeyValue::new(
                        "heddle.escalation.allowed",
                        self.mask.mask(&allowed.to_string()),
                    ));
                }
                let event = Event::new("heddle.escalation", at, a, 0);
                match self
                    .pending
                    .get_mut(node_id)
                    .and_then(|v| v.iter_mut().rev().find(|p| p.key == key))
                {
                    Some(p) => {
                        p.escalated = true;
                        p.span.events.push(event);
                    }
                    None => self.run_event(node_id, event),
                }
            }
            EventKind::Decision {
                node_id,
                verdict,
                decided_by,
                cost_usd,
            } => {
                let mut a = vec![KeyValue::new(
                    "heddle.decided_by",
                    self.mask.mask(decided_by),
                )];
                if let Some(action) = verdict.get("action").and_then(|v| v.as_str()) {
                    a.push(KeyValue::new("heddle.verdict", action.to_string()));
                }
                if let Some(reason) = verdict.get("reason").and_then(|v| v.as_str()) {
                    a.push(KeyValue::new(
                        "heddle.verdict.reason",
                        self.mask.mask(reason),
                    ));
                }
                if *cost_usd > 0.0 {
                    a.push(KeyValue::new("heddle.decision.cost_usd", *cost_usd));
                }
                let event = Event::new("heddle.verdict", at, a, 0);
                let decided = self.pending.get_mut(node_id).and_then(|v| {
                    let i = v.iter().rposition(|p| p.escalated)?;
                    Some(v.remove(i))
                });
                match decided {
                    Some(mut p) => {
                        p.span.events.push(event);
                        self.send(p.span);
                    }
                    None => self.run_event(node_id, event),
                }
            }
            EventKind::Node {
                node_id,
                status,
                skip_reason,
                ..
            } => match status {
                NodeStatus::Running | NodeStatus::Warning => {}
                NodeStatus::Suspended => {
                    self.flush(node_id, None);
                    let event = Event::new("heddle.node.suspended", at, Vec::new(), 0);
                    self.run_event(node_id, event);
                }
                NodeStatus::Completed | NodeStatus::Failed => self.flush(node_id, None),
                // A durable run that suspended is paused, not over: what it has not run
                // yet may run once it is resumed, or is reported skipped (with why) by
                // the process that ends it.
                NodeStatus::Skipped
                    if self.run_id.is_some() && *skip_reason == Some(SkipReason::Suspended) =>
                {
                    self.flush(node_id, None)
                }
                NodeStatus::Skipped => {
                    self.flush(node_id, None);
                    self.skipped(node_id, skip_reason.as_ref(), at);
                }
            },
            EventKind::Run { status, error } if *status != RunStatus::Running => {
                self.status = Some((*status, error.clone()));
            }
            _ => {}
        }
    }

    /// Sends the held spans of `node` (those at `key` only, when given).
    fn flush(&mut self, node: &str, key: Option<&str>) {
        let Some(held) = self.pending.remove(node) else {
            return;
        };
        let mut keep = Vec::new();
        for p in held {
            if key.is_none_or(|k| k == p.key) {
                self.send(p.span);
            } else {
                keep.push(p);
            }
        }
        if !keep.is_empty() {
            self.pending.insert(node.to_string(), keep);
        }
    }

    /// An event about `node` on the run span.
    fn run_event(&mut self, node: &str, mut event: Event) {
        event
            .attributes
            .push(KeyValue::new(names::NODE_ID, self.mask.mask(node)));
        self.events.push(event);
    }

    /// The span of a node that never ran, at `at`, with why.
    fn skipped(&mut self, node: &str, reason: Option<&SkipReason>, at: SystemTime) {
        if self.spans.is_none() {
            return;
        }
        let mut a = Vec::new();
        self.base(node, &mut a);
        a.push(KeyValue::new(names::OUTCOME, "skipped"));
        if let Some(r) = reason {
            let r = serde_json::to_value(r).unwrap_or_default();
            a.push(KeyValue::new(
                names::SKIP_REASON,
                r.as_str().unwrap_or_default().to_string(),
            ));
        }
        let span = Held {
            span_id: self.new_span_id(),
            start: at,
            end: at,
            attributes: a,
            events: Vec::new(),
            error: None,
        };
        self.send(span);
    }

    /// The span of an attempt the previous owner died with: from its recorded start to
    /// the last thing its owner recorded.
    fn died(&mut self, d: &DiedAttempt, until: SystemTime) {
        if self.spans.is_none() {
            return;
        }
        let occ = &d.occurrence;
        let mut a = Vec::new();
        self.base(&occ.node, &mut a);
        a.push(KeyValue::new(names::ATTEMPT, i64::from(d.attempt)));
        a.push(KeyValue::new(names::KEY, self.mask.mask(&occ.key)));
        a.push(KeyValue::new(names::OUTCOME, "died"));
        let why = "the process running this attempt died before it ended";
        a.push(KeyValue::new(names::ERROR, why));
        let span = Held {
            span_id: self.new_span_id(),
            start: at_ms(d.started_at_ms),
            end: until,
            attributes: a,
            events: Vec::new(),
            error: Some(why.to_string()),
        };
        self.send(span);
    }
}

/// An attempt's outcome, as spans and metrics name it.
fn outcome(failed: bool, timed_out: bool) -> &'static str {
    match (failed, timed_out) {
        (false, _) => "ok",
        (true, true) => "timed_out",
        (true, false) => "error",
    }
}
