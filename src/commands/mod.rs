//! One module per subcommand.

pub mod bench;
pub mod images;
pub mod nodes;
pub mod package;
pub mod run;
pub mod runs;
pub mod validate;
pub mod worker;

use heddle_core::GraphDoc;
use heddle_core::plan::{IssueKind, Plan, ValidationError};

use crate::cli::EnvArgs;
use crate::providers::{Env, graph_types};

/// Loads what `doc` uses and plans it. A graph naming a type that nothing loaded
/// declares is planned again with every package there is, so the "did you mean" hint can
/// name a type of a package the graph did not otherwise need (only packages a graph uses
/// are loaded, and compiled on first use).
pub(crate) fn load_and_plan(
    rt: &tokio::runtime::Runtime,
    args: &EnvArgs,
    doc: &GraphDoc,
) -> anyhow::Result<(Env, Result<Plan, ValidationError>)> {
    let env = rt.block_on(Env::load(args, Some(&graph_types(doc))))?;
    match heddle_core::plan::plan(doc, &env.registry) {
        Err(e)
            if e.issues
                .iter()
                .any(|i| i.kind == IssueKind::UnknownNodeType) =>
        {
            let all = rt.block_on(Env::load(args, None))?;
            let again = heddle_core::plan::plan(doc, &all.registry);
            Ok((all, again))
        }
        planned => Ok((env, planned)),
    }
}
