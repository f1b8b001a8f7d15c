//! The executor seam: the one trait that native built-ins, WASM nodes and code nodes all
//! implement, and the context an invocation runs in.
//!
//! Arguments are owned (`Call`, `NodeCtx`, `InputStream`) rather than borrowed from the
//! actor, because a WASM executor moves them into a wasmtime `Store` and a code runner
//! into a container task; neither can hold a borrow of the actor across its own awaits.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use heddle_core::trace::{SpanId, TraceParent, Traced};
use heddle_core::{ConfigProblem, EventKind, InvocationMetrics, LogLevel, NodeDecl, Value};
use smallvec::SmallVec;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The future an [`Executor`] returns: boxed, so the trait stays object safe (the kernel
/// holds every node's executor as `Arc<dyn Executor>`), and `Send`, so an invocation may
/// run on any worker thread.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Input values of one invocation, by input handle name. Properties with no edge are
/// included, so a node reads configuration and inputs the same way (edge values win).
pub type Inputs = BTreeMap<String, Value>;

/// Output values of one invocation: `(handle, value)` pairs, at most one per handle for
/// one-shot nodes. Handles a node leaves out stay silent for that invocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs(pub SmallVec<[(Arc<str>, Value); 2]>);

impl Outputs {
    /// No outputs: every handle stays silent for this invocation.
    pub fn new() -> Self {
        Outputs(SmallVec::new())
    }

    /// The single output `handle` = `v`, the commonest answer.
    pub fn one(handle: impl Into<Arc<str>>, v: Value) -> Self {
        let mut o = Outputs::new();
        o.push(handle, v);
        o
    }

    /// Adds `v` on `handle`, after what is there (a streaming node's final outputs may
    /// hold several values per handle, routed in this order).
    pub fn push(&mut self, handle: impl Into<Arc<str>>, v: Value) {
        self.0.push((handle.into(), v));
    }

    /// Becomes the single output `handle` = `v`. Outputs that already are one value on
    /// that very handle keep their handle: a node answering on the same output every
    /// time then touches no reference count (see [`Executor::invoke_now_into`]).
    pub fn set_one(&mut self, handle: &Arc<str>, v: Value) {
        match self.0.as_mut_slice() {
            [(h, slot)] if Arc::ptr_eq(h, handle) => *slot = v,
            _ => {
                self.0.clear();
                self.0.push((handle.clone(), v));
            }
        }
    }

    /// The first value on `handle`, if the invocation produced one.
    pub fn get(&self, handle: &str) -> Option<&Value> {
        self.0.iter().find(|(h, _)| &**h == handle).map(|(_, v)| v)
    }

    /// Whether the invocation produced nothing at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every `(handle, value)`, in the order they are routed.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(h, v)| (&**h, v))
    }

    /// Only the last value of each handle (in the order of those last values): what
    /// [`Outputs::to_map`] keeps, without the values before it (a foreach's outputs
    /// carry every item, which its `completed` event would hold until the run's end).
    pub(crate) fn into_last_per_handle(self) -> Outputs {
        if self.0.len() <= 1 {
            return self;
        }
        let mut last: SmallVec<[(Arc<str>, Value); 2]> = SmallVec::new();
        for (h, v) in self.0.into_iter().rev() {
            if !last.iter().any(|(k, _)| Arc::ptr_eq(k, &h) || **k == *h) {
                last.push((h, v));
            }
        }
        last.reverse();
        Outputs(last)
    }

    /// By handle, the last value of each (as a node's `completed` event shows it).
    /// Walked from the end, so each handle is copied once however many values it has: a
    /// foreach over n items has two handles, not 2n values to copy and overwrite.
    pub fn to_map(&self) -> BTreeMap<String, Value> {
        let mut map = BTreeMap::new();
        for (h, v) in self.0.iter().rev() {
            if !map.contains_key(&**h) {
                map.insert(String::from(&**h), v.clone());
            }
        }
        map
    }
}

impl FromIterator<(String, Value)> for Outputs {
    fn from_iter<T: IntoIterator<Item = (String, Value)>>(iter: T) -> Self {
        Outputs(iter.into_iter().map(|(h, v)| (Arc::from(h), v)).collect())
    }
}

