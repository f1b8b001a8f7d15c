//! Planning: turns a [`GraphDoc`] into a validated [`Plan`] before any node runs,
//! reporting every problem at once.
//!
//! Order (model §2.1): bypass rewrite → dangling edges → node types and handles →
//! edge types → structure (control edges, cycles, multi-edges) → correlation analysis →
//! required inputs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::decl::NodeDecl;
use crate::graph::{EdgeType, NodeLimits};
use crate::value::Value;

/// Index of a node in [`Plan::nodes`].
pub type NodeIdx = u32;
/// Index of an edge in [`Plan::edges`].
pub type EdgeIdx = u32;
/// Index of a lineage root in [`Correlation::roots`].
pub type RootIdx = u32;

/// A graph ready to run: every reference resolved, every check passed.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Nodes in a topological order of data edges (sources first).
    pub nodes: Vec<PlanNode>,
    /// Surviving edges (after bypass rewrite), data and control.
    pub edges: Vec<PlanEdge>,
    pub correlation: Correlation,
    /// Non-fatal findings (e.g. a sticky handle with several values per key).
    pub warnings: Vec<Issue>,
}

#[derive(Clone, Debug)]
pub struct PlanNode {
    pub id: Arc<str>,
    pub node_type: Arc<str>,
    /// External name for input/output nodes: `name`, else `properties.name`, else `id`.
    pub name: Arc<str>,
    pub decl: Arc<NodeDecl>,
    /// Document properties (+ dynamic properties), minus values for handles fed by an
    /// edge (edge values win, model §2.1).
    pub properties: BTreeMap<String, Value>,
    pub limits: Option<NodeLimits>,
    /// Incoming data and control edges.
    pub in_edges: Vec<EdgeIdx>,
    /// Outgoing data and control edges.
    pub out_edges: Vec<EdgeIdx>,
    /// Unique nodes with a control edge into this node.
    pub controllers: Vec<NodeIdx>,
}

#[derive(Clone, Debug)]
pub struct PlanEdge {
    pub id: Arc<str>,
    pub source: NodeIdx,
    pub source_handle: Arc<str>,
    pub target: NodeIdx,
    pub target_handle: Arc<str>,
    pub edge_type: EdgeType,
}

/// Result of the static correlation (scope) analysis, model §2.4.
///
/// A *scope* is the ordered list of lineage roots (outermost first) a value is indexed
/// by. A root is minted by an iteration output: `"{node_id}:{group or handle}"`.
#[derive(Clone, Debug, Default)]
pub struct Correlation {
    /// Interned roots; [`RootIdx`] indexes this.
    pub roots: Vec<RootInfo>,
    /// Per edge (same index as [`Plan::edges`]); control edges get an empty scope.
    pub edges: Vec<EdgeScope>,
    /// Per node (same index as [`Plan::nodes`]).
    pub nodes: Vec<NodeScope>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootInfo {
    /// `"{node_id}:{group or handle}"`.
    pub name: Arc<str>,
    /// The node whose iteration output mints it.
    pub node: NodeIdx,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeScope {
    /// Scope of values travelling on the edge.
    pub scope: Vec<RootIdx>,
    /// More than one value per lineage key may arrive (chunk outputs, streams).
    pub repeats_per_key: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeScope {
    /// Scope the node is invoked at (for a buffered node: its max input scope, or the
    /// longest common prefix for a join node; empty for a source).
    pub invocation_scope: Vec<RootIdx>,
    /// Connected data input handles, by name.
    pub inputs: BTreeMap<Arc<str>, HandleScope>,
    /// Declared outputs, by name.
    pub outputs: BTreeMap<Arc<str>, OutputScope>,
    /// The input handle that repeats per key and makes the node fire once per envelope.
    pub repeating_driver: Option<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleScope {
    pub scope: Vec<RootIdx>,
    pub class: HandleClass,
    /// Several edges feed a list-typed handle: values accumulate and the handle is
    /// ready when it closes.
    pub accumulates: bool,
    pub repeats_per_key: bool,
    /// Number of data edges feeding it (the inbox's open-upstream count).
    pub upstream_edges: u32,
}

/// How the buffered scheduler treats a connected input handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandleClass {
    /// Scope equals the invocation scope: bucketed per lineage key.
    Max,
    /// A strict non-empty prefix of the invocation scope: sticky per parent key.
    Prefix,
    /// Empty scope under a non-empty invocation scope: one sticky value (last wins).
    Empty,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputScope {
    pub scope: Vec<RootIdx>,
    /// The root this output mints (iteration outputs only).
    pub mints: Option<RootIdx>,
    pub repeats_per_key: bool,
}

/// One problem found while planning. Carries the ids needed to find it in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issue {
    pub kind: IssueKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    DuplicateNodeId,
    DuplicateEdgeId,
    DanglingEdge,
    UnknownNodeType,
    UnknownInputHandle,
    UnknownOutputHandle,
    UnknownProperty,
    TypeMismatch,
    Cycle,
    SelfLoop,
    ControlHandle,
    ControlCycle,
    MultipleEdgesIntoInput,
    MissingRequiredInput,
    IncomparableScopes,
    Correlation,
    InvalidProperty,
}

impl std::fmt::Display for Issue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut wrote = false;
        if let Some(n) = &self.node {
            write!(f, "node {n}")?;
            wrote = true;
        }
        if let Some(h) = &self.handle {
            write!(f, "{}handle `{h}`", if wrote { ", " } else { "" })?;
            wrote = true;
        }
        if let Some(e) = &self.edge {
            write!(f, "{}edge {e}", if wrote { ", " } else { "" })?;
            wrote = true;
        }
        if wrote {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found while planning, reported together; no node starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub struct ValidationError {
    pub issues: Vec<Issue>,
}

impl std::fmt::Display for ValidationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "graph is invalid ({} problem{})",
            self.issues.len(),
            if self.issues.len() == 1 { "" } else { "s" }
        )?;
        for i in &self.issues {
            write!(f, "\n  - {i}")?;
        }
        Ok(())
    }
}
