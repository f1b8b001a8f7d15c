//! Where a node package came from, when it came from a registry.
//!
//! One type for the three places that pin it: the package store's lockfile
//! (`[package.source]`), a durable run's stored package list (so a resume on another
//! host can fetch exactly the bytes the run started with), and the registry client that
//! fills it in. It lives here, below all three, so they cannot drift apart.

use serde::{Deserialize, Serialize};

/// What was fetched from a registry, pinned: enough to fetch exactly the same bytes
/// again (the manifest digest) and to check them (the layer digest is the component's
/// sha256, the one grants pin with `sha256 = …`).
///
/// Unknown fields are ignored rather than refused: a run stored by a newer Heddle that
/// records more about a source must still read back here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageSource {
    /// The reference as the user typed it (`oci://…:1.0.0`, `acme:text@1.0.0`).
    pub reference: String,
    /// The OCI registry it resolved to (`host[:port]`).
    pub registry: String,
    /// The repository in that registry.
    pub repository: String,
    /// `sha256:…` of the OCI manifest fetched: what a re-fetch asks for.
    pub manifest_digest: String,
    /// `sha256:…` of its one layer: the component bytes.
    pub layer_digest: String,
    /// The trusted publisher whose signature was checked, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}
