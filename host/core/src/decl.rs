//! Node declarations: what an executor says about the node types it implements.
//!
//! Ports, types, defaults, modes and retry safety come from here and only from here;
//! a graph file cannot change them (a saved `retry_safe: true` means nothing).

use serde::{Deserialize, Serialize};

use crate::types::PortType;
use crate::value::Value;

/// Everything a node type says about itself: the planner types edges and properties
/// against it, the kernel picks the actor's mode and retry rules from it, and `heddle
/// nodes` lists it. Providers build one per type; nothing in a graph overrides it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeDecl {
    /// Fully-qualified type name, e.g. `heddle.constant` or `std.text.concat`.
    pub type_name: String,
    /// A short human name for listings and the viewer's palette.
    #[serde(default)]
    pub title: String,
    /// What the node does, for `heddle nodes` and editors.
    #[serde(default)]
    pub description: String,
    /// The input ports edges may target, with their types and defaults.
    #[serde(default)]
    pub inputs: Vec<PortDecl>,
    /// The output ports edges may leave from, with how each one's lineage relates to the
    /// invocation's.
    #[serde(default)]
    pub outputs: Vec<OutputDecl>,
    /// Configuration that is not an input port (e.g. the code of a code node). Kept as a
    /// list of ports so it is typed and documented the same way.
    #[serde(default)]
    pub properties: Vec<PortDecl>,
    /// True only when re-running an invocation with the same inputs is harmless.
    #[serde(default)]
    pub retry_safe: bool,
    /// How the actor feeds the node its inputs and takes its outputs.
    #[serde(default)]
    pub mode: NodeMode,
    /// How many invocations of a buffered node, at different lineage keys (the items of
    /// a fan-out), may run at the same time; 0 and 1 mean one at a time, in the order
    /// they became ready. More says the node's invocations are independent: none needs
    /// another to have finished, and their effects may land in any order. A durable
    /// run writes the starts of invocations that run together in one synced commit.
    #[serde(default, skip_serializing_if = "one_at_a_time")]
    pub concurrency: u32,
    /// For a buffered node: take the longest common prefix of input scopes as the
    /// invocation scope instead of rejecting incomparable scopes (zip/cross nodes).
    #[serde(default)]
    pub is_join: bool,
    /// The node takes inputs named by the workflow author (code nodes: each input becomes
    /// a variable). An input handle not listed in `inputs` is then accepted with type
    /// `any`, and a property listed in neither `inputs` nor `properties` is taken as the
    /// value of such an input instead of being reported as unknown.
    #[serde(default)]
    pub dynamic_inputs: bool,
    /// Capabilities the implementation wants; the operator decides what it gets.
    #[serde(default)]
    pub capabilities: Vec<CapabilityRequest>,
    /// Where the declaration came from, for listings, error messages and a durable
    /// run's record of which packages it used.
    #[serde(default)]
    pub origin: Origin,
}

/// Where a node type's declaration came from. Written as text (`builtin`,
/// `package:std@0.1.0`, `code`) wherever a declaration or a durable run's plan is
/// stored or shown; that text is parsed here only, so nothing else matches on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A native node of the kernel.
    Builtin,
    /// A node type of a WASM package; its digest is pinned by the lockfile, and a durable
    /// run records it by `name`.
    Package {
        /// The package's name (`std`), what a graph's type prefix and the lockfile use.
        name: String,
        /// Its version as the package declares it; the digest, not this, pins the bytes.
        version: String,
    },
    /// A code node (Python, JavaScript, Bash, shell): the language is the type's suffix
    /// (`code.python`), which the stored text never repeated.
    Code,
    /// Any other provider (an embedder's executor, a test's), by the name it gave.
    Other(String),
    /// The declaration does not say (written as empty text).
    #[default]
    Unnamed,
}

