//! The first-party packages (`std`, `files`), embedded in the host at build time: an
//! installed or copied binary has them without the build tree it came from.

use std::path::PathBuf;

use crate::engine::WasmHost;
use crate::error::PackageError;
use crate::package::WasmPackage;

/// Names of the first-party packages built with the host. Reserved: no installed
/// package may take one (its grants would be the first-party package's).
pub const FIRST_PARTY: &[&str] = &["std", "files"];

/// One embedded package: its manifest text and component bytes.
pub(crate) struct Embedded {
    pub name: &'static str,
    pub manifest: &'static str,
    pub component: &'static [u8],
}

/// Written by the build script; empty when the build skipped the plugins
/// (`HEDDLE_SKIP_PLUGIN_BUILD=1` with nothing built).
static EMBEDDED: &[Embedded] = include!(env!("HEDDLE_EMBEDDED_PACKAGES"));

/// Where the build assembled the first-party package directories (`<dir>/<name>/`, a
/// manifest and the component), inside the build tree. The host never reads them (it
/// embeds the same files); tests and tools that need the package files do.
pub fn first_party_packages_dir() -> PathBuf {
    PathBuf::from(env!("HEDDLE_FIRST_PARTY_DIR"))
}

/// Loads (compiles or reads from the compile cache) every embedded first-party package.
/// Fails when the host was built without them.
pub(crate) async fn load(host: &WasmHost) -> Result<Vec<WasmPackage>, PackageError> {
    if EMBEDDED.len() < FIRST_PARTY.len() {
        return Err(PackageError::FirstPartyMissing {
            built: EMBEDDED.iter().map(|e| e.name).collect(),
        });
    }
    let mut out = Vec::with_capacity(EMBEDDED.len());
    for e in EMBEDDED {
        out.push(WasmPackage::load_embedded(host, e.name, e.manifest, e.component).await?);
    }
    Ok(out)
}
