//! One actor per node: it owns the node's inbox state (no lock), fires invocations as
//! inputs become ready, routes outputs downstream and propagates end-of-stream,
//! `lineage_done` and scope-close signals.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use heddle_core::plan::{HandleClass, RootIdx, RootInfo};
use heddle_core::{
    EdgeStatus, EventKind, InvocationMetrics, NodeDecl, NodeMode, NodeOutcome, NodeStatus,
    PortType, SkipReason, SuspendInfo, Value,
};
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::bus::EventBus;
use super::lineage::{Key, Lineage};
use super::sched::{DoneEffect, Firing, Limits, SchedHandle, Scheduler};
use crate::executor::{
    Call, CtxParts, Emitted, ErrorKind, Executor, InputStream, Inputs, NodeCtx, NodeError, Outputs,
    SecretRegistry, StreamItem,
};

/// Messages drained per wake-up of an actor.
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
    },
    /// `lineage_done`: no value will come for this lineage on the edge.
    Done {
        handle: u16,
        lineage: Lineage,
    },
    /// `lineage_scope_closed`: no more children of `root` under `parent` on the edge.
    ScopeClosed {
        parent: Lineage,
        root: RootIdx,
    },
    Control(ControlEvent),
    ControlEos,
    /// A value pushed from outside into a streaming input node.
    External(Value),
    ExternalEos,
}

pub(crate) struct OutEdge {
    pub edge_id: Arc<str>,
    pub tx: mpsc::Sender<Msg>,
    pub handle: u16,
    pub counter: u64,
    pub last_event: Option<Instant>,
    pub dirty: bool,
}

pub(crate) struct OutPort {
    pub name: Arc<str>,
    /// Keep this many outer entries of the invocation lineage (the output's scope,
    /// minus the minted root).
    pub keep: usize,
    /// Roots of the output's scope (for forwarding scope-close signals).
    pub scope: Vec<RootIdx>,
    pub mints: Option<RootIdx>,
    /// Control port: values become control events.
    pub control: bool,
    pub edges: Vec<OutEdge>,
}

/// What kind of node the kernel runs itself.
#[derive(Clone, Debug)]
pub(crate) enum Special {
    None,
    /// `heddle.input`: the kernel dispatches external values.
    Input {
        streaming: bool,
        initial: Option<Value>,
    },
    /// `heddle.output`: values become run outputs.
    Output {
        name: Arc<str>,
    },
}

pub(crate) struct HandleSpec {
    pub name: Arc<str>,
    pub class: HandleClass,
    pub scope: Vec<RootIdx>,
    pub accumulates: bool,
    pub repeats: bool,
    pub upstream: u32,
}

/// Run-wide things every actor shares.
pub(crate) struct Shared {
    pub bus: Arc<EventBus>,
    pub roots: Arc<[RootInfo]>,
    pub secrets: Arc<SecretRegistry>,
    /// Cancelled by `cancel()` and by an abort.
    pub run_token: CancellationToken,
    /// Cancelled when the caller can no longer interact with the run (it waits for the
    /// end): nodes that only the caller drives stop waiting then.
    pub external_closed: CancellationToken,
    pub cancelled: AtomicBool,
    pub limits: super::InboxLimits,
    pub root_key: Arc<str>,
    /// Present only when the run has a supervisor: without one no escalation is built.
    pub escalator: Option<Arc<crate::supervisor::Escalator>>,
}

pub(crate) struct ActorSpec {
    pub idx: usize,
    pub id: Arc<str>,
    pub node_type: Arc<str>,
    pub decl: Arc<NodeDecl>,
    pub exec: Arc<dyn Executor>,
    pub base_inputs: Inputs,
    pub defaults: Vec<Option<Value>>,
    pub handles: Vec<HandleSpec>,
    pub scope: Vec<RootIdx>,
    pub driver: Option<usize>,
    pub ports: Vec<OutPort>,
    pub control_targets: Vec<mpsc::Sender<Msg>>,
    pub controllers: usize,
    pub root_contrib: HashMap<RootIdx, u32>,
    pub timeout: Option<Duration>,
    pub special: Special,
    pub rx: mpsc::Receiver<Msg>,
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

/// What an actor reports back to the runner.
pub(crate) struct ActorReport {
    pub outcome: NodeOutcome,
    pub invocations: u64,
    pub metrics: InvocationMetrics,
    pub outputs: Vec<Value>,
    pub stop: Option<Stop>,
}

/// Everything the supervisor needs about a failed invocation (recorded per invocation).
pub struct InvocationRecord {
    /// Inputs the invocation was called with.
    pub inputs: Inputs,
    /// Canonical lineage key.
    pub key: Arc<str>,
    pub lineage_len: usize,
    pub lineage: Lineage,
    /// This invocation's own metrics (cost and assets decide whether retry is allowed).
    pub metrics: InvocationMetrics,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Whether the invocation emitted anything before failing.
    pub emitted: bool,
}

/// What the supervisor decided for a failed invocation, for the caller to carry out.
pub(crate) enum Recovery {
    /// Invoke again with the same inputs and properties.
    Retry,
    /// Route these (validated) outputs as the invocation's own.
    Substitute(Outputs),
    /// Drop the invocation: lineage_done plus scope closure downstream.
    Skip,
    /// Keep what was emitted and close the output slots.
    EndStream,
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

/// Per-invocation state of minted iteration tokens: outputs minting the same root share
/// one token until a port repeats (then the next item starts).
#[derive(Default)]
struct Mint {
    groups: SmallVec<[(RootIdx, u32, u64); 2]>,
}

pub(crate) struct Actor {
    s: ActorSpec,
    sh: Arc<Shared>,
    /// The run's token, shared cheaply by every invocation of this node.
    node_token: InvToken,
    /// The context of the last invocation, re-armed for the next one when nobody kept it.
    spare_ctx: Option<NodeCtx>,
    /// This actor's own `""` key (a shared one would bounce one cache line between cores).
    root_key: Arc<str>,
    has_mints: bool,
    /// A native built-in (`origin == "builtin"`): no metrics to collect.
    native: bool,
    epoch: Instant,
    invocations: u64,
    metrics: InvocationMetrics,
    started: bool,
    received: bool,
    ends: SmallVec<[End; 4]>,
    last_result: Option<Outputs>,
    outputs: Vec<Value>,
    counters: HashMap<(RootIdx, Key), u32>,
    /// Scope closes received so far for roots fed by several edges.
    close_counts: HashMap<(RootIdx, Lineage), u32>,
    open: Vec<u32>,
    eos_sent: bool,
    /// Invocations the supervisor skipped (a node whose every invocation was skipped
    /// ends skipped, reason supervisor).
    sup_skips: u64,
}

impl Actor {
    pub fn new(s: ActorSpec, sh: Arc<Shared>) -> Self {
        let open = s.handles.iter().map(|h| h.upstream).collect();
        let node_token = InvToken(Arc::new(sh.run_token.clone()));
        let has_mints = s.ports.iter().any(|p| p.mints.is_some());
        let native = s.decl.origin == "builtin";
        Actor {
            s,
            sh,
            node_token,
            spare_ctx: None,
            root_key: Arc::from(""),
            has_mints,
            native,
            epoch: Instant::now(),
            invocations: 0,
            metrics: InvocationMetrics::default(),
            started: false,
            received: false,
            ends: SmallVec::new(),
            last_result: None,
            outputs: Vec::new(),
            counters: HashMap::new(),
            close_counts: HashMap::new(),
            open,
            eos_sent: false,
            sup_skips: 0,
        }
    }

