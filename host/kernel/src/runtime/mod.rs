//! The native actor runtime: runs a [`Plan`] on the current tokio runtime.
//!
//! One actor per node, one inbox per actor. An inbox is a bounded mpsc channel, made
//! when first used (`inbox`), whose receiving end, and all per-handle state behind it
//! (buffers, open-upstream counts, end-of-stream, control upstreams, per-key buckets), is
//! owned by the actor task, so the hot path takes no lock: a hop is a channel send plus a
//! batched drain. Producers hold a sender into each target; a full channel is
//! backpressure. A native node fed by one edge from another native node runs in its
//! producer's task instead, its inbox a local queue of the same capacity (see
//! `actor::fused`).

mod actor;
pub mod bus;
pub mod control;
mod inbox;
mod inline;
pub mod lineage;
mod runner;
pub mod sched;
mod wiring;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use heddle_core::plan::{BoundInputs, GraphInput, InputError, InputErrors, Plan, ValidationError};
use heddle_core::{GraphDoc, RunResult, RunStatus, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use actor::InvocationRecord;
use actor::{ControlEvent, Msg, Shared};
pub use bus::{EventBus, EventRef, EventStream, Kinds, Observer};
pub use control::{CONTROL_CONTEXT_INPUT, ControlReply, Controls};
use inbox::{Inbox, InboxTx};
pub use lineage::Lineage;

use crate::executor::{Executor, NodeSpec, Outputs, SecretRegistry};
use crate::registry::Registry;

pub use heddle_core::plan::{INPUT_TYPE, OUTPUT_TYPE};

/// Inbox safety limits: values held for lineage keys that never complete would grow
/// without bound. Exceeding a pending limit aborts the run.
#[derive(Clone, Debug)]
pub struct InboxLimits {
    /// Lineage keys one node's inbox may hold waiting to fire at once; more means a
    /// scope that never closes, or a join whose other input never arrives.
    pub max_pending_keys: usize,
    /// Values one node's inbox may hold waiting for one key.
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

/// Everything about one run that is not the graph: its inputs, limits, secrets, and the
/// optional supervisor and journal. The default is an in-memory run without inputs,
/// supervision or time limit.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Values for input nodes, by external name.
    pub inputs: BTreeMap<String, Value>,
    /// The inboxes' safety limits and capacity.
    pub inbox: InboxLimits,
    /// How many events the run result retains (oldest half dropped when exceeded).
    pub event_cap: usize,
    /// Bytes of output values the run retains in all (run outputs and their events);
    /// past it a value is replaced by a marker naming its size. A node that re-emits
    /// one large buffer costs itself little: this keeps the host's copy bounded.
    pub output_cap_bytes: usize,
    /// Time limit per invocation for nodes that set none themselves.
    pub node_timeout: Option<Duration>,
    /// Registry of secret values handed to nodes, for masking.
    pub secrets: Arc<SecretRegistry>,
    /// Decides failed invocations (retry / substitute / skip / end_stream / fail). With
    /// `None` no escalation is ever built and a failure fails the node. The kernel wraps
    /// the handle in [`crate::supervisor::Bounded`] unless it already is bounded; give
    /// each run its own handle (bounds and sticky verdicts are per handle).
    pub supervisor: Option<Arc<dyn crate::supervisor::Supervisor>>,
    /// Makes the run durable: every invocation is recorded ahead (see
    /// [`crate::journal`]) and what an earlier process recorded is not run again.
    pub journal: Option<Arc<dyn crate::journal::Journal>>,
    /// Gate nodes a person approved (gate id → the reviewer's note, maybe empty): they
    /// pass their value on instead of suspending the run.
    pub approved_gates: BTreeMap<String, String>,
    /// Makes the run traced: every invocation attempt (but the native built-ins') gets a
    /// span id, handed to its code ([`crate::NodeCtx::traceparent`]) and carried by its
    /// `invocation` event, which is then published for every attempt, not only those
    /// that measured something (unless the trace is sampled out: its spans are never
    /// built). `None` (the default): nothing of the kind is done.
    pub trace: Option<Arc<heddle_core::trace::Traced>>,
    /// Publishes an `invocation` event for every attempt (but the native built-ins'),
    /// not only for those that measured something: what a consumer counting
    /// invocations (metrics) needs. A traced run always does.
    pub every_invocation: bool,
    /// The durable run's id, handed to every invocation ([`crate::NodeCtx::run_id`]):
    /// what a node that starts something outside this process (a container, a server)
    /// labels it with, so that the run's next owner finds and removes what this process
    /// left should it be killed outright (no `finalize` runs then). `None`: a run kept
    /// in memory, whose leftovers only the owner label finds.
    pub run_id: Option<Arc<str>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            inputs: BTreeMap::new(),
            inbox: InboxLimits::default(),
            event_cap: RunResult::EVENT_CAP,
            output_cap_bytes: RunResult::OUTPUT_CAP_BYTES,
            node_timeout: None,
            secrets: Arc::new(SecretRegistry::default()),
            supervisor: None,
            journal: None,
            approved_gates: BTreeMap::new(),
            trace: None,
            every_invocation: false,
            run_id: None,
        }
    }
}

