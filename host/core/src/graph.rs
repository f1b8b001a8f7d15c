//! The graph document: the JSON a user writes, in NodeTool's wire shape plus a format
//! marker and version.
//!
//! This module only parses. Everything semantic (dangling edges, unknown types, cycles,
//! correlation) is checked by [`crate::plan`], which reports all problems at once.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::limits::{AccessLevel, NodeLimits, RetryPolicy};
use crate::value::Value;

/// The value of the top-level `format` field.
pub const FORMAT: &str = "heddle.graph";
/// The document version this build reads and writes.
pub const VERSION: u32 = 1;
/// The handle every control edge targets.
pub const CONTROL_HANDLE: &str = "__control__";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
/// A graph document: nodes and edges in NodeTool's wire shape, with a format marker and
/// version. What a user writes and a durable run stores byte for byte.
pub struct GraphDoc {
    /// `"heddle.graph"`. Optional on input so bare NodeTool graphs load; when present it
    /// must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The document's version of the format (this build reads [`VERSION`]).
    pub version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// A name to show (a run created through the API is listed under it).
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// What the graph does, for a person.
    pub description: Option<String>,
    /// Every node, in the document's order.
    pub nodes: Vec<NodeDoc>,
    #[serde(default)]
    /// Every edge, data and control.
    pub edges: Vec<EdgeDoc>,
    /// Set when the document was read as a NodeTool workflow: what its NodeTool types
    /// became ([`crate::nodetool`]). Not part of the document: the same bytes read again
    /// give the same translation.
    #[serde(skip)]
    pub imported: Option<crate::nodetool::Imported>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
/// One node of a document.
pub struct NodeDoc {
    /// Its id, unique in the document (edges name it).
    pub id: String,
    #[serde(rename = "type")]
    /// Its node type (`heddle.constant`, `std.text.case`, …), resolved against the registry.
    pub node_type: String,
    /// Optional display name; input and output nodes also use it as their external name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Property values. NodeTool's wire format calls this `data`; either name is accepted
    /// (a node carrying both is refused as a duplicate field).
    #[serde(default, alias = "data", skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Properties whose values the workflow author computes per run (kept for tools; the
    /// planner treats them like `properties`).
    pub dynamic_properties: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The editor's per-node state; `bypassed` is the one the planner reads.
    pub ui_properties: Option<UiProperties>,
    /// Per-node limits and capability narrowing set by the workflow author. They can only
    /// tighten what the operator's configuration allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<NodeLimits>,
    /// Wall-clock limit per invocation in ms; the same setting as `limits.timeout_ms`
    /// (read together by [`NodeDoc::resolved_limits`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::ranged::opt_int::<_, u64, 1, 604_800_000>"
    )]
    pub timeout_ms: Option<u64>,
    /// How far the node may touch its granted files; the same setting as `limits.files`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessLevel>,
    /// The node's own retry policy; the same setting as `limits.retry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Fields the node promises on one output (see [`crate::contract`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<crate::contract::OutputContract>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