    pub async fn run(mut self) -> ActorReport {
        let res = match self.s.special.clone() {
            Special::Input { streaming, initial } => self.run_input(streaming, initial).await,
            _ => match self.s.decl.mode {
                // Boxed: the rarer modes' state would otherwise inflate every actor's
                // future, which is moved on spawn.
                NodeMode::Controlled => Box::pin(self.run_controlled()).await,
                NodeMode::StreamingInput => Box::pin(self.run_streaming_input()).await,
                NodeMode::Buffered | NodeMode::StreamingOutput => self.run_buffered().await,
            },
        };
        self.finish(res).await
    }

    /// A native built-in with no inputs at all: it fires once, at once, so the runner
    /// may run it inline instead of paying for a task.
    pub fn inline_source(&self) -> bool {
        self.s.handles.is_empty()
            && self.s.controllers == 0
            && matches!(self.s.special, Special::None)
            && matches!(self.s.decl.mode, NodeMode::Buffered)
            && self.s.decl.origin == "builtin"
    }

    fn emit(&self, kind: EventKind) {
        self.sh.bus.publish(kind);
    }

    fn node_event(
        &self,
        status: NodeStatus,
        result: Option<Outputs>,
        error: Option<String>,
        skip: Option<SkipReason>,
    ) {
        self.emit(EventKind::Node {
            node_id: self.s.id.to_string(),
            node_type: self.s.node_type.to_string(),
            status,
            result: result.map(|o| o.to_map()),
            error,
            skip_reason: skip,
        });
    }

    fn mark_started(&mut self) {
        if !self.started {
            self.started = true;
            self.node_event(NodeStatus::Running, None, None, None);
        }
    }

    fn cancelled_stop(&self) -> Stop {
        Stop::Cancelled
    }

    // ---------------------------------------------------------------- input nodes

