//! Durable runs: the `[store]` section, recording a new run (its graph bytes, plan,
//! inputs, package digests and limits), and taking a recorded run over again, by
//! `heddle runs resume`, a gate's approval, a watchdog's worker or the server's
//! adoption. The commands that print what is recorded are in `commands::runs`.

pub mod gates;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use heddle_core::plan::Plan;
use heddle_core::{GraphDoc, PlanSummary};
use heddle_kernel::runtime::RunOptions;
use heddle_store::session::{self, Session};
use heddle_store::status::RunView;
use heddle_store::{
    Budget, NewRun, RunHeader, RunLimits, RunState, RunStore, RunSummary, SqliteStore, StoreError,
    SuperviseMode,
};
use serde::Deserialize;

use crate::config::{Config, MAX_TIME_LIMIT_MS};
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
    /// A node output whose JSON is longer than this many bytes is stored as an artifact
    /// of the run, and the log and the event feed carry a reference to it (default
    /// 64 KiB).
    #[serde(default)]
    pub inline_output_bytes: Option<u64>,
    /// The largest one artifact of a run may be (a large output, the final report);
    /// default 64 MiB.
    #[serde(default)]
    pub max_artifact_bytes: Option<u64>,
    /// All of one run's artifacts together; default 256 MiB.
    #[serde(default)]
    pub max_run_artifact_bytes: Option<u64>,
}

impl StoreSection {
    pub fn load(config: &Config) -> anyhow::Result<StoreSection> {
        let mut s: StoreSection = config.section("store")?.unwrap_or_default();
        s.path = Some(match s.path {
            Some(p) => config.resolve(&p),
            None => PathBuf::from(heddle_store::DEFAULT_PATH),
        });
        s.artifact_policy(Vec::new())?;
        Ok(s)
    }

    /// What the run's artifacts are held to, refused (naming the setting) when a limit
    /// is zero, beyond what the store can hold, or inconsistent with another.
    fn artifact_policy(
        &self,
        known_secrets: Vec<String>,
    ) -> anyhow::Result<(u64, heddle_store::artifacts::ArtifactPolicy)> {
        let defaults = heddle_store::artifacts::ArtifactPolicy::default();
        let policy = heddle_store::artifacts::ArtifactPolicy {
            max_artifact_bytes: self
                .max_artifact_bytes
                .unwrap_or(defaults.max_artifact_bytes),
            max_run_bytes: self
                .max_run_artifact_bytes
                .unwrap_or(defaults.max_run_bytes),
            known_secrets,
        };
        let inline = self
            .inline_output_bytes
            .unwrap_or(heddle_store::spill::DEFAULT_INLINE_BYTES);
        let check = |name: &str, n: u64, max: u64, why: &str| {
            if (1..=max).contains(&n) {
                Ok(())
            } else {
                Err(crate::usage!(
                    "[store] {name} = {n}: give 1 to {max} bytes ({why})"
                ))
            }
        };
        check(
            "max_artifact_bytes",
            policy.max_artifact_bytes,
            MAX_BLOB_BYTES,
            "the largest value the run store can hold",
        )?;
        check(
            "max_run_artifact_bytes",
            policy.max_run_bytes,
            MAX_RUN_BYTES,
            "1 TiB",
        )?;
        if policy.max_artifact_bytes > policy.max_run_bytes {
            return Err(crate::usage!(
                "[store] max_artifact_bytes = {} is over max_run_artifact_bytes = {}: one artifact cannot be larger than all of a run's",
                policy.max_artifact_bytes,
                policy.max_run_bytes
            ));
        }
        check(
            "inline_output_bytes",
            inline,
            policy.max_artifact_bytes,
            "at most max_artifact_bytes, so every value that leaves the log fits in an artifact",
        )?;
        Ok((inline, policy))
    }

