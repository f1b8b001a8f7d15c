//! One actor per node: it owns the node's inbox state (no lock), fires invocations as
//! inputs become ready, routes outputs downstream and propagates end-of-stream,
//! `lineage_done` and scope-close signals.
//!
//! Where things are: the message and spec types and the actor's state are here; each
//! way of driving a node has its own module ([`input`], [`buffered`], [`streaming`],
//! [`controlled`]); every invocation runs through [`invoke`] (one attempt loop) and every
//! failure is decided in [`recovery`]; [`routing`] delivers values and signals, and
//! [`finish`] decides the node's outcome and closes its outgoing edges.

mod buffered;
mod controlled;
mod finish;
mod fused;
mod group;
mod input;
mod invoke;
mod journaled;
mod known_secrets;
mod link;
mod promise;
mod recovery;
mod routing;
mod streaming;
mod typed;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use heddle_core::plan::{HandleClass, RootIdx, RootInfo};
use heddle_core::{
    EdgeStatus, EventKind, InvocationMetrics, NodeDecl, NodeMode, NodeOutcome, NodeStatus,
    SkipReason, SuspendInfo, Value,
};
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::bus::{Draft, EventBus};
pub(crate) use super::inbox::{Inbox, InboxTx};
use super::lineage::{Key, Lineage};
use crate::executor::{Executor, Inputs, NodeCtx, Outputs, SecretRegistry};
pub(crate) use finish::shows_result;
pub(crate) use routing::undeclared_output;

pub(crate) use fused::Fusion;
pub use invoke::InvocationRecord;
pub(crate) use link::{Link, LocalRx};

/// Messages drained per wake-up of an actor. A batch buffer starts empty and grows to
/// the batches its node actually gets: a node fed one message at a time keeps a small
/// one, and a node never fed none.
const BATCH: usize = 256;
/// Buffer of the channel a streaming node emits into.
const EMIT_BUFFER: usize = 64;
/// Edge counters are published at most this often while active.
const EDGE_EVENT_INTERVAL: Duration = Duration::from_secs(1);

/// How an upstream node ended; carried by end-of-stream so a node that received nothing
/// knows why (its skip reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Done,
    Failed,
    Skipped,
    Suspended,
    Cancelled,
}

/// A control event for a controlled node (`__control__`).
pub(crate) struct ControlEvent {
    pub event_type: String,
    pub properties: BTreeMap<String, Value>,
    /// The controller that sent it (`None`: the caller, through `RunHandle::send_control`).
    /// A durable run numbers a controlled node's invocations per controller, so a
    /// recovery pairs each controller's events with its recorded replies in that
    /// controller's own order, however the events of several controllers interleaved.
    pub origin: Option<Arc<str>>,
    /// Answered with the outputs of the invocation this event causes (FIFO by
    /// construction: events are handled in arrival order).
    pub reply: Option<oneshot::Sender<Result<Outputs, String>>>,
}

/// What travels into an actor's inbox. Handles are indices into the target's connected
/// data handles, so routing never hashes a handle name.
pub(crate) enum Msg {
    Data {
        handle: u16,
        value: Value,
        lineage: Lineage,
    },
    Eos {
        handle: u16,
        end: End,
        /// The plan index of the edge that ended.
        edge: u32,
    },
    /// `lineage_done`: no value will come for this lineage on the edge.
    Done {
        handle: u16,
        lineage: Lineage,
    },
    /// The edge's condition ruled this lineage out: the node must not run for it, even
    /// when its other inputs deliver (the gating rule's veto).
    RuledOut {
        handle: u16,
        lineage: Lineage,
    },
    /// The edge's rule could not be applied to a value (its condition threw): the node
    /// fails with this message rather than treat it as a quiet false.
    EdgeFailed(Box<str>),
    /// `lineage_scope_closed`: no more children of `root` under `parent` on the edge.
    ScopeClosed {
        parent: Lineage,
        root: RootIdx,
    },
    /// Boxed: rare, and three times the size of a data message (every inbox slot and
    /// batch buffer is as large as the largest message).
    Control(Box<ControlEvent>),
    ControlEos,
    /// A value pushed from outside into a streaming input node.
    External(Value),
    ExternalEos,
}