/// What went wrong in an invocation. Guest errors come from node code; the `Host*`
/// kinds are produced only by the host (a guest cannot claim to have run out of fuel).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    /// The class of failure: it decides whether the invocation may be retried or
    /// escalated, and the family of its failure signature.
    pub kind: ErrorKind,
    /// What went wrong, for the user (masked for secrets before it is shown).
    pub message: String,
    /// Stable failure signature (e.g. `http:429`, `trap:out-of-fuel`), used by the
    /// supervisor to recognise repeated failures. A plain error has none.
    pub signature: Option<String>,
    /// The malformed output the node produced, which a supervisor may repair.
    pub candidate: Option<Outputs>,
}

/// The class of an invocation's failure (see [`NodeError`]). The supervisor sees it as
/// [`heddle_core::supervise::FailureKind`].
#[derive(Clone, Debug, PartialEq)]
pub enum ErrorKind {
    /// The node's own code reported an error.
    Node,
    /// The invocation exceeded its fuel budget.
    FuelExhausted,
    /// The invocation exceeded its wall-clock deadline.
    Deadline,
    /// The invocation hit its memory limit.
    MemoryLimit,
    /// An output value was larger than allowed.
    OutputTooLarge,
    /// The guest trapped (panic, unreachable, bad memory access); `trap` names the kind.
    Trap {
        /// The kind of trap, as wasmtime names it.
        trap: String,
    },
    /// The run was cancelled while the invocation was in flight.
    Cancelled,
    /// The node asks to suspend the run (human-in-the-loop); not a failure.
    Suspend {
        /// What the run waits for, in words for the person who must act.
        reason: String,
        /// What the node hands over to whoever resumes it (a gate's pending value).
        state: Value,
    },
    /// A fault in the host machinery around the node (container engine down, I/O error).
    Host,
    /// A value did not fit the declared type of the input it arrived on; the kernel
    /// checked it before the invocation, which did not run (signature `input:type`).
    Input,
    /// An assertion about the graph's data did not hold (`heddle.check`): not a failure
    /// to repair but the graph's own verdict on its data, so it fails the node (and the
    /// run) without escalation or retry, like a routing or edge-rule failure. The same
    /// data would fail the same assertion again, and a supervisor's skip would wave
    /// through exactly what the author asked to stop.
    Assertion,
}

impl NodeError {
    /// An error of `kind` with no signature and no candidate output.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        NodeError {
            kind,
            message: message.into(),
            signature: None,
            candidate: None,
        }
    }

    /// A plain error from node code.
    pub fn msg(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Node, message)
    }

    /// A fault of the host machinery, not of the node ([`ErrorKind::Host`]).
    pub fn host(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Host, message)
    }

    /// What an invocation returns when the run was cancelled under it: not a failure
    /// of the node, and never escalated.
    pub fn cancelled() -> Self {
        Self::new(ErrorKind::Cancelled, "cancelled")
    }

    /// Asks the kernel to suspend the run at this node (a gate waiting for approval),
    /// handing over `state` for whoever resumes it.
    pub fn suspend(reason: impl Into<String>, state: Value) -> Self {
        let reason = reason.into();
        Self::new(
            ErrorKind::Suspend {
                reason: reason.clone(),
                state,
            },
            format!("suspended: {reason}"),
        )
    }

    /// The error with a failure signature (`family:code`), what policy rules and sticky
    /// verdicts match on.
    pub fn with_signature(mut self, sig: impl Into<String>) -> Self {
        self.signature = Some(sig.into());
        self
    }

    /// The error with the malformed output the node produced, shown to a supervisor
    /// that may repair it.
    pub fn with_candidate(mut self, candidate: Outputs) -> Self {
        self.candidate = Some(candidate);
        self
    }

    /// Whether this is a request to suspend rather than a failure.
    pub fn is_suspend(&self) -> bool {
        matches!(self.kind, ErrorKind::Suspend { .. })
    }

    /// The failure's signature as policy rules and reports name it: the host's for a
    /// failure it detected (`limit:deadline`), else the one the node declared, when it
    /// is valid.
    pub fn failure_signature(&self) -> Option<String> {
        heddle_core::supervise::signatures::signature(
            &crate::supervisor::failure_kind(&self.kind),
            self.signature.as_deref(),
        )
    }
}

/// Where a node's events go. The runtime's event bus implements it; executors never
/// see the bus itself.
pub trait EventSink: Send + Sync {
    /// Publishes `event` on the run's stream; the sink stamps its sequence number and
    /// time, so events from all nodes share one order.
    fn emit(&self, event: EventKind);
}

