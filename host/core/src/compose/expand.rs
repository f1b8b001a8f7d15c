//! Expansion: graph nodes become their inner graphs, in one flat document.
//!
//! Inner nodes keep their type and settings under a path id (`g/clean`); inner edges
//! get path ids too (`g/` + the edge's id). An inner `heddle.input` becomes the graph
//! node's input port and an inner `heddle.output` its output port: each is a port node
//! at its path (`g/text`, shown as `heddle.graph.input` or `heddle.graph.output`) that
//! runs as the kernel's `heddle.passthrough`, declared with the port's type on both
//! sides, so an edge into `g.text` is the edge into `g/text` and planning checks its
//! type like any edge's. A port nothing feeds takes the graph node's property of that
//! name, else the inner input's default. Pass-through nodes are the kernel's retry-safe
//! built-ins: they run inline, are never journaled, and keep an envelope's lineage, so a
//! fan-out outside reaches the inner nodes item by item.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{
    Composition, GRAPH_TYPE, GraphNodeInfo, GraphPort, IncludeKey, IncludedDoc, OWN_PROPERTIES,
    PATH_SEP,
};
use crate::DeclLookup;
use crate::contract::OutputContract;
use crate::decl::{NodeDecl, Origin, OutputCorrelation, OutputDecl, PortDecl};
use crate::graph::{CONTROL_HANDLE, EdgeDoc, EdgeType, GraphDoc, NodeDoc};
use crate::nodetool::Imported;
use crate::plan::issues::{Issue, IssueKind, issue, list_names, suggest};
use crate::plan::model::{INPUT_TYPE, OUTPUT_TYPE};
use crate::types::PortType;
use crate::value::Value;

/// The executor a port runs on: the kernel's pass-through.
const PORT_EXECUTOR: &str = "heddle.passthrough";
/// The node types a port node shows (in reports, logs, the viewer), so it reads as a
/// port rather than as a node someone wrote; its declaration is the pass-through's.
pub const INPUT_PORT_TYPE: &str = "heddle.graph.input";
/// See [`INPUT_PORT_TYPE`].
pub const OUTPUT_PORT_TYPE: &str = "heddle.graph.output";
/// The handle a port node takes and emits on.
const PORT_HANDLE: &str = "value";

/// A document with its graph nodes expanded.
pub(crate) struct Expanded {
    /// The flat document: what the planner plans.
    pub doc: GraphDoc,
    /// Declarations by node id that replace the type's: each port node's, typed.
    pub overrides: HashMap<String, Arc<NodeDecl>>,
    /// Every graph node expanded, outermost first.
    pub graphs: Vec<GraphNodeInfo>,
    /// Port node path → (graph node path, port name): how issues about a port node are
    /// told as issues of the graph node's handle.
    pub ports: HashMap<String, (String, String)>,
    /// Every document expanded, by key.
    pub included: BTreeMap<IncludeKey, IncludedDoc>,
    /// Problems found reading and expanding.
    pub issues: Vec<Issue>,
}

/// Expands every graph node of `doc` with the documents `comp` read.
pub(crate) fn expand(doc: &GraphDoc, comp: &Composition, decls: &dyn DeclLookup) -> Expanded {
    let mut x = Expander {
        comp,
        decls,
        nodes: Vec::with_capacity(doc.nodes.len()),
        edges: Vec::with_capacity(doc.edges.len()),
        overrides: HashMap::new(),
        graphs: Vec::new(),
        ports: HashMap::new(),
        included: BTreeMap::new(),
        issues: comp.issues.clone(),
        notes: Vec::new(),
        envelope: doc.imported.as_ref().is_some_and(|i| i.envelope),
    };
    x.doc(doc, "");
    let imported = (doc.imported.is_some() || !x.notes.is_empty()).then_some(Imported {
        envelope: x.envelope,
        notes: x.notes,
    });
    Expanded {
        doc: GraphDoc {
            format: doc.format.clone(),
            version: doc.version,
            name: doc.name.clone(),
            description: doc.description.clone(),
            nodes: x.nodes,
            edges: x.edges,
            imported,
        },
        overrides: x.overrides,
        graphs: x.graphs,
        ports: x.ports,
        included: x.included,
        issues: x.issues,
    }
}