pub(crate) struct OutEdge {
    /// Index in the plan's edges (whose id its events name, see [`Actor::edge_id`]).
    pub index: u32,
    pub tx: Link,
    pub handle: u16,
    pub counter: u64,
    pub last_event: Option<Instant>,
    pub dirty: bool,
    /// The edge's condition and field narrowing, if it declares any.
    pub rule: Option<Arc<heddle_core::plan::EdgeRule>>,
}

pub(crate) struct OutPort {
    pub name: Arc<str>,
    /// Keep this many outer entries of the invocation lineage (the output's scope,
    /// minus the minted root).
    pub keep: usize,
    /// Roots of the output's scope (for forwarding scope-close signals).
    pub scope: Box<[RootIdx]>,
    pub mints: Option<RootIdx>,
    /// Control port: values become control events.
    pub control: bool,
    pub edges: Box<[OutEdge]>,
}

/// Who turns a node's inputs into outputs: its executor, or the kernel itself for the
/// two node types that connect a run to its caller.
#[derive(Clone, Debug)]
pub(crate) enum NodeRole {
    /// The node's executor is invoked.
    Executor,
    /// `heddle.input`: the kernel dispatches external values.
    Input {
        streaming: bool,
        initial: Option<Value>,
    },
    /// `heddle.output`: values become run outputs.
    Output { name: Arc<str> },
}

pub(crate) struct HandleSpec {
    pub name: Arc<str>,
    pub class: HandleClass,
    pub scope: Box<[RootIdx]>,
    pub accumulates: bool,
    pub repeats: bool,
    pub upstream: u32,
    /// A firing without a value here cannot run (required, no default, no property).
    pub required: bool,
}

/// Run-wide things every actor shares.
pub(crate) struct Shared {
    pub bus: Arc<EventBus>,
    pub roots: Arc<[RootInfo]>,
    pub secrets: Arc<SecretRegistry>,
    /// Cancelled by `cancel()` and by an abort.
    pub run_token: CancellationToken,
    /// Set by `cancel()` only: an abort cancels `run_token` without it.
    pub cancelled: AtomicBool,
    /// The plan the run runs, for what an abort reaches.
    pub plan: Arc<heddle_core::plan::Plan>,
    /// Nodes below one whose inbox limit aborted the run (see [`Shared::abort`]).
    pub below_abort: std::sync::Mutex<Option<Vec<bool>>>,
    pub limits: super::InboxLimits,
    /// Present only when the run has a supervisor: without one no escalation is built.
    pub escalator: Option<Arc<crate::supervisor::Escalator>>,
    pub outputs_retained: RetainedOutputs,
    /// Present only for a durable run: without one no occurrence is ever built.
    pub journal: Option<Arc<dyn crate::journal::Journal>>,
    /// Present only for a traced run: without it no span id is minted.
    pub trace: Option<Arc<heddle_core::trace::Traced>>,
    /// Every attempt's `invocation` event is published (traced or counted runs).
    pub every_invocation: bool,
    /// The durable run's id, given to every invocation's context.
    pub run_id: Option<Arc<str>>,
}

impl Shared {
    /// Aborts the run because node `node_id` hit an inbox limit: the nodes below it are
    /// marked first, so each one the cancel stops knows its upstream failed.
    pub(crate) fn abort(&self, node_id: &str) {
        if let Some(i) = self.plan.node_index(node_id) {
            // A poisoned lock only means another abort panicked midway: its marks stand.
            let mut below = self.below_abort.lock().unwrap_or_else(|p| p.into_inner());
            let below = below.get_or_insert_with(|| vec![false; self.plan.nodes.len()]);
            mark_below(&self.plan, i as usize, below);
        }
        self.run_token.cancel();
    }

    /// Why node `node_id`, stopped by the run's token, did not finish: the run was
    /// cancelled, or an abort below a node that hit an inbox limit failed it (the run
    /// ends failed, and this node's upstream is what failed). A node beside the failure
    /// is stopped by the run's end, not by its upstream: cancelled.
    pub(crate) fn stopped_reason(&self, node_id: &str) -> SkipReason {
        if self.cancelled.load(std::sync::atomic::Ordering::SeqCst) {
            return SkipReason::Cancelled;
        }
        let below = self.below_abort.lock().unwrap_or_else(|p| p.into_inner());
        let failed_above = below
            .as_ref()
            .zip(self.plan.node_index(node_id))
            .is_some_and(|(b, i)| b[i as usize]);
        if failed_above {
            SkipReason::UpstreamFailed
        } else {
            SkipReason::Cancelled
        }
    }
}

