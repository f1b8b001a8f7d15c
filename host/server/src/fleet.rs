//! A host among several on one store ([`heddle_store::Fleet`], PostgreSQL): what it
//! does besides answering requests.
//!
//! - **Claims** ([`serve`]): whenever it has free worker slots, it claims that many runs
//!   from the store's queue (`FOR UPDATE SKIP LOCKED`: hosts claiming at once never get
//!   the same run) and runs whose lease expired (a dead, paused or partitioned host's),
//!   each taken over and continued from its log by the crash table: recorded results are
//!   never run again, uncertain work that is not retry-safe pauses for a person, a
//!   restart is never an approval. It looks when woken (`LISTEN/NOTIFY`: a run queued, a
//!   slot freed here) and every [`POLL`] whatever happens, as wake-ups can be lost.
//! - **Leases** ([`serve`]'s heartbeat): its registration and every run lease it holds are
//!   renewed every third of the TTL in one statement. A run whose renewal finds it gone
//!   is stopped here at once (another host may drive it; the store refuses this host's
//!   writes already). A host that has not renewed for a whole TTL (the database out of
//!   reach) stops its runs by itself, since their leases have expired for everyone else,
//!   and claims nothing until it reaches the database again; a registration found gone
//!   is made again.
//! - **Requests for its runs** from other hosts: a cancel ([`Wake::Cancel`]) and the
//!   commands another host relays to the run's (escalations listed and answered),
//!   carried out and answered through the store.
//! - **No run stranded.** A claimed run this host could not take (any failure but a lost
//!   lease or a damaged log) is queued again, claimable after a pause that grows while it
//!   keeps failing here ([`take_retry`]); the log says why. Given back idle, it would
//!   never be claimed again: idle is for runs that wait for a person.
//! - **Runs other hosts drive** are followed from the store for this host's event
//!   subscribers ([`Host::subscribe`]), one follower per run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::Response;
use heddle_store::fleet::{Claimed, GiveBack, Heartbeat, Wake, renewal_retry, take_retry};
use heddle_store::session::{self, Resumption};
use heddle_store::status::{Liveness, RunState};
use heddle_store::{Fleet, StoreError};
use tokio_util::sync::CancellationToken;

use crate::coding::Coding;
use crate::feed::{Feed, Subscription};
use crate::host::{Host, RELAY_WAIT, blocking};

/// How often a host looks for work and for requests whatever it was told: the latency
/// of a run queued while its wake-up was lost.
pub const POLL: Duration = Duration::from_secs(1);

/// How often the follower of a run another host drives checks whether it still does.
const WATCH_LOOK: Duration = Duration::from_millis(500);

/// Claims work and keeps this host's leases until `host` shuts down; `api` is where it
/// answers (what its registration names). The host must be registered already
/// ([`Fleet::register`]).
pub async fn serve(host: Arc<Host>, api: String, ttl: Duration) {
    serve_polling(host, api, ttl, POLL).await
}

/// [`serve`], looking for work every `poll` whatever it was told instead of every
/// [`POLL`]: a test that makes `poll` longer than it waits tells a claim the store's
/// wake-up (`LISTEN/NOTIFY`) brought from one the poll found.
pub async fn serve_polling(host: Arc<Host>, api: String, ttl: Duration, poll: Duration) {
    let Some(fleet) = host.fleet.clone() else {
        return;
    };
    let heartbeat = tokio::spawn(heartbeat(host.clone(), fleet.clone(), api, ttl));
    claim_loop(host, fleet, poll).await;
    heartbeat.abort();
}

/// How long a run's failures here are remembered after its last one: longer than the
/// longest pause ([`take_retry`]), so a run failing again is counted on.
const RETRIES_FORGOTTEN: Duration = Duration::from_secs(600);

/// How many times in a row each run failed here (its take, or its driver), for the pause
/// before it is claimable again ([`take_retry`]): a run that keeps failing is tried now
/// and then, neither in a loop nor never.
#[derive(Default)]
pub(crate) struct Retries(Mutex<HashMap<String, (u32, Instant)>>);

impl Retries {
    /// Counts one more failure of `run`: how many in a row, and the pause before the run
    /// is claimable again.
    pub(crate) fn failed(&self, run: &str) -> (u32, Duration) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Runs that stopped failing here (taken elsewhere since, ended) are forgotten.
        m.retain(|_, (_, at)| now.duration_since(*at) < RETRIES_FORGOTTEN);
        let (n, at) = m.entry(run.to_string()).or_insert((0, now));
        *n += 1;
        *at = now;
        (*n, take_retry(*n))
    }

    /// `run` made progress here: its next failure counts from one.
    pub(crate) fn forget(&self, run: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(run);
    }
}

