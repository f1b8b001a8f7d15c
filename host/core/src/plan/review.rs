//! The advisory review of a planned graph (seed 004): what does not stop a run but means
//! part of it cannot do what its author wrote. Planning refuses what cannot run; this
//! warns about what runs and quietly does nothing:
//!
//! - a condition or a narrowing over `fields` the producer never declared: with no
//!   declaration `fields` is undefined on the edge, so `fields.amount > 100` is always
//!   false and prunes its target without a word;
//! - a gate with no upstream: it asks for approval at the start, before any work it could
//!   review;
//! - a check that can never be reached (every path into it crosses a condition that is
//!   always false), that nothing feeds, or whose assertion reads an upstream node no edge
//!   brings it or fields that node does not declare.
//!
//! `heddle validate` lists these findings, and `heddle run` prints them first.

use std::collections::HashSet;

use super::declared::NodeContract;
use super::issues::{Issue, IssueKind, issue, list_names, suggest};
use super::model::{CHECK_TYPE, PlanEdge, PlanNode};
use crate::expr::Expr;
use crate::gate::GATE_TYPE;
use crate::graph::EdgeType;
use crate::value::{Map, Value};

/// The review's findings for a plan's nodes and edges (as the planner built them).
pub(super) fn review(nodes: &[PlanNode], edges: &[PlanEdge]) -> Vec<Issue> {
    let mut out = Vec::new();
    let mut never = vec![false; edges.len()];
    for (i, e) in edges.iter().enumerate() {
        never[i] = review_edge(nodes, e, &mut out);
    }
    // Most graphs have no condition that can never hold: nothing is cut off.
    let dead = never
        .contains(&true)
        .then(|| unreachable(nodes, edges, &never));
    for (i, n) in nodes.iter().enumerate() {
        // Only gates and checks are reviewed: a wide graph pays no allocation per node.
        if !matches!(&*n.node_type, GATE_TYPE | CHECK_TYPE) {
            continue;
        }
        let data_in: Vec<&PlanEdge> = n
            .in_edges
            .iter()
            .map(|&e| &edges[e as usize])
            .filter(|e| e.edge_type == EdgeType::Data)
            .collect();
        let cut_off = dead.as_ref().is_some_and(|d| d[i]);
        match &*n.node_type {
            GATE_TYPE if data_in.is_empty() => out.push(issue(
                IssueKind::UnfedGate,
                Some(&n.id),
                None,
                Some("value"),
                "the gate has no upstream: it asks for approval at the start of the run, before any work it could review; connect the work under review to its `value` input".into(),
            )),
            CHECK_TYPE => review_check(nodes, n, &data_in, cut_off, edges, &never, &mut out),
            _ => {}
        }
    }
    out
}

/// The contract `source` declares on `handle`, if any.
fn contract_on<'a>(source: &'a PlanNode, handle: &str) -> Option<&'a NodeContract> {
    source.contract.as_deref().filter(|c| *c.handle == *handle)
}

/// Warns about an edge's condition or narrowing over fields its source does not declare;
/// true when the condition can never hold (it reads nothing but those absent fields and
/// is false without them): the target never runs through this edge.
fn review_edge(nodes: &[PlanNode], e: &PlanEdge, out: &mut Vec<Issue>) -> bool {
    let Some(rule) = e.rule.as_deref() else {
        return false;
    };
    let source = &nodes[e.source as usize];
    let target = &nodes[e.target as usize];
    let contract = contract_on(source, &e.source_handle);
    let warn = |message: String| {
        issue(
            IssueKind::UndeclaredFields,
            Some(&target.id),
            Some(&e.id),
            None,
            message,
        )
    };
    let mut never = false;
    if let Some(when) = &rule.when {
        let reads = when.reads();
        let fields: Vec<&[String]> = reads
            .iter()
            .filter(|p| p.first().is_some_and(|f| f == "fields"))
            .map(|p| &p[1..])
            .collect();
        match contract {
            None if !fields.is_empty() => {
                // Without a declaration `fields` is not bound: a condition that reads
                // nothing else answers the same for every value.
                never = fields.len() == reads.len()
                    && when.test(&Value::object(Map::new())) == Ok(false);
                let shown = shown_paths("fields", &fields);
                let consequence = if never {
                    format!(
                        "so the condition is always false and node {} never runs through this edge",
                        target.id
                    )
                } else {
                    format!("so {shown} is always undefined here")
                };
                out.push(warn(format!(
                    "condition `{}` reads {shown}, but node {} declares no output fields on `{}`: `fields` is undefined on this edge, {consequence}; declare them (`\"output\": {{\"fields\": [...]}}` on node {}) or read `value` instead",
                    when.text(),
                    source.id,
                    e.source_handle,
                    source.id
                )));
            }
            Some(c) => {
                let undeclared: Vec<&[String]> = fields
                    .into_iter()
                    .filter(|p| p.first().is_some_and(|k| !declares(c, k)))
                    .collect();
                if !undeclared.is_empty() {
                    out.push(warn(format!(
                        "condition `{}` reads {}, which node {} does not declare on `{}` (declared: {}){}: nothing promises it, so it is undefined whenever a value leaves it out",
                        when.text(),
                        shown_paths("fields", &undeclared),
                        source.id,
                        e.source_handle,
                        c.contract.summary(),
                        suggest(
                            &undeclared[0][0],
                            c.contract.fields.iter().map(|f| f.key.as_str())
                        ),
                    )));
                }
            }
            None => {}
        }
    }
    if let Some(keys) = &rule.fields
        && contract.is_none()
    {
        out.push(warn(format!(
            "`fields` keeps {}, but node {} declares no output fields on `{}`: nothing promises those keys, and a value that lacks them crosses without them; declare them (`\"output\": {{\"fields\": [...]}}` on node {})",
            list_names(keys.iter().map(|k| &**k)),
            source.id,
            e.source_handle,
            source.id
        )));
    }
    never
}

