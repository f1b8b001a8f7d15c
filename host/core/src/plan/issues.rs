//! What planning reports: one [`Issue`] per problem, all of them together in a
//! [`ValidationError`], and the wording helpers ("did you mean", port lists) the checks share.

use serde::{Deserialize, Serialize};

/// One problem found while planning. Carries the ids needed to find it in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issue {
    /// What sort of problem, stable for programs (an editor's highlighting, a test).
    pub kind: IssueKind,
    /// The node at fault, by id, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The edge at fault, by id, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<String>,
    /// The port or property at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// What is wrong and how to fix it, in words for the graph's author.
    pub message: String,
}

/// The sorts of problem planning finds; an error unless its doc says warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    /// Two nodes share an id.
    DuplicateNodeId,
    /// Two edges share an id.
    DuplicateEdgeId,
    /// An edge names a source or target node that does not exist.
    DanglingEdge,
    /// No provider declares the node's type (the message suggests close names).
    UnknownNodeType,
    /// An edge targets an input the node's type does not declare.
    UnknownInputHandle,
    /// An edge leaves from an output the node's type does not declare.
    UnknownOutputHandle,
    /// A property the node's type declares neither as property nor as input.
    UnknownProperty,
    /// An edge's or a property's value type does not fit the port's.
    TypeMismatch,
    /// Data edges form a cycle: values would wait on themselves.
    Cycle,
    /// An edge from a node to itself.
    SelfLoop,
    /// A control edge that does not target `__control__` of a controlled node.
    ControlHandle,
    /// Control edges form a cycle: each node would wait for the other to finish.
    ControlCycle,
    /// More than one edge feeds an input that is neither a list nor a join of condition
    /// branches.
    MultipleEdgesIntoInput,
    /// A required input that no edge, property or default feeds.
    MissingRequiredInput,
    /// Inputs arrive from fan-outs whose items cannot be paired (no common scope), and
    /// the node is not a join.
    IncomparableScopes,
    /// Values of an input cannot be paired with the invocation's items (a sticky input
    /// that repeats per key); as a warning, one whose latest value is used.
    Correlation,
    /// The node's type refused a property value ([`crate::DeclLookup::check_node`]).
    InvalidProperty,
    /// A node's `timeout_ms`, `access`, `retry` or `limits` cannot be honoured as written.
    InvalidLimits,
    /// An edge's `when` or `fields` cannot be applied.
    InvalidEdgeRule,
    /// A node's `output` field declaration cannot be kept.
    InvalidOutputContract,
    /// A graph node's document cannot be used: its reference, the file (unreadable,
    /// malformed), or its ports (none out, two of one name).
    InvalidGraphNode,
    /// A graph node's document is not pinned, or not the one its `sha256` pins.
    GraphDigest,
    /// A graph node includes, directly or through others, the graph it is in.
    GraphCycle,
    /// Graph nodes nest deeper than the depth cap.
    GraphDepth,
    /// Warning: a NodeTool node type read as a Heddle one (or left out).
    Imported,
    /// Warning: an edge was dropped while rewriting around a bypassed node.
    BypassDroppedEdge,
    /// Warning (review): a condition, narrowing or assertion reads output fields the
    /// producer does not declare.
    UndeclaredFields,
    /// Warning (review): a gate nothing feeds, which asks before any work is done.
    UnfedGate,
    /// Warning (review): a check that can never be reached, that nothing feeds, or that
    /// reads an upstream node no edge brings it.
    UnreachableCheck,
}

/// Ids and handles are the user's text, of any length: they are shown clipped (the
/// fields keep them whole for programs).
impl std::fmt::Display for Issue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::{ECHO_MAX_CHARS, MESSAGE_MAX_CHARS, clip};
        let mut wrote = false;
        if let Some(n) = &self.node {
            write!(f, "node {}", clip(n, ECHO_MAX_CHARS))?;
            wrote = true;
        }
        if let Some(h) = &self.handle {
            let sep = if wrote { ", " } else { "" };
            write!(f, "{sep}handle `{}`", clip(h, ECHO_MAX_CHARS))?;
            wrote = true;
        }
        if let Some(e) = &self.edge {
            let sep = if wrote { ", " } else { "" };
            write!(f, "{sep}edge {}", clip(e, ECHO_MAX_CHARS))?;
            wrote = true;
        }
        if wrote {
            f.write_str(": ")?;
        }
        f.write_str(&clip(&self.message, MESSAGE_MAX_CHARS))
    }
}

/// Every problem found while planning, reported together; no node starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub struct ValidationError {
    /// Every error found (warnings travel with the plan instead, [`crate::plan::Plan::warnings`]).
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

pub(crate) fn issue(
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

pub(crate) fn list_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<String> = names.map(|n| format!("`{n}`")).collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

/// `" (did you mean `x`?)"` for the closest candidate within a small edit distance.
pub(crate) fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let limit = (name.chars().count() / 3).max(2);
    let lower = name.to_lowercase();
    candidates
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}

/// The hint for an unknown node type: the closest name (as [`suggest`]); else the types
/// whose names begin with what was written (`files.read` → `files.read_text`), else the
/// types of the same namespace (`files.red` → every `files.…`), a few of them.
pub(super) fn suggest_type(name: &str, names: &[String]) -> String {
    const SHOWN: usize = 4;
    let close = suggest(name, names.iter().map(String::as_str));
    if !close.is_empty() {
        return close;
    }
    let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let namespace = name.rsplit_once('.').map(|(ns, _)| format!("{ns}."));
    let begins: Vec<&str> = sorted
        .iter()
        .copied()
        .filter(|n| n.starts_with(name))
        .collect();
    let near = if begins.is_empty() {
        namespace
            .as_deref()
            .map(|ns| {
                sorted
                    .iter()
                    .copied()
                    .filter(|n| n.starts_with(ns))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        begins
    };
    match near.as_slice() {
        [] => String::new(),
        [one] => format!(" (did you mean `{one}`?)"),
        many => {
            let more = many.len().saturating_sub(SHOWN);
            let shown = list_names(many.iter().take(SHOWN).copied());
            if more > 0 {
                format!(" (did you mean one of {shown}, or {more} more?)")
            } else {
                format!(" (did you mean one of {shown}?)")
            }
        }
    }
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
        let names: Vec<String> = [
            "files.read_text",
            "files.write_text",
            "std.text.case",
            "std.text.split",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            suggest_type("std.text.cas", &names),
            " (did you mean `std.text.case`?)"
        );
        assert_eq!(
            suggest_type("files.read", &names),
            " (did you mean `files.read_text`?)"
        );
        assert_eq!(
            suggest_type("files.red", &names),
            " (did you mean one of `files.read_text`, `files.write_text`?)"
        );
        assert_eq!(suggest_type("nothing.like.it", &names), "");
    }
}
