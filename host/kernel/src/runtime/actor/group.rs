//! Invocations of one buffered node that run at the same time: a node whose
//! declaration allows it ([`heddle_core::NodeDecl::concurrency`]) runs the firings that
//! became ready together (an inbox batch of a fan-out's items) side by side, up to
//! that many at once, instead of one after another.
//!
//! In a durable run this is what makes work that is not retry-safe cheap: each such
//! invocation's start must be on disk before its code runs, and one after another that
//! was a synced commit per invocation, then another for its result. Here the starts of
//! the invocations that run together are appended together and waited on together, so
//! the log writer commits them in one synced transaction; their results are appended
//! as they are known and ride with the next chunk's starts (the log on disk is one
//! ordered file, so what a later synced commit carries is durable with it), and a
//! chunk's outputs go downstream once their results are on disk, as one at a time.
//! Recovery sees the same records as for invocations run one at a time: every start
//! without a result is uncertain, and only invocations that did start have one (a
//! chunk's starts are written only once nothing can stop it from running).
//!
//! Only the first attempt runs in the group; a failure goes on through the node's own
//! attempt loop ([`Actor::attempts`]), retries and supervisor included, one at a time.

use std::sync::Arc;

use futures_util::future::join_all;

use heddle_core::{NodeMode, Occurrence};

use super::invoke::{Ahead, Invocation, Settled, Tried, Work, bounded};
use super::journaled::Written;
use super::routing::MintedTokens;
use super::{Actor, NodeRole, Stop};
use crate::executor::{BoxFuture, Call, NodeError, Outputs};
use crate::journal::Journal;
use crate::runtime::lineage::Lineage;
use crate::runtime::sched::Firing;

/// Firings of a node waiting to run together: collected while an inbox batch is
/// handled, run by [`Actor::run_group`] before anything else leaves the node.
pub(super) struct Group {
    pending: Vec<(Firing, Lineage)>,
    /// The last chunk that ran, its results appended and not yet waited on: delivered
    /// once the next chunk's starts have put them on disk, or by [`Actor::run_group`]
    /// with `settle`.
    ran: Vec<Produced>,
    /// How many run at once; 1: the node's firings are not grouped at all.
    max: usize,
}

impl Group {
    /// Nothing waits: no firing, and no outputs held back.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.ran.is_empty()
    }

    /// Outputs are held back until their results are on disk.
    pub fn holds_outputs(&self) -> bool {
        !self.ran.is_empty()
    }
}

/// One invocation of a chunk, its first attempt under way or done.
struct Member {
    lineage: Lineage,
    key: Arc<str>,
    used: Firing,
    /// A durable run's occurrence, whether it is fresh, and the attempts an earlier
    /// process began.
    occ: Option<(Occurrence, bool, u32)>,
    tried: Option<Tried>,
}

/// A member whose first attempt succeeded, its result appended: its outputs go
/// downstream once `written` (when not retry-safe) is on disk.
struct Produced {
    lineage: Lineage,
    out: Outputs,
    written: Option<Written>,
}

impl Actor {
    /// The group this node's firings wait in: several at a time only for a node that
    /// declares it, that the kernel invokes through its executor (not a native one,
    /// which runs in place), and whose invocations emit nothing while they run.
    pub(super) fn group(&self) -> Group {
        let max = if matches!(self.spec.role, NodeRole::Executor)
            && !self.native
            && self.spec.decl.mode == NodeMode::Buffered
            && self.spec.controllers == 0
        {
            self.spec.decl.max_concurrent()
        } else {
            1
        };
        Group {
            pending: Vec::new(),
            ran: Vec::new(),
            max,
        }
    }

    /// Runs `f` at once, or queues it in `group` when the node's firings run together.
    pub(super) async fn fire_grouped(
        &mut self,
        group: &mut Group,
        f: Firing,
        lineage: Lineage,
    ) -> Result<(), Stop> {
        if group.max > 1 {
            group.pending.push((f, lineage));
            return Ok(());
        }
        self.fire_firing(f, lineage).await
    }

