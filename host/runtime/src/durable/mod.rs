//! Durable runs: what a new run records (its graph bytes, plan, inputs, package digests
//! and limits), and taking a recorded run over again, by a resume, a gate's approval, a
//! watchdog's worker or a server's adoption. The store's own side (the session, the
//! crash table) is [`heddle_store::session`]; this module is what a run needs from the
//! runtime around it (its plan again, its options, its package digests checked).

pub mod cancel;
pub mod gates;
pub mod reconcile;
mod view;

pub use view::{cannot_spend, list_json, list_line, list_states, show_json, show_text, usage};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use heddle_core::compose::{Bounds, Bundle, Composition, IncludeKey};
use heddle_core::plan::Plan;
use heddle_core::{GraphDoc, PlanSummary};
use heddle_kernel::runtime::RunOptions;
use heddle_store::session::{self, Ending};
use heddle_store::{
    Budget, NewRun, PackagePin, RunHeader, RunLimits, RunStore, StoreError, SuperviseMode,
};

pub use heddle_store::RunState;
pub use heddle_store::session::{Resumption, check_resume, inspect};

use crate::driver::Drive;
use crate::error::{Error, Refused, SecretInput, refused};
use crate::providers::Runtime;
use crate::settings::{StoreSettings, Supervise};
use crate::telemetry::{RunInfo, RunTracing};

/// The bytes of the graph file at `path`, as a durable run records them.
pub fn read_graph(path: &Path) -> Result<Vec<u8>, Refused> {
    std::fs::read(path).map_err(|e| refused!("cannot read {}: {e}", path.display()))
}

