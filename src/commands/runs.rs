//! Durable runs from the command line: `heddle run --durable` records a run in the run
//! store, and `heddle runs list | show | resume | cancel` work on what is recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use heddle_core::plan::Plan;
use heddle_core::{GraphDoc, PauseReason};
use heddle_kernel::runtime::RunOptions;
use heddle_store::session::{self, Ending, Session};
use heddle_store::status::{Outcome, RunView};
use heddle_store::{
    Budget, NewRun, RunHeader, RunState, RunStore, RunSummary, SqliteStore, StoreError,
};
use serde::Deserialize;

use crate::cli::{RunsArgs, RunsCommand};
use crate::config::Config;
use crate::exit::Exit;
use crate::providers::Env;

/// `[store]` in heddle.toml.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// The run store file (default `.heddle/runs.db`), relative to the config file.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Make every `heddle run` durable, as if `--durable` were given.
    #[serde(default)]
    pub durable: bool,
    /// Budget of every durable run (the flags of the same names override it).
    #[serde(default)]
    pub max_dispatches: Option<u64>,
    #[serde(default)]
    pub time_limit_ms: Option<u64>,
}

impl StoreSection {
    pub fn load(config: &Config) -> anyhow::Result<StoreSection> {
        let mut s: StoreSection = config.section("store")?.unwrap_or_default();
        s.path = Some(match s.path {
            Some(p) => config.resolve(&p),
            None => PathBuf::from(heddle_store::DEFAULT_PATH),
        });
        Ok(s)
    }

    pub(crate) fn path(&self) -> &Path {
        self.path
            .as_deref()
            .unwrap_or(Path::new(heddle_store::DEFAULT_PATH))
    }

    pub(crate) fn open(&self) -> Result<Arc<dyn RunStore>, StoreError> {
        Ok(Arc::new(SqliteStore::open(self.path())?))
    }

    /// Opens a store that must already exist: reading or resuming never creates one.
    fn open_existing(&self) -> anyhow::Result<Option<Arc<dyn RunStore>>> {
        if !self.path().exists() {
            return Ok(None);
        }
        Ok(Some(self.open()?))
    }
}

/// Records a new durable run and prints its id before anything runs.
pub fn begin(
    store: &StoreSection,
    env: &Env,
    graph: &Path,
    plan: &Plan,
    opts: &RunOptions,
    budget: Budget,
) -> anyhow::Result<Session> {
    let run = new_run(env, graph, plan, opts, budget)?;
    let (header, session) = session::begin(store.open()?, &run)?;
    eprintln!(
        "durable run {} (store {})",
        header.run_id,
        store.path().display()
    );
    Ok(session)
}

/// What a new durable run records: the graph's exact bytes, its plan, inputs, package
/// digests and limits.
pub(crate) fn new_run(
    env: &Env,
    graph: &Path,
    plan: &Plan,
    opts: &RunOptions,
    budget: Budget,
) -> anyhow::Result<NewRun> {
    let graph_bytes =
        std::fs::read(graph).map_err(|e| crate::usage!("cannot read {}: {e}", graph.display()))?;
    Ok(record(
        env,
        graph.display().to_string(),
        graph_bytes,
        plan,
        opts,
        budget,
    ))
}

/// [`new_run`] for a document already in memory (the server's API), named `graph_name`.
pub(crate) fn record(
    env: &Env,
    graph_name: String,
    graph_bytes: Vec<u8>,
    plan: &Plan,
    opts: &RunOptions,
    budget: Budget,
) -> NewRun {
    NewRun {
        graph_name,
        graph_bytes,
        plan: plan_summary(plan),
        inputs: opts.inputs.clone(),
        // Secrets reach nodes through the operator's grants, by name, on every start;
        // no secret value is ever part of a run.
        secrets: Vec::new(),
        packages: used_packages(plan, &env.package_digests),
        limits: limits(opts, budget),
    }
}

/// A run's limits as recorded: the node timeout and the budget ([`Budget::of`] reads
/// it back).
fn limits(opts: &RunOptions, budget: Budget) -> serde_json::Value {
    let mut v = serde_json::to_value(budget).unwrap_or_default();
    v["node_timeout_ms"] = serde_json::json!(opts.node_timeout.map(|t| t.as_millis() as u64));
    v
}

