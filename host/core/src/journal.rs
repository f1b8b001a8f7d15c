//! What a durable run writes ahead: the records of its event log, and the identity of an
//! invocation that stays the same when the run is rebuilt after a crash.
//!
//! The kernel writes these records through its journal seam and a store persists them;
//! both name them here so neither depends on the other, and recovery can match what was
//! recorded against what the rebuilt plan produces.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::{InvocationMetrics, RunStatus};
use crate::value::Value;

/// One invocation's position in a run: node id, canonical lineage key and which
/// invocation at that key it is. Rebuilding the plan from the same graph document gives
/// the same positions, because lineage keys name scope roots by node and handle and
/// count items in arrival order per key, never by memory address or task id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Occurrence {
    /// The node invoked.
    pub node: String,
    /// Canonical lineage key (`root=index,...`), empty at root scope.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Which invocation of `node` at `key`, from 0. A buffered node invokes once per key;
    /// streaming and repeating nodes may invoke several times.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Occurrence {
    /// Invocation `n` of `node` at lineage key `key`.
    pub fn new(node: impl Into<String>, key: impl Into<String>, n: u32) -> Self {
        Occurrence {
            node: node.into(),
            key: key.into(),
            n,
        }
    }
}

impl fmt::Display for Occurrence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.node)?;
        if !self.key.is_empty() {
            write!(f, "[{}]", self.key)?;
        }
        if self.n > 0 {
            write!(f, "#{}", self.n)?;
        }
        Ok(())
    }
}

/// Why a process took ownership of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenReason {
    /// The run was created.
    Start,
    /// A process continued a run whose previous owner died (no user decision involved).
    Recover,
    /// The user resumed a paused run.
    Resume,
}

/// Why a run paused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum PauseReason {
    /// A node that is not retry-safe started and its result was never recorded: whether
    /// its effect happened is unknown, so only the user may offer the work again.
    Reconcile {
        /// The invocation.
        occurrence: Occurrence,
    },
    /// A node asked to suspend (human in the loop).
    Suspend {
        /// The node.
        node: String,
        /// What it waits for.
        reason: String,
    },
    /// The user interrupted the run (Ctrl-C); nothing is uncertain.
    Interrupted,
    /// The run's dispatch budget or time limit ran out.
    Budget {
        /// Which budget, and what was spent.
        detail: String,
    },
}

