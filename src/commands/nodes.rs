//! `heddle nodes`: every node type the registry knows, with its declaration
//! ([`heddle_runtime::node_types`]).

use std::fmt::Write as _;

use heddle_core::NodeDecl;
use heddle_runtime::node_types::describe;

use crate::cli::NodesArgs;
use crate::exit::Exit;
use heddle_runtime::Runtime;

pub fn run(args: NodesArgs) -> anyhow::Result<Exit> {
    let rt = heddle_runtime::tokio_runtime(None)?;
    let env = rt.block_on(Runtime::load(args.env.settings()?, None))?;
    let decls: Vec<_> = env
        .registry()
        .declarations()
        .into_iter()
        .filter(|d| {
            args.prefix
                .as_deref()
                .is_none_or(|p| d.type_name.starts_with(p))
        })
        .collect();
    if args.json {
        let plain: Vec<&NodeDecl> = decls.iter().map(|d| d.as_ref()).collect();
        println!("{}", serde_json::to_string_pretty(&plain)?);
    } else {
        let mut out = String::new();
        for d in &decls {
            describe(&mut out, d);
        }
        let _ = writeln!(out, "{} node types", decls.len());
        print!("{out}");
    }
    Ok(Exit::Ok)
}