    async fn run_input(&mut self, streaming: bool, initial: Option<Value>) -> Result<(), Stop> {
        self.mark_started();
        if let Some(v) = initial {
            self.invocations += 1;
            self.route_port_values(&[(0, v)], &Lineage::ROOT, &mut Mint::default())
                .await?;
        }
        if !streaming {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(BATCH);
        loop {
            let n = tokio::select! {
                biased;
                n = self.s.rx.recv_many(&mut buf, BATCH) => n,
                _ = self.sh.run_token.cancelled() => return Err(self.cancelled_stop()),
            };
            if n == 0 {
                return Ok(());
            }
            let mut batch = std::mem::take(&mut buf);
            for m in batch.drain(..) {
                match m {
                    Msg::External(v) => {
                        self.invocations += 1;
                        self.route_port_values(&[(0, v)], &Lineage::ROOT, &mut Mint::default())
                            .await?;
                    }
                    Msg::ExternalEos => return Ok(()),
                    Msg::Control(ev) => reply_not_controlled(ev, &self.s.id),
                    _ => {}
                }
            }
            buf = batch;
            self.flush_edge_events(false);
        }
    }

    // ---------------------------------------------------------------- buffered

    async fn run_buffered(&mut self) -> Result<(), Stop> {
        if self.s.handles.is_empty() {
            // A source: fires once with its properties.
            let inputs = self.s.base_inputs.clone();
            return self.fire(inputs, SmallVec::new(), Lineage::ROOT).await;
        }
        let handles: Vec<SchedHandle> = self
            .s
            .handles
            .iter()
            .map(|h| SchedHandle {
                name: h.name.clone(),
                class: h.class,
                scope: h.scope.clone(),
                accumulates: h.accumulates,
                closed: h.upstream == 0,
            })
            .collect();
        let keep = self.s.handles.iter().any(|h| h.repeats);
        // One plain handle: every value fires at once, no buckets needed.
        let fast = self.s.handles.len() == 1 && !self.s.handles[0].accumulates;
        let mut sched = Scheduler::new(
            self.s.id.clone(),
            handles,
            self.s.scope.clone(),
            self.s.driver,
            keep,
            Limits {
                max_pending_keys: self.sh.limits.max_pending_keys,
                max_pending_messages_per_key: self.sh.limits.max_pending_messages_per_key,
            },
            self.sh.roots.clone(),
        );
        let mut buf = Vec::with_capacity(BATCH);
        while !self.all_closed() {
            let n = tokio::select! {
                biased;
                n = self.s.rx.recv_many(&mut buf, BATCH) => n,
                _ = self.sh.run_token.cancelled() => return Err(self.cancelled_stop()),
            };
            if n == 0 {
                break;
            }
            let mut batch = std::mem::take(&mut buf);
            for m in batch.drain(..) {
                match m {
                    Msg::Data {
                        handle,
                        value,
                        lineage,
                    } => {
                        self.received = true;
                        if fast {
                            let mut f = Firing::new();
                            f.push((0, value));
                            let lin = lineage.truncate(self.s.scope.len());
                            self.fire_firing(f, lin).await?;
                            continue;
                        }
                        match sched.push(handle as usize, value, &lineage) {
                            Err(o) => return Err(Stop::Abort(o.0)),
                            Ok(Some(key)) => self.fire_key(&mut sched, &key).await?,
                            Ok(None) => self.fire_ready(&mut sched).await?,
                        }
                    }
                    Msg::Eos { handle, end } => {
                        self.ends.push(end);
                        let h = handle as usize;
                        self.open[h] = self.open[h].saturating_sub(1);
                        if self.open[h] == 0 {
                            sched.close_handle(h);
                            if !fast {
                                self.fire_ready(&mut sched).await?;
                            }
                        }
                    }
                    Msg::Done { handle, lineage } => match sched.done(handle as usize, &lineage) {
                        Err(o) => return Err(Stop::Abort(o.0)),
                        Ok(DoneEffect::Wait) => {}
                        Ok(DoneEffect::Ready(key)) => self.fire_key(&mut sched, &key).await?,
                        Ok(DoneEffect::Dropped(key)) => {
                            let l = Lineage::from_key(&self.s.scope, &key);
                            self.forward_dropped(&l).await?;
                        }
                    },
                    Msg::ScopeClosed { parent, root } => {
                        if !self.scope_close_complete(root, &parent) {
                            continue;
                        }
                        if let Some(d) = self.s.scope.iter().position(|r| *r == root) {
                            let pk = parent.key(&self.s.scope[..d]);
                            sched.close_scope(&pk, d);
                            self.fire_ready(&mut sched).await?;
                            sched.retire_scope(&pk, d);
                        }
                        self.forward_scope_closed(&parent, root).await?;
                    }
                    Msg::Control(ev) => reply_not_controlled(ev, &self.s.id),
                    Msg::ControlEos | Msg::External(_) | Msg::ExternalEos => {}
                }
            }
            buf = batch;
            self.flush_edge_events(false);
        }
        // Every input closed: whatever can fire, fires (partial input takes defaults).
        if !fast {
            self.fire_ready(&mut sched).await?;
        }
        Ok(())
    }

    fn all_closed(&self) -> bool {
        self.open.iter().all(|o| *o == 0)
    }

    /// Whether every edge that carries `root` has closed it under `parent`.
    fn scope_close_complete(&mut self, root: RootIdx, parent: &Lineage) -> bool {
        let need = self.s.root_contrib.get(&root).copied().unwrap_or(1);
        if need <= 1 {
            return true;
        }
        let c = self.close_counts.entry((root, parent.clone())).or_insert(0);
        *c += 1;
        if *c >= need {
            self.close_counts.remove(&(root, parent.clone()));
            true
        } else {
            false
        }
    }

    async fn fire_key(&mut self, sched: &mut Scheduler, key: &Key) -> Result<(), Stop> {
        while let Some(f) = sched.take(key) {
            let lin = Lineage::from_key(sched.scope(), key);
            self.fire_firing(f, lin).await?;
        }
        Ok(())
    }

    async fn fire_ready(&mut self, sched: &mut Scheduler) -> Result<(), Stop> {
        loop {
            let keys = sched.ready_keys();
            if keys.is_empty() {
                return Ok(());
            }
            for k in keys {
                self.fire_key(sched, &k).await?;
            }
        }
    }

    async fn fire_firing(&mut self, f: Firing, lineage: Lineage) -> Result<(), Stop> {
        if let Special::Output { name } = self.s.special.clone() {
            // Output nodes are the kernel's own: the value becomes a run output.
            let v = f
                .into_iter()
                .next()
                .map(|(_, v)| v)
                .or_else(|| self.s.defaults.first().cloned().flatten())
                .unwrap_or(Value::Null);
            self.mark_started();
            self.invocations += 1;
            self.emit(EventKind::Output {
                node_id: self.s.id.to_string(),
                name: name.to_string(),
                value: v.clone(),
            });
            self.outputs.push(v);
            return Ok(());
        }
        let mut inputs = self.s.base_inputs.clone();
        for (h, v) in &f {
            inputs.insert(self.s.handles[*h].name.to_string(), v.clone());
        }
        self.fire(inputs, f, lineage).await
    }

    /// Runs one invocation (buffered, streaming output) and routes what it produces.
    async fn fire(&mut self, inputs: Inputs, used: Firing, lineage: Lineage) -> Result<(), Stop> {
        self.mark_started();
        let key = self.key_text(&lineage);
        let streaming = self.s.decl.mode == NodeMode::StreamingOutput;
        let mut inputs = Some(inputs);
        loop {
            let (emit_tx, emit_rx) = if streaming {
                let (tx, rx) = mpsc::channel(EMIT_BUFFER);
                (Some(tx), Some(rx))
            } else {
                (None, None)
            };
            let (token, deadline) = self.invocation_token();
            let ctx = self.ctx(key.clone(), token.clone(), deadline, emit_tx);
            self.invocations += 1;
            let t0 = self.clock();
            let exec = self.s.exec.clone();
            // A retry re-invokes with the inputs rebuilt from the same firing.
            let inputs = inputs.take().unwrap_or_else(|| self.rebuild_inputs(&used));
            let fut = exec.invoke(Call {
                inputs,
                ctx: ctx.clone(),
            });
            let mut mint = Mint::default();
            let result = self
                .drive(fut, emit_rx, &lineage, &mut mint, &token, deadline)
                .await?;
            self.account(&ctx, t0, &key, result.as_ref().err());
            let out = match result {
                Ok(out) => out,
                Err(e) => {
                    let rec = InvocationRecord {
                        inputs: self.rebuild_inputs(&used),
                        key: key.clone(),
                        lineage_len: lineage.len(),
                        lineage: lineage.clone(),
                        metrics: ctx.metrics(),
                        attempt: 1,
                        emitted: ctx.has_emitted(),
                    };
                    match self.handle_invocation_error(e, rec).await? {
                        Recovery::Retry => continue,
                        Recovery::Substitute(out) => out,
                        Recovery::Skip => {
                            self.sup_skips += 1;
                            return self.forward_dropped(&lineage).await;
                        }
                        Recovery::EndStream => {
                            // What was emitted stays; the children minted so far are
                            // complete.
                            return self.close_minted(&lineage).await;
                        }
                    }
                }
            };
            self.record_for_supervisor(&lineage, &out, &ctx);
            self.route_outputs(&out, &lineage, &mut mint).await?;
            self.close_minted(&lineage).await?;
            self.last_result = Some(out);
            return Ok(());
        }
    }

    /// Keeps outputs per lineage for the supervisor's `read_node_output` tool (only when
    /// the run is supervised).
    fn record_for_supervisor(&self, lineage: &Lineage, out: &Outputs, ctx: &NodeCtx) {
        if let Some(esc) = &self.sh.escalator {
            esc.state().record_invocation(
                &self.s.id,
                lineage.entries(),
                Some(out),
                ctx.metrics().cost_usd,
            );
        }
    }

    fn lineage_steps(&self, lineage: &Lineage) -> Vec<crate::supervisor::LineageStep> {
        lineage
            .entries()
            .iter()
            .map(|(r, i)| crate::supervisor::LineageStep {
                root: self
                    .sh
                    .roots
                    .get(*r as usize)
                    .map(|x| x.name.to_string())
                    .unwrap_or_default(),
                index: u64::from(*i),
            })
            .collect()
    }

    fn rebuild_inputs(&self, used: &Firing) -> Inputs {
        let mut inputs = self.s.base_inputs.clone();
        for (h, v) in used {
            inputs.insert(self.s.handles[*h].name.to_string(), v.clone());
        }
        inputs
    }

    fn key_text(&self, lineage: &Lineage) -> Arc<str> {
        if lineage.is_empty() {
            self.root_key.clone()
        } else {
            Arc::from(lineage.canonical(&self.sh.roots))
        }
    }

    fn invocation_token(&self) -> (InvToken, Option<Instant>) {
        match self.s.timeout {
            // A per-invocation child, so a deadline cancels this invocation only.
            Some(t) => (
                InvToken(Arc::new(self.node_token.child_token())),
                Some(Instant::now() + t),
            ),
            None => (self.node_token.clone(), None),
        }
    }

    fn ctx(
        &mut self,
        key: Arc<str>,
        token: InvToken,
        deadline: Option<Instant>,
        emit: Option<mpsc::Sender<Emitted>>,
    ) -> NodeCtx {
        // Without a deadline the token is the node's own: the last context can be
        // re-armed instead of rebuilt (no allocation, no token clone).
        let reusable = deadline.is_none();
        if reusable
            && let Some(spare) = &mut self.spare_ctx
            && spare.try_rearm(key.clone(), None, emit.clone())
        {
            return spare.clone();
        }
        let ctx = NodeCtx::new(CtxParts {
            node_id: self.s.id.clone(),
            node_type: self.s.node_type.clone(),
            key,
            cancel: (*token.0).clone(),
            deadline,
            events: self.sh.bus.clone(),
            emit,
            secrets: self.sh.secrets.clone(),
        });
        if reusable {
            self.spare_ctx = Some(ctx.clone());
        }
        ctx
    }

    /// Sums the invocation's metrics; publishes them when the executor measured more
    /// than wall time.
    /// Start of an invocation's wall time. Native built-ins measure nothing (their
    /// invocations cost less than reading the clock twice), so they skip the clock.
    fn clock(&self) -> Instant {
        if self.native {
            self.epoch
        } else {
            Instant::now()
        }
    }

    fn account(&mut self, ctx: &NodeCtx, t0: Instant, key: &Arc<str>, err: Option<&NodeError>) {
        if self.native {
            return;
        }
        let mut m = ctx.metrics();
        m.wall_us = t0.elapsed().as_micros() as u64;
        if m.fuel.is_some()
            || m.peak_memory_bytes.is_some()
            || m.cost_usd > 0.0
            || !m.assets.is_empty()
        {
            self.emit(EventKind::Invocation {
                node_id: self.s.id.to_string(),
                key: key.to_string(),
                metrics: m.clone(),
                error: err.map(|e| e.message.clone()),
            });
        }
        self.metrics.accumulate(&m);
    }

    /// Awaits an invocation future while routing what it emits, honouring cancellation
    /// and the deadline. The outer `Result` is a routing/cancel stop; the inner one the
    /// invocation's own result.
    async fn drive<'f>(
        &mut self,
        fut: crate::executor::BoxFuture<'f, Result<Outputs, NodeError>>,
        emit_rx: Option<mpsc::Receiver<Emitted>>,
        lineage: &Lineage,
        mint: &mut Mint,
        token: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<Result<Outputs, NodeError>, Stop> {
        let mut fut = fut;
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let timeout_ms = self.s.timeout.map(|t| t.as_millis()).unwrap_or(0);
        let Some(mut rx) = emit_rx else {
            let r = tokio::select! {
                biased;
                r = &mut fut => r,
                _ = token.cancelled() => Err(NodeError::cancelled()),
                _ = &mut sleep => {
                    token.cancel();
                    Err(NodeError::new(ErrorKind::Deadline, format!("invocation exceeded its time limit of {timeout_ms} ms")))
                }
            };
            return Ok(r);
        };
        let r = loop {
            tokio::select! {
                biased;
                e = rx.recv() => {
                    if let Some(e) = e {
                        self.route_emitted(e, lineage, mint).await?;
                    }
                }
                r = &mut fut => break r,
                _ = token.cancelled() => break Err(NodeError::cancelled()),
                _ = &mut sleep => {
                    token.cancel();
                    break Err(NodeError::new(ErrorKind::Deadline, format!("invocation exceeded its time limit of {timeout_ms} ms")));
                }
            }
        };
        drop(fut);
        // Everything emitted before the invocation returned goes out before its result.
        while let Ok(e) = rx.try_recv() {
            self.route_emitted(e, lineage, mint).await?;
        }
        Ok(r)
    }

    /// The one place an invocation failure is decided. With a supervisor the failure is
    /// escalated (suspension and cancellation never are) and the verdict, already
    /// checked against the allowed set, comes back as a [`Recovery`]; without one a
    /// failure fails the node. Routing failures never come here.
    async fn handle_invocation_error(
        &mut self,
        err: NodeError,
        rec: InvocationRecord,
    ) -> Result<Recovery, Stop> {
        let mut summary = None;
        if let Some(esc) = self.sh.escalator.clone()
            && crate::supervisor::escalates(&err)
        {
            esc.state().record_invocation(
                &self.s.id,
                rec.lineage.entries(),
                None,
                rec.metrics.cost_usd,
            );
            let resolution = esc
                .on_failure(crate::supervisor::FailedInvocation {
                    node_id: &self.s.id,
                    node_type: &self.s.node_type,
                    decl: &self.s.decl,
                    mode: self.s.decl.mode,
                    lineage: self.lineage_steps(&rec.lineage),
                    key: &rec.key,
                    inputs: &rec.inputs,
                    error: &err,
                    metrics: &rec.metrics,
                    emitted: rec.emitted,
                })
                .await;
            if self.sh.run_token.is_cancelled() {
                return Err(Stop::Cancelled);
            }
            match resolution {
                crate::supervisor::Resolution::Retry => return Ok(Recovery::Retry),
                crate::supervisor::Resolution::Substitute(o) => {
                    return Ok(Recovery::Substitute(o));
                }
                crate::supervisor::Resolution::Skip => return Ok(Recovery::Skip),
                crate::supervisor::Resolution::EndStream => return Ok(Recovery::EndStream),
                crate::supervisor::Resolution::Fail { summary: s } => summary = s,
            }
        }
        match err.kind {
            ErrorKind::Suspend { reason, state } => Err(Stop::Suspended(SuspendInfo {
                node_id: self.s.id.to_string(),
                reason,
                state,
            })),
            ErrorKind::Cancelled if self.sh.run_token.is_cancelled() => Err(Stop::Cancelled),
            kind => {
                let what = match kind {
                    ErrorKind::Deadline => "deadline exceeded: ",
                    ErrorKind::FuelExhausted => "fuel exhausted: ",
                    ErrorKind::MemoryLimit => "memory limit: ",
                    ErrorKind::OutputTooLarge => "output too large: ",
                    ErrorKind::Trap { .. } => "trap: ",
                    ErrorKind::Host => "host error: ",
                    _ => "",
                };
                let key = if rec.key.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", rec.key)
                };
                let original = format!(
                    "node \"{}\" (type {}) failed{key}: {what}{}",
                    self.s.id,
                    self.s.node_type,
                    self.sh.secrets.mask(&err.message)
                );
                // The decider's reason leads the run's error summary; the original error
                // stays with it (and in the intervention record).
                Err(Stop::Failed(match summary {
                    Some(reason) => format!("{reason} [supervisor; {original}]"),
                    None => original,
                }))
            }
        }
    }

