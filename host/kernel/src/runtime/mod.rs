//! The native actor runtime: runs a [`Plan`] on the current tokio runtime.
//!
//! One actor per node, one inbox per actor. An inbox is a bounded mpsc channel whose
//! receiving end, and all per-handle state behind it (buffers, open-upstream counts,
//! end-of-stream, control upstreams, per-key buckets), is owned by the actor task, so the
//! hot path takes no lock: a hop is a channel send plus a batched drain. Producers hold
//! a sender into each target; a full channel is backpressure.

mod actor;
pub mod bus;
pub mod lineage;
pub mod sched;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use heddle_core::graph::EdgeType;
use heddle_core::plan::{Plan, ValidationError};
use heddle_core::{
    EventKind, GraphDoc, NodeOutcome, NodeReport, PortType, RunResult, RunStatus, SkipReason,
    SuspendInfo, Value,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use actor::InvocationRecord;
use actor::{
    Actor, ActorReport, ActorSpec, ControlEvent, HandleSpec, Msg, NodeRole, OutEdge, OutPort,
    Shared, Stop,
};
pub use bus::{EventBus, EventStream};
pub use lineage::Lineage;

use crate::executor::{Executor, NodeSpec, Outputs, SecretRegistry};
use crate::registry::Registry;

pub const INPUT_TYPE: &str = "heddle.input";
pub const OUTPUT_TYPE: &str = "heddle.output";

/// Inbox safety limits: values held for lineage keys that never complete would grow
/// without bound. Exceeding a pending limit aborts the run.
#[derive(Clone, Debug)]
pub struct InboxLimits {
    pub max_pending_keys: usize,
    pub max_pending_messages_per_key: usize,
    /// Capacity of each node's inbox channel: a producer waits when it is full.
    pub buffer: usize,
}

impl Default for InboxLimits {
    fn default() -> Self {
        InboxLimits {
            max_pending_keys: 10_000,
            max_pending_messages_per_key: 10_000,
            buffer: 1024,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Values for input nodes, by external name.
    pub inputs: BTreeMap<String, Value>,
    pub inbox: InboxLimits,
    /// How many events the run result retains (oldest half dropped when exceeded).
    pub event_cap: usize,
    /// Time limit per invocation for nodes that set none themselves.
    pub node_timeout: Option<Duration>,
    /// Registry of secret values handed to nodes, for masking.
    pub secrets: Arc<SecretRegistry>,
    /// Decides failed invocations (retry / substitute / skip / end_stream / fail). With
    /// `None` no escalation is ever built and a failure fails the node. The kernel wraps
    /// the handle in [`crate::supervisor::Bounded`] unless it already is bounded; give
    /// each run its own handle (bounds and sticky verdicts are per handle).
    pub supervisor: Option<Arc<dyn crate::supervisor::Supervisor>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            inputs: BTreeMap::new(),
            inbox: InboxLimits::default(),
            event_cap: RunResult::EVENT_CAP,
            node_timeout: None,
            secrets: Arc::new(SecretRegistry::default()),
            supervisor: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("node {node} (type {node_type}): cannot create its executor")]
    Create {
        node: String,
        node_type: String,
        /// Boxed: a node error carries a candidate output, too large for every
        /// `Result` of the kernel's API.
        #[source]
        source: Box<crate::executor::NodeError>,
    },
    #[error("missing required workflow inputs: {}", .0.join(", "))]
    MissingInputs(Vec<String>),
    #[error("input `{name}` (node {node}): {message}")]
    InputValue {
        name: String,
        node: String,
        message: String,
    },
    #[error("no input named `{0}` in this graph")]
    UnknownInput(String),
    #[error(
        "input `{0}` is not a streaming input (set `streaming: true` on its node to push values while the run is live)"
    )]
    NotStreaming(String),
    #[error("input `{0}` no longer accepts values (finished, or the run ended)")]
    InputClosed(String),
    #[error("no node `{0}` in this run")]
    UnknownNode(String),
    #[error("node {0} is not a controlled node")]
    NotControlled(String),
    #[error("control event to node {node}: {message}")]
    Control { node: String, message: String },
}

/// A run that has been set up (executors created) but not started.
pub struct Run {
    plan: Arc<Plan>,
    executors: Vec<Arc<dyn Executor>>,
    opts: RunOptions,
    bus: Arc<EventBus>,
    inputs: Vec<Option<Value>>,
}