struct Expander<'a> {
    comp: &'a Composition,
    decls: &'a dyn DeclLookup,
    nodes: Vec<NodeDoc>,
    edges: Vec<EdgeDoc>,
    overrides: HashMap<String, Arc<NodeDecl>>,
    graphs: Vec<GraphNodeInfo>,
    ports: HashMap<String, (String, String)>,
    included: BTreeMap<IncludeKey, IncludedDoc>,
    issues: Vec<Issue>,
    notes: Vec<(String, String)>,
    envelope: bool,
}

/// One port of a document being expanded as a graph node's inner graph.
struct Port {
    name: String,
    /// The port node's path.
    path: String,
    /// The port node's position in the flat document.
    at: usize,
    ty: PortType,
    default: Option<Value>,
    streaming: bool,
}

/// A graph node of the document being expanded, as its edges see it.
enum Boundary {
    /// Expanded: its ports, its own properties (the values of unfed inputs) and its
    /// entry in [`Expander::graphs`].
    Ports {
        inputs: Vec<Port>,
        outputs: Vec<Port>,
        properties: BTreeMap<String, Value>,
        info: usize,
    },
    /// Its document could not be used (already an issue): it stays one node, declared to
    /// take whatever its edges bring, so nothing around it is reported twice.
    Placeholder { at: usize },
}