    // ---------------------------------------------------------------- routing

    async fn send(&self, tx: &mpsc::Sender<Msg>, msg: Msg) -> Result<(), Stop> {
        match tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(()), // target gone: drop
            Err(mpsc::error::TrySendError::Full(msg)) => tokio::select! {
                biased;
                _ = tx.send(msg) => Ok(()),
                _ = self.sh.run_token.cancelled() => Err(Stop::Cancelled),
            },
        }
    }

    fn port_index(&self, handle: &str) -> Option<usize> {
        self.s.ports.iter().position(|p| &*p.name == handle)
    }

    async fn route_outputs(
        &mut self,
        out: &Outputs,
        lineage: &Lineage,
        mint: &mut Mint,
    ) -> Result<(), Stop> {
        let mut vals: SmallVec<[(usize, Value); 4]> = SmallVec::new();
        for (h, v) in out.iter() {
            match self.port_index(h) {
                Some(p) => vals.push((p, v.clone())),
                None => self.unknown_output(h),
            }
        }
        self.route_port_values(&vals, lineage, mint).await
    }

    async fn route_emitted(
        &mut self,
        e: Emitted,
        lineage: &Lineage,
        mint: &mut Mint,
    ) -> Result<(), Stop> {
        match self.port_index(&e.handle) {
            Some(p) => self.route_port_values(&[(p, e.value)], lineage, mint).await,
            None => {
                self.unknown_output(&e.handle);
                Ok(())
            }
        }
    }