/// Marks every node reachable from node `from` along its outgoing edges (not `from`).
fn mark_below(plan: &heddle_core::plan::Plan, from: usize, below: &mut [bool]) {
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        for &e in &plan.nodes[n].out_edges {
            let t = plan.edges[e as usize].target as usize;
            if !below[t] {
                below[t] = true;
                stack.push(t);
            }
        }
    }
}

/// The run-wide budget of retained output bytes (see `RunOptions::output_cap_bytes`).
pub(crate) struct RetainedOutputs {
    cap: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl RetainedOutputs {
    pub fn new(cap: usize) -> Self {
        RetainedOutputs {
            cap,
            used: Default::default(),
        }
    }

    /// `v` itself while the budget lasts, else a marker string naming what was dropped.
    fn admit(&self, v: Value) -> Value {
        use std::sync::atomic::Ordering::Relaxed;
        let size = v.approx_size();
        let prev = self.used.fetch_add(size, Relaxed);
        if prev.saturating_add(size) <= self.cap {
            return v;
        }
        self.used.fetch_sub(size, Relaxed);
        Value::str(format!(
            "[output value not retained: {} of {size} bytes, over the run's {}-byte output cap]",
            v.kind(),
            self.cap
        ))
    }
}

pub(crate) struct ActorSpec {
    pub id: Arc<str>,
    pub node_type: Arc<str>,
    pub decl: Arc<NodeDecl>,
    pub exec: Arc<dyn Executor>,
    pub base_inputs: Inputs,
    /// Per connected handle, its declared default; empty when no handle declares one
    /// (only an output node reads them).
    pub defaults: Box<[Option<Value>]>,
    pub handles: Box<[HandleSpec]>,
    pub scope: Box<[RootIdx]>,
    pub driver: Option<usize>,
    pub ports: Box<[OutPort]>,
    pub controllers: usize,
    /// See [`SpecRare`]; `None` for a node that sets none of it.
    pub rare: Option<Box<SpecRare>>,
    pub role: NodeRole,
    pub rx: Inbox,
}

/// What few nodes' specs set: a time limit or retry policy, an output contract, typed
/// inputs (a guest's), control edges, scopes closed by several edges. Boxed, and absent
/// when all of it is unset: in place it was a third of every actor (120 bytes) on a
/// long chain of pass-through nodes that sets none of it.
#[derive(Default)]
pub(crate) struct SpecRare {
    pub control_targets: Vec<Link>,
    /// What this node's invocations may drive: the controlled nodes its control edges
    /// reach (`None`: it controls nothing).
    pub controls: Option<crate::runtime::Controls>,
    /// Edges into this node carrying each root, for the roots more than one carries
    /// (a scope closes once every one of them closed it).
    pub root_contrib: Box<[(RootIdx, u32)]>,
    pub timeout: Option<Duration>,
    /// The node's own retry policy (`retry`), run by the attempt loop before any
    /// supervisor is asked.
    pub retry: Option<heddle_core::graph::RetryPolicy>,
    /// Declared output fields, checked on every value of that output.
    pub contract: Option<Arc<heddle_core::plan::NodeContract>>,
    /// The edge-fed inputs whose declared type is not `any`, checked on every value
    /// before the node's code sees it (`typed.rs`); empty for a built-in.
    pub typed_inputs: Box<[(Arc<str>, heddle_core::PortType)]>,
}

impl SpecRare {
    /// `None` when nothing is set (what nearly every node of a large graph has).
    pub fn boxed(self) -> Option<Box<SpecRare>> {
        let unset = self.control_targets.is_empty()
            && self.controls.is_none()
            && self.root_contrib.is_empty()
            && self.timeout.is_none()
            && self.retry.is_none()
            && self.contract.is_none()
            && self.typed_inputs.is_empty();
        (!unset).then(|| Box::new(self))
    }
}

impl ActorSpec {
    /// The node's time limit per attempt.
    pub fn timeout(&self) -> Option<Duration> {
        self.rare.as_ref().and_then(|r| r.timeout)
    }

