//! NodeTool's own workflow files, read as Heddle graphs.
//!
//! NodeTool saves a workflow as an envelope around the graph (`{"id", "name",
//! "description", "graph": {"nodes", "edges"}, "input_schema", …}`), and its graphs use
//! its own structural node types for what Heddle's built-ins do: inputs
//! (`nodetool.input.StringInput`, …), outputs (`nodetool.output.*`), constants
//! (`nodetool.constant.*`), and the editor's `Comment` and `Preview`. The import maps
//! those onto `heddle.input`, `heddle.output` and `heddle.constant` (renaming NodeTool's
//! `output` handle to Heddle's `value`), drops comments and turns a preview into an
//! output, and says what it did for each node: planning reports it as a warning, so
//! `validate` and the run report show what a NodeTool graph became. Every other NodeTool
//! type stays as written, and planning names the NodeTool package it comes from.
//!
//! The mapping runs on every parse of the same bytes, so a durable run that stores the
//! file as written plans to the same graph when it is resumed.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::graph::{GraphDoc, NodeDoc};
use crate::plan::model::{INPUT_TYPE, OUTPUT_TYPE};
use crate::types::PortType;
use crate::value::Value;

/// The prefix of every type NodeTool's own packages define.
pub const PREFIX: &str = "nodetool.";
const INPUT_PREFIX: &str = "nodetool.input.";
const OUTPUT_PREFIX: &str = "nodetool.output.";
const CONSTANT_PREFIX: &str = "nodetool.constant.";
const COMMENT: &str = "nodetool.workflows.base_node.Comment";
const PREVIEW: &str = "nodetool.workflows.base_node.Preview";
/// The handle NodeTool's inputs and constants emit on (Heddle's emit on `value`).
const NODETOOL_OUT: &str = "output";

/// What reading a document as a NodeTool workflow changed, node by node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Imported {
    /// The document was NodeTool's saved envelope (`{"graph": {…}, "name", …}`).
    pub envelope: bool,
    /// One line per node whose type was translated or dropped: (node id, what happened).
    pub notes: Vec<(String, String)>,
}

/// The saved envelope: the graph and the two fields Heddle keeps; every other member
/// (`id`, `access`, `tags`, `input_schema`, `settings`, …) is NodeTool's bookkeeping.
#[derive(Deserialize)]
pub(crate) struct Envelope {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub graph: GraphDoc,
}

/// Whether `text` is a saved NodeTool workflow: an object with a `graph` member and no
/// `nodes` of its own. Malformed text is not (the graph parse reports where it breaks).
pub(crate) fn is_envelope(text: &str) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        graph: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        nodes: Option<serde::de::IgnoredAny>,
    }
    // A Heddle graph never has a `graph` member: most documents skip the second parse.
    text.contains("\"graph\"")
        && serde_json::from_str::<Probe>(text).is_ok_and(|p| p.graph.is_some() && p.nodes.is_none())
}

/// The Heddle port type a NodeTool input class stands for, from its name:
/// `nodetool.input.IntegerInput` holds an int. Asset inputs (images, audio, documents,
/// folders, models) carry NodeTool's reference objects; a class this table does not
/// know is `any`.
pub fn input_port_type(class: &str) -> PortType {
    let base = class.strip_suffix("Input").unwrap_or(class);
    match base {
        "String" | "Text" | "FilePath" | "FolderPath" | "Path" => PortType::Str,
        "Integer" | "Int" => PortType::Int,
        "Float" => PortType::Float,
        "Boolean" | "Bool" => PortType::Bool,
        "StringList" => PortType::list_of(PortType::Str),
        "Chat" | "Messages" => PortType::list_of(PortType::Any),
        "List" => PortType::list_of(PortType::Any),
        "Dict" | "Object" | "Json" => PortType::Object,
        "Image" | "Audio" | "Video" | "Document" | "Dataframe" | "Folder" | "Asset"
        | "ImageFolder" | "AudioFolder" | "VideoFolder" | "TextFolder" | "Color"
        | "LanguageModel" | "ImageModel" | "Model" => PortType::Object,
        _ => PortType::Any,
    }
}

/// Whether the document uses NodeTool's types (so unknown types are explained as
/// NodeTool's), or came in its envelope.
pub fn is_nodetool(doc: &GraphDoc) -> bool {
    doc.imported.is_some()
}

