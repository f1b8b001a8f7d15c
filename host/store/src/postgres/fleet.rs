//! The fleet on PostgreSQL: host registrations, run leases, claims and commands
//! ([`crate::fleet`] has the rules).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Inner, Pg, PgStore, on_conn};
use crate::StoreError;
use crate::fleet::{
    Claimed, Command, Fleet, GiveBack, Heartbeat, HostRow, LeaseRow, Wake, Wakeups, renewal_retry,
};

pub use crate::fleet::LostLease;

/// Milliseconds since the Unix epoch of a timestamptz expression, in SQL.
macro_rules! ms {
    ($e:literal) => {
        concat!("(extract(epoch FROM ", $e, ") * 1000)::bigint")
    };
}

/// Renews what `inner` holds every third of its TTL, until the store is dropped. A
/// renewal that could not reach the database is tried again soon ([`renewal_retry`]),
/// not a whole period later.
pub(super) fn keep(rt: &tokio::runtime::Handle, inner: Weak<Inner>) {
    let period = match inner.upgrade() {
        Some(i) => i.ttl / 3,
        None => return,
    };
    rt.spawn(async move {
        // The pause of the renewal being retried, if one is.
        let mut retrying: Option<Duration> = None;
        loop {
            tokio::time::sleep(retrying.unwrap_or(period)).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let idle = inner
                .held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
                && inner
                    .registration
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_none();
            if idle {
                retrying = None;
                continue;
            }
            // Leases it could not renew in time expire, and their appends are refused by
            // the database.
            retrying = match inner.clone().heartbeat().await {
                Ok(hb) => {
                    if !hb.lost.is_empty() {
                        inner
                            .lost
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .extend(hb.lost);
                    }
                    None
                }
                Err(e) if e.is_transient() => Some(renewal_retry(retrying, period)),
                Err(_) => None,
            };
        }
    });
}

/// What the renewals of a handle saw of the database lately, so that a lease found
/// expired says why: the database away for longer than the TTL is not the same as a
/// process that stopped renewing.
#[derive(Default)]
pub(crate) struct Renewals {
    /// Since when renewals have failed to reach the database, and the last such failure
    /// (none once one went through).
    failing: Option<(Instant, String)>,
    /// Runs whose lease the first renewal after such an outage found expired, with what
    /// to say of it.
    expired_in_outage: HashMap<String, String>,
}

impl Renewals {
    /// Notes what a renewal came to.
    fn saw(&mut self, r: &Result<Heartbeat, StoreError>) {
        match r {
            Err(e) if e.is_transient() => {
                let since = self.failing.as_ref().map_or_else(Instant::now, |f| f.0);
                self.failing = Some((since, e.to_string()));
            }
            Ok(hb) => {
                if self.failing.is_some() {
                    let why = self.outage();
                    for l in &hb.lost {
                        self.expired_in_outage.insert(l.run_id.clone(), why.clone());
                    }
                }
                self.failing = None;
            }
            Err(_) => {}
        }
    }

    /// What the current (or last) outage was.
    fn outage(&self) -> String {
        match &self.failing {
            Some((since, last)) => format!(
                "the database was away: no renewal reached it for {} ms (last: {last})",
                since.elapsed().as_millis()
            ),
            None => "the database was away".into(),
        }
    }

    /// Why the lease of `run` this handle held expired.
    pub(crate) fn why_expired(&self, run: &str) -> String {
        if let Some(why) = self.expired_in_outage.get(run) {
            format!("it expired while {why}")
        } else if self.failing.is_some() {
            format!("it expired while {}", self.outage())
        } else {
            "it expired without renewal (this process renewed nothing for a whole lease TTL: paused or starved)".into()
        }
    }

    /// `run` is held again: an old account of it no longer applies.
    pub(crate) fn forget(&mut self, run: &str) {
        self.expired_in_outage.remove(run);
    }
}

