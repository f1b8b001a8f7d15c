//! The typed event stream of a run, and the run result built from it.
//!
//! Everything that happens in a run is one [`Event`]. The CLI's progress view, its JSON
//! report, a durable log and any UI are all consumers of the same stream; nothing
//! reports state through a side channel.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::value::Value;

/// One event. `seq` is gapless per run, starting at 0; `at_us` is microseconds since the
/// run started.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// Position in the run's stream: a consumer that saw `n` resumes from `n + 1`
    /// (SSE's `Last-Event-ID`) and a gap means it missed something.
    pub seq: u64,
    /// Microseconds since the run started, from one monotonic clock for the whole run.
    pub at_us: u64,
    /// What happened; flattened so the JSON carries `type` next to `seq`.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What an [`Event`] says happened. The JSON tag (`type`) is the variant's name in
/// snake case; the names in parentheses are the viewer's message kinds they map to.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// Run status changed (`job_update`).
    Run {
        /// The run's new status; a terminal one is the stream's last event.
        status: RunStatus,
        /// Why the run failed or was cancelled, when it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A node's status changed (`node_update`). `result` is the last invocation's outputs
    /// when the node completes.
    Node {
        /// The node's id in the graph document.
        node_id: String,
        /// Its type name, so a consumer can label it without the plan.
        node_type: String,
        /// The node's new status.
        status: NodeStatus,
        /// Outputs of the node's last invocation, by handle.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<BTreeMap<String, Value>>,
        /// The failure's text (ending with its signature) when the node failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Why the node did not run, when it was skipped.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skip_reason: Option<SkipReason>,
    },
    /// A value reached an output of the graph (`output_update`).
    Output {
        /// The `heddle.output` node the value reached.
        node_id: String,
        /// The external output name (the output node's `name`, else its id).
        name: String,
        /// The value, as it will appear in [`RunResult::outputs`].
        value: Value,
    },
    /// Edge traffic (`edge_update`): first message at once, then at most one per second,
    /// with the exact count flushed when the edge completes.
    Edge {
        /// The edge's id in the graph document.
        edge_id: String,
        /// Whether values still flow on it.
        status: EdgeStatus,
        /// Messages sent on the edge so far (exact once it is completed or drained).
        counter: u64,
    },
    /// A log line from a node (guest log import, code-node stdout/stderr, warnings).
    Log {
        /// The node that logged it.
        node_id: String,
        /// The line's severity, as the node gave it.
        level: LogLevel,
        /// The text, already masked for the run's secrets.
        message: String,
    },
    /// One finished invocation with what it cost. Executors that measure nothing beyond
    /// wall time (native built-ins) do not emit it, to keep the hot path quiet.
    Invocation {
        /// The node invoked.
        node_id: String,
        /// Canonical lineage key of the invocation (`""` at root scope).
        key: String,
        /// What the attempt cost.
        metrics: InvocationMetrics,
        /// The attempt's failure, when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// 1 for an invocation's first attempt, then 2, 3… for each retry (the node's
        /// own `retry` policy or the supervisor's), so every attempt is visible.
        #[serde(default = "first_attempt")]
        attempt: u32,
        /// The attempt reached the node's time limit and its work was cancelled.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        timed_out: bool,
        /// The failure's signature (`family:code`, what policy rules match), when the
        /// attempt failed with one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// The attempt's span in the run's trace, when the run is traced (the id its
        /// code was handed as `TRACEPARENT`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        span_id: Option<crate::trace::SpanId>,
    },
    /// A failed invocation was escalated to the supervisor.
    Escalation {
        /// The node whose invocation failed.
        node_id: String,
        /// The escalation as the supervisor receives it (failure, attempt, context),
        /// in its wire form so any supervisor implementation can read it.
        escalation: serde_json::Value,
    },
    /// The supervisor decided (or the kernel overruled it).
    Decision {
        /// The node the verdict is about.
        node_id: String,
        /// The verdict in its wire form (`{"verdict": "retry", ...}`).
        verdict: serde_json::Value,
        /// Who decided ([`crate::supervise::DecidedBy`] as text: `agent`, `policy`,
        /// `kernel`...): a verdict the kernel overruled says so here.
        decided_by: String,
        /// What deciding cost (an LLM supervisor's call), in USD.
        #[serde(default)]
        cost_usd: f64,
    },
}

