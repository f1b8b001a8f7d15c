//! `heddle validate GRAPH`: plans the graph and reports every problem at once
//! ([`heddle_runtime::validation`]).

use heddle_runtime::validation::{Verdict, graph_node_line};

use crate::cli::ValidateArgs;
use crate::exit::{Exit, classify};

pub fn run(args: ValidateArgs) -> anyhow::Result<Exit> {
    let rt = heddle_runtime::tokio_runtime(None)?;
    let graph = args.graph.display().to_string();
    let doc = match heddle_core::GraphDoc::load(&args.graph).map_err(anyhow::Error::from) {
        Ok(doc) => doc,
        Err(e) if args.json => {
            let v = Verdict::unreadable(graph, crate::exit::bounded(&format!("{e:#}")));
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(classify(&e));
        }
        Err(e) => return Err(e),
    };
    let (_runtime, planned) = super::load_and_plan(&rt, args.env.settings()?, &doc, &args.graph)?;
    match planned {
        Ok(plan) if args.json => {
            let v = Verdict::valid(graph, &doc, &plan);
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(Exit::Ok)
        }
        Ok(plan) => {
            for w in &plan.warnings {
                eprintln!("warning: {w}");
            }
            println!(
                "{graph}: valid ({} nodes, {} edges)",
                plan.nodes.len(),
                plan.edges.len()
            );
            for g in &plan.graphs {
                println!("{}", graph_node_line(g));
            }
            Ok(Exit::Ok)
        }
        Err(err) if args.json => {
            let v = Verdict::invalid(graph, &doc, &err.issues);
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(Exit::Invalid)
        }
        Err(err) => Err(anyhow::Error::from(err).context(graph)),
    }
}