/// A value a streaming node emits while its invocation is still running.
#[derive(Debug)]
pub struct Emitted {
    /// The output handle it is emitted on.
    pub handle: Arc<str>,
    /// The value, routed downstream at once.
    pub value: Value,
}

/// Every secret value handed to a node during the run, so escalations and logs can mask
/// them wherever they appear.
#[derive(Default, Debug)]
pub struct SecretRegistry {
    values: Mutex<Vec<String>>,
    /// Set by the first registration: a run that knows no secret checks nothing (the
    /// check of every output value, [`SecretRegistry::holds`], costs one load).
    any: std::sync::atomic::AtomicBool,
}

impl SecretRegistry {
    /// Adds a secret value handed to a node (an empty one is ignored: it would match
    /// everywhere). From now on logs, errors and escalations mask it.
    pub fn register(&self, value: &str) {
        if value.is_empty() {
            return;
        }
        // A poisoned lock only means another thread panicked mid-push; the list is still valid.
        let mut v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        if !v.iter().any(|s| s == value) {
            v.push(value.to_string());
        }
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether `v` holds a registered secret value anywhere (see [`Value::holds_any`]).
    pub fn holds(&self, v: &Value) -> bool {
        if !self.any.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        v.holds_any(&self.values.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The values registered so far, to build a masking
    /// [`heddle_core::supervise::Redactor`] from.
    pub fn snapshot(&self) -> Vec<String> {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces every registered secret value in `text` with `«redacted»`.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in self.values.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "«redacted»");
            }
        }
        out
    }
}

/// A `run` event a controller's invocation sent: its target and property overrides.
pub(crate) type SentEvent = (Arc<str>, BTreeMap<String, Value>);

/// The context of one invocation (or one streaming-input run). Cheap to clone.
#[derive(Clone)]
pub struct NodeCtx {
    inner: Arc<CtxInner>,
}

struct CtxInner {
    node_id: Arc<str>,
    node_type: Arc<str>,
    key: Arc<str>,
    cancel: CancellationToken,
    deadline: Option<Instant>,
    events: Arc<dyn EventSink>,
    emit: Option<mpsc::Sender<Emitted>>,
    secrets: Arc<SecretRegistry>,
    metrics: Mutex<InvocationMetrics>,
    /// The run's trace and this attempt's span in it, when the run is traced.
    trace: Option<(Arc<Traced>, SpanId)>,
    /// The durable run's id, when the run is durable.
    run_id: Option<Arc<str>>,
    /// The controlled nodes this invocation may drive, when the node is a controller.
    controls: Option<crate::runtime::Controls>,
    /// The `run` events this invocation sent (target, properties), in order: a durable
    /// run records them with its result, so a recovery that carries the result out
    /// sends them again and the targets replay their recorded replies.
    sent: Mutex<Vec<SentEvent>>,
}

/// Parts the runtime supplies to build a [`NodeCtx`].
pub struct CtxParts {
    /// The node's id.
    pub node_id: Arc<str>,
    /// The node's type name.
    pub node_type: Arc<str>,
    /// The invocation's canonical lineage key (`""` at root scope).
    pub key: Arc<str>,
    /// Cancelled when the run is, or when this invocation's time is up.
    pub cancel: CancellationToken,
    /// When the invocation's time limit runs out, if it has one.
    pub deadline: Option<Instant>,
    /// Where the node's logs and events go.
    pub events: Arc<dyn EventSink>,
    /// Present for modes that may emit while running (streaming output and input).
    pub emit: Option<mpsc::Sender<Emitted>>,
    /// The run-wide registry of secret values, shared by every node of the run.
    pub secrets: Arc<SecretRegistry>,
}

