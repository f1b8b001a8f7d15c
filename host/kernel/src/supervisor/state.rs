//! Read-only run state for supervisor tools. Recorded by the runtime only when a
//! supervisor is present, so clean unsupervised runs pay nothing.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use heddle_core::Value;
use heddle_core::supervise::{LineageStep, lineage_related};

/// What the agent's tools may read. `read_output` is scoped to a lineage: in a fan-out,
/// "the last output" of a node may belong to another item, and handing that to the model
/// as repair material would poison the repair and widen what the model sees.
pub trait RunStateReader: Send + Sync {
    /// Per-node status, invocation and error counts, cost.
    fn digest(&self) -> serde_json::Value;
    /// The most recent output of `node_id` whose lineage is related to `scope`.
    fn read_output(
        &self,
        node_id: &str,
        scope: &[LineageStep],
    ) -> Result<BTreeMap<String, Value>, ReadOutputError>;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadOutputError {
    #[error("no node `{0}` in this run")]
    UnknownNode(String),
    #[error("node `{0}` has produced no output yet")]
    NoOutput(String),
    #[error(
        "node `{0}` has outputs only for other items than the failing one; reading them is refused"
    )]
    OutsideLineage(String),
}

/// Kept lineages per node; older outputs are forgotten.
pub const KEPT_OUTPUTS_PER_NODE: usize = 64;

#[derive(Default)]
struct NodeState {
    node_type: String,
    status: String,
    invocations: u64,
    errors: u64,
    cost_usd: f64,
    outputs: VecDeque<(Vec<LineageStep>, BTreeMap<String, Value>)>,
}

/// The runtime's recorder, also the reader handed to supervisors.
#[derive(Default)]
pub struct RunState {
    nodes: Mutex<BTreeMap<String, NodeState>>,
}

impl RunState {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, node_id: &str, f: impl FnOnce(&mut NodeState) -> R) -> R {
        let mut g = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        f(g.entry(node_id.to_string()).or_default())
    }

    /// Declares a node (so the digest lists nodes that never ran). The status is the
    /// outcome of its latest invocation: `pending`, `ran` or `failed`.
    pub fn add_node(&self, node_id: &str, node_type: &str) {
        self.with(node_id, |n| {
            n.node_type = node_type.to_string();
            n.status = "pending".into();
        });
    }

    pub fn set_status(&self, node_id: &str, status: &str) {
        self.with(node_id, |n| n.status = status.to_string());
    }

    /// One finished invocation; `outputs` is `Some` when it succeeded.
    pub fn record_invocation(
        &self,
        node_id: &str,
        lineage: Vec<LineageStep>,
        outputs: Option<BTreeMap<String, Value>>,
        cost_usd: f64,
    ) {
        self.with(node_id, |n| {
            n.invocations += 1;
            n.cost_usd += cost_usd;
            n.status = if outputs.is_some() { "ran" } else { "failed" }.to_string();
            match outputs {
                Some(o) => {
                    if n.outputs.len() == KEPT_OUTPUTS_PER_NODE {
                        n.outputs.pop_front();
                    }
                    n.outputs.push_back((lineage, o));
                }
                None => n.errors += 1,
            }
        });
    }
}

impl RunStateReader for RunState {
    fn digest(&self) -> serde_json::Value {
        let g = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let nodes: serde_json::Map<String, serde_json::Value> = g
            .iter()
            .map(|(id, n)| {
                (
                    id.clone(),
                    serde_json::json!({
                        "type": n.node_type,
                        "status": n.status,
                        "invocations": n.invocations,
                        "errors": n.errors,
                        "cost_usd": n.cost_usd,
                    }),
                )
            })
            .collect();
        serde_json::json!({ "nodes": nodes })
    }

    fn read_output(
        &self,
        node_id: &str,
        scope: &[LineageStep],
    ) -> Result<BTreeMap<String, Value>, ReadOutputError> {
        let g = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let n = g
            .get(node_id)
            .ok_or_else(|| ReadOutputError::UnknownNode(node_id.to_string()))?;
        if n.outputs.is_empty() {
            return Err(ReadOutputError::NoOutput(node_id.to_string()));
        }
        n.outputs
            .iter()
            .rev()
            .find(|(l, _)| lineage_related(l, scope))
            .map(|(_, o)| o.clone())
            .ok_or_else(|| ReadOutputError::OutsideLineage(node_id.to_string()))
    }
}
