//! The planner's checks of what a graph declares beyond wiring (see [`super::declared`]):
//! output contracts resolved against the node's outputs, edge conditions parsed and
//! refused when the engine cannot evaluate them, field lists checked against what the
//! source declares.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::bypass::WorkEdge;
use super::declared::{EdgeRule, NodeContract};
use super::issues::{IssueKind, issue};
use super::model::{CHECK_TYPE, PlanNode};
use super::planner::{DeclOf, Planner};
use crate::compose::PATH_SEP;
use crate::expr::{Expr, ExprError};
use crate::graph::EdgeType;
use crate::types::PortType;

/// The name the document holding node `target` gives its feeder `source`, in a graph
/// whose graph nodes were expanded into paths: relative to `target`'s own graph node
/// (`g/all` feeding `g/complete` is `all`), and a graph node's port by the graph node
/// (`g/out` feeding `complete` is `g`). A check inside a graph node names its inputs as
/// its document wrote them.
pub(super) fn written_name<'a>(source: &'a str, target: &str) -> &'a str {
    let prefix = target.rfind(PATH_SEP).map_or("", |i| &target[..=i]);
    let local = source.strip_prefix(prefix).unwrap_or(source);
    local.split(PATH_SEP).next().unwrap_or(local)
}

/// Whether values of this port type may be objects (what fields need).
fn may_be_object(ty: &PortType) -> bool {
    matches!(ty, PortType::Any | PortType::Json | PortType::Object)
}