    /// Runs the firings waiting in `group`, `group.max` at a time, and delivers what
    /// they produce once it is on disk. The last chunk's outputs are held back (their
    /// results ride with the next chunk's starts) unless `settle`: then everything is
    /// delivered before this returns, as before anything else leaves the node.
    pub(super) async fn run_group(&mut self, group: &mut Group, settle: bool) -> Result<(), Stop> {
        let pending = std::mem::take(&mut group.pending);
        let journal = self.shared.journal.clone();
        let journal = journal.as_deref();
        let mut rest = pending.into_iter().peekable();
        while rest.peek().is_some() {
            // Up to `max` firings at different keys: a key's own invocations (the
            // values of one stream) follow one another.
            let mut chunk: Vec<(Firing, Lineage)> = Vec::new();
            // A lineage's cached text is its only interior mutability, outside its hash.
            #[allow(clippy::mutable_key_type)]
            let mut keys = std::collections::HashSet::new();
            while chunk.len() < group.max
                && let Some((_, next)) = rest.peek()
                && keys.insert(next.clone())
            {
                chunk.extend(rest.next());
            }
            // A firing that stops the node (an uncertain occurrence pauses the run)
            // stops it after the ones before it ran, as one at a time: a resume that
            // offers one occurrence again makes progress.
            let (members, stop) = self.begin_chunk(journal, chunk).await;
            // Waited on together: one synced commit, which carries the results of the
            // chunk that ran before.
            let mut starts = Vec::new();
            for m in &members {
                if let (Some(j), Some((occ, _, _))) = (journal, &m.occ)
                    && let Some(w) = self.record_start(j, occ)
                {
                    starts.push(w);
                }
            }
            for r in join_all(starts).await {
                r.map_err(|e| self.journal_stop(e))?;
            }
            self.deliver_produced(&mut group.ran).await?;
            let members = self.run_chunk(members).await;
            let (ran, failed) = self.settle_chunk(journal, members).await;
            group.ran = ran;
            if let Some(stop) = failed.or(stop) {
                // What completed goes downstream first, as it would have one at a time.
                self.deliver_produced(&mut group.ran).await?;
                return Err(stop);
            }
        }
        if settle {
            self.deliver_produced(&mut group.ran).await?;
        }
        Ok(())
    }

    /// The first step of each of a chunk's firings, one at a time: a firing that cannot
    /// run is dropped, one whose occurrence an earlier process settled is delivered from
    /// the log, and the rest are admitted (their dispatch recorded). None has started
    /// yet. A firing that stops the node ends the chunk there: the members before it
    /// are returned with the stop.
    async fn begin_chunk(
        &mut self,
        journal: Option<&dyn Journal>,
        chunk: Vec<(Firing, Lineage)>,
    ) -> (Vec<Member>, Option<Stop>) {
        let mut members = Vec::with_capacity(chunk.len());
        for (used, lineage) in chunk {
            match self.begin_member(journal, used, lineage).await {
                Ok(Some(m)) => members.push(m),
                Ok(None) => {}
                Err(stop) => return (members, Some(stop)),
            }
        }
        (members, None)
    }

    /// [`Actor::begin_chunk`] for one firing: `None` when it settled without running.
    async fn begin_member(
        &mut self,
        journal: Option<&dyn Journal>,
        used: Firing,
        lineage: Lineage,
    ) -> Result<Option<Member>, Stop> {
        if self.lacks_required(&used) {
            self.forward_dropped(&lineage).await?;
            return Ok(None);
        }
        self.mark_started();
        let key = self.key_text(&lineage);
        let mut occ = None;
        if let Some(j) = journal {
            let inv = Invocation {
                lineage: &lineage,
                key: key.clone(),
                // What the journal reads of it is the key and the lineage.
                work: Work::Firing {
                    first: None,
                    used: Firing::new(),
                },
                emits: false,
                feed: None,
            };
            let mut mint = MintedTokens::default();
            match Box::pin(self.journal_ahead(j, &inv, &mut mint)).await? {
                Ahead::Run {
                    occ: o,
                    fresh,
                    begun,
                } => occ = Some((o, fresh, begun)),
                Ahead::Settled(settled) => {
                    self.deliver(settled, &lineage, &mut mint).await?;
                    return Ok(None);
                }
            }
        }
        Ok(Some(Member {
            lineage,
            key,
            used,
            occ,
            tried: None,
        }))
    }

    /// Runs the first attempts of `members` side by side, each under its own cancel
    /// token and time limit.
    async fn run_chunk(&mut self, mut members: Vec<Member>) -> Vec<Member> {
        type Running = BoxFuture<'static, (Result<Outputs, NodeError>, std::time::Duration)>;
        let mut calls: Vec<Running> = Vec::new();
        let mut started = Vec::new();
        for m in &members {
            let (token, deadline) = self.invocation_token();
            let ctx = self.ctx(m.key.clone(), token.clone(), deadline, None);
            self.invocations += 1;
            let t0 = self.clock();
            let exec = self.spec.exec.clone();
            let mut inputs = self.rebuild_inputs(&m.used);
            // Typed inputs are checked here as on the one-at-a-time path: a misfit is
            // this member's failure, and the node's code never sees the value.
            let misfit = if self.spec.typed_inputs().is_empty() {
                None
            } else {
                self.check_inputs(&mut inputs).err()
            };
            self.control_context(&mut inputs);
            let call = Call {
                inputs,
                ctx: ctx.clone(),
            };
            let late = deadline.map(|_| self.deadline_error());
            calls.push(Box::pin(async move {
                let r = match misfit {
                    Some(e) => Err(e),
                    None => {
                        bounded(exec.invoke(call), &token, deadline, || {
                            late.unwrap_or_else(NodeError::cancelled)
                        })
                        .await
                    }
                };
                // Its own time, not the chunk's.
                (r, t0.elapsed())
            }));
            started.push(ctx);
        }
        let results = join_all(calls).await;
        for ((m, ctx), (result, took)) in members.iter_mut().zip(started).zip(results) {
            // Timed from when its call began: the wall time reported is its own.
            let t0 = std::time::Instant::now()
                .checked_sub(took)
                .unwrap_or_else(std::time::Instant::now);
            m.tried = Some(Tried { ctx, t0, result });
        }
        members
    }