impl StoreSection {
    /// The budget of a new durable run: the flags, else `[store]`. A budget is kept only
    /// by a durable run, so asking for one otherwise is refused rather than ignored.
    pub fn budget(
        &self,
        durable: bool,
        max_dispatches: Option<u64>,
        time_limit_ms: Option<u64>,
    ) -> anyhow::Result<Budget> {
        if !durable && (max_dispatches.is_some() || time_limit_ms.is_some()) {
            return Err(crate::usage!(
                "--max-dispatches and --time-limit-ms bound a durable run: add --durable (or [store] durable = true)"
            ));
        }
        if self.time_limit_ms == Some(0) {
            return Err(crate::usage!(
                "[store] time_limit_ms = 0: a run needs at least 1 ms"
            ));
        }
        Ok(Budget {
            max_dispatches: max_dispatches.or(self.max_dispatches),
            time_limit_ms: time_limit_ms.or(self.time_limit_ms),
        })
    }
}

/// What a plan is, for the record and for `heddle runs show`.
fn plan_summary(plan: &Plan) -> serde_json::Value {
    let nodes: Vec<_> = plan
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "id": &*n.id,
                "type": &*n.node_type,
                "retry_safe": n.decl.retry_safe,
                "origin": n.decl.origin,
            })
        })
        .collect();
    serde_json::json!({ "nodes": nodes, "edges": plan.edges.len() })
}

/// The packages (by name, with their sha256) whose node types the plan uses.
fn used_packages(plan: &Plan, digests: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    plan.nodes
        .iter()
        .filter_map(|n| {
            let name = n.decl.origin.strip_prefix("package:")?;
            let name = name.split('@').next().unwrap_or(name);
            Some((name.to_string(), digests.get(name)?.clone()))
        })
        .collect()
}

/// The exit code a planned ending will have (the README's: paused = suspended, 4; a
/// spent budget = 6).
pub fn planned_exit(planned: &session::Planned) -> Exit {
    match planned {
        session::Planned::Pause(_) => Exit::Suspended,
        session::Planned::Finish { status, .. } => Exit::for_status(*status),
        session::Planned::Exhausted(_) => Exit::Limit,
    }
}

/// Says how a durable run ended and what to do next; the exit code of the README
/// (paused = suspended, 4).
/// A run paused at gate `gate` is answered, not resumed: the message says how.
pub fn report_ending(run_id: &str, ending: &Ending, gate: Option<&str>) -> Exit {
    match ending {
        Ending::Finished(status) => Exit::for_status(*status),
        Ending::Paused { event, reason } => {
            let why = match reason {
                PauseReason::Interrupted => "interrupted".to_string(),
                PauseReason::Reconcile { occurrence } => format!(
                    "node {occurrence} started and its result was never recorded; it is not retry-safe, so whether its effect happened is unknown"
                ),
                PauseReason::Suspend { node, reason } => format!("node {node} suspended: {reason}"),
                PauseReason::Budget { detail } => detail.clone(),
            };
            match gate {
                Some(g) => eprintln!(
                    "run {run_id} paused at event {event} ({why}); approve with: heddle runs approve {run_id} {g} [--note TEXT], or reject with: heddle runs reject {run_id} {g} --note TEXT"
                ),
                None => eprintln!(
                    "run {run_id} paused at event {event} ({why}); resume with: heddle runs resume {run_id}"
                ),
            }
            Exit::Suspended
        }
        Ending::Exhausted(e) => {
            eprintln!("run {run_id} ended: {e}");
            Exit::Limit
        }
    }
}

pub fn run(args: RunsArgs) -> anyhow::Result<Exit> {
    let config = Config::load(args.env.config.as_deref())?;
    let section = StoreSection::load(&config)?;
    match args.command {
        RunsCommand::List { json } => list(&section, json),
        RunsCommand::Show { run, json } => show(&section, &run, json),
        RunsCommand::Resume {
            run,
            pause,
            json,
            watchdog,
        } => {
            if watchdog.watchdog {
                return crate::watchdog::resume(&section, &args.env, &run, pause, json, &watchdog);
            }
            // A run a watchdog supervises (or a dead one left locked) is not taken over.
            crate::watchdog::refuse_if_locked(&section, &run)?;
            resume(&section, &args.env, &run, pause, json)
        }
        RunsCommand::Status { run, json } => crate::watchdog::status::run(&section, &run, json),
        RunsCommand::Unlock { run } => crate::watchdog::status::unlock(&section, &run),
        RunsCommand::Approve {
            run,
            gate,
            note,
            json,
        } => {
            // Approving runs the run on in this process: not one a watchdog holds.
            crate::watchdog::refuse_if_locked(&section, &run)?;
            let store = existing(&section, &run)?;
            super::gates::approve(store, &args.env, &run, &gate, note, json)
        }
        RunsCommand::Reject { run, gate, note } => {
            let store = existing(&section, &run)?;
            super::gates::reject(store, &run, &gate, &note)
        }
        RunsCommand::Cancel { run } => {
            let store = existing(&section, &run)?;
            session::cancel(store, &run)?;
            eprintln!("run {run} cancelled");
            Ok(Exit::Ok)
        }
    }
}

