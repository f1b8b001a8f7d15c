//! The runs a server owns: created (durable before asynchronous), adopted after a
//! restart, resumed and cancelled on request, each driven by the runtime's driver
//! ([`heddle_runtime::Drive`]) in a task of its own; at most `workers` runs execute at
//! once, the rest wait for a slot.
//!
//! Every run this server drives has one entry in its list of active runs, holding its
//! driver's [`Control`], its feed and its desk: requests about a run reach the run
//! through that one entry.
//!
//! On a store several hosts share ([`Host::shared`], PostgreSQL), a run is driven by
//! whichever host holds its lease: a new run starts here when a worker slot is free, else
//! it is queued for any host to claim ([`crate::fleet`]); a request about a run another
//! host drives reaches it through the store.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use heddle_core::plan::{Issue, ValidationError};
use heddle_core::{GraphDoc, Value};
use heddle_kernel::supervisor::{Bounds, Verdict};
use heddle_runtime::durable::{self, Decision, Reopen, gates, reconcile};
use heddle_runtime::supervision;
use heddle_runtime::{Control, Drive, Error, Refused, Runtime, SecretInput, Supervise};
use heddle_store::fleet::GiveBack;
use heddle_store::session::{self, Resumption};
use heddle_store::status::RunState;
use heddle_store::{Fleet, RunStore, StoreError};
use heddle_supervisor::interactive::{Answer, AnswerError, Desk, Interactive, Notice, Pending};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::coding::Coding;
use crate::feed::{Feed, Subscription};
use crate::mask::Mask;

/// Largest graph the API plans: nodes plus edges. A document this size is already far
/// beyond a hand-drawn graph; the bound keeps one request from holding the planner.
pub const MAX_GRAPH_ITEMS: usize = 20_000;

