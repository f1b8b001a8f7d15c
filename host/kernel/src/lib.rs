//! Heddle's actor kernel: runs a planned graph natively on tokio.
//!
//! The kernel never names wasmtime, bollard or SQLite. WASM packages, code nodes and the
//! durable store plug in through [`executor::NodeProvider`] / [`executor::Executor`] and
//! the event stream.

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
pub use runtime::{EventStream, InboxLimits, KernelError, Run, RunHandle, RunOptions, run_graph};
