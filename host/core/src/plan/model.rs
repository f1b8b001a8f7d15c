//! What a plan is: the validated graph the kernel runs, with every reference resolved to
//! an index and the correlation scope of every edge, handle and output worked out.
//!
//! Plain data only; [`super::plan()`] builds it and the kernel reads it.

use std::collections::BTreeMap;

use super::by_name::ByName;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::issues::Issue;
use crate::decl::NodeDecl;
use crate::graph::{CONTROL_HANDLE, EdgeType, NodeLimits};
use crate::types::PortType;
use crate::value::Value;

/// The built-in graph input: its `type` property narrows its `any` output, its `value` is
/// the default, and with `streaming: true` its output repeats per key.
pub const INPUT_TYPE: &str = "heddle.input";
/// The built-in graph output, whose `name` keys `RunResult.outputs`.
pub const OUTPUT_TYPE: &str = "heddle.output";
/// The built-in assertion node: its inputs are named after the nodes feeding them.
pub const CHECK_TYPE: &str = "heddle.check";
/// A source handle that sends a node's control output along every control edge it has,
/// so a controller (an agent, say) need not declare an output per controlled node.
pub(crate) const CONTROL_OUTPUT_HANDLE: &str = "__control_output__";

/// Index of a node in [`Plan::nodes`].
pub type NodeIdx = u32;
/// Index of an edge in [`Plan::edges`].
pub type EdgeIdx = u32;
/// Index of a lineage root in [`Correlation::roots`].
pub type RootIdx = u32;

/// A node's edges (or controllers), by index: up to four in place, as large as a `Vec`.
/// Most nodes have one or two edges each way and no controller, so on a large graph
/// this saves each node two or three allocations (32 bytes each at least, with the
/// allocator's header) that a `Vec` would make for a handful of indices.
pub type Indices = smallvec::SmallVec<[u32; 4]>;

/// A graph ready to run: every reference resolved, every check passed.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Nodes in a topological order of data edges (sources first).
    pub nodes: Vec<PlanNode>,
    /// Surviving edges (after bypass rewrite), data and control.
    pub edges: Vec<PlanEdge>,
    /// The correlation analysis: lineage roots and every edge's, node's and handle's scope.
    pub correlation: Correlation,
    /// Non-fatal findings (e.g. a sticky handle with several values per key).
    pub warnings: Vec<Issue>,
    /// The `heddle.input` nodes, read once ([`Plan::inputs`]).
    pub(super) inputs: Vec<GraphInput>,
    /// Node indices in the order of their ids ([`Plan::by_id`]).
    pub(super) by_id: Box<[NodeIdx]>,
    /// The graph nodes expanded into this plan, outermost first (their inner nodes are
    /// plan nodes named by path).
    pub graphs: Vec<crate::compose::GraphNodeInfo>,
    /// Every document the graph nodes include, by key: what a durable run records to
    /// resume the same plan.
    pub included: Vec<crate::compose::IncludedDoc>,
}

impl Plan {
    /// Every node's index, in the order of the node ids: what a report keyed by id is
    /// built in, sorted once when planning rather than on every run of the plan.
    pub fn by_id(&self) -> &[NodeIdx] {
        &self.by_id
    }

    /// The index of the node with id `id`.
    pub fn node_index(&self, id: &str) -> Option<NodeIdx> {
        self.by_id
            .binary_search_by(|&i| (*self.nodes[i as usize].id).cmp(id))
            .ok()
            .map(|p| self.by_id[p])
    }

    /// How many levels of controllers node `i` stands on: 0 for a node that controls
    /// nothing, 1 for a controller whose targets control nothing, 1 + the highest of its
    /// targets' heights otherwise. An engine whose invocations hold a scarce slot while
    /// they wait for control replies reserves slots per height, so a level's controllers
    /// can never take every slot the level below needs to answer them (heddle-wasm's
    /// instance pool). Control cycles are refused at planning; the depth is bounded by
    /// the node count all the same, so a plan built by hand cannot make it loop.
    pub fn control_height(&self, i: NodeIdx) -> u32 {
        // Memoised: controllers sharing targets (a diamond) are walked once each.
        let mut known = std::collections::HashMap::new();
        self.control_height_within(i, self.nodes.len(), &mut known)
    }