    fn unknown_output(&self, h: &str) {
        if self.s.decl.output(h).is_none() {
            self.emit(EventKind::Log {
                node_id: self.s.id.to_string(),
                level: heddle_core::LogLevel::Warn,
                message: format!("node produced a value on undeclared output `{h}`; dropped"),
            });
        }
    }

    fn next_token(&mut self, root: RootIdx, parent: &Lineage) -> u32 {
        let k = (root, parent.key(&self.s.scope));
        let c = self.counters.entry(k).or_insert(0);
        let t = *c;
        *c += 1;
        t
    }

    async fn route_port_values(
        &mut self,
        vals: &[(usize, Value)],
        lineage: &Lineage,
        mint: &mut Mint,
    ) -> Result<(), Stop> {
        for (p, v) in vals {
            let p = *p;
            let port = &self.s.ports[p];
            if port.edges.is_empty() {
                continue;
            }
            if port.control {
                let Some(ev) = to_control_event(v) else {
                    continue;
                };
                for i in 0..self.s.ports[p].edges.len() {
                    let ev = ControlEvent {
                        event_type: ev.0.clone(),
                        properties: ev.1.clone(),
                        reply: None,
                    };
                    let tx = self.s.ports[p].edges[i].tx.clone();
                    self.send(&tx, Msg::Control(ev)).await?;
                    self.count_edge(p, i);
                }
                continue;
            }
            let base = lineage.truncate(port.keep);
            let lin = match port.mints {
                None => base,
                Some(root) => {
                    let bit = 1u64 << (p % 64);
                    let pos = mint.groups.iter().position(|g| g.0 == root);
                    let token = match pos {
                        Some(i) if mint.groups[i].2 & bit == 0 => {
                            mint.groups[i].2 |= bit;
                            mint.groups[i].1
                        }
                        _ => {
                            let t = self.next_token(root, &base);
                            match pos {
                                Some(i) => mint.groups[i] = (root, t, bit),
                                None => mint.groups.push((root, t, bit)),
                            }
                            t
                        }
                    };
                    base.child(root, token)
                }
            };
            let n = self.s.ports[p].edges.len();
            for i in 0..n {
                let e = &self.s.ports[p].edges[i];
                let msg = Msg::Data {
                    handle: e.handle,
                    value: v.clone(),
                    lineage: lin.clone(),
                };
                self.send(&e.tx, msg).await?;
                self.count_edge(p, i);
            }
        }
        Ok(())
    }

    fn count_edge(&mut self, p: usize, i: usize) {
        let e = &mut self.s.ports[p].edges[i];
        e.counter += 1;
        if e.last_event.is_none() {
            let now = Instant::now();
            e.last_event = Some(now);
            let id = e.edge_id.to_string();
            let c = e.counter;
            self.emit(EventKind::Edge {
                edge_id: id,
                status: EdgeStatus::Active,
                counter: c,
            });
        } else {
            e.dirty = true;
        }
    }

    /// Publishes throttled edge counters (at most one per edge per second).
    fn flush_edge_events(&mut self, _force: bool) {
        let mut now: Option<Instant> = None;
        let mut evs = Vec::new();
        for p in self.s.ports.iter_mut() {
            for e in p.edges.iter_mut() {
                if !e.dirty {
                    continue;
                }
                let t = *now.get_or_insert_with(Instant::now);
                if e.last_event
                    .is_some_and(|l| t.duration_since(l) >= EDGE_EVENT_INTERVAL)
                {
                    e.dirty = false;
                    e.last_event = Some(t);
                    evs.push(EventKind::Edge {
                        edge_id: e.edge_id.to_string(),
                        status: EdgeStatus::Active,
                        counter: e.counter,
                    });
                }
            }
        }
        for ev in evs {
            self.emit(ev);
        }
    }

    /// After an invocation of an iterating node: the children it minted under this key
    /// are complete, so aggregates downstream may finish (even with zero children).
    async fn close_minted(&mut self, lineage: &Lineage) -> Result<(), Stop> {
        if !self.has_mints {
            return Ok(());
        }
        let mut done: SmallVec<[RootIdx; 2]> = SmallVec::new();
        for p in 0..self.s.ports.len() {
            let Some(root) = self.s.ports[p].mints else {
                continue;
            };
            if done.contains(&root) {
                continue;
            }
            done.push(root);
            let parent = lineage.truncate(self.s.ports[p].keep);
            self.send_scope_closed(&parent, root).await?;
        }
        Ok(())
    }

    /// Sends `ScopeClosed(parent, root)` on every outgoing data edge whose scope
    /// carries `root`.
    async fn send_scope_closed(&mut self, parent: &Lineage, root: RootIdx) -> Result<(), Stop> {
        for p in 0..self.s.ports.len() {
            if self.s.ports[p].control || !self.s.ports[p].scope.contains(&root) {
                continue;
            }
            for i in 0..self.s.ports[p].edges.len() {
                let e = &self.s.ports[p].edges[i];
                let msg = Msg::ScopeClosed {
                    parent: parent.clone(),
                    root,
                };
                self.send(&e.tx, msg).await?;
            }
        }
        Ok(())
    }

    async fn forward_scope_closed(&mut self, parent: &Lineage, root: RootIdx) -> Result<(), Stop> {
        self.send_scope_closed(parent, root).await
    }