/// One record of a durable run's event log. Records are append-only; a run's state is
/// the fold of its records in sequence order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A process took ownership (its epoch fences out any older owner).
    Opened {
        /// The owner epoch it took (every later append of an older epoch is refused).
        epoch: u64,
        /// Why it took the run (a start, a resume, a recovery).
        reason: OpenReason,
        /// Its process id (a reader checks whether the owner still lives).
        pid: u32,
        /// The run's trace, on the first `opened` record of a run traced when it started
        /// (or when a later process first traced it): every later owner continues it.
        /// Absent in logs written before runs were traced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<crate::trace::RunTrace>,
    },
    /// An invocation was decided and handed towards its executor.
    Dispatched {
        /// The invocation.
        occurrence: Occurrence,
        /// Whether its node is retry-safe (recovery may run it again if it started).
        retry_safe: bool,
    },
    /// The invocation's node code is about to run. Durable before the code runs when the
    /// node is not retry-safe.
    Started {
        /// The invocation.
        occurrence: Occurrence,
    },
    /// The invocation ended with outputs. `emitted` holds what a streaming node emitted
    /// while it ran, in order, so recovery routes exactly what the first run routed.
    Completed {
        /// The invocation.
        occurrence: Occurrence,
        /// Its outputs by handle, in the order it produced them.
        outputs: Vec<(String, Value)>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        /// What a streaming node emitted while it ran, in order.
        emitted: Vec<(String, Value)>,
        #[serde(default)]
        /// What it cost (wall time, fuel, memory, reported cost).
        metrics: InvocationMetrics,
    },
    /// The invocation ended with an error.
    Failed {
        /// The invocation.
        occurrence: Occurrence,
        /// The error (masked, like all text a record carries).
        error: String,
        #[serde(default)]
        /// What it cost.
        metrics: InvocationMetrics,
    },
    /// A failure was escalated to the supervisor.
    Escalated {
        /// The invocation.
        occurrence: Occurrence,
        /// The escalation as the supervisor saw it (masked).
        escalation: serde_json::Value,
    },
    /// A decision about the invocation (a retry, a skip, a gate's answer); carried out
    /// on recovery, never asked again.
    Verdict {
        /// The invocation decided about.
        occurrence: Occurrence,
        /// What was decided.
        verdict: RecordedVerdict,
        /// Who decided it.
        decided_by: Decider,
    },
    /// A person's answer to a reconcile pause: the uncertain invocation is settled
    /// without running it, never asked about again. A `completed` answer is followed,
    /// in the same transaction, by the [`Record::Completed`] holding the outputs the
    /// person supplied; a `skipped` one settles the invocation by itself.
    Reconciled {
        /// The uncertain invocation.
        occurrence: Occurrence,
        /// What the person said became of it.
        answer: ReconcileAnswer,
        /// Who answered (a login name, or what an API client gave).
        by: String,
        /// Why (masked, like all text a record carries).
        note: String,
    },
    /// The run paused; the record's sequence number is the pause event id a resume names.
    Paused {
        /// Why.
        pause: PauseReason,
    },
    /// A user resumed the pause recorded at sequence number `pause`.
    Resumed {
        /// The pause event reopened.
        pause: u64,
    },
    /// A node of a finished run never ran, and why: recorded with the run's ending, so
    /// a reader of the log does not have to guess it from the node's neighbours.
    Skipped {
        /// The node.
        node: String,
        /// Why it did not run.
        reason: crate::SkipReason,
    },
    /// A user asked for the run to be cancelled.
    CancelRequested,
    /// The run ended.
    Finished {
        /// How the run ended.
        status: RunStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        /// What went wrong, when it did not complete.
        error: Option<String>,
    },
}

impl Record {
    /// The record kind as stored (and shown by `heddle runs show`).
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Opened { .. } => "opened",
            Record::Dispatched { .. } => "dispatched",
            Record::Started { .. } => "started",
            Record::Completed { .. } => "completed",
            Record::Failed { .. } => "failed",
            Record::Escalated { .. } => "escalated",
            Record::Verdict { .. } => "verdict",
            Record::Reconciled { .. } => "reconciled",
            Record::Paused { .. } => "paused",
            Record::Resumed { .. } => "resumed",
            Record::Skipped { .. } => "skipped",
            Record::CancelRequested => "cancel_requested",
            Record::Finished { .. } => "finished",
        }
    }

    /// The invocation the record is about, if any.
    pub fn occurrence(&self) -> Option<&Occurrence> {
        match self {
            Record::Dispatched { occurrence, .. }
            | Record::Started { occurrence }
            | Record::Completed { occurrence, .. }
            | Record::Failed { occurrence, .. }
            | Record::Escalated { occurrence, .. }
            | Record::Verdict { occurrence, .. }
            | Record::Reconciled { occurrence, .. } => Some(occurrence),
            _ => None,
        }
    }
}

/// What a person said became of an uncertain invocation ([`Record::Reconciled`]). The
/// third answer the seed's model allows, running it again, is a plain resume of the
/// pause and records no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconcileAnswer {
    /// Its effect happened; its outputs are the ones supplied.
    Completed,
    /// Leave it undone: skipped with reason `reconciled`.
    Skipped,
}