impl Run {
    /// Creates one executor per node. Errors name the node id and type.
    pub fn new(plan: Plan, registry: &Registry, opts: RunOptions) -> Result<Run, KernelError> {
        let mut executors = Vec::with_capacity(plan.nodes.len());
        for n in &plan.nodes {
            let spec = NodeSpec {
                id: &n.id,
                decl: &n.decl,
                properties: &n.properties,
                limits: n.limits.as_ref(),
            };
            let e = registry
                .create(&spec)
                .map_err(|source| KernelError::Create {
                    node: n.id.to_string(),
                    node_type: n.node_type.to_string(),
                    source: Box::new(source),
                })?;
            executors.push(e);
        }
        // External inputs: every name must exist, values must fit the declared type,
        // and every non-streaming input needs a value.
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, n) in plan.nodes.iter().enumerate() {
            if &*n.node_type == INPUT_TYPE {
                names.insert(&n.name, i);
            }
        }
        for k in opts.inputs.keys() {
            if !names.contains_key(k.as_str()) {
                return Err(KernelError::UnknownInput(k.clone()));
            }
        }
        let mut inputs = vec![None; plan.nodes.len()];
        let mut missing = Vec::new();
        for (i, n) in plan.nodes.iter().enumerate() {
            if &*n.node_type != INPUT_TYPE {
                continue;
            }
            let ty = actor::input_type(&n.properties).map_err(|m| KernelError::InputValue {
                name: n.name.to_string(),
                node: n.id.to_string(),
                message: format!("invalid `type` property: {m}"),
            })?;
            let v = opts
                .inputs
                .get(&*n.name)
                .cloned()
                .or_else(|| n.properties.get("value").cloned());
            match v {
                Some(v) => {
                    let v = actor::check_input(&ty, v).map_err(|m| KernelError::InputValue {
                        name: n.name.to_string(),
                        node: n.id.to_string(),
                        message: m,
                    })?;
                    inputs[i] = Some(v);
                }
                None if is_streaming(&n.properties) => {}
                None => missing.push(n.name.to_string()),
            }
        }
        if !missing.is_empty() {
            return Err(KernelError::MissingInputs(missing));
        }
        let bus = EventBus::new(opts.event_cap);
        Ok(Run {
            plan: Arc::new(plan),
            executors,
            opts,
            bus,
            inputs,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn subscribe(&self) -> EventStream {
        self.bus.subscribe()
    }

    /// Spawns the run on the current tokio runtime.
    pub fn start(self) -> RunHandle {
        let plan = self.plan.clone();
        let n = plan.nodes.len();
        let buffer = self.opts.inbox.buffer.max(1);
        let mut txs = Vec::with_capacity(n);
        let mut rxs = Vec::with_capacity(n);
        for _ in 0..n {
            let (tx, rx) = mpsc::channel::<Msg>(buffer);
            txs.push(tx);
            rxs.push(Some(rx));
        }
        let run_token = CancellationToken::new();
        let escalator = self.opts.supervisor.clone().map(|sup| {
            let e = crate::supervisor::Escalator::new(
                sup,
                self.opts.secrets.clone(),
                self.bus.clone(),
                run_token.clone(),
            );
            e.state()
                .set_roots(plan.correlation.roots.iter().map(|r| r.name.to_string()));
            for n in &plan.nodes {
                e.state().add_node(&n.id, &n.node_type);
            }
            Arc::new(e)
        });
        let shared = Arc::new(Shared {
            bus: self.bus.clone(),
            roots: plan.correlation.roots.clone().into(),
            secrets: self.opts.secrets.clone(),
            run_token: run_token.clone(),
            external_closed: CancellationToken::new(),
            cancelled: AtomicBool::new(false),
            limits: self.opts.inbox.clone(),
            escalator,
        });

        let mut inputs_by_name = HashMap::new();
        let mut node_index = HashMap::new();
        for (i, node) in plan.nodes.iter().enumerate() {
            node_index.insert(node.id.to_string(), i);
            if &*node.node_type == INPUT_TYPE {
                let ty = actor::input_type(&node.properties).unwrap_or(PortType::Any);
                inputs_by_name.insert(
                    node.name.to_string(),
                    (i, is_streaming(&node.properties), ty),
                );
            }
        }

        let specs: Vec<ActorSpec> = (0..n)
            .map(|i| self.spec(i, &txs, rxs[i].take().expect("one receiver per node")))
            .collect();
        let executors = self.executors.clone();
        let bus = self.bus.clone();
        let sh = shared.clone();
        let plan2 = plan.clone();
        let join = tokio::spawn(run_all(plan2, executors, specs, sh, bus));
        RunHandle {
            shared,
            txs: txs.into(),
            node_index,
            inputs_by_name,
            plan,
            join,
        }
    }

    fn spec(&self, i: usize, txs: &[mpsc::Sender<Msg>], rx: mpsc::Receiver<Msg>) -> ActorSpec {
        let plan = &self.plan;
        let node = &plan.nodes[i];
        let scope = plan.correlation.nodes.get(i).cloned().unwrap_or_default();
        let decl = node.decl.clone();

        let handles: Vec<HandleSpec> = scope
            .inputs
            .iter()
            .map(|(name, h)| HandleSpec {
                name: name.clone(),
                class: h.class,
                scope: h.scope.clone(),
                accumulates: h.accumulates,
                repeats: h.repeats_per_key,
                upstream: 0,
            })
            .collect();
        let mut handles = handles;
        let handle_idx = |node: usize, h: &str| -> Option<u16> {
            plan.correlation
                .nodes
                .get(node)
                .and_then(|s| s.inputs.keys().position(|k| &**k == h))
                .map(|p| p as u16)
        };
        let mut root_contrib: HashMap<u32, u32> = HashMap::new();
        let mut control_in: Vec<u32> = Vec::new();
        for &ei in &node.in_edges {
            let e = &plan.edges[ei as usize];
            match e.edge_type {
                EdgeType::Data => {
                    if let Some(h) = handle_idx(i, &e.target_handle) {
                        handles[h as usize].upstream += 1;
                        if let Some(es) = plan.correlation.edges.get(ei as usize) {
                            for r in &es.scope {
                                *root_contrib.entry(*r).or_insert(0) += 1;
                            }
                        }
                    }
                }
                EdgeType::Control => {
                    if !control_in.contains(&e.source) {
                        control_in.push(e.source);
                    }
                }
            }
        }

        // Output ports: declared outputs with their scopes, plus control ports.
        let mut ports: Vec<OutPort> = Vec::new();
        let mut control_targets: Vec<usize> = Vec::new();
        for &ei in &node.out_edges {
            let e = &plan.edges[ei as usize];
            let target = e.target as usize;
            let control = e.edge_type == EdgeType::Control;
            let handle = if control {
                0
            } else {
                match handle_idx(target, &e.target_handle) {
                    Some(h) => h,
                    None => continue,
                }
            };
            if control && !control_targets.contains(&target) {
                control_targets.push(target);
            }
            let pi = match ports
                .iter()
                .position(|p| p.name == e.source_handle && p.control == control)
            {
                Some(p) => p,
                None => {
                    let os = scope.outputs.get(&e.source_handle);
                    let (pscope, mints) = match os {
                        Some(o) => (o.scope.clone(), o.mints),
                        None => (scope.invocation_scope.clone(), None),
                    };
                    let keep = pscope.len() - usize::from(mints.is_some());
                    ports.push(OutPort {
                        name: e.source_handle.clone(),
                        keep,
                        scope: pscope,
                        mints,
                        control,
                        edges: Vec::new(),
                    });
                    ports.len() - 1
                }
            };
            ports[pi].edges.push(OutEdge {
                edge_id: e.id.clone(),
                tx: txs[target].clone(),
                handle,
                counter: 0,
                last_event: None,
                dirty: false,
            });
        }
        // Declared outputs without edges still get a port (values are dropped there
        // without a warning).
        for o in &decl.outputs {
            if !ports
                .iter()
                .any(|p| &*p.name == o.name.as_str() && !p.control)
            {
                let os = scope.outputs.get(o.name.as_str());
                let (pscope, mints) = match os {
                    Some(o) => (o.scope.clone(), o.mints),
                    None => (scope.invocation_scope.clone(), None),
                };
                let keep = pscope.len() - usize::from(mints.is_some());
                ports.push(OutPort {
                    name: Arc::from(o.name.as_str()),
                    keep,
                    scope: pscope,
                    mints,
                    control: false,
                    edges: Vec::new(),
                });
            }
        }
        if &*node.node_type == INPUT_TYPE {
            // The input node's single output must be port 0 (the kernel routes to it).
            if let Some(p) = ports.iter().position(|p| &*p.name == "value" && !p.control) {
                ports.swap(0, p);
            }
        }

        // Defaults: declared input/property defaults, then document properties.
        let mut base = BTreeMap::new();
        for p in decl.inputs.iter().chain(decl.properties.iter()) {
            if let Some(d) = &p.default {
                base.insert(p.name.clone(), d.clone());
            }
        }
        for (k, v) in &node.properties {
            base.insert(k.clone(), v.clone());
        }
        let defaults = handles
            .iter()
            .map(|h| decl.input(&h.name).and_then(|p| p.default.clone()))
            .collect();

        let role = if &*node.node_type == INPUT_TYPE {
            NodeRole::Input {
                streaming: is_streaming(&node.properties),
                initial: self.inputs[i].clone(),
            }
        } else if &*node.node_type == OUTPUT_TYPE {
            NodeRole::Output {
                name: node.name.clone(),
            }
        } else {
            NodeRole::Executor
        };
        let timeout = node
            .limits
            .as_ref()
            .and_then(|l| l.timeout_ms)
            .map(Duration::from_millis)
            .or(self.opts.node_timeout);
        let controllers = node.controllers.len().max(control_in.len());
        let driver = scope
            .repeating_driver
            .as_ref()
            .and_then(|d| scope.inputs.keys().position(|k| k == d));
        ActorSpec {
            idx: i,
            id: node.id.clone(),
            node_type: node.node_type.clone(),
            decl,
            exec: self.executors[i].clone(),
            base_inputs: base,
            defaults,
            handles,
            scope: scope.invocation_scope.clone(),
            driver,
            ports,
            control_targets: control_targets.iter().map(|t| txs[*t].clone()).collect(),
            controllers,
            root_contrib,
            timeout,
            role,
            rx,
        }
    }
}

fn is_streaming(props: &BTreeMap<String, Value>) -> bool {
    props
        .get("streaming")
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// The runner: initializes executors, runs every actor, finalizes, builds the result.
async fn run_all(
    plan: Arc<Plan>,
    executors: Vec<Arc<dyn Executor>>,
    specs: Vec<ActorSpec>,
    sh: Arc<Shared>,
    bus: Arc<EventBus>,
) -> RunResult {
    let t0 = Instant::now();
    bus.publish(EventKind::Run {
        status: RunStatus::Running,
        error: None,
    });
    // Initialize every executor in graph order before any actor starts.
    for (i, e) in executors.iter().enumerate() {
        let r = tokio::select! {
            biased;
            r = e.initialize() => r,
            _ = sh.run_token.cancelled() => Err(crate::executor::NodeError::cancelled()),
        };
        if let Err(err) = r {
            for e in &executors[..i] {
                e.finalize().await;
            }
            let n = &plan.nodes[i];
            let (status, error) = if sh.cancelled.load(Ordering::SeqCst) {
                (RunStatus::Cancelled, "cancelled".to_string())
            } else {
                (
                    RunStatus::Failed,
                    format!(
                        "node \"{}\" (type {}) failed to initialize: {}",
                        n.id, n.node_type, err.message
                    ),
                )
            };
            let nodes = plan
                .nodes
                .iter()
                .map(|n| {
                    (
                        n.id.to_string(),
                        NodeReport {
                            node_type: n.node_type.to_string(),
                            outcome: NodeOutcome::Skipped {
                                reason: if status == RunStatus::Cancelled {
                                    SkipReason::Cancelled
                                } else {
                                    SkipReason::UpstreamFailed
                                },
                            },
                            invocations: 0,
                            metrics: Default::default(),
                        },
                    )
                })
                .collect();
            return finish_result(&bus, status, Some(error), None, BTreeMap::new(), nodes, t0);
        }
    }

    let mut joins: Vec<(usize, JoinHandle<ActorReport>)> = Vec::with_capacity(specs.len());
    let mut reports: Vec<Option<ActorReport>> = (0..plan.nodes.len()).map(|_| None).collect();
    for s in specs {
        let idx = s.idx;
        let a = Actor::new(s, sh.clone());
        if a.inline_source() {
            // An actor is a logical unit, not necessarily a task: a ready native source
            // runs to completion right here unless it has to wait (a full downstream
            // inbox), in which case the rest of it becomes a task.
            let mut fut = Box::pin(a.run());
            match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
                std::task::Poll::Ready(r) => reports[idx] = Some(r),
                std::task::Poll::Pending => joins.push((idx, tokio::spawn(fut))),
            }
        } else {
            joins.push((idx, tokio::spawn(a.run())));
        }
    }
    let mut panics = Vec::new();
    for (idx, j) in joins {
        match j.await {
            Ok(r) => reports[idx] = Some(r),
            Err(e) => {
                let n = &plan.nodes[idx];
                panics.push(format!(
                    "node \"{}\" (type {}) panicked: {e}",
                    n.id, n.node_type
                ));
            }
        }
    }
    for e in &executors {
        e.finalize().await;
    }

    // Outcome, with precedence cancel > suspend > failed > completed.
    let mut outputs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let mut errors = Vec::new();
    let mut aborts = Vec::new();
    let mut suspend: Option<SuspendInfo> = None;
    for (i, r) in reports.into_iter().enumerate() {
        let n = &plan.nodes[i];
        let Some(r) = r else {
            nodes.insert(
                n.id.to_string(),
                NodeReport {
                    node_type: n.node_type.to_string(),
                    outcome: NodeOutcome::Failed {
                        error: "the node's actor panicked".into(),
                    },
                    invocations: 0,
                    metrics: Default::default(),
                },
            );
            continue;
        };
        if &*n.node_type == OUTPUT_TYPE {
            outputs
                .entry(n.name.to_string())
                .or_default()
                .extend(r.outputs);
        }
        match r.stop {
            Some(Stop::Failed(m)) => errors.push(m),
            Some(Stop::Abort(m)) => aborts.push(m),
            Some(Stop::Suspended(info)) if suspend.is_none() => suspend = Some(info),
            _ => {}
        }
        nodes.insert(
            n.id.to_string(),
            NodeReport {
                node_type: n.node_type.to_string(),
                outcome: r.outcome,
                invocations: r.invocations,
                metrics: r.metrics,
            },
        );
    }
    errors.extend(panics.iter().cloned());
    let all_errors: Vec<String> = aborts
        .iter()
        .cloned()
        .chain(errors.iter().cloned())
        .collect();
    let (status, error) = if sh.cancelled.load(Ordering::SeqCst) {
        (RunStatus::Cancelled, Some("cancelled".to_string()))
    } else if let Some(s) = &suspend {
        (
            RunStatus::Suspended,
            Some(format!("suspended by node \"{}\": {}", s.node_id, s.reason)),
        )
    } else if !all_errors.is_empty() {
        (RunStatus::Failed, Some(all_errors.join("; ")))
    } else {
        (RunStatus::Completed, None)
    };
    let mut result = finish_result(&bus, status, error, suspend, outputs, nodes, t0);
    if let Some(esc) = &sh.escalator {
        result.interventions = esc.interventions_json();
        esc.close();
    }
    result
}

fn finish_result(
    bus: &EventBus,
    status: RunStatus,
    error: Option<String>,
    suspend: Option<SuspendInfo>,
    outputs: BTreeMap<String, Vec<Value>>,
    nodes: BTreeMap<String, NodeReport>,
    t0: Instant,
) -> RunResult {
    bus.publish(EventKind::Run {
        status,
        error: error.clone(),
    });
    let (events, dropped) = bus.close();
    RunResult {
        status,
        outputs,
        error,
        suspend,
        nodes,
        interventions: Vec::new(),
        events: events.iter().map(|e| (**e).clone()).collect(),
        events_dropped: dropped,
        wall_us: t0.elapsed().as_micros() as u64,
    }
}

/// A running run.
pub struct RunHandle {
    shared: Arc<Shared>,
    txs: Arc<[mpsc::Sender<Msg>]>,
    node_index: HashMap<String, usize>,
    inputs_by_name: HashMap<String, (usize, bool, PortType)>,
    plan: Arc<Plan>,
    join: JoinHandle<RunResult>,
}

impl RunHandle {
    pub fn subscribe(&self) -> EventStream {
        self.shared.bus.subscribe()
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Cancels the run: every node's token is cancelled (executors abort in-flight
    /// work) and every actor stops and closes its inbox. Latched: the run ends
    /// `cancelled` even if it was about to complete.
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::SeqCst);
        self.shared.run_token.cancel();
    }

    /// A token that cancels the run when cancelled (for Ctrl-C handlers).
    pub fn canceller(&self) -> RunCanceller {
        RunCanceller {
            shared: self.shared.clone(),
        }
    }

    fn input(&self, name: &str) -> Result<(usize, &PortType), KernelError> {
        let (i, streaming, ty) = self
            .inputs_by_name
            .get(name)
            .ok_or_else(|| KernelError::UnknownInput(name.to_string()))?;
        if !streaming {
            return Err(KernelError::NotStreaming(name.to_string()));
        }
        Ok((*i, ty))
    }

    /// Pushes a value into a streaming input while the run is live (waits while the
    /// input's downstream is backed up).
    pub async fn push_input(&self, name: &str, value: Value) -> Result<(), KernelError> {
        let (i, ty) = self.input(name)?;
        let value = actor::check_input(ty, value).map_err(|m| KernelError::InputValue {
            name: name.to_string(),
            node: self.plan.nodes[i].id.to_string(),
            message: m,
        })?;
        self.txs[i]
            .send(Msg::External(value))
            .await
            .map_err(|_| KernelError::InputClosed(name.to_string()))
    }

    /// Ends a streaming input: downstream nodes see its end-of-stream.
    pub async fn finish_input(&self, name: &str) -> Result<(), KernelError> {
        let (i, _) = self.input(name)?;
        self.txs[i]
            .send(Msg::ExternalEos)
            .await
            .map_err(|_| KernelError::InputClosed(name.to_string()))
    }

    /// Sends a `run` control event with `properties` to a controlled node and resolves
    /// with the outputs of the invocation it causes. Concurrent calls are answered in
    /// the order they were sent (FIFO).
    pub async fn send_control(
        &self,
        node_id: &str,
        properties: BTreeMap<String, Value>,
    ) -> Result<Outputs, KernelError> {
        let i = *self
            .node_index
            .get(node_id)
            .ok_or_else(|| KernelError::UnknownNode(node_id.to_string()))?;
        if self.plan.nodes[i].decl.mode != heddle_core::NodeMode::Controlled {
            return Err(KernelError::NotControlled(node_id.to_string()));
        }
        let (tx, rx) = oneshot::channel();
        let closed = || KernelError::Control {
            node: node_id.to_string(),
            message: "the node has already completed".into(),
        };
        self.txs[i]
            .send(Msg::Control(ControlEvent {
                event_type: "run".into(),
                properties,
                reply: Some(tx),
            }))
            .await
            .map_err(|_| closed())?;
        match rx.await {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(message)) => Err(KernelError::Control {
                node: node_id.to_string(),
                message,
            }),
            Err(_) => Err(closed()),
        }
    }