impl Origin {
    /// The package a declaration came from, if a package's.
    pub fn package(&self) -> Option<&str> {
        match self {
            Origin::Package { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Whether what a node of this origin spent is a question (its usage `reported`,
    /// `partial` or `unknown`) even when it reported nothing. A native built-in cannot
    /// spend. A package node is treated alike: its sandbox reaches only the destinations
    /// the operator granted (`heddle-wasm`'s grants), and a package that calls a paid
    /// service says what it cost with `report-cost` (then its usage shows). A code node
    /// may spend unseen (it runs any program, and its sandbox may be given a network),
    /// and so may any other provider's.
    pub fn may_spend(&self) -> bool {
        match self {
            Origin::Builtin | Origin::Package { .. } => false,
            Origin::Code | Origin::Other(_) | Origin::Unnamed => true,
        }
    }

    /// The origin the text names (the inverse of [`Origin`]'s `Display`).
    pub fn parse(text: &str) -> Origin {
        match text {
            "" => Origin::Unnamed,
            "builtin" => Origin::Builtin,
            "code" => Origin::Code,
            _ => match text
                .strip_prefix("package:")
                .and_then(|p| p.split_once('@'))
            {
                Some((name, version)) => Origin::Package {
                    name: name.to_string(),
                    version: version.to_string(),
                },
                None => Origin::Other(text.to_string()),
            },
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Builtin => f.write_str("builtin"),
            Origin::Package { name, version } => write!(f, "package:{name}@{version}"),
            Origin::Code => f.write_str("code"),
            Origin::Other(s) => f.write_str(s),
            Origin::Unnamed => Ok(()),
        }
    }
}

impl From<&str> for Origin {
    fn from(text: &str) -> Origin {
        Origin::parse(text)
    }
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Origin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Origin, D::Error> {
        Ok(Origin::parse(&String::deserialize(d)?))
    }
}

/// How the actor drives the node.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum NodeMode {
    /// Fires once per ready correlation key with one value per input.
    #[default]
    Buffered,
    /// Like buffered, but one invocation may emit many values per output as it goes.
    StreamingOutput,
    /// The node drains its own inbox (and may emit as it goes).
    StreamingInput,
    /// Re-runs once per control event on `__control__`, with the latest data inputs.
    Controlled,
}

impl NodeMode {
    /// Whether one invocation may emit several values per output, so that consumers
    /// must not expect exactly one value per invocation.
    pub fn streams_output(self) -> bool {
        matches!(self, NodeMode::StreamingOutput | NodeMode::StreamingInput)
    }
}

/// One input port or property of a node type.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PortDecl {
    /// The handle edges and properties name it by.
    pub name: String,
    /// What values it accepts; the planner checks edges and property values against it.
    #[serde(rename = "type", default)]
    pub ty: PortType,
    /// A required input must be fed by an edge or given a property value.
    #[serde(default)]
    pub required: bool,
    /// The value the node gets when nothing feeds the port and no property sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// What the port is for, shown in listings and editors.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl PortDecl {
    /// An optional port without default or description; chain the builders below for
    /// the rest.
    pub fn new(name: impl Into<String>, ty: PortType) -> Self {
        PortDecl {
            name: name.into(),
            ty,
            required: false,
            default: None,
            description: String::new(),
        }
    }

    /// Makes the port required: planning fails when nothing feeds it.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// Gives the port a default value.
    pub fn with_default(mut self, v: impl Into<Value>) -> Self {
        self.default = Some(v.into());
        self
    }

    /// Sets the port's description.
    pub fn describe(mut self, d: impl Into<String>) -> Self {
        self.description = d.into();
        self
    }
}

/// One output port of a node type.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OutputDecl {
    /// The handle edges leave from.
    pub name: String,
    /// The type of the values it emits, which every edge from it must accept.
    #[serde(rename = "type", default)]
    pub ty: PortType,
    /// How an emitted value's lineage relates to the invocation's (fan-out, fan-in...).
    #[serde(default)]
    pub correlation: OutputCorrelation,
    /// What the output carries, shown in listings and editors.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl OutputDecl {
    /// An output that inherits the invocation's lineage ([`OutputCorrelation::Single`]).
    pub fn new(name: impl Into<String>, ty: PortType) -> Self {
        OutputDecl {
            name: name.into(),
            ty,
            correlation: OutputCorrelation::Single,
            description: String::new(),
        }
    }

    /// Sets how the output's lineage relates to the invocation's.
    pub fn correlated(mut self, c: OutputCorrelation) -> Self {
        self.correlation = c;
        self
    }

    /// Sets the output's description.
    pub fn describe(mut self, d: impl Into<String>) -> Self {
        self.description = d.into();
        self
    }
}

/// How an output's lineage relates to the invocation's (see [`crate::plan::correlation`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutputCorrelation {
    /// Inherits the invocation lineage.
    #[default]
    Single,
    /// Each emitted value is a new item of a child scope (fan-out). Outputs of one
    /// invocation that share a `group` share the item token.
    Iteration {
        /// Outputs naming the same group emit one item together (a zip of outputs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<String>,
    },
    /// Many values per key with the same lineage; makes the consumer a repeating driver.
    Chunk,
    /// Drops the innermost root (fan-in). Valid only on streaming-input nodes.
    Aggregate,
    /// Keeps the lineage of the envelope that arrived on input `source`.
    Forward {
        /// The input handle whose lineage the output keeps.
        source: String,
    },
}

