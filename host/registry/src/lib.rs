//! Heddle node packages from OCI registries.
//!
//! `heddle package add oci://REGISTRY/NAMESPACE/NAME:VERSION` (or `@sha256:…`, or wkg's
//! `namespace:name@version`) fetches a package published in the CNCF "Wasm OCI
//! artifact" layout ([`artifact`]), checks the layout and every digest while the bytes
//! stream in ([`client`]), and stages a package directory for
//! `heddle_wasm::PackageStore` to install and pin, with where it came from
//! ([`heddle_wasm::PackageSource`]). `heddle package push DIR REF` writes the same
//! layout, so `wkg oci pull` fetches what Heddle pushed and Heddle adds what `wkg oci
//! push` published. References resolve as wkg resolves them ([`resolve`]).

pub mod artifact;
pub mod client;
pub mod error;
pub mod fetch;
pub mod reference;
pub mod resolve;
pub mod sign;

pub use error::{ErrorClass, RegistryError};
pub use fetch::{FetchOptions, Fetched, Pushed, fetch, fetch_pinned, push, sign};
pub use reference::{OciRef, PackageRef};
pub use resolve::RegistrySettings;
pub use sign::{SigningKey, Trust, TrustSettings};
