//! Heddle's core data model: graph documents, values and port types, node declarations,
//! planning and validation, correlation analysis, events and run results.
//!
//! This crate knows nothing about tokio, wasmtime or Docker, so everything that depends
//! on it (the kernel, the CLI, a UI) rebuilds fast and can reason about graphs offline:
//! an editor can validate a graph, explain its fan-outs or read a run's events without
//! being able to run a single node.
//!
//! # Example
//!
//! Node types are known only by their declarations. Give the planner a [`DeclLookup`]
//! (the kernel's registry is one; here, a map), and it checks a graph against them,
//! reporting every problem at once:
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Arc;
//!
//! use heddle_core::plan::{IssueKind, plan};
//! use heddle_core::{DeclLookup, GraphDoc, NodeDecl, OutputDecl, PortDecl, PortType};
//!
//! struct Decls(HashMap<String, Arc<NodeDecl>>);
//!
//! impl DeclLookup for Decls {
//!     fn decl(&self, type_name: &str) -> Option<Arc<NodeDecl>> {
//!         self.0.get(type_name).cloned()
//!     }
//! }
//!
//! let count = NodeDecl {
//!     inputs: vec![PortDecl::new("text", PortType::Str).required()],
//!     outputs: vec![OutputDecl::new("n", PortType::Int)],
//!     ..NodeDecl::new("demo.count")
//! };
//! let decls = Decls(HashMap::from([("demo.count".to_string(), Arc::new(count))]));
//!
//! // A node fed nothing on a required input, and an edge to a handle it lacks: both
//! // reported in one error, with the ids that find them in the file.
//! let doc = GraphDoc::parse(
//!     r#"{"nodes": [{"id": "a", "type": "demo.count"}, {"id": "b", "type": "demo.count"}],
//!         "edges": [{"source": "a", "sourceHandle": "n", "target": "b", "targetHandle": "txt"}]}"#,
//!     "count.json",
//! )?;
//! let err = plan(&doc, &decls).unwrap_err();
//! let kinds: Vec<IssueKind> = err.issues.iter().map(|i| i.kind).collect();
//! assert!(kinds.contains(&IssueKind::UnknownInputHandle), "{err}");
//! assert!(kinds.contains(&IssueKind::MissingRequiredInput), "{err}");
//! # Ok::<(), heddle_core::DocError>(())
//! ```
//!
//! # Core concepts
//!
//! - A [`GraphDoc`] is the graph as written (JSON, NodeTool's shape): nodes with types
//!   and properties, edges between handles. [`GraphBuilder`] writes one in code.
//! - A [`NodeDecl`] is what a node type says about itself: ports and their
//!   [`PortType`]s, its [`NodeMode`], whether a retry is safe. A graph cannot change it.
//! - [`plan::plan`] turns a document into a [`plan::Plan`]: every reference resolved,
//!   every type checked, and the correlation analysis ([`plan::correlation`]) that says
//!   which values of a fan-out meet at each invocation. A plan is made once per graph
//!   and can be run any number of times.
//! - A [`Value`] is what travels on an edge: JSON-shaped, with integers kept apart from
//!   floats and bytes kept as bytes, cheap to clone.
//! - An [`Event`] is one thing that happened in a run; a [`RunResult`] is what a
//!   finished run reports, built from the same stream.
//! - A [`Record`] is one entry of a durable run's log, and [`supervise`] holds what a
//!   supervisor sees of a failure ([`supervise::Escalation`]) and may answer
//!   ([`supervise::Verdict`]).
//!
//! Running a plan is the kernel's job (`heddle-kernel`); running one with WASM packages,
//! code nodes and a durable store is `heddle-runtime`'s.

#![warn(missing_docs)]

pub mod builder;
pub mod compose;
pub mod contract;
pub mod decl;
pub mod event;
pub mod expr;
pub mod gate;
pub mod graph;
pub mod journal;
pub mod limits;
pub mod net;
pub mod nodetool;
pub mod package;
pub mod plan;
pub mod ranged;
pub mod reports;
pub mod supervise;
pub mod text;
pub mod trace;
pub mod types;
pub mod value;

pub use builder::GraphBuilder;
pub use decl::{
    CapabilityKind, CapabilityRequest, NodeDecl, NodeMode, Origin, OutputCorrelation, OutputDecl,
    PortDecl,
};
pub use event::{
    EdgeStatus, Event, EventKind, InvocationMetrics, LogLevel, NodeOutcome, NodeReport, NodeStatus,
    RunResult, RunStatus, SkipReason, SuspendInfo, UsageState,
};
pub use graph::{CONTROL_HANDLE, DocError, EdgeDoc, EdgeType, GraphDoc, NodeDoc, NodeLimits};
pub use journal::{
    Decider, Occurrence, OpenReason, PauseReason, PlanSummary, PlannedGraph, PlannedNode,
    ReconcileAnswer, Record, RecordedAction, RecordedVerdict,
};
pub use plan::{INPUT_TYPE, OUTPUT_TYPE};
pub use reports::NodeReports;
pub use types::PortType;
pub use value::{Map, Value};

/// Looks up node declarations by type name. The kernel's registry implements it; planning
/// needs nothing more, so validation can run without any executor being instantiated.
pub trait DeclLookup {
    /// The declaration of `type_name` (its ports, properties, mode), or `None` for a
    /// type nobody provides, which the planner reports as an unknown type.
    fn decl(&self, type_name: &str) -> Option<std::sync::Arc<NodeDecl>>;

    /// Every known type name, used only for "did you mean" hints on unknown types.
    fn type_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Where node types were looked for (the package store, and how to point at
    /// another), said with an unknown one. Default: nothing to say.
    fn searched(&self) -> Option<String> {
        None
    }

    /// What the node's type finds wrong with its configuration beyond the declared
    /// property types (a value out of range, a setting the operator does not allow).
    /// The planner reports each as an issue of that node, so `validate` refuses what a
    /// run would refuse, all at once. Default: nothing to add.
    fn check_node(&self, _node: &NodeSpec<'_>) -> Vec<ConfigProblem> {
        Vec::new()
    }
}

/// One node of a graph as its type sees it: what a provider creates an executor from,
/// and what [`DeclLookup::check_node`] checks before the run.
pub struct NodeSpec<'a> {
    /// The node's id in the document, for messages and per-node state.
    pub id: &'a str,
    /// Its type's declaration, as [`DeclLookup::decl`] returned it.
    pub decl: &'a std::sync::Arc<NodeDecl>,
    /// Property values from the document (`properties` + `dynamic_properties`), as the
    /// planner checked them against the declared types.
    pub properties: &'a std::collections::BTreeMap<String, Value>,
    /// The node's own limits from the document (time, memory, fuel), when it sets any.
    pub limits: Option<&'a NodeLimits>,
}

/// A problem a node type found in one node's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigProblem {
    /// The property at fault, when one is.
    pub property: Option<String>,
    /// What is wrong and how to fix it, without the node id (the issue carries it).
    pub message: String,
}
