//! Heddle as a library: run node graphs whose nodes are WebAssembly components, in
//! memory or durably, from any Rust program, the way the `heddle` command line and
//! `heddle serve` do (they are built on this crate).
//!
//! # Example
//!
//! Load a graph, run it in memory with an input, read its output. `std.text.case` is a
//! node of the first-party `std` WASM package:
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use heddle_runtime::{Drive, GraphDoc, Overrides, Runtime, Settings, Value};
//!
//! const SHOUT: &str = r#"{"format": "heddle.graph", "version": 1,
//!   "nodes": [
//!     {"id": "text", "type": "heddle.input", "properties": {"name": "text", "type": "str"}},
//!     {"id": "upper", "type": "std.text.case", "properties": {"mode": "upper"}},
//!     {"id": "shouted", "type": "heddle.output"}],
//!   "edges": [
//!     {"source": "text", "sourceHandle": "value", "target": "upper", "targetHandle": "text"},
//!     {"source": "upper", "sourceHandle": "text", "target": "shouted", "targetHandle": "value"}]}"#;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Once per program: the settings (`./heddle.toml` if there is one, else the defaults)
//! // and the runtime they make: the WASM engine and every node type it can run.
//! let settings = Settings::load(&Overrides::default())?;
//! let runtime = Runtime::load(settings, None).await?;
//!
//! // Per run: its plan (every problem in the graph reported at once), its options
//! // (inputs, the secret set), and a driver that takes it to its end.
//! let doc = GraphDoc::parse(SHOUT, "shout.json")?;
//! let plan = runtime.plan(&doc, "shout.json")?;
//! let inputs = BTreeMap::from([("text".to_string(), Value::from("hello"))]);
//! let drive = Drive::in_memory(plan, runtime.options(inputs, None));
//! let result = drive.run(runtime.registry()).await?.result.expect("it started");
//! assert_eq!(result.outputs["shouted"], [Value::from("HELLO")]);
//! # Ok(())
//! # }
//! ```
//!
//! # A durable run, resumed
//!
//! A durable run is recorded in a run store (SQLite, `[store] path`) before anything
//! runs, and every invocation is written ahead: it survives a crash, a Ctrl-C or a pause,
//! and any later process takes it up from its log without repeating recorded work. Here
//! the run pauses at a gate, and a person's approval (maybe given in another process,
//! days later) lets it go on:
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use heddle_runtime::durable::{Decision, Reopen, gates, stored_graph};
//! use heddle_runtime::{Ending, GraphDoc, Overrides, Runtime, RunStatus, Settings};
//!
//! const REVIEWED: &str = r#"{"format": "heddle.graph", "version": 1,
//!   "nodes": [
//!     {"id": "draft", "type": "heddle.constant", "properties": {"value": "release notes"}},
//!     {"id": "review", "type": "heddle.gate", "properties": {"title": "Ship it?"}},
//!     {"id": "shipped", "type": "heddle.output"}],
//!   "edges": [
//!     {"source": "draft", "sourceHandle": "value", "target": "review", "targetHandle": "value"},
//!     {"source": "review", "sourceHandle": "value", "target": "shipped", "targetHandle": "value"}]}"#;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let mut settings = Settings::load(&Overrides::default())?;
//! settings.store.path = dir.path().join("runs.db");
//! let runtime = Runtime::load(settings, None).await?;
//! let store = runtime.settings().store.open()?;
//!
//! // Recorded (graph bytes, plan, inputs, package digests, budget), then driven.
//! let doc = GraphDoc::parse(REVIEWED, "reviewed.json")?;
//! let plan = runtime.plan(&doc, "reviewed.json")?;
//! let opts = runtime.options(BTreeMap::new(), None);
//! let budget = runtime.settings().store.budget(None, None)?;
//! let record = runtime.new_run("reviewed.json".into(), REVIEWED.into(), &plan, &opts, budget)?;
//! let (header, drive) = runtime.begin(store.clone(), record, plan, opts).await?;
//! let outcome = drive.run(runtime.registry()).await?;
//! assert!(matches!(outcome.ending, Some(Ending::Paused { .. })));
//!
//! // The approval is recorded first, then the run goes on from the gate.
//! let run = header.run_id.as_str();
//! let (resumption, _, approval) = gates::approval(&*store, run, "review", Some("ok".into()))?;
//! let doc = stored_graph(&resumption.header)?;
//! let reopened = runtime.reopen(store, resumption, &doc, Some(Decision::Approve(approval))).await?;
//! let Reopen::Ready(drive) = reopened.run else { unreachable!("no budget was spent") };
//! let outcome = drive.run(runtime.registry()).await?;
//! assert!(matches!(outcome.ending, Some(Ending::Finished(RunStatus::Completed))));
//! # Ok(())
//! # }
//! ```
//!
//! A run whose process died is taken up the same way: [`heddle_store::session::check_resume`]
//! (or, for a server's adoption, [`heddle_store::session::inspect`]) reads it, and
//! [`Runtime::reopen`] recovers it by the crash table: recorded results are fed
//! downstream, never run again; a started invocation runs again only when its node is
//! retry-safe, else the run pauses for a person to reconcile: a resume of that pause
//! offers the work again, or records their answer instead
//! ([`durable::reconcile::reconciliation`]: it completed with the outputs they supply,
//! or it is skipped) and runs on without running it.
//!
//! # Watching a run
//!
//! Every step of a run is a typed event on one stream: subscribe before the start to see
//! them all. [`Drive::run`] is [`Drive::prepare`], [`Prepared::start`] and
//! [`Running::finish`] in one call; taken apart, a caller can watch the events, feed
//! streaming inputs and stop the run ([`Control`]):
//!
//! ```
//! use heddle_runtime::{Drive, EventKind, GraphDoc, NodeStatus, Overrides, Runtime, Settings};
//!
//! const ONE: &str = r#"{"format": "heddle.graph", "version": 1,
//!   "nodes": [
//!     {"id": "one", "type": "heddle.constant", "properties": {"value": 1}},
//!     {"id": "out", "type": "heddle.output"}],
//!   "edges": [{"source": "one", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let runtime = Runtime::load(Settings::load(&Overrides::default())?, None).await?;
//! let plan = runtime.plan(&GraphDoc::parse(ONE, "one.json")?, "one.json")?;
//! let prepared = Drive::in_memory(plan, runtime.options(Default::default(), None))
//!     .prepare(runtime.registry())
//!     .await?;
//! let mut events = prepared.subscribe();
//! let running = prepared.start();
//! let finished = running.finish().await;
//! let mut completed = Vec::new();
//! while let Some(event) = events.next().await {
//!     if let EventKind::Node { node_id, status: NodeStatus::Completed, .. } = &event.kind {
//!         completed.push(node_id.clone());
//!     }
//! }
//! completed.sort();
//! assert_eq!(completed, ["one", "out"]);
//! assert_eq!(finished.exit(), heddle_runtime::Exit::Ok);
//! # Ok(())
//! # }
//! ```
//!
//! # Core concepts
//!
//! - [`Settings`]: every setting, resolved once from what the caller overrides
//!   ([`Overrides`]: a command line's flags) over `heddle.toml` over the defaults, and
//!   checked before anything starts. Each crate owns its section's schema.
//! - [`Runtime`]: the node registry (native built-ins, WASM packages pinned by digest,
//!   code nodes in Docker or subprocesses) and the options every run takes from it, its
//!   secret set among them: every value it could come to hold is registered before its
//!   first event, so masking covers the first escalation, error and log line.
//! - [`Drive`]: the one run driver, in memory ([`Drive::in_memory`]) or durable
//!   ([`Runtime::begin`], [`Runtime::reopen`]). Its [`Control`] cancels (the run ends
//!   cancelled), interrupts (a durable run stays resumable) or stops it (a host going
//!   away: the run is left for the next owner); a durable run is held to its time limit
//!   on a clock that starts when this process took it.
//! - [`durable`]: what a new durable run records, a stored run planned again, gates
//!   answered; the store's side is [`heddle_store`] ([`heddle_store::session`]: begin,
//!   reopen, end, the crash table).
//! - [`watch`]: the watchdog, which runs a durable run in a worker process and replaces
//!   a worker that dies, within limits.
//! - What a front end shows, as JSON and as text, so another front end says what
//!   `heddle` says: inputs given as text, `NAME=VALUE` ([`inputs`]), a graph checked
//!   without running it ([`validation`]), node types ([`node_types`]), a run's report
//!   ([`run_report`]), a stored run ([`durable::show_json`], [`durable::show_text`]),
//!   what to do next after a durable run stopped ([`driver::ending_advice`]) and a
//!   watched run ([`watch::status`]).
//!
//! # What to create once, and what per run
//!
//! Create the [`Settings`] and the [`Runtime`] once per program: loading compiles (or
//! reads from the compile cache) every WASM package, and the runtime holds the engine
//! every run shares. Open a run store once ([`StoreSettings::open`]) and share it. Per
//! run: a [`Plan`](heddle_core::plan::Plan) ([`Runtime::plan`]), its options
//! ([`Runtime::options`]) and one [`Drive`]; drive each run in a task of its own, as
//! many at once as the machine takes (a server: `heddle-server`).
//!
//! # Logging and errors
//!
//! The crate logs through `tracing` (targets `heddle_runtime::*`): info for what a
//! person watching wants to know (a package compiled on first use, a watchdog's
//! workers), warnings and errors for trouble it recovered from. Operations return
//! [`Error`], whose variants tell a refused request ([`Refused`], [`ConfigError`]: the
//! caller's to correct, nothing was written) from a failure of the store, a package or
//! the kernel; [`Error::cause`] is the error to classify by.

#![warn(missing_docs)]

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
pub mod config;
pub mod driver;
pub mod durable;
pub mod error;
pub mod exit;
pub mod inputs;
pub mod node_types;
pub mod package_review;
pub mod packages;
pub mod providers;
pub mod report;
pub mod run_report;
pub mod secrets;
pub mod settings;
pub mod streams;
pub mod supervision;
pub mod telemetry;
pub mod validation;
pub mod watch;

pub use config::Config;
pub use driver::{Control, Drive, Finished, Outcome, Prepared, Running};
pub use error::{ConfigError, Error, Refused, SecretInput};
pub use exit::Exit;
pub use heddle_core::text::error_chain;
pub use heddle_core::{EventKind, GraphDoc, NodeStatus, RunResult, RunStatus, Value};
pub use heddle_store::session::Ending;
pub use providers::{Runtime, compose, composed_types, graph_types};
pub use settings::{Overrides, ServeOverrides, Settings, StoreSettings, Supervise};

/// The tokio runtime runs are driven on: `threads` workers (`None`: one per core); 1 is
/// a current-thread runtime, so a measurement with one thread sees the scheduler
/// without any cross-thread wake-ups.
pub fn tokio_runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all().thread_name("heddle").build()
}
