//! A program that embeds Heddle, using only `heddle-runtime`'s public API: it runs a
//! durable graph whose nodes are WASM components (the first-party `files` and `std`
//! packages), and when it is killed part-way, the next start recovers the run from its
//! log and finishes it without repeating what was done.
//!
//! Run it in a directory holding a `heddle.toml` that grants the `files` package a
//! `/data` directory (see `README.md`):
//!
//! ```text
//! embed          # recovers the last unfinished run of this graph, else starts one
//! ```
//!
//! It prints each node's completion on stderr as it happens (the run's events) and the
//! run's outputs on stdout. Its exit code is the `heddle` command's: 0 completed, 1
//! failed, 4 paused (a node that is not retry-safe started before the crash and whether
//! its effect happened is unknown: a person decides, `heddle runs resume`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use heddle_runtime::durable::{self, Reopen, Reopening, RunState};
use heddle_runtime::{
    Ending, EventKind, Exit, GraphDoc, NodeStatus, Overrides, RunStatus, Runtime, Settings, Value,
    graph_types,
};

/// The graph's name in the run store: how a start finds its unfinished runs.
const NAME: &str = "embed.json";

/// Writes a line, reads the file back, and appends the line it read, upper-cased. `w1`
/// and `w2` are not retry-safe (they append to a file); `read` and `shout` are.
const GRAPH: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "line", "type": "heddle.input", "properties": {"name": "line", "type": "str"}},
    {"id": "w1", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "read", "type": "files.read_text"},
    {"id": "shout", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "w2", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "shouted", "type": "heddle.output"},
    {"id": "bytes", "type": "heddle.output"}],
  "edges": [
    {"source": "line", "sourceHandle": "value", "target": "w1", "targetHandle": "text"},
    {"source": "w1", "sourceHandle": "path", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "shout", "targetHandle": "text"},
    {"source": "shout", "sourceHandle": "text", "target": "w2", "targetHandle": "text"},
    {"source": "shout", "sourceHandle": "text", "target": "shouted", "targetHandle": "value"},
    {"source": "w2", "sourceHandle": "bytes", "target": "bytes", "targetHandle": "value"}]}"#;

#[tokio::main]
async fn main() -> ExitCode {
    match embed().await {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("error: {}", heddle_runtime::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn embed() -> Result<Exit, heddle_runtime::Error> {
    // Created once: the settings (./heddle.toml) and the runtime (the WASM engine, the
    // packages the graph uses, every other node type).
    let settings = Settings::load(&Overrides::default())?;
    let doc = GraphDoc::parse(GRAPH, NAME)?;
    let runtime = Runtime::load(settings, Some(&graph_types(&doc))).await?;
    let store = runtime.settings().store.open()?;

    // An unfinished run of this graph is recovered from its log; else a new one starts.
    let unfinished = durable::list_states(&*store)?
        .into_iter()
        .rev()
        .find(|(run, state)| run.graph_name == NAME && *state == RunState::Interrupted);
    let drive = match unfinished {
        Some((run, _)) => {
            let resumption = durable::check_resume(&*store, &run.run_id, None)?;
            let doc = durable::stored_graph(&resumption.header)?;
            let reopened = runtime.reopen(store, resumption, &doc, None).await?;
            if reopened.how == Reopening::Recover {
                eprintln!("recovering run {}", run.run_id);
            }
            match reopened.run {
                Reopen::Ready(drive) => *drive,
                Reopen::Ended(ending) => return Ok(report(&run.run_id, &ending)),
            }
        }
        None => {
            let plan = runtime.plan(&doc, NAME)?;
            let inputs = BTreeMap::from([("line".to_string(), Value::from("one\n"))]);
            let opts = runtime.options(inputs, None);
            let budget = runtime.settings().store.budget(None, None)?;
            let record = runtime.new_run(NAME.into(), GRAPH.into(), &plan, &opts, budget)?;
            let (header, drive) = runtime.begin(store, record, plan, opts).await?;
            eprintln!("started run {}", header.run_id);
            drive
        }
    };
    let run_id = drive
        .session()
        .map(|s| s.run_id.clone())
        .unwrap_or_default();

    // Every event as it happens; here, each node's completion.
    let prepared = drive.prepare(runtime.registry()).await?;
    let mut events = prepared.subscribe();
    let watcher = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let EventKind::Node {
                node_id,
                status: NodeStatus::Completed,
                ..
            } = &event.kind
            {
                eprintln!("node {node_id} completed");
            }
        }
    });
    let finished = prepared.start().finish().await;
    let _ = watcher.await;
    for (name, values) in &finished.result.outputs {
        for v in values {
            match v.as_str() {
                Some(text) => println!("{name}: {}", text.trim_end()),
                None => println!("{name}: {}", v.to_json()),
            }
        }
    }
    let ending = finished.record().await?;
    Ok(match ending {
        Some(ending) => report(&run_id, &ending),
        None => Exit::Failed,
    })
}

/// Says how the run ended; its exit code.
fn report(run: &str, ending: &Ending) -> Exit {
    match ending {
        Ending::Finished(RunStatus::Completed) => eprintln!("run {run} completed"),
        Ending::Finished(status) => eprintln!("run {run} ended {status:?}"),
        Ending::Paused { reason, .. } => eprintln!("run {run} paused: {reason:?}"),
        Ending::Exhausted(e) => eprintln!("run {run} ended: {e}"),
    }
    heddle_runtime::driver::ending_exit(ending)
}
