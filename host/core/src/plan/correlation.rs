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
use crate::decl::{NodeMode, OutputCorrelation, OutputDecl};
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
    /// One node's scopes, in six passes. They run in this order because each needs what
    /// the one before settled: the handles' scopes come from the edges into the node
    /// (scoped when their sources were analysed, which the topological order guarantees),
    /// the invocation scope from the handles' scopes, the handles' classes and the driver
    /// from the invocation scope, the outputs from all of these; the last pass hands the
    /// outputs' scopes to the edges the later nodes read.
    fn node(&mut self, ni: usize) -> NodeScope {
        let by_handle = self.connected_inputs(ni);
        let mut inputs = self.input_scopes(ni, &by_handle);
        let invocation_scope = self.invocation_scope(ni, &inputs);
        let repeating_driver = self.classify_inputs(ni, &mut inputs, &invocation_scope);
        let driven = repeating_driver.is_some();
        let outputs = self.output_scopes(ni, &inputs, &invocation_scope, driven);
        self.scope_out_edges(ni, &outputs);
        NodeScope {
            invocation_scope,
            inputs: inputs.into(),
            outputs: outputs.into(),
            repeating_driver,
        }
    }

    /// Pass 1: the data edges into the node that the analysis can use, by target handle.
    ///
    /// An edge from a later node (a cycle) has no scope yet, and an edge naming a handle
    /// that either end does not declare has no port to scope; planning reports both
    /// itself, so they are left out and this analysis still reports its own findings on
    /// the rest. Leaves: every listed edge's source precedes the node (its scope is
    /// known), every listed handle is declared, and handles are in name order (the order
    /// the node's findings are reported in and [`NodeScope::inputs`] keeps).
    fn connected_inputs(&self, ni: usize) -> BTreeMap<Arc<str>, Vec<EdgeIdx>> {
        let node = &self.nodes[ni];
        let mut by_handle: BTreeMap<Arc<str>, Vec<EdgeIdx>> = BTreeMap::new();
        for &ei in &node.in_edges {
            let e = &self.edges[ei as usize];
            if e.edge_type != EdgeType::Data
                || (e.source as usize) >= ni
                || input_type(&node.decl, &e.target_handle).is_none()
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
        by_handle
    }

    /// Pass 2: each connected handle's scope, from the edges into it.
    ///
    /// The scheduler buckets a handle's values by one lineage key, so every edge into a
    /// handle must carry the same scope: edges that disagree are an issue (one per edge
    /// differing from the first), and their common prefix stands in so the later passes
    /// still have one scope to work with. Leaves: one [`HandleScope`] per connected
    /// handle with its final `scope`, `accumulates` (several edges into a list handle)
    /// and `upstream_edges`; `repeats_per_key` if any edge repeats (pass 4 may add to
    /// it); `class` a placeholder until pass 4.
    fn input_scopes(
        &mut self,
        ni: usize,
        by_handle: &BTreeMap<Arc<str>, Vec<EdgeIdx>>,
    ) -> BTreeMap<Arc<str>, HandleScope> {
        let node = &self.nodes[ni];
        let mut inputs: BTreeMap<Arc<str>, HandleScope> = BTreeMap::new();
        for (h, eis) in by_handle {
            let first = &self.c.edges[eis[0] as usize];
            let mut scope = first.scope.clone();
            let mut repeats = false;
            for &ei in eis {
                let es = &self.c.edges[ei as usize];
                repeats |= es.repeats_per_key;
                if es.scope != first.scope {
                    let message = format!(
                        "edges into this handle carry values of different scopes ({} via edge {}, {} via edge {}); feed it from one iteration level or add a join node",
                        self.show(&first.scope),
                        self.edges[eis[0] as usize].id,
                        self.show(&es.scope),
                        self.edges[ei as usize].id
                    );
                    let issue = self.finding(ni, IssueKind::IncomparableScopes, h, message);
                    self.issues.push(Issue {
                        edge: Some(self.edges[ei as usize].id.to_string()),
                        ..issue
                    });
                    scope = common_prefix(&scope, &es.scope);
                }
            }
            let is_list = input_type(&node.decl, h).is_some_and(PortType::is_list);
            inputs.insert(
                h.clone(),
                HandleScope {
                    scope,
                    // Placeholder until the invocation scope is known (pass 4).
                    class: HandleClass::Max,
                    accumulates: eis.len() > 1 && is_list,
                    repeats_per_key: repeats,
                    upstream_edges: eis.len() as u32,
                },
            );
        }
        inputs
    }

    /// Pass 3: the scope the node is invoked at, the lineage key its invocations are
    /// told apart by.
    ///
    /// A buffered node pairs one value per input per key, which is only defined when the
    /// input scopes nest: it is invoked at the deepest, and an input from an unrelated
    /// iteration is an issue (reported once, at the first such input), after which the
    /// common prefix stands in. A join or streaming-input node pairs (or reads) values
    /// itself, so it is invoked at the common prefix of its inputs. A node without
    /// inputs is invoked once, at the root. Leaves: every input scope is a prefix of the
    /// invocation scope or extends it, the two cases pass 4 tells apart.
    fn invocation_scope(
        &mut self,
        ni: usize,
        inputs: &BTreeMap<Arc<str>, HandleScope>,
    ) -> Vec<RootIdx> {
        let decl = &self.nodes[ni].decl;
        if inputs.is_empty() {
            return Vec::new();
        }
        if decl.mode == NodeMode::StreamingInput || decl.is_join {
            return common_prefix_of(inputs);
        }
        // On a tie the last deepest input in name order, as `max_by_key` picks.
        let (deep_name, deep) = inputs
            .iter()
            .max_by_key(|(_, h)| h.scope.len())
            .map(|(n, h)| (n.clone(), h.scope.clone()))
            .unwrap_or_default();
        for (name, h) in inputs {
            if !is_prefix(&h.scope, &deep) {
                let message = format!(
                    "input `{name}` (scope {}) and input `{deep_name}` (scope {}) come from unrelated iterations, so their values cannot be paired; add a join node to combine them",
                    self.show(&h.scope),
                    self.show(&deep)
                );
                self.issues
                    .push(self.finding(ni, IssueKind::IncomparableScopes, name, message));
                return common_prefix_of(inputs);
            }
        }
        deep
    }

    /// Pass 4: each handle's class against the invocation scope, and the repeating
    /// driver.
    ///
    /// The class is how the scheduler keeps a handle's values (bucketed per key, sticky
    /// per parent key, one sticky value). A handle deeper than a join's or
    /// streaming-input node's invocation scope repeats per key: several of its values
    /// project onto each key (so does one deeper than the common prefix pass 3 fell back
    /// to on a buffered node). A handle that repeats must be one the scheduler can pair:
    /// a repeating sticky handle leaves which value goes with which item undefined (an
    /// issue on a prefix; a warning on the empty scope, where the latest value wins),
    /// and a buffered node can follow at most one repeating stream at the invocation
    /// scope (its driver, fired once per envelope; a second is an issue, and the first
    /// in name order still drives). A join pairs its repeating inputs in arrival order
    /// and has no driver; a streaming-input node reads its inbox itself, so the repeat checks
    /// skip it and it has no driver either. Leaves: every class and
    /// `repeats_per_key` final, and at most one driver.
    fn classify_inputs(
        &mut self,
        ni: usize,
        inputs: &mut BTreeMap<Arc<str>, HandleScope>,
        invocation_scope: &[RootIdx],
    ) -> Option<Arc<str>> {
        let decl = &self.nodes[ni].decl;
        let streaming_input = decl.mode == NodeMode::StreamingInput;
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
                HandleClass::Prefix => {
                    let message = format!(
                        "input `{name}` repeats per key but is a sticky side input (scope {} under invocation scope {}): which of its values pairs with each item is undefined; collect it into a list first or feed it at the invocation scope",
                        self.show(&h.scope),
                        self.show(invocation_scope)
                    );
                    self.issues
                        .push(self.finding(ni, IssueKind::Correlation, name, message));
                }
                HandleClass::Empty => {
                    let message = format!(
                        "input `{name}` may receive several values but is a sticky input under invocation scope {}: each invocation uses the latest value that has arrived",
                        self.show(invocation_scope)
                    );
                    self.warnings
                        .push(self.finding(ni, IssueKind::Correlation, name, message));
                }
                HandleClass::Max => {}
            }
        }
        if streaming_input {
            return None;
        }
        if drivers.len() > 1 {
            let message = format!(
                "inputs {} all repeat per key at the invocation scope {}; a buffered node can be driven by at most one repeating input, since pairing two streams by arrival order is a choice the graph must make explicit: use a join node to pair them, make the node streaming-input, or collect all but one into a list",
                drivers
                    .iter()
                    .map(|d| format!("`{d}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.show(invocation_scope)
            );
            self.issues
                .push(self.finding(ni, IssueKind::Correlation, &drivers[1], message));
        }
        drivers.into_iter().next()
    }

    /// Pass 5: the scope of every declared output, and whether it repeats per key.
    ///
    /// The edges out of the node carry these, so every later node's passes depend on
    /// them. A node fires or emits several times per key, so its plain outputs repeat,
    /// when a repeating input drives it (`driven`), when it is a join pairing repeating
    /// (or deeper) inputs in arrival order, or when its mode lets one invocation emit
    /// many values. A buffered node's output at a strict prefix of its invocation scope
    /// is an issue: it emits once per item, so its items would collide under one parent
    /// key (an aggregate output is reported by its own rule instead). Leaves: one
    /// [`OutputScope`] per declared output, under the output's interned name.
    fn output_scopes(
        &mut self,
        ni: usize,
        inputs: &BTreeMap<Arc<str>, HandleScope>,
        invocation_scope: &[RootIdx],
        driven: bool,
    ) -> BTreeMap<Arc<str>, OutputScope> {
        let node = &self.nodes[ni];
        let decl = &node.decl;
        let streaming_input = decl.mode == NodeMode::StreamingInput;
        let pairs_many = decl.is_join
            && inputs
                .values()
                .any(|h| h.class == HandleClass::Max && h.repeats_per_key && !h.accumulates);
        let emits_many = driven
            || pairs_many
            || decl.mode.streams_output()
            || decl.mode == NodeMode::Controlled
            || (&*node.node_type == INPUT_TYPE
                && node.properties.get("streaming") == Some(&Value::Bool(true)));
        let mut outputs: BTreeMap<Arc<str>, OutputScope> = BTreeMap::new();
        for o in &decl.outputs {
            let out = self.output_scope(ni, o, inputs, invocation_scope, emits_many);
            if !streaming_input
                && out.scope.len() < invocation_scope.len()
                && is_prefix(&out.scope, invocation_scope)
                && !matches!(o.correlation, OutputCorrelation::Aggregate)
            {
                let message = format!(
                    "output `{}` would carry scope {}, a strict prefix of the invocation scope {}: a buffered node emits once per item, so its items would collide under one parent key",
                    o.name,
                    self.show(&out.scope),
                    self.show(invocation_scope)
                );
                self.issues
                    .push(self.finding(ni, IssueKind::Correlation, &o.name, message));
            }
            let name = self
                .output_names
                .entry(o.name.as_str())
                .or_insert_with(|| Arc::from(o.name.as_str()))
                .clone();
            outputs.insert(name, out);
        }
        outputs
    }

    /// The scope of output `o` by its correlation, by the rules the module doc lists
    /// (`emits_many`: pass 5 found the node's plain outputs repeat per key). An
    /// iteration output mints its root here, or reuses it when a sibling output of the
    /// same group did.
    fn output_scope(
        &mut self,
        ni: usize,
        o: &OutputDecl,
        inputs: &BTreeMap<Arc<str>, HandleScope>,
        invocation_scope: &[RootIdx],
        emits_many: bool,
    ) -> OutputScope {
        let node = &self.nodes[ni];
        let at_invocation = |repeats_per_key| OutputScope {
            scope: invocation_scope.to_vec(),
            mints: None,
            repeats_per_key,
        };
        match &o.correlation {
            OutputCorrelation::Single => at_invocation(emits_many),
            OutputCorrelation::Iteration { group } => {
                let name = format!("{}:{}", node.id, group.as_deref().unwrap_or(&o.name));
                let r = self.root(name, ni);
                let mut scope = invocation_scope.to_vec();
                scope.push(r);
                OutputScope {
                    scope,
                    mints: Some(r),
                    repeats_per_key: false,
                }
            }
            OutputCorrelation::Chunk => at_invocation(true),
            OutputCorrelation::Aggregate => {
                if node.decl.mode != NodeMode::StreamingInput {
                    let message = format!(
                        "output `{}` aggregates (drops the innermost lineage root) but node type `{}` is not a streaming-input node; only a node that sees the whole stream can know when a scope is complete",
                        o.name, node.node_type
                    );
                    self.issues
                        .push(self.finding(ni, IssueKind::Correlation, &o.name, message));
                }
                // What is aggregated is the deepest input (a collect with a side
                // input at the root still emits one list per parent item), when the
                // inputs nest; otherwise the invocation scope.
                let deepest = inputs
                    .values()
                    .map(|h| h.scope.as_slice())
                    .max_by_key(|s| s.len())
                    .filter(|d| inputs.values().all(|h| is_prefix(&h.scope, d)));
                let mut scope = deepest.unwrap_or(invocation_scope).to_vec();
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
                    if input_type(&node.decl, source).is_none() {
                        let message = format!(
                            "output `{}` forwards the lineage of input `{source}`, which node type `{}` does not declare",
                            o.name, node.node_type
                        );
                        self.issues.push(self.finding(
                            ni,
                            IssueKind::Correlation,
                            &o.name,
                            message,
                        ));
                    }
                    at_invocation(emits_many)
                }
            },
        }
    }

    /// Pass 6: the node's outgoing data edges take the scope of the output they leave.
    ///
    /// This is how the node's findings reach the nodes after it (their passes 1 and 2
    /// read these edges). Leaves: every data edge out of the node scoped; control edges,
    /// and edges from an output the node does not declare, keep the empty scope.
    fn scope_out_edges(&mut self, ni: usize, outputs: &BTreeMap<Arc<str>, OutputScope>) {
        for &ei in &self.nodes[ni].out_edges {
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
    }

    /// A finding on node `ni` at `handle` (an input or an output): every finding of the
    /// analysis names both, and the one that also names an edge sets `edge` over this.
    fn finding(&self, ni: usize, kind: IssueKind, handle: &str, message: String) -> Issue {
        Issue {
            kind,
            node: Some(self.nodes[ni].id.to_string()),
            edge: None,
            handle: Some(handle.to_string()),
            message,
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

/// The longest common prefix of every input's scope (empty without inputs).
fn common_prefix_of(inputs: &BTreeMap<Arc<str>, HandleScope>) -> Vec<RootIdx> {
    let mut it = inputs.values();
    let mut lcp = it.next().map(|h| h.scope.clone()).unwrap_or_default();
    for h in it {
        lcp = common_prefix(&lcp, &h.scope);
    }
    lcp
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
