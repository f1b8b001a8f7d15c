//! The runs a server owns: created (durable before asynchronous), adopted after a
//! restart, resumed and cancelled on request, each driven by a worker; at most
//! `workers` runs execute at once, the rest wait for a slot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use heddle_core::plan::{Issue, Plan, ValidationError};
use heddle_core::{GraphDoc, Record, RunStatus, SkipReason, Value};
use heddle_kernel::runtime::{Run, RunCanceller, RunOptions};
use heddle_kernel::supervisor::{Bounds, Verdict};
use heddle_store::session::{self, Resumption, Session};
use heddle_store::status::RunState;
use heddle_store::{RunStore, SqliteStore, StoreError, SuperviseMode};
use heddle_supervisor::interactive::{Answer, AnswerError, Desk, Interactive, Notice, Pending};
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::coding::Coding;
use super::feed::{Feed, Subscription};
use super::mask::Mask;
use crate::cli::Supervise;
use crate::durable::{self, gates};
use crate::providers::Env;

/// Largest graph the API plans: nodes plus edges. A document this size is already far
/// beyond a hand-drawn graph; the bound keeps one request from holding the planner.
pub const MAX_GRAPH_ITEMS: usize = 20_000;

/// Why a request for a new run was refused; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Doc(#[from] heddle_core::graph::DocError),
    #[error("the graph has {items} nodes and edges; this server plans at most {max}")]
    TooLarge { items: usize, max: usize },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Inputs(#[from] heddle_core::plan::InputErrors),
    #[error("{0}")]
    Budget(String),
    #[error(transparent)]
    SecretInput(#[from] durable::SecretInput),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a create request may set besides the graph and its inputs.
#[derive(Debug, Default, Clone, Copy)]
pub struct CreateOptions {
    /// The run's supervisor handle; the server's `--supervise` when absent.
    pub supervise: Option<Supervise>,
    /// The run's budget; `[store]`'s keys of the same names when absent.
    pub max_dispatches: Option<u64>,
    pub time_limit_ms: Option<u64>,
}

/// Desks of ended runs kept for late answers.
const ENDED_DESKS: usize = 64;

impl CreateError {
    /// The problems as `heddle validate --json` lists them.
    pub fn issues(&self) -> &[Issue] {
        match self {
            CreateError::Invalid(v) => &v.issues,
            _ => &[],
        }
    }
}

/// A run a worker of this server drives.
struct Active {
    /// Cancelled by a user's cancel request.
    cancel: CancellationToken,
    /// Its log rendered for its subscribers, as the follower reads it (see `feed`).
    feed: Arc<Feed>,
    /// Its escalations waiting for a person, under interactive supervision.
    desk: Option<Arc<Desk>>,
    /// The kernel's cancel, once the run started: a user's cancel reaches the run
    /// before its pending decision is withdrawn, so the kernel takes the withdrawal for
    /// the cancel it is, not for a `fail` verdict.
    kernel: Arc<std::sync::OnceLock<RunCanceller>>,
}

/// How the server supervises the runs it drives.
pub struct Supervision {
    /// For a run created without a choice of its own.
    pub default: Supervise,
    pub decision_timeout: std::time::Duration,
}

pub struct Host {
    pub store: Arc<SqliteStore>,
    section: durable::StoreSection,
    env: Env,
    workers: Arc<Semaphore>,
    active: Mutex<HashMap<String, Active>>,
    /// The desks of the last runs that ended here, so a late answer is told what became
    /// of its escalation (withdrawn, timed out) rather than that it never existed.
    ended: Mutex<std::collections::VecDeque<(String, Arc<Desk>)>>,
    supervision: Supervision,
    /// Masks the operator's secrets out of everything the API sends.
    pub mask: Arc<Mask>,
    tasks: TaskTracker,
    /// Where the runs execute (see `serve::run`).
    runs: tokio::runtime::Handle,
    /// Cancelled when the server shuts down: workers stop their runs without recording
    /// an ending, so the next owner adopts them.
    pub shutdown: CancellationToken,
}

impl Host {
    pub fn new(
        store: Arc<SqliteStore>,
        section: durable::StoreSection,
        env: Env,
        workers: usize,
        supervision: Supervision,
        runs: tokio::runtime::Handle,
    ) -> Host {
        let mask = Arc::new(Mask::new(
            crate::execute::run_secrets(&env, None).snapshot(),
        ));
        Host {
            store,
            section,
            env,
            workers: Arc::new(Semaphore::new(workers)),
            active: Mutex::new(HashMap::new()),
            ended: Mutex::new(Default::default()),
            supervision,
            mask,
            tasks: TaskTracker::new(),
            runs,
            shutdown: CancellationToken::new(),
        }
    }

    /// [`blocking`] on the runs' own threads: a run's log writer, started by opening
    /// its session, is a thread of the runs', with their priority (see `serve::run`).
    async fn on_runs<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.runs.spawn_blocking(f).await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The secret values a write to a run's log outside a run (a rejection, a cancel
    /// of a run no worker drives) masks out; what [`Host::mask`] masks too.
    fn known_secrets(&self) -> Vec<String> {
        crate::execute::run_secrets(&self.env, None).snapshot()
    }

    fn dyn_store(&self) -> Arc<dyn RunStore> {
        self.store.clone()
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
        // Nothing panics while holding it; a poisoned map is still consistent.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans `graph` with `inputs`, records the run and its first record durably, and
    /// only then hands it to a worker: the returned id names a run that exists on disk.
    pub async fn create(
        self: &Arc<Self>,
        name: &str,
        graph: &serde_json::Value,
        inputs: serde_json::Map<String, serde_json::Value>,
        options: CreateOptions,
    ) -> Result<String, CreateError> {
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
        let plan = heddle_core::plan::plan(&doc, &self.env.registry)?;
        let values = inputs
            .into_iter()
            .map(|(k, v)| (k, Value::from_json(v)))
            .collect();
        plan.bind_inputs(&values)?;
        let opts = RunOptions {
            secrets: crate::execute::run_secrets(&self.env, None),
            inputs: values,
            node_timeout: self.env.config.run.node_timeout(),
            ..RunOptions::default()
        };
        let budget = self
            .section
            .budget(true, options.max_dispatches, options.time_limit_ms)
            .map_err(|e| CreateError::Budget(format!("{e:#}")))?;
        let mut run = durable::record(
            &self.env,
            name.to_string(),
            text.into_bytes(),
            &plan,
            &opts,
            budget,
        )?;
        let supervise = options.supervise.unwrap_or(self.supervision.default);
        run.limits.supervise = Some(match supervise {
            Supervise::None => SuperviseMode::None,
            Supervise::Interactive => SuperviseMode::Interactive,
        });
        let store = self.dyn_store();
        let (header, session) = self.on_runs(move || session::begin(store, &run)).await?;
        self.spawn(session, plan, opts, supervise);
        Ok(header.run_id)
    }

    /// Takes over every run a previous owner left running (it continues from its log);
    /// paused and finished runs are left as they are. A run that cannot be planned again
    /// (a package changed) is reported and left alone.
    pub async fn adopt_all(self: &Arc<Self>) -> Result<Vec<String>, StoreError> {
        let store = self.dyn_store();
        let runs = blocking(move || durable::list_states(&*store)).await?;
        let mut adopted = Vec::new();
        for (summary, state) in runs {
            if !matches!(state, RunState::Running | RunState::Interrupted) {
                continue;
            }
            let id = summary.run_id;
            match self.adopt(&id).await {
                Ok(()) => adopted.push(id),
                Err(e) => eprintln!("warning: run {id} not adopted: {e:#}"),
            }
        }
        Ok(adopted)
    }

    async fn adopt(self: &Arc<Self>, id: &str) -> anyhow::Result<()> {
        // A run a watchdog supervises is its watchdog's to recover.
        crate::watchdog::refuse_if_locked(&self.section, id)?;
        let store = self.dyn_store();
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
        self.reopen_and_spawn(r, None, None).await
    }

    /// A user's resume of a paused or interrupted run (at `pause` when given).
    pub async fn resume(self: &Arc<Self>, id: &str, pause: Option<u64>) -> anyhow::Result<()> {
        crate::watchdog::refuse_if_locked(&self.section, id)?;
        let store = self.dyn_store();
        let run_id = id.to_string();
        let r = blocking(move || session::check_resume(&*store, &run_id, pause)).await?;
        let doc = durable::stored_graph(&r.header)?;
        // A run waiting at a gate is answered (approve/reject), not resumed.
        crate::durable::gates::refuse_resume_at_gate(&r, &doc)?;
        self.reopen_and_spawn(r, Some(doc), None).await
    }

    /// A person approves `gate` of a run waiting there: recorded, then the run goes on.
    pub async fn approve(
        self: &Arc<Self>,
        id: &str,
        gate: &str,
        note: Option<String>,
    ) -> anyhow::Result<()> {
        crate::watchdog::refuse_if_locked(&self.section, id)?;
        let store = self.dyn_store();
        let (run_id, gate_id) = (id.to_string(), gate.to_string());
        let (r, _, approval) =
            tokio::task::spawn_blocking(move || gates::approval(&*store, &run_id, &gate_id, note))
                .await??;
        self.reopen_and_spawn(r, None, Some(approval)).await
    }

    /// A person rejects `gate`: the run ends cancelled with the gate's title and `note`.
    pub async fn reject(&self, id: &str, gate: &str, note: String) -> anyhow::Result<String> {
        crate::watchdog::refuse_if_locked(&self.section, id)?;
        let store = self.dyn_store();
        let (run_id, gate_id) = (id.to_string(), gate.to_string());
        let secrets = self.known_secrets();
        tokio::task::spawn_blocking(move || {
            gates::record_rejection(store, &run_id, &gate_id, &note, &secrets)
        })
        .await?
    }

    async fn reopen_and_spawn(
        self: &Arc<Self>,
        r: Resumption,
        doc: Option<GraphDoc>,
        approval: Option<gates::Approval>,
    ) -> anyhow::Result<()> {
        let doc = match doc {
            Some(d) => d,
            None => durable::stored_graph(&r.header)?,
        };
        let (plan, opts) = durable::prepare(&self.env, &r, &doc, approval.as_ref())?;
        let supervise = match r.header.run.limits.supervise {
            Some(SuperviseMode::Interactive) => Supervise::Interactive,
            Some(SuperviseMode::None) | None => Supervise::None,
        };
        let store = self.dyn_store();
        let session = self.on_runs(move || session::reopen(store, &r)).await?;
        // Before the approval's note is recorded: no record goes in unmasked.
        self.section.configure_spill(&session, &opts.secrets);
        let session = match approval {
            None => session,
            Some(a) => {
                // On disk before anything runs on from the gate.
                tokio::task::spawn_blocking(move || gates::record(&session, &a).map(|_| session))
                    .await??
            }
        };
        if let Some(e) = session.exhausted_at_open() {
            // Its time limit was used up before this server took it: nothing runs.
            blocking(move || session::end_exhausted(&session, e).map(|_| ())).await?;
            return Ok(());
        }
        self.spawn(session, plan, opts, supervise);
        Ok(())
    }

    /// Cancels a run: one this server drives is stopped and records its ending; any
    /// other unfinished run is taken over and recorded cancelled.
    pub async fn cancel(&self, id: &str) -> Result<(), StoreError> {
        if let Some(a) = self.active().get(id) {
            a.cancel.cancel();
            if let Some(k) = a.kernel.get() {
                k.cancel();
            }
            // Withdrawn before the cancel returns: the API never offers a decision
            // about a run that is going away.
            if let Some(d) = &a.desk {
                d.withdraw_all();
            }
            return Ok(());
        }
        let store = self.dyn_store();
        let run_id = id.to_string();
        let secrets = self.known_secrets();
        blocking(move || session::cancel(store, &run_id, &secrets)).await
    }

    /// Whether a worker of this server drives `id`, and a subscription to its feed.
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
        let store = self.dyn_store();
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

    fn spawn(
        self: &Arc<Self>,
        session: Session,
        plan: Plan,
        mut opts: RunOptions,
        supervise: Supervise,
    ) {
        self.section.configure_spill(&session, &opts.secrets);
        let cancel = CancellationToken::new();
        let kernel = Arc::new(std::sync::OnceLock::new());
        let feed = Arc::new(Feed::default());
        let desk = match supervise {
            Supervise::None => None,
            Supervise::Interactive => {
                let desk = Desk::new(self.supervision.decision_timeout);
                opts.supervisor = Some(Interactive::bounded(desk.clone(), Bounds::default()));
                Some(desk)
            }
        };
        let done = CancellationToken::new();
        self.tasks.spawn(super::feed::follow(
            feed.clone(),
            self.store.clone(),
            self.mask.clone(),
            session.run_id.clone(),
            done.clone(),
        ));
        self.active().insert(
            session.run_id.clone(),
            Active {
                cancel: cancel.clone(),
                feed,
                desk: desk.clone(),
                kernel: kernel.clone(),
            },
        );
        let host = self.clone();
        let kernel_of_this = kernel.clone();
        let task = async move {
            let run_id = session.run_id.clone();
            let session = Arc::new(session);
            if let Err(e) = host.work(session.clone(), plan, opts, cancel, kernel).await {
                eprintln!(
                    "error: run {run_id}: {}",
                    crate::exit::bounded(&format!("{e:#}"))
                );
            }
            // Closing a log waits for its writer thread, which must not happen on an
            // async thread: after a failed write (a lost lease) nothing else closed it,
            // and the last reference would close it wherever it was dropped.
            let _ = blocking(move || session.log.close()).await;
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
            // worker's entry: a resume may have started the next worker of the run
            // (which replaced it) while this one was still closing its log, and removing
            // that one would leave its run without feed, desk or cancel.
            {
                let mut active = host.active();
                if active
                    .get(&run_id)
                    .is_some_and(|a| Arc::ptr_eq(&a.kernel, &kernel_of_this))
                {
                    active.remove(&run_id);
                }
            }
            done.cancel();
        };
        self.tasks.spawn_on(task, &self.runs);
    }

    /// One run from a free worker slot to its recorded ending.
    async fn work(
        &self,
        session: Arc<Session>,
        plan: Plan,
        mut opts: RunOptions,
        cancel: CancellationToken,
        kernel: Arc<std::sync::OnceLock<RunCanceller>>,
    ) -> anyhow::Result<()> {
        let permit = tokio::select! {
            p = self.workers.clone().acquire_owned() => Some(p?),
            _ = cancel.cancelled() => None,
            _ = self.shutdown.cancelled() => None,
        };
        if permit.is_none() {
            return if cancel.is_cancelled() {
                finish_cancelled(session).await
            } else {
                close(session).await
            };
        }
        opts.journal = Some(session.journal.clone());
        let run = match Run::new(plan, &self.env.registry, opts) {
            Ok(run) => run,
            Err(e) => {
                let error = crate::exit::bounded(&format!("{:#}", anyhow::Error::from(e)));
                let s = session.clone();
                return blocking(move || {
                    // As the kernel reports a run that failed before it started.
                    session::end_unrun(
                        &s,
                        RunStatus::Failed,
                        Some(error),
                        SkipReason::UpstreamFailed,
                    )
                    .map(|_| ())
                })
                .await
                .map_err(Into::into);
            }
        };
        let handle = run.start();
        for input in handle.plan().inputs().iter().filter(|i| i.streaming) {
            // The API has no live feed into a run: a streaming input gets the value its
            // request gave (which the kernel pushed) as its only item, then ends, so
            // the run can finish.
            let _ = handle.finish_input(&input.name).await;
        }
        let canceller = handle.canceller();
        let _ = kernel.set(handle.canceller());
        // The run time limit's clock: execution left from when this server took it.
        let time_limit = session.time_left().map(|left| {
            let canceller = handle.canceller();
            let (journal, limit_ms) = (session.journal.clone(), session.budget.time_limit_ms);
            tokio::spawn(async move {
                tokio::time::sleep(left).await;
                journal.exhaust(heddle_store::Exhausted::Time {
                    limit_ms: limit_ms.unwrap_or(0),
                });
                canceller.cancel();
            })
        });
        let wait = handle.wait();
        tokio::pin!(wait);
        let mut shut_down = false;
        let result = tokio::select! {
            // A cancel is recorded even when it already ended the run (see `cancel`).
            biased;
            _ = cancel.cancelled() => {
                session.log.append(Record::CancelRequested);
                canceller.cancel();
                wait.await
            }
            _ = self.shutdown.cancelled() => {
                shut_down = true;
                canceller.cancel();
                wait.await
            }
            r = &mut wait => r,
        };
        drop(permit);
        if let Some(t) = time_limit {
            t.abort();
        }
        if shut_down {
            return close(session).await;
        }
        let s = session.clone();
        blocking(move || session::end(&s, &result, false).map(|_| ())).await?;
        Ok(())
    }

    /// Stops accepting runs' work: cancels every worker and waits up to `timeout` for
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

/// Ends a run a user cancelled before it got a worker.
async fn finish_cancelled(session: Arc<Session>) -> anyhow::Result<()> {
    blocking(move || {
        session.log.append(Record::CancelRequested);
        session::end_unrun(
            &session,
            RunStatus::Cancelled,
            Some("cancelled through the API".into()),
            SkipReason::Cancelled,
        )
        .map(|_| ())
    })
    .await
    .map_err(Into::into)
}

/// Makes what the run wrote durable and stops its log without an ending: the run stays
/// running on disk, for the next owner to adopt.
async fn close(session: Arc<Session>) -> anyhow::Result<()> {
    blocking(move || session.log.close())
        .await
        .map_err(Into::into)
}

/// Runs blocking store work (SQLite, waits for synced writes) off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        // The closure panicked: that is a bug, and the server cannot go on sanely.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