/// Whether the database answered the last time this host tried, to say each change
/// once.
#[derive(Default)]
struct Reach {
    lost_since: Option<Instant>,
}

impl Reach {
    fn failed(&mut self, what: &str, e: &StoreError) {
        if self.lost_since.is_none() {
            tracing::warn!("{what}: {e}; no runs are claimed until the database answers again");
            self.lost_since = Some(Instant::now());
        }
    }

    fn answered(&mut self) {
        if let Some(t) = self.lost_since.take() {
            tracing::info!(
                "the database answers again (after {} ms); claiming runs",
                t.elapsed().as_millis()
            );
        }
    }
}

async fn claim_loop(host: Arc<Host>, fleet: Arc<dyn Fleet>, poll: Duration) {
    let mut wake = match blocking({
        let f = fleet.clone();
        move || f.subscribe()
    })
    .await
    {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("no wake-ups from the store ({e}); looking every {poll:?}");
            None
        }
    };
    let mut reach = Reach::default();
    loop {
        if host.shutdown.is_cancelled() {
            return;
        }
        claim(&host, &fleet, &mut reach).await;
        let woken = tokio::select! {
            w = async {
                match wake.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            } => match w {
                Some(w) => w,
                None => {
                    // The store's wake-ups ended: poll from now on.
                    wake = None;
                    Wake::Missed
                }
            },
            // A slot freed, or time to look anyway: claims only.
            _ = host.freed.notified() => Wake::Work { run_id: String::new() },
            _ = tokio::time::sleep(poll) => Wake::Work { run_id: String::new() },
            _ = host.shutdown.cancelled() => return,
        };
        match woken {
            Wake::Cancel { run_id } => cancel_here(&host, &run_id),
            Wake::Command { run_id, .. } => carry_out(&host, &run_id),
            Wake::Missed => {
                // Whatever was missed: the requests for every run driven here.
                for run in host.driving() {
                    if let Ok(true) = cancel_asked(&host, &run).await {
                        cancel_here(&host, &run);
                    }
                    carry_out(&host, &run);
                }
            }
            Wake::Work { .. } | Wake::CommandDone { .. } => {}
        }
    }
}

/// Claims as many runs as this host has free worker slots, and hands each to a driver.
/// The slots are taken only once the runs are claimed: held through the claim, they made
/// a run created here meanwhile find none and queue itself (another host then drove it).
/// A run claimed for a slot a create took meanwhile is queued again at once.
async fn claim(host: &Arc<Host>, fleet: &Arc<dyn Fleet>, reach: &mut Reach) {
    let n = host.workers.available_permits();
    if n == 0 {
        return;
    }
    let f = fleet.clone();
    let claimed = match blocking(move || f.claim(n)).await {
        Ok(c) => {
            reach.answered();
            c
        }
        Err(e) if e.is_transient() => return reach.failed("claiming runs", &e),
        // Its registration expired: the heartbeat registers it again.
        Err(e @ StoreError::HostLost { .. }) => return reach.failed("claiming runs", &e),
        Err(e) => {
            tracing::warn!("claiming runs: {e}");
            return;
        }
    };
    for c in claimed {
        match host.workers.clone().try_acquire_owned() {
            Ok(slot) => take_claimed(host, fleet, c, slot).await,
            Err(_) => {
                tracing::debug!(run_id = %c.run_id, "run {}: no slot free any more; queued again", c.run_id);
                hand_back(fleet, &c.run_id, GiveBack::QUEUED).await;
            }
        }
    }
}