    /// The node's own retry policy.
    pub fn retry(&self) -> Option<&heddle_core::graph::RetryPolicy> {
        self.rare.as_ref().and_then(|r| r.retry.as_ref())
    }

    /// The node's output contract.
    pub fn contract(&self) -> Option<&Arc<heddle_core::plan::NodeContract>> {
        self.rare.as_ref().and_then(|r| r.contract.as_ref())
    }

    /// What its invocations may drive.
    pub fn controls(&self) -> Option<&crate::runtime::Controls> {
        self.rare.as_ref().and_then(|r| r.controls.as_ref())
    }

    /// The typed edge-fed inputs (empty for most nodes).
    pub fn typed_inputs(&self) -> &[(Arc<str>, heddle_core::PortType)] {
        self.rare.as_ref().map_or(&[], |r| &r.typed_inputs)
    }

    /// Edges into the node per root, for roots more than one carries.
    pub fn root_contrib(&self) -> &[(RootIdx, u32)] {
        self.rare.as_ref().map_or(&[], |r| &r.root_contrib)
    }
}

/// Whether invocations of an executor node may go through [`Executor::invoke_now`]: a
/// native built-in whose work is the executor's alone, with nothing around it (journal
/// record, supervisor, output contract, emitting mode) that needs an attempt.
pub(crate) fn runs_now(decl: &NodeDecl, contract: bool, shared: &Shared) -> bool {
    // A journaled run recomputes retry-safe built-ins instead of recording them (see
    // `Actor::recomputed`), so they need no attempt there either.
    decl.origin == heddle_core::Origin::Builtin
        && decl.mode == NodeMode::Buffered
        && !contract
        && shared.escalator.is_none()
        && (shared.journal.is_none() || decl.retry_safe)
}

/// How an actor stopped early.
#[derive(Debug)]
pub(crate) enum Stop {
    Failed(String),
    Suspended(SuspendInfo),
    Cancelled,
    /// An inbox limit: the whole run aborts.
    Abort(String),
}

impl Stop {
    /// What a caller waiting on the stopped invocation is told.
    fn message(&self) -> String {
        match self {
            Stop::Failed(m) | Stop::Abort(m) => m.clone(),
            Stop::Suspended(info) => format!("suspended: {}", info.reason),
            Stop::Cancelled => "cancelled".to_string(),
        }
    }
}

/// What an actor reports back to the runner.
pub(crate) struct ActorReport {
    pub outcome: NodeOutcome,
    pub invocations: u64,
    pub metrics: InvocationMetrics,
    pub outputs: Vec<Value>,
    pub stop: Option<Stop>,
    /// Incoming edges whose end this node consumed: any other edge into it still held
    /// or could still carry values when it stopped (the edge is `drained`). In place up
    /// to four, as `sent` up to one: every node of a chain ends with one of each, and
    /// a list of its own for each was two allocations per node as the run ends.
    pub ended_in: SmallVec<[u32; 4]>,
    /// Values sent per outgoing edge (plan index, count).
    pub sent: SmallVec<[(u32, u64); 1]>,
    /// See `Actor::signature` and `Actor::timed_out`.
    pub signature: Option<Box<str>>,
    pub timed_out: bool,
}

/// A cancel token shared by reference count: cloning a `CancellationToken` takes its
/// tree lock, which is too much to do per invocation.
#[derive(Clone)]
pub(crate) struct InvToken(Arc<CancellationToken>);

impl std::ops::Deref for InvToken {
    type Target = CancellationToken;
    fn deref(&self) -> &CancellationToken {
        &self.0
    }
}

/// What only some nodes ever use, allocated the first time one does: a node that mints
/// (its iteration counters), one whose scope closes come on several edges, a durable
/// run's records, a supervisor's notes, a failure, metrics (never a built-in's), an
/// output node's values. Held in the actor, these would be a third of every node's
/// state on a long chain of pass-through nodes that needs none of them.
#[derive(Default)]
struct Rare {
    metrics: InvocationMetrics,
    /// Values an output node received (the run's outputs under its name).
    outputs: Vec<Value>,
    /// Next iteration token per minted root and parent key.
    /// (Ordered, not hashed: a fan-out looks it up once per item, nearly always under
    /// one parent key, where one comparison beats hashing the key.)
    counters: BTreeMap<(RootIdx, Key), u32>,
    /// Scope closes received so far for roots fed by several edges.
    close_counts: HashMap<(RootIdx, Lineage), u32>,
    /// Durable runs only: invocations so far per lineage key (an occurrence's `n`).
    occurrences: HashMap<Arc<str>, u32>,
    /// Durable runs only: what the current attempt emitted, for its result record.
    emitted: Option<Vec<(Arc<str>, Value)>>,
    /// The note of the supervisor's last verdict, taken by the record that carries the
    /// verdict (a retry's, a skip's) so a person's reason is in the log whatever they
    /// decided.
    decision_note: Option<String>,
    /// An incoming edge's rule failed: the node fails with this.
    edge_failure: Option<String>,
    /// The failure signature the node named when it failed for good (the one its error
    /// text shows), for the report's field.
    signature: Option<Box<str>>,
}

pub(crate) struct Actor {
    spec: ActorSpec,
    shared: Arc<Shared>,
    /// The run's token, shared cheaply by every invocation of this node: made by the
    /// first invocation that needs one (a native node's hop never does).
    node_token: std::sync::OnceLock<InvToken>,
    /// The context of the last invocation, re-armed for the next one when nobody kept it.
    spare_ctx: Option<NodeCtx>,
    /// This actor's own `""` key (a shared one would bounce one cache line between
    /// cores), made when first used.
    root_key: std::sync::OnceLock<Arc<str>>,
    has_mints: bool,
    /// The output handle last routed and its port: an executor names its outputs with
    /// the same `Arc` every time, so a hop finds its port by address, not by comparing
    /// names. (Held, so the address cannot be reused for another name meanwhile.)
    hot_port: Option<(Arc<str>, usize)>,
    /// A native built-in (`Origin::Builtin`): no metrics to collect.
    native: bool,
    /// Invocations may go through [`Executor::invoke_now`]: the node's executor does
    /// the work, and nothing around it (journal record, supervisor, output contract,
    /// emitting mode) needs an attempt.
    now: bool,
    invocations: u64,
    started: bool,
    ends: SmallVec<[End; 4]>,
    last_result: Option<Outputs>,
    /// See [`Rare`]; `None` until first needed.
    rare: Option<Box<Rare>>,
    /// Upstream edges per handle that have not yet ended.
    open: SmallVec<[u32; 2]>,
    /// Incoming edges whose end-of-stream was consumed (see [`ActorReport::ended_in`]).
    ended_in: SmallVec<[u32; 4]>,
    eos_sent: bool,
    /// Why its invocations were skipped, when one was: by the supervisor's verdict, or
    /// by a person's answer to a reconcile pause (a node whose every invocation was
    /// skipped ends skipped with that reason; the first skip's, should they differ).
    skipped_by: Option<SkipReason>,
    /// The current attempt sent a value along an edge while it ran: retrying it would
    /// send that value again.
    sent_downstream: bool,
    /// An incoming edge's condition ruled out at least one item (a node that never ran
    /// is then skipped for `condition`).
    ruled_out: bool,
    /// An attempt reached the node's time limit and its work was cancelled.
    timed_out: bool,
}

impl Actor {
    pub fn new(spec: ActorSpec, shared: Arc<Shared>) -> Self {
        let open = spec.handles.iter().map(|h| h.upstream).collect();
        let has_mints = spec.ports.iter().any(|p| p.mints.is_some());
        let native = spec.decl.origin == heddle_core::Origin::Builtin;
        let now = matches!(spec.role, NodeRole::Executor)
            && runs_now(&spec.decl, spec.contract().is_some(), &shared);
        Actor {
            spec,
            shared,
            node_token: std::sync::OnceLock::new(),
            spare_ctx: None,
            root_key: std::sync::OnceLock::new(),
            has_mints,
            hot_port: None,
            native,
            now,
            invocations: 0,
            started: false,
            ends: SmallVec::new(),
            last_result: None,
            rare: None,
            open,
            ended_in: SmallVec::new(),
            eos_sent: false,
            skipped_by: None,
            sent_downstream: false,
            ruled_out: false,
            timed_out: false,
        }
    }