impl Runtime {
    /// What a new durable run records: the graph's exact bytes (named `graph_name`),
    /// its plan, inputs, the digests of the packages it uses and its limits. Refused
    /// (nothing is recorded) when an input holds a known secret value.
    pub fn new_run(
        &self,
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
            packages: used_packages(plan, |name| self.package_pin(name)),
            limits: RunLimits {
                budget,
                node_timeout_ms: opts.node_timeout.map(|t| t.as_millis() as u64),
                ..RunLimits::default()
            },
        })
    }

    /// Records `run` in `store` and takes it: a durable run, ready to drive. Its first
    /// record is on disk when this returns (the disk is waited for off the async
    /// threads).
    pub async fn begin(
        &self,
        store: Arc<dyn RunStore>,
        run: NewRun,
        plan: Plan,
        mut opts: RunOptions,
    ) -> Result<(RunHeader, Drive), Error> {
        self.default_trace(&mut opts);
        let settings = self.settings().store.clone();
        let (header, drive) =
            crate::driver::blocking(move || begin(&settings, store, &run, plan, opts)).await?;
        Ok(self.trace_begun(header, drive))
    }

    /// [`Runtime::begin`] on this thread: blocks on the disk (call it where blocking is
    /// fine, not on an async thread).
    pub fn blocking_begin(
        &self,
        store: Arc<dyn RunStore>,
        run: &NewRun,
        plan: Plan,
        mut opts: RunOptions,
    ) -> Result<(RunHeader, Drive), Error> {
        self.default_trace(&mut opts);
        let (header, drive) = begin(&self.settings().store, store, run, plan, opts)?;
        Ok(self.trace_begun(header, drive))
    }

    /// Gives a new run without a trace of its own one under the process's `TRACEPARENT`
    /// (when an exporter is configured), and what the metrics need.
    fn default_trace(&self, opts: &mut RunOptions) {
        self.watch_options(opts);
    }

    /// Attaches the tracing of a run just begun (its trace recorded with its first
    /// record).
    fn trace_begun(&self, header: RunHeader, drive: Drive) -> (RunHeader, Drive) {
        let tracing = self.run_tracing(
            drive.options().trace.as_ref(),
            run_info(&header),
            &drive.options().secrets,
        );
        if let Some(m) = tracing.as_ref().and_then(|t| t.metrics()) {
            m.runs_created.inc();
        }
        (header, drive.traced(tracing))
    }

    /// Plans a stored run again for a resume or an adoption, with its recorded inputs
    /// and limits and the gates its log (and `decision`, a gate approved now) opened;
    /// refused when a package it used changed since it started.
    pub fn prepare(
        &self,
        r: &Resumption,
        doc: &GraphDoc,
        decision: Option<&Decision>,
    ) -> Result<(Plan, RunOptions), Error> {
        let h = &r.header;
        let plan = self.plan_with(doc, &h.run.graph_name, &recorded(h, doc))?;
        for (name, recorded) in &h.run.packages {
            let current = self.package_digests().get(name);
            if current.is_none() {
                return Err(missing_package(
                    &h.run_id,
                    name,
                    recorded,
                    &self.settings().packages_dir,
                )
                .into());
            }
            if current != Some(&recorded.sha256) {
                return Err(StoreError::PackageChanged {
                    run: h.run_id.clone(),
                    package: name.clone(),
                    recorded: recorded.sha256.clone(),
                    current: current.cloned().unwrap_or_default(),
                }
                .into());
            }
        }
        // The trace its log records (every owner continues it), else a new one.
        let trace = match (
            heddle_store::session::recorded_trace(&r.header, &r.records),
            self.telemetry(),
        ) {
            (Some(run), Some(t)) => Some(Arc::new(heddle_core::trace::Traced::new(run, t.salt()))),
            _ => self.trace(self.settings().telemetry.parent),
        };
        let opts = RunOptions {
            secrets: self.secrets(None),
            inputs: h.run.inputs.clone(),
            node_timeout: h.run.limits.node_timeout(),
            approved_gates: gates::approved(&r.records, decision.and_then(Decision::approval)),
            trace,
            every_invocation: self.metrics_kept(),
            ..RunOptions::default()
        };
        Ok((plan, opts))
    }

    /// Takes a checked run over and reopens it from its log ([`Runtime::prepare`], then
    /// [`session::reopen`]), with `decision` (a gate approved now, an answer to a
    /// reconcile pause) recorded before anything runs. A run whose time limit was used
    /// up before this process took it ends at once, failed. The disk is waited for off
    /// the async threads.
    pub async fn reopen(
        &self,
        store: Arc<dyn RunStore>,
        r: Resumption,
        doc: &GraphDoc,
        decision: Option<Decision>,
    ) -> Result<Reopened, Error> {
        let (plan, opts) = self.prepare(&r, doc, decision.as_ref())?;
        let settings = self.settings().store.clone();
        let tracing = self.reopen_tracing(&r, &opts, decision.as_ref());
        let leftovers = self.leftovers(&r, &plan);
        let reopened = crate::driver::blocking(move || {
            take_over(&settings, store, &r, plan, opts, decision.as_ref(), tracing)
        })
        .await?;
        if let Some(l) = leftovers {
            l.remove().await;
        }
        Ok(reopened)
    }

    /// What [`Leftovers::remove`] removes once this process took `r`'s run over: only
    /// when its graph has code nodes (no engine is asked otherwise).
    fn leftovers(&self, r: &Resumption, plan: &Plan) -> Option<Leftovers> {
        let code = plan
            .nodes
            .iter()
            .any(|n| matches!(n.decl.origin, heddle_core::Origin::Code));
        code.then(|| self.run_leftovers(&r.header.run_id))
    }

    /// The containers an earlier owner of run `run` left on the engine the code nodes
    /// use ([`Leftovers`]): what a cancel that ends a run nobody drives removes too.
    pub fn run_leftovers(&self, run: &str) -> Leftovers {
        Leftovers::new(self.settings().runners.docker_host.clone(), run)
    }

    /// [`Runtime::reopen`] on this thread: blocks on the disk (call it where blocking
    /// is fine, not on an async thread).
    pub fn blocking_reopen(
        &self,
        store: Arc<dyn RunStore>,
        r: &Resumption,
        doc: &GraphDoc,
        decision: Option<&Decision>,
    ) -> Result<Reopened, Error> {
        let (plan, opts) = self.prepare(r, doc, decision)?;
        let tracing = self.reopen_tracing(r, &opts, decision);
        let leftovers = self.leftovers(r, &plan);
        let reopened = take_over(
            &self.settings().store,
            store,
            r,
            plan,
            opts,
            decision,
            tracing,
        )?;
        if let Some(l) = leftovers {
            l.blocking_remove();
        }
        Ok(reopened)
    }

    /// The tracing of a run taken over by `r`: the run span's events from its log, and
    /// those of this opening.
    fn reopen_tracing(
        &self,
        r: &Resumption,
        opts: &RunOptions,
        decision: Option<&Decision>,
    ) -> Option<RunTracing> {
        let mut t = self
            .run_tracing(opts.trace.as_ref(), run_info(&r.header), &opts.secrets)?
            .with_history(&r.records);
        let pid = opentelemetry::KeyValue::new("process.pid", i64::from(std::process::id()));
        let how = match Reopening::of(r) {
            Reopening::Start => "start",
            Reopening::Recover => {
                t.event("heddle.run.recovered", vec![pid]);
                "recover"
            }
            Reopening::Resume { .. } => {
                t.event("heddle.run.resumed", vec![pid]);
                "resume"
            }
        };
        if let Some(m) = t.metrics() {
            m.runs_taken_over.with_label_values(&[how]).inc();
        }
        if let Some(Decision::Reconcile(a)) = decision {
            let answer = match a.answer() {
                reconcile::Answer::Completed(_) => heddle_core::ReconcileAnswer::Completed,
                reconcile::Answer::Skip => heddle_core::ReconcileAnswer::Skipped,
            };
            t.reconciled(a.occurrence(), answer);
        }
        if let Some(a) = decision.and_then(Decision::approval) {
            let mut attributes = vec![opentelemetry::KeyValue::new(
                "heddle.node.id",
                a.gate().to_string(),
            )];
            if !a.note().is_empty() {
                attributes.push(opentelemetry::KeyValue::new(
                    "heddle.gate.note",
                    a.note().to_string(),
                ));
            }
            t.event("heddle.gate.approved", attributes);
        }
        Some(t)
    }
}