/// Why a request for a new run was refused; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The graph document is malformed.
    #[error(transparent)]
    Doc(#[from] heddle_core::graph::DocError),
    /// The graph is larger than this server plans.
    #[error("the graph has {items} nodes and edges; this server plans at most {max}")]
    TooLarge {
        /// Its nodes and edges.
        items: usize,
        /// [`MAX_GRAPH_ITEMS`].
        max: usize,
    },
    /// Planning refused the graph.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// An input is missing, unknown or of the wrong type.
    #[error(transparent)]
    Inputs(#[from] heddle_core::plan::InputErrors),
    /// The budget asked for is out of range.
    #[error(transparent)]
    Budget(#[from] Refused),
    /// An input holds a known secret value.
    #[error(transparent)]
    SecretInput(#[from] SecretInput),
    /// Recording the run failed.
    #[error(transparent)]
    Run(#[from] Error),
}

impl CreateError {
    /// The problems as `heddle validate --json` lists them.
    pub fn issues(&self) -> &[Issue] {
        match self {
            CreateError::Invalid(v) => &v.issues,
            _ => &[],
        }
    }
}

/// What a create request may set besides the graph and its inputs.
#[derive(Debug, Default, Clone)]
pub struct CreateOptions {
    /// The documents the graph's graph nodes include, by the path they name (relative
    /// to the graph): the server reads no files for a graph sent to it.
    pub graphs: std::collections::BTreeMap<String, String>,
    /// The run's supervisor handle; the server's `--supervise` when absent.
    pub supervise: Option<Supervise>,
    /// The run's budget; `[store]`'s keys of the same names when absent.
    pub max_dispatches: Option<u64>,
    /// The run's time limit in milliseconds; `[store] time_limit_ms` when absent.
    pub time_limit_ms: Option<u64>,
    /// The caller's span (a `traceparent` header): the run's span becomes its child.
    pub trace_parent: Option<heddle_core::trace::TraceParent>,
}

/// How a driven run's failures are decided, built before the run is taken.
enum Supervision {
    /// Nobody: failures fail.
    Nobody,
    /// A person, through this server's desk.
    Person,
    /// A policy or the LLM agent, as the run recorded.
    Handle(Arc<dyn heddle_kernel::supervisor::Supervisor>),
}

/// How busy a [`Host`] is ([`Host::load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    /// Runs holding a worker slot.
    pub running: usize,
    /// Runs driven here waiting for a slot.
    pub queued: usize,
    /// Clients reading a run's event stream.
    pub subscribers: usize,
}

/// Desks of ended runs kept for late answers.
const ENDED_DESKS: usize = 64;

/// A run created through [`Host::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// Its id.
    pub run_id: String,
    /// Queued for a host of a shared store to claim (every worker slot here was taken),
    /// rather than started here.
    pub queued: bool,
}

/// How long a host waits for another host to carry out a request about a run that host
/// drives before it answers that it did not (a relayed escalation list or answer).
pub const RELAY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a cancel of a run another host (or process) drives waits for its owner to
/// record it, before it answers that the request is recorded.
pub const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A run this server drives.
pub(crate) struct Active {
    /// Its driver's stops.
    control: Control,
    /// Its log rendered for its subscribers, as the follower reads it (see `feed`).
    feed: Arc<Feed>,
    /// Its escalations waiting for a person, under interactive supervision.
    desk: Option<Arc<Desk>>,
    /// Cancelled once its driver is done with it (ending recorded, log closed).
    done: CancellationToken,
    /// The owner epoch its log writes under (what its lease is held and given back at).
    pub(crate) epoch: u64,
    /// Its lease was lost: another host may drive it now, so nothing of it is handed
    /// back from here.
    pub(crate) lost: Arc<AtomicBool>,
}

impl Active {
    /// A cancel another host or process asked for through the store: the same as one
    /// asked here (the driver also finds the request by itself).
    pub(crate) fn cancel_asked(&self) {
        if self.control.request_cancel()
            && let Some(d) = &self.desk
        {
            d.withdraw_all();
        }
    }
}

/// The runs of one server: the store it owns, the runtime they run on, and every run
/// it drives.
pub struct Host {
    /// The run store this server owns.
    pub store: Arc<dyn RunStore>,
    /// The hosts this server shares its store with, on a shared store (`None`: it owns
    /// a store file alone).
    pub(crate) fleet: Option<Arc<dyn Fleet>>,
    runtime: Arc<Runtime>,
    pub(crate) workers: Arc<Semaphore>,
    /// How many worker slots there are.
    slots: usize,
    /// What `GET /metrics` reports.
    pub metrics: Arc<crate::metrics::ServerMetrics>,
    active: Mutex<HashMap<String, Active>>,
    /// Told when a run's worker slot is free again (the claim loop takes more work).
    pub(crate) freed: Notify,
    /// Feeds of runs other hosts drive, shared by the subscribers of this host.
    pub(crate) watched: Mutex<HashMap<String, Arc<Feed>>>,
    /// One lock per run that requests about it (resume, approve, reject, cancel,
    /// adoption) hold from their check to their driver's start: the second of two
    /// answers to one run sees what the first made of it (409) instead of racing it.
    handovers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Runs that failed here lately, for the pause before they are claimable again.
    pub(crate) retries: crate::fleet::Retries,
    /// The desks of the last runs that ended here, so a late answer is told what became
    /// of its escalation (withdrawn, timed out) rather than that it never existed.
    ended: Mutex<VecDeque<(String, Arc<Desk>)>>,
    /// Masks the operator's secrets out of everything the API sends.
    pub mask: Arc<Mask>,
    pub(crate) tasks: TaskTracker,
    /// Where the runs execute (see [`crate::Server`]).
    runs: tokio::runtime::Handle,
    /// Cancelled when the server shuts down: drivers stop their runs without recording
    /// an ending, so the next owner adopts them.
    pub shutdown: CancellationToken,
}

impl Host {
    /// A host for the runs of `store`, on `runtime`, with at most `workers` executing at
    /// once on `runs`.
    pub fn new(
        store: Arc<dyn RunStore>,
        runtime: Arc<Runtime>,
        workers: usize,
        runs: tokio::runtime::Handle,
    ) -> Host {
        let mask = Arc::new(Mask::new(runtime.secrets(None).snapshot()));
        // Asked for before any run is taken: every run of this server is counted.
        let metrics = Arc::new(crate::metrics::ServerMetrics::new(
            runtime.metrics().clone(),
        ));
        Host {
            store,
            fleet: None,
            runtime,
            workers: Arc::new(Semaphore::new(workers)),
            slots: workers,
            metrics,
            active: Mutex::new(HashMap::new()),
            freed: Notify::new(),
            watched: Mutex::new(HashMap::new()),
            handovers: Mutex::new(HashMap::new()),
            retries: Default::default(),
            ended: Mutex::new(Default::default()),
            mask,
            tasks: TaskTracker::new(),
            runs,
            shutdown: CancellationToken::new(),
        }
    }

    /// A host for the runs of `store`, which `fleet` (the same store) shares with other
    /// hosts: new runs beyond its free worker slots are queued for any host, and
    /// requests about a run another host drives reach it through the store. Call
    /// [`crate::fleet::serve`] to claim work.
    pub fn shared(
        store: Arc<dyn RunStore>,
        fleet: Arc<dyn Fleet>,
        runtime: Arc<Runtime>,
        workers: usize,
        runs: tokio::runtime::Handle,
    ) -> Host {
        Host {
            fleet: Some(fleet),
            ..Host::new(store, runtime, workers, runs)
        }
    }

    /// The runtime the runs run on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The hosts this server shares its store with (`None`: it owns a store file alone).
    pub fn fleet(&self) -> Option<&Arc<dyn Fleet>> {
        self.fleet.as_ref()
    }

    /// The runs this server drives now.
    pub fn driving(&self) -> Vec<String> {
        self.active().keys().cloned().collect()
    }

    /// How busy it is now: runs holding a worker slot, runs waiting for one, and
    /// clients reading a run's event stream.
    pub fn load(&self) -> Load {
        let active = self.active();
        let running = self.slots - self.workers.available_permits().min(self.slots);
        Load {
            running,
            queued: active.len().saturating_sub(running),
            subscribers: active.values().map(|a| a.feed.subscribers()).sum(),
        }
    }

    /// [`blocking`] on the runs' own threads: a run's log writer, started by opening
    /// its session, is a thread of the runs', with their priority (see `Server`).
    async fn on_runs<T: Send + 'static, E: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        match self.runs.spawn_blocking(f).await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The secret values a write to a run's log outside a run (a rejection, a cancel
    /// of a run no driver drives) masks out; what [`Host::mask`] masks too.
    fn known_secrets(&self) -> Vec<String> {
        self.runtime.secrets(None).snapshot()
    }

    pub(crate) fn active(&self) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
        // Nothing panics while holding it; a poisoned map is still consistent.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the turn of a request about run `id` (see [`Host::handovers`]): held
    /// until the request has taken the run over and handed it to its driver, or was
    /// refused.
    pub(crate) async fn handover(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.handovers.lock().unwrap_or_else(|e| e.into_inner());
            // Locks nobody waits for are let go, so the map holds only runs in hand.
            locks.retain(|_, l| Arc::strong_count(l) > 1);
            locks.entry(id.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// Plans `graph` with `inputs`, records the run and its first record durably, and
    /// only then hands it to a driver: the returned id names a run that exists on disk.
    /// On a shared store with every worker slot taken, the run is recorded and queued
    /// for whichever host has a slot first.
    pub async fn create(
        self: &Arc<Self>,
        name: &str,
        graph: &serde_json::Value,
        inputs: serde_json::Map<String, serde_json::Value>,
        options: CreateOptions,
    ) -> Result<Created, CreateError> {
        // Serializing a JSON value cannot fail; these bytes are the run's document.
        let text = serde_json::to_string_pretty(graph).expect("a JSON value serializes");
        let doc = GraphDoc::parse(&text, name)?;
        let items = doc.nodes.len() + doc.edges.len();
        if items > MAX_GRAPH_ITEMS {
            return Err(CreateError::TooLarge {
                items,
                max: MAX_GRAPH_ITEMS,
            });
        }
        let sent = heddle_core::compose::Bundle::new(
            options.graphs,
            "not sent: a graph sent to the server brings the documents its graph nodes include in `graphs`, by the path they name",
        )
        // An installed package's documents are the server's own: read from its store
        // unless the request sends them; no other file is read for a request.
        .or_packages(heddle_runtime::providers::with_package_graphs(
            self.runtime.settings(),
            heddle_core::compose::FileSource::packages_only(),
        ));
        let comp = heddle_core::compose::Composition::load(
            &doc,
            None,
            &sent,
            heddle_core::compose::Bounds {
                depth: self.runtime.settings().run.max_graph_depth,
                // What the server plans at most, all documents together.
                nodes: MAX_GRAPH_ITEMS,
            },
        );
        let plan = heddle_core::plan::plan_with(&doc, self.runtime.registry(), &comp)?;
        // Graph nodes bring their inner graphs: the bound holds for the whole.
        let items = plan.nodes.len() + plan.edges.len();
        if items > MAX_GRAPH_ITEMS {
            return Err(CreateError::TooLarge {
                items,
                max: MAX_GRAPH_ITEMS,
            });
        }
        let values = inputs
            .into_iter()
            .map(|(k, v)| (k, Value::from_json(v)))
            .collect();
        plan.bind_inputs(&values)?;
        let mut opts = self.runtime.options(values, None);
        opts.trace = self.runtime.trace(options.trace_parent);
        let budget = self
            .runtime
            .settings()
            .store
            .budget(options.max_dispatches, options.time_limit_ms)?;
        let mut run =
            self.runtime
                .new_run(name.to_string(), text.into_bytes(), &plan, &opts, budget)?;
        let serve = &self.runtime.settings().serve;
        let supervise = options.supervise.unwrap_or_else(|| serve.supervise.clone());
        // Checked and built before anything is written: a policy that does not parse, a
        // model or endpoint the operator did not permit, refuse the request.
        supervision::permit(serve, &supervise).map_err(|e| CreateError::Run(e.into()))?;
        let supervision = self.supervision(&supervise)?;
        durable::set_supervise(&mut run, &supervise);
        let mut slot = None;
        if let Some(fleet) = &self.fleet {
            match self.workers.clone().try_acquire_owned() {
                Ok(p) => slot = Some(p),
                Err(_) => {
                    // Whichever host claims it continues the caller's trace.
                    run.limits.trace = opts.trace.as_ref().map(|t| t.run);
                    let (store, fleet) = (self.store.clone(), fleet.clone());
                    let run_id = blocking(move || {
                        let h = store.create_run(&run)?;
                        fleet.enqueue(&h.run_id)?;
                        Ok::<_, StoreError>(h.run_id)
                    })
                    .await
                    .map_err(Error::from)?;
                    return Ok(Created {
                        run_id,
                        queued: true,
                    });
                }
            }
        }
        let (store, runtime) = (self.store.clone(), self.runtime.clone());
        let (header, drive) = self
            .on_runs(move || runtime.blocking_begin(store, &run, plan, opts))
            .await?;
        self.spawn(drive, self.runtime.clone(), supervision, slot);
        Ok(Created {
            run_id: header.run_id,
            queued: false,
        })
    }

    /// Takes over every run a previous owner left running (it continues from its log);
    /// paused and finished runs are left as they are. A run that cannot be planned again
    /// (a package changed) is reported and left alone.
    pub async fn adopt_all(self: &Arc<Self>) -> Result<Vec<String>, StoreError> {
        let store = self.store.clone();
        let runs = blocking(move || durable::list_states(&*store)).await?;
        let mut adopted = Vec::new();
        for (summary, state) in runs {
            if !matches!(state, RunState::Running | RunState::Interrupted) {
                continue;
            }
            let id = summary.run_id;
            match self.adopt(&id).await {
                Ok(()) => adopted.push(id),
                Err(e) => tracing::warn!(
                    run_id = %id,
                    "run {id} not adopted: {}",
                    heddle_core::text::error_chain(&e)
                ),
            }
        }
        Ok(adopted)
    }

    async fn adopt(self: &Arc<Self>, id: &str) -> Result<(), Error> {
        let _turn = self.handover(id).await;
        // A run a watchdog watches is its watchdog's to recover.
        heddle_runtime::watch::refuse_if_locked(self.runtime.settings(), id)?;
        let store = self.store.clone();
        let run_id = id.to_string();
        let (header, records, view) = blocking(move || session::inspect(&*store, &run_id)).await?;
        // Adopting is not a user's resume: no pause is reopened and no uncertain work
        // offered again (that stays a decision for a person).
        let r = Resumption {
            header,
            records,
            view,
            pause: None,
        };
        self.reopen_and_spawn(r, None, None, None).await
    }

    /// A user's resume of a paused or interrupted run (at `pause` when given), with
    /// their answer to its reconcile pause when `given` (recorded with the take-over,
    /// then the run goes on without running the uncertain work).
    pub async fn resume(
        self: &Arc<Self>,
        id: &str,
        pause: Option<u64>,
        given: Option<reconcile::Given>,
    ) -> Result<(), Error> {
        let _turn = self.handover(id).await;
        heddle_runtime::watch::refuse_if_locked(self.runtime.settings(), id)?;
        let store = self.store.clone();
        let run_id = id.to_string();
        let r = blocking(move || session::check_resume(&*store, &run_id, pause))
            .await
            .map_err(|e| self.driven_here(e))?;
        let decision = match given {
            Some(g) => Some(Decision::Reconcile(reconcile::reconciliation(&r, g)?)),
            None => None,
        };
        let doc = durable::stored_graph(&r.header)?;
        // A run waiting at a gate is answered (approve/reject), not resumed.
        gates::refuse_resume_at_gate(&r)?;
        self.reopen_and_spawn(r, Some(doc), decision, None).await
    }

    /// A person approves `gate` of a run waiting there: recorded, then the run goes on.
    pub async fn approve(
        self: &Arc<Self>,
        id: &str,
        gate: &str,
        note: Option<String>,
    ) -> Result<(), Error> {
        let _turn = self.handover(id).await;
        heddle_runtime::watch::refuse_if_locked(self.runtime.settings(), id)?;
        let store = self.store.clone();
        let (run_id, gate_id) = (id.to_string(), gate.to_string());
        let (r, _, approval) = blocking(move || gates::approval(&*store, &run_id, &gate_id, note))
            .await
            .map_err(|e| self.driven_here_runtime(e))?;
        self.reopen_and_spawn(r, None, Some(Decision::Approve(approval)), None)
            .await
    }

    /// A person rejects `gate`: the run ends cancelled with the gate's title and `note`.
    pub async fn reject(&self, id: &str, gate: &str, note: String) -> Result<String, Error> {
        let _turn = self.handover(id).await;
        heddle_runtime::watch::refuse_if_locked(self.runtime.settings(), id)?;
        let store = self.store.clone();
        let (run_id, gate_id) = (id.to_string(), gate.to_string());
        let secrets = self.known_secrets();
        let watch = self.runtime.watch();
        blocking(move || gates::record_rejection(store, &run_id, &gate_id, &note, &secrets, &watch))
            .await
            .map_err(|e| self.driven_here_runtime(e))
    }

    /// On a store several hosts share, a run this host drives is refused by the store
    /// as owned by a host, its lease naming this one: said as a store file says a run
    /// live in this very process, so the answer is "this server drives it", never this
    /// host named as if it were another owner. The lease decides, not the map of runs
    /// driven here: a driver that just ended (or not yet started) is out of the map while
    /// this host still holds the run's lease.
    fn driven_here(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::RunOwned { run, host, .. }
                if self.fleet.as_ref().is_some_and(|f| f.host_id() == host) =>
            {
                StoreError::Live {
                    run,
                    pid: std::process::id(),
                }
            }
            e => e,
        }
    }

    /// [`Host::driven_here`] for the runtime's errors.
    fn driven_here_runtime(&self, e: Error) -> Error {
        match e {
            Error::Store(s) => Error::Store(self.driven_here(s)),
            e => e,
        }
    }

    /// Takes `r`'s run over and hands it to a driver, which runs it once `slot` (when
    /// given, else a worker slot when one frees).
    pub(crate) async fn reopen_and_spawn(
        self: &Arc<Self>,
        r: Resumption,
        doc: Option<GraphDoc>,
        decision: Option<Decision>,
        slot: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Error> {
        let doc = match doc {
            Some(d) => d,
            None => durable::stored_graph(&r.header)?,
        };
        // Built before the run is taken over: a run this server cannot supervise as it
        // was recorded (no key for its LLM supervisor) stays for one that can.
        let supervision = self.supervision(&durable::supervise_of(&r.header))?;
        // A run created elsewhere (another host on the shared store, a command line on
        // another machine) may use a registry package this machine never installed:
        // fetched by the digest the run pinned before anything is taken over, and the
        // run driven by a runtime that knows it. A fetch that fails leaves the run as it
        // was (queued again by the fleet, or the request refused saying why).
        let runtime = self.runtime.for_stored_run(&r.header, &doc).await?;
        let (store, rt) = (self.store.clone(), runtime.clone());
        let reopened = self
            .on_runs(move || rt.blocking_reopen(store, &r, &doc, decision.as_ref()))
            .await?;
        match reopened.run {
            // Its time limit was used up before this server took it: nothing runs.
            Reopen::Ended(_) => {}
            Reopen::Ready(drive) => self.spawn(*drive, runtime, supervision, slot),
        }
        Ok(())
    }

    /// Cancels a run: one this server drives is stopped and records its ending; any
    /// other unfinished run is taken over and recorded cancelled. Returns only once the
    /// cancel counts: a driver whose ending was already decided without it is waited
    /// for, and the run then cancelled from the store (a pause) or refused as ended.
    pub async fn cancel(&self, id: &str) -> Result<(), StoreError> {
        let _turn = self.handover(id).await;
        let ending = {
            let active = self.active();
            match active.get(id) {
                Some(a) if a.control.request_cancel() => {
                    // Withdrawn after the kernel was told and before the cancel returns:
                    // the API never offers a decision about a run that is going away,
                    // and the kernel takes the withdrawal for the cancel it is, not for
                    // a `fail`.
                    if let Some(d) = &a.desk {
                        d.withdraw_all();
                    }
                    return Ok(());
                }
                // Too late for its driver: what it recorded decides below.
                Some(a) => Some(a.done.clone()),
                None => None,
            }
        };
        if let Some(done) = ending {
            done.cancelled().await;
        }
        let store = self.store.clone();
        let run_id = id.to_string();
        let secrets = self.known_secrets();
        // What a host killed outright left for the run (a server's container): its
        // owner, when it ended the run itself, left nothing.
        let leftovers = self.runtime.run_leftovers(id);
        let watch = self.runtime.watch();
        if self.fleet.is_some() {
            // Whoever drives it (another host, a command line) is asked through the store
            // and records the cancel itself; one nobody drives is cancelled here.
            let ended = blocking(move || {
                durable::cancel::cancel_run(
                    &store,
                    &run_id,
                    &secrets,
                    CANCEL_WAIT,
                    &mut |_: &str| {},
                    &watch,
                )
            })
            .await?;
            if ended == durable::cancel::Cancelled::Ended {
                leftovers.remove().await;
            }
            return Ok(());
        }
        blocking(move || durable::cancel::cancel_unowned(&store, &run_id, &secrets, &watch))
            .await?;
        leftovers.remove().await;
        Ok(())
    }

    /// Whether a driver of this server drives `id`, and a subscription to its feed.
    /// Subscribed under the list's lock: once the run left the list, its follower
    /// knows every subscriber it will ever have.
    pub fn feed(&self, id: &str, coding: Coding) -> Option<Subscription> {
        self.active().get(id).map(|a| a.feed.subscribe(coding))
    }

    /// Changes of run `id`'s pending escalations, when a person supervises it here,
    /// starting with a `pending` notice for each escalation already waiting.
    pub fn notices(&self, id: &str) -> Option<(Vec<Notice>, broadcast::Receiver<Notice>)> {
        let desk = self.active().get(id)?.desk.clone()?;
        // Subscribed first: one opened in between is announced twice, never missed.
        let rx = desk.subscribe();
        let now = desk.pending().iter().map(|p| p.notice()).collect();
        Some((now, rx))
    }

    /// The escalations of run `id` waiting for a person: none for a run that is not
    /// driven here or not supervised interactively.
    pub async fn escalations(&self, id: &str) -> Result<Vec<Pending>, StoreError> {
        if let Some(a) = self.active().get(id) {
            return Ok(a.desk.as_ref().map(|d| d.pending()).unwrap_or_default());
        }
        // Known, or 404.
        let store = self.store.clone();
        let run_id = id.to_string();
        blocking(move || store.header(&run_id).map(|_| ())).await?;
        Ok(Vec::new())
    }

    /// A person's answer to escalation `eid` of run `id`.
    pub async fn answer(
        &self,
        id: &str,
        eid: &str,
        answer: Answer,
    ) -> Result<Verdict, AnswerError> {
        let desk = self.active().get(id).and_then(|a| a.desk.clone());
        let desk = desk.or_else(|| {
            let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
            ended.iter().find(|(r, _)| r == id).map(|(_, d)| d.clone())
        });
        match desk {
            Some(d) => d.answer(eid, answer),
            None => Err(AnswerError::Unknown(eid.to_string())),
        }
    }

    /// Who decides the failures of a run supervised as `supervise` says.
    fn supervision(&self, supervise: &Supervise) -> Result<Supervision, Error> {
        Ok(match supervise {
            Supervise::None => Supervision::Nobody,
            Supervise::Interactive => Supervision::Person,
            recorded => match supervision::recorded(&self.runtime.settings().config, recorded)? {
                Some(handle) => Supervision::Handle(handle),
                None => Supervision::Nobody,
            },
        })
    }

    /// Hands a durable run to a task of its own that drives it to its ending with
    /// `runtime`'s node types (the server's, or one loaded for this run), once `slot`
    /// (when given) or a worker slot.
    fn spawn(
        self: &Arc<Self>,
        drive: Drive,
        runtime: Arc<Runtime>,
        supervision: Supervision,
        slot: Option<OwnedSemaphorePermit>,
    ) {
        let mut drive = drive.stopped_by(&self.shutdown);
        // A durable drive always has its session.
        let (run_id, epoch) = match drive.session() {
            Some(s) => (s.run_id.clone(), s.log.epoch()),
            None => return,
        };
        let lost = Arc::new(AtomicBool::new(false));
        let desk = match supervision {
            Supervision::Nobody => None,
            Supervision::Person => {
                let desk = Desk::new(self.runtime.settings().serve.decision_timeout);
                drive.supervise(Interactive::bounded(desk.clone(), Bounds::default()));
                Some(desk)
            }
            Supervision::Handle(handle) => {
                drive.supervise(handle);
                None
            }
        };
        let feed = Arc::new(Feed::default());
        // Tells this driver's entry from a later driver's of the same run.
        let feed_of_this = feed.clone();
        let done = CancellationToken::new();
        self.tasks.spawn(crate::feed::follow(
            feed.clone(),
            self.store.clone(),
            self.mask.clone(),
            run_id.clone(),
            done.clone(),
        ));
        self.active().insert(
            run_id.clone(),
            Active {
                control: drive.control(),
                feed,
                desk: desk.clone(),
                done: done.clone(),
                epoch,
                lost: lost.clone(),
            },
        );
        let host = self.clone();
        let task = async move {
            let workers = host.workers.clone();
            let slot = async move {
                match slot {
                    Some(p) => p,
                    // Never closed.
                    None => workers.acquire_owned().await.expect("the worker slots"),
                }
            };
            let outcome = drive.run_when(runtime.registry(), slot).await;
            match &outcome {
                // Found by its own writes before a renewal found it: the same loss.
                Err(Error::Store(e)) if e.is_lost_lease() => {
                    if let Some(f) = &host.fleet {
                        f.stop_renewing(&run_id, epoch);
                    }
                    if !lost.swap(true, Ordering::SeqCst) {
                        // Why it was lost: a database away longer than the TTL reads
                        // differently from a host that stopped renewing.
                        tracing::warn!(
                            run_id = %run_id,
                            "{} ({})",
                            lost_lease(&run_id, epoch),
                            heddle_core::text::error_chain(e)
                        );
                    }
                }
                Err(e) => tracing::error!(
                    run_id = %run_id,
                    "run {run_id}: {}",
                    heddle_core::text::error_chain(e)
                ),
                Ok(_) => {}
            }
            // On a shared store, a run left without an ending (this host shutting down,
            // or its driver failed) goes back to the queue: a host continues it from its
            // log. One whose lease was lost is another host's already. One whose driver
            // failed waits a while first, longer each time in a row: a failure that
            // lasts must not make hosts take the run in a loop.
            let ended = matches!(&outcome, Ok(o) if o.ending.is_some());
            if let Some(fleet) = &host.fleet
                && !ended
                && !lost.load(Ordering::SeqCst)
            {
                let back = match &outcome {
                    Err(_) => {
                        let (n, after) = host.retries.failed(&run_id);
                        tracing::warn!(
                            run_id = %run_id,
                            "run {run_id}: queued again, claimable in {} ms ({n} failure(s) in a row here)",
                            after.as_millis()
                        );
                        GiveBack::Queued { after }
                    }
                    Ok(_) => GiveBack::QUEUED,
                };
                let (f, r) = (fleet.clone(), run_id.clone());
                if let Err(e) = blocking(move || f.release(&r, epoch, back)).await {
                    tracing::warn!(
                        run_id = %run_id,
                        "run {run_id}: not handed back ({e}); its lease expires on its own"
                    );
                }
            }
            if outcome.is_ok() {
                host.retries.forget(&run_id);
            }
            if let Some(d) = desk {
                // The server stopping with a decision pending: the next owner asks again.
                d.withdraw_all();
                let mut ended = host.ended.lock().unwrap_or_else(|e| e.into_inner());
                if ended.len() >= ENDED_DESKS {
                    ended.pop_front();
                }
                ended.push_back((run_id.clone(), d));
            }
            // After the desk is kept: an answer finds one or the other. Only this
            // driver's entry: a resume may have started the next driver of the run
            // (which replaced it) while this one was still closing its log, and removing
            // that one would leave its run without feed, desk or cancel.
            {
                let mut active = host.active();
                if active
                    .get(&run_id)
                    .is_some_and(|a| Arc::ptr_eq(&a.feed, &feed_of_this))
                {
                    active.remove(&run_id);
                }
            }
            done.cancel();
            host.freed.notify_one();
        };
        self.tasks.spawn_on(task, &self.runs);
    }

    /// Stops driving run `id` (held at `epoch`) because its lease was lost: another host
    /// may drive it now. Its writes are refused by the store already; this stops its
    /// work and its lease's renewal (renewed on, the lease would keep the run from the
    /// other hosts with nobody driving it), and gives nothing back.
    pub(crate) fn lose(&self, id: &str, epoch: u64) {
        if let Some(f) = &self.fleet {
            f.stop_renewing(id, epoch);
        }
        let active = self.active();
        if let Some(a) = active.get(id)
            && a.epoch == epoch
        {
            if !a.lost.swap(true, Ordering::SeqCst) {
                tracing::warn!(run_id = %id, "{}", lost_lease(id, epoch));
            }
            a.control.stop();
        }
    }

    /// Stops accepting runs' work: stops every driver and waits up to `timeout` for
    /// them. Returns how many were still running when it gave up.
    pub async fn shutdown(&self, timeout: std::time::Duration) -> usize {
        self.shutdown.cancel();
        self.tasks.close();
        match tokio::time::timeout(timeout, self.tasks.wait()).await {
            Ok(()) => 0,
            Err(_) => self.active().len().max(1),
        }
    }
}

/// What a host says when it lost the lease of run `id` (held at `epoch`).
fn lost_lease(id: &str, epoch: u64) -> String {
    format!(
        "run {id}: this host lost its lease (epoch {epoch}): another host may drive it now, so it is stopped here and nothing more of it is written"
    )
}

/// Runs blocking store work (SQLite, waits for synced writes) off the async threads.
pub(crate) async fn blocking<T: Send + 'static, E: Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        // The closure panicked: that is a bug, and the server cannot go on sanely.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