    /// Sets how `session` stores its large values: this store's inline limit and
    /// artifact limits (checked when the section was loaded), and the run's secret
    /// values, which no stored value may hold.
    pub(crate) fn configure_spill(
        &self,
        session: &Session,
        secrets: &heddle_kernel::SecretRegistry,
    ) {
        // Checked by `load`, which every section goes through.
        if let Ok((inline_bytes, policy)) = self.artifact_policy(secrets.snapshot()) {
            session.configure(heddle_store::spill::Spill {
                inline_bytes,
                policy,
            });
        }
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
    pub(crate) fn open_existing(&self) -> anyhow::Result<Option<Arc<dyn RunStore>>> {
        if !self.path().exists() {
            return Ok(None);
        }
        Ok(Some(self.open()?))
    }
}

/// SQLite's largest blob (its default `SQLITE_MAX_LENGTH`).
const MAX_BLOB_BYTES: u64 = 1_000_000_000;

/// The largest per-run artifact quota accepted (1 TiB): anything above is a typo.
const MAX_RUN_BYTES: u64 = 1 << 40;

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
    store.configure_spill(&session, &opts.secrets);
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
    record(
        env,
        graph.display().to_string(),
        graph_bytes,
        plan,
        opts,
        budget,
    )
    .map_err(|e| crate::usage!("{e}"))
}

/// [`new_run`] for a document already in memory (the server's API), named `graph_name`.
/// Refused (nothing is recorded) when an input holds a known secret value.
pub(crate) fn record(
    env: &Env,
    graph_name: String,
    graph_bytes: Vec<u8>,
    plan: &Plan,
    opts: &RunOptions,
    budget: Budget,
) -> Result<NewRun, SecretInput> {
    refuse_secret_inputs(opts)?;
    Ok(NewRun {
        graph_name,
        graph_bytes,
        plan: PlanSummary::of(plan),
        inputs: opts.inputs.clone(),
        // Secrets reach nodes through the operator's grants, by name, on every start;
        // no secret value is ever part of a run.
        secrets: Vec::new(),
        packages: used_packages(plan, &env.package_digests),
        limits: RunLimits {
            budget,
            node_timeout_ms: opts.node_timeout.map(|t| t.as_millis() as u64),
            ..RunLimits::default()
        },
    })
}

/// An input of a new durable run holding a known secret value.
#[derive(Debug, thiserror::Error)]
#[error(
    "input `{input}` holds a known secret value, which a durable run never stores (its inputs are recorded and fed to its nodes again on every resume): grant the secret to the package that needs it and refer to it by name; KNOWN_SECRET; nothing was recorded"
)]
pub struct SecretInput {
    pub input: String,
}

/// Refuses a run whose inputs hold one of its known secret values, before anything is
/// recorded: a person types inputs (`--input`, an API request), and the store keeps a
/// run's inputs as they are, where masking one would run a resumed graph on
/// `«redacted»`. The rule the store holds node values to ([`heddle_store::secrets`]).
fn refuse_secret_inputs(opts: &RunOptions) -> Result<(), SecretInput> {
    let secrets = opts.secrets.snapshot();
    match opts
        .inputs
        .iter()
        .find(|(_, v)| heddle_store::secrets::holds(v, &secrets))
    {
        Some((name, _)) => Err(SecretInput {
            input: name.clone(),
        }),
        None => Ok(()),
    }
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
        // One range however the limit is given (the flag is also bounded by clap, the
        // server's API passes a request's value here).
        let (limit, source) = match time_limit_ms {
            Some(ms) => (Some(ms), "time_limit_ms"),
            None => (self.time_limit_ms, "[store] time_limit_ms"),
        };
        if let Some(ms) = limit
            && !(1..=MAX_TIME_LIMIT_MS).contains(&ms)
        {
            return Err(crate::usage!(
                "{source} = {ms}: a run's time limit is 1 to {MAX_TIME_LIMIT_MS} ms (30 days)"
            ));
        }
        Ok(Budget {
            max_dispatches: max_dispatches.or(self.max_dispatches),
            time_limit_ms: limit,
        })
    }
}

