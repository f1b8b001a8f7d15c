//! Read-only run state for supervisor tools. Recorded by the runtime only when a
//! supervisor is present, so clean unsupervised runs pay nothing; a supervised run pays
//! one map lookup and a reference-counted copy of the outputs per invocation.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use heddle_core::Value;
use heddle_core::plan::Plan;
use heddle_core::supervise::{LineageStep, on_lineage};

use crate::executor::Outputs;

/// What the agent's tools may read. `read_output` is scoped to a lineage: in a fan-out,
/// "the last output" of a node may belong to another item, and handing that to the model
/// as repair material would poison the repair and widen what the model sees.
pub trait RunLedgerReader: Send + Sync {
    /// Per-node status, invocation and error counts, cost.
    fn digest(&self) -> serde_json::Value;
    /// The most recent output of `node_id` on the lineage `scope`: produced by the
    /// failing item itself or by one of its ancestors, never by a sibling item or a
    /// descendant. Of an ancestor's output, the values it fans out (iteration outputs)
    /// belong to its items, each its own lineage, and are left out.
    fn read_output(
        &self,
        node_id: &str,
        scope: &[LineageStep],
    ) -> Result<BTreeMap<String, Value>, ReadOutputError>;
}

/// Why a supervisor's `read_node_output` got nothing; said to the decider as the tool's
/// answer, so it can ask for something else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadOutputError {
    /// The run has no node with that id.
    #[error("no node `{0}` in this run")]
    UnknownNode(String),
    /// The node exists but has not produced anything yet.
    #[error("node `{0}` has produced no output yet")]
    NoOutput(String),
    /// Its outputs belong to other items of a fan-out: showing them as the failing
    /// item's would mix items up.
    #[error(
        "node `{0}` has no output on the failing item's lineage (what it produced belongs to other items); reading it is refused"
    )]
    OutsideLineage(String),
}

/// Kept lineages per node; older outputs are forgotten.
pub const KEPT_OUTPUTS_PER_NODE: usize = 64;

/// A lineage as the runtime holds it: (root index, item index), outermost first.
type RawLineage = Box<[(u32, u32)]>;

#[derive(Default)]
struct NodeState {
    node_type: String,
    status: &'static str,
    invocations: u64,
    errors: u64,
    cost_usd: f64,
    outputs: VecDeque<(RawLineage, Outputs)>,
    /// Output handles that fan out (mint a lineage root): each value on them belongs to
    /// a child item, not to the invocation that produced it.
    fan_out: Vec<String>,
}

#[derive(Default)]
struct Inner {
    /// Root names by root index (the plan's correlation roots).
    roots: Vec<String>,
    nodes: HashMap<String, NodeState>,
}

/// The runtime's recorder, also the reader handed to supervisors.
pub struct RunLedger {
    /// False when no handle reads it: recording is then skipped entirely.
    enabled: bool,
    inner: Mutex<Inner>,
}