    /// Settles a chunk that ran, in firing order: every result is appended first (a
    /// failure must not leave work that completed without its record), then each
    /// failure goes on through the node's attempt loop. Returns what was produced, for
    /// [`Actor::deliver_produced`], and the first failure that stops the node (the
    /// later failures are recorded as they are, not retried).
    async fn settle_chunk(
        &mut self,
        journal: Option<&dyn Journal>,
        members: Vec<Member>,
    ) -> (Vec<Produced>, Option<Stop>) {
        let mut produced = Vec::with_capacity(members.len());
        let mut failed = Vec::new();
        let mut stop = None;
        for mut m in members {
            // Filled by `run_chunk`.
            let mut t = m.tried.take().expect("a member that ran");
            #[allow(clippy::result_large_err)] // the seam's error type
            let result = std::mem::replace(&mut t.result, Err(NodeError::cancelled()))
                .and_then(|out| self.keep_promise(out));
            let attempt = m.occ.as_ref().map_or(0, |(_, _, begun)| *begun) + 1;
            match result {
                Ok(out) => {
                    self.account(&t.ctx, t.t0, &m.key, None, attempt);
                    let j = journal.zip(m.occ.as_ref().map(|(o, _, _)| o));
                    match self.produced(j, &t.ctx, t.t0, &m.lineage, &out) {
                        Ok(written) => produced.push(Produced {
                            lineage: m.lineage,
                            out,
                            written,
                        }),
                        // Its result could not be recorded: the invocation fails so.
                        Err(s) => {
                            let s = match (journal, m.occ) {
                                (Some(j), Some((occ, fresh, _))) => {
                                    Box::pin(self.journal_settled(j, occ, fresh, Err(s))).await
                                }
                                _ => Err(s),
                            };
                            if let Err(s) = s {
                                stop.get_or_insert(s);
                            }
                        }
                    }
                }
                Err(e) => {
                    t.result = Err(e);
                    failed.push((m, t));
                }
            }
        }
        for (m, t) in failed {
            let Member {
                lineage,
                key,
                used,
                occ,
                ..
            } = m;
            let mut mint = MintedTokens::default();
            let settled = if stop.is_none() {
                let inv = Invocation {
                    lineage: &lineage,
                    key,
                    work: Work::Firing { first: None, used },
                    emits: false,
                    feed: None,
                };
                let j = journal
                    .zip(occ.as_ref())
                    .map(|(j, (o, _, begun))| (j, o, *begun));
                let settled = self.attempts(inv, &mut mint, j, Some(t)).await;
                if let Some(r) = &mut self.rare {
                    r.emitted = None;
                }
                match (journal, occ) {
                    (Some(j), Some((occ, fresh, _)))
                        if !matches!(settled, Ok(Settled::Produced(_))) =>
                    {
                        Box::pin(self.journal_settled(j, occ, fresh, settled)).await
                    }
                    _ => settled,
                }
            } else if let (Some(j), Some((occ, fresh, _))) = (journal, occ) {
                // The node stops already: a later failure is recorded as it is.
                let error = match &t.result {
                    Err(e) => self.shared.secrets.mask(&e.message).to_string(),
                    Ok(_) => String::new(),
                };
                Box::pin(self.journal_settled(j, occ, fresh, Err(Stop::Failed(error)))).await
            } else {
                continue;
            };
            match settled {
                Ok(Settled::Produced(out)) => produced.push(Produced {
                    lineage,
                    out,
                    written: None,
                }),
                Ok(other) => {
                    if let Err(s) = self.deliver(other, &lineage, &mut mint).await {
                        stop.get_or_insert(s);
                    }
                }
                Err(s) => {
                    stop.get_or_insert(s);
                }
            }
        }
        (produced, stop)
    }

    /// Sends what `produced` holds downstream, in firing order, once each result is on
    /// disk.
    async fn deliver_produced(&mut self, produced: &mut Vec<Produced>) -> Result<(), Stop> {
        let waits: Vec<Written> = produced
            .iter_mut()
            .filter_map(|p| p.written.take())
            .collect();
        for r in join_all(waits).await {
            r.map_err(|e| self.journal_stop(e))?;
        }
        for p in produced.drain(..) {
            let mut mint = MintedTokens::default();
            self.deliver(Settled::Produced(p.out), &p.lineage, &mut mint)
                .await?;
        }
        Ok(())
    }
}