pub(crate) fn existing(section: &StoreSection, run: &str) -> anyhow::Result<Arc<dyn RunStore>> {
    section.open_existing()?.ok_or_else(|| {
        anyhow::Error::from(StoreError::UnknownRun(run.to_string()))
            .context(format!("no run store at {}", section.path().display()))
    })
}

/// Every run with its state, folded from its log.
pub(crate) fn list_states(store: &dyn RunStore) -> Result<Vec<(RunSummary, RunState)>, StoreError> {
    let mut rows = Vec::new();
    for s in store.list()? {
        let read = store.read(&s.run_id, 0)?;
        let view = RunView::fold(&read.records, heddle_store::status::pid_alive);
        rows.push((s, view.state));
    }
    Ok(rows)
}

/// A run in a listing, as `runs list --json` and the server's API give it.
pub(crate) fn list_json(s: &RunSummary, state: RunState) -> serde_json::Value {
    serde_json::json!({
        "run_id": s.run_id, "created_ms": s.created_ms, "graph": s.graph_name,
        "state": state, "records": s.records,
    })
}

/// One run in full, as `runs show --json` and the server's API give it.
pub(crate) fn show_json(header: &RunHeader, view: &RunView) -> serde_json::Value {
    serde_json::json!({
        "run_id": header.run_id,
        "created_ms": header.created_ms,
        "graph": header.run.graph_name,
        "graph_sha256": header.graph_sha256,
        "inputs": header.run.inputs,
        "packages": header.run.packages,
        "limits": header.run.limits,
        "plan": header.run.plan,
        "state": view.state,
        "owner_pid": view.owner_pid,
        "epoch": view.epoch,
        "pause": view.pause,
        "error": view.error,
        "dispatches": view.dispatches,
        "execution_ms": view.execution_ms,
        "budget": heddle_store::Budget::of(&header.run.limits),
        "usage": view.usage(),
        "records": view.records,
        "occurrences": view.occurrences.iter().map(|(o, v)| {
            let mut e = serde_json::to_value(v).unwrap_or_default();
            e["occurrence"] = serde_json::to_value(o).unwrap_or_default();
            e
        }).collect::<Vec<_>>(),
    })
}

fn list(section: &StoreSection, json: bool) -> anyhow::Result<Exit> {
    let Some(store) = section.open_existing()? else {
        if json {
            println!("[]");
        } else {
            eprintln!("no runs (no run store at {})", section.path().display());
        }
        return Ok(Exit::Ok);
    };
    let rows = list_states(&*store)?;
    if json {
        let v: Vec<_> = rows.iter().map(|(s, state)| list_json(s, *state)).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for (s, state) in rows {
            println!(
                "{}  {:<11}  {:>6} records  {}",
                s.run_id,
                state.as_str(),
                s.records,
                s.graph_name
            );
        }
    }
    Ok(Exit::Ok)
}

fn show(section: &StoreSection, run: &str, json: bool) -> anyhow::Result<Exit> {
    let store = existing(section, run)?;
    let (header, _, view) = session::inspect(&*store, run)?;
    if json {
        let v = show_json(&header, &view);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(Exit::Ok);
    }
    println!("run       {}", header.run_id);
    println!(
        "graph     {} (sha256 {})",
        header.run.graph_name, header.graph_sha256
    );
    let owner = view
        .owner_pid
        .map(|p| format!(" (owner pid {p}, epoch {})", view.epoch))
        .unwrap_or_default();
    println!("state     {}{owner}", view.state.as_str());
    if let Some(p) = &view.pause {
        println!(
            "pause     event {}: {}",
            p.event,
            serde_json::to_string(&p.reason)?
        );
    }
    if let Some(e) = &view.error {
        println!("error     {e}");
    }
    let budget = heddle_store::Budget::of(&header.run.limits);
    let of = |limit: Option<u64>| limit.map(|l| format!(" of {l}")).unwrap_or_default();
    println!(
        "progress  {} dispatches{}, {} ms executed{}, {} records, opened {} times",
        view.dispatches,
        of(budget.max_dispatches),
        view.execution_ms,
        of(budget.time_limit_ms),
        view.records,
        view.opens
    );
    for (node, u) in view.usage() {
        let state = serde_json::to_value(u.state)?;
        println!(
            "usage     {node}: {} (${:.6} from {} of {} calls)",
            state.as_str().unwrap_or_default(),
            u.cost_usd,
            u.receipts,
            u.calls
        );
    }
    for (occ, o) in &view.occurrences {
        let rejected = o.verdicts.iter().any(|v| v["verdict"] == "reject");
        let result = match &o.result {
            Some(Outcome::Completed { .. }) => "completed",
            Some(Outcome::Failed { .. }) => "failed",
            None if rejected => "cancelled (gate rejected)",
            None if o.started > 0 => "started, no result",
            None => "dispatched",
        };
        let safety = if o.retry_safe {
            "retry-safe"
        } else {
            "not retry-safe"
        };
        println!("  {occ:<30} {result:<20} starts {} ({safety})", o.started);
    }
    Ok(Exit::Ok)
}

