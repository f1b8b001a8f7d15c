//! Planning: turns a [`GraphDoc`] into a validated [`Plan`] before any node runs,
//! reporting every problem at once.
//!
//! [`plan`] checks, in this order, and keeps going after a problem so that one
//! [`ValidationError`] lists them all: duplicate node and edge ids → dangling edges (on
//! the document as written, so the error names the edge the user wrote) → bypass rewrite
//! ([`crate::bypass`]) → node types → properties → edge handles and types, control edges,
//! self-loops → several edges into a non-list input → data and control cycles → required
//! inputs → the correlation analysis ([`crate::correlation`]).
//!
//! Choices worth knowing when reading a plan:
//! - a `null` property value means unset (NodeTool saves `null` for untouched fields);
//! - a `heddle.input`'s `type` property narrows its `any` output for edge checks, and its
//!   `value` must fit that type;
//! - several edges into a `list[T]` input each carry one item (type `T`); the handle
//!   accumulates them ([`HandleScope::accumulates`]);
//! - a controlled node is exempt from the required-input check: each control event may
//!   carry the missing values;
//! - non-fatal findings (edges dropped by a bypass, sticky inputs that repeat, controlled
//!   nodes nothing controls, output names used twice) go to [`Plan::warnings`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::DeclLookup;
use crate::bypass::{self, WorkEdge};
use crate::correlation;
use crate::decl::{NodeDecl, NodeMode};
use crate::graph::{CONTROL_HANDLE, EdgeType, GraphDoc, NodeDoc, NodeLimits};
use crate::types::PortType;
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
    /// Warning: an edge was dropped while rewriting around a bypassed node.
    BypassDroppedEdge,
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

// ---------------------------------------------------------------------------------------
// Planning
// ---------------------------------------------------------------------------------------

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

/// Plans `doc` against the declarations in `decls`: bypass rewrite, structural checks,
/// property and edge type checks, required inputs and the correlation analysis.
///
/// Every problem found is returned together in one [`ValidationError`], so a user fixes a
/// broken graph in one pass instead of one error per run. On success the plan's nodes are
/// in topological order of data edges and every index is consistent.
///
/// A property whose value is `null` counts as unset (NodeTool documents save `null` for
/// untouched fields): it is not type-checked, does not satisfy a required input, and is
/// left out of [`PlanNode::properties`].
pub fn plan(doc: &GraphDoc, decls: &dyn DeclLookup) -> Result<Plan, ValidationError> {
    Planner {
        doc,
        decls,
        issues: Vec::new(),
        warnings: Vec::new(),
        input_types: HashMap::new(),
    }
    .run()
}

struct Planner<'a> {
    doc: &'a GraphDoc,
    decls: &'a dyn DeclLookup,
    issues: Vec<Issue>,
    warnings: Vec<Issue>,
    /// Output type of each `heddle.input` node that sets its `type` property: the
    /// declaration says `any`, the document narrows it, and edges are checked against it.
    input_types: HashMap<String, PortType>,
}

/// The built-in typed input, whose `type` property narrows its output type.
const INPUT_TYPE: &str = "heddle.input";
/// The built-in graph output, whose `name` keys `RunResult.outputs`.
const OUTPUT_TYPE: &str = "heddle.output";
/// A node's output routed to every control edge it has (model §2.7).
const CONTROL_OUTPUT_HANDLE: &str = "__control_output__";

fn issue(
    kind: IssueKind,
    node: Option<&str>,
    edge: Option<&str>,
    handle: Option<&str>,
    message: String,
) -> Issue {
    Issue {
        kind,
        node: node.map(str::to_string),
        edge: edge.map(str::to_string),
        handle: handle.map(str::to_string),
        message,
    }
}

