//! Graphs written in code instead of JSON: for tests, benchmarks and programs that
//! generate graphs. One builder, so every test in the workspace writes a graph the same
//! way and a change to the document shape is made here once.
//!
//! ```
//! use heddle_core::GraphBuilder;
//! use serde_json::json;
//!
//! let doc = GraphBuilder::new()
//!     .node_with("in", "heddle.input", json!({"name": "x", "type": "int"}))
//!     .node("out", "heddle.output")
//!     .prop("name", "result")
//!     .edge("in", "value", "out", "value")
//!     .build();
//! assert_eq!(doc.nodes.len(), 2);
//! ```

use std::collections::BTreeMap;

use crate::graph::{
    CONTROL_HANDLE, EdgeDoc, EdgeType, FORMAT, GraphDoc, NodeDoc, NodeLimits, VERSION,
};
use crate::value::Value;

/// Adds nodes and edges in order; [`GraphBuilder::build`] returns the document as if it
/// had been read from a file with the current format marker and version.
#[derive(Clone, Debug)]
pub struct GraphBuilder {
    doc: GraphDoc,
}

impl Default for GraphBuilder {
    fn default() -> Self {
        GraphBuilder {
            doc: GraphDoc {
                format: Some(FORMAT.to_string()),
                version: Some(VERSION),
                name: None,
                description: None,
                nodes: Vec::new(),
                edges: Vec::new(),
                imported: None,
            },
        }
    }
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty graph with room for `nodes` nodes and `edges` edges. A program that
    /// generates a large graph and knows its size should start here: a list grown one
    /// node at a time is copied each time it doubles, and the room it leaves behind is
    /// kept by the allocator (on a 10,000-node chain, ~0.5 KB of peak memory per node
    /// that the run itself never uses).
    pub fn with_capacity(nodes: usize, edges: usize) -> Self {
        let mut b = Self::default();
        b.doc.nodes.reserve_exact(nodes);
        b.doc.edges.reserve_exact(edges);
        b
    }