impl NodeCtx {
    /// A context from its parts, with no usage measured yet.
    pub fn new(p: CtxParts) -> Self {
        NodeCtx {
            inner: Arc::new(CtxInner {
                node_id: p.node_id,
                node_type: p.node_type,
                key: p.key,
                cancel: p.cancel,
                deadline: p.deadline,
                events: p.events,
                emit: p.emit,
                secrets: p.secrets,
                metrics: Mutex::new(InvocationMetrics::default()),
                trace: None,
                run_id: None,
                controls: None,
                sent: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Runtime use: this context as the attempt whose span is `span` in `trace` (its
    /// [`NodeCtx::traceparent`]). Only on a context nobody else holds yet (a fresh one);
    /// otherwise it is left as it is.
    pub fn traced(mut self, trace: Arc<Traced>, span: SpanId) -> NodeCtx {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.trace = Some((trace, span));
        }
        self
    }

    /// Runtime use: this context as an invocation of the durable run `run` (its
    /// [`NodeCtx::run_id`]). Only on a context nobody else holds yet, like
    /// [`NodeCtx::traced`].
    pub fn in_run(mut self, run: Arc<str>) -> NodeCtx {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.run_id = Some(run);
        }
        self
    }

    /// Runtime use: this context as an invocation of a controller, which may drive the
    /// controlled nodes of `controls`. Only on a context nobody else holds yet, like
    /// [`NodeCtx::traced`].
    pub fn controlling(mut self, controls: crate::runtime::Controls) -> NodeCtx {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.controls = Some(controls);
        }
        self
    }

    /// The controlled nodes this invocation may drive (`None`: the node is wired to
    /// none by a control edge).
    pub fn controls(&self) -> Option<&crate::runtime::Controls> {
        self.inner.controls.as_ref()
    }

    /// Sends a `run` event with property overrides to the controlled node `target` and
    /// resolves once it is queued there; the reply resolves with that node's outputs.
    /// Events sent before any reply is awaited are in flight together and answered in
    /// the order sent. Fails, naming both nodes, when no control edge from this node
    /// reaches `target` or the target has no such property.
    pub async fn dispatch_control(
        &self,
        target: &str,
        properties: BTreeMap<String, Value>,
    ) -> Result<crate::runtime::ControlReply, NodeError> {
        let Some(controls) = &self.inner.controls else {
            return Err(NodeError::msg(format!(
                "node {} sent a control event to node {target}, but no control edge leaves it",
                self.inner.node_id
            ))
            .with_signature("control:target"));
        };
        let reply = controls.dispatch(target, properties.clone()).await?;
        self.inner
            .sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Arc::from(target), properties));
        // The event runs the target whatever becomes of this invocation: a retry of it
        // would run the target again, which only a retry-safe target allows.
        if !controls.retry_safe(target) {
            self.record_asset(format!("control:{target}"));
        }
        Ok(reply)
    }

    /// [`NodeCtx::dispatch_control`], then its reply: the target's outputs.
    pub async fn send_control(
        &self,
        target: &str,
        properties: BTreeMap<String, Value>,
    ) -> Result<Outputs, NodeError> {
        self.dispatch_control(target, properties)
            .await?
            .outputs()
            .await
    }

    /// Runtime use: the `run` events this invocation sent so far, taken (for its
    /// result record).
    pub(crate) fn take_sent(&self) -> Vec<SentEvent> {
        std::mem::take(&mut *self.inner.sent.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The durable run this invocation belongs to (`None` for a run kept in memory):
    /// what a node labels what it starts outside this process with (a container), so
    /// that whoever takes the run over after this process was killed can find it by the
    /// run and remove it.
    pub fn run_id(&self) -> Option<&str> {
        self.inner.run_id.as_deref()
    }

    /// Runtime use: re-arms this context for the node's next invocation (same node,
    /// same cancel token) when nobody else holds it any more. Returns false, changing
    /// nothing, when a clone is still alive (an executor kept it): the caller then builds
    /// a fresh one. Saves an allocation and a cancel-token clone per invocation on the
    /// hot path.
    pub fn try_rearm(
        &mut self,
        key: Arc<str>,
        deadline: Option<Instant>,
        emit: Option<mpsc::Sender<Emitted>>,
        span: Option<SpanId>,
    ) -> bool {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return false;
        };
        if let (Some((_, s)), Some(span)) = (&mut inner.trace, span) {
            *s = span;
        }
        inner.key = key;
        inner.deadline = deadline;
        inner.emit = emit;
        *inner.metrics.get_mut().unwrap_or_else(|e| e.into_inner()) = InvocationMetrics::default();
        inner
            .sent
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        true
    }

    /// The node's id in the graph.
    pub fn node_id(&self) -> &str {
        &self.inner.node_id
    }

    /// The node's type name.
    pub fn node_type(&self) -> &str {
        &self.inner.node_type
    }

    /// Canonical lineage key of this invocation (`""` at root scope).
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// This attempt's span, when the run is traced.
    pub fn span_id(&self) -> Option<SpanId> {
        self.inner.trace.as_ref().map(|(_, s)| *s)
    }

    /// The W3C `traceparent` of this attempt's span, when the run is traced: what a
    /// node that starts a process hands it (`TRACEPARENT`), so the spans that process
    /// makes join the run's trace under this attempt.
    pub fn traceparent(&self) -> Option<TraceParent> {
        self.inner.trace.as_ref().map(|(t, s)| t.traceparent(*s))
    }

    /// Whether the run was cancelled or the deadline passed: a long-running executor
    /// checks it between steps and returns [`NodeError::cancelled`].
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Resolves when the run is cancelled or this invocation's deadline passes.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// When the invocation's time limit runs out, for an executor that must pass it on
    /// (an epoch deadline, a container's stop timeout).
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.deadline
    }