/// A decision as a durable run records it. Stored as the JSON object
/// `{"verdict": ACTION, "attempt"?, "error"?, "note"?}` that earlier runs wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedVerdict {
    #[serde(rename = "verdict")]
    /// What the decision does.
    pub action: RecordedAction,
    /// The failed attempt (from 1) that the node's own `retry` policy runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The failure decided on (masked, like all text a record carries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the decider said: a person's note, a supervisor's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl RecordedVerdict {
    /// A decision to `action` with no attempt, error or note.
    pub fn new(action: RecordedAction) -> Self {
        RecordedVerdict {
            action,
            attempt: None,
            error: None,
            note: None,
        }
    }

    /// With the failure decided on.
    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    /// With what the decider said.
    pub fn with_note(mut self, note: Option<String>) -> Self {
        self.note = note;
        self
    }
}

/// What a recorded decision does. A substitute is recorded as the occurrence's result
/// and a fail as its failure, so neither is a verdict record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordedAction {
    /// Run the occurrence again: one more dispatch, charged to the run's budget.
    Retry,
    /// Drop the occurrence; what depends on it is skipped.
    Skip,
    /// End the node's stream; what it emitted stays.
    EndStream,
    /// A person approved a gate.
    Approve,
    /// A person rejected a gate; the run was cancelled.
    Reject,
}

/// Who made a recorded decision. (Which supervisor handle decided, the agent or a
/// policy file, is [`crate::supervise::DecidedBy`], reported in the run's
/// interventions.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// The node's own `retry` setting.
    RetryPolicy,
    /// The run's supervisor.
    Supervisor,
    /// A person answering a gate.
    User,
}

/// What a durable run records of its plan: for inspection (`heddle runs show`), to name
/// the packages and kinds of node it uses, and to find the nodes of a run that never
/// ran. Stored as `{"nodes": [{"id", "type", "retry_safe", "origin"}], "edges": N}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSummary {
    /// Every node of the plan, in its order.
    pub nodes: Vec<PlannedNode>,
    /// How many edges the plan kept (after bypassed nodes were rewritten).
    pub edges: usize,
}

/// One node of a [`PlanSummary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedNode {
    /// The node's id.
    pub id: String,
    #[serde(rename = "type")]
    /// Its node type.
    pub node_type: String,
    /// Whether its declaration says it is retry-safe.
    pub retry_safe: bool,
    /// Where its node type comes from (built-in, package and digest, code node).
    pub origin: crate::decl::Origin,
}

impl PlanSummary {
    /// The summary of `plan`, as a durable run records it.
    pub fn of(plan: &crate::plan::Plan) -> PlanSummary {
        PlanSummary {
            nodes: plan
                .nodes
                .iter()
                .map(|n| PlannedNode {
                    id: n.id.to_string(),
                    node_type: n.node_type.to_string(),
                    retry_safe: n.decl.retry_safe,
                    origin: n.decl.origin.clone(),
                })
                .collect(),
            edges: plan.edges.len(),
        }
    }

    /// The packages whose node types the plan uses, each once.
    pub fn packages(&self) -> std::collections::BTreeSet<&str> {
        self.nodes
            .iter()
            .filter_map(|n| n.origin.package())
            .collect()
    }

    /// Whether a node of the plan is a code node (whose containers outlive a killed
    /// process unless someone removes them).
    pub fn has_code_nodes(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.origin == crate::decl::Origin::Code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_distinct_value_kinds() {
        let r = Record::Completed {
            occurrence: Occurrence::new("a", "each:item=2", 1),
            outputs: vec![
                ("n".into(), Value::Int(1)),
                ("f".into(), Value::Float(1.0)),
                ("b".into(), Value::Bytes(vec![0u8, 255].into())),
            ],
            emitted: vec![("item".into(), Value::str("x"))],
            metrics: InvocationMetrics::default(),
        };
        let text = serde_json::to_string(&r).unwrap();
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.kind(), "completed");
    }

    #[test]
    fn occurrence_display_is_compact() {
        assert_eq!(Occurrence::new("a", "", 0).to_string(), "a");
        assert_eq!(
            Occurrence::new("a", "each:item=2", 3).to_string(),
            "a[each:item=2]#3"
        );
    }
}
