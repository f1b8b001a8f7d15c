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
    Reconcile { occurrence: Occurrence },
    /// A node asked to suspend (human in the loop).
    Suspend { node: String, reason: String },
    /// The user interrupted the run (Ctrl-C); nothing is uncertain.
    Interrupted,
    /// The run's dispatch budget or time limit ran out.
    Budget { detail: String },
}

/// One record of a durable run's event log. Records are append-only; a run's state is
/// the fold of its records in sequence order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A process took ownership (its epoch fences out any older owner).
    Opened {
        epoch: u64,
        reason: OpenReason,
        pid: u32,
    },
    /// An invocation was decided and handed towards its executor.
    Dispatched {
        occurrence: Occurrence,
        retry_safe: bool,
    },
    /// The invocation's node code is about to run. Durable before the code runs when the
    /// node is not retry-safe.
    Started { occurrence: Occurrence },
    /// The invocation ended with outputs. `emitted` holds what a streaming node emitted
    /// while it ran, in order, so recovery routes exactly what the first run routed.
    Completed {
        occurrence: Occurrence,
        outputs: Vec<(String, Value)>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        emitted: Vec<(String, Value)>,
        #[serde(default)]
        metrics: InvocationMetrics,
    },
    /// The invocation ended with an error.
    Failed {
        occurrence: Occurrence,
        error: String,
        #[serde(default)]
        metrics: InvocationMetrics,
    },
    /// A failure was escalated to the supervisor.
    Escalated {
        occurrence: Occurrence,
        escalation: serde_json::Value,
    },
    /// The supervisor's verdict; carried out on recovery, never asked again.
    Verdict {
        occurrence: Occurrence,
        verdict: serde_json::Value,
        decided_by: String,
    },
    /// The run paused; the record's sequence number is the pause event id a resume names.
    Paused { pause: PauseReason },
    /// A user resumed the pause recorded at sequence number `pause`.
    Resumed { pause: u64 },
    /// A node of a finished run never ran, and why: recorded with the run's ending, so
    /// a reader of the log does not have to guess it from the node's neighbours.
    Skipped {
        node: String,
        reason: crate::SkipReason,
    },
    /// A user asked for the run to be cancelled.
    CancelRequested,
    /// The run ended.
    Finished {
        status: RunStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
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
            | Record::Verdict { occurrence, .. } => Some(occurrence),
            _ => None,
        }
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
