//! Static correlation (scope) analysis: which fan-out items every value is indexed by.
//!
//! Every value travels with a lineage: a map from lineage root to item index. Statically,
//! what matters is which roots a value is indexed by (its *scope*, outermost first), and
//! whether several values may share one lineage key (`repeats_per_key`). Knowing both for
//! every edge, handle and output before the run lets the buffered scheduler pair values
//! by key without guessing, and lets us reject graphs that could only deadlock or pair
//! values arbitrarily.
//!
//! The rules, per node in topological order:
//! - a buffered (also streaming-output or controlled) node is invoked at its longest input
//!   scope; every other input scope must be a prefix of it, else the inputs come from
//!   unrelated iterations and a join node is needed. A join node (`is_join`) and a
//!   streaming-input node (which sees every envelope itself) are invoked at the longest
//!   common prefix of their input scopes;
//! - a handle at the invocation scope is [`HandleClass::Max`] (bucketed per key), a shorter
//!   non-empty one [`HandleClass::Prefix`] (sticky per parent key), an empty one under a
//!   non-empty invocation scope [`HandleClass::Empty`] (one sticky value). On a join or
//!   streaming-input node a handle deeper than the invocation scope is also `Max`, with
//!   `repeats_per_key` set: its values project onto the invocation key, several per key;
//! - at most one input of a buffered node may repeat per key at the invocation scope: it
//!   becomes the *repeating driver* (the node fires once per envelope on it). A join node
//!   has no driver: it pairs repeating and deeper inputs in arrival order;
//! - outputs: `single` at the invocation scope, repeating when the node fires or emits
//!   several times per key (a repeating driver, a join pairing streams, streaming modes,
//!   controlled nodes, a `heddle.input` with `streaming: true`);
//!   `iteration` appends the root `"{node}:{group or handle}"`; `chunk` repeats per key;
//!   `aggregate` drops the innermost root of the deepest input (streaming-input nodes
//!   only; when the inputs do not nest, of the invocation scope); `forward(source)`
//!   takes the scope of input `source`.
//!
//! Rejections are pushed to `issues`, non-fatal findings to `warnings`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::issues::{Issue, IssueKind};
use super::model::{
    Correlation, EdgeIdx, EdgeScope, HandleClass, HandleScope, INPUT_TYPE, NodeScope, OutputScope,
    PlanEdge, PlanNode, RootIdx, RootInfo, input_type,
};
use crate::decl::{NodeMode, OutputCorrelation};
use crate::graph::EdgeType;
use crate::types::PortType;
use crate::value::Value;

/// Runs the analysis over `nodes` (in topological order of data edges). Edges whose
/// source comes later in `nodes` (only possible in a cyclic graph, which planning rejects
/// anyway) and edges naming undeclared handles are ignored, so the analysis can still
/// report its own findings alongside structural problems.
pub fn analyze(
    nodes: &[PlanNode],
    edges: &[PlanEdge],
    issues: &mut Vec<Issue>,
    warnings: &mut Vec<Issue>,
) -> Correlation {
    let mut a = Analysis {
        nodes,
        edges,
        c: Correlation {
            roots: Vec::new(),
            edges: vec![EdgeScope::default(); edges.len()],
            nodes: Vec::with_capacity(nodes.len()),
        },
        root_ids: HashMap::new(),
        output_names: HashMap::new(),
        issues,
        warnings,
    };
    for ni in 0..nodes.len() {
        let scope = a.node(ni);
        a.c.nodes.push(scope);
    }
    a.c
}

struct Analysis<'a> {
    nodes: &'a [PlanNode],
    edges: &'a [PlanEdge],
    c: Correlation,
    root_ids: HashMap<Arc<str>, RootIdx>,
    /// Output names, one text per name for every node declaring it: a large graph has
    /// many nodes and few names.
    output_names: HashMap<&'a str, Arc<str>>,
    issues: &'a mut Vec<Issue>,
    warnings: &'a mut Vec<Issue>,
}