fn first_attempt() -> u32 {
    1
}

/// Where a run stands. Every status but `Running` is an ending of this process's drive;
/// `Suspended` is the one a durable run comes back from (approval, resume).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Nodes are still being driven.
    Running,
    /// Every node ended and none failed.
    Completed,
    /// A node failed and nothing recovered it (or the plan did not hold).
    Failed,
    /// Stopped on request (Ctrl-C, `cancel`, a time limit): nodes still running were
    /// cancelled.
    Cancelled,
    /// Paused until someone acts: a gate waits for approval, or an invocation must be
    /// reconciled before it may be repeated.
    Suspended,
}

impl RunStatus {
    /// Precedence when combining: cancelled > suspended > failed > completed.
    pub fn rank(self) -> u8 {
        match self {
            RunStatus::Running => 0,
            RunStatus::Completed => 1,
            RunStatus::Failed => 2,
            RunStatus::Suspended => 3,
            RunStatus::Cancelled => 4,
        }
    }

    /// The status as stored and shown (the serde name), without going through serde.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Suspended => "suspended",
        }
    }
}

/// A node's status in a [`EventKind::Node`] event; the last one a node gets is how it
/// ended.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Its first invocation started.
    Running,
    /// It ended without failing: its inputs ended and its work is done.
    Completed,
    /// An invocation failed and nothing recovered it.
    Failed,
    /// It never ran, or stopped early ([`SkipReason`] says why).
    Skipped,
    /// It is the node the run is suspended at.
    Suspended,
    /// Part of the viewer's vocabulary (a node that ran with a problem worth showing);
    /// the kernel does not emit it today, and consumers should treat it as running.
    Warning,
}

/// Whether values still flow on an edge ([`EventKind::Edge`]).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EdgeStatus {
    /// Values have been sent and more may come.
    Active,
    /// The source sent its end of stream: nothing more will come, and the counter is
    /// exact.
    Completed,
    /// The target stopped before consuming the end: values were still buffered or could
    /// still have come. The edge's last status, published once every actor stopped.
    Drained,
}

/// A log line's severity; ordered, so a consumer can filter with `>=`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Detail for whoever writes the node.
    Debug,
    /// Ordinary progress.
    Info,
    /// Something the user should look at; the run goes on.
    Warn,
    /// A failure the node reports (its invocation may still succeed).
    Error,
}

/// Why a node did not run (machine-readable; the CLI and the JSON report show it).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Wired to inputs that received nothing (an untaken branch).
    NoInput,
    /// An incoming edge's condition (`when`) chose another branch.
    Condition,
    /// Every upstream node that feeds it was skipped.
    UpstreamSkipped,
    /// An upstream node failed, so its inputs never came.
    UpstreamFailed,
    /// The run was cancelled before the node could finish.
    Cancelled,
    /// The supervisor's verdict was skip.
    Supervisor,
    /// The run was suspended before the node could run.
    Suspended,
    /// A person answered the reconcile pause of its uncertain invocation with skip
    /// (`heddle runs resume RUN --pause N --skip`): it is not run again, and what it
    /// feeds is skipped as after any skip.
    Reconciled,
}

/// What one invocation cost.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InvocationMetrics {
    /// Wall time of the invocation, in microseconds.
    pub wall_us: u64,
    /// WASM fuel consumed (instructions, roughly); `None` for executors without fuel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// The largest memory the invocation reached, where the executor can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Provider cost reported by the node (e.g. an LLM call), in USD.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_usd: f64,
    /// Invocations that reported their cost (one per invocation, summed with the
    /// figures): an invocation that reported nothing has unknown usage, not zero.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cost_reports: u32,
    /// Assets the invocation created (ids reported through `record-asset`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assets: Vec<String>,
    /// Outgoing HTTP requests made (WASM nodes granted a network).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub http_requests: u64,
    /// Bytes those requests moved: headers and bodies, sent and received.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub http_bytes: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero(f: &f64) -> bool {
    *f == 0.0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// How much of a node's provider usage is known: missing usage is not zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageState {
    /// Every invocation reported its cost.
    Reported,
    /// Some did: the figures are a lower bound.
    Partial,
    /// None did (or nothing is known of an invocation that died before its result).
    Unknown,
}