/// Drives a run this host just claimed: continued from its log by the crash table
/// (never a person's decision: no pause reopened, no uncertain work offered again). A
/// run that needs no driver (paused, ended) or whose log is damaged is given back idle,
/// for a person. One that could not be taken for any other reason (a package missing
/// here, the database away or refusing, another taker's records in between) is queued
/// again for any host after a pause ([`Retries`]): idle, it would never be claimed again
/// and wait forever.
async fn take_claimed(
    host: &Arc<Host>,
    fleet: &Arc<dyn Fleet>,
    c: Claimed,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let id = c.run_id.clone();
    match &c.adopted_from {
        Some(from) => {
            tracing::info!(run_id = %id, "run {id}: adopted from host {from} (its lease expired)")
        }
        None => tracing::debug!(run_id = %id, "run {id}: claimed from the queue"),
    }
    let _turn = host.handover(&id).await;
    let store = host.store.clone();
    let run_id = id.clone();
    let taken = async {
        heddle_runtime::watch::refuse_if_locked(host.runtime().settings(), &id)?;
        let (header, records, view) = blocking(move || session::inspect(&*store, &run_id)).await?;
        if !matches!(
            view.state,
            RunState::Running | RunState::Interrupted | RunState::Queued
        ) {
            // Nothing to drive: a pause waits for a person, an ending is final.
            return Ok(false);
        }
        let r = Resumption {
            header,
            records,
            view,
            pause: None,
        };
        host.reopen_and_spawn(r, None, None, Some(slot)).await?;
        Ok::<_, heddle_runtime::Error>(true)
    };
    match taken.await {
        Ok(true) => {}
        Ok(false) => hand_back(fleet, &id, GiveBack::Idle).await,
        // Its lease expired meanwhile or another host has it now: nothing to give back
        // (an expired lease is claimable by anyone).
        Err(heddle_runtime::Error::Store(e)) if e.is_lost_lease() => {
            tracing::info!(run_id = %id, "run {id} not taken: {e}");
        }
        // Quarantined: nothing of it runs until a person looks.
        Err(heddle_runtime::Error::Store(e)) if e.is_damaged_run() => {
            tracing::warn!(run_id = %id, "run {id} not taken: {e}; it waits for a person");
            hand_back(fleet, &id, GiveBack::Idle).await;
        }
        Err(e) => {
            let (n, after) = host.retries.failed(&id);
            tracing::warn!(
                run_id = %id,
                "run {id} not taken ({n} failure(s) in a row here): {}; queued again, claimable in {} ms",
                heddle_core::text::error_chain(&e),
                after.as_millis()
            );
            hand_back(fleet, &id, GiveBack::Queued { after }).await;
        }
    }
}

/// Gives run `id` back (to wait as `back` says) if this host holds its lease, at
/// whatever epoch it holds it now ([`Fleet::hand_back`]: not renewed from here on, even
/// when the database cannot be reached now; a lease read first and failing left the run
/// renewed here forever with nobody driving it).
async fn hand_back(fleet: &Arc<dyn Fleet>, id: &str, back: GiveBack) {
    let f = fleet.clone();
    let run = id.to_string();
    let r = blocking(move || f.hand_back(&run, back)).await;
    if let Err(e) = r {
        tracing::warn!(run_id = %id, "run {id}: not handed back ({e}); its lease expires on its own");
    }
}

