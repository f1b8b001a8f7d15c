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

use heddle_core::GraphDoc;
use heddle_core::plan::{IssueKind, Plan, ValidationError};
use heddle_runtime::{Runtime, Settings, graph_types};

/// Loads what `doc` uses and plans it. A graph naming a type that nothing loaded
/// declares is planned again with every package there is, so the "did you mean" hint can
/// name a type of a package the graph did not otherwise need (only packages a graph uses
/// are loaded, and compiled on first use).
pub(crate) fn load_and_plan(
    rt: &tokio::runtime::Runtime,
    settings: Settings,
    doc: &GraphDoc,
) -> anyhow::Result<(Runtime, Result<Plan, ValidationError>)> {
    let runtime = rt.block_on(Runtime::load(settings.clone(), Some(&graph_types(doc))))?;
    match heddle_core::plan::plan(doc, runtime.registry()) {
        Err(e)
            if e.issues
                .iter()
                .any(|i| i.kind == IssueKind::UnknownNodeType) =>
        {
            let all = rt.block_on(Runtime::load(settings, None))?;
            let again = heddle_core::plan::plan(doc, all.registry());
            Ok((all, again))
        }
        planned => Ok((runtime, planned)),
    }
}