impl UsageState {
    /// The state of `calls` invocations of which `reports` reported their cost.
    pub fn of(calls: u64, reports: u64) -> UsageState {
        match reports {
            0 => UsageState::Unknown,
            r if r >= calls => UsageState::Reported,
            _ => UsageState::Partial,
        }
    }
}

impl InvocationMetrics {
    /// Adds another invocation's figures (peak memory takes the max).
    pub fn accumulate(&mut self, other: &InvocationMetrics) {
        self.wall_us += other.wall_us;
        self.fuel = match (self.fuel, other.fuel) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.peak_memory_bytes = self.peak_memory_bytes.max(other.peak_memory_bytes);
        self.cost_usd += other.cost_usd;
        self.cost_reports += other.cost_reports;
        self.assets.extend(other.assets.iter().cloned());
        self.http_requests += other.http_requests;
        self.http_bytes += other.http_bytes;
    }
}

/// How a node ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum NodeOutcome {
    /// Its inputs ended and it finished its work.
    Done,
    /// It failed and nothing recovered it.
    Failed {
        /// The failure's text, ending with its signature.
        error: String,
    },
    /// It did not run (or stopped early).
    Skipped {
        /// Why.
        reason: SkipReason,
    },
    /// The run was suspended at this node.
    Suspended,
}

/// Per-node summary in a [`RunResult`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeReport {
    /// Shared with the plan's node: a report per node on a large graph copies no text.
    pub node_type: Arc<str>,
    /// How the node ended; flattened, so the JSON says `"outcome": "done"`.
    #[serde(flatten)]
    pub outcome: NodeOutcome,
    /// Invocations it started, retries included.
    pub invocations: u64,
    /// Totals over all invocations that reported metrics.
    pub metrics: InvocationMetrics,
    /// The failure signature a failed node named (`family:code`, what policy rules
    /// match), the one its error text ends with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// An attempt reached the node's time limit and its work was cancelled (the node
    /// may still have succeeded on a retry).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Whether the node can spend money at all ([`crate::Origin::may_spend`]): one
    /// that cannot has no usage to report, whatever it measured.
    #[serde(default = "may_spend_unless_said")]
    pub may_spend: bool,
}

/// A report written without the field says nothing: the node may have spent.
fn may_spend_unless_said() -> bool {
    true
}

/// Why a run was suspended (human-in-the-loop pause).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SuspendInfo {
    /// The node the run waits at (a gate, or an invocation to reconcile).
    pub node_id: String,
    /// What the run waits for, in words for the person who must act.
    pub reason: String,
    /// What the node handed over with its suspension (a gate's pending value, the
    /// occurrence to reconcile), so whoever resumes need not ask the node again.
    #[serde(default)]
    pub state: Value,
}

/// Everything a finished run reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// How the run ended.
    pub status: RunStatus,
    /// Values that reached each output, keyed by output name, in arrival order.
    pub outputs: BTreeMap<String, Vec<Value>>,
    /// Summary of what went wrong (node errors joined, validation problems, cancel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where and why the run waits, when it ended suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<SuspendInfo>,
    /// One report per node of the plan, by node id.
    pub nodes: crate::reports::NodeReports,
    /// Supervisor interventions (escalation, verdict, who decided, cost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interventions: Vec<serde_json::Value>,
    /// Retained events, capped at [`RunResult::EVENT_CAP`]; when exceeded the oldest half
    /// is dropped and `events_dropped` counts what was lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
    /// Events dropped from `events` by the cap (the stream itself lost nothing).
    #[serde(default)]
    pub events_dropped: u64,
    /// Wall time of the whole run, in microseconds.
    pub wall_us: u64,
}

impl RunResult {
    /// Events a result retains: enough to explain a run, bounded so a long stream
    /// cannot grow the result without limit (subscribers still get every event).
    pub const EVENT_CAP: usize = 10_000;
    /// Bytes of output values a run retains before replacing them by a marker.
    pub const OUTPUT_CAP_BYTES: usize = 64 << 20;
}
