//! Heddle node packages: WebAssembly components behind the `heddle:node` WIT contract,
//! run in a sandbox that grants nothing the operator did not write down.
//!
//! - [`PackageStore`]: install (validate + copy + pin sha256 in `heddle.lock`), list,
//!   verify, remove, load (refusing changed bytes).
//! - [`WasmHost`]: the wasmtime engine (fuel, epoch ticker, pooling allocator with
//!   fallback) and the on-disk compile cache keyed by digest and engine configuration.
//! - [`WasmProvider`]: the kernel's `NodeProvider` for every loaded package.
//! - [`WasmConfig`]: the operator's `[wasm]`, `[packages.<name>]` and `[secrets]` sections.

// `NodeError` is the kernel's seam type, returned by value across the whole executor
// interface; boxing it here alone would only add conversions.
#![allow(clippy::result_large_err)]

mod bindings;
mod boundary;
mod budget;
pub mod config;
mod deadline;
mod engine;
pub mod error;
mod executor;
mod failure;
pub mod manifest;
mod package;
mod sandbox;
pub mod store;
mod text;

use std::path::PathBuf;

pub use config::{
    DirGrant, DirMode, EngineSettings, PackageGrant, Sandbox, SecretsConfig, WasmConfig,
};
pub use engine::{EPOCH_TICK, WasmHost};
pub use error::PackageError;
pub use executor::{WasmExecutor, WasmProvider};
pub use manifest::{MANIFEST_FILE, Manifest};
pub use package::{WIT_SUPPORTED, WIT_VERSION, WasmPackage, wit_version_supported};
pub use store::{LOCKFILE, LockEntry, Lockfile, PackageStore, VerifyReport};

/// Names of the first-party packages built with the host.
pub const FIRST_PARTY: &[&str] = &["std", "files"];

/// Where the build placed the first-party package directories (`<dir>/<name>/`), each
/// holding a `heddle-package.toml` and the component. Overridable with
/// `HEDDLE_FIRST_PARTY_DIR` at run time (for relocated installs).
pub fn first_party_packages_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HEDDLE_FIRST_PARTY_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    PathBuf::from(env!("HEDDLE_FIRST_PARTY_DIR"))
}

/// The first-party package directories, checked to exist.
pub fn first_party_package_dirs() -> Result<Vec<PathBuf>, PackageError> {
    let root = first_party_packages_dir();
    FIRST_PARTY
        .iter()
        .map(|n| {
            let d = root.join(n);
            if d.join(MANIFEST_FILE).is_file() {
                Ok(d)
            } else {
                Err(PackageError::MissingManifest {
                    path: d.join(MANIFEST_FILE),
                })
            }
        })
        .collect()
}
