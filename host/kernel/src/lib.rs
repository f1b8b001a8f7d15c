//! Heddle's actor kernel: runs a planned graph natively on tokio.
//!
//! The kernel never names wasmtime, bollard or SQLite. WASM packages, code nodes and the
//! durable store plug in through [`executor::NodeProvider`] / [`executor::Executor`] and
//! the event stream. An embedder who wants all of those uses `heddle-runtime`, which is
//! built on this crate; one who brings its own node types needs only this one.
//!
//! # Example
//!
//! Plan a graph made of built-in nodes (fan a list out, gather it back) and run it in
//! memory, reading its output and watching its events:
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use heddle_core::{EventKind, GraphDoc, NodeStatus, RunStatus, Value};
//! use heddle_kernel::{Registry, Run, RunOptions};
//!
//! const FAN: &str = r#"{"nodes": [
//!     {"id": "words", "type": "heddle.input", "properties": {"name": "words", "type": "list[str]"}},
//!     {"id": "each", "type": "heddle.foreach"},
//!     {"id": "gather", "type": "heddle.collect"},
//!     {"id": "out", "type": "heddle.output", "properties": {"name": "words"}}],
//!   "edges": [
//!     {"source": "words", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
//!     {"source": "each", "sourceHandle": "item", "target": "gather", "targetHandle": "item"},
//!     {"source": "gather", "sourceHandle": "list", "target": "out", "targetHandle": "value"}]}"#;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Once: the node types a run may use (here only the kernel's built-ins).
//! let registry = Registry::with_builtins();
//!
//! // Per graph: a plan, checked against the registry's declarations (every problem at
//! // once). A plan may be run any number of times.
//! let doc = GraphDoc::parse(FAN, "fan.json")?;
//! let plan = heddle_core::plan::plan(&doc, &registry)?;
//!
//! // Per run: its options (inputs by external name), the executors, and a subscription
//! // made before it starts, so no event is missed.
//! let words = Value::list(vec!["warp".into(), "weft".into()]);
//! let opts = RunOptions {
//!     inputs: BTreeMap::from([("words".to_string(), words.clone())]),
//!     ..RunOptions::default()
//! };
//! let run = Run::new(plan, &registry, opts)?;
//! let mut events = run.subscribe();
//! let result = run.start().wait().await;
//!
//! assert_eq!(result.status, RunStatus::Completed);
//! assert_eq!(result.outputs["words"], [words]);
//! let mut completed = Vec::new();
//! while let Some(event) = events.next().await {
//!     if let EventKind::Node { node_id, status: NodeStatus::Completed, .. } = &event.kind {
//!         completed.push(node_id.clone());
//!     }
//! }
//! completed.sort();
//! assert_eq!(completed, ["each", "gather", "out", "words"]);
//! # Ok(())
//! # }
//! ```
//!
//! # Your own node types
//!
//! A node type is a [`NodeDecl`](heddle_core::NodeDecl) (what the planner checks edges
//! against) and an [`Executor`] per node of a graph, both from a [`NodeProvider`] added
//! to the registry. Type names are unique across providers, so a provider cannot shadow
//! a built-in:
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//!
//! use heddle_core::{GraphBuilder, NodeDecl, OutputDecl, PortDecl, PortType, Value};
//! use heddle_kernel::{
//!     BoxFuture, Call, Executor, NodeError, NodeProvider, NodeSpec, Outputs, Registry,
//!     RunOptions, run_graph,
//! };
//!
//! struct Upper;
//!
//! impl Executor for Upper {
//!     fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
//!         Box::pin(async move {
//!             // The planner checked the edge's type; the value is still the node's to
//!             // read, and a failure here is the node's, with its message.
//!             let text = call.inputs.get("text").and_then(Value::as_str);
//!             let text = text.ok_or_else(|| NodeError::msg("`text` must be a string"))?;
//!             Ok(Outputs::one("text", Value::from(text.to_uppercase())))
//!         })
//!     }
//! }
//!
//! struct Demo;
//!
//! impl NodeProvider for Demo {
//!     fn name(&self) -> &str {
//!         "demo"
//!     }
//!
//!     fn declarations(&self) -> Vec<Arc<NodeDecl>> {
//!         vec![Arc::new(NodeDecl {
//!             inputs: vec![PortDecl::new("text", PortType::Str).required()],
//!             outputs: vec![OutputDecl::new("text", PortType::Str)],
//!             retry_safe: true, // same input, same answer, no effects
//!             ..NodeDecl::new("demo.upper")
//!         })]
//!     }
//!
//!     fn create(&self, _node: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
//!         Ok(Arc::new(Upper))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut registry = Registry::with_builtins();
//! registry.add(Arc::new(Demo))?;
//!
//! let doc = GraphBuilder::new()
//!     .node_with("in", "heddle.input", serde_json::json!({"name": "text", "type": "str"}))
//!     .node("upper", "demo.upper")
//!     .node_with("out", "heddle.output", serde_json::json!({"name": "shouted"}))
//!     .edge("in", "value", "upper", "text")
//!     .edge("upper", "text", "out", "value")
//!     .build();
//! let opts = RunOptions {
//!     inputs: BTreeMap::from([("text".to_string(), Value::from("heddle"))]),
//!     ..RunOptions::default()
//! };
//! let result = run_graph(&doc, &registry, opts).await?;
//! assert_eq!(result.outputs["shouted"], [Value::from("HEDDLE")]);
//! # Ok(())
//! # }
//! ```
//!
//! # Core concepts
//!
//! - A [`Registry`] holds every node type a run may use; make it once and share it.
//! - A [`Run`] is one run of a plan with its [`RunOptions`]: [`Run::new`] creates every
//!   node's executor before anything runs (so a bad property fails the run up front),
//!   [`Run::start`] spawns it on the current tokio runtime, and the [`RunHandle`] it
//!   returns cancels it, feeds streaming inputs, drives controlled nodes and waits for
//!   its [`RunResult`](heddle_core::RunResult).
//! - Each node runs as an actor with a bounded inbox: a full inbox is backpressure, and
//!   values meet by their lineage (which items of which fan-outs they belong to), as the
//!   plan's correlation analysis worked out ([`runtime`]).
//! - Everything that happens is an [`Event`](heddle_core::Event) on the run's bus
//!   ([`EventStream`]); the result is built from the same stream.
//! - A failed invocation goes to the [`supervisor`] when the run has one (retry,
//!   substitute, skip, end the stream, or fail, checked against what is allowed), and a
//!   [`Journal`] makes the run durable: every invocation is written ahead, and what an
//!   earlier process recorded is not run again.

#![warn(missing_docs)]

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
pub mod builtins;
pub mod executor;
pub mod gate;
pub mod journal;
pub mod registry;
pub mod runtime;
pub mod supervisor;

pub use executor::{
    BoxFuture, Call, CtxParts, Emitted, ErrorKind, EventSink, Executor, InputStream, InputView,
    Inputs, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs, SecretRegistry, StreamItem,
};
pub use journal::{Journal, JournalError, Prior, Refused, SealError, Step};
pub use registry::{Registry, RegistryError};
pub use runtime::{
    EventRef, EventStream, InboxLimits, KernelError, Kinds, Observer, Run, RunHandle, RunOptions,
    run_graph,
};