/// The containers an earlier owner of a run left: a host killed outright (SIGKILL, a
/// crash, the OOM killer) runs no `finalize`, so a server it started for the run
/// (`code.server`), or a code node's container in flight, is still on the engine,
/// labelled with the run ([`heddle_runners::LABEL_RUN`]). Whoever takes the run over
/// (a resume, a recovery, a watchdog's next worker, another host's adoption) removes
/// them once the run is its own, before anything of the run runs again; a server the
/// run still needs is started afresh (the kernel never replays a run-scoped result).
/// A cancel that ends a run nobody drives removes them as well.
pub struct Leftovers {
    docker_host: Option<String>,
    run: String,
}

impl Leftovers {
    /// How long the engine gets to answer: a run is not held up by an engine that is
    /// down (its Docker nodes then fail on their own, naming it).
    const CONNECT: std::time::Duration = std::time::Duration::from_secs(5);

    /// Run `run`'s containers on the engine at `docker_host` (`[runners] docker_host`;
    /// `None`: `DOCKER_HOST` or the local socket).
    pub fn new(docker_host: Option<String>, run: &str) -> Leftovers {
        Leftovers {
            docker_host,
            run: run.to_string(),
        }
    }

    /// Removes them (an engine that does not answer is logged, never an error: the run
    /// goes on, and its Docker nodes report the engine themselves).
    pub async fn remove(self) {
        let run = &self.run;
        let docker = match tokio::time::timeout(
            Self::CONNECT,
            heddle_runners::connect_docker(self.docker_host.as_deref()),
        )
        .await
        {
            Ok(Ok(d)) => d,
            // No engine: no container can have been left on it (subprocess nodes die
            // with their host).
            Ok(Err(e)) => {
                tracing::debug!(run_id = %run, error = %e, "no Docker engine to look for the run's containers in");
                return;
            }
            Err(_) => {
                tracing::warn!(run_id = %run, "the Docker engine did not answer within 5 s: containers an earlier owner of the run left may remain");
                return;
            }
        };
        match heddle_runners::remove_run_containers(&docker, run).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                run_id = %run,
                removed = n,
                "removed the containers an earlier owner of the run left"
            ),
            Err(e) => tracing::warn!(
                run_id = %run,
                error = %e,
                "could not remove the containers an earlier owner of the run left"
            ),
        }
    }

    /// [`Leftovers::remove`] from a thread that may block (not an async one): on a
    /// thread and a runtime of its own, so it works whether or not the caller is
    /// inside one.
    pub fn blocking_remove(self) {
        std::thread::scope(|s| {
            s.spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(self.remove()),
                    Err(e) => tracing::warn!(error = %e, "no runtime to remove the run's leftover containers with"),
                }
            });
        });
    }
}

/// What a durable run's span says of it.
pub(crate) fn run_info(h: &RunHeader) -> RunInfo {
    RunInfo {
        run_id: Some(h.run_id.clone()),
        graph_name: h.run.graph_name.clone(),
        graph_digest: Some(h.graph_sha256.clone()),
        created: crate::telemetry::at_ms(h.created_ms),
    }
}

/// Records `run` and takes it (blocking).
fn begin(
    settings: &StoreSettings,
    store: Arc<dyn RunStore>,
    run: &NewRun,
    plan: Plan,
    opts: RunOptions,
) -> Result<(RunHeader, Drive), Error> {
    let trace = opts.trace.as_ref().map(|t| t.run);
    let (header, session) = session::begin_traced(store, run, trace)?;
    settings.configure(&session, &opts.secrets);
    Ok((header, Drive::durable(plan, opts, session)))
}

