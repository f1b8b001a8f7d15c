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
    pub seq: u64,
    pub at_us: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// Run status changed (`job_update`).
    Run {
        status: RunStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A node's status changed (`node_update`). `result` is the last invocation's outputs
    /// when the node completes.
    Node {
        node_id: String,
        node_type: String,
        status: NodeStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<BTreeMap<String, Value>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skip_reason: Option<SkipReason>,
    },
    /// A value reached an output of the graph (`output_update`).
    Output {
        node_id: String,
        /// The external output name (the output node's `name`, else its id).
        name: String,
        value: Value,
    },
    /// Edge traffic (`edge_update`): first message at once, then at most one per second,
    /// with the exact count flushed when the edge completes.
    Edge {
        edge_id: String,
        status: EdgeStatus,
        counter: u64,
    },
    /// A log line from a node (guest log import, code-node stdout/stderr, warnings).
    Log {
        node_id: String,
        level: LogLevel,
        message: String,
    },
    /// One finished invocation with what it cost. Executors that measure nothing beyond
    /// wall time (native built-ins) do not emit it, to keep the hot path quiet.
    Invocation {
        node_id: String,
        /// Canonical lineage key of the invocation (`""` at root scope).
        key: String,
        metrics: InvocationMetrics,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// 1 for an invocation's first attempt, then 2, 3… for each retry (the node's
        /// own `retry` policy or the supervisor's), so every attempt is visible.
        #[serde(default = "first_attempt")]
        attempt: u32,
        /// The attempt reached the node's time limit and its work was cancelled.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        timed_out: bool,
    },
    /// A failed invocation was escalated to the supervisor.
    Escalation {
        node_id: String,
        escalation: serde_json::Value,
    },
    /// The supervisor decided (or the kernel overruled it).
    Decision {
        node_id: String,
        verdict: serde_json::Value,
        decided_by: String,
        #[serde(default)]
        cost_usd: f64,
    },
}

fn first_attempt() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
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

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Running,
    Completed,
    Failed,
    Skipped,
    Suspended,
    Warning,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EdgeStatus {
    Active,
    Completed,
    Drained,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
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
}

/// What one invocation cost.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InvocationMetrics {
    pub wall_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
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
    }
}

/// How a node ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum NodeOutcome {
    Done,
    Failed { error: String },
    Skipped { reason: SkipReason },
    Suspended,
}

/// Per-node summary in a [`RunResult`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeReport {
    /// Shared with the plan's node: a report per node on a large graph copies no text.
    pub node_type: Arc<str>,
    #[serde(flatten)]
    pub outcome: NodeOutcome,
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
    pub node_id: String,
    pub reason: String,
    #[serde(default)]
    pub state: Value,
}

/// Everything a finished run reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub status: RunStatus,
    /// Values that reached each output, keyed by output name, in arrival order.
    pub outputs: BTreeMap<String, Vec<Value>>,
    /// Summary of what went wrong (node errors joined, validation problems, cancel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<SuspendInfo>,
    pub nodes: BTreeMap<String, NodeReport>,
    /// Supervisor interventions (escalation, verdict, who decided, cost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interventions: Vec<serde_json::Value>,
    /// Retained events, capped at [`RunResult::EVENT_CAP`]; when exceeded the oldest half
    /// is dropped and `events_dropped` counts what was lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
    #[serde(default)]
    pub events_dropped: u64,
    pub wall_us: u64,
}

impl RunResult {
    pub const EVENT_CAP: usize = 10_000;
    /// Bytes of output values a run retains before replacing them by a marker.
    pub const OUTPUT_CAP_BYTES: usize = 64 << 20;
}