    /// Boxed actor: its future would otherwise hold the actor twice over (an async fn's
    /// future keeps its arguments and copies of them).
    pub async fn run(mut self: Box<Self>) -> Box<ActorReport> {
        // Every step is a boxed future: the task holds the actor for the node's whole
        // life, and in place the modes' states would add up (an async fn's future keeps
        // room for each awaited future, and copies of some), several KB per node.
        let res = match self.spec.role.clone() {
            NodeRole::Input { streaming, initial } => {
                Box::pin(self.run_input(streaming, initial)).await
            }
            _ => match self.spec.decl.mode {
                // A controlled node runs on its controllers' events; with no control
                // edge nothing would ever send one, so it runs as a buffered node.
                NodeMode::Controlled if self.spec.controllers > 0 => {
                    Box::pin(self.run_controlled()).await
                }
                NodeMode::StreamingInput => Box::pin(self.run_streaming_input()).await,
                NodeMode::Controlled | NodeMode::Buffered | NodeMode::StreamingOutput => {
                    Box::pin(self.run_buffered()).await
                }
            },
        };
        Box::pin((*self).finish(res)).await
    }

    /// [`Actor::run`] of an [`Actor::inline_source`]: the same steps, without the other
    /// modes' state in its future (the runner boxes one such future per source node).
    pub async fn run_source(mut self) -> Box<ActorReport> {
        let res = self.fire_source().await;
        self.finish(res).await
    }