pub(crate) fn resume(
    section: &StoreSection,
    env_args: &crate::cli::EnvArgs,
    run: &str,
    pause: Option<u64>,
    json: bool,
) -> anyhow::Result<Exit> {
    let store = existing(section, run)?;
    // Everything is checked before the run is taken over, so a refused resume writes
    // nothing.
    let r = session::check_resume(&*store, run, pause)?;
    continue_run(store, r, env_args, json, None)
}

/// The graph document a run was started from, exactly as stored.
pub(crate) fn stored_graph(h: &heddle_store::RunHeader) -> anyhow::Result<GraphDoc> {
    let text = String::from_utf8(h.run.graph_bytes.clone())
        .map_err(|e| crate::usage!("run {}: the stored graph is not UTF-8: {e}", h.run_id))?;
    Ok(GraphDoc::parse(&text, &h.run.graph_name)?)
}

/// Takes a checked run over and runs it on from its log, with the gates its log
/// approved open, and `approval` (a gate approved now) recorded first.
pub(super) fn continue_run(
    store: Arc<dyn RunStore>,
    r: session::Resumption,
    env_args: &crate::cli::EnvArgs,
    json: bool,
    approval: Option<super::gates::Approval>,
) -> anyhow::Result<Exit> {
    let run = r.header.run_id.as_str();
    let doc = stored_graph(&r.header)?;
    if approval.is_none() {
        super::gates::refuse_resume_at_gate(&r, &doc)?;
    }
    let rt = crate::app::runtime()?;
    let h = &r.header;
    let env = rt.block_on(Env::load(
        env_args,
        Some(&crate::providers::graph_types(&doc)),
    ))?;
    let (plan, opts) = prepare(&env, &r, &doc, approval.as_ref())?;
    let session = session::reopen(store, &r)?;
    if let Some(a) = &approval {
        super::gates::record(&session, a)?;
    }
    match &r.pause {
        Some(p) => eprintln!("resuming run {run} at pause event {}", p.event),
        // A watchdog's first worker takes a run nothing has opened yet.
        None if r.records.is_empty() => eprintln!("starting run {run}"),
        None => eprintln!("recovering interrupted run {run}"),
    }
    if let Some(e) = session.exhausted_at_open() {
        // Nothing runs: the time limit was used up before this process took the run.
        let ending = session::end_exhausted(&session, e)?;
        return Ok(report_ending(run, &ending, None));
    }
    super::run::execute(
        rt,
        super::run::Execution {
            graph: h.run.graph_name.clone(),
            plan,
            registry: &env.registry,
            opts,
            json,
            stream: None,
            session: Some(session),
        },
    )
}

/// Plans a stored run again for a resume or an adoption, with its recorded inputs and
/// limits and the gates its log (and `approval`) opened; refused when a package it used
/// changed since it started.
pub(crate) fn prepare(
    env: &Env,
    r: &session::Resumption,
    doc: &GraphDoc,
    approval: Option<&super::gates::Approval>,
) -> anyhow::Result<(Plan, RunOptions)> {
    let h = &r.header;
    let plan = super::plan_graph(doc, &env.registry, Path::new(&h.run.graph_name))?;
    for (name, recorded) in &h.run.packages {
        let current = env.package_digests.get(name);
        if current != Some(recorded) {
            return Err(StoreError::PackageChanged {
                run: h.run_id.clone(),
                package: name.clone(),
                recorded: recorded.clone(),
                current: current.cloned().unwrap_or_else(|| "not installed".into()),
            }
            .into());
        }
    }
    let opts = RunOptions {
        secrets: super::run::run_secrets(env, None),
        inputs: h.run.inputs.clone(),
        node_timeout: h.run.limits["node_timeout_ms"]
            .as_u64()
            .map(std::time::Duration::from_millis),
        approved_gates: super::gates::approved(&r.records, approval),
        ..RunOptions::default()
    };
    Ok((plan, opts))
}