impl Planner<'_> {
    fn run(mut self) -> Result<Plan, ValidationError> {
        let doc = self.doc;

        // Node ids: the first node with an id wins, later ones are reported.
        let mut by_id: HashMap<&str, usize> = HashMap::new();
        for (i, n) in doc.nodes.iter().enumerate() {
            if n.id.is_empty() {
                self.issues.push(issue(
                    IssueKind::DuplicateNodeId,
                    Some(""),
                    None,
                    None,
                    format!("node #{i} (type `{}`) has an empty id", n.node_type),
                ));
                continue;
            }
            if let Some(&first) = by_id.get(n.id.as_str()) {
                self.issues.push(issue(
                    IssueKind::DuplicateNodeId,
                    Some(&n.id),
                    None,
                    None,
                    format!(
                        "node id is used more than once (nodes #{first} and #{i} in the document); node ids must be unique"
                    ),
                ));
            } else {
                by_id.insert(&n.id, i);
            }
        }
        let decl_of: HashMap<&str, Option<Arc<NodeDecl>>> = by_id
            .iter()
            .map(|(&id, &i)| (id, self.decls.decl(&doc.nodes[i].node_type)))
            .collect();
        // In document order, so issues come out in a stable order.
        for (i, n) in doc.nodes.iter().enumerate() {
            let id = n.id.as_str();
            if n.node_type != INPUT_TYPE || n.is_bypassed() || by_id.get(id) != Some(&i) {
                continue;
            }
            let props = n.merged_properties();
            let Some(v) = props.get("type").filter(|v| !v.is_null()) else {
                continue;
            };
            // A non-string `type` is reported by the property check against the decl.
            let Some(text) = v.as_str() else { continue };
            match text.parse::<PortType>() {
                Ok(ty) => {
                    self.input_types.insert(id.to_string(), ty);
                }
                Err(err) => self.issues.push(issue(
                    IssueKind::InvalidProperty,
                    Some(id),
                    None,
                    Some("type"),
                    err.to_string(),
                )),
            }
        }

        // Edge ids and dangling edges (checked on the document as written, so the error
        // names the edge the user wrote, before any bypass rewrite).
        let mut edge_ids: HashSet<String> = HashSet::new();
        let mut work = Vec::with_capacity(doc.edges.len());
        for e in &doc.edges {
            let id = e.effective_id();
            if !edge_ids.insert(id.clone()) {
                self.issues.push(issue(
                    IssueKind::DuplicateEdgeId,
                    None,
                    Some(&id),
                    None,
                    "edge id is used more than once; edge ids must be unique".to_string(),
                ));
            }
            let missing: Vec<String> = [("source", &e.source), ("target", &e.target)]
                .into_iter()
                .filter(|(_, n)| !by_id.contains_key(n.as_str()))
                .map(|(end, n)| format!("{end} node `{n}`"))
                .collect();
            if !missing.is_empty() {
                self.issues.push(issue(
                    IssueKind::DanglingEdge,
                    None,
                    Some(&id),
                    None,
                    format!(
                        "edge refers to {} which does not exist",
                        missing.join(" and ")
                    ),
                ));
                continue;
            }
            work.push(WorkEdge {
                id,
                source: e.source.clone(),
                source_handle: e.source_handle.clone(),
                target: e.target.clone(),
                target_handle: e.target_handle.clone(),
                edge_type: e.edge_type,
            });
        }

        // Bypass rewrite.
        let bypassed: Vec<&str> = doc
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| n.is_bypassed() && by_id.get(n.id.as_str()) == Some(i))
            .map(|(_, n)| n.id.as_str())
            .collect();
        let work = if bypassed.is_empty() {
            work
        } else {
            let out_ty = |node: &str, handle: &str| -> PortType {
                decl_of
                    .get(node)
                    .and_then(|d| d.as_ref())
                    .and_then(|d| self.output_type(node, d, handle))
                    .unwrap_or_default()
            };
            let in_ty = |node: &str, handle: &str| -> PortType {
                decl_of
                    .get(node)
                    .and_then(|d| d.as_ref())
                    .and_then(|d| input_type(d, handle))
                    .cloned()
                    .unwrap_or_default()
            };
            let compatible =
                |s: &str, sh: &str, t: &str, th: &str| in_ty(t, th).accepts(&out_ty(s, sh));
            let (rewritten, warnings) = bypass::rewrite(work, &bypassed, &compatible);
            self.warnings.extend(warnings);
            rewritten
        };
        let bypassed: HashSet<&str> = bypassed.into_iter().collect();

        // Surviving nodes, in document order.
        let live: Vec<usize> = doc
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| {
                by_id.get(n.id.as_str()) == Some(i) && !bypassed.contains(n.id.as_str())
            })
            .map(|(i, _)| i)
            .collect();
        let mut known_types: Option<Vec<String>> = None;
        for &i in &live {
            let n = &doc.nodes[i];
            if decl_of[n.id.as_str()].is_none() {
                let names = known_types.get_or_insert_with(|| self.decls.type_names());
                self.issues.push(issue(
                    IssueKind::UnknownNodeType,
                    Some(&n.id),
                    None,
                    None,
                    format!(
                        "unknown node type `{}`{}",
                        n.node_type,
                        suggest(&n.node_type, names.iter().map(String::as_str))
                    ),
                ));
            }
        }

        // Edge checks: handles, types, control edges, self-loops.
        let mut into: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
        for e in work.iter().filter(|e| e.edge_type == EdgeType::Data) {
            into.entry((&e.target, &e.target_handle))
                .or_default()
                .push(&e.id);
        }
        for e in &work {
            let fan_in = into
                .get(&(e.target.as_str(), e.target_handle.as_str()))
                .map_or(0, Vec::len);
            self.check_edge(e, &decl_of, fan_in);
        }

        // More than one data edge into a non-list input (sorted: stable issue order).
        let mut multi: Vec<_> = into.iter().filter(|(_, ids)| ids.len() > 1).collect();
        multi.sort();
        for ((node, handle), ids) in multi {
            let Some(Some(d)) = decl_of.get(node) else {
                continue;
            };
            let Some(ty) = input_type(d, handle) else {
                continue;
            };
            if !ty.is_list() {
                self.issues.push(issue(
                    IssueKind::MultipleEdgesIntoInput,
                    Some(node),
                    Some(ids[1]),
                    Some(handle),
                    format!(
                        "{} edges ({}) feed input `{handle}` of type {}; only a list input accepts more than one edge",
                        ids.len(),
                        ids.join(", "),
                        ty
                    ),
                ));
            }
        }

        // Cycles and the topological order.
        let index_of: HashMap<&str, usize> = live
            .iter()
            .enumerate()
            .map(|(pos, &i)| (doc.nodes[i].id.as_str(), pos))
            .collect();
        let data_adj = adjacency(&work, &index_of, live.len(), EdgeType::Data);
        let control_adj = adjacency(&work, &index_of, live.len(), EdgeType::Control);
        let cycle_kinds = [
            (
                &data_adj,
                IssueKind::Cycle,
                "data edges form a cycle through nodes {}; values would wait on themselves",
            ),
            (
                &control_adj,
                IssueKind::ControlCycle,
                "control edges form a cycle through nodes {}; each would wait for the other to finish",
            ),
        ];
        for (adj, kind, message) in cycle_kinds {
            for scc in cycles(adj) {
                let names: Vec<&str> = scc
                    .iter()
                    .map(|&p| doc.nodes[live[p]].id.as_str())
                    .collect();
                self.issues.push(issue(
                    kind,
                    Some(names[0]),
                    None,
                    None,
                    message.replace("{}", &names.join(" -> ")),
                ));
            }
        }
        let order = topo_order(&data_adj);

        // Plan nodes (in topological order) and edges.
        let pos_to_idx: Vec<NodeIdx> = {
            let mut v = vec![0; live.len()];
            for (idx, &pos) in order.iter().enumerate() {
                v[pos] = idx as NodeIdx;
            }
            v
        };
        let fed: HashSet<(&str, &str)> = work
            .iter()
            .filter(|e| e.edge_type == EdgeType::Data)
            .map(|e| (e.target.as_str(), e.target_handle.as_str()))
            .collect();
        let mut nodes: Vec<PlanNode> = Vec::with_capacity(live.len());
        for &pos in &order {
            let n = &doc.nodes[live[pos]];
            let known = decl_of[n.id.as_str()].is_some();
            let decl = decl_of[n.id.as_str()]
                .clone()
                // Unknown types were reported above; a placeholder keeps the rest of the
                // analysis running so every problem is found in one pass.
                .unwrap_or_else(|| Arc::new(NodeDecl::new(n.node_type.clone())));
            let properties = self.node_properties(n, &decl, known, &fed);
            let name = n
                .name
                .clone()
                .or_else(|| {
                    n.properties
                        .get("name")
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                })
                .unwrap_or_else(|| n.id.clone());
            nodes.push(PlanNode {
                id: Arc::from(n.id.as_str()),
                node_type: Arc::from(n.node_type.as_str()),
                name: Arc::from(name),
                decl,
                properties,
                limits: n.limits.clone(),
                in_edges: Vec::new(),
                out_edges: Vec::new(),
                controllers: Vec::new(),
            });
        }
        let mut edges: Vec<PlanEdge> = Vec::with_capacity(work.len());
        for e in &work {
            let (Some(&s), Some(&t)) = (
                index_of.get(e.source.as_str()),
                index_of.get(e.target.as_str()),
            ) else {
                // Edges touching a node dropped as a duplicate id: already reported.
                continue;
            };
            let (s, t) = (pos_to_idx[s], pos_to_idx[t]);
            let ei = edges.len() as EdgeIdx;
            nodes[s as usize].out_edges.push(ei);
            nodes[t as usize].in_edges.push(ei);
            if e.edge_type == EdgeType::Control && !nodes[t as usize].controllers.contains(&s) {
                nodes[t as usize].controllers.push(s);
            }
            edges.push(PlanEdge {
                id: Arc::from(e.id.as_str()),
                source: s,
                source_handle: Arc::from(e.source_handle.as_str()),
                target: t,
                target_handle: Arc::from(e.target_handle.as_str()),
                edge_type: e.edge_type,
            });
        }

        self.required_inputs(&nodes, &fed);
        self.lint(&nodes);

        let correlation =
            correlation::analyze(&nodes, &edges, &mut self.issues, &mut self.warnings);

        if self.issues.is_empty() {
            Ok(Plan {
                nodes,
                edges,
                correlation,
                warnings: self.warnings,
            })
        } else {
            Err(ValidationError {
                issues: self.issues,
            })
        }
    }

    /// `fan_in` is the number of data edges into the edge's target handle: several edges
    /// into a list input each carry one element (the handle accumulates them).
    fn check_edge(
        &mut self,
        e: &WorkEdge,
        decl_of: &HashMap<&str, Option<Arc<NodeDecl>>>,
        fan_in: usize,
    ) {
        let src = decl_of.get(e.source.as_str()).and_then(|d| d.as_ref());
        let tgt = decl_of.get(e.target.as_str()).and_then(|d| d.as_ref());
        if e.source == e.target {
            self.issues.push(issue(
                IssueKind::SelfLoop,
                Some(&e.source),
                Some(&e.id),
                Some(&e.target_handle),
                format!(
                    "{} edge connects node {} to itself",
                    if e.edge_type == EdgeType::Control {
                        "control"
                    } else {
                        "data"
                    },
                    e.source
                ),
            ));
        }
        match e.edge_type {
            EdgeType::Control => {
                if e.target_handle != CONTROL_HANDLE {
                    self.issues.push(issue(
                        IssueKind::ControlHandle,
                        Some(&e.target),
                        Some(&e.id),
                        Some(&e.target_handle),
                        format!(
                            "control edge targets handle `{}`; control edges must target `{CONTROL_HANDLE}`",
                            e.target_handle
                        ),
                    ));
                }
                if let Some(t) = tgt
                    && t.mode != NodeMode::Controlled
                {
                    self.issues.push(issue(
                            IssueKind::ControlHandle,
                            Some(&e.target),
                            Some(&e.id),
                            Some(CONTROL_HANDLE),
                            format!(
                                "control edge targets node {} of type `{}`, which is not a controlled node",
                                e.target, t.type_name
                            ),
                        ));
                }
                if let Some(s) = src
                    && e.source_handle != CONTROL_HANDLE
                    && e.source_handle != CONTROL_OUTPUT_HANDLE
                    && s.output(&e.source_handle).is_none()
                {
                    self.unknown_output(e, s);
                }
            }
            EdgeType::Data => {
                let out = src.map(|s| (s, self.output_type(&e.source, s, &e.source_handle)));
                if let Some((s, None)) = out {
                    self.unknown_output(e, s);
                }
                if e.target_handle == CONTROL_HANDLE {
                    self.issues.push(issue(
                        IssueKind::ControlHandle,
                        Some(&e.target),
                        Some(&e.id),
                        Some(CONTROL_HANDLE),
                        format!(
                            "data edge targets `{CONTROL_HANDLE}`; set \"edge_type\": \"control\" on it"
                        ),
                    ));
                    return;
                }
                let Some(t) = tgt else { return };
                let Some(input_ty) = input_type(t, &e.target_handle) else {
                    self.unknown_handle(
                        IssueKind::UnknownInputHandle,
                        e,
                        &e.target,
                        &e.target_handle,
                        t,
                        "input",
                        t.inputs.iter().map(|p| p.name.as_str()),
                    );
                    return;
                };
                let (want, what) = match input_ty {
                    PortType::List(elem) if fan_in > 1 => (&**elem, "items of "),
                    ty => (ty, ""),
                };
                if let Some((_, Some(out_ty))) = out
                    && !want.accepts(&out_ty)
                {
                    self.issues.push(issue(
                        IssueKind::TypeMismatch,
                        Some(&e.target),
                        Some(&e.id),
                        Some(&e.target_handle),
                        format!(
                            "output `{}.{}` ({}) cannot feed {what}input `{}.{}` ({})",
                            e.source, e.source_handle, out_ty, e.target, e.target_handle, input_ty
                        ),
                    ));
                }
            }
        }
    }

    /// The type of output `handle` of node `id`, narrowed by a `heddle.input`'s `type`.
    fn output_type(&self, id: &str, decl: &NodeDecl, handle: &str) -> Option<PortType> {
        let declared = &decl.output(handle)?.ty;
        Some(self.input_types.get(id).unwrap_or(declared).clone())
    }

    fn unknown_output(&mut self, e: &WorkEdge, s: &NodeDecl) {
        self.unknown_handle(
            IssueKind::UnknownOutputHandle,
            e,
            &e.source,
            &e.source_handle,
            s,
            "output",
            s.outputs.iter().map(|o| o.name.as_str()),
        );
    }

    /// An edge names a port its node type does not have: say so, suggest a close name
    /// and list the ports that exist.
    #[allow(clippy::too_many_arguments)]
    fn unknown_handle<'a>(
        &mut self,
        kind: IssueKind,
        e: &WorkEdge,
        node: &str,
        handle: &str,
        decl: &NodeDecl,
        side: &str,
        names: impl Iterator<Item = &'a str> + Clone,
    ) {
        self.issues.push(issue(
            kind,
            Some(node),
            Some(&e.id),
            Some(handle),
            format!(
                "node type `{}` has no {side} `{handle}`{} ({side}s: {})",
                decl.type_name,
                suggest(handle, names.clone()),
                list_names(names)
            ),
        ));
    }

    /// Checks a node's properties against its declaration and returns the map the node
    /// is invoked with: values for edge-fed handles removed (edge values win), nulls
    /// removed, ints widened where the port is a float.
    fn node_properties(
        &mut self,
        n: &NodeDoc,
        decl: &NodeDecl,
        known: bool,
        fed: &HashSet<(&str, &str)>,
    ) -> BTreeMap<String, Value> {
        let merged = n.merged_properties();
        let mut out = BTreeMap::new();
        for (k, v) in merged {
            let port = decl.input(&k).or_else(|| decl.property(&k));
            // Undeclared properties of a dynamic-inputs node are values for its inputs.
            if known && port.is_none() && k != "name" && !decl.dynamic_inputs {
                self.issues.push(issue(
                    IssueKind::UnknownProperty,
                    Some(&n.id),
                    None,
                    Some(&k),
                    format!(
                        "node type `{}` has no input or property `{k}`{}",
                        decl.type_name,
                        suggest(
                            &k,
                            decl.inputs
                                .iter()
                                .chain(&decl.properties)
                                .map(|p| p.name.as_str())
                        )
                    ),
                ));
                continue;
            }
            if v.is_null() {
                continue;
            }
            if fed.contains(&(n.id.as_str(), k.as_str())) {
                continue;
            }
            let v = match port {
                Some(p) => match p.ty.check(&v) {
                    Ok(()) => p.ty.coerce(v),
                    Err(why) => {
                        self.issues.push(issue(
                            IssueKind::InvalidProperty,
                            Some(&n.id),
                            None,
                            Some(&k),
                            format!("value of `{k}` does not fit its declared type: {why}"),
                        ));
                        continue;
                    }
                },
                None => v,
            };
            out.insert(k, v);
        }
        // A typed input's default value must fit the type it declares.
        if let (Some(ty), Some(v)) = (self.input_types.get(&n.id), out.get("value")) {
            match ty.check(v) {
                Ok(()) => {
                    let v = ty.coerce(v.clone());
                    out.insert("value".to_string(), v);
                }
                Err(why) => self.issues.push(issue(
                    IssueKind::InvalidProperty,
                    Some(&n.id),
                    None,
                    Some("value"),
                    format!("default value does not fit the input's type `{ty}`: {why}"),
                )),
            }
        }
        out
    }

    /// Findings that do not stop a run but usually mean the graph is not what the author
    /// meant.
    fn lint(&mut self, nodes: &[PlanNode]) {
        let mut outputs: HashMap<&str, &str> = HashMap::new();
        for n in nodes {
            if n.decl.mode == NodeMode::Controlled && n.controllers.is_empty() {
                self.warnings.push(issue(
                    IssueKind::ControlHandle,
                    Some(&n.id),
                    None,
                    Some(CONTROL_HANDLE),
                    format!(
                        "node type `{}` runs only on control events and no control edge reaches this node: it runs only if the caller sends it control events while the run is live",
                        n.node_type
                    ),
                ));
            }
            if &*n.node_type == OUTPUT_TYPE
                && let Some(first) = outputs.insert(&n.name, &n.id)
            {
                self.warnings.push(issue(
                    IssueKind::InvalidProperty,
                    Some(&n.id),
                    None,
                    Some("name"),
                    format!(
                        "output name `{}` is also used by output node {first}; their values are merged under one name",
                        n.name
                    ),
                ));
            }
        }
    }

    /// A required input (or property) needs an edge, a value or a default. A controlled
    /// node is exempt: each control event (from a controller or from the caller) carries
    /// properties that may supply the value.
    fn required_inputs(&mut self, nodes: &[PlanNode], fed: &HashSet<(&str, &str)>) {
        for n in nodes {
            if n.decl.mode == NodeMode::Controlled {
                continue;
            }
            for (what, p) in n
                .decl
                .inputs
                .iter()
                .map(|p| ("input", p))
                .chain(n.decl.properties.iter().map(|p| ("property", p)))
            {
                if !p.required || p.default.is_some() {
                    continue;
                }
                if n.properties.contains_key(&p.name) || fed.contains(&(&*n.id, p.name.as_str())) {
                    continue;
                }
                self.issues.push(issue(
                    IssueKind::MissingRequiredInput,
                    Some(&n.id),
                    None,
                    Some(&p.name),
                    format!(
                        "required {what} `{}` ({}) has no edge, no value and no default",
                        p.name, p.ty
                    ),
                ));
            }
        }
    }
}