/// A capability a node asks for, with the reason shown to the operator.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CapabilityRequest {
    /// What sort of access.
    pub kind: CapabilityKind,
    /// What exactly: a directory label, an env var name, a secret name, a host pattern.
    pub target: String,
    /// Why the node needs it, in the node author's words, shown when it is granted.
    pub reason: String,
}

/// The sorts of access a node may ask for; each is denied unless the operator grants it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum CapabilityKind {
    /// Read a directory the operator maps to a label.
    FilesRead,
    /// Write to such a directory.
    FilesWrite,
    /// Read a host environment variable.
    Env,
    /// Read a named secret (its value is then masked in everything the run shows).
    Secret,
    /// Reach hosts matching a pattern.
    Network,
}

fn one_at_a_time(n: &u32) -> bool {
    *n <= 1
}

impl NodeDecl {
    /// How many of the node's invocations may run at once ([`NodeDecl::concurrency`]):
    /// at least one, and only a buffered node's.
    pub fn max_concurrent(&self) -> usize {
        match self.mode {
            NodeMode::Buffered => self.concurrency.max(1) as usize,
            _ => 1,
        }
    }

    /// A declaration with only its type name: a buffered node with no ports, not retry
    /// safe, of unnamed origin. Fill in the rest with struct update syntax.
    pub fn new(type_name: impl Into<String>) -> Self {
        NodeDecl {
            type_name: type_name.into(),
            ..Default::default()
        }
    }

    /// The input port called `name`, if declared (a dynamic-input node takes others too).
    pub fn input(&self, name: &str) -> Option<&PortDecl> {
        self.inputs.iter().find(|p| p.name == name)
    }

    /// The output port called `name`, if declared.
    pub fn output(&self, name: &str) -> Option<&OutputDecl> {
        self.outputs.iter().find(|p| p.name == name)
    }

    /// The property called `name`, if declared.
    pub fn property(&self, name: &str) -> Option<&PortDecl> {
        self.properties.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every origin reads back from the text it is written as, and text that names no
    /// package (no version) stays what it said rather than becoming a package.
    #[test]
    fn an_origin_is_its_text() {
        let package = Origin::Package {
            name: "std".into(),
            version: "0.1.0".into(),
        };
        for (origin, text) in [
            (Origin::Builtin, "builtin"),
            (package.clone(), "package:std@0.1.0"),
            (Origin::Code, "code"),
            (Origin::Other("test".into()), "test"),
            (Origin::Unnamed, ""),
        ] {
            assert_eq!(origin.to_string(), text);
            assert_eq!(Origin::parse(text), origin);
            let json = serde_json::to_string(&origin).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<Origin>(&json).unwrap(), origin);
        }
        assert_eq!(package.package(), Some("std"));
        assert_eq!(Origin::Code.package(), None);
        assert_eq!(
            Origin::parse("package:std"),
            Origin::Other("package:std".into())
        );
    }
}