    fn control_height_within(
        &self,
        i: NodeIdx,
        depth: usize,
        known: &mut std::collections::HashMap<NodeIdx, u32>,
    ) -> u32 {
        if let Some(&h) = known.get(&i) {
            return h;
        }
        let Some(node) = self.nodes.get(i as usize) else {
            return 0;
        };
        if depth == 0 {
            return 0;
        }
        let mut h = 0;
        for e in &node.out_edges {
            if let Some(e) = self.edges.get(*e as usize)
                && e.edge_type == EdgeType::Control
            {
                h = h.max(1 + self.control_height_within(e.target, depth - 1, known));
            }
        }
        known.insert(i, h);
        h
    }
}

/// [`Plan::by_id`] for `nodes` (whose ids are unique).
pub(super) fn order_by_id(nodes: &[PlanNode]) -> Box<[NodeIdx]> {
    // Sorted side by side as (first bytes, id, index): comparing through the nodes would
    // fetch a whole node (a cache miss on a large graph) for every comparison, and ids
    // mostly differ in their first eight bytes, which compare as one integer. Padded
    // with zero bytes, the least there are, the prefixes order as the ids do; equal ones
    // fall back to the whole id.
    let mut order: Vec<(u64, &str, NodeIdx)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (prefix(&n.id), &*n.id, i as NodeIdx))
        .collect();
    order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    order.into_iter().map(|(_, _, i)| i).collect()
}

/// The first eight bytes of `id` as a big-endian integer, zero-padded.
fn prefix(id: &str) -> u64 {
    let mut b = [0u8; 8];
    let n = id.len().min(8);
    b[..n].copy_from_slice(&id.as_bytes()[..n]);
    u64::from_be_bytes(b)
}

/// One external input of a planned graph, as the caller names it.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphInput {
    /// The input node's index in [`Plan::nodes`].
    pub node: NodeIdx,
    /// The input node's id.
    pub node_id: Arc<str>,
    /// The external name: the node's `name`, else its `name` property, else its id.
    pub name: Arc<str>,
    /// The `type` property (`any` when unset).
    pub ty: PortType,
    /// The `value` property, already checked against `ty`.
    pub default: Option<Value>,
    /// With `streaming: true` the caller may push values while the run is live, and the
    /// input needs no value at start.
    pub streaming: bool,
}

#[derive(Clone, Debug)]
/// One node of a plan, resolved against its declaration.
pub struct PlanNode {
    /// Its id.
    pub id: Arc<str>,
    /// Its node type.
    pub node_type: Arc<str>,
    /// External name for input/output nodes: `name`, else `properties.name`, else `id`.
    pub name: Arc<str>,
    /// Its declaration (ports, types, modes, retry safety), from its executor.
    pub decl: Arc<NodeDecl>,
    /// Document properties (+ dynamic properties), minus values for handles fed by an
    /// edge (a value arriving on an edge overrides the one written in the document).
    pub properties: BTreeMap<String, Value>,
    /// Its time limit, access and retry, from the document. Boxed: few nodes set any,
    /// and in place the limits were nearly half of every node's size (144 of 304 bytes).
    pub limits: Option<Box<NodeLimits>>,
    /// Incoming data and control edges.
    pub in_edges: Indices,
    /// Outgoing data and control edges.
    pub out_edges: Indices,
    /// Unique nodes with a control edge into this node.
    pub controllers: Indices,
    /// Declared output fields, checked on every value of that output.
    pub contract: Option<Arc<super::declared::NodeContract>>,
}

