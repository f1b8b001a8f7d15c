//! The planning pass: indexes the document, rewrites bypassed nodes away, runs the checks
//! ([`super::checks`]), orders the nodes and hands the result to the correlation analysis.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::bypass::{self, WorkEdge};
use super::correlation;
use super::digraph::{cycles, topo_order};
use super::inputs;
use super::issues::{Issue, IssueKind, ValidationError, issue, suggest_type};
use super::model::{EdgeIdx, INPUT_TYPE, Indices, NodeIdx, Plan, PlanEdge, PlanNode, input_type};
use crate::DeclLookup;
use crate::compose::{self, Bounds, Bundle, Composition};
use crate::decl::NodeDecl;
use crate::graph::{CONTROL_HANDLE, EdgeType, GraphDoc};
use crate::nodetool;
use crate::types::PortType;

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
///
/// A graph with graph nodes (`heddle.graph`) needs its documents read: plan it with
/// [`plan_with`]. Here each graph node is refused, naming the document it wants.
pub fn plan(doc: &GraphDoc, decls: &dyn DeclLookup) -> Result<Plan, ValidationError> {
    if !has_graph_nodes(doc) {
        return Planner::new(doc, decls, &HashMap::new()).run();
    }
    let none = Bundle::new(
        [],
        "this program plans without reading graph documents (it gives the planner no graph source)",
    );
    let comp = Composition::load(doc, None, &none, Bounds::default());
    plan_with(doc, decls, &comp)
}

/// [`plan`] for a graph whose graph nodes include the documents `comp` read
/// ([`Composition::load`]): each graph node is expanded inline, its inner nodes named by
/// path (`outer/inner`), and the whole is planned as one graph. A problem reading or
/// expanding a document is an issue of the graph node at fault, reported with every
/// other problem.
pub fn plan_with(
    doc: &GraphDoc,
    decls: &dyn DeclLookup,
    comp: &Composition,
) -> Result<Plan, ValidationError> {
    if !has_graph_nodes(doc) {
        return Planner::new(doc, decls, &HashMap::new()).run();
    }
    let ex = compose::expand(doc, comp, decls);
    let planned = Planner::new(&ex.doc, decls, &ex.overrides).run();
    let mut issues = ex.issues;
    match planned {
        Ok(mut plan) if issues.is_empty() => {
            let mut graphs = ex.graphs;
            for g in &mut graphs {
                let prefix = format!("{}{}", g.id, compose::PATH_SEP);
                g.nodes = plan
                    .by_id
                    .iter()
                    .map(|&i| &plan.nodes[i as usize].id)
                    .filter(|id| id.starts_with(&prefix))
                    .map(|id| id.to_string())
                    .collect();
            }
            plan.graphs = graphs;
            plan.included = ex.included.into_values().collect();
            Ok(plan)
        }
        Ok(_) => Err(ValidationError { issues }),
        Err(e) => {
            issues.extend(e.issues.into_iter().map(|i| at_port(i, &ex.ports)));
            Err(ValidationError { issues })
        }
    }
}

fn has_graph_nodes(doc: &GraphDoc) -> bool {
    doc.nodes
        .iter()
        .any(|n| n.node_type == compose::GRAPH_TYPE && !n.is_bypassed())
}

/// An issue about a port node told as one of its graph node's handle: `g.text` rather
/// than the pass-through `g/text` that carries it.
fn at_port(mut i: Issue, ports: &HashMap<String, (String, String)>) -> Issue {
    let Some((graph, port)) = i.node.as_deref().and_then(|n| ports.get(n)) else {
        return i;
    };
    let node = i.node.take().unwrap_or_default();
    i.message = i
        .message
        .replace(&format!("{node}.value"), &format!("{graph}.{port}"));
    if i.handle.as_deref().is_none_or(|h| h == "value") {
        i.handle = Some(port.clone());
    }
    i.node = Some(graph.clone());
    i
}