/// Editor state of a node (NodeTool's `ui_properties`).
pub struct UiProperties {
    #[serde(default)]
    /// Bypassed nodes are rewritten out of the graph before planning: their inputs flow
    /// straight to their outputs' targets.
    pub bypassed: bool,
    #[serde(flatten)]
    /// Everything else the editor keeps (positions, sizes), carried through unread.
    pub rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
/// What an edge carries.
pub enum EdgeType {
    #[default]
    /// Values from an output handle to an input handle.
    Data,
    /// A control event into a controlled node's `__control__` handle.
    Control,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
/// One edge of a document: from `source`'s output handle to `target`'s input handle.
pub struct EdgeDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Its id (given one by position when absent).
    pub id: Option<String>,
    /// The node it leaves.
    pub source: String,
    #[serde(rename = "sourceHandle")]
    /// The output handle it leaves from.
    pub source_handle: String,
    /// The node it enters.
    pub target: String,
    #[serde(rename = "targetHandle")]
    /// The input handle it enters (`__control__` for a control edge).
    pub target_handle: String,
    #[serde(default)]
    /// Data (the default) or control.
    pub edge_type: EdgeType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The editor's state of the edge, carried through unread.
    pub ui_properties: Option<serde_json::Value>,
    /// A JSONata condition per value crossing the edge (see [`crate::expr`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Keys of an object value the edge carries; the rest are dropped (never renamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
}

impl EdgeDoc {
    /// The edge's id, or the one NodeTool derives when absent:
    /// `{source}:{sourceHandle}->{target}:{targetHandle}`.
    pub fn effective_id(&self) -> String {
        match &self.id {
            Some(id) => id.clone(),
            None => format!(
                "{}:{}->{}:{}",
                self.source, self.source_handle, self.target, self.target_handle
            ),
        }
    }
}

/// Why a document could not be read. Semantic problems are [`crate::plan::ValidationError`].
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("cannot read graph file {path}: {source}")]
    /// The file could not be read.
    Io {
        /// The file.
        path: String,
        #[source]
        /// Why.
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: invalid graph JSON: {message}")]
    /// The text is not valid graph JSON.
    Parse {
        /// The file (or the name a document in memory was given).
        path: String,
        /// Where the problem is: its line (from 1).
        line: usize,
        /// Its column (from 1).
        column: usize,
        /// What is wrong.
        message: String,
    },
    #[error("{path}: unsupported graph format `{found}` (expected `{FORMAT}`)")]
    /// The document names another format than `heddle.graph`.
    Format {
        /// The file.
        path: String,
        /// The format it names.
        found: String,
    },
    #[error("{path}: graph version {found} is not supported (this build reads version {VERSION})")]
    /// The document's version is newer than this build reads.
    Version {
        /// The file.
        path: String,
        /// Its version.
        found: u32,
    },
}

impl GraphDoc {
    /// Parses a document; `origin` names it in errors (a path, or `<stdin>`).
    ///
    /// A saved NodeTool workflow (the graph inside an envelope with its `name`,
    /// `description` and NodeTool's bookkeeping) is read as its graph, keeping the name
    /// and description, and NodeTool's structural node types are translated
    /// ([`crate::nodetool`]).
    pub fn parse(text: &str, origin: &str) -> Result<Self, DocError> {
        let envelope = crate::nodetool::is_envelope(text);
        let mut doc = if envelope {
            let w: crate::nodetool::Envelope = from_json(text, origin)?;
            GraphDoc {
                name: w.name.or(w.graph.name),
                description: w.description.or(w.graph.description),
                ..w.graph
            }
        } else {
            from_json(text, origin)?
        };
        if let Some(f) = &doc.format
            && f != FORMAT
        {
            return Err(DocError::Format {
                path: origin.to_string(),
                found: f.clone(),
            });
        }
        if let Some(v) = doc.version
            && v != VERSION
        {
            return Err(DocError::Version {
                path: origin.to_string(),
                found: v,
            });
        }
        crate::nodetool::import(&mut doc, envelope);
        Ok(doc)
    }

    /// Reads and parses the graph file at `path`; an unreadable file or malformed JSON is an
    /// error naming the file (and line and column).
    pub fn load(path: &Path) -> Result<Self, DocError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| DocError::Io {
            path: origin.clone(),
            source,
        })?;
        Self::parse(&text, &origin)
    }

    /// The document as indented JSON (what a durable run created from a built graph stores).
    pub fn to_json_pretty(&self) -> String {
        // Serializing a tree of plain data cannot fail.
        serde_json::to_string_pretty(self).expect("graph documents always serialize")
    }
}

/// `text` as a `T`, a malformed document an error naming `origin`, line and column.
fn from_json<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> Result<T, DocError> {
    serde_json::from_str(text).map_err(|e| {
        // serde_json reports "... at line L column C"; keep the message without it,
        // since line and column are shown in front.
        let full = e.to_string();
        let message = match full.rfind(" at line ") {
            Some(i) => full[..i].to_string(),
            None => full,
        };
        let (line, column) = token_position(text, &e);
        DocError::Parse {
            path: origin.to_string(),
            line,
            column,
            message,
        }
    })
}