    /// A key this node will never fire for: tell downstream (done for its outputs,
    /// scope closed for the children it would have minted).
    pub(crate) async fn forward_dropped(&mut self, lineage: &Lineage) -> Result<(), Stop> {
        let mut minted: SmallVec<[RootIdx; 2]> = SmallVec::new();
        for p in 0..self.s.ports.len() {
            if self.s.ports[p].control {
                continue;
            }
            if let Some(root) = self.s.ports[p].mints {
                if !minted.contains(&root) {
                    minted.push(root);
                }
                continue;
            }
            let lin = lineage.truncate(self.s.ports[p].keep);
            for i in 0..self.s.ports[p].edges.len() {
                let e = &self.s.ports[p].edges[i];
                let msg = Msg::Done {
                    handle: e.handle,
                    lineage: lin.clone(),
                };
                self.send(&e.tx, msg).await?;
            }
        }
        for root in minted {
            self.send_scope_closed(lineage, root).await?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- streaming input

    async fn run_streaming_input(&mut self) -> Result<(), Stop> {
        let aggregate = !self.s.scope.is_empty()
            && self
                .s
                .decl
                .outputs
                .iter()
                .any(|o| matches!(o.correlation, heddle_core::OutputCorrelation::Aggregate));
        if aggregate {
            self.run_aggregate().await
        } else {
            self.run_live_stream().await
        }
    }

    /// One session over the whole input stream, items fed as they arrive.
    async fn run_live_stream(&mut self) -> Result<(), Stop> {
        let mut buf: Vec<Msg> = Vec::with_capacity(BATCH);
        let mut pending: VecDeque<StreamItem> = VecDeque::new();
        // Wait for the first item (or the end) before starting the node: a node wired
        // to inputs that never deliver is skipped, not run on nothing.
        if !self.s.handles.is_empty() {
            while pending.is_empty() && !self.all_closed() {
                let n = tokio::select! {
                    biased;
                    n = self.s.rx.recv_many(&mut buf, BATCH) => n,
                    _ = self.sh.run_token.cancelled() => return Err(Stop::Cancelled),
                };
                if n == 0 {
                    break;
                }
                for m in buf.drain(..) {
                    self.stream_msg(m, &mut pending);
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
        }
        self.mark_started();
        let (stx, srx) = mpsc::channel::<StreamItem>(self.sh.limits.buffer.max(1));
        let mut stx = Some(stx);
        let (etx, mut erx) = mpsc::channel::<Emitted>(EMIT_BUFFER);
        let (token, deadline) = self.invocation_token();
        let key = self.sh.root_key.clone();
        let ctx = self.ctx(key.clone(), token.clone(), deadline, Some(etx));
        self.invocations += 1;
        let t0 = self.clock();
        let exec = self.s.exec.clone();
        let mut fut = exec.run_stream(
            InputStream::new(srx, self.s.base_inputs.clone()),
            ctx.clone(),
        );
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let mut mint = Mint::default();
        let lineage = Lineage::ROOT;
        let mut stream_gone = false;
        let result = loop {
            if stream_gone {
                // The node stopped reading: what is still queued has nowhere to go.
                pending.clear();
                stx = None;
                stream_gone = false;
            }
            if self.all_closed() && pending.is_empty() {
                stx = None;
            }
            let can_recv = pending.is_empty() && !self.all_closed();
            tokio::select! {
                biased;
                e = erx.recv() => {
                    if let Some(e) = e {
                        self.route_emitted(e, &lineage, &mut mint).await?;
                    }
                }
                r = &mut fut => break r,
                permit = reserve(&stx), if !pending.is_empty() => {
                    match permit {
                        Some(p) => p.send(pending.pop_front().expect("pending checked non-empty")),
                        None => stream_gone = true,
                    }
                }
                n = self.s.rx.recv_many(&mut buf, BATCH), if can_recv => {
                    if n == 0 {
                        for o in self.open.iter_mut() { *o = 0; }
                    }
                    for m in buf.drain(..) {
                        self.stream_msg(m, &mut pending);
                    }
                    self.flush_edge_events(false);
                }
                _ = token.cancelled() => break Err(NodeError::cancelled()),
                _ = &mut sleep => {
                    token.cancel();
                    break Err(NodeError::new(ErrorKind::Deadline, format!(
                        "invocation exceeded its time limit of {} ms",
                        self.s.timeout.map(|t| t.as_millis()).unwrap_or(0)
                    )));
                }
            }
        };
        drop(fut);
        drop(stx);
        while let Ok(e) = erx.try_recv() {
            self.route_emitted(e, &lineage, &mut mint).await?;
        }
        self.account(&ctx, t0, &key, result.as_ref().err());
        match result {
            Ok(out) => {
                self.route_outputs(&out, &lineage, &mut mint).await?;
                self.close_minted(&lineage).await?;
                self.last_result = Some(out);
                // Drain what arrived after the node stopped reading (ends, signals).
                Ok(())
            }
            Err(e) => {
                let rec = InvocationRecord {
                    inputs: self.s.base_inputs.clone(),
                    key,
                    lineage_len: 0,
                    lineage: lineage.clone(),
                    metrics: ctx.metrics(),
                    attempt: 1,
                    emitted: ctx.has_emitted(),
                };
                // A streaming-input node may only be ended (end_stream) or failed: what
                // it emitted stays, the rest of its input is dropped.
                self.handle_invocation_error(e, rec).await.map(|_| ())
            }
        }
    }

    fn stream_msg(&mut self, m: Msg, pending: &mut VecDeque<StreamItem>) {
        match m {
            Msg::Data { handle, value, .. } => {
                self.received = true;
                pending.push_back(StreamItem {
                    handle: self.s.handles[handle as usize].name.clone(),
                    value,
                });
            }
            Msg::Eos { handle, end } => {
                self.ends.push(end);
                let h = handle as usize;
                self.open[h] = self.open[h].saturating_sub(1);
            }
            Msg::Control(ev) => reply_not_controlled(ev, &self.s.id),
            _ => {}
        }
    }

    /// Aggregating streaming-input node: one session per parent key, run when the
    /// child scope closes, items in item-index order.
    async fn run_aggregate(&mut self) -> Result<(), Stop> {
        let depth = self.s.scope.len() - 1;
        let inner = self.s.scope[depth];
        let mut sessions: BTreeMap<Key, Vec<(u32, u16, Value)>> = BTreeMap::new();
        let mut buf = Vec::with_capacity(BATCH);
        while !self.all_closed() {
            let n = tokio::select! {
                biased;
                n = self.s.rx.recv_many(&mut buf, BATCH) => n,
                _ = self.sh.run_token.cancelled() => return Err(Stop::Cancelled),
            };
            if n == 0 {
                break;
            }
            let mut batch = std::mem::take(&mut buf);
            for m in batch.drain(..) {
                match m {
                    Msg::Data {
                        handle,
                        value,
                        lineage,
                    } => {
                        self.received = true;
                        let key = lineage.key(&self.s.scope);
                        let parent: Key = key[..depth].iter().copied().collect();
                        sessions
                            .entry(parent)
                            .or_default()
                            .push((key[depth], handle, value));
                    }
                    Msg::Eos { handle, end } => {
                        self.ends.push(end);
                        let h = handle as usize;
                        self.open[h] = self.open[h].saturating_sub(1);
                    }
                    Msg::ScopeClosed { parent, root, .. } => {
                        if !self.scope_close_complete(root, &parent) {
                            continue;
                        }
                        if root == inner {
                            let pk = parent.key(&self.s.scope[..depth]);
                            let items = sessions.remove(&pk).unwrap_or_default();
                            self.received = true;
                            self.run_session(pk, items).await?;
                        } else if let Some(d) = self.s.scope.iter().position(|r| *r == root) {
                            let pk = parent.key(&self.s.scope[..d]);
                            let under: Vec<Key> =
                                sessions.keys().filter(|k| k[..d] == *pk).cloned().collect();
                            for k in under {
                                let items = sessions.remove(&k).unwrap_or_default();
                                self.run_session(k, items).await?;
                            }
                            self.forward_scope_closed(&parent, root).await?;
                        }
                    }
                    Msg::Done { .. } => {}
                    Msg::Control(ev) => reply_not_controlled(ev, &self.s.id),
                    _ => {}
                }
            }
            buf = batch;
            self.flush_edge_events(false);
        }
        for (k, items) in std::mem::take(&mut sessions) {
            self.run_session(k, items).await?;
        }
        Ok(())
    }

    async fn run_session(
        &mut self,
        parent: Key,
        mut items: Vec<(u32, u16, Value)>,
    ) -> Result<(), Stop> {
        self.mark_started();
        items.sort_by_key(|(i, _, _)| *i);
        let depth = self.s.scope.len() - 1;
        let lineage = Lineage::from_key(&self.s.scope[..depth], &parent);
        let key = self.key_text(&lineage);
        let (stx, srx) = mpsc::channel::<StreamItem>(items.len().max(1));
        for (_, h, v) in items {
            // Capacity equals the item count, so this cannot fail.
            let _ = stx.try_send(StreamItem {
                handle: self.s.handles[h as usize].name.clone(),
                value: v,
            });
        }
        drop(stx);
        let (etx, erx) = mpsc::channel::<Emitted>(EMIT_BUFFER);
        let (token, deadline) = self.invocation_token();
        let ctx = self.ctx(key.clone(), token.clone(), deadline, Some(etx));
        self.invocations += 1;
        let t0 = self.clock();
        let exec = self.s.exec.clone();
        let fut = exec.run_stream(
            InputStream::new(srx, self.s.base_inputs.clone()),
            ctx.clone(),
        );
        let mut mint = Mint::default();
        let result = self
            .drive(fut, Some(erx), &lineage, &mut mint, &token, deadline)
            .await?;
        self.account(&ctx, t0, &key, result.as_ref().err());
        match result {
            Ok(out) => {
                self.route_outputs(&out, &lineage, &mut mint).await?;
                self.last_result = Some(out);
                Ok(())
            }
            Err(e) => {
                let rec = InvocationRecord {
                    inputs: self.s.base_inputs.clone(),
                    key,
                    lineage_len: lineage.len(),
                    lineage: lineage.clone(),
                    metrics: ctx.metrics(),
                    attempt: 1,
                    emitted: ctx.has_emitted(),
                };
                // Streaming input: end_stream (keep what was emitted) or fail only.
                self.handle_invocation_error(e, rec).await.map(|_| ())
            }
        }
    }

    // ---------------------------------------------------------------- controlled

    async fn run_controlled(&mut self) -> Result<(), Stop> {
        let mut latest: Vec<Option<Value>> = vec![None; self.s.handles.len()];
        let mut held: VecDeque<ControlEvent> = VecDeque::new();
        let mut controllers = self.s.controllers;
        let mut external = controllers == 0;
        if external {
            controllers = 1;
        }
        let mut buf = Vec::with_capacity(BATCH);
        let mut ready = false;
        loop {
            if !ready {
                ready = latest
                    .iter()
                    .zip(&self.open)
                    .all(|(l, o)| l.is_some() || *o == 0);
            }
            if ready {
                while let Some(ev) = held.pop_front() {
                    if !self.control_event(ev, &latest).await? {
                        return Ok(());
                    }
                }
            }
            if controllers == 0 {
                // Every controller has finished: answer what is still queued.
                for ev in held.drain(..) {
                    if let Some(r) = ev.reply {
                        let _ = r.send(Err(format!(
                            "node {} finished before it could run the control event",
                            self.s.id
                        )));
                    }
                }
                return Ok(());
            }
            let n = tokio::select! {
                biased;
                n = self.s.rx.recv_many(&mut buf, BATCH) => n,
                _ = self.sh.run_token.cancelled() => return Err(Stop::Cancelled),
                // No controller in the graph: the caller drives it until it stops
                // interacting with the run (waits for its end).
                _ = self.sh.external_closed.cancelled(), if external => {
                    external = false;
                    controllers = controllers.saturating_sub(1);
                    continue;
                }
            };
            if n == 0 {
                return Ok(());
            }
            for m in buf.drain(..) {
                match m {
                    Msg::Data { handle, value, .. } => {
                        self.received = true;
                        latest[handle as usize] = Some(value);
                    }
                    Msg::Eos { handle, end } => {
                        self.ends.push(end);
                        let h = handle as usize;
                        self.open[h] = self.open[h].saturating_sub(1);
                    }
                    Msg::Control(ev) => held.push_back(ev),
                    Msg::ControlEos => controllers = controllers.saturating_sub(1),
                    _ => {}
                }
            }
            self.flush_edge_events(false);
        }
    }

    /// Runs one control event; `false` when it was a stop.
    async fn control_event(
        &mut self,
        ev: ControlEvent,
        latest: &[Option<Value>],
    ) -> Result<bool, Stop> {
        if ev.event_type == "stop" {
            if let Some(r) = ev.reply {
                let _ = r.send(Ok(Outputs::new()));
            }
            return Ok(false);
        }
        if ev.event_type != "run" {
            if let Some(r) = ev.reply {
                let _ = r.send(Err(format!(
                    "unknown control event type `{}`",
                    ev.event_type
                )));
            }
            return Ok(true);
        }
        self.received = true;
        let mut inputs = self.s.base_inputs.clone();
        let mut used = Firing::new();
        for (i, v) in latest.iter().enumerate() {
            if let Some(v) = v {
                inputs.insert(self.s.handles[i].name.to_string(), v.clone());
                used.push((i, v.clone()));
            }
        }
        // Event properties apply to this invocation only.
        for (k, v) in ev.properties {
            inputs.insert(k, v);
        }
        self.mark_started();
        let lineage = Lineage::ROOT;
        let key = self.sh.root_key.clone();
        let mut next_inputs = Some(inputs);
        loop {
            let (token, deadline) = self.invocation_token();
            let (etx, erx) = mpsc::channel(EMIT_BUFFER);
            let ctx = self.ctx(key.clone(), token.clone(), deadline, Some(etx));
            self.invocations += 1;
            let t0 = self.clock();
            let inputs = next_inputs
                .take()
                .expect("inputs are put back before a retry");
            let record_inputs = inputs.clone();
            let exec = self.s.exec.clone();
            let fut = exec.invoke(Call {
                inputs,
                ctx: ctx.clone(),
            });
            let mut mint = Mint::default();
            let result = self
                .drive(fut, Some(erx), &lineage, &mut mint, &token, deadline)
                .await?;
            self.account(&ctx, t0, &key, result.as_ref().err());
            let out = match result {
                Ok(out) => out,
                Err(e) => {
                    let message = e.message.clone();
                    let rec = InvocationRecord {
                        inputs: record_inputs.clone(),
                        key: key.clone(),
                        lineage_len: 0,
                        lineage: lineage.clone(),
                        metrics: ctx.metrics(),
                        attempt: 1,
                        emitted: ctx.has_emitted(),
                    };
                    let _ = &used;
                    match self.handle_invocation_error(e, rec).await {
                        Ok(Recovery::Retry) => {
                            next_inputs = Some(record_inputs);
                            continue;
                        }
                        Ok(Recovery::Substitute(out)) => out,
                        // Skip (end_stream is not offered to a controlled node): this
                        // event produces nothing; the node keeps serving events.
                        Ok(Recovery::Skip | Recovery::EndStream) => {
                            self.sup_skips += 1;
                            if let Some(r) = ev.reply {
                                let _ =
                                    r.send(Err(format!("{message} (skipped by the supervisor)")));
                            }
                            return Ok(true);
                        }
                        Err(stop) => {
                            if let Some(r) = ev.reply {
                                let _ = r.send(Err(message));
                            }
                            return Err(stop);
                        }
                    }
                }
            };
            self.record_for_supervisor(&lineage, &out, &ctx);
            self.route_outputs(&out, &lineage, &mut mint).await?;
            if let Some(r) = ev.reply {
                let _ = r.send(Ok(out.clone()));
            }
            self.last_result = Some(out);
            return Ok(true);
        }
    }

    // ---------------------------------------------------------------- the end

    fn skip_reason(&self) -> SkipReason {
        if self.sh.run_token.is_cancelled() {
            return SkipReason::Cancelled;
        }
        if self.ends.contains(&End::Cancelled) {
            SkipReason::Cancelled
        } else if self.ends.contains(&End::Failed) {
            SkipReason::UpstreamFailed
        } else if self.ends.contains(&End::Suspended) {
            SkipReason::Suspended
        } else if self.ends.contains(&End::Skipped) {
            SkipReason::UpstreamSkipped
        } else {
            SkipReason::NoInput
        }
    }

    async fn finish(mut self, res: Result<(), Stop>) -> ActorReport {
        let (outcome, end, stop) = match res {
            Ok(()) => {
                let ran = self.invocations > 0 || self.started;
                if self.sup_skips > 0 && self.last_result.is_none() {
                    (
                        NodeOutcome::Skipped {
                            reason: SkipReason::Supervisor,
                        },
                        End::Skipped,
                        None,
                    )
                } else if ran || matches!(self.s.special, Special::Input { .. }) {
                    (NodeOutcome::Done, End::Done, None)
                } else {
                    let reason = self.skip_reason();
                    // Downstream learns the root cause, not just "skipped".
                    let end = match reason {
                        SkipReason::UpstreamFailed => End::Failed,
                        SkipReason::Suspended => End::Suspended,
                        SkipReason::Cancelled => End::Cancelled,
                        _ => End::Skipped,
                    };
                    (NodeOutcome::Skipped { reason }, end, None)
                }
            }
            Err(Stop::Cancelled) => (
                NodeOutcome::Skipped {
                    reason: SkipReason::Cancelled,
                },
                End::Cancelled,
                Some(Stop::Cancelled),
            ),
            Err(Stop::Failed(msg)) => (
                NodeOutcome::Failed { error: msg.clone() },
                End::Failed,
                Some(Stop::Failed(msg)),
            ),
            Err(Stop::Abort(msg)) => {
                // An inbox limit aborts the whole run.
                self.sh.run_token.cancel();
                (
                    NodeOutcome::Failed { error: msg.clone() },
                    End::Failed,
                    Some(Stop::Abort(msg)),
                )
            }
            Err(Stop::Suspended(info)) => (
                NodeOutcome::Suspended,
                End::Suspended,
                Some(Stop::Suspended(info)),
            ),
        };
        // Closing the inbox: further sends to this node are dropped.
        self.s.rx.close();
        self.send_eos(end).await;
        match &outcome {
            NodeOutcome::Done => {
                let result = if matches!(self.s.special, Special::None)
                    && &*self.s.node_type != "heddle.constant"
                {
                    self.last_result.clone()
                } else {
                    None
                };
                self.node_event(NodeStatus::Completed, result, None, None);
            }
            NodeOutcome::Failed { error } => {
                self.node_event(NodeStatus::Failed, None, Some(error.clone()), None)
            }
            NodeOutcome::Skipped { reason } => {
                self.node_event(NodeStatus::Skipped, None, None, Some(*reason))
            }
            NodeOutcome::Suspended => {
                let state = match &stop {
                    Some(Stop::Suspended(i)) => Some(Outputs::one("state", i.state.clone())),
                    _ => None,
                };
                self.node_event(NodeStatus::Suspended, state, None, None)
            }
        }
        ActorReport {
            outcome,
            invocations: self.invocations,
            metrics: std::mem::take(&mut self.metrics),
            outputs: std::mem::take(&mut self.outputs),
            stop,
        }
    }

    /// End-of-stream on every outgoing edge (exactly once), control EOS once per
    /// controlled target, and the final edge counters.
    async fn send_eos(&mut self, end: End) {
        if self.eos_sent {
            return;
        }
        self.eos_sent = true;
        let cancelled = self.sh.run_token.is_cancelled();
        let mut evs = Vec::new();
        for p in 0..self.s.ports.len() {
            let control = self.s.ports[p].control;
            for i in 0..self.s.ports[p].edges.len() {
                let e = &self.s.ports[p].edges[i];
                if !control {
                    let msg = Msg::Eos {
                        handle: e.handle,
                        end,
                    };
                    if cancelled {
                        let _ = e.tx.try_send(msg);
                    } else {
                        let tx = e.tx.clone();
                        let _ = self.send(&tx, msg).await;
                    }
                }
                let e = &self.s.ports[p].edges[i];
                evs.push(EventKind::Edge {
                    edge_id: e.edge_id.to_string(),
                    status: EdgeStatus::Completed,
                    counter: e.counter,
                });
            }
        }
        for tx in std::mem::take(&mut self.s.control_targets) {
            if cancelled {
                let _ = tx.try_send(Msg::ControlEos);
            } else {
                let _ = self.send(&tx, Msg::ControlEos).await;
            }
        }
        for ev in evs {
            self.emit(ev);
        }
    }
}

async fn reserve(tx: &Option<mpsc::Sender<StreamItem>>) -> Option<mpsc::Permit<'_, StreamItem>> {
    match tx {
        Some(tx) => tx.reserve().await.ok(),
        None => None,
    }
}

fn reply_not_controlled(ev: ControlEvent, id: &str) {
    if let Some(r) = ev.reply {
        let _ = r.send(Err(format!("node {id} is not a controlled node")));
    }
}

/// Model §2.7: a value with `event_type` is a control event as is; a plain object is a
/// `run` event with those properties (a nested `properties` object is unwrapped);
/// anything else is ignored.
fn to_control_event(v: &Value) -> Option<(String, BTreeMap<String, Value>)> {
    let obj = v.as_object()?;
    if let Some(t) = obj.get("event_type").and_then(|t| t.as_str()) {
        let props = obj
            .get("properties")
            .and_then(|p| p.as_object())
            .cloned()
            .unwrap_or_default();
        return Some((t.to_string(), props));
    }
    let props = match obj.get("properties").and_then(|p| p.as_object()) {
        Some(p) => p.clone(),
        None => obj.clone(),
    };
    Some(("run".to_string(), props))
}

/// Declared type of an input node's values (`type` property).
pub(crate) fn input_type(props: &BTreeMap<String, Value>) -> Result<PortType, String> {
    match props.get("type").and_then(|t| t.as_str()) {
        None => Ok(PortType::Any),
        Some(s) => s.parse::<PortType>().map_err(|e| e.0),
    }
}

/// Checks (and losslessly coerces) an external input value.
pub(crate) fn check_input(ty: &PortType, v: Value) -> Result<Value, String> {
    let v = ty.coerce(v);
    ty.check(&v)?;
    Ok(v)
}
