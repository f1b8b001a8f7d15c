//! One module per subcommand.

pub mod bench;
pub mod images;
pub mod nodes;
pub mod package;
pub mod run;
pub mod runs;
pub mod serve;
pub mod validate;
pub mod watch;
pub mod worker;

use std::path::Path;

use heddle_core::GraphDoc;
use heddle_core::plan::{IssueKind, Plan, ValidationError};
use heddle_runtime::{Runtime, Settings, compose, composed_types};

/// Loads what `doc` (read from the file `path`) and the documents its graph nodes
/// include use, and plans it. A graph naming a type that nothing loaded declares is
/// planned again with every package there is, so the "did you mean" hint can name a
/// type of a package the graph did not otherwise need (only packages a graph uses are
/// loaded, and compiled on first use).
pub(crate) fn load_and_plan(
    rt: &tokio::runtime::Runtime,
    settings: Settings,
    doc: &GraphDoc,
    path: &Path,
) -> anyhow::Result<(Runtime, Result<Plan, ValidationError>)> {
    let comp = compose(&settings, doc, Some(path));
    let types = composed_types(doc, &comp);
    let runtime = rt.block_on(Runtime::load(settings.clone(), Some(&types)))?;
    match heddle_core::plan::plan_with(doc, runtime.registry(), &comp) {
        Err(e)
            if e.issues
                .iter()
                .any(|i| i.kind == IssueKind::UnknownNodeType) =>
        {
            let all = rt.block_on(Runtime::load(settings, None))?;
            let again = heddle_core::plan::plan_with(doc, all.registry(), &comp);
            Ok((all, again))
        }
        planned => Ok((runtime, planned)),
    }
}