fn declares(c: &NodeContract, key: &str) -> bool {
    c.contract.fields.iter().any(|f| f.key == key)
}

/// `fields.a`, `fields.b` for the paths below `fields` (`fields` itself for an empty one).
fn shown_paths(root: &str, paths: &[&[String]]) -> String {
    let mut shown: Vec<String> = paths
        .iter()
        .map(|p| {
            std::iter::once(root)
                .chain(p.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect();
    shown.dedup();
    list_names(shown.iter().map(String::as_str))
}

/// Per node: it has data inputs, and every one of them is cut by a condition that can
/// never hold, or comes from a node that is itself unreachable. Nodes are in the plan's
/// topological order, so one pass settles every node after its sources.
fn unreachable(nodes: &[PlanNode], edges: &[PlanEdge], never: &[bool]) -> Vec<bool> {
    let mut dead = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        let mut data = n
            .in_edges
            .iter()
            .map(|&e| (e as usize, &edges[e as usize]))
            .filter(|(_, e)| e.edge_type == EdgeType::Data)
            .peekable();
        if data.peek().is_none() {
            continue;
        }
        dead[i] = data.all(|(ei, e)| never[ei] || dead[e.source as usize]);
    }
    dead
}

/// The edges with a condition that can never hold above an unreachable node `n`: what
/// cuts it off, however far up.
fn cut_above<'a>(
    n: &PlanNode,
    nodes: &[PlanNode],
    edges: &'a [PlanEdge],
    never: &[bool],
) -> Vec<&'a str> {
    let mut cut = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![n];
    while let Some(n) = stack.pop() {
        for &e in &n.in_edges {
            let edge = &edges[e as usize];
            if edge.edge_type != EdgeType::Data || !seen.insert(e) {
                continue;
            }
            if never[e as usize] {
                cut.push(&*edge.id);
            } else {
                stack.push(&nodes[edge.source as usize]);
            }
        }
    }
    cut.sort_unstable();
    cut
}

/// A check's findings: nothing feeds it, it can never be reached, or its assertion reads
/// an upstream no edge brings it or fields that upstream does not declare.
fn review_check(
    nodes: &[PlanNode],
    n: &PlanNode,
    data_in: &[&PlanEdge],
    unreachable: bool,
    edges: &[PlanEdge],
    never: &[bool],
    out: &mut Vec<Issue>,
) {
    let warn = |handle: Option<&str>, message: String| {
        issue(
            IssueKind::UnreachableCheck,
            Some(&n.id),
            None,
            handle,
            message,
        )
    };
    if data_in.is_empty() {
        out.push(warn(
            None,
            "nothing comes into this check: it asserts over an empty `upstream`, once, at the start of the run; connect the nodes it checks (each edge's `targetHandle` named after its source node)".into(),
        ));
    } else if unreachable {
        out.push(warn(
            None,
            format!(
                "this check can never be reached: every path into it crosses a condition that is always false (edge {}), so the run would end without asserting it",
                list_names(cut_above(n, nodes, edges, never).into_iter())
            ),
        ));
    }
    let Some(Ok(expr)) = n
        .properties
        .get("assert")
        .and_then(Value::as_str)
        .map(Expr::compile)
    else {
        // No assertion, or one the check's own declaration check refuses.
        return;
    };
    // By the handle each feeder arrives on: what the check's scope names it by (the
    // feeding node's id as its document wrote it, also inside a graph node).
    let fed: Vec<(&str, &PlanEdge)> = data_in.iter().map(|e| (&*e.target_handle, *e)).collect();
    let mut seen = HashSet::new();
    for path in expr.reads() {
        if path.first().map(String::as_str) != Some("upstream") {
            continue;
        }
        let Some(up) = path.get(1) else { continue };
        let Some(&(_, e)) = fed.iter().find(|(id, _)| *id == up) else {
            if seen.insert(up.clone()) {
                out.push(warn(
                    Some(up),
                    format!(
                        "the assertion `{}` reads `upstream.{up}`, but no edge from node {up} comes into this check (fed by: {}): it is always undefined",
                        expr.text(),
                        list_names(fed.iter().map(|(id, _)| *id)),
                    ),
                ));
            }
            continue;
        };
        if path.get(2).map(String::as_str) != Some("fields") {
            continue;
        }
        let Some(key) = path.get(3) else { continue };
        let source = &nodes[e.source as usize];
        let message = match contract_on(source, &e.source_handle) {
            Some(c) if declares(c, key) => continue,
            Some(c) => format!(
                "which node {up} does not declare on `{}` (declared: {}){}",
                e.source_handle,
                c.contract.summary(),
                suggest(key, c.contract.fields.iter().map(|f| f.key.as_str()))
            ),
            None => format!(
                "but node {up} declares no output fields on `{}`",
                e.source_handle
            ),
        };
        if seen.insert(format!("{up}.fields.{key}")) {
            out.push(issue(
                IssueKind::UndeclaredFields,
                Some(&n.id),
                None,
                Some(up),
                format!(
                    "the assertion `{}` reads `upstream.{up}.fields.{key}`, {message}: nothing promises it, so the assertion sees it undefined whenever the value leaves it out",
                    expr.text()
                ),
            ));
        }
    }
}