/// Why a run could not be set up, or a live run refused a caller's request. A run that
/// starts and then fails is not an error: its [`RunResult`] says how it ended.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The graph did not plan; every problem is listed and no node started.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A node's provider refused to create its executor (a bad property, a package
    /// that does not load). Found before any node runs.
    #[error("node {node} (type {node_type}): cannot create its executor")]
    Create {
        /// The node's id.
        node: String,
        /// Its type name.
        node_type: String,
        /// Boxed: a node error carries a candidate output, too large for every
        /// `Result` of the kernel's API.
        #[source]
        source: Box<crate::executor::NodeError>,
    },
    /// The values given for the graph's inputs do not fit them (every problem at once).
    #[error(transparent)]
    Inputs(#[from] InputErrors),
    /// A value pushed into a live input, or the name it was pushed to, is wrong.
    #[error(transparent)]
    Input(#[from] InputError),
    /// [`RunHandle::push_input`] to an input that takes its value up front only.
    #[error(
        "input `{0}` is not a streaming input (set `streaming: true` on its node to push values while the run is live)"
    )]
    NotStreaming(String),
    /// A push to a streaming input that was finished, or whose run has ended.
    #[error("input `{0}` no longer accepts values (finished, or the run ended)")]
    InputClosed(String),
    /// A control event to a node id the plan does not have.
    #[error("no node `{0}` in this run")]
    UnknownNode(String),
    /// A control event to a node that does not take them.
    #[error(
        "node {0} does not take control events (not a controlled node, or no control edge reaches it and it runs as a buffered node)"
    )]
    NotControlled(String),
    /// The controlled node could not answer a control event (it completed, or the
    /// invocation the event caused failed).
    #[error("control event to node {node}: {message}")]
    Control {
        /// The node the event was sent to.
        node: String,
        /// What went wrong.
        message: String,
    },
}

