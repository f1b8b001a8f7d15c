//! Heddle's core data model: graph documents, values and port types, node declarations,
//! planning and validation, correlation analysis, events and run results.
//!
//! This crate knows nothing about tokio, wasmtime or Docker, so everything that depends
//! on it (the kernel, the CLI, a UI) rebuilds fast and can reason about graphs offline.

pub mod builder;
pub mod contract;
pub mod decl;
pub mod event;
pub mod expr;
pub mod gate;
pub mod graph;
pub mod journal;
pub mod limits;
pub mod plan;
pub mod ranged;
pub mod supervise;
pub mod text;
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
    Decider, Occurrence, OpenReason, PauseReason, PlanSummary, PlannedNode, Record, RecordedAction,
    RecordedVerdict,
};
pub use plan::{INPUT_TYPE, OUTPUT_TYPE};
pub use types::PortType;
pub use value::{Map, Value};

/// Looks up node declarations by type name. The kernel's registry implements it; planning
/// needs nothing more, so validation can run without any executor being instantiated.
pub trait DeclLookup {
    fn decl(&self, type_name: &str) -> Option<std::sync::Arc<NodeDecl>>;

    /// Every known type name, used only for "did you mean" hints on unknown types.
    fn type_names(&self) -> Vec<String> {
        Vec::new()
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
    pub id: &'a str,
    pub decl: &'a std::sync::Arc<NodeDecl>,
    /// Property values from the document (`properties` + `dynamic_properties`), as the
    /// planner checked them against the declared types.
    pub properties: &'a std::collections::BTreeMap<String, Value>,
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