impl Default for RunLedger {
    fn default() -> Self {
        RunLedger {
            enabled: true,
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl RunLedger {
    /// A recorder that keeps outputs and statuses for a supervisor's tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder that keeps nothing (for handles that never read run state).
    pub fn disabled() -> Self {
        RunLedger {
            enabled: false,
            ..Self::default()
        }
    }

    /// Whether anything is kept (a handle reads it): a caller may skip building what it
    /// would record.
    pub fn recording(&self) -> bool {
        self.enabled
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declares everything a plan fixes before the run: its roots, its nodes and which
    /// outputs of each fan out.
    pub fn declare(&self, plan: &Plan) {
        self.set_roots(plan.correlation.roots.iter().map(|r| r.name.to_string()));
        for (i, n) in plan.nodes.iter().enumerate() {
            self.add_node(&n.id, &n.node_type);
            if let Some(scope) = plan.correlation.nodes.get(i) {
                let fan_out = scope
                    .outputs
                    .iter()
                    .filter(|(_, o)| o.mints.is_some())
                    .map(|(h, _)| h.to_string());
                self.set_fan_out(&n.id, fan_out);
            }
        }
    }

    /// Marks output handles of `node_id` that fan out (see [`RunLedger::declare`]).
    pub fn set_fan_out(&self, node_id: &str, handles: impl IntoIterator<Item = String>) {
        if let Some(n) = self.lock().nodes.get_mut(node_id) {
            n.fan_out = handles.into_iter().collect();
        }
    }

    /// The plan's root names, indexed like the runtime's lineage entries.
    pub fn set_roots(&self, roots: impl IntoIterator<Item = String>) {
        self.lock().roots = roots.into_iter().collect();
    }

    /// Declares a node (so the digest lists nodes that never ran). The status is the
    /// outcome of its latest invocation: `pending`, `ran` or `failed`.
    pub fn add_node(&self, node_id: &str, node_type: &str) {
        self.lock().nodes.insert(
            node_id.to_string(),
            NodeState {
                node_type: node_type.to_string(),
                status: "pending",
                ..NodeState::default()
            },
        );
    }

    /// One finished invocation; `outputs` is `Some` when it succeeded. `lineage` holds
    /// (root index, item index) pairs as the runtime keeps them.
    pub fn record_invocation(
        &self,
        node_id: &str,
        lineage: &[(u32, u32)],
        outputs: Option<&Outputs>,
        cost_usd: f64,
    ) {
        if !self.enabled {
            return;
        }
        let mut g = self.lock();
        if !g.nodes.contains_key(node_id) {
            g.nodes.insert(node_id.to_string(), NodeState::default());
        }
        let Some(n) = g.nodes.get_mut(node_id) else {
            return;
        };
        n.invocations += 1;
        n.cost_usd += cost_usd;
        match outputs {
            Some(o) => {
                n.status = "ran";
                if n.outputs.len() == KEPT_OUTPUTS_PER_NODE {
                    n.outputs.pop_front();
                }
                n.outputs.push_back((lineage.into(), o.clone()));
            }
            None => {
                n.status = "failed";
                n.errors += 1;
            }
        }
    }

    /// [`RunLedger::record_invocation`] with named roots (for callers outside the runtime).
    pub fn record_steps(
        &self,
        node_id: &str,
        lineage: &[LineageStep],
        outputs: Option<&Outputs>,
        cost_usd: f64,
    ) {
        let raw: Vec<(u32, u32)> = {
            let mut g = self.lock();
            lineage
                .iter()
                .map(|s| {
                    let idx = match g.roots.iter().position(|r| *r == s.root) {
                        Some(i) => i,
                        None => {
                            g.roots.push(s.root.clone());
                            g.roots.len() - 1
                        }
                    };
                    (idx as u32, s.index as u32)
                })
                .collect()
        };
        self.record_invocation(node_id, &raw, outputs, cost_usd);
    }
}

impl RunLedgerReader for RunLedger {
    fn digest(&self) -> serde_json::Value {
        let g = self.lock();
        let mut ids: Vec<&String> = g.nodes.keys().collect();
        ids.sort();
        let nodes: serde_json::Map<String, serde_json::Value> = ids
            .into_iter()
            .map(|id| {
                let n = &g.nodes[id];
                (
                    id.clone(),
                    serde_json::json!({
                        "type": n.node_type,
                        "status": if n.status.is_empty() { "pending" } else { n.status },
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
        let g = self.lock();
        let n = g
            .nodes
            .get(node_id)
            .ok_or_else(|| ReadOutputError::UnknownNode(node_id.to_string()))?;
        if n.outputs.is_empty() {
            return Err(ReadOutputError::NoOutput(node_id.to_string()));
        }
        let named = |raw: &[(u32, u32)]| -> Vec<LineageStep> {
            raw.iter()
                .map(|(r, i)| LineageStep {
                    root: g.roots.get(*r as usize).cloned().unwrap_or_default(),
                    index: u64::from(*i),
                })
                .collect()
        };
        n.outputs
            .iter()
            .rev()
            .filter(|(l, _)| on_lineage(&named(l), scope))
            .map(|(_, o)| {
                let mut m = o.to_map();
                m.retain(|h, _| !n.fan_out.contains(h));
                m
            })
            .find(|m| !m.is_empty())
            .ok_or_else(|| ReadOutputError::OutsideLineage(node_id.to_string()))
    }
}
