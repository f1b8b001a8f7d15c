//! A graph checked without running it, as `heddle validate --json` reports it: valid
//! or not, every problem at once, and what planning resolved (declared output fields,
//! edge rules, graph nodes with their digests), so an editor or a CI step can show the
//! same thing the command line does.

use heddle_core::GraphDoc;
use heddle_core::plan::{Issue, Plan};
use serde::Serialize;

/// The report on one graph file.
#[derive(Serialize)]
pub struct Verdict<'a> {
    graph: String,
    /// The document's `name` and `description` (a NodeTool workflow's are kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    valid: bool,
    /// Set when the file could not be read or parsed at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    issues: &'a [Issue],
    warnings: &'a [Issue],
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    edges: Option<usize>,
    /// Each node's declared output fields, as the planner resolved them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    declared_fields: Vec<DeclaredFields<'a>>,
    /// Each edge's condition and field narrowing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    edge_rules: Vec<EdgeRuleView<'a>>,
    /// Each graph node as expanded: the document it includes with its sha256 (what
    /// `sha256` pins), its ports and the plan nodes inside it, by path.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    graph_nodes: &'a [heddle_core::compose::GraphNodeInfo],
}

#[derive(Serialize)]
struct DeclaredFields<'a> {
    node: &'a str,
    handle: &'a str,
    fields: &'a [heddle_core::contract::FieldDecl],
}

#[derive(Serialize)]
struct EdgeRuleView<'a> {
    edge: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    when: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fields: Option<Vec<&'a str>>,
}

impl<'a> Verdict<'a> {
    /// Nothing known yet of `graph` but whether it is `valid`.
    fn of(graph: String, valid: bool) -> Self {
        Verdict {
            graph,
            name: None,
            description: None,
            valid,
            error: None,
            issues: &[],
            warnings: &[],
            nodes: None,
            edges: None,
            declared_fields: Vec::new(),
            edge_rules: Vec::new(),
            graph_nodes: &[],
        }
    }

    /// A file that could not be read or parsed at all: `error` says why.
    pub fn unreadable(graph: String, error: String) -> Self {
        Verdict {
            error: Some(error),
            ..Verdict::of(graph, false)
        }
    }

    /// A graph that planned: its size, warnings and what planning resolved.
    pub fn valid(graph: String, doc: &'a GraphDoc, plan: &'a Plan) -> Self {
        Verdict {
            name: doc.name.as_deref(),
            description: doc.description.as_deref(),
            warnings: &plan.warnings,
            nodes: Some(plan.nodes.len()),
            edges: Some(plan.edges.len()),
            graph_nodes: &plan.graphs,
            ..Verdict::of(graph, true)
        }
        .declarations(plan)
    }

    /// A graph planning refused: every issue found.
    pub fn invalid(graph: String, doc: &'a GraphDoc, issues: &'a [Issue]) -> Self {
        Verdict {
            name: doc.name.as_deref(),
            description: doc.description.as_deref(),
            issues,
            ..Verdict::of(graph, false)
        }
    }

    /// The declarations of a planned graph.
    fn declarations(mut self, plan: &'a Plan) -> Self {
        self.declared_fields = plan
            .nodes
            .iter()
            .filter_map(|n| {
                n.contract.as_deref().map(|c| DeclaredFields {
                    node: &n.id,
                    handle: &c.handle,
                    fields: &c.contract.fields,
                })
            })
            .collect();
        self.edge_rules = plan
            .edges
            .iter()
            .filter_map(|e| {
                e.rule.as_deref().map(|r| EdgeRuleView {
                    edge: &e.id,
                    when: r.when.as_ref().map(|w| w.text()),
                    fields: r.fields.as_ref().map(|f| f.iter().map(|k| &**k).collect()),
                })
            })
            .collect();
        self
    }
}

/// One graph node as `heddle validate` prints it: what it includes, pinned by which
/// digest, and its ports.
pub fn graph_node_line(g: &heddle_core::compose::GraphNodeInfo) -> String {
    let port = |p: &heddle_core::compose::GraphPort| {
        let default = p
            .default
            .as_ref()
            .map(|v| format!(" = {}", serde_json::to_string(v).unwrap_or_default()))
            .unwrap_or_default();
        format!("{} ({}{default})", p.name, p.ty)
    };
    let list = |ps: &[heddle_core::compose::GraphPort]| {
        if ps.is_empty() {
            "none".to_string()
        } else {
            ps.iter().map(port).collect::<Vec<_>>().join(", ")
        }
    };
    format!(
        "  graph node {}: {} (sha256 {}), {} nodes inside; in: {}; out: {}",
        g.id,
        g.key,
        g.sha256,
        g.nodes.len(),
        list(&g.inputs),
        list(&g.outputs)
    )
}
