//! Heddle node packages: WebAssembly components behind the `heddle:node` WIT contract,
//! run in a sandbox that grants nothing the operator did not write down.
//!
//! - [`PackageStore`]: install (validate + copy + pin sha256 in `heddle.lock`), list,
//!   verify, remove, load (refusing changed bytes).
//! - [`WasmHost`]: the wasmtime engine (fuel, epoch ticker, pooling allocator with
//!   fallback) and the on-disk compile cache keyed by digest and engine configuration.
//! - [`WasmProvider`]: the kernel's `NodeProvider` for every loaded package.
//! - [`WasmConfig`]: the operator's `[wasm]`, `[packages.<name>]` and `[secrets]` sections.
//! - [`grants`]: what a package is granted, narrowed per node, judged against its
//!   requests, and given to the store it runs in.

// `NodeError` is the kernel's seam type, returned by value across the whole executor
// interface; boxing it here alone would only add conversions.
#![allow(clippy::result_large_err)]

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
mod bindings;
mod boundary;
mod budget;
pub mod config;
mod deadline;
mod engine;
pub mod error;
mod executor;
mod failure;
mod first_party;
mod fs_quota;
pub mod grants;
mod host_state;
mod host_v0_2;
mod lockfile;
pub mod manifest;
mod net;
mod package;
mod provider;
mod quota;
mod signature;
pub mod store;
mod text;
mod value;

pub use config::{EngineSettings, SecretsConfig, WasmConfig};
pub use engine::{EPOCH_TICK, WasmHost};
pub use error::PackageError;
pub use executor::WasmExecutor;
pub use first_party::{FIRST_PARTY, first_party_packages_dir};
pub use grants::{DirGrant, DirMode, NetGrant, NetworkAuth, NodeGrant, PackageGrant};
pub use lockfile::{LOCKFILE, LockEntry, Lockfile, PackageSource};
pub use manifest::{MANIFEST_FILE, Manifest};
pub use package::{WIT_SUPPORTED, WIT_VERSION, WasmPackage, wit_version_supported};
pub use provider::WasmProvider;
pub use store::{PackageStore, VerifyReport};