/// A run that has been set up (executors created) but not started.
pub struct Run {
    plan: Arc<Plan>,
    executors: Vec<Arc<dyn Executor>>,
    opts: RunOptions,
    bus: Arc<EventBus>,
    inputs: BoundInputs,
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
                limits: n.limits.as_deref(),
            };
            let approved = opts.approved_gates.get(&*n.id);
            let created = match approved {
                Some(_) if &*n.node_type == heddle_core::gate::GATE_TYPE => {
                    Ok(crate::gate::Gate::executor(&spec, approved))
                }
                _ => registry.create(&spec),
            };
            let e = created.map_err(|source| KernelError::Create {
                node: n.id.to_string(),
                node_type: n.node_type.to_string(),
                source: Box::new(source),
            })?;
            executors.push(e);
        }
        // External inputs, bound by the plan (the CLI binds through the same code).
        let inputs = plan.bind_inputs(&opts.inputs)?;
        let plan = Arc::new(plan);
        let bus = EventBus::new(opts.event_cap, plan.clone());
        Ok(Run {
            plan,
            executors,
            opts,
            bus,
            inputs,
        })
    }

    /// The plan being run.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The wall-clock time its events' `at_us` count from.
    pub fn origin(&self) -> std::time::SystemTime {
        self.bus.origin()
    }

    /// Subscribes to the run's events before it starts, so nothing is missed (a later
    /// subscriber also gets the retained events first).
    pub fn subscribe(&self) -> EventStream {
        self.bus.subscribe()
    }

    /// Has `observer` read the run's events of `kinds` where they are published, from
    /// the first (see [`Observer`]): for a reader that folds them into something of
    /// its own (spans, metrics) without an allocation, a channel or a wake-up per event.
    pub fn observe(&self, kinds: Kinds, observer: Box<dyn Observer>) {
        self.bus.observe(kinds, observer);
    }

    /// Spawns the run on the current tokio runtime.
    pub fn start(self) -> RunHandle {
        let plan = self.plan.clone();
        let n = plan.nodes.len();
        let buffer = self.opts.inbox.buffer.max(1);
        let mut txs = Vec::with_capacity(n);
        let mut rxs = Vec::with_capacity(n);
        // Which native nodes run in their producer's task (see `actor::fused`).
        let fusion = actor::Fusion::new(&plan);
        for (i, node) in plan.nodes.iter().enumerate() {
            // Only a node something can send to gets an inbox (see `inbox::Inbox`), and
            // its channel only once an end uses it. A node fed through its group's local
            // queue gets none: only its producer sends to it, and only through that.
            let reachable = (!node.in_edges.is_empty()
                || &*node.node_type == INPUT_TYPE
                || !node.controllers.is_empty())
                && !fusion.fed_locally(i);
            let (tx, rx) = if reachable {
                let (tx, rx) = inbox::inbox(buffer);
                (Some(tx), rx)
            } else {
                (None, Inbox::none())
            };
            txs.push(tx);
            rxs.push(rx);
        }
        let txs: Arc<[Option<InboxTx>]> = txs.into();
        let run_token = CancellationToken::new();
        let escalator = self.opts.supervisor.clone().map(|sup| {
            let e = crate::supervisor::Escalator::new(
                sup,
                self.opts.secrets.clone(),
                self.bus.clone(),
                run_token.clone(),
            );
            e.state().declare(&plan);
            Arc::new(e)
        });
        let shared = Arc::new(Shared {
            bus: self.bus.clone(),
            roots: plan.correlation.roots.clone().into(),
            secrets: self.opts.secrets.clone(),
            run_token: run_token.clone(),
            cancelled: AtomicBool::new(false),
            plan: plan.clone(),
            below_abort: Default::default(),
            limits: self.opts.inbox.clone(),
            escalator,
            outputs_retained: actor::RetainedOutputs::new(self.opts.output_cap_bytes),
            journal: self.opts.journal.clone(),
            every_invocation: self.opts.every_invocation
                || self.opts.trace.as_ref().is_some_and(|t| t.run.sampled),
            trace: self.opts.trace.clone(),
            run_id: self.opts.run_id.clone(),
        });

        let controlled = plan
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| takes_control(node))
            .map(|(i, node)| (node.id.clone(), i))
            .collect();
        // The runner wires each actor when it starts it: a node that runs inline and ends
        // holds its wiring only meanwhile.
        let join = tokio::spawn(runner::run_all(
            self,
            txs.clone(),
            rxs,
            fusion,
            shared.clone(),
        ));
        RunHandle {
            shared,
            txs,
            controlled,
            plan,
            join,
        }
    }
}

/// A controlled node that a control edge reaches: the caller may drive it alongside its
/// controllers. (One no control edge reaches runs as a buffered node.)
fn takes_control(node: &heddle_core::plan::PlanNode) -> bool {
    node.decl.mode == heddle_core::NodeMode::Controlled && !node.controllers.is_empty()
}

