//! One module per subcommand.

pub mod bench;
pub mod gates;
pub mod images;
pub mod nodes;
pub mod package;
pub mod run;
pub mod runs;
pub mod validate;

use std::path::Path;

use anyhow::Context as _;
use heddle_core::GraphDoc;
use heddle_core::plan::{Plan, ValidationError};
use heddle_kernel::Registry;

/// Reads a graph file; a missing file or malformed JSON is a usage error naming the
/// file (and line:column).
pub fn load_graph(path: &Path) -> anyhow::Result<GraphDoc> {
    Ok(GraphDoc::load(path)?)
}

/// Plans a graph against the registry; the error lists every problem.
pub fn plan_graph(doc: &GraphDoc, registry: &Registry, path: &Path) -> anyhow::Result<Plan> {
    heddle_core::plan::plan(doc, registry)
        .map_err(|e: ValidationError| anyhow::Error::from(e))
        .with_context(|| format!("{}", path.display()))
}
