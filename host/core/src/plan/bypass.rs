//! Bypass rewrite: a node flagged `ui_properties.bypassed` is removed before
//! the run and its consumers are wired to what fed it, as if the node were a wire.
//!
//! Rules, in NodeTool's terms so graphs behave the same in both systems:
//! - each outgoing data edge is re-attached to a type-compatible upstream source feeding
//!   the bypassed node, preferring the incoming edge whose `targetHandle` equals the
//!   outgoing `sourceHandle`; unknown types count as compatible;
//! - chains of bypassed nodes collapse (each node is rewritten in turn, so an edge
//!   re-attached to a bypassed node is re-attached again when that node is rewritten);
//! - outgoing edges with no compatible source, and every control edge touching the node,
//!   are dropped, each with a warning so the user sees what the bypass cost;
//! - the rewritten edge keeps the outgoing edge's id (and its position in the edge list).

use std::borrow::Cow;

use super::issues::{Issue, IssueKind};
use crate::graph::EdgeType;

/// An edge during planning, before node indices exist. It borrows its names from the
/// document: it lives only while the document is planned, and owned copies were five
/// allocations per edge at the planning peak (with the document and the plan alive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkEdge<'a> {
    /// The effective id (`id`, or NodeTool's derived `source:handle->target:handle`,
    /// the only one made here).
    pub id: Cow<'a, str>,
    /// The node it leaves.
    pub source: &'a str,
    /// The output handle it leaves from.
    pub source_handle: &'a str,
    /// The node it enters.
    pub target: &'a str,
    /// The input handle it enters.
    pub target_handle: &'a str,
    /// Data or control.
    pub edge_type: EdgeType,
}

/// Rewrites `edges` around every node in `bypassed` (processed in the given order).
///
/// `compatible(source, source_handle, target, target_handle)` decides whether a value
/// from the upstream output may flow into the downstream input; callers answer `true`
/// when a type is unknown. Returns the surviving edges, in their original order, and a
/// warning per dropped edge.
pub fn rewrite<'a>(
    edges: Vec<WorkEdge<'a>>,
    bypassed: &[&str],
    compatible: &dyn Fn(&str, &str, &str, &str) -> bool,
) -> (Vec<WorkEdge<'a>>, Vec<Issue>) {
    let mut slots: Vec<Option<WorkEdge<'a>>> = edges.into_iter().map(Some).collect();
    let mut warnings = Vec::new();
    for &b in bypassed {
        // Upstream candidates: data edges into `b` from some other node, in document order.
        let incoming: Vec<WorkEdge<'a>> = slots
            .iter()
            .flatten()
            .filter(|e| e.edge_type == EdgeType::Data && e.target == b && e.source != b)
            .cloned()
            .collect();
        for slot in slots.iter_mut() {
            let Some(e) = slot.as_ref() else { continue };
            if e.source != b && e.target != b {
                continue;
            }
            let is_outgoing_data = e.edge_type == EdgeType::Data && e.source == b && e.target != b;
            if !is_outgoing_data {
                if e.edge_type == EdgeType::Control {
                    warnings.push(dropped(
                        e,
                        format!("control edge dropped because node {b} is bypassed"),
                    ));
                }
                // Incoming data edges are absorbed into the rewritten outgoing ones; a
                // self-loop on a bypassed node has nothing to attach to.
                *slot = None;
                continue;
            }
            let fits =
                |i: &&WorkEdge| compatible(i.source, i.source_handle, e.target, e.target_handle);
            let chosen = incoming
                .iter()
                .filter(|i| i.target_handle == e.source_handle)
                .find(fits)
                .or_else(|| incoming.iter().find(fits));
            match chosen {
                Some(up) => {
                    let mut re = e.clone();
                    re.source = up.source;
                    re.source_handle = up.source_handle;
                    *slot = Some(re);
                }
                None => {
                    let why = if incoming.is_empty() {
                        format!("nothing feeds bypassed node {b}")
                    } else {
                        format!(
                            "no input of bypassed node {b} carries a type that `{}.{}` accepts",
                            e.target, e.target_handle
                        )
                    };
                    warnings.push(dropped(e, format!("edge dropped: {why}")));
                    *slot = None;
                }
            }
        }
    }
    (slots.into_iter().flatten().collect(), warnings)
}

fn dropped(e: &WorkEdge, message: String) -> Issue {
    Issue {
        kind: IssueKind::BypassDroppedEdge,
        node: Some(e.target.to_string()),
        edge: Some(e.id.to_string()),
        handle: Some(e.target_handle.to_string()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge<'a>(id: &'a str, s: &'a str, sh: &'a str, t: &'a str, th: &'a str) -> WorkEdge<'a> {
        WorkEdge {
            id: id.into(),
            source: s,
            source_handle: sh,
            target: t,
            target_handle: th,
            edge_type: EdgeType::Data,
        }
    }

    #[test]
    fn prefers_matching_handle_and_keeps_outgoing_id() {
        let edges = vec![
            edge("e1", "a", "out", "b", "x"),
            edge("e2", "c", "out", "b", "y"),
            edge("e3", "b", "y", "d", "in"),
        ];
        let (out, warn) = rewrite(edges, &["b"], &|_, _, _, _| true);
        assert!(warn.is_empty());
        assert_eq!(out, vec![edge("e3", "c", "out", "d", "in")]);
    }

    #[test]
    fn incompatible_edges_are_dropped_with_a_warning() {
        let edges = vec![
            edge("e1", "a", "out", "b", "x"),
            edge("e2", "b", "x", "d", "in"),
        ];
        let (out, warn) = rewrite(edges, &["b"], &|_, _, _, _| false);
        assert!(out.is_empty());
        assert_eq!(warn.len(), 1);
        assert_eq!(warn[0].edge.as_deref(), Some("e2"));
    }
}