#[derive(Clone, Debug)]
/// One edge of a plan.
pub struct PlanEdge {
    /// Its id.
    pub id: Arc<str>,
    /// The node it leaves.
    pub source: NodeIdx,
    /// The output handle it leaves from.
    pub source_handle: Arc<str>,
    /// The node it enters.
    pub target: NodeIdx,
    /// The input handle it enters.
    pub target_handle: Arc<str>,
    /// Data or control.
    pub edge_type: EdgeType,
    /// Condition and field narrowing applied to every value crossing the edge.
    pub rule: Option<Arc<super::declared::EdgeRule>>,
}

/// Result of the static correlation (scope) analysis ([`super::correlation`]).
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
/// A lineage root: the scope an iteration output mints.
pub struct RootInfo {
    /// `"{node_id}:{group or handle}"`.
    pub name: Arc<str>,
    /// The node whose iteration output mints it.
    pub node: NodeIdx,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
/// What travels on one edge.
pub struct EdgeScope {
    /// Scope of values travelling on the edge.
    pub scope: Vec<RootIdx>,
    /// More than one value per lineage key may arrive (chunk outputs, streams).
    pub repeats_per_key: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
/// How one node is invoked.
pub struct NodeScope {
    /// Scope the node is invoked at (for a buffered node: its max input scope, or the
    /// longest common prefix for a join node; empty for a source).
    pub invocation_scope: Vec<RootIdx>,
    /// Connected data input handles, by name.
    pub inputs: ByName<HandleScope>,
    /// Declared outputs, by name.
    pub outputs: ByName<OutputScope>,
    /// The input handle that repeats per key and makes the node fire once per envelope.
    pub repeating_driver: Option<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// One connected input handle of a node.
pub struct HandleScope {
    /// Scope of the values arriving on it.
    pub scope: Vec<RootIdx>,
    /// How the buffered scheduler treats it.
    pub class: HandleClass,
    /// Several edges feed a list-typed handle: values accumulate and the handle is
    /// ready when it closes.
    pub accumulates: bool,
    /// More than one value per lineage key may arrive on it.
    pub repeats_per_key: bool,
    /// Number of data edges feeding it (the inbox's open-upstream count).
    pub upstream_edges: u32,
}

/// How the buffered scheduler treats a connected input handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandleClass {
    /// Scope equals the invocation scope: bucketed per lineage key. On a join or
    /// streaming-input node, also a handle deeper than the invocation scope: its values
    /// are bucketed by their projection onto the invocation key, several per key
    /// (`repeats_per_key` is set), and pair up in arrival order.
    Max,
    /// A strict non-empty prefix of the invocation scope: sticky per parent key.
    Prefix,
    /// Empty scope under a non-empty invocation scope: one sticky value (last wins).
    Empty,
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// One declared output of a node.
pub struct OutputScope {
    /// Scope of the values it produces.
    pub scope: Vec<RootIdx>,
    /// The root this output mints (iteration outputs only).
    pub mints: Option<RootIdx>,
    /// It produces more than one value per lineage key (chunks, streams).
    pub repeats_per_key: bool,
}

static ANY: PortType = PortType::Any;

/// The type of input `handle` of a node with this declaration: the declared port's type,
/// or `any` for an undeclared handle on a node with [`NodeDecl::dynamic_inputs`] (code
/// nodes, whose inputs the workflow author names). `None` when the node has no such input.
pub fn input_type<'a>(decl: &'a NodeDecl, handle: &str) -> Option<&'a PortType> {
    match decl.input(handle) {
        Some(p) => Some(&p.ty),
        None if decl.dynamic_inputs && handle != CONTROL_HANDLE && !handle.is_empty() => Some(&ANY),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    /// A plan holds one node, one edge and one scope per node of the graph: on a large
    /// graph these sizes are most of the plan's memory (64-bit targets; a node's limits
    /// are boxed, its edges held in place).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_planned_node_and_edge_stay_small() {
        use std::mem::size_of;
        assert_eq!(size_of::<super::Indices>(), 24);
        assert_eq!(size_of::<super::PlanNode>(), 168);
        assert_eq!(size_of::<super::PlanEdge>(), 72);
        assert_eq!(size_of::<super::NodeScope>(), 72);
    }
}