/// A person's decision a take-over records before anything runs.
#[derive(Debug)]
pub enum Decision {
    /// A gate approved now ([`gates::approval`]).
    Approve(gates::Approval),
    /// An answer to the reconcile pause reopened ([`reconcile::reconciliation`]).
    Reconcile(reconcile::Reconciliation),
}

impl Decision {
    /// The gate approved, if that is the decision.
    pub fn approval(&self) -> Option<&gates::Approval> {
        match self {
            Decision::Approve(a) => Some(a),
            Decision::Reconcile(_) => None,
        }
    }
}

/// Takes `r`'s run over with its plan and options (blocking).
fn take_over(
    settings: &StoreSettings,
    store: Arc<dyn RunStore>,
    r: &Resumption,
    plan: Plan,
    opts: RunOptions,
    decision: Option<&Decision>,
    tracing: Option<RunTracing>,
) -> Result<Reopened, Error> {
    let how = Reopening::of(r);
    // Checked against the plan (and its large values stored) before the take-over:
    // an answer that cannot be taken writes nothing.
    let answer = match decision {
        Some(Decision::Reconcile(a)) => a.records(&plan, settings, &*store, &opts.secrets)?,
        _ => Vec::new(),
    };
    // Recorded with this opening when the log holds no trace yet.
    let new_trace = match session::recorded_trace(&r.header, &r.records) {
        Some(_) => None,
        None => opts.trace.as_ref().map(|t| t.run),
    };
    let session = session::reopen_answered(store, r, answer, new_trace)?;
    // Before the approval's note is recorded: no record goes in unmasked.
    settings.configure(&session, &opts.secrets);
    if let Some(a) = decision.and_then(Decision::approval) {
        gates::record(&session, a)?;
    }
    if how == Reopening::Recover && session.cancel_requested()? {
        // Asked of a run whose owner died before it saw the request (a resume of a
        // pause withdrew any older one): carried out before anything runs again.
        let why = "cancelled: asked before its owner died, carried out by the recovery";
        let ending = crate::driver::end_cancelled_unrun(&session, why)?;
        if let Some(t) = tracing {
            t.unrun(heddle_core::RunStatus::Cancelled, Some(why.into()));
        }
        return Ok(Reopened {
            how,
            run: Reopen::Ended(ending),
        });
    }
    if let Some(e) = session.exhausted_at_open() {
        // Nothing runs: the time limit was used up before this process took the run.
        let error = e.to_string();
        let ending = session::end_exhausted(&session, e)?;
        if let Some(t) = tracing {
            t.unrun(heddle_core::RunStatus::Failed, Some(error));
        }
        return Ok(Reopened {
            how,
            run: Reopen::Ended(ending),
        });
    }
    Ok(Reopened {
        how,
        run: Reopen::Ready(Box::new(
            Drive::durable(plan, opts, session).traced(tracing),
        )),
    })
}

/// How a stored run is taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reopening {
    /// A paused run reopened at pause event `pause` (a person decided).
    Resume {
        /// The pause's event.
        pause: u64,
    },
    /// A run nothing has opened yet (a watchdog's first worker).
    Start,
    /// An interrupted run recovered from its log (no decision is implied: uncertain
    /// work pauses again).
    Recover,
}

impl Reopening {
    /// How `r` takes its run over.
    pub fn of(r: &Resumption) -> Reopening {
        match &r.pause {
            Some(p) => Reopening::Resume { pause: p.event },
            None if r.records.is_empty() => Reopening::Start,
            None => Reopening::Recover,
        }
    }
}

/// A stored run taken over.
pub struct Reopened {
    /// How it was taken over.
    pub how: Reopening,
    /// What became of it.
    pub run: Reopen,
}

/// What [`Runtime::reopen`] leaves.
pub enum Reopen {
    /// The run, ready to drive.
    Ready(Box<Drive>),
    /// Its budget was spent before it was taken over: it ended without running.
    Ended(Ending),
}

/// Refuses a run whose inputs hold one of its known secret values, before anything is
/// recorded: a person types inputs (a flag, an API request), and the store keeps a
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

/// The packages (by name, with their pins) whose node types the plan uses.
fn used_packages(
    plan: &Plan,
    pin: impl Fn(&str) -> Option<PackagePin>,
) -> BTreeMap<String, PackagePin> {
    plan.nodes
        .iter()
        .filter_map(|n| {
            let name = n.decl.origin.package()?;
            Some((name.to_string(), pin(name)?))
        })
        .collect()
}

