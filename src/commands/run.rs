//! `heddle run GRAPH`: checks the request (inputs, `--stream`, the supervisor and its
//! bounds, a durable run's budget) before anything runs, then hands the run to
//! [`crate::execute`], or to a watchdog with `--watchdog`.

use std::sync::Arc;

use heddle_kernel::supervisor::Supervisor;
use heddle_runtime::supervision::{self, Decider, DeciderBounds};
use heddle_runtime::{Overrides, Settings};

use crate::cli::RunArgs;
use crate::execute::{Execution, execute};
use crate::exit::Exit;
use heddle_runtime::inputs;

pub fn run(args: RunArgs) -> anyhow::Result<Exit> {
    // Everything that can be wrong with the request is checked before anything runs, so
    // a usage mistake never costs a started node.
    let raw_inputs = args
        .inputs
        .iter()
        .map(|a| inputs::parse_arg(a))
        .collect::<Result<Vec<_>, _>>()?;
    let rt = heddle_runtime::tokio_runtime(None)?;
    let doc = heddle_core::GraphDoc::load(&args.graph)?;
    let settings = Settings::load(&Overrides {
        node_timeout_ms: args.node_timeout_ms,
        durable: args.durable,
        ..args.env.overrides()
    })?;
    crate::console::set_format(settings.telemetry.log_format);
    let (runtime, planned) = super::load_and_plan(&rt, settings, &doc, &args.graph)?;
    let graph = args.graph.display().to_string();
    let plan = match planned {
        Ok(plan) => plan,
        // A script reading `--json` gets an object for a refused graph too, with every
        // problem as data, instead of nothing on stdout.
        Err(err) if args.json => {
            let summary = crate::exit::bounded(&format!("{graph}: {err}"));
            let report =
                heddle_runtime::run_report::InvalidReport::new(&graph, summary, &err.issues);
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(Exit::Invalid);
        }
        Err(err) => return Err(anyhow::Error::from(err).context(graph)),
    };
    let values = inputs::resolve(&plan, &graph, &raw_inputs)?;
    if let Some(name) = &args.stream {
        match plan.input(name) {
            Ok(s) if s.streaming => {}
            Ok(s) => {
                return Err(crate::usage!(
                    "--stream {name}: input `{name}` (node {}) is not a streaming input; set \"streaming\": true in its properties",
                    s.node_id
                ));
            }
            Err(_) => {
                return Err(crate::usage!(
                    "--stream {name}: {graph} has no input of that name"
                ));
            }
        }
    }

    let supervisor = supervisor(&args, &runtime.settings().config)?;
    let opts = runtime.options(values, supervisor);
    if args.watchdog.watchdog {
        return crate::commands::watch::start(&args, &runtime, &plan, &opts);
    }
    let store = &runtime.settings().store;
    if !store.durable && (args.max_dispatches.is_some() || args.time_limit_ms.is_some()) {
        return Err(crate::usage!(
            "--max-dispatches and --time-limit-ms bound a durable run: add --durable (or [store] durable = true)"
        ));
    }
    let drive = if store.durable {
        let budget = store.budget(args.max_dispatches, args.time_limit_ms)?;
        let bytes = heddle_runtime::durable::read_graph(&args.graph)?;
        let run = runtime.new_run(graph.clone(), bytes, &plan, &opts, budget)?;
        let (header, drive) = runtime.blocking_begin(store.open()?, &run, plan, opts)?;
        eprintln!("durable run {} (store {})", header.run_id, store.location());
        drive
    } else {
        // A traced run's span names the graph's digest, as a durable run's does.
        let bytes = runtime
            .telemetry()
            .and_then(|_| heddle_runtime::durable::read_graph(&args.graph).ok());
        runtime.in_memory(plan, opts, &graph, bytes.as_deref())
    };
    execute(
        rt,
        Execution {
            graph,
            registry: runtime.registry(),
            drive,
            json: args.json,
            stream: args.stream.as_deref(),
            worker_store: None,
        },
    )
}

/// The supervisor handle asked for on the command line, wrapped in its bounds; `None`
/// (no supervision, failures fail) unless `--policy`, `--replay` or `--supervise` is given.
fn supervisor(
    args: &RunArgs,
    config: &heddle_runtime::Config,
) -> anyhow::Result<Option<Arc<dyn Supervisor>>> {
    let decider = match (&args.policy, &args.replay) {
        (Some(p), _) => Decider::PolicyFile(p.clone()),
        (None, Some(r)) => Decider::Replay(r.clone()),
        (None, None) if args.supervise => Decider::Llm {
            model: args.supervisor_model.clone(),
            endpoint: None,
            cost_cap_usd: args.supervisor_cost_cap,
        },
        (None, None) => {
            if args.max_decisions.is_some() || args.max_retries.is_some() {
                return Err(crate::usage!(
                    "--max-decisions and --max-retries bound a supervisor: add --policy FILE, --replay REPORT or --supervise"
                ));
            }
            return Ok(None);
        }
    };
    let bounds = DeciderBounds {
        max_decisions: args.max_decisions,
        max_retries_per_node: args.max_retries,
    };
    Ok(Some(supervision::supervisor(config, &decider, bounds)?))
}