impl Planner<'_> {
    /// Resolves and checks every node's `output` declaration, in plan order.
    pub(super) fn node_contracts(&mut self, nodes: &mut [PlanNode]) {
        let docs: HashMap<&str, _> = self
            .doc
            .nodes
            .iter()
            .filter_map(|n| n.output.as_ref().map(|o| (n.id.as_str(), o)))
            .collect();
        for node in nodes.iter_mut() {
            let Some(&c) = docs.get(&*node.id) else {
                continue;
            };
            let outputs = &node.decl.outputs;
            let port = match &c.handle {
                Some(h) => outputs.iter().find(|o| o.name == *h),
                None if outputs.len() == 1 => outputs.first(),
                None => None,
            };
            let Some(port) = port else {
                let names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
                let message = match &c.handle {
                    Some(h) => format!(
                        "declared output fields are on output `{h}`, which the node does not have (outputs: {})",
                        names.join(", ")
                    ),
                    None => format!(
                        "the node has {} outputs ({}); say which one carries the declared fields with `output.handle`",
                        names.len(),
                        names.join(", ")
                    ),
                };
                self.contract_issue(&node.id, c.handle.as_deref(), message);
                continue;
            };
            let ty = self
                .output_type(&node.id, &node.decl, &port.name)
                .unwrap_or_default();
            if !may_be_object(&ty) {
                self.contract_issue(
                    &node.id,
                    Some(&port.name),
                    format!(
                        "declares output fields, but output `{}` is of type {ty}, not an object",
                        port.name
                    ),
                );
                continue;
            }
            let mut seen = HashSet::new();
            for f in &c.fields {
                if f.key.is_empty() || !seen.insert(f.key.as_str()) {
                    self.contract_issue(
                        &node.id,
                        Some(&port.name),
                        format!("declared field key `{}` is empty or used twice", f.key),
                    );
                }
            }
            node.contract = Some(Arc::new(NodeContract {
                handle: Arc::from(port.name.as_str()),
                contract: c.clone(),
            }));
        }
    }

    fn contract_issue(&mut self, node: &str, handle: Option<&str>, message: String) {
        self.issues.push(issue(
            IssueKind::InvalidOutputContract,
            Some(node),
            None,
            handle,
            message,
        ));
    }

    /// The rule of each surviving edge that declares `when` or `fields` (looked up by
    /// id: an edge rewired around a bypassed node keeps its outgoing id, and its rule).
    pub(super) fn edge_rules(
        &mut self,
        work: &[WorkEdge],
        nodes: &[PlanNode],
        decl_of: &DeclOf<'_>,
    ) -> HashMap<String, Arc<EdgeRule>> {
        let contracts: HashMap<&str, &NodeContract> = nodes
            .iter()
            .filter_map(|n| n.contract.as_deref().map(|c| (&*n.id, c)))
            .collect();
        let declared: HashMap<String, &crate::graph::EdgeDoc> = self
            .doc
            .edges
            .iter()
            .filter(|e| e.when.is_some() || e.fields.is_some())
            .map(|e| (e.effective_id(), e))
            .collect();
        let mut rules = HashMap::new();
        for e in work.iter().filter(|e| e.edge_type == EdgeType::Data) {
            let into_check = decl_of
                .get(e.target)
                .and_then(|d| d.as_ref())
                .is_some_and(|d| d.type_name == CHECK_TYPE);
            let written = written_name(e.source, e.target);
            if into_check && e.target_handle != e.source && e.target_handle != written {
                self.issues.push(issue(
                    IssueKind::InvalidEdgeRule,
                    Some(e.target),
                    Some(&e.id),
                    Some(e.target_handle),
                    format!(
                        "an edge into a check targets the handle named after its source node: use `\"targetHandle\": \"{written}\"` (the assertion reads `upstream.{written}`)"
                    ),
                ));
            }
        }
        for e in work {
            let Some(doc) = declared.get(&*e.id) else {
                continue;
            };
            let bad = |message: String| {
                issue(
                    IssueKind::InvalidEdgeRule,
                    Some(e.target),
                    Some(&e.id),
                    None,
                    message,
                )
            };
            if e.edge_type == EdgeType::Control {
                self.issues.push(bad(
                    "a control edge carries events, not values: `when` and `fields` apply to data edges only".into(),
                ));
                continue;
            }
            let contract = contracts
                .get(e.source)
                .filter(|c| *c.handle == *e.source_handle);
            let when = match doc.when.as_deref().map(Expr::compile) {
                None => None,
                Some(Ok(x)) => Some(x),
                Some(Err(err)) => {
                    self.issues.push(bad(condition_message(&err)));
                    continue;
                }
            };
            let fields = match &doc.fields {
                None => None,
                Some(keys) => {
                    let ty = decl_of
                        .get(e.source)
                        .and_then(|d| d.as_ref())
                        .and_then(|d| self.output_type(e.source, d, e.source_handle))
                        .unwrap_or_default();
                    if keys.is_empty() {
                        self.issues.push(bad(
                            "`fields` lists no key; leave it out to carry the whole value".into(),
                        ));
                        continue;
                    }
                    if !may_be_object(&ty) {
                        self.issues.push(bad(format!(
                            "`fields` selects keys of an object, but output `{}` of node {} is of type {ty}",
                            e.source_handle, e.source
                        )));
                        continue;
                    }
                    if let Some(c) = contract {
                        let unknown: Vec<&str> = keys
                            .iter()
                            .filter(|k| !c.contract.fields.iter().any(|f| f.key == **k))
                            .map(String::as_str)
                            .collect();
                        if !unknown.is_empty() {
                            self.issues.push(bad(format!(
                                "`fields` names {} which node {} does not declare (declared: {})",
                                unknown.join(", "),
                                e.source,
                                c.contract.summary()
                            )));
                            continue;
                        }
                    }
                    Some(keys.iter().map(|k| Arc::from(k.as_str())).collect())
                }
            };
            rules.insert(
                e.id.to_string(),
                Arc::new(EdgeRule {
                    when,
                    fields,
                    source_fields: contract.is_some(),
                }),
            );
        }
        rules
    }

    /// Nodes below a condition: some path into them crosses an edge with `when`. Edges
    /// from such nodes may join into one input (only one branch delivers per item).
    pub(super) fn below_condition<'w>(&self, work: &'w [WorkEdge]) -> HashSet<&'w str> {
        let when: HashSet<String> = self
            .doc
            .edges
            .iter()
            .filter(|e| e.when.is_some())
            .map(|e| e.effective_id())
            .collect();
        let mut below: HashSet<&str> = work
            .iter()
            .filter(|e| e.edge_type == EdgeType::Data && when.contains(&*e.id))
            .map(|e| e.target)
            .collect();
        // A fixed point over the data edges (cycles are reported elsewhere).
        loop {
            let before = below.len();
            for e in work.iter().filter(|e| e.edge_type == EdgeType::Data) {
                if below.contains(e.source) {
                    below.insert(e.target);
                }
            }
            if below.len() == before {
                return below;
            }
        }
    }

    /// Whether the edges `ids` into one non-list input are a join of condition branches:
    /// each comes from below a condition and carries none itself (a condition on a
    /// joining edge would veto the join whenever another branch delivers).
    pub(super) fn branch_join(
        &self,
        ids: &[&str],
        work: &[WorkEdge],
        below: &HashSet<&str>,
    ) -> bool {
        ids.iter().all(|id| {
            work.iter().find(|e| e.id == *id).is_some_and(|e| {
                below.contains(e.source)
                    && !self
                        .doc
                        .edges
                        .iter()
                        .any(|d| d.when.is_some() && d.effective_id() == e.id)
            })
        })
    }
}

fn condition_message(err: &ExprError) -> String {
    format!("condition refused: {err}")
}
