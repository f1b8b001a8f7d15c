//! The first-party packages (`std`, `files`, `http`), embedded in the host at build time: an
//! installed or copied binary has them without the build tree it came from.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::engine::WasmHost;
use crate::error::PackageError;
use crate::package::WasmPackage;

/// Names of the first-party packages built with the host. Reserved: no installed
/// package may take one (its grants would be the first-party package's).
pub const FIRST_PARTY: &[&str] = &["std", "files", "http"];

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
    load_providing(host, None).await
}

/// Loads the first-party packages that may declare one of the `wanted` node types (all
/// of them when `None`). A first-party package's node types are named `<package>.…`
/// (a test holds them to it), so which one a graph needs is known before compiling any:
/// a run pays only for the ones its graph uses.
pub(crate) async fn load_providing(
    host: &WasmHost,
    wanted: Option<&BTreeSet<String>>,
) -> Result<Vec<WasmPackage>, PackageError> {
    if EMBEDDED.len() < FIRST_PARTY.len() {
        return Err(PackageError::FirstPartyMissing {
            built: EMBEDDED.iter().map(|e| e.name).collect(),
        });
    }
    let mut out = Vec::with_capacity(EMBEDDED.len());
    for e in EMBEDDED {
        let used = wanted.is_none_or(|w| {
            w.iter()
                .any(|t| t.strip_prefix(e.name).is_some_and(|r| r.starts_with('.')))
        });
        if used {
            out.push(WasmPackage::load_embedded(host, e.name, e.manifest, e.component).await?);
        }
    }
    Ok(out)
}