/// Successors per node position, for edges of one type between surviving nodes.
fn adjacency(
    edges: &[WorkEdge],
    index_of: &HashMap<&str, usize>,
    n: usize,
    ty: EdgeType,
) -> Vec<Vec<usize>> {
    let mut adj = vec![Vec::new(); n];
    for e in edges
        .iter()
        .filter(|e| e.edge_type == ty && e.source != e.target)
    {
        if let (Some(&s), Some(&t)) = (
            index_of.get(e.source.as_str()),
            index_of.get(e.target.as_str()),
        ) {
            adj[s].push(t);
        }
    }
    // Sorted successors: deterministic traversal, and parallel edges count once.
    for succ in &mut adj {
        succ.sort_unstable();
        succ.dedup();
    }
    adj
}

/// Strongly connected components with more than one node (self-loops are reported per
/// edge), each rotated to start at its lowest position and listed along a cycle.
fn cycles(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    // Tarjan, iterative so a long chain cannot overflow the stack.
    let n = adj.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut out = Vec::new();
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut call: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut i)) = call.last_mut() {
            if *i < adj[v].len() {
                let w = adj[v][*i];
                *i += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    call.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
            } else {
                call.pop();
                if let Some(&(u, _)) = call.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut comp = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        comp.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if comp.len() > 1 {
                        out.push(cycle_path(adj, &comp));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// A cycle through the component's lowest node, following edges inside the component
/// (so the message reads as a path the user can trace in the graph).
fn cycle_path(adj: &[Vec<usize>], comp: &[usize]) -> Vec<usize> {
    let inside: HashSet<usize> = comp.iter().copied().collect();
    let start = *comp.iter().min().unwrap_or(&0);
    // BFS from start back to start within the component.
    let mut prev: HashMap<usize, usize> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &adj[v] {
            if !inside.contains(&w) {
                continue;
            }
            if w == start {
                let mut path = vec![v];
                let mut cur = v;
                while cur != start {
                    cur = prev[&cur];
                    path.push(cur);
                }
                path.reverse();
                path.push(start);
                return path;
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = prev.entry(w) {
                slot.insert(v);
                queue.push_back(w);
            }
        }
    }
    let mut c = comp.to_vec();
    c.sort();
    c
}

/// Kahn's algorithm, always taking the earliest ready node in document order so the plan
/// is deterministic and reads like the file. Nodes left in cycles (already reported) are
/// appended in document order.
fn topo_order(adj: &[Vec<usize>]) -> Vec<usize> {
    let n = adj.len();
    let mut indeg = vec![0usize; n];
    for succ in adj {
        for &w in succ {
            indeg[w] += 1;
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&v| indeg[v] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    while let Some(Reverse(v)) = ready.pop() {
        order.push(v);
        placed[v] = true;
        for &w in &adj[v] {
            indeg[w] -= 1;
            if indeg[w] == 0 {
                ready.push(Reverse(w));
            }
        }
    }
    order.extend((0..n).filter(|&v| !placed[v]));
    order
}

fn list_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<String> = names.map(|n| format!("`{n}`")).collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

/// `" (did you mean `x`?)"` for the closest candidate within a small edit distance.
fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let limit = (name.chars().count() / 3).max(2);
    let lower = name.to_lowercase();
    candidates
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diag + cost);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            suggest(
                "heddle.constnt",
                ["heddle.constant", "heddle.input"].into_iter()
            ),
            " (did you mean `heddle.constant`?)"
        );
        assert_eq!(suggest("zzz", ["heddle.constant"].into_iter()), "");
    }

    #[test]
    fn cycle_is_listed_along_its_edges() {
        // 0 -> 1 -> 2 -> 0, 3 alone.
        let adj = vec![vec![1], vec![2], vec![0], vec![]];
        assert_eq!(cycles(&adj), vec![vec![0, 1, 2, 0]]);
        assert_eq!(topo_order(&[vec![2], vec![0], vec![]]), vec![1, 0, 2]);
    }
}
