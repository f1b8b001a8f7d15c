//! Heddle's core data model: graph documents, values and port types, node declarations,
//! planning and validation, correlation analysis, events and run results.
//!
//! This crate knows nothing about tokio, wasmtime or Docker, so everything that depends
//! on it (the kernel, the CLI, a UI) rebuilds fast and can reason about graphs offline.

pub mod decl;
pub mod event;
pub mod graph;
pub mod journal;
pub mod plan;
pub mod supervise;
pub mod types;
pub mod value;

pub use decl::{
    CapabilityKind, CapabilityRequest, NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl,
};
pub use event::{
    EdgeStatus, Event, EventKind, InvocationMetrics, LogLevel, NodeOutcome, NodeReport, NodeStatus,
    RunResult, RunStatus, SkipReason, SuspendInfo,
};
pub use graph::{CONTROL_HANDLE, DocError, EdgeDoc, EdgeType, GraphDoc, NodeDoc, NodeLimits};
pub use journal::{Occurrence, OpenReason, PauseReason, Record};
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
}