/// The packages (by name, with their sha256) whose node types the plan uses.
fn used_packages(plan: &Plan, digests: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    plan.nodes
        .iter()
        .filter_map(|n| {
            let name = n.decl.origin.package()?;
            Some((name.to_string(), digests.get(name)?.clone()))
        })
        .collect()
}

pub(crate) fn existing(section: &StoreSection, run: &str) -> anyhow::Result<Arc<dyn RunStore>> {
    section.open_existing()?.ok_or_else(|| {
        anyhow::Error::from(StoreError::UnknownRun(run.to_string()))
            .context(format!("no run store at {}", section.path().display()))
    })
}

/// Every run with its state, folded from its lifecycle records.
pub(crate) fn list_states(store: &dyn RunStore) -> Result<Vec<(RunSummary, RunState)>, StoreError> {
    let mut rows = Vec::new();
    for s in store.list()? {
        let state = heddle_store::status::state_of(store, &s.run_id)?;
        rows.push((s, state));
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
        "budget": header.run.limits.budget,
        "usage": view.usage(),
        "records": view.records,
        "skipped": view.skipped,
        "occurrences": view.occurrences.iter().map(|(o, v)| {
            let mut e = serde_json::to_value(v).unwrap_or_default();
            e["occurrence"] = serde_json::to_value(o).unwrap_or_default();
            e
        }).collect::<Vec<_>>(),
    })
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

/// Refuses to run on, from the command line, a run recorded with interactive
/// supervision: its failures wait for a person's verdict through `heddle serve`, and a
/// command-line process has nobody to ask (it would fail them unasked, or run them
/// unsupervised). Called before anything is written.
pub(crate) fn refuse_interactive(h: &heddle_store::RunHeader) -> anyhow::Result<()> {
    if h.run.limits.supervise != Some(SuperviseMode::Interactive) {
        return Ok(());
    }
    let id = &h.run_id;
    Err(crate::usage!(
        "run {id} is supervised interactively (a person decides its failures through `heddle serve`): \
         resume it from the server instead, on the run's page or with POST /api/runs/{id}/resume \
         (a gate: POST /api/runs/{id}/gates/GATE/approve); nothing was changed"
    ))
}

/// Takes a checked run over and runs it on from its log, with the gates its log
/// approved open, and `approval` (a gate approved now) recorded first.
pub(super) fn continue_run(
    store: Arc<dyn RunStore>,
    r: session::Resumption,
    env_args: &crate::cli::EnvArgs,
    json: bool,
    approval: Option<gates::Approval>,
) -> anyhow::Result<Exit> {
    let run = r.header.run_id.as_str();
    refuse_interactive(&r.header)?;
    let doc = stored_graph(&r.header)?;
    if approval.is_none() {
        gates::refuse_resume_at_gate(&r, &doc)?;
    }
    let rt = crate::runtime::runtime()?;
    let h = &r.header;
    let env = rt.block_on(Env::load(
        env_args,
        Some(&crate::providers::graph_types(&doc)),
    ))?;
    let (plan, opts) = prepare(&env, &r, &doc, approval.as_ref())?;
    let section = StoreSection::load(&env.config)?;
    let session = session::reopen(store, &r)?;
    section.configure_spill(&session, &opts.secrets);
    if let Some(a) = &approval {
        gates::record(&session, a)?;
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
        return Ok(crate::execute::report_ending(run, &ending, None));
    }
    crate::execute::execute(
        rt,
        crate::execute::Execution {
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
    approval: Option<&gates::Approval>,
) -> anyhow::Result<(Plan, RunOptions)> {
    let h = &r.header;
    let plan = crate::providers::plan_graph(doc, &env.registry, Path::new(&h.run.graph_name))?;
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
        secrets: crate::execute::run_secrets(env, None),
        inputs: h.run.inputs.clone(),
        node_timeout: h.run.limits.node_timeout(),
        approved_gates: gates::approved(&r.records, approval),
        ..RunOptions::default()
    };
    Ok((plan, opts))
}