/// Renews this host's registration and leases every third of `ttl`; stops the runs
/// whose leases were lost; registers again when the registration was. A renewal is
/// waited for a third of the TTL at most (a partition holds a call for the whole
/// operation timeout): one still without an answer counts as failed, and is not doubled
/// while it waits. One that failed is tried again soon ([`renewal_retry`]), not a whole
/// period later. A host that renewed nothing for a whole TTL stops every run by itself:
/// the others may take them from then on.
async fn heartbeat(host: Arc<Host>, fleet: Arc<dyn Fleet>, api: String, ttl: Duration) {
    let period = ttl / 3;
    // When the last renewal that succeeded was sent (its leases last `ttl` from a moment
    // after that on the database's clock).
    let mut renewed_at = Instant::now();
    let mut fenced = false;
    let mut pending: Option<(
        Instant,
        tokio::task::JoinHandle<Result<Heartbeat, StoreError>>,
    )> = None;
    // The pause of the renewal being retried, if one is.
    let mut retrying: Option<Duration> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(retrying.unwrap_or(period)) => {}
            _ = host.shutdown.cancelled() => return,
        }
        let (sent, mut renewal) = match pending.take() {
            Some(p) => p,
            None => {
                let f = fleet.clone();
                (
                    Instant::now(),
                    tokio::task::spawn_blocking(move || f.heartbeat()),
                )
            }
        };
        let answer = match tokio::time::timeout(period, &mut renewal).await {
            Ok(joined) => joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
            Err(_) => {
                pending = Some((sent, renewal));
                Err(StoreError::Unavailable {
                    target: String::new(),
                    op: "renewing leases",
                    source: format!("no answer within {period:?}").into(),
                })
            }
        };
        retrying = match &answer {
            Err(e) if e.is_transient() => Some(renewal_retry(retrying, period)),
            _ => None,
        };
        match answer {
            Ok(hb) => {
                host.metrics.lease_renewed(true);
                host.metrics.lease_held(true);
                if fenced {
                    tracing::info!("leases renewed again; this host claims runs again");
                    fenced = false;
                }
                renewed_at = sent;
                for l in hb.lost {
                    host.lose(&l.run_id, l.epoch);
                }
            }
            Err(StoreError::HostLost { why, .. }) => {
                tracing::warn!(
                    "this host's registration was lost ({why}): its runs' leases expired, so they are stopped here; registering again"
                );
                host.metrics.lease_renewed(false);
                stop_all(&host);
                let (f, a) = (fleet.clone(), api.clone());
                let now = Instant::now();
                match blocking(move || f.register(&a)).await {
                    Ok(()) => {
                        renewed_at = now;
                        tracing::info!("registered again as host {}", fleet.host_id());
                    }
                    Err(e) => tracing::warn!("registering again: {e}"),
                }
                // Stopped already; the next renewal says when claims resume.
                fenced = true;
            }
            Err(e) => tracing::warn!("renewing leases: {e}"),
        }
        if !fenced && renewed_at.elapsed() >= ttl {
            // Every lease this host held has expired for the others: another host may
            // take these runs now. Their writes are refused by the store anyway; their
            // work stops here too.
            tracing::warn!(
                "no lease renewed for {} ms (the lease TTL): every run of this host is stopped; claims resume once the database answers",
                ttl.as_millis()
            );
            host.metrics.lease_held(false);
            stop_all(&host);
            fenced = true;
        }
    }
}

/// Stops every run this host drives as one whose lease was lost.
fn stop_all(host: &Host) {
    let held: Vec<(String, u64)> = host
        .active()
        .iter()
        .map(|(r, a)| (r.clone(), a.epoch))
        .collect();
    for (run, epoch) in held {
        host.lose(&run, epoch);
    }
}

/// A cancel another host (or a command line) asked for, of a run driven here: the same
/// cancel as one asked here. (The driver also finds the request by itself.)
fn cancel_here(host: &Arc<Host>, run: &str) {
    let active = host.active();
    if let Some(a) = active.get(run) {
        a.cancel_asked();
    }
}

/// Whether a cancel of run `run` was asked for through the store.
async fn cancel_asked(host: &Arc<Host>, run: &str) -> Result<bool, StoreError> {
    let (store, run) = (host.store.clone(), run.to_string());
    blocking(move || store.cancel_requested(&run)).await
}

/// Carries out the pending commands for run `run` if it is driven here, off the claim
/// loop, and records each one's answer.
fn carry_out(host: &Arc<Host>, run: &str) {
    let Some(epoch) = host.active().get(run).map(|a| a.epoch) else {
        return;
    };
    let Some(fleet) = host.fleet.clone() else {
        return;
    };
    let (host, run) = (host.clone(), run.to_string());
    tokio::spawn(async move {
        let (f, r) = (fleet.clone(), run.clone());
        let pending = match blocking(move || f.pending_commands(&r)).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(run_id = %run, "run {run}: reading its commands: {e}");
                return;
            }
        };
        for c in pending {
            let (status, body) = answer_command(&host, &run, &c.kind, c.body).await;
            let outcome = serde_json::json!({ "status": status.as_u16(), "body": body });
            let (f, r) = (fleet.clone(), run.clone());
            if let Err(e) = blocking(move || f.finish_command(&r, epoch, c.id, &outcome)).await {
                tracing::warn!(run_id = %run, "run {run}: answering command {}: {e}", c.id);
            }
        }
    });
}

/// The answer to a relayed request, as the route would give it here.
async fn answer_command(
    host: &Arc<Host>,
    run: &str,
    kind: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    use crate::api::escalations::{ANSWER, LIST, Relayed, answer_here, list_here};
    match kind {
        LIST => list_here(host, run).await,
        ANSWER => match serde_json::from_value::<Relayed>(body) {
            Ok(r) => answer_here(host, run, &r.eid, r.request).await,
            Err(e) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                serde_json::json!({ "error": format!("a relayed answer: {e}") }),
            ),
        },
        other => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({ "error": format!("a relayed request this host does not know: {other}") }),
        ),
    }
}