    /// A native built-in with no inputs at all: it fires once, at once, so the runner
    /// may run it inline instead of paying for a task.
    pub fn inline_source(&self) -> bool {
        self.spec.handles.is_empty()
            && self.spec.controllers == 0
            && matches!(self.spec.role, NodeRole::Executor)
            && matches!(self.spec.decl.mode, NodeMode::Buffered)
            && self.spec.decl.origin == heddle_core::Origin::Builtin
    }

    /// The node's [`Rare`] state, made on first use.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// The run's token for this node's invocations (see `node_token`).
    fn node_token(&self) -> &InvToken {
        self.node_token
            .get_or_init(|| InvToken(Arc::new(self.shared.run_token.clone())))
    }

    /// The key of invocations at root scope (see `root_key`).
    fn root_key(&self) -> Arc<str> {
        self.root_key.get_or_init(|| Arc::from("")).clone()
    }

    fn emit(&self, kind: EventKind) {
        self.shared.bus.publish(kind);
    }

    fn node_event(
        &self,
        status: NodeStatus,
        result: Option<Outputs>,
        error: Option<String>,
        skip: Option<SkipReason>,
    ) {
        self.shared.bus.publish_draft(Draft::Node {
            node_id: self.spec.id.clone(),
            node_type: self.spec.node_type.clone(),
            status,
            result: result.map(Box::new),
            error,
            skip_reason: skip,
        });
    }

    /// The id of outgoing edge `e`, as the plan names it (not held per edge: only its
    /// events, at most one a second, and a failing rule's message read it).
    fn edge_id(&self, e: &OutEdge) -> &Arc<str> {
        &self.shared.plan.edges[e.index as usize].id
    }

    /// An edge's counter, as a draft (see [`Draft`]).
    fn edge_event(&self, e: &OutEdge, status: EdgeStatus) {
        self.shared.bus.publish_draft(Draft::Edge {
            edge_id: self.edge_id(e).clone(),
            status,
            counter: e.counter,
        });
    }

    fn mark_started(&mut self) {
        if !self.started {
            self.started = true;
            self.node_event(NodeStatus::Running, None, None, None);
        }
    }

    /// Counts an upstream edge's end-of-stream on `handle`; true when that was the
    /// handle's last open edge.
    fn close_upstream(&mut self, handle: u16, end: End, edge: u32) -> bool {
        self.ends.push(end);
        self.ended_in.push(edge);
        let h = handle as usize;
        self.open[h] = self.open[h].saturating_sub(1);
        self.open[h] == 0
    }