pub(super) struct Planner<'a> {
    pub(super) doc: &'a GraphDoc,
    pub(super) decls: &'a dyn DeclLookup,
    /// Declarations by node id that replace the type's (a graph node's typed ports).
    overrides: &'a HashMap<String, Arc<NodeDecl>>,
    pub(super) issues: Vec<Issue>,
    pub(super) warnings: Vec<Issue>,
    /// Output type of each `heddle.input` node that sets its `type` property: the
    /// declaration says `any`, the document narrows it, and edges are checked against it.
    pub(super) input_types: HashMap<String, PortType>,
}

/// Node id → position in the document, for the first node with each id.
type ById<'a> = HashMap<&'a str, usize>;
/// Node id → its declaration (`None` for an unknown type, already reported).
pub(super) type DeclOf<'a> = HashMap<&'a str, Option<Arc<NodeDecl>>>;

impl<'a> Planner<'a> {
    fn new(
        doc: &'a GraphDoc,
        decls: &'a dyn DeclLookup,
        overrides: &'a HashMap<String, Arc<NodeDecl>>,
    ) -> Self {
        Planner {
            doc,
            decls,
            overrides,
            issues: Vec::new(),
            warnings: Vec::new(),
            input_types: HashMap::new(),
        }
    }

    /// The pass, phase by phase; each phase reports into `issues` and keeps going.
    fn run(mut self) -> Result<Plan, ValidationError> {
        let doc = self.doc;
        if let Some(imported) = &doc.imported {
            for (node, note) in &imported.notes {
                self.warnings.push(issue(
                    IssueKind::Imported,
                    Some(node),
                    None,
                    None,
                    note.clone(),
                ));
            }
        }
        let by_id = self.index_nodes();
        let decl_of: DeclOf<'a> = by_id
            .iter()
            .map(|(&id, &i)| {
                let decl = match self.overrides.get(id) {
                    Some(d) => Some(d.clone()),
                    None => self.decls.decl(&doc.nodes[i].node_type),
                };
                (id, decl)
            })
            .collect();
        self.narrow_input_types(&by_id);
        let work = self.work_edges(&by_id);
        let (work, bypassed) = self.rewrite_bypassed(work, &by_id, &decl_of);
        let live = self.live_nodes(&by_id, &bypassed, &decl_of);
        self.check_edges(&work, &decl_of);

        // Cycles and the topological order, over positions in `live`.
        let index_of: HashMap<&str, usize> = live
            .iter()
            .enumerate()
            .map(|(pos, &i)| (doc.nodes[i].id.as_str(), pos))
            .collect();
        let data_adj = adjacency(&work, &index_of, live.len(), EdgeType::Data);
        let control_adj = adjacency(&work, &index_of, live.len(), EdgeType::Control);
        self.report_cycles(&data_adj, &control_adj, &live);
        self.report_control_waits(&work, &data_adj, &index_of);
        let order = topo_order(&data_adj);
        // The adjacency lists are freed once the order is known, so the plan's nodes
        // and edges reuse their room: on a large graph the document, the plan and these
        // are all alive at planning's peak, which is the peak of a run's memory. (The
        // rest of planning's scratch is freed when planning returns: freed earlier, the
        // correlation analysis took its room, and the run then had to grow the heap for
        // its own allocations, page by page, inside its timed span: +12% CPU on the
        // 1,000-node wide bench for no measurable gain on the chain.)
        drop((data_adj, control_adj));

        let fed: HashSet<(&str, &str)> = work
            .iter()
            .filter(|e| e.edge_type == EdgeType::Data)
            .map(|e| (e.target, e.target_handle))
            .collect();
        let mut nodes = self.plan_nodes(&order, &live, &decl_of, &fed);
        self.node_contracts(&mut nodes);
        let rules = self.edge_rules(&work, &nodes, &decl_of);
        let edges = plan_edges(&work, &rules, &index_of, &order, &mut nodes);

        self.required_inputs(&nodes, &fed);
        self.lint(&nodes);
        self.warnings.extend(super::review::review(&nodes, &edges));

        let correlation =
            correlation::analyze(&nodes, &edges, &mut self.issues, &mut self.warnings);

        if self.issues.is_empty() {
            Ok(Plan {
                inputs: inputs::collect(&nodes, &self.input_types),
                by_id: super::model::order_by_id(&nodes),
                graphs: Vec::new(),
                included: Vec::new(),
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

    /// Node ids: the first node with an id wins, later ones (and empty ids) are reported.
    fn index_nodes(&mut self) -> ById<'a> {
        let mut by_id = ById::new();
        for (i, n) in self.doc.nodes.iter().enumerate() {
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
        by_id
    }

    /// Reads the `type` property of each graph input, so edges from it are checked
    /// against the type it declares rather than its `any` output. In document order, so
    /// issues come out in a stable order.
    fn narrow_input_types(&mut self, by_id: &ById<'a>) {
        for (i, n) in self.doc.nodes.iter().enumerate() {
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
    }

    /// Edge ids and dangling edges, checked on the document as written (before any
    /// bypass rewrite) so the error names the edge the user wrote. Dangling edges are
    /// left out of the result.
    fn work_edges(&mut self, by_id: &ById<'a>) -> Vec<WorkEdge<'a>> {
        let doc: &'a GraphDoc = self.doc;
        // An explicit id is borrowed; only a derived one is made.
        let ids: Vec<Cow<'a, str>> = doc
            .edges
            .iter()
            .map(|e| match &e.id {
                Some(id) => Cow::Borrowed(id.as_str()),
                None => Cow::Owned(e.effective_id()),
            })
            .collect();
        let mut edge_ids: HashSet<&str> = HashSet::with_capacity(ids.len());
        let mut kept = Vec::with_capacity(ids.len());
        for (e, id) in doc.edges.iter().zip(&ids) {
            if !edge_ids.insert(id) {
                self.issues.push(issue(
                    IssueKind::DuplicateEdgeId,
                    None,
                    Some(id),
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
                    Some(id),
                    None,
                    format!(
                        "edge refers to {} which does not exist",
                        missing.join(" and ")
                    ),
                ));
            }
            kept.push(missing.is_empty());
        }
        drop(edge_ids);
        doc.edges
            .iter()
            .zip(ids)
            .zip(kept)
            .filter(|(_, kept)| *kept)
            .map(|((e, id), _)| WorkEdge {
                id,
                source: &e.source,
                source_handle: &e.source_handle,
                target: &e.target,
                target_handle: &e.target_handle,
                edge_type: e.edge_type,
            })
            .collect()
    }

    /// Rewires edges around bypassed nodes ([`bypass::rewrite`]), matching types as the
    /// declarations (and narrowed inputs) give them. Returns the edges and the ids of the
    /// bypassed nodes.
    fn rewrite_bypassed(
        &mut self,
        work: Vec<WorkEdge<'a>>,
        by_id: &ById<'a>,
        decl_of: &DeclOf<'a>,
    ) -> (Vec<WorkEdge<'a>>, HashSet<&'a str>) {
        let bypassed: Vec<&'a str> = self
            .doc
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| n.is_bypassed() && by_id.get(n.id.as_str()) == Some(i))
            .map(|(_, n)| n.id.as_str())
            .collect();
        // An edge into a bypassed node is absorbed by the rewrite, and with it any rule it
        // carries: dropping a `when` would let through what it rules out, so such an edge
        // is refused rather than rewired without its rule.
        for e in &self.doc.edges {
            if (e.when.is_some() || e.fields.is_some()) && bypassed.contains(&e.target.as_str()) {
                let what = if e.when.is_some() {
                    "a `when` condition"
                } else {
                    "a `fields` list"
                };
                self.issues.push(issue(
                    IssueKind::InvalidEdgeRule,
                    Some(&e.target),
                    Some(&e.effective_id()),
                    Some(&e.target_handle),
                    format!(
                        "edge carries {what} into node {}, which is bypassed: the bypass would drop the rule; move it to the edge leaving {} or stop bypassing the node",
                        e.target, e.target
                    ),
                ));
            }
        }
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
        (work, bypassed.into_iter().collect())
    }

    /// Positions in the document of the nodes that take part in the run (first of each
    /// id, not bypassed), in document order; reports those of unknown type.
    fn live_nodes(
        &mut self,
        by_id: &ById<'a>,
        bypassed: &HashSet<&'a str>,
        decl_of: &DeclOf<'a>,
    ) -> Vec<usize> {
        let doc = self.doc;
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
                let searched = self
                    .decls
                    .searched()
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default();
                let message = if nodetool::is_nodetool(doc)
                    || n.node_type.starts_with(nodetool::PREFIX)
                {
                    format!(
                        "node type `{}` comes from NodeTool's package `{}`; Heddle has no such node{}: replace it with a Heddle node type (`heddle nodes` lists them){searched}",
                        n.node_type,
                        nodetool::package_of(&n.node_type),
                        suggest_type(&n.node_type, names)
                    )
                } else {
                    format!(
                        "unknown node type `{}`{}{searched}",
                        n.node_type,
                        suggest_type(&n.node_type, names)
                    )
                };
                self.issues.push(issue(
                    IssueKind::UnknownNodeType,
                    Some(&n.id),
                    None,
                    None,
                    message,
                ));
            }
        }
        live
    }

    /// Reports data and control cycles, each as the path of node ids around it.
    fn report_cycles(&mut self, data: &[Vec<usize>], control: &[Vec<usize>], live: &[usize]) {
        let cycle_kinds = [
            (
                data,
                IssueKind::Cycle,
                "data edges form a cycle through nodes {}; values would wait on themselves",
            ),
            (
                control,
                IssueKind::ControlCycle,
                "control edges form a cycle through nodes {}; each would wait for the other to finish",
            ),
        ];
        for (adj, kind, message) in cycle_kinds {
            for scc in cycles(adj) {
                let names: Vec<&str> = scc
                    .iter()
                    .map(|&p| self.doc.nodes[live[p]].id.as_str())
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
    }

    /// A controller waits for its controlled node's replies while its invocation runs,
    /// and a controlled node runs an event only once its data inputs are there: a data
    /// path between the two, either way, is a wait that never ends (the controller's
    /// outputs come after the replies, or the controller's inputs after the node ran).
    /// Refused at planning, naming both nodes and the control edge, instead of a hang.
    fn report_control_waits(
        &mut self,
        work: &[WorkEdge],
        data: &[Vec<usize>],
        index_of: &HashMap<&str, usize>,
    ) {
        for e in work
            .iter()
            .filter(|e| e.edge_type == EdgeType::Control && e.source != e.target)
        {
            let (Some(&c), Some(&t)) = (index_of.get(e.source), index_of.get(e.target)) else {
                continue;
            };
            let message = if reaches(data, c, t) {
                format!(
                    "node {} is controlled by node {} and also waits for its outputs through data edges: the controller waits for the node's replies, the node for the controller's outputs",
                    e.target, e.source
                )
            } else if reaches(data, t, c) {
                format!(
                    "node {} controls node {} and also waits for its outputs through data edges: the controlled node runs only on the controller's events",
                    e.source, e.target
                )
            } else {
                continue;
            };
            self.issues.push(issue(
                IssueKind::ControlCycle,
                Some(e.target),
                Some(&e.id),
                Some(CONTROL_HANDLE),
                message,
            ));
        }
    }

    /// The plan's nodes in topological order, with checked properties and no edges yet.
    fn plan_nodes(
        &mut self,
        order: &[usize],
        live: &[usize],
        decl_of: &DeclOf<'a>,
        fed: &HashSet<(&str, &str)>,
    ) -> Vec<PlanNode> {
        let mut nodes: Vec<PlanNode> = Vec::with_capacity(live.len());
        // One text per node type, shared by its nodes (and their events and reports): a
        // large graph has many nodes and few types.
        let mut types: HashMap<&'a str, Arc<str>> = HashMap::new();
        let doc = self.doc;
        for &pos in order {
            let n = &doc.nodes[live[pos]];
            let known = decl_of[n.id.as_str()].is_some();
            let decl = decl_of[n.id.as_str()]
                .clone()
                // Unknown types were reported above; a placeholder keeps the rest of the
                // analysis running so every problem is found in one pass.
                .unwrap_or_else(|| Arc::new(NodeDecl::new(n.node_type.clone())));
            let properties = self.node_properties(n, &decl, known, fed);
            let limits = self.node_limits(n, &decl, known);
            if known {
                self.node_config(n, &decl, &properties, limits.as_ref(), fed);
            }
            let id: Arc<str> = Arc::from(n.id.as_str());
            let node_type = types
                .entry(n.node_type.as_str())
                .or_insert_with(|| Arc::from(n.node_type.as_str()))
                .clone();
            let name = n
                .name
                .as_deref()
                .or_else(|| n.properties.get("name").and_then(|v| v.as_str()))
                .map_or_else(|| id.clone(), Arc::from);
            nodes.push(PlanNode {
                id,
                node_type,
                name,
                decl,
                properties,
                limits: limits.map(Box::new),
                in_edges: Indices::new(),
                out_edges: Indices::new(),
                controllers: Indices::new(),
                contract: None,
            });
        }
        nodes
    }

    /// The type of output `handle` of node `id`, narrowed by a `heddle.input`'s `type`.
    pub(super) fn output_type(&self, id: &str, decl: &NodeDecl, handle: &str) -> Option<PortType> {
        let declared = &decl.output(handle)?.ty;
        Some(self.input_types.get(id).unwrap_or(declared).clone())
    }
}

/// The plan's edges by node index, each recorded on its two nodes (and a control edge's
/// source as a controller of its target).
fn plan_edges<'a>(
    work: &'a [WorkEdge<'a>],
    rules: &HashMap<String, Arc<super::declared::EdgeRule>>,
    index_of: &HashMap<&str, usize>,
    order: &[usize],
    nodes: &mut [PlanNode],
) -> Vec<PlanEdge> {
    let mut pos_to_idx: Vec<NodeIdx> = vec![0; order.len()];
    for (idx, &pos) in order.iter().enumerate() {
        pos_to_idx[pos] = idx as NodeIdx;
    }
    let mut edges: Vec<PlanEdge> = Vec::with_capacity(work.len());
    // One text per handle name, shared by every edge naming it: a large graph has many
    // edges and few names (`value` on both ends of every edge of a chain), and a text of
    // its own was an allocation of 32 bytes (with the allocator's header) per end.
    let mut names: HashMap<&str, Arc<str>> = HashMap::new();
    let mut name = |n: &'a str| names.entry(n).or_insert_with(|| Arc::from(n)).clone();
    for e in work {
        let (Some(&s), Some(&t)) = (index_of.get(e.source), index_of.get(e.target)) else {
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
            id: Arc::from(&*e.id),
            source: s,
            source_handle: name(e.source_handle),
            target: t,
            target_handle: name(e.target_handle),
            edge_type: e.edge_type,
            rule: rules.get(&*e.id).cloned(),
        });
    }
    edges
}

/// Whether a path of `adj` edges leads from `from` to `to`.
fn reaches(adj: &[Vec<usize>], from: usize, to: usize) -> bool {
    let mut seen = vec![false; adj.len()];
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if std::mem::replace(&mut seen[n], true) {
            continue;
        }
        stack.extend(adj[n].iter().copied().filter(|&m| !seen[m]));
    }
    false
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
        if let (Some(&s), Some(&t)) = (index_of.get(e.source), index_of.get(e.target)) {
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