impl Expander<'_> {
    /// Expands `doc` at `prefix` (`""` for the top document, `g/` inside graph node `g`)
    /// into the flat document; inside a graph node, returns its ports.
    fn doc(&mut self, doc: &GraphDoc, prefix: &str) -> (Vec<Port>, Vec<Port>) {
        let inner = !prefix.is_empty();
        if let Some(imp) = &doc.imported {
            self.notes.extend(
                imp.notes
                    .iter()
                    .map(|(id, note)| (format!("{prefix}{id}"), note.clone())),
            );
        }
        let mut graphs: HashMap<&str, Boundary> = HashMap::new();
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for n in &doc.nodes {
            let path = format!("{prefix}{}", n.id);
            if n.id.contains(PATH_SEP) {
                self.issues.push(issue(
                    IssueKind::InvalidGraphNode,
                    Some(&path),
                    None,
                    None,
                    format!(
                        "node id contains `{PATH_SEP}`, which separates a graph node's id from its inner nodes' in a graph with graph nodes; rename it"
                    ),
                ));
            }
            let live = !n.is_bypassed();
            if live && n.node_type == GRAPH_TYPE {
                let b = self.graph_node(n, &path);
                graphs.insert(n.id.as_str(), b);
            } else if live && inner && n.node_type == INPUT_TYPE {
                inputs.push(self.input_port(n, path));
            } else if live && inner && n.node_type == OUTPUT_TYPE {
                outputs.push(self.port_node(n, path, PortType::Any, OUTPUT_PORT_TYPE));
            } else {
                let mut m = n.clone();
                m.id = path;
                self.nodes.push(m);
            }
        }
        let fed = self.edges_of(doc, prefix, &graphs);
        self.settle_boundaries(&graphs, &fed);
        if inner {
            self.type_outputs(&mut outputs);
        }
        (inputs, outputs)
    }

    /// The inner graph of graph node `n` at `path`, expanded (or its placeholder).
    fn graph_node(&mut self, n: &NodeDoc, path: &str) -> Boundary {
        let Some((key, loaded)) = self.comp.loaded(path) else {
            self.nodes.push(NodeDoc {
                id: path.to_string(),
                ..n.clone()
            });
            return Boundary::Placeholder {
                at: self.nodes.len() - 1,
            };
        };
        self.own_settings(n, path);
        self.included
            .entry(key.clone())
            .or_insert_with(|| IncludedDoc {
                key: key.clone(),
                sha256: loaded.sha256.clone(),
                text: loaded.text.clone(),
            });
        let props = n.merged_properties();
        let info = self.graphs.len();
        self.graphs.push(GraphNodeInfo {
            id: path.to_string(),
            graph: props
                .get("graph")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            package: props
                .get("package")
                .and_then(Value::as_str)
                .map(str::to_string),
            key: key.clone(),
            sha256: loaded.sha256.clone(),
            name: loaded.doc.name.clone(),
            description: loaded.doc.description.clone(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            retry_safe: false,
            nodes: Vec::new(),
        });
        let (inputs, outputs) = self.doc(&loaded.doc, &format!("{path}{PATH_SEP}"));
        self.check_ports(path, &loaded.origin, &inputs, &outputs);
        for p in inputs.iter().chain(&outputs) {
            self.ports
                .insert(p.path.clone(), (path.to_string(), p.name.clone()));
        }
        let port = |p: &Port| GraphPort {
            name: p.name.clone(),
            node: p.path.clone(),
            ty: p.ty.clone(),
            default: p.default.clone(),
            streaming: p.streaming,
        };
        self.graphs[info].inputs = inputs.iter().map(port).collect();
        self.graphs[info].outputs = outputs.iter().map(port).collect();
        let properties = props
            .into_iter()
            .filter(|(k, v)| !OWN_PROPERTIES.contains(&k.as_str()) && !v.is_null())
            .collect();
        Boundary::Ports {
            inputs,
            outputs,
            properties,
            info,
        }
    }

    /// A graph node has no invocation of its own: a limit, retry, access or output
    /// declaration written on it would mean nothing, so it is refused rather than
    /// silently dropped.
    fn own_settings(&mut self, n: &NodeDoc, path: &str) {
        let mut set = Vec::new();
        if n.limits.is_some() {
            set.push("limits");
        }
        if n.timeout_ms.is_some() {
            set.push("timeout_ms");
        }
        if n.access.is_some() {
            set.push("access");
        }
        if n.retry.is_some() {
            set.push("retry");
        }
        if !set.is_empty() {
            self.issues.push(issue(
                IssueKind::InvalidLimits,
                Some(path),
                None,
                None,
                format!(
                    "a graph node has no invocation of its own, so its {} would mean nothing: set them on the nodes inside its graph",
                    set.join(", ")
                ),
            ));
        }
        if n.output.is_some() {
            self.issues.push(issue(
                IssueKind::InvalidOutputContract,
                Some(path),
                None,
                None,
                "a graph node's outputs are its inner graph's: declare fields on the node that feeds the inner `heddle.output`".into(),
            ));
        }
    }

    /// Two ports of one side with one name, a port named like one of the graph node's
    /// own properties, and a graph with no output: each an issue of the graph node.
    fn check_ports(&mut self, path: &str, origin: &str, inputs: &[Port], outputs: &[Port]) {
        for (side, ports) in [("input", inputs), ("output", outputs)] {
            let mut seen: HashMap<&str, &str> = HashMap::new();
            for p in ports {
                if let Some(first) = seen.insert(&p.name, &p.path) {
                    self.issues.push(issue(
                        IssueKind::InvalidGraphNode,
                        Some(path),
                        None,
                        Some(&p.name),
                        format!(
                            "graph document {origin} has two {side}s named `{}` (nodes {first} and {}); a graph node's {side} handles must be distinct: rename one",
                            p.name, p.path
                        ),
                    ));
                }
            }
        }
        for p in inputs {
            if OWN_PROPERTIES.contains(&p.name.as_str()) {
                self.issues.push(issue(
                    IssueKind::InvalidGraphNode,
                    Some(path),
                    None,
                    Some(&p.name),
                    format!(
                        "graph document {origin} has an input named `{}` (node {}), which is also the name of a graph node's own property ({}); rename the input",
                        p.name,
                        p.path,
                        OWN_PROPERTIES.join(", ")
                    ),
                ));
            }
        }
        if outputs.is_empty() {
            self.issues.push(issue(
                IssueKind::InvalidGraphNode,
                Some(path),
                None,
                None,
                format!(
                    "graph document {origin} has no `{OUTPUT_TYPE}` node: a graph node's outputs are its graph's outputs, and without one nothing it does reaches the graph around it"
                ),
            ));
        }
    }

    /// An inner `heddle.input` as an input port.
    fn input_port(&mut self, n: &NodeDoc, path: String) -> Port {
        let props = n.merged_properties();
        let ty = match props.get("type").filter(|v| !v.is_null()) {
            None => PortType::Any,
            Some(v) => match v.as_str().map(str::parse::<PortType>) {
                Some(Ok(t)) => t,
                Some(Err(e)) => {
                    self.issues.push(issue(
                        IssueKind::InvalidProperty,
                        Some(&path),
                        None,
                        Some("type"),
                        e.to_string(),
                    ));
                    PortType::Any
                }
                None => {
                    self.issues.push(issue(
                        IssueKind::InvalidProperty,
                        Some(&path),
                        None,
                        Some("type"),
                        "`type` must be text, a port type such as `str` or `list[int]`".into(),
                    ));
                    PortType::Any
                }
            },
        };
        let mut port = self.port_node(n, path, ty, INPUT_PORT_TYPE);
        port.default = props.get("value").filter(|v| !v.is_null()).cloned();
        port.streaming = props
            .get("streaming")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if port.streaming {
            // Planned as the inner graph plans its streaming input: several values per
            // key, whatever feeds the port outside, so the inner graph is checked (a
            // node driven by it, two streams needing a join) as it was written.
            self.overrides.insert(
                port.path.clone(),
                Arc::new(port_decl(&port.path, &port.name, &port.ty, true)),
            );
        }
        port
    }

    /// The pass-through node that carries a port, typed `ty` on both sides.
    fn port_node(&mut self, n: &NodeDoc, path: String, ty: PortType, shown: &str) -> Port {
        let name = n
            .name
            .clone()
            .or_else(|| {
                n.merged_properties()
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| n.id.clone());
        self.nodes.push(NodeDoc {
            id: path.clone(),
            node_type: shown.to_string(),
            name: None,
            properties: BTreeMap::new(),
            dynamic_properties: BTreeMap::new(),
            ui_properties: n.ui_properties.clone(),
            limits: None,
            timeout_ms: None,
            access: None,
            retry: None,
            output: None,
        });
        self.overrides
            .insert(path.clone(), Arc::new(port_decl(&path, &name, &ty, false)));
        Port {
            name,
            path,
            at: self.nodes.len() - 1,
            ty,
            default: None,
            streaming: false,
        }
    }

    /// Copies `doc`'s edges with their ends at paths, through graph nodes' ports; returns
    /// the (graph node, input) pairs an edge feeds.
    fn edges_of<'d>(
        &mut self,
        doc: &'d GraphDoc,
        prefix: &str,
        graphs: &HashMap<&str, Boundary>,
    ) -> HashSet<(&'d str, String)> {
        let mut fed = HashSet::new();
        for e in &doc.edges {
            let written = e.effective_id();
            let id = format!("{prefix}{written}");
            let ends = [
                (e.source.as_str(), e.source_handle.as_str(), false),
                (e.target.as_str(), e.target_handle.as_str(), true),
            ];
            let mut mapped: Vec<(String, String)> = Vec::with_capacity(2);
            for (node, handle, into) in ends {
                let path = format!("{prefix}{node}");
                match graphs.get(node) {
                    Some(Boundary::Ports {
                        inputs,
                        outputs,
                        info,
                        ..
                    }) => {
                        if e.edge_type == EdgeType::Control || handle == CONTROL_HANDLE {
                            self.issues.push(issue(
                                IssueKind::ControlHandle,
                                Some(&path),
                                Some(&id),
                                Some(handle),
                                "a graph node takes no control edges: it has no invocation of its own to control".into(),
                            ));
                            break;
                        }
                        let side = if into { inputs } else { outputs };
                        match side.iter().find(|p| p.name == handle) {
                            Some(p) => mapped.push((p.path.clone(), PORT_HANDLE.to_string())),
                            None => {
                                self.unknown_port(&path, *info, &id, handle, into, side);
                                break;
                            }
                        }
                    }
                    _ => mapped.push((path, handle.to_string())),
                }
            }
            let [(source, source_handle), (target, target_handle)] =
                match <[_; 2]>::try_from(mapped) {
                    Ok(m) => m,
                    Err(_) => continue,
                };
            if matches!(graphs.get(e.target.as_str()), Some(Boundary::Ports { .. })) {
                fed.insert((e.target.as_str(), e.target_handle.clone()));
            }
            // The top document's edges keep the id they were written with (derived from
            // their ends as written); inner edges are named under their graph node.
            let id = if prefix.is_empty() {
                e.id.clone().or(Some(written))
            } else {
                Some(id)
            };
            self.edges.push(EdgeDoc {
                id,
                source,
                source_handle,
                target,
                target_handle,
                ..e.clone()
            });
        }
        fed
    }

    fn unknown_port(
        &mut self,
        path: &str,
        info: usize,
        edge: &str,
        handle: &str,
        into: bool,
        ports: &[Port],
    ) {
        let (kind, side) = if into {
            (IssueKind::UnknownInputHandle, "input")
        } else {
            (IssueKind::UnknownOutputHandle, "output")
        };
        let names = ports.iter().map(|p| p.name.as_str());
        let graph = &self.graphs[info].key;
        self.issues.push(issue(
            kind,
            Some(path),
            Some(edge),
            Some(handle),
            format!(
                "graph node {path} (graph `{graph}`) has no {side} `{handle}`{} ({side}s: {}); its {side}s are its graph's `heddle.{side}` nodes",
                suggest(handle, names.clone()),
                list_names(names)
            ),
        ));
    }

    /// Gives every graph node's unfed inputs their value (the node's property of the
    /// port's name, else the inner default) and reports those with none; declares each
    /// placeholder with the outputs its edges use.
    fn settle_boundaries(
        &mut self,
        graphs: &HashMap<&str, Boundary>,
        fed: &HashSet<(&str, String)>,
    ) {
        let mut ids: Vec<&&str> = graphs.keys().collect();
        ids.sort();
        for &&id in &ids {
            match &graphs[id] {
                Boundary::Ports {
                    inputs,
                    properties,
                    info,
                    ..
                } => {
                    let path = self.graphs[*info].id.clone();
                    for k in properties.keys() {
                        if !inputs.iter().any(|p| &p.name == k) {
                            let names = inputs.iter().map(|p| p.name.as_str());
                            self.issues.push(issue(
                                IssueKind::UnknownProperty,
                                Some(&path),
                                None,
                                Some(k),
                                format!(
                                    "graph node has no input or property `{k}`{} (its own: {}; inputs: {})",
                                    suggest(k, names.clone()),
                                    OWN_PROPERTIES.join(", "),
                                    list_names(names)
                                ),
                            ));
                        }
                    }
                    for p in inputs {
                        if fed.contains(&(id, p.name.clone())) {
                            continue;
                        }
                        match properties.get(&p.name).or(p.default.as_ref()) {
                            Some(v) => {
                                self.nodes[p.at]
                                    .properties
                                    .insert(PORT_HANDLE.to_string(), v.clone());
                            }
                            None => self.issues.push(issue(
                                IssueKind::MissingRequiredInput,
                                Some(&path),
                                None,
                                Some(&p.name),
                                format!(
                                    "input `{}` ({}) of the graph node has no edge, no value and no default{}",
                                    p.name,
                                    p.ty,
                                    if p.streaming {
                                        " (it is a streaming input: inside a graph node nobody pushes values into it, so an edge into the graph node's handle must feed it)"
                                    } else {
                                        ""
                                    }
                                ),
                            )),
                        }
                    }
                }
                Boundary::Placeholder { at } => {
                    let path = self.nodes[*at].id.clone();
                    let mut decl = NodeDecl::new(GRAPH_TYPE);
                    decl.dynamic_inputs = true;
                    decl.origin = Origin::Builtin;
                    for e in self.edges.iter().filter(|e| e.source == path) {
                        if decl.output(&e.source_handle).is_none() {
                            decl.outputs
                                .push(OutputDecl::new(e.source_handle.clone(), PortType::Any));
                        }
                    }
                    self.overrides.insert(path, Arc::new(decl));
                }
            }
        }
    }

    /// Each output port's type: the type of the one edge that feeds it inside (`any`
    /// when several do, or none); and the fields that edge's source declares on it.
    fn type_outputs(&mut self, outputs: &mut [Port]) {
        for p in outputs.iter_mut() {
            let mut feeding = self
                .edges
                .iter()
                .filter(|e| e.target == p.path && e.edge_type == EdgeType::Data);
            let source = match (feeding.next(), feeding.next()) {
                (Some(e), None) => Some((e.source.clone(), e.source_handle.clone())),
                _ => None,
            };
            let ty = source
                .as_ref()
                .map_or(PortType::Any, |(s, h)| self.output_type(s, h));
            p.ty = ty.clone();
            self.overrides.insert(
                p.path.clone(),
                Arc::new(port_decl(&p.path, &p.name, &ty, false)),
            );
            self.nodes[p.at].output = source
                .as_ref()
                .and_then(|(s, h)| self.declared_fields(s, h));
        }
    }

    /// The fields node `path` declares on its output `handle` (its `output`), as the
    /// port it feeds declares them: an edge leaving the graph node is then checked
    /// against them (`fields` naming a key the producer does not promise is refused, a
    /// `when` may read `fields.<key>`), as an edge leaving the producer would be.
    fn declared_fields(&self, path: &str, handle: &str) -> Option<OutputContract> {
        let node = self.nodes.iter().rev().find(|n| n.id == path)?;
        let c = node.output.as_ref()?;
        let on_handle = match &c.handle {
            Some(h) => h == handle,
            None => {
                let outputs = match self.overrides.get(path) {
                    Some(d) => d.outputs.len(),
                    None => self.decls.decl(&node.node_type)?.outputs.len(),
                };
                outputs == 1
            }
        };
        // A declaration the planner refuses on the producer is not repeated on the port.
        let mut seen = HashSet::new();
        let well_formed = c
            .fields
            .iter()
            .all(|f| !f.key.is_empty() && seen.insert(f.key.as_str()))
            && matches!(
                self.output_type(path, handle),
                PortType::Any | PortType::Json | PortType::Object
            );
        (on_handle && well_formed).then(|| OutputContract {
            handle: None,
            fields: c.fields.clone(),
        })
    }

    /// The type of output `handle` of the flat node `path`, as far as it is known here.
    fn output_type(&self, path: &str, handle: &str) -> PortType {
        if let Some(d) = self.overrides.get(path) {
            return d.output(handle).map(|o| o.ty.clone()).unwrap_or_default();
        }
        self.nodes
            .iter()
            .rev()
            .find(|n| n.id == path)
            .and_then(|n| self.decls.decl(&n.node_type))
            .and_then(|d| d.output(handle).map(|o| o.ty.clone()))
            .unwrap_or_default()
    }
}

/// The declaration of a port node: a retry-safe built-in pass-through typed `ty`. A
/// `streaming` port's output repeats per key (`chunk`), as a streaming `heddle.input`'s
/// does: planning gives the inner graph the stream it was written for.
fn port_decl(path: &str, name: &str, ty: &PortType, streaming: bool) -> NodeDecl {
    let mut d = NodeDecl::new(PORT_EXECUTOR);
    d.title = "Port".into();
    d.description = format!("Port `{name}` of a graph node ({path})");
    d.inputs = vec![PortDecl::new(PORT_HANDLE, ty.clone())];
    let mut out = OutputDecl::new(PORT_HANDLE, ty.clone());
    if streaming {
        out = out.correlated(OutputCorrelation::Chunk);
    }
    d.outputs = vec![out];
    d.retry_safe = true;
    d.origin = Origin::Builtin;
    d
}