    /// The next batch of inbox messages (at most [`BATCH`]), received into `spare` and
    /// taken out of it, so the caller can drain the batch while calling `&mut self`
    /// methods and hand the emptied vector back as the next `spare` (one allocation per
    /// actor, not per batch). `None` when the inbox has ended; a cancelled run stops the
    /// actor.
    async fn recv_batch(&mut self, spare: &mut Vec<Msg>) -> Result<Option<Vec<Msg>>, Stop> {
        let n = tokio::select! {
            biased;
            n = self.spec.rx.recv_many(spare, BATCH) => n,
            _ = self.shared.run_token.cancelled() => return Err(Stop::Cancelled),
        };
        Ok((n > 0).then(|| std::mem::take(spare)))
    }

    fn all_closed(&self) -> bool {
        self.open.iter().all(|o| *o == 0)
    }

    /// Whether every edge that carries `root` has closed it under `parent`.
    fn scope_close_complete(&mut self, root: RootIdx, parent: &Lineage) -> bool {
        let need = self
            .spec
            .root_contrib()
            .iter()
            .find(|(r, _)| *r == root)
            .map_or(1, |(_, n)| *n);
        if need <= 1 {
            return true;
        }
        let counts = &mut self.rare().close_counts;
        let c = counts.entry((root, parent.clone())).or_insert(0);
        *c += 1;
        if *c >= need {
            counts.remove(&(root, parent.clone()));
            true
        } else {
            false
        }
    }
}

impl Actor {
    /// Takes note of an edge-rule message in a mode that has no per-item veto (the
    /// buffered scheduler handles `RuledOut` itself): a ruled-out item simply never
    /// arrives, and a failure stops the node (see [`Actor::edge_stop`]).
    fn edge_signal(&mut self, m: Msg) {
        match m {
            Msg::RuledOut { .. } => self.ruled_out = true,
            Msg::EdgeFailed(message) => {
                self.rare().edge_failure.get_or_insert(message.into());
            }
            _ => {}
        }
    }

    /// A pending edge-rule failure as the node's stop.
    fn edge_stop(&mut self) -> Result<(), Stop> {
        match self.rare.as_mut().and_then(|r| r.edge_failure.take()) {
            Some(m) => Err(Stop::Failed(m)),
            None => Ok(()),
        }
    }
}

fn reply_not_controlled(ev: ControlEvent, id: &str) {
    if let Some(r) = ev.reply {
        let _ = r.send(Err(format!("node {id} is not a controlled node")));
    }
}

#[cfg(test)]
mod tests {
    /// Every inbox slot, queue slot and batch buffer entry is a `Msg`: on a 64-bit
    /// target a data message is its value (24 bytes), its lineage (one word, see
    /// `runtime::lineage`) and its handle, and no rarer variant is larger.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_message_is_a_value_and_two_words() {
        use std::mem::size_of;
        assert_eq!(size_of::<heddle_core::Value>(), 24);
        assert_eq!(size_of::<crate::runtime::lineage::Lineage>(), 8);
        assert_eq!(size_of::<super::Msg>(), 40);
    }

    /// Every node of a run holds an actor from the start, and one port, edge and handle
    /// per connection: on a 10,000-node chain these are most of the run's memory per
    /// node. What few nodes set is boxed ([`super::SpecRare`]), lists are exact boxed
    /// slices, and an edge's id is read from the plan (64-bit targets).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_actor_and_its_wiring_stay_small() {
        use std::mem::size_of;
        assert_eq!(size_of::<super::ActorSpec>(), 224);
        assert_eq!(size_of::<super::Actor>(), 504);
        assert_eq!(size_of::<super::OutPort>(), 72);
        assert_eq!(size_of::<super::OutEdge>(), 56);
        assert_eq!(size_of::<super::HandleSpec>(), 40);
        // In place, the size of the vectors they replaced (see `ActorReport`).
        assert_eq!(size_of::<smallvec::SmallVec<[u32; 4]>>(), 24);
        assert_eq!(size_of::<smallvec::SmallVec<[(u32, u64); 1]>>(), 24);
    }
}