/// The NodeTool package (namespace) a type comes from: its name up to the class,
/// `nodetool.text` for `nodetool.text.Concat`, `huggingface.text_to_image` for a
/// Hugging Face node.
pub fn package_of(node_type: &str) -> &str {
    node_type.rsplit_once('.').map_or(node_type, |(p, _)| p)
}

/// Maps NodeTool's structural types onto Heddle's built-ins in place (see the module
/// doc), recording what it did in `doc.imported`. A document with no NodeTool type and
/// no envelope is left as it is, `imported` unset.
pub(crate) fn import(doc: &mut GraphDoc, envelope: bool) {
    if !envelope && !doc.nodes.iter().any(|n| n.node_type.starts_with(PREFIX)) {
        return;
    }
    let mut notes = Vec::new();
    // Nodes whose `output` handle is now `value`, and nodes dropped.
    let mut renamed: HashSet<String> = HashSet::new();
    let mut dropped: HashSet<String> = HashSet::new();
    for n in &mut doc.nodes {
        let from = n.node_type.clone();
        let note = if let Some(class) = from.strip_prefix(INPUT_PREFIX) {
            let ty = input_port_type(class);
            keep_only(n, &["name", "value"]);
            n.properties
                .insert("type".into(), Value::Str(ty.to_string().into()));
            set_type(n, INPUT_TYPE);
            renamed.insert(n.id.clone());
            format!("NodeTool input `{from}` read as `{INPUT_TYPE}` of type {ty}")
        } else if from.starts_with(OUTPUT_PREFIX) {
            keep_only(n, &["name"]);
            set_type(n, OUTPUT_TYPE);
            format!("NodeTool output `{from}` read as `{OUTPUT_TYPE}`")
        } else if from.starts_with(CONSTANT_PREFIX) {
            keep_only(n, &["value"]);
            set_type(n, "heddle.constant");
            renamed.insert(n.id.clone());
            format!("NodeTool constant `{from}` read as `heddle.constant`")
        } else if from == COMMENT {
            dropped.insert(n.id.clone());
            "NodeTool comment left out (it holds text for the editor, nothing to run)".to_string()
        } else if from == PREVIEW {
            keep_only(n, &["name"]);
            set_type(n, OUTPUT_TYPE);
            let name = n
                .name
                .clone()
                .or_else(|| {
                    n.properties
                        .get("name")
                        .and_then(|v| v.as_str())
                        .map(Into::into)
                })
                .unwrap_or_else(|| n.id.clone());
            format!(
                "NodeTool preview read as `{OUTPUT_TYPE}`: what it shows is the run's output `{name}`"
            )
        } else {
            continue;
        };
        notes.push((n.id.clone(), note));
    }
    doc.nodes.retain(|n| !dropped.contains(&n.id));
    doc.edges
        .retain(|e| !dropped.contains(&e.source) && !dropped.contains(&e.target));
    for e in &mut doc.edges {
        if e.source_handle == NODETOOL_OUT && renamed.contains(&e.source) {
            e.source_handle = "value".into();
        }
    }
    doc.imported = Some(Imported { envelope, notes });
}

fn set_type(n: &mut NodeDoc, to: &str) {
    n.node_type = to.to_string();
}

/// Keeps only the properties a Heddle built-in declares (NodeTool's inputs also carry
/// `label`, `description`, `min`, `max`, …, which mean nothing to a run), and an empty
/// `name` counts as none.
fn keep_only(n: &mut NodeDoc, keep: &[&str]) {
    let merged = n.merged_properties();
    n.dynamic_properties.clear();
    n.properties = merged
        .into_iter()
        .filter(|(k, v)| {
            keep.contains(&k.as_str()) && !(k == "name" && v.as_str().is_some_and(str::is_empty))
        })
        .collect::<BTreeMap<_, _>>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_say_the_type() {
        assert_eq!(input_port_type("IntegerInput"), PortType::Int);
        assert_eq!(input_port_type("StringInput"), PortType::Str);
        assert_eq!(input_port_type("ImageInput"), PortType::Object);
        assert_eq!(input_port_type("SomethingNewInput"), PortType::Any);
        assert_eq!(package_of("nodetool.text.Concat"), "nodetool.text");
    }

    #[test]
    fn an_envelope_is_told_from_a_graph() {
        assert!(is_envelope(r#"{"id": "x", "graph": {"nodes": []}}"#));
        assert!(!is_envelope(r#"{"nodes": [], "graph": 1}"#));
        assert!(!is_envelope(r#"{"nodes": []}"#));
        assert!(!is_envelope("{"));
    }
}