impl Inner {
    pub(super) fn incarnation(&self) -> Option<String> {
        self.registration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn register(self: Arc<Self>, api: String) -> Result<(), StoreError> {
        const OP: &str = "registering this host";
        let incarnation = crate::sqlite::new_run_id(crate::clock::now_ms());
        let hostname = crate::lease::host_name();
        let pid = i64::from(std::process::id());
        let ttl = self.ttl_ms();
        // Registering again replaces this handle's own registration.
        let ours = self.incarnation().unwrap_or_default();
        let taken = on_conn!(self, OP, |c| {
            let upsert = "INSERT INTO hosts (host_id, incarnation, hostname, pid, api, started_at,
                              last_seen, expires_at)
                          VALUES ($1, $2, $3, $4, $5, now(), now(), now() + $6::bigint * interval '1 millisecond')
                          ON CONFLICT (host_id) DO UPDATE SET incarnation = excluded.incarnation,
                              hostname = excluded.hostname, pid = excluded.pid, api = excluded.api,
                              started_at = now(), last_seen = now(), expires_at = excluded.expires_at
                          WHERE hosts.expires_at <= now() OR hosts.incarnation = $7
                          RETURNING 1";
            let mut done = c
                .query_opt(
                    upsert,
                    &[
                        &self.host_id,
                        &incarnation,
                        &hostname,
                        &pid,
                        &api,
                        &ttl,
                        &ours,
                    ],
                )
                .await
                .map_err(Pg::op(OP))?
                .is_some();
            if done {
                return Ok(None);
            }
            let row = c
                .query_one(
                    "SELECT incarnation, hostname, pid,
                            greatest(0, extract(epoch FROM expires_at - now()) * 1000)::bigint
                     FROM hosts WHERE host_id = $1",
                    &[&self.host_id],
                )
                .await
                .map_err(Pg::op(OP))?;
            let (old, other_host, other_pid): (String, String, i64) =
                (row.get(0), row.get(1), row.get(2));
            // A process of this machine that no longer exists cannot renew: its
            // registration is not waited out (a killed server restarts at once).
            if other_host == hostname && !crate::status::pid_alive(other_pid as u32) {
                done = c
                    .query_opt(
                        upsert,
                        &[
                            &self.host_id,
                            &incarnation,
                            &hostname,
                            &pid,
                            &api,
                            &ttl,
                            &old,
                        ],
                    )
                    .await
                    .map_err(Pg::op(OP))?
                    .is_some();
                if done {
                    return Ok(None);
                }
            }
            Ok(Some((
                other_host,
                other_pid as u32,
                row.get::<_, i64>(3) as u64,
            )))
        })?;
        if let Some((hostname, pid, left_ms)) = taken {
            return Err(StoreError::HostIdTaken {
                target: self.target.clone(),
                host_id: self.host_id.clone(),
                hostname,
                pid,
                left_ms,
            });
        }
        *self.registration.lock().unwrap_or_else(|e| e.into_inner()) = Some(incarnation);
        Ok(())
    }

    pub(super) async fn heartbeat(self: Arc<Self>) -> Result<Heartbeat, StoreError> {
        let r = self.clone().renew().await;
        self.renewals().saw(&r);
        r
    }