    /// Logs a line for this node; registered secret values are masked before it leaves.
    pub fn log(&self, level: LogLevel, message: impl Into<String>) {
        let message = self.inner.secrets.mask(&message.into());
        self.inner.events.emit(EventKind::Log {
            node_id: self.inner.node_id.to_string(),
            level,
            message,
        });
    }

    /// Publishes an event as is (an executor's own [`EventKind::Invocation`] figures);
    /// unlike [`NodeCtx::log`] it masks nothing.
    pub fn event(&self, event: EventKind) {
        self.inner.events.emit(event);
    }

    /// Emits a value on an output while the invocation runs; it is routed downstream at
    /// once (waiting for backpressure). Fails when the node's mode does not stream or the
    /// run is shutting down.
    pub async fn emit(&self, handle: &str, value: Value) -> Result<(), NodeError> {
        let Some(tx) = &self.inner.emit else {
            return Err(NodeError::host(format!(
                "node {} emitted on `{handle}` but is not a streaming node",
                self.inner.node_id
            )));
        };
        tx.send(Emitted {
            handle: handle.into(),
            value,
        })
        .await
        .map_err(|_| NodeError::cancelled())
    }

    /// Adds provider cost; any valid report (zero included) makes the invocation's
    /// usage known.
    pub fn report_cost(&self, usd: f64) {
        if usd.is_finite() && usd >= 0.0 {
            self.metrics_mut(|m| {
                m.cost_usd += usd;
                m.cost_reports = 1;
            });
        }
    }

    /// Records an asset the invocation created: if it then fails, a supervisor is not
    /// offered a retry, since a retry could create the asset twice.
    pub fn record_asset(&self, id: impl Into<String>) {
        let id = id.into();
        self.metrics_mut(|m| m.assets.push(id));
    }

    /// Records fuel / peak memory measured by the executor.
    pub fn record_usage(&self, fuel: Option<u64>, peak_memory_bytes: Option<u64>) {
        self.metrics_mut(|m| {
            if let Some(f) = fuel {
                m.fuel = Some(m.fuel.unwrap_or(0) + f);
            }
            m.peak_memory_bytes = m.peak_memory_bytes.max(peak_memory_bytes);
        });
    }

    /// Records outgoing HTTP requests the invocation made and the bytes they moved
    /// (headers and bodies, sent and received), reported with its metrics.
    pub fn record_http(&self, requests: u64, bytes: u64) {
        if requests == 0 && bytes == 0 {
            return;
        }
        self.metrics_mut(|m| {
            m.http_requests += requests;
            m.http_bytes += bytes;
        });
    }