impl Host {
    /// Relays a request about run `id` (command `kind` with `body`) to the host that
    /// drives it, when another host does, and returns its answer; `None` when the
    /// request is answered here (the run is driven here, by nobody, or the store is
    /// this server's alone). A host that does not answer within [`RELAY_WAIT`] is a 504.
    pub(crate) async fn relay(
        self: &Arc<Self>,
        id: &str,
        kind: &str,
        body: serde_json::Value,
    ) -> Result<Option<Response>, crate::api::state::ApiError> {
        use crate::api::state::ApiError;
        let Some(fleet) = self.fleet.clone() else {
            return Ok(None);
        };
        if self.active().contains_key(id) {
            return Ok(None);
        }
        let (store, run) = (self.store.clone(), id.to_string());
        let owner = match blocking(move || store.liveness(&run)).await? {
            Liveness::Lease {
                holder: Some(h), ..
            } if h != fleet.host_id() => h,
            _ => return Ok(None),
        };
        let (f, run, kind) = (fleet.clone(), id.to_string(), kind.to_string());
        let answer = blocking(move || ask(&*f, &run, &kind, &body)).await?;
        match answer {
            Some(outcome) => {
                let status = outcome["status"]
                    .as_u64()
                    .and_then(|s| StatusCode::from_u16(s as u16).ok())
                    .unwrap_or(StatusCode::BAD_GATEWAY);
                Ok(Some(crate::api::escalations::reply((
                    status,
                    outcome["body"].clone(),
                ))))
            }
            None => Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "run {id} is driven by host {owner}, which did not answer within {} s; try again",
                    RELAY_WAIT.as_secs()
                ),
            )),
        }
    }

    /// A subscription to run `id`'s feed: its driver's when it is driven here, else (on
    /// a shared store) the one follower of this host for a run another host drives or
    /// one waiting in the queue; `None` when nobody drives it (its log as it is is all
    /// there is).
    pub async fn subscribe(self: &Arc<Self>, id: &str, coding: Coding) -> Option<Subscription> {
        if let Some(s) = self.feed(id, coding) {
            return Some(s);
        }
        self.fleet.as_ref()?;
        let (store, run) = (self.store.clone(), id.to_string());
        let state = blocking(move || heddle_store::status::state_of(&*store, &run))
            .await
            .ok()?;
        if !matches!(state, RunState::Running | RunState::Queued) {
            return None;
        }
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = watched.get(id) {
            return Some(f.subscribe(coding));
        }
        let feed = Arc::new(Feed::default());
        let done = CancellationToken::new();
        self.tasks.spawn(crate::feed::follow(
            feed.clone(),
            self.store.clone(),
            self.mask.clone(),
            id.to_string(),
            done.clone(),
        ));
        self.tasks
            .spawn(watch(self.clone(), id.to_string(), feed.clone(), done));
        let sub = feed.subscribe(coding);
        watched.insert(id.to_string(), feed);
        Some(sub)
    }
}

/// Keeps the follower of run `id` (driven by another host) going while it is running or
/// queued and someone subscribes; then ends it (its subscribers get the rest of the log)
/// and forgets it.
async fn watch(host: Arc<Host>, id: String, feed: Arc<Feed>, done: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(WATCH_LOOK) => {}
            _ = host.shutdown.cancelled() => break,
        }
        let (store, run) = (host.store.clone(), id.clone());
        let live = matches!(
            blocking(move || heddle_store::status::state_of(&*store, &run)).await,
            Ok(RunState::Running | RunState::Queued)
        );
        let mut watched = host.watched.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock new subscribers take it: once nobody holds it, nobody will.
        if !live || feed.subscribers() == 0 {
            if watched.get(&id).is_some_and(|f| Arc::ptr_eq(f, &feed)) {
                watched.remove(&id);
            }
            break;
        }
    }
    done.cancel();
}

/// Sends command `kind` for run `id` to its owner and waits up to [`RELAY_WAIT`] for its
/// answer (`None`: none came).
fn ask(
    fleet: &dyn Fleet,
    id: &str,
    kind: &str,
    body: &serde_json::Value,
) -> Result<Option<serde_json::Value>, StoreError> {
    let deadline = Instant::now() + RELAY_WAIT;
    let cmd = fleet.send_command(id, kind, body)?;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(outcome) = fleet.command_outcome(cmd)? {
            return Ok(Some(outcome));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}