    /// One renewal of this handle's registration and leases.
    async fn renew(self: Arc<Self>) -> Result<Heartbeat, StoreError> {
        const OP: &str = "renewing leases";
        let held: Vec<(String, u64)> = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(r, e)| (r.clone(), *e))
            .collect();
        let runs: Vec<&str> = held.iter().map(|(r, _)| r.as_str()).collect();
        let epochs: Vec<i64> = held.iter().map(|(_, e)| *e as i64).collect();
        let incarnation = self.incarnation();
        let ttl = self.ttl_ms();
        let renewed: Option<Vec<String>> = on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            if let Some(inc) = &incarnation {
                let alive = tx
                    .execute(
                        "UPDATE hosts SET last_seen = now(),
                             expires_at = now() + $3::bigint * interval '1 millisecond'
                         WHERE host_id = $1 AND incarnation = $2",
                        &[&self.host_id, &inc, &ttl],
                    )
                    .await
                    .map_err(Pg::op(OP))?;
                if alive == 0 {
                    return Ok(None);
                }
            }
            let rows = tx
                .query(
                    "UPDATE leases l SET expires_at = now() + $4::bigint * interval '1 millisecond'
                     FROM unnest($1::text[], $2::bigint[]) AS h (run_id, epoch)
                     WHERE l.run_id = h.run_id AND l.owner_epoch = h.epoch
                       AND l.owner_host = $3 AND l.state = 'running' AND l.expires_at > now()
                     RETURNING l.run_id",
                    &[&runs, &epochs, &self.host_id, &ttl],
                )
                .await
                .map_err(Pg::op(OP))?;
            tx.commit().await.map_err(Pg::op(OP))?;
            Ok(Some(rows.iter().map(|r| r.get(0)).collect()))
        })?;
        let Some(renewed) = renewed else {
            *self.registration.lock().unwrap_or_else(|e| e.into_inner()) = None;
            let outage = {
                let r = self.renewals();
                r.failing.is_some().then(|| r.outage())
            };
            let why = match outage {
                Some(o) => format!("its registration expired while {o}"),
                None => "its registration expired or another process registered the same id".into(),
            };
            return Err(StoreError::HostLost {
                target: self.target.clone(),
                host_id: self.host_id.clone(),
                why,
            });
        };
        let renewed: std::collections::HashSet<String> = renewed.into_iter().collect();
        let mut lost = Vec::new();
        {
            let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
            for (run, epoch) in held {
                if !renewed.contains(&run) && h.get(&run) == Some(&epoch) {
                    h.remove(&run);
                    lost.push(LostLease { run_id: run, epoch });
                }
            }
        }
        Ok(Heartbeat {
            renewed: renewed.len(),
            lost,
        })
    }

    async fn deregister(self: Arc<Self>, requeue: bool) -> Result<(), StoreError> {
        const OP: &str = "handing runs back";
        let held: Vec<(String, u64)> = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let runs: Vec<&str> = held.iter().map(|(r, _)| r.as_str()).collect();
        let epochs: Vec<i64> = held.iter().map(|(_, e)| *e as i64).collect();
        let incarnation = self.incarnation();
        let channel = self.channel("work");
        on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            tx.execute(
                "WITH r AS (
                    UPDATE leases l SET state = CASE WHEN $3 THEN 'queued' ELSE 'idle' END,
                        owner_host = NULL, expires_at = NULL,
                        queued_at = CASE WHEN $3 THEN now() ELSE l.queued_at END
                    FROM unnest($1::text[], $2::bigint[]) AS h (run_id, epoch)
                    WHERE l.run_id = h.run_id AND l.owner_epoch = h.epoch AND l.state = 'running'
                    RETURNING l.run_id)
                 SELECT count(pg_notify($4, run_id)) FROM r WHERE $3",
                &[&runs, &epochs, &requeue, &channel],
            )
            .await
            .map_err(Pg::op(OP))?;
            if let Some(inc) = &incarnation {
                tx.execute(
                    "UPDATE hosts SET expires_at = now(), last_seen = now()
                     WHERE host_id = $1 AND incarnation = $2",
                    &[&self.host_id, &inc],
                )
                .await
                .map_err(Pg::op(OP))?;
            }
            tx.commit().await.map_err(Pg::op(OP))
        })?;
        *self.registration.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    async fn hosts(self: Arc<Self>) -> Result<Vec<HostRow>, StoreError> {
        const OP: &str = "listing hosts";
        let rows = on_conn!(self, OP, |c| {
            c.query(
                concat!(
                    "SELECT h.host_id, h.hostname, h.pid, h.api, ",
                    ms!("h.started_at"),
                    ", ",
                    ms!("h.last_seen"),
                    ", h.expires_at > now(),
                        array(SELECT l.run_id FROM leases l WHERE l.owner_host = h.host_id
                           AND l.state = 'running' AND l.expires_at > now() ORDER BY l.run_id)
                     FROM hosts h ORDER BY h.host_id"
                ),
                &[],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        Ok(rows
            .iter()
            .map(|r| HostRow {
                host_id: r.get(0),
                hostname: r.get(1),
                pid: r.get::<_, i64>(2) as u32,
                api: r.get(3),
                started_ms: r.get::<_, i64>(4) as u64,
                last_seen_ms: r.get::<_, i64>(5) as u64,
                alive: r.get(6),
                runs: r.get::<_, Vec<String>>(7).len() as u64,
                run_ids: r.get(7),
            })
            .collect())
    }

    async fn enqueue(self: Arc<Self>, run_id: String) -> Result<(), StoreError> {
        const OP: &str = "queueing a run";
        let channel = self.channel("work");
        let found = on_conn!(self, OP, |c| {
            c.query_opt(
                "WITH q AS (
                    UPDATE leases SET state = 'queued', queued_at = now()
                    WHERE run_id = $1 AND state = 'idle' RETURNING run_id)
                 SELECT (SELECT count(pg_notify($2, run_id)) FROM q)
                 FROM leases WHERE run_id = $1",
                &[&run_id, &channel],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        match found {
            Some(_) => Ok(()),
            None => Err(StoreError::UnknownRun(run_id)),
        }
    }

    async fn claim(self: Arc<Self>, n: usize) -> Result<Vec<Claimed>, StoreError> {
        const OP: &str = "claiming runs";
        let Some(incarnation) = self.incarnation() else {
            return Err(StoreError::HostLost {
                target: self.target.clone(),
                host_id: self.host_id.clone(),
                why: "it is not registered".into(),
            });
        };
        let (ttl, limit) = (self.ttl_ms(), n as i64);
        let claimed = on_conn!(self, OP, |c| {
            let stmt = c
                .prepare_cached(
                    "WITH h AS (
                        SELECT 1 FROM hosts
                        WHERE host_id = $1 AND incarnation = $2 AND expires_at > now()),
                     c AS (
                        SELECT run_id, state AS was, owner_host AS was_host FROM leases
                        WHERE state <> 'idle'
                          AND CASE WHEN state = 'queued' THEN coalesce(queued_at <= now(), true)
                                   ELSE expires_at <= now() END
                          AND EXISTS (SELECT 1 FROM h)
                        ORDER BY queued_at, run_id
                        LIMIT $4 FOR UPDATE SKIP LOCKED)
                     UPDATE leases l SET state = 'running', owner_host = $1,
                         owner_epoch = l.owner_epoch + 1,
                         expires_at = now() + $3::bigint * interval '1 millisecond',
                         owner_hostname = $5, owner_pid = $6
                     FROM c WHERE l.run_id = c.run_id
                     RETURNING l.run_id, l.owner_epoch, c.was, c.was_host",
                )
                .await
                .map_err(Pg::op(OP))?;
            let rows = c
                .query(
                    &stmt,
                    &[
                        &self.host_id,
                        &incarnation,
                        &ttl,
                        &limit,
                        &self.hostname,
                        &self.pid,
                    ],
                )
                .await
                .map_err(Pg::op(OP))?;
            if rows.is_empty() {
                let alive = c
                    .query_opt(
                        "SELECT 1 FROM hosts WHERE host_id = $1 AND incarnation = $2
                           AND expires_at > now()",
                        &[&self.host_id, &incarnation],
                    )
                    .await
                    .map_err(Pg::op(OP))?;
                if alive.is_none() {
                    return Ok(None);
                }
            }
            Ok(Some(
                rows.iter()
                    .map(|r| Claimed {
                        run_id: r.get(0),
                        epoch: r.get::<_, i64>(1) as u64,
                        adopted_from: (r.get::<_, String>(2) == "running")
                            .then(|| r.get::<_, Option<String>>(3).unwrap_or_default()),
                    })
                    .collect::<Vec<_>>(),
            ))
        })?;
        let Some(claimed) = claimed else {
            return Err(StoreError::HostLost {
                target: self.target.clone(),
                host_id: self.host_id.clone(),
                why: "its registration expired".into(),
            });
        };
        for c in &claimed {
            self.hold(&c.run_id, c.epoch);
        }
        Ok(claimed)
    }

    async fn release(
        self: Arc<Self>,
        run_id: String,
        epoch: u64,
        back: GiveBack,
    ) -> Result<(), StoreError> {
        const OP: &str = "releasing a run";
        let channel = self.channel("work");
        // No longer renewed from here on, whatever the database answers: a release that
        // does not reach it leaves the lease to expire, never one renewed forever for a
        // run nobody here drives.
        {
            let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if h.get(&run_id) == Some(&epoch) {
                h.remove(&run_id);
            }
        }
        let (requeue, after_ms) = match back {
            GiveBack::Idle => (false, 0),
            GiveBack::Queued { after } => (true, after.as_millis() as i64),
        };
        let released = on_conn!(self, OP, |c| {
            // Hosts are woken for a run claimable at once; one queued for later is found
            // by their polls.
            c.query_opt(
                "WITH r AS (
                    UPDATE leases SET state = CASE WHEN $3 THEN 'queued' ELSE 'idle' END,
                        owner_host = NULL, expires_at = NULL,
                        queued_at = CASE WHEN $3
                            THEN now() + $5::bigint * interval '1 millisecond'
                            ELSE queued_at END
                    WHERE run_id = $1 AND owner_epoch = $2 AND state = 'running'
                    RETURNING run_id)
                 SELECT count(CASE WHEN $3 AND $5 = 0 THEN pg_notify($4, run_id) END) FROM r
                 HAVING count(*) > 0",
                &[&run_id, &(epoch as i64), &requeue, &channel, &after_ms],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        match released {
            Some(_) => Ok(()),
            None => Err(StoreError::RunLeaseLost {
                run: run_id,
                epoch,
                why: "another host holds it now".into(),
            }),
        }
    }

    async fn lease(self: Arc<Self>, run_id: String) -> Result<LeaseRow, StoreError> {
        const OP: &str = "reading a run's lease";
        let l = on_conn!(self, OP, |c| {
            super::lease_now(&*c, &run_id, false, OP).await
        })?;
        Ok(LeaseRow {
            state: l.state,
            owner_host: l.host,
            epoch: l.epoch,
            left_ms: l.left_ms,
        })
    }

    async fn send_command(
        self: Arc<Self>,
        run_id: String,
        kind: String,
        body: String,
    ) -> Result<u64, StoreError> {
        const OP: &str = "sending a command";
        let channel = self.channel("command");
        let r = on_conn!(self, OP, |c| {
            c.query_one(
                "WITH c AS (
                    INSERT INTO commands (run_id, kind, body) VALUES ($1, $2, $3)
                    RETURNING id, run_id)
                 SELECT id, pg_notify($4, id::text || ' ' || run_id) FROM c",
                &[&run_id, &kind, &body, &channel],
            )
            .await
            .map_err(Pg::op(OP))
        });
        match r {
            Ok(row) => Ok(row.get::<_, i64>(0) as u64),
            Err(StoreError::Pg { source, .. })
                if source.code()
                    == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) =>
            {
                Err(StoreError::UnknownRun(run_id))
            }
            Err(e) => Err(e),
        }
    }

    async fn pending_commands(self: Arc<Self>, run_id: String) -> Result<Vec<Command>, StoreError> {
        const OP: &str = "reading commands";
        let rows = on_conn!(self, OP, |c| {
            c.query(
                "SELECT id, kind, body FROM commands WHERE run_id = $1 AND done_at IS NULL
                 ORDER BY id",
                &[&run_id],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        rows.iter()
            .map(|r| {
                Ok(Command {
                    id: r.get::<_, i64>(0) as u64,
                    run_id: run_id.clone(),
                    kind: r.get(1),
                    body: crate::sqlite::from_json(&run_id, "command", r.get(2))?,
                })
            })
            .collect()
    }

    async fn finish_command(
        self: Arc<Self>,
        run_id: String,
        epoch: u64,
        id: u64,
        outcome: String,
    ) -> Result<(), StoreError> {
        const OP: &str = "recording a command's outcome";
        let channel = self.channel("command_done");
        let r = on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            let current: Option<i64> = tx
                .query_opt(
                    "SELECT owner_epoch FROM leases WHERE run_id = $1 FOR SHARE",
                    &[&run_id],
                )
                .await
                .map_err(Pg::op(OP))?
                .map(|r| r.get(0));
            let Some(current) = current else {
                return Err(StoreError::UnknownRun(run_id.clone()));
            };
            if current as u64 != epoch {
                return Err(StoreError::Fenced {
                    run: run_id.clone(),
                    ours: epoch,
                    current: current as u64,
                });
            }
            let found = tx
                .query_opt(
                    "WITH d AS (
                        UPDATE commands SET done_at = coalesce(done_at, now()),
                            outcome = coalesce(outcome, $3)
                        WHERE id = $1 AND run_id = $2 RETURNING id)
                     SELECT pg_notify($4, id::text) FROM d",
                    &[&(id as i64), &run_id, &outcome, &channel],
                )
                .await
                .map_err(Pg::op(OP))?;
            tx.commit().await.map_err(Pg::op(OP))?;
            Ok(found.is_some())
        })?;
        if r {
            Ok(())
        } else {
            Err(StoreError::UnknownCommand(id))
        }
    }

    async fn command_outcome(
        self: Arc<Self>,
        id: u64,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        const OP: &str = "reading a command's outcome";
        let row = on_conn!(self, OP, |c| {
            c.query_opt(
                "SELECT run_id, outcome FROM commands WHERE id = $1",
                &[&(id as i64)],
            )
            .await
            .map_err(Pg::op(OP))
        })?
        .ok_or(StoreError::UnknownCommand(id))?;
        let run: String = row.get(0);
        row.get::<_, Option<String>>(1)
            .map(|o| crate::sqlite::from_json(&run, "command outcome", &o))
            .transpose()
    }
}

impl PgStore {
    /// Drops this handle as a process that died would leave it: nothing is handed back,
    /// its leases and registration expire. For fault tests and for a host that must
    /// not touch the database on its way out.
    pub fn forsake(self) {
        self.inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        *self
            .inner
            .registration
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Fleet for PgStore {
    fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    fn target(&self) -> String {
        PgStore::target(self).to_string()
    }

    fn register(&self, api: &str) -> Result<(), StoreError> {
        let api = api.to_string();
        self.call(|i| i.register(api))
    }

    fn heartbeat(&self) -> Result<Heartbeat, StoreError> {
        self.call(|i| i.heartbeat())
    }

    fn take_lost(&self) -> Vec<LostLease> {
        std::mem::take(&mut *self.inner.lost.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn deregister(&self, requeue: bool) -> Result<(), StoreError> {
        self.call(|i| i.deregister(requeue))
    }

    fn hosts(&self) -> Result<Vec<HostRow>, StoreError> {
        self.call(|i| i.hosts())
    }

    fn enqueue(&self, run_id: &str) -> Result<(), StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.enqueue(run_id))
    }

    fn claim(&self, n: usize) -> Result<Vec<Claimed>, StoreError> {
        self.call(|i| i.claim(n))
    }

    fn release(&self, run_id: &str, epoch: u64, back: GiveBack) -> Result<(), StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.release(run_id, epoch, back))
    }

    fn stop_renewing(&self, run_id: &str, epoch: u64) {
        let mut h = self.inner.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.get(run_id) == Some(&epoch) {
            h.remove(run_id);
        }
    }

    fn hand_back(&self, run_id: &str, back: GiveBack) -> Result<(), StoreError> {
        match self.inner.held_epoch(run_id) {
            Some(epoch) => self.release(run_id, epoch, back),
            None => Ok(()),
        }
    }

    fn lease(&self, run_id: &str) -> Result<LeaseRow, StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.lease(run_id))
    }

    fn send_command(
        &self,
        run_id: &str,
        kind: &str,
        body: &serde_json::Value,
    ) -> Result<u64, StoreError> {
        let (run_id, kind) = (run_id.to_string(), kind.to_string());
        let body = crate::sqlite::to_json(body);
        self.call(|i| i.send_command(run_id, kind, body))
    }

    fn pending_commands(&self, run_id: &str) -> Result<Vec<Command>, StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.pending_commands(run_id))
    }

    fn finish_command(
        &self,
        run_id: &str,
        epoch: u64,
        id: u64,
        outcome: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let run_id = run_id.to_string();
        let outcome = crate::sqlite::to_json(outcome);
        self.call(|i| i.finish_command(run_id, epoch, id, outcome))
    }

    fn command_outcome(&self, id: u64) -> Result<Option<serde_json::Value>, StoreError> {
        self.call(|i| i.command_outcome(id))
    }

    /// The first subscriber starts the listening connection and returns once it
    /// listens (or after the operation timeout, when the database is out of reach: a
    /// `Missed` follows once it listens), so what commits after this returns wakes it.
    fn subscribe(&self) -> Result<Wakeups, StoreError> {
        let w = self.inner.hub.subscribe();
        if !self
            .inner
            .listening
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let (ready, listening) = std::sync::mpsc::sync_channel(1);
            super::listen::start(self.bridge.handle(), Arc::downgrade(&self.inner), ready);
            let _ = listening.recv_timeout(self.inner.op_timeout);
        }
        Ok(w)
    }
}

/// What a notification on one of the store's channels says.
pub(super) fn wake_of(inner: &Inner, channel: &str, payload: &str) -> Option<Wake> {
    if channel == inner.channel("work") {
        Some(Wake::Work {
            run_id: payload.to_string(),
        })
    } else if channel == inner.channel("command") {
        let (id, run) = payload.split_once(' ')?;
        let run_id = run.to_string();
        match id.parse().ok()? {
            0 => Some(Wake::Cancel { run_id }),
            id => Some(Wake::Command { run_id, id }),
        }
    } else if channel == inner.channel("command_done") {
        Some(Wake::CommandDone {
            id: payload.parse().ok()?,
        })
    } else {
        None
    }
}