    /// What the invocation has reported so far (cost, assets, fuel, memory).
    pub fn metrics(&self) -> InvocationMetrics {
        self.inner
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn metrics_mut(&self, f: impl FnOnce(&mut InvocationMetrics)) {
        f(&mut self.inner.metrics.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The run-wide registry of secret values handed out (for masking).
    pub fn secrets(&self) -> &Arc<SecretRegistry> {
        &self.inner.secrets
    }
}

/// One buffered / streaming-output / controlled invocation.
pub struct Call {
    /// Input values (properties merged in, edge values win).
    pub inputs: Inputs,
    /// The invocation's context: its identity, cancellation, logs and usage reports.
    pub ctx: NodeCtx,
}

/// The inputs of one invocation as the runtime holds them, for [`Executor::invoke_now`]:
/// the values that arrived on edges, by handle name, over the node's properties. No map
/// is built: a pass-through hop reads its one value where it already is.
pub struct InputView<'a> {
    edges: SmallVec<[(&'a str, Value); 2]>,
    properties: &'a Inputs,
}

impl<'a> InputView<'a> {
    /// The view of `edges` (handle, value) over `properties`.
    pub fn new(edges: SmallVec<[(&'a str, Value); 2]>, properties: &'a Inputs) -> Self {
        InputView { edges, properties }
    }

    /// Input `name`: an edge value wins over a property, as in [`Call::inputs`].
    pub fn get(&self, name: &str) -> Option<&Value> {
        match self.edges.iter().find(|(h, _)| *h == name) {
            Some((_, v)) => Some(v),
            None => self.properties.get(name),
        }
    }

    /// Input `name`, moved out when it came on an edge (a property is cloned).
    pub fn take(&mut self, name: &str) -> Option<Value> {
        // One edge value, the common case (a pass-through hop): no search, no shuffle.
        if let [(h, _)] = self.edges.as_slice()
            && same_name(h, name)
        {
            return self.edges.pop().map(|(_, v)| v);
        }
        match self.edges.iter().position(|(h, _)| *h == name) {
            Some(i) => Some(self.edges.swap_remove(i).1),
            None => self.properties.get(name).cloned(),
        }
    }

    /// The edge values with their handle names, in the order given, when the executor
    /// declined (took nothing).
    pub fn into_edges(self) -> impl Iterator<Item = (&'a str, Value)> {
        self.edges.into_iter()
    }
}

/// Handle names are a few bytes: compared in place, since the call to `memcmp` that `==`
/// makes costs more than the comparison on a pass-through hop.
#[inline]
fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && (0..a.len()).all(|i| a[i] == b[i])
}

/// One item a streaming-input node reads from its inbox.
#[derive(Clone, Debug)]
pub struct StreamItem {
    /// The input handle it arrived on.
    pub handle: Arc<str>,
    /// The value.
    pub value: Value,
}

/// The inbox as seen by a streaming-input node. The runtime owns the other end.
pub struct InputStream {
    rx: mpsc::Receiver<StreamItem>,
    /// Values of unconnected inputs and properties, for nodes that also read config.
    pub properties: Inputs,
}

impl InputStream {
    /// The stream reading `rx`, with the node's `properties`.
    pub fn new(rx: mpsc::Receiver<StreamItem>, properties: Inputs) -> Self {
        InputStream { rx, properties }
    }

    /// How many values are waiting to be read now (all of them, for an aggregate whose
    /// scope closed before it ran): what a node collecting them can reserve room for.
    pub fn waiting(&self) -> usize {
        self.rx.len()
    }

    /// Next value from any input handle, in arrival order; `None` once every input
    /// handle is closed (or the run is cancelled).
    pub async fn next(&mut self) -> Option<StreamItem> {
        self.rx.recv().await
    }
}

/// Implemented once per node of a graph (created by a [`NodeProvider`]).
pub trait Executor: Send + Sync + 'static {
    /// Runs one invocation (buffered, streaming-output and controlled modes). A streaming
    /// output node emits through `call.ctx.emit` and may also return final outputs.
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>>;

    /// The invocation's outputs computed at once from its inputs alone, for an executor
    /// that needs neither its context nor an await (the kernel's own built-ins): the
    /// runtime then builds no input map, context or future, which is most of what a
    /// pass-through hop would cost. `None` means "call [`Executor::invoke`]", and is the
    /// answer for any failure (so errors take the one path that reports them); an
    /// executor that answers `None` must not have taken any input out of `inputs`.
    fn invoke_now(&self, inputs: &mut InputView<'_>) -> Option<Outputs> {
        let _ = inputs;
        None
    }

    /// [`Executor::invoke_now`] into `out`, which holds this node's previous outputs (or
    /// nothing): an executor may reuse them (see [`Outputs::set_one`]) where building
    /// new ones would cost more than its work. False (and `out` untouched) when it
    /// declines.
    fn invoke_now_into(&self, inputs: &mut InputView<'_>, out: &mut Outputs) -> bool {
        match self.invoke_now(inputs) {
            Some(o) => {
                *out = o;
                true
            }
            None => false,
        }
    }

    /// Streaming-input mode: the node drains `input` itself and emits through `ctx`.
    /// Returned outputs are routed after everything emitted.
    fn run_stream(
        &self,
        input: InputStream,
        ctx: NodeCtx,
    ) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        let _ = input;
        Box::pin(async move {
            Err(NodeError::host(format!(
                "node {} is declared streaming-input but its executor does not implement run_stream",
                ctx.node_id()
            )))
        })
    }

    /// Called once before any actor starts; a failure aborts the run before it begins.
    fn initialize(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(Initialized)
    }

    /// Called once when the run ends, whatever the outcome.
    fn finalize(&self) -> BoxFuture<'_, ()> {
        Box::pin(Finalized)
    }

    /// Whether an invocation can spend anything outside this process (a provider call
    /// over the network, a container, a host process). A durable run writes the start
    /// of a retry-safe attempt only for such executors, so that an attempt lost in a
    /// crash shows its usage as unknown rather than zero; for one that cannot, the lost
    /// attempt spent nothing to account, and its start record would be pure cost.
    fn spends_outside(&self) -> bool {
        true
    }

    /// Whether an invocation leaves something running for the rest of the run (a
    /// server whose address it returns): a run-scoped resource. The executor keeps it
    /// and stops it in [`Executor::finalize`], which the kernel calls on every ending
    /// of the run (completed, failed, cancelled, suspended at a gate). A durable run
    /// never journals such an invocation: what it returned (an endpoint) names
    /// something that died with the process that held it, so recovery invokes it again
    /// (as it recomputes the deterministic built-ins), and the nodes that had not run
    /// yet get the new value. A supervisor's verdict about its failure is therefore not
    /// recorded either: recovery starts it afresh and asks again if it fails again.
    fn run_scoped(&self) -> bool {
        false
    }
}

/// What a provider needs to create the executor for one node of a graph (defined in
/// core because the planner hands the same view to [`NodeProvider::check`]).
pub use heddle_core::NodeSpec;

/// A source of node types: the built-ins, a set of WASM packages, the code nodes.
pub trait NodeProvider: Send + Sync {
    /// Short name for listings and conflict messages (`builtin`, `wasm`, `code`).
    fn name(&self) -> &str;
    /// The declarations of every node type it provides; two providers declaring one
    /// name is a conflict the registry refuses.
    fn declarations(&self) -> Vec<Arc<NodeDecl>>;
    /// Creates the executor for one node. Called before any node runs, so bad
    /// properties are reported with the run's other problems.
    // NodeError is large by design (it can carry a candidate output); creation is cold.
    #[allow(clippy::result_large_err)]
    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError>;

    /// Every problem [`NodeProvider::create`] would refuse the node for, found without
    /// creating anything, so planning reports them (`heddle validate` included) together
    /// with the graph's other issues. Default: none beyond the declared types.
    fn check(&self, _spec: &NodeSpec<'_>) -> Vec<ConfigProblem> {
        Vec::new()
    }
}

/// The default `finalize` (and, as [`Initialized`], `initialize`): done at once.
/// Zero-sized, so boxing it allocates nothing, where an `async {}` block is a byte of
/// state, hence an allocation (two per node of every run).
struct Finalized;

impl Future for Finalized {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Ready(())
    }
}

/// The default `initialize`: succeeded at once (see [`Finalized`]).
struct Initialized;

impl Future for Initialized {
    type Output = Result<(), NodeError>;

    fn poll(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's `completed` event keeps only the last value per handle: the same map as
    /// the whole outputs give, whichever handles repeat and however the names are shared.
    #[test]
    fn last_per_handle_keeps_what_the_map_shows() {
        let item: Arc<str> = Arc::from("item");
        let mut many = Outputs::new();
        for i in 0..1000 {
            many.0.push((item.clone(), Value::Int(i)));
            // A separately allocated name: matched by text, not only by address.
            many.0.push((Arc::from("index"), Value::Int(-i)));
        }
        many.0.push((Arc::from("total"), Value::Int(7)));
        let map = many.to_map();
        let last = many.into_last_per_handle();
        assert_eq!(last.0.len(), 3);
        assert_eq!(last.to_map(), map);
        assert_eq!(map["item"], Value::Int(999));
        assert_eq!(map["index"], Value::Int(-999));

        let one = Outputs::one("value", Value::Int(1));
        assert_eq!(one.clone().into_last_per_handle(), one);
        assert_eq!(Outputs::new().into_last_per_handle(), Outputs::new());
    }
}