    /// Sets the document's `name` (shown in run results and benchmark reports).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.doc.name = Some(name.into());
        self
    }

    /// A node without properties.
    pub fn node(mut self, id: &str, node_type: &str) -> Self {
        self.doc.nodes.push(NodeDoc {
            id: id.to_string(),
            node_type: node_type.to_string(),
            name: None,
            properties: BTreeMap::new(),
            dynamic_properties: BTreeMap::new(),
            ui_properties: None,
            limits: None,
            timeout_ms: None,
            access: None,
            retry: None,
            output: None,
        });
        self
    }

    /// A node with the properties of a JSON object (`null` or `{}` for none), the shape a
    /// graph file gives them.
    ///
    /// # Panics
    /// When `properties` is neither an object nor `null`: a mistake in the calling code.
    pub fn node_with(self, id: &str, node_type: &str, properties: serde_json::Value) -> Self {
        let props = match properties {
            serde_json::Value::Object(m) => m,
            serde_json::Value::Null => serde_json::Map::new(),
            other => panic!("properties of node {id} must be a JSON object, got {other}"),
        };
        props
            .into_iter()
            .fold(self.node(id, node_type), |b, (k, v)| b.prop(&k, v))
    }

    /// Sets a property on the node added last.
    ///
    /// # Panics
    /// When no node has been added yet.
    pub fn prop(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.last_node("prop")
            .properties
            .insert(key.to_string(), value.into());
        self
    }

    /// Sets the limits of the node added last.
    ///
    /// # Panics
    /// When no node has been added yet.
    pub fn limits(mut self, limits: NodeLimits) -> Self {
        self.last_node("limits").limits = Some(limits);
        self
    }

    fn last_node(&mut self, what: &str) -> &mut NodeDoc {
        match self.doc.nodes.last_mut() {
            Some(n) => n,
            None => panic!("GraphBuilder::{what} follows a node"),
        }
    }

    /// A data edge, or a control edge when `target_handle` is [`CONTROL_HANDLE`]. Its id
    /// is the one NodeTool derives (`source:handle->target:handle`).
    pub fn edge(
        self,
        source: &str,
        source_handle: &str,
        target: &str,
        target_handle: &str,
    ) -> Self {
        self.push_edge(None, source, source_handle, target, target_handle)
    }

    /// Like [`GraphBuilder::edge`], with an explicit id (what issues and events name).
    pub fn edge_id(
        self,
        id: &str,
        source: &str,
        source_handle: &str,
        target: &str,
        target_handle: &str,
    ) -> Self {
        self.push_edge(Some(id), source, source_handle, target, target_handle)
    }

    /// A control edge from `source`'s control output into `target`.
    pub fn control(self, source: &str, target: &str) -> Self {
        self.edge(source, CONTROL_HANDLE, target, CONTROL_HANDLE)
    }

    fn push_edge(
        mut self,
        id: Option<&str>,
        source: &str,
        source_handle: &str,
        target: &str,
        target_handle: &str,
    ) -> Self {
        self.doc.edges.push(EdgeDoc {
            id: id.map(str::to_string),
            source: source.to_string(),
            source_handle: source_handle.to_string(),
            target: target.to_string(),
            target_handle: target_handle.to_string(),
            edge_type: if target_handle == CONTROL_HANDLE {
                EdgeType::Control
            } else {
                EdgeType::Data
            },
            ui_properties: None,
            when: None,
            fields: None,
        });
        self
    }

    /// Sets the condition (`when`) of the edge added last.
    ///
    /// # Panics
    /// When no edge has been added yet.
    pub fn when(mut self, expression: &str) -> Self {
        self.last_edge("when").when = Some(expression.to_string());
        self
    }

    /// Narrows the edge added last to these keys of its object values.
    ///
    /// # Panics
    /// When no edge has been added yet.
    pub fn fields(mut self, keys: &[&str]) -> Self {
        self.last_edge("fields").fields = Some(keys.iter().map(|k| k.to_string()).collect());
        self
    }

    /// Declares the output fields of the node added last.
    ///
    /// # Panics
    /// When no node has been added yet.
    pub fn output(mut self, contract: crate::contract::OutputContract) -> Self {
        self.last_node("output").output = Some(contract);
        self
    }

    fn last_edge(&mut self, what: &str) -> &mut EdgeDoc {
        match self.doc.edges.last_mut() {
            Some(e) => e,
            None => panic!("GraphBuilder::{what} follows an edge"),
        }
    }

    /// The document built.
    pub fn build(self) -> GraphDoc {
        self.doc
    }
}

/// A graph from `(id, type, properties)` nodes and `(source, sourceHandle, target,
/// targetHandle)` edges: the compact form most tests write.
pub fn graph(
    nodes: &[(&str, &str, serde_json::Value)],
    edges: &[(&str, &str, &str, &str)],
) -> GraphDoc {
    let b = nodes
        .iter()
        .fold(GraphBuilder::new(), |b, (id, ty, props)| {
            b.node_with(id, ty, props.clone())
        });
    edges
        .iter()
        .fold(b, |b, (s, sh, t, th)| b.edge(s, sh, t, th))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the builder makes is what the same graph written as JSON parses to.
    #[test]
    fn builds_what_the_json_form_parses_to() {
        let built = GraphBuilder::new()
            .node_with("in", "heddle.input", json!({"name": "x", "value": 3}))
            .node("c", "test.scale")
            .node("out", "heddle.output")
            .prop("name", "result")
            .edge_id("e1", "in", "value", "c", "x")
            .control("in", "c")
            .edge("c", "out", "out", "value")
            .build();
        let parsed = GraphDoc::parse(
            &json!({"format": "heddle.graph", "version": 1,
                "nodes": [
                    {"id": "in", "type": "heddle.input", "properties": {"name": "x", "value": 3}},
                    {"id": "c", "type": "test.scale"},
                    {"id": "out", "type": "heddle.output", "properties": {"name": "result"}}],
                "edges": [
                    {"id": "e1", "source": "in", "sourceHandle": "value", "target": "c", "targetHandle": "x"},
                    {"source": "in", "sourceHandle": "__control__", "target": "c",
                     "targetHandle": "__control__", "edge_type": "control"},
                    {"source": "c", "sourceHandle": "out", "target": "out", "targetHandle": "value"}]})
            .to_string(),
            "g.json",
        )
        .unwrap();
        assert_eq!(built, parsed);
    }
}