    /// Waits for the run to end. Every actor task has finished when this returns.
    pub async fn wait(self) -> RunResult {
        self.shared.external_closed.cancel();
        drop(self.txs);
        match self.join.await {
            Ok(r) => r,
            Err(e) => RunResult {
                status: RunStatus::Failed,
                outputs: BTreeMap::new(),
                error: Some(format!("the run's runner task failed: {e}")),
                suspend: None,
                nodes: BTreeMap::new(),
                interventions: Vec::new(),
                events: Vec::new(),
                events_dropped: 0,
                wall_us: 0,
            },
        }
    }
}

/// Cancels a run from elsewhere (a signal handler) without holding the handle.
#[derive(Clone)]
pub struct RunCanceller {
    shared: Arc<Shared>,
}

impl RunCanceller {
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::SeqCst);
        self.shared.run_token.cancel();
    }
}

/// Plans `doc` and runs it to the end. An invalid graph returns
/// [`KernelError::Invalid`] with every problem, and no node starts.
pub async fn run_graph(
    doc: &GraphDoc,
    registry: &Registry,
    opts: RunOptions,
) -> Result<RunResult, KernelError> {
    let plan = heddle_core::plan::plan(doc, registry)?;
    let run = Run::new(plan, registry, opts)?;
    Ok(run.start().wait().await)
}