/// A running run.
pub struct RunHandle {
    shared: Arc<Shared>,
    /// Inbox senders by node index (`None`: a node nothing can send to).
    txs: Arc<[Option<InboxTx>]>,
    /// The nodes `send_control` reaches, by id.
    controlled: HashMap<Arc<str>, usize>,
    plan: Arc<Plan>,
    join: JoinHandle<RunResult>,
}

impl RunHandle {
    /// Subscribes to the run's events: the retained ones first, then each as it
    /// happens; the stream ends after the run's final event.
    pub fn subscribe(&self) -> EventStream {
        self.shared.bus.subscribe()
    }

    /// The plan being run.
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

    /// The sender into node `i`'s inbox (every input node and every controlled node
    /// with a controller has one).
    fn inbox(&self, i: usize) -> Option<&mpsc::Sender<Msg>> {
        self.txs.get(i).and_then(Option::as_ref).map(|tx| &**tx)
    }

    /// The streaming input the caller calls `name`.
    fn streaming_input(&self, name: &str) -> Result<&GraphInput, KernelError> {
        let input = self.plan.input(name)?;
        if !input.streaming {
            return Err(KernelError::NotStreaming(name.to_string()));
        }
        Ok(input)
    }

    /// Pushes a value into a streaming input while the run is live (waits while the
    /// input's downstream is backed up).
    pub async fn push_input(&self, name: &str, value: Value) -> Result<(), KernelError> {
        let input = self.streaming_input(name)?;
        let value = input.check(value)?;
        self.inbox(input.node as usize)
            .ok_or_else(|| KernelError::InputClosed(name.to_string()))?
            .send(Msg::External(value))
            .await
            .map_err(|_| KernelError::InputClosed(name.to_string()))
    }

    /// Ends a streaming input: downstream nodes see its end-of-stream.
    pub async fn finish_input(&self, name: &str) -> Result<(), KernelError> {
        let input = self.streaming_input(name)?;
        self.inbox(input.node as usize)
            .ok_or_else(|| KernelError::InputClosed(name.to_string()))?
            .send(Msg::ExternalEos)
            .await
            .map_err(|_| KernelError::InputClosed(name.to_string()))
    }

    /// Sends a `run` control event with `properties` to a controlled node and resolves
    /// with the outputs of the invocation it causes. Concurrent calls are answered in
    /// the order they were sent (FIFO). The caller drives a node alongside its
    /// controllers, while one of them is live; a controlled node that no control edge
    /// reaches runs as a buffered node and refuses control events.
    pub async fn send_control(
        &self,
        node_id: &str,
        properties: BTreeMap<String, Value>,
    ) -> Result<Outputs, KernelError> {
        let Some(&i) = self.controlled.get(node_id) else {
            return Err(if self.plan.node_index(node_id).is_some() {
                KernelError::NotControlled(node_id.to_string())
            } else {
                KernelError::UnknownNode(node_id.to_string())
            });
        };
        let (tx, rx) = oneshot::channel();
        let closed = || KernelError::Control {
            node: node_id.to_string(),
            message: "the node has already completed".into(),
        };
        self.inbox(i)
            .ok_or_else(closed)?
            .send(Msg::Control(Box::new(ControlEvent {
                event_type: "run".into(),
                properties,
                origin: None,
                reply: Some(tx),
            })))
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
        drop(self.txs);
        match self.join.await {
            Ok(mut r) => {
                r.events = self.shared.bus.take_record();
                r
            }
            Err(e) => RunResult {
                status: RunStatus::Failed,
                outputs: BTreeMap::new(),
                error: Some(format!("the run's runner task failed: {e}")),
                suspend: None,
                nodes: Default::default(),
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
    /// Cancels the run, as [`RunHandle::cancel`] does.
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::SeqCst);
        self.shared.run_token.cancel();
    }
}

/// Polls `fut` once with the calling task's context: lets a caller finish work that is
/// ready at once without building the machinery (a task, a race, a timer) it would need
/// to wait for it.
pub(crate) async fn poll_once<F: std::future::Future + ?Sized>(
    mut fut: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await
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