impl<'a> Analysis<'a> {
    fn node(&mut self, ni: usize) -> NodeScope {
        let nodes = self.nodes;
        let node = &nodes[ni];
        let decl = &node.decl;
        let streaming_input = decl.mode == NodeMode::StreamingInput;

        // Connected data inputs, grouped by handle, in handle-name order.
        let mut by_handle: BTreeMap<Arc<str>, Vec<EdgeIdx>> = BTreeMap::new();
        for &ei in &node.in_edges {
            let e = &self.edges[ei as usize];
            if e.edge_type != EdgeType::Data
                || (e.source as usize) >= ni
                || input_type(decl, &e.target_handle).is_none()
                || self.nodes[e.source as usize]
                    .decl
                    .output(&e.source_handle)
                    .is_none()
            {
                continue;
            }
            by_handle
                .entry(e.target_handle.clone())
                .or_default()
                .push(ei);
        }

        let mut inputs: BTreeMap<Arc<str>, HandleScope> = BTreeMap::new();
        for (h, eis) in &by_handle {
            let first = &self.c.edges[eis[0] as usize];
            let mut scope = first.scope.clone();
            let mut repeats = false;
            for &ei in eis {
                let es = &self.c.edges[ei as usize];
                repeats |= es.repeats_per_key;
                if es.scope != first.scope {
                    self.issues.push(Issue {
                        kind: IssueKind::IncomparableScopes,
                        node: Some(node.id.to_string()),
                        edge: Some(self.edges[ei as usize].id.to_string()),
                        handle: Some(h.to_string()),
                        message: format!(
                            "edges into this handle carry values of different scopes ({} via edge {}, {} via edge {}); feed it from one iteration level or add a join node",
                            self.show(&first.scope),
                            self.edges[eis[0] as usize].id,
                            self.show(&es.scope),
                            self.edges[ei as usize].id
                        ),
                    });
                    scope = common_prefix(&scope, &es.scope);
                }
            }
            let is_list = input_type(decl, h).is_some_and(PortType::is_list);
            inputs.insert(
                h.clone(),
                HandleScope {
                    scope,
                    // Placeholder until the invocation scope is known.
                    class: HandleClass::Max,
                    accumulates: eis.len() > 1 && is_list,
                    repeats_per_key: repeats,
                    upstream_edges: eis.len() as u32,
                },
            );
        }

        // Invocation scope.
        let invocation_scope = if inputs.is_empty() {
            Vec::new()
        } else if streaming_input || decl.is_join {
            let mut it = inputs.values();
            let mut lcp = it.next().map(|h| h.scope.clone()).unwrap_or_default();
            for h in it {
                lcp = common_prefix(&lcp, &h.scope);
            }
            lcp
        } else {
            // The deepest input; every other must be a prefix of it.
            let (deep_name, deep) = inputs
                .iter()
                .max_by_key(|(_, h)| h.scope.len())
                .map(|(n, h)| (n.clone(), h.scope.clone()))
                .unwrap_or_default();
            let mut ok = true;
            for (name, h) in &inputs {
                if !is_prefix(&h.scope, &deep) {
                    ok = false;
                    self.issues.push(Issue {
                        kind: IssueKind::IncomparableScopes,
                        node: Some(node.id.to_string()),
                        edge: None,
                        handle: Some(name.to_string()),
                        message: format!(
                            "input `{name}` (scope {}) and input `{deep_name}` (scope {}) come from unrelated iterations, so their values cannot be paired; add a join node to combine them",
                            self.show(&h.scope),
                            self.show(&deep)
                        ),
                    });
                    break;
                }
            }
            if ok {
                deep
            } else {
                let mut it = inputs.values();
                let mut lcp = it.next().map(|h| h.scope.clone()).unwrap_or_default();
                for h in it {
                    lcp = common_prefix(&lcp, &h.scope);
                }
                lcp
            }
        };

        // Classes and the repeating driver.
        let mut drivers: Vec<Arc<str>> = Vec::new();
        for (name, h) in inputs.iter_mut() {
            h.class = if h.scope.len() >= invocation_scope.len() {
                if h.scope.len() > invocation_scope.len() {
                    // Deeper than a join/streaming node's invocation: several values
                    // project onto each invocation key.
                    h.repeats_per_key = true;
                } else if h.repeats_per_key && !h.accumulates && !decl.is_join {
                    // A join pairs repeating inputs in arrival order instead.
                    drivers.push(name.clone());
                }
                HandleClass::Max
            } else if h.scope.is_empty() {
                HandleClass::Empty
            } else {
                HandleClass::Prefix
            };
            if streaming_input || !h.repeats_per_key {
                continue;
            }
            match h.class {
                HandleClass::Prefix => self.issues.push(Issue {
                    kind: IssueKind::Correlation,
                    node: Some(node.id.to_string()),
                    edge: None,
                    handle: Some(name.to_string()),
                    message: format!(
                        "input `{name}` repeats per key but is a sticky side input (scope {} under invocation scope {}): which of its values pairs with each item is undefined; collect it into a list first or feed it at the invocation scope",
                        self.show(&h.scope),
                        self.show(&invocation_scope)
                    ),
                }),
                HandleClass::Empty => self.warnings.push(Issue {
                    kind: IssueKind::Correlation,
                    node: Some(node.id.to_string()),
                    edge: None,
                    handle: Some(name.to_string()),
                    message: format!(
                        "input `{name}` may receive several values but is a sticky input under invocation scope {}: each invocation uses the latest value that has arrived",
                        self.show(&invocation_scope)
                    ),
                }),
                HandleClass::Max => {}
            }
        }
        let repeating_driver = if streaming_input {
            None
        } else {
            if drivers.len() > 1 {
                self.issues.push(Issue {
                    kind: IssueKind::Correlation,
                    node: Some(node.id.to_string()),
                    edge: None,
                    handle: Some(drivers[1].to_string()),
                    message: format!(
                        "inputs {} all repeat per key at the invocation scope {}; a buffered node can be driven by at most one repeating input, since pairing two streams by arrival order is a choice the graph must make explicit: use a join node to pair them, make the node streaming-input, or collect all but one into a list",
                        drivers
                            .iter()
                            .map(|d| format!("`{d}`"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        self.show(&invocation_scope)
                    ),
                });
            }
            drivers.into_iter().next()
        };

        // Outputs. A node fires several times per key, so its plain outputs repeat, when a
        // repeating input drives it, when it is a join pairing repeating (or deeper)
        // inputs in arrival order, or when its mode lets one invocation emit many values.
        let pairs_many = decl.is_join
            && inputs
                .values()
                .any(|h| h.class == HandleClass::Max && h.repeats_per_key && !h.accumulates);
        let emits_many = repeating_driver.is_some()
            || pairs_many
            || decl.mode.streams_output()
            || decl.mode == NodeMode::Controlled
            || (&*node.node_type == INPUT_TYPE
                && node.properties.get("streaming") == Some(&Value::Bool(true)));
        let mut outputs: BTreeMap<Arc<str>, OutputScope> = BTreeMap::new();
        for o in &decl.outputs {
            let out = match &o.correlation {
                OutputCorrelation::Single => OutputScope {
                    scope: invocation_scope.clone(),
                    mints: None,
                    repeats_per_key: emits_many,
                },
                OutputCorrelation::Iteration { group } => {
                    let name = format!("{}:{}", node.id, group.as_deref().unwrap_or(&o.name));
                    let r = self.root(name, ni);
                    let mut scope = invocation_scope.clone();
                    scope.push(r);
                    OutputScope {
                        scope,
                        mints: Some(r),
                        repeats_per_key: false,
                    }
                }
                OutputCorrelation::Chunk => OutputScope {
                    scope: invocation_scope.clone(),
                    mints: None,
                    repeats_per_key: true,
                },
                OutputCorrelation::Aggregate => {
                    if !streaming_input {
                        self.issues.push(Issue {
                            kind: IssueKind::Correlation,
                            node: Some(node.id.to_string()),
                            edge: None,
                            handle: Some(o.name.clone()),
                            message: format!(
                                "output `{}` aggregates (drops the innermost lineage root) but node type `{}` is not a streaming-input node; only a node that sees the whole stream can know when a scope is complete",
                                o.name, node.node_type
                            ),
                        });
                    }
                    // What is aggregated is the deepest input (a collect with a side
                    // input at the root still emits one list per parent item), when the
                    // inputs nest; otherwise the invocation scope.
                    let deepest = inputs
                        .values()
                        .map(|h| &h.scope)
                        .max_by_key(|s| s.len())
                        .filter(|d| inputs.values().all(|h| is_prefix(&h.scope, d)));
                    let mut scope = deepest.unwrap_or(&invocation_scope).clone();
                    scope.pop();
                    OutputScope {
                        scope,
                        mints: None,
                        repeats_per_key: false,
                    }
                }
                OutputCorrelation::Forward { source } => match inputs.get(source.as_str()) {
                    Some(h) => OutputScope {
                        scope: h.scope.clone(),
                        mints: None,
                        repeats_per_key: h.repeats_per_key || emits_many,
                    },
                    None => {
                        if input_type(decl, source).is_none() {
                            self.issues.push(Issue {
                                kind: IssueKind::Correlation,
                                node: Some(node.id.to_string()),
                                edge: None,
                                handle: Some(o.name.clone()),
                                message: format!(
                                    "output `{}` forwards the lineage of input `{source}`, which node type `{}` does not declare",
                                    o.name, node.node_type
                                ),
                            });
                        }
                        OutputScope {
                            scope: invocation_scope.clone(),
                            mints: None,
                            repeats_per_key: emits_many,
                        }
                    }
                },
            };
            if !streaming_input
                && out.scope.len() < invocation_scope.len()
                && is_prefix(&out.scope, &invocation_scope)
                && !matches!(o.correlation, OutputCorrelation::Aggregate)
            {
                self.issues.push(Issue {
                    kind: IssueKind::Correlation,
                    node: Some(node.id.to_string()),
                    edge: None,
                    handle: Some(o.name.clone()),
                    message: format!(
                        "output `{}` would carry scope {}, a strict prefix of the invocation scope {}: a buffered node emits once per item, so its items would collide under one parent key",
                        o.name,
                        self.show(&out.scope),
                        self.show(&invocation_scope)
                    ),
                });
            }
            let name = self
                .output_names
                .entry(o.name.as_str())
                .or_insert_with(|| Arc::from(o.name.as_str()))
                .clone();
            outputs.insert(name, out);
        }

        // Scopes of this node's outgoing data edges.
        for &ei in &node.out_edges {
            let e = &self.edges[ei as usize];
            if e.edge_type != EdgeType::Data {
                continue;
            }
            if let Some(o) = outputs.get(&e.source_handle) {
                self.c.edges[ei as usize] = EdgeScope {
                    scope: o.scope.clone(),
                    repeats_per_key: o.repeats_per_key,
                };
            }
        }

        NodeScope {
            invocation_scope,
            inputs: inputs.into(),
            outputs: outputs.into(),
            repeating_driver,
        }
    }

    fn root(&mut self, name: String, node: usize) -> RootIdx {
        let name: Arc<str> = Arc::from(name);
        if let Some(&r) = self.root_ids.get(&name) {
            return r;
        }
        let r = self.c.roots.len() as RootIdx;
        self.c.roots.push(RootInfo {
            name: name.clone(),
            node: node as u32,
        });
        self.root_ids.insert(name, r);
        r
    }

    /// A scope as the user can read it: `[foreach1:item, inner:item]`, `[]` for the root.
    fn show(&self, scope: &[RootIdx]) -> String {
        let names: Vec<&str> = scope
            .iter()
            .map(|&r| &*self.c.roots[r as usize].name)
            .collect();
        format!("[{}]", names.join(", "))
    }
}

fn is_prefix(p: &[RootIdx], of: &[RootIdx]) -> bool {
    p.len() <= of.len() && p == &of[..p.len()]
}

fn common_prefix(a: &[RootIdx], b: &[RootIdx]) -> Vec<RootIdx> {
    a.iter()
        .zip(b)
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| *x)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert!(is_prefix(&[], &[1, 2]));
        assert!(is_prefix(&[1], &[1, 2]));
        assert!(!is_prefix(&[2], &[1, 2]));
        assert!(!is_prefix(&[1, 2, 3], &[1, 2]));
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), vec![1, 2]);
        assert_eq!(common_prefix(&[1], &[2]), Vec::<RootIdx>::new());
    }
}