/// The refusal to resume a run whose package `name` is not installed, saying what
/// installs exactly the recorded bytes.
pub fn missing_package(run: &str, name: &str, pin: &PackagePin, packages_dir: &Path) -> StoreError {
    let store = packages_dir.display();
    let sha256 = &pin.sha256;
    let what = match &pin.source {
        Some(s) => format!(
            "(sha256 {sha256}), which the package store {store} lacks; it was fetched from {} (manifest {}): `heddle package add oci://{}/{}@{}` installs exactly those bytes (`heddle runs resume` does it itself)",
            s.reference, s.manifest_digest, s.registry, s.repository, s.manifest_digest
        ),
        None => format!(
            "(sha256 {sha256}), which the package store {store} lacks; add the package directory whose component has that sha256 (`heddle package add DIR`)"
        ),
    };
    StoreError::PackageMissing {
        run: run.to_string(),
        package: name.to_string(),
        what,
    }
}

/// The graph document a run was started from, exactly as stored.
pub fn stored_graph(h: &RunHeader) -> Result<GraphDoc, Error> {
    let text = String::from_utf8(h.run.graph_bytes.clone())
        .map_err(|e| refused!("run {}: the stored graph is not UTF-8: {e}", h.run_id))?;
    Ok(GraphDoc::parse(&text, &h.run.graph_name)?)
}

/// What the graph nodes of a stored run's graph `doc` include, from the documents the
/// run recorded (never from files, which may have changed since it started); each is
/// checked again against the digest its graph node pins.
pub fn recorded(h: &RunHeader, doc: &GraphDoc) -> Composition {
    let top = IncludeKey::top(Path::new(&h.run.graph_name));
    Composition::load(
        doc,
        top.as_ref(),
        &Bundle::recorded(&h.run.plan.included),
        Bounds::depth(crate::config::MAX_GRAPH_DEPTH),
    )
}

/// A stored run's graph with its graph nodes expanded ([`Composition::flatten`]): every
/// node at its path, as the run's records name them.
pub fn stored_flat(h: &RunHeader) -> Result<GraphDoc, Error> {
    let doc = stored_graph(h)?;
    if h.run.plan.graphs.is_empty() {
        return Ok(doc);
    }
    Ok(recorded(h, &doc).flatten(&doc))
}

/// Every node type a stored run's plan uses, inside its graph nodes too: what resuming
/// it needs loaded.
pub fn recorded_types(h: &RunHeader) -> std::collections::BTreeSet<String> {
    h.run
        .plan
        .nodes
        .iter()
        .map(|n| n.node_type.clone())
        .collect()
}

/// Records that `run` is supervised by `supervise`: data of the run, so whoever adopts
/// or resumes it supervises it the same way.
pub fn set_supervise(run: &mut NewRun, supervise: &Supervise) {
    run.limits.supervise = Some(match supervise.clone() {
        Supervise::None => SuperviseMode::None,
        Supervise::Interactive => SuperviseMode::Interactive,
        Supervise::Policy { document } => SuperviseMode::Policy { document },
        Supervise::Llm { model, endpoint } => SuperviseMode::Llm { model, endpoint },
    });
}

/// Who decides the failed invocations of the stored run `h` (nobody for a run the
/// command line recorded: its `--policy` or `--supervise` is not kept).
pub fn supervise_of(h: &RunHeader) -> Supervise {
    match h.run.limits.supervise.clone() {
        Some(SuperviseMode::Interactive) => Supervise::Interactive,
        Some(SuperviseMode::Policy { document }) => Supervise::Policy { document },
        Some(SuperviseMode::Llm { model, endpoint }) => Supervise::Llm { model, endpoint },
        Some(SuperviseMode::None) | None => Supervise::None,
    }
}

/// Refuses to run on, outside a server, a run recorded with interactive supervision:
/// its failures wait for a person's verdict through `heddle serve`, and a command-line
/// process has nobody to ask (it would fail them unasked, or run them unsupervised).
/// Called before anything is written.
pub fn refuse_interactive(h: &RunHeader) -> Result<(), Refused> {
    if supervise_of(h) != Supervise::Interactive {
        return Ok(());
    }
    let id = &h.run_id;
    Err(refused!(
        "run {id} is supervised interactively (a person decides its failures through `heddle serve`): \
         resume it from the server instead, on the run's page or with POST /api/runs/{id}/resume \
         (a gate: POST /api/runs/{id}/gates/GATE/approve); nothing was changed"
    ))
}