/// Where a parse error's offending token starts (1-based line and byte column).
///
/// serde_json reports syntax errors at the character it could not take, but a shape
/// error found while looking at a value (`invalid type: map, expected a string`) at the
/// last character it consumed: the space, colon, comma or bracket before the value. Such
/// a position moves to the value itself.
fn token_position(text: &str, e: &serde_json::Error) -> (usize, usize) {
    let (line, column) = (e.line(), e.column());
    if e.classify() != serde_json::error::Category::Data || line == 0 {
        return (line, column);
    }
    let Some(start) = text
        .split_inclusive('\n')
        .take(line - 1)
        .map(str::len)
        .try_fold(0usize, |acc, n| Some(acc + n))
    else {
        return (line, column);
    };
    let consumed = (start + column).min(text.len());
    let before = text[..consumed].chars().next_back();
    if column > 0 && !matches!(before, Some(' ' | '\t' | '\r' | '\n' | ':' | ',' | '[')) {
        // The error came after the value was read: the position is inside it.
        return (line, column);
    }
    let Some(skip) = text[consumed..].find(|c: char| !c.is_whitespace()) else {
        return (line, column);
    };
    let at = consumed + skip;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    (text[..at].matches('\n').count() + 1, at - line_start + 1)
}

impl NodeDoc {
    /// The property map a node is invoked with: `properties` merged with
    /// `dynamic_properties` (edge values are added later and win over both).
    pub fn merged_properties(&self) -> BTreeMap<String, Value> {
        let mut out = self.properties.clone();
        for (k, v) in &self.dynamic_properties {
            out.insert(k.clone(), v.clone());
        }
        out
    }

    /// The node's one set of limits, both spellings folded together, with the
    /// problems found doing so ([`crate::limits::resolve`]).
    pub fn resolved_limits(&self) -> (Option<NodeLimits>, Vec<String>) {
        let top = crate::limits::TopLevel {
            timeout_ms: self.timeout_ms,
            access: self.access,
            retry: self.retry.as_ref(),
        };
        crate::limits::resolve(top, self.limits.as_ref())
    }

    /// Whether the editor bypassed the node (it is rewritten out before planning).
    pub fn is_bypassed(&self) -> bool {
        self.ui_properties.as_ref().is_some_and(|u| u.bypassed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_error_names_line_and_column() {
        let err =
            GraphDoc::parse("{\n  \"nodes\": [\n    {\"id\": }\n  ]\n}", "g.json").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("g.json:3:"), "{msg}");
    }

    #[test]
    fn shape_errors_point_at_the_offending_value() {
        // `name` must be a string; the map starts at column 25 of line 3.
        let text = "{\n  \"nodes\": [\n    {\"id\": \"a\", \"name\": {\"x\": 1}}\n  ]\n}";
        let err = GraphDoc::parse(text, "g.json").unwrap_err();
        let DocError::Parse { line, column, .. } = err else {
            panic!("{err}")
        };
        assert_eq!((line, column), (3, 25), "{err}");
        // The same across a line break and without a space.
        let text = "{\"nodes\":[{\"id\":\n\n  [1]}]}";
        let DocError::Parse { line, column, .. } = GraphDoc::parse(text, "g.json").unwrap_err()
        else {
            panic!()
        };
        assert_eq!((line, column), (3, 3));
        let text = "{\"nodes\":[{\"id\":[1]}]}";
        let DocError::Parse { line, column, .. } = GraphDoc::parse(text, "g.json").unwrap_err()
        else {
            panic!()
        };
        assert_eq!((line, column), (1, 17));
    }

    #[test]
    fn accepts_nodetool_shape() {
        let doc = GraphDoc::parse(
            r#"{"nodes":[{"id":"a","type":"heddle.constant","data":{"value":1},"ui_properties":{"bypassed":false,"position":{"x":1}}}],
                "edges":[{"source":"a","sourceHandle":"output","target":"b","targetHandle":"x"}]}"#,
            "g.json",
        )
        .unwrap();
        assert_eq!(doc.nodes[0].properties["value"], Value::Int(1));
        assert_eq!(doc.edges[0].effective_id(), "a:output->b:x");
        assert_eq!(doc.edges[0].edge_type, EdgeType::Data);
    }

    #[test]
    fn wrong_format_is_refused() {
        let err = GraphDoc::parse(r#"{"format":"other","nodes":[]}"#, "g.json").unwrap_err();
        assert!(matches!(err, DocError::Format { .. }));
    }
}
