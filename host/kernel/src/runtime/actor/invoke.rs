//! The one path every executor invocation takes: [`Actor::invoke`] runs attempts until
//! one produces outputs or the failure is settled by [`Actor::recover`]. A hook that must
//! see every invocation (metrics, supervisor records, write-ahead records) belongs here.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use heddle_core::{
    Decider, EventKind, InvocationMetrics, Occurrence, Record, RecordedAction, RecordedVerdict,
    Value,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::routing::MintedTokens;
use super::{Actor, BATCH, EMIT_BUFFER, InvToken, Msg, Stop};
use crate::executor::{
    BoxFuture, Call, CtxParts, Emitted, ErrorKind, InputStream, Inputs, NodeCtx, NodeError,
    Outputs, StreamItem,
};
use crate::journal::Journal;
use crate::runtime::bus::{Draft, InvocationDetail};
use crate::runtime::lineage::Lineage;
use crate::runtime::poll_once;
use crate::runtime::sched::Firing;
use crate::supervisor::escalates;

/// The input side of a live session while it runs: items wait in `pending` until the
/// node's stream has room; `tx` is dropped once every input has ended (or the node
/// stopped reading).
#[derive(Default)]
pub(super) struct Feed {
    pub pending: VecDeque<StreamItem>,
    pub tx: Option<mpsc::Sender<StreamItem>>,
    pub buf: Vec<Msg>,
}

/// One attempt of one invocation as the supervisor sees it when it fails.
pub struct InvocationRecord {
    /// Inputs the invocation was called with.
    pub inputs: Inputs,
    /// Canonical lineage key.
    pub key: Arc<str>,
    /// Where the invocation sits in the graph's fan-outs, shown to the supervisor.
    pub lineage: Lineage,
    /// This attempt's own metrics (cost and assets decide whether retry is allowed).
    pub metrics: InvocationMetrics,
    /// 1 for the first attempt, then 2, 3… for each retry of the same invocation (the
    /// node's own policy's, then the supervisor's: one count).
    pub attempt: u32,
    /// Whether the attempt sent anything downstream before failing: a value emitted on
    /// an output no edge leaves (a code node's stdout, a traceback on stderr) reached
    /// nobody, so it does not take skip or retry away.
    pub emitted: bool,
}

/// What an invocation consumes; a retry takes it again.
pub(super) enum Work {
    /// The node's base inputs plus these handle values. The first attempt takes the map
    /// built for it; a retry or a failure record rebuilds it (cheaper than keeping a copy
    /// of every map on the hot path).
    Firing { first: Option<Inputs>, used: Firing },
    /// A complete input map (a control event's properties are part of it).
    Inputs(Inputs),
    /// One session over a stream: the first attempt consumes it (the allowed verdicts of
    /// a streaming-input node never include retry).
    Stream(Option<InputStream>),
}

/// One invocation to run.
pub(super) struct Invocation<'a> {
    pub lineage: &'a Lineage,
    pub key: Arc<str>,
    pub work: Work,
    /// The node emits while it runs (streaming output, controlled, stream sessions).
    pub emits: bool,
    /// A live session's input, fed from the inbox while the node runs.
    pub feed: Option<&'a mut Feed>,
}

/// Where a durable run's journal ([`Actor::journal_ahead`]) leaves an invocation:
/// defined here, beside [`Settled`], so that the journal's side depends on the
/// invocation's and not the other way round.
pub(super) enum Ahead {
    /// Run its attempts: `begun` of them an earlier process started; `fresh` when nothing
    /// was recorded for it.
    Run {
        occ: Occurrence,
        fresh: bool,
        begun: u32,
    },
    /// Settled from what was recorded, without running.
    Settled(Settled),
}

/// How an invocation ended, once the supervisor (if any) had its say.
pub(super) enum Settled {
    /// The node's outputs, or the supervisor's validated substitute.
    Produced(Outputs),
    /// The supervisor dropped the invocation; `error` is what failed.
    Skipped { error: String },
    /// The supervisor ended the stream: what was emitted stays.
    Ended { error: String },
}

/// A first attempt that already ran (see [`Actor::attempts`]).
pub(super) struct Tried {
    pub ctx: NodeCtx,
    pub t0: Instant,
    pub result: Result<Outputs, NodeError>,
}

impl Actor {
    /// Runs `inv` until it settles. Values it emits are routed as they come, under
    /// `mint`'s iteration tokens (fresh for each attempt). An `Err` stops the node.
    pub(super) async fn invoke(
        &mut self,
        inv: Invocation<'_>,
        mint: &mut MintedTokens,
    ) -> Result<Settled, Stop> {
        // A live stream session is not journaled: its inputs arrive while it runs, so
        // it runs again on recovery (its upstream results are replayed into it).
        let journal = match (&self.shared.journal, &inv.work) {
            (Some(j), Work::Firing { .. } | Work::Inputs(_)) => Some(j.clone()),
            _ => None,
        };
        match journal {
            None => self.attempts(inv, mint, None, None).await,
            Some(journal) if self.recomputed() => {
                let key = inv.key.clone();
                let settled = self.attempts(inv, mint, None, None).await;
                if let Err(Stop::Suspended(_)) = &settled {
                    // A gate: the pause must name an occurrence its answer can find.
                    journal.append(Record::Dispatched {
                        occurrence: self.occurrence(&key),
                        retry_safe: true,
                    });
                }
                settled
            }
            // The journal's bookkeeping before and after the attempts is boxed: it would
            // otherwise enlarge the future of every invocation, journaled or not, and a
            // future is moved per invocation. The attempts run inline as in a run without
            // a journal: boxed with the bookkeeping they moved a ~2 KB future to the heap
            // per invocation.
            Some(journal) => {
                let ahead = Box::pin(self.journal_ahead(&*journal, &inv, mint)).await?;
                let (occ, fresh, begun) = match ahead {
                    Ahead::Run { occ, fresh, begun } => (occ, fresh, begun),
                    Ahead::Settled(settled) => {
                        if let Settled::Produced(out) = &settled {
                            // Its cost was counted by the process that recorded it.
                            self.record_for_supervisor(inv.lineage, out, || 0.0);
                        }
                        return Ok(settled);
                    }
                };
                let settled = self
                    .attempts(inv, mint, Some((&*journal, &occ, begun)), None)
                    .await;
                if let Some(r) = &mut self.rare {
                    r.emitted = None;
                }
                if let Ok(Settled::Produced(_)) = settled {
                    // Recorded by the attempt.
                    return settled;
                }
                Box::pin(self.journal_settled(&*journal, occ, fresh, settled)).await
            }
        }
    }

    /// The attempt loop of one invocation; `journal` records each attempt's start,
    /// result and the supervisor's retries, and says how many attempts an earlier process
    /// began (numbering continues from there). With `tried`, the first attempt already
    /// ran (its start recorded), beside others of the node's ([`super::group`]): the loop
    /// goes on from its result.
    pub(super) async fn attempts(
        &mut self,
        mut inv: Invocation<'_>,
        mint: &mut MintedTokens,
        journal: Option<(&dyn Journal, &Occurrence, u32)>,
        mut tried: Option<Tried>,
    ) -> Result<Settled, Stop> {
        let begun = journal.map_or(0, |(_, _, n)| n);
        let journal = journal.map(|(j, occ, _)| (j, occ));
        let mut attempt = begun + 1;
        loop {
            let (ctx, t0, result) = if let Some(t) = tried.take() {
                *mint = MintedTokens::default();
                self.sent_downstream = false;
                (t.ctx, t.t0, t.result)
            } else {
                if let Some((j, occ)) = journal {
                    // A retry is one more dispatch of the occurrence, charged to the run's
                    // budget like the first (its retry verdict is on disk, so a restart
                    // counts it too).
                    if attempt > begun + 1
                        && let Err(e) = j.admit(occ)
                    {
                        return Err(Stop::Abort(format!(
                            "node \"{}\" (type {}) at {occ}, attempt {attempt}: {e}",
                            self.spec.id, self.spec.node_type
                        )));
                    }
                    if let Some(wait) = self.record_start(j, occ) {
                        self.written(wait).await?;
                    }
                    if inv.emits {
                        self.rare().emitted = Some(Vec::new());
                    } else if let Some(r) = &mut self.rare {
                        r.emitted = None;
                    }
                }
                let (emit_tx, emit_rx) = if inv.emits {
                    let (tx, rx) = mpsc::channel(EMIT_BUFFER);
                    (Some(tx), Some(rx))
                } else {
                    (None, None)
                };
                let (token, deadline) = self.invocation_token();
                let ctx = self.ctx(inv.key.clone(), token.clone(), deadline, emit_tx);
                self.invocations += 1;
                let t0 = self.clock();
                let exec = self.spec.exec.clone();
                let fut = match &mut inv.work {
                    Work::Firing { first, used } => {
                        let inputs = first.take().unwrap_or_else(|| self.rebuild_inputs(used));
                        self.call(&*exec, inputs, &ctx)
                    }
                    Work::Inputs(inputs) => self.call(&*exec, inputs.clone(), &ctx),
                    Work::Stream(stream) => match stream.take() {
                        Some(s) => exec.run_stream(s, ctx.clone()),
                        None => {
                            return Err(Stop::Failed(format!(
                                "node \"{}\" (type {}): a stream session cannot be retried",
                                self.spec.id, self.spec.node_type
                            )));
                        }
                    },
                };
                *mint = MintedTokens::default();
                self.sent_downstream = false;
                let result = self
                    .drive(
                        fut,
                        emit_rx,
                        inv.feed.as_deref_mut(),
                        inv.lineage,
                        mint,
                        &token,
                        deadline,
                    )
                    .await?;
                (ctx, t0, result)
            };
            #[allow(clippy::result_large_err)] // the seam's error type, as returned by `drive`
            let result = result.and_then(|out| self.keep_promise(out));
            self.account(&ctx, t0, &inv.key, result.as_ref().err(), attempt);
            match result {
                Ok(out) => {
                    if let Some(wait) = self.produced(journal, &ctx, t0, inv.lineage, &out)? {
                        self.written(wait).await?;
                    }
                    return Ok(Settled::Produced(out));
                }
                Err(e) => {
                    // The node's own policy first, in this same loop: the supervisor is
                    // asked only once it is spent, and nothing re-enters it.
                    if let Some(wait) = self.own_retry(&e, attempt, &inv.work) {
                        // On disk before the wait and the next attempt, as a supervisor's
                        // retry is: recovery counts recorded retries as attempts made, so
                        // a crash after this never refills the allowance. A retry-safe
                        // node's attempts leave no other trace in the log.
                        if let Some((j, occ)) = journal {
                            let record = Record::Verdict {
                                occurrence: occ.clone(),
                                verdict: RecordedVerdict {
                                    attempt: Some(attempt),
                                    ..RecordedVerdict::new(RecordedAction::Retry)
                                        .with_error(e.message.clone())
                                },
                                decided_by: Decider::RetryPolicy,
                            };
                            Box::pin(self.append_synced(j, record)).await?;
                        }
                        self.backoff(wait, attempt, &e).await?;
                        attempt += 1;
                        continue;
                    }
                    let inputs = match &inv.work {
                        Work::Firing { used, .. } => self.rebuild_inputs(used),
                        Work::Inputs(inputs) => inputs.clone(),
                        Work::Stream(_) => self.spec.base_inputs.clone(),
                    };
                    let rec = InvocationRecord {
                        inputs,
                        key: inv.key.clone(),
                        lineage: inv.lineage.clone(),
                        metrics: ctx.metrics(),
                        attempt,
                        emitted: self.sent_downstream,
                    };
                    if let Some((j, occ)) = journal
                        && self.shared.escalator.is_some()
                        && escalates(&e)
                    {
                        j.append(Record::Escalated {
                            occurrence: occ.clone(),
                            escalation: serde_json::json!({
                                "attempt": attempt,
                                "error": self.shared.secrets.mask(&e.message),
                            }),
                        });
                    }
                    // Boxed, like the journal records: rare, and large.
                    match Box::pin(self.recover(e, rec)).await? {
                        Some(Settled::Produced(out)) => {
                            self.refuse_known_secrets(out.iter())?;
                            // A substitute is the occurrence's result from now on, on
                            // disk before it goes downstream.
                            if let Some((j, occ)) = journal {
                                self.keep_sent(&ctx);
                                let record = self.result_record(occ, &out, ctx.metrics());
                                let record = self.sealed(j, record)?;
                                Box::pin(self.append_synced(j, record)).await?;
                            }
                            return Ok(Settled::Produced(out));
                        }
                        Some(settled) => return Ok(settled),
                        None => {
                            if let Some((j, occ)) = journal {
                                let record = Record::Verdict {
                                    occurrence: occ.clone(),
                                    verdict: RecordedVerdict::new(RecordedAction::Retry).with_note(
                                        self.rare.as_mut().and_then(|r| r.decision_note.take()),
                                    ),
                                    decided_by: Decider::Supervisor,
                                };
                                Box::pin(self.append_synced(j, record)).await?;
                            }
                            attempt += 1
                        }
                    }
                }
            }
        }
    }

    /// The invocation of `exec` with `inputs`, once they fit the node's typed inputs; a
    /// misfit is the attempt's failure, and the node's code never sees the value.
    fn call<'e>(
        &self,
        exec: &'e dyn crate::executor::Executor,
        mut inputs: Inputs,
        ctx: &NodeCtx,
    ) -> BoxFuture<'e, Result<Outputs, NodeError>> {
        if !self.spec.typed_inputs().is_empty()
            && let Err(e) = self.check_inputs(&mut inputs)
        {
            return Box::pin(std::future::ready(Err(e)));
        }
        self.control_context(&mut inputs);
        exec.invoke(Call {
            inputs,
            ctx: ctx.clone(),
        })
    }

    /// The run events a controller's attempt sent, kept with what it emitted for its
    /// result record, so a recovery that carries the result out sends them again.
    pub(super) fn keep_sent(&mut self, ctx: &NodeCtx) {
        let sent = ctx.take_sent();
        if sent.is_empty() {
            return;
        }
        let rec = self.rare().emitted.get_or_insert_with(Vec::new);
        let handle: Arc<str> = Arc::from(crate::runtime::control::CONTROL_SENT);
        for (target, properties) in sent {
            let v = Value::from_json(serde_json::json!({
                "target": &*target,
                "properties": Value::object(properties).to_json(),
            }));
            rec.push((handle.clone(), v));
        }
    }

    /// A controller's invocation gets `_control_context`: what it may drive (seed 002).
    pub(super) fn control_context(&self, inputs: &mut Inputs) {
        if let Some(c) = self.spec.controls() {
            inputs.insert(
                crate::runtime::CONTROL_CONTEXT_INPUT.to_string(),
                c.context().clone(),
            );
        }
    }

    /// Records an attempt's outputs (a durable run's result record) and keeps them for
    /// the supervisor; for a node that is not retry-safe the caller waits on the returned
    /// future before the outputs go downstream.
    /// Outputs holding a known secret are refused first: they fail the attempt and never
    /// reach the disk, whichever path (one at a time or a fan-out group) produced them.
    pub(super) fn produced(
        &mut self,
        journal: Option<(&dyn Journal, &Occurrence)>,
        ctx: &NodeCtx,
        t0: Instant,
        lineage: &Lineage,
        out: &Outputs,
    ) -> Result<Option<super::journaled::Written>, Stop> {
        self.refuse_known_secrets(out.iter())?;
        let mut wait = None;
        if let Some((j, occ)) = journal {
            self.keep_sent(ctx);
            let mut m = ctx.metrics();
            m.wall_us = t0.elapsed().as_micros() as u64;
            wait = self.record_result(j, occ, out, m)?;
        }
        self.record_for_supervisor(lineage, out, || ctx.metrics().cost_usd);
        Ok(wait)
    }

    /// The wait before the next attempt when the node's `retry` policy catches this
    /// failure; `None` leaves it to the supervisor (or the node fails). A suspension
    /// and a cancel are decisions, not failures, a failed assertion would fail the same
    /// way again, and an attempt that already sent values downstream would send them
    /// twice, so none of them is retried.
    fn own_retry(&self, e: &NodeError, attempt: u32, work: &Work) -> Option<std::time::Duration> {
        let policy = self.spec.retry()?;
        if attempt >= policy.attempts
            || matches!(
                e.kind,
                ErrorKind::Suspend { .. }
                    | ErrorKind::Cancelled
                    | ErrorKind::Assertion
                    | ErrorKind::Input
            )
            || matches!(work, Work::Stream(_))
            || self.shared.run_token.is_cancelled()
        {
            return None;
        }
        if self.sent_downstream {
            self.emit(EventKind::Log {
                node_id: self.spec.id.to_string(),
                level: heddle_core::LogLevel::Warn,
                message: format!(
                    "attempt {attempt} failed after sending values downstream; not retried (a retry would send them again)"
                ),
            });
            return None;
        }
        Some(policy.backoff(attempt))
    }

    /// Waits out a retry's backoff; a cancel of the run ends the wait (and the node).
    async fn backoff(
        &self,
        wait: std::time::Duration,
        attempt: u32,
        e: &NodeError,
    ) -> Result<(), Stop> {
        let attempts = self.spec.retry().map_or(1, |p| p.attempts);
        self.emit(EventKind::Log {
            node_id: self.spec.id.to_string(),
            level: heddle_core::LogLevel::Warn,
            message: format!(
                "attempt {attempt} of {attempts} failed ({}); retrying in {} ms",
                self.shared.secrets.mask(&e.message),
                wait.as_millis()
            ),
        });
        tokio::select! {
            _ = self.shared.run_token.cancelled() => Err(Stop::Cancelled),
            _ = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// Keeps outputs per lineage for the supervisor's `read_node_output` tool (only when
    /// the run is supervised). Every node that produces a value comes here, an input
    /// node and a result recorded by an earlier process included: the tools show the
    /// failing item's ancestors, whatever produced them.
    /// (`cost_usd` is read only then: an invocation's metrics are behind a lock.)
    pub(super) fn record_for_supervisor(
        &self,
        lineage: &Lineage,
        out: &Outputs,
        cost_usd: impl FnOnce() -> f64,
    ) {
        if let Some(esc) = &self.shared.escalator {
            esc.state()
                .record_invocation(&self.spec.id, &lineage.entries(), Some(out), cost_usd());
        }
    }

    pub(super) fn rebuild_inputs(&self, used: &Firing) -> Inputs {
        let mut inputs = self.spec.base_inputs.clone();
        for (h, v) in used {
            inputs.insert(String::from(&*self.spec.handles[*h].name), v.clone());
        }
        inputs
    }

    pub(super) fn key_text(&self, lineage: &Lineage) -> Arc<str> {
        if lineage.is_empty() {
            self.root_key()
        } else {
            lineage.text(&self.shared.roots)
        }
    }

    pub(super) fn invocation_token(&self) -> (InvToken, Option<Instant>) {
        match self.spec.timeout() {
            // A per-invocation child, so a deadline cancels this invocation only.
            Some(t) => (
                InvToken(Arc::new(self.node_token().child_token())),
                Some(Instant::now() + t),
            ),
            None => (self.node_token().clone(), None),
        }
    }

    pub(super) fn ctx(
        &mut self,
        key: Arc<str>,
        token: InvToken,
        deadline: Option<Instant>,
        emit: Option<mpsc::Sender<Emitted>>,
    ) -> NodeCtx {
        // A traced run's attempts each get a span (native built-ins get none: they are
        // not reported one by one).
        let span = match &self.shared.trace {
            Some(t) if !self.native => Some(t.mint()),
            _ => None,
        };
        // Without a deadline the token is the node's own: the last context can be
        // re-armed instead of rebuilt (no allocation, no token clone).
        let reusable = deadline.is_none();
        if reusable
            && let Some(spare) = &mut self.spare_ctx
            && spare.try_rearm(key.clone(), None, emit.clone(), span)
        {
            return spare.clone();
        }
        let mut ctx = NodeCtx::new(CtxParts {
            node_id: self.spec.id.clone(),
            node_type: self.spec.node_type.clone(),
            key,
            cancel: (*token.0).clone(),
            deadline,
            events: self.shared.bus.clone(),
            emit,
            secrets: self.shared.secrets.clone(),
        });
        if let (Some(t), Some(span)) = (&self.shared.trace, span) {
            ctx = ctx.traced(t.clone(), span);
        }
        if let Some(run) = &self.shared.run_id {
            ctx = ctx.in_run(run.clone());
        }
        if let Some(controls) = self.spec.controls() {
            ctx = ctx.controlling(controls.clone());
        }
        if reusable {
            self.spare_ctx = Some(ctx.clone());
        }
        ctx
    }

    /// Start of an invocation's wall time. Native built-ins measure nothing (their
    /// invocations cost less than reading the clock twice), so they skip the clock and
    /// read one instant the process took once (not one per actor: 16 bytes of every
    /// node's state for a value nothing reads).
    pub(super) fn clock(&self) -> Instant {
        static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
        if self.native { *EPOCH } else { Instant::now() }
    }

    /// Sums the invocation's metrics; publishes them when the executor measured more
    /// than wall time.
    pub(super) fn account(
        &mut self,
        ctx: &NodeCtx,
        t0: Instant,
        key: &Arc<str>,
        err: Option<&NodeError>,
        attempt: u32,
    ) {
        let timed_out = err.is_some_and(|e| matches!(e.kind, ErrorKind::Deadline));
        self.timed_out |= timed_out;
        if self.native {
            return;
        }
        let mut m = ctx.metrics();
        m.wall_us = t0.elapsed().as_micros() as u64;
        self.rare().metrics.accumulate(&m);
        // A failed attempt is always reported (failures are off the hot path), so every
        // retry and every time limit shows with its attempt number; in a traced run every
        // attempt is (its span is built from it), and in a counted one.
        if err.is_some()
            || self.shared.every_invocation
            || m.fuel.is_some()
            || m.peak_memory_bytes.is_some()
            || m.cost_usd > 0.0
            || !m.assets.is_empty()
        {
            // A draft: the ids shared, the figures moved into one box (see `Draft`).
            self.shared.bus.publish_draft(Draft::Invocation {
                node_id: self.spec.id.clone(),
                key: key.clone(),
                attempt,
                timed_out,
                span_id: ctx.span_id(),
                detail: Box::new(InvocationDetail {
                    metrics: m,
                    error: err.map(|e| self.shared.secrets.mask(&e.message)),
                    signature: err.and_then(|e| e.failure_signature()),
                }),
            });
        }
    }

    /// The error of an invocation that outlived its time limit.
    pub(super) fn deadline_error(&self) -> NodeError {
        let ms = self.spec.timeout().map(|t| t.as_millis()).unwrap_or(0);
        NodeError::new(
            ErrorKind::Deadline,
            format!("invocation exceeded its time limit of {ms} ms"),
        )
    }

    /// Awaits an invocation future while routing what it emits, honouring cancellation
    /// and the deadline. The outer `Result` is a routing/cancel stop; the inner one the
    /// invocation's own result.
    #[allow(clippy::too_many_arguments)] // the parts of one attempt, borrowed separately
    async fn drive<'f>(
        &mut self,
        fut: BoxFuture<'f, Result<Outputs, NodeError>>,
        emit_rx: Option<mpsc::Receiver<Emitted>>,
        feed: Option<&mut Feed>,
        lineage: &Lineage,
        mint: &mut MintedTokens,
        token: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<Result<Outputs, NodeError>, Stop> {
        let mut fut = fut;
        let Some(rx) = emit_rx else {
            // Most invocations (every native one) are done at their first poll, which
            // the race below would make anyway: build neither the race nor a timer.
            if let Poll::Ready(r) = poll_once(fut.as_mut()).await {
                return Ok(r);
            }
            // Boxed: a timer and a cancel waiter in every actor's state would cost each
            // node that never waits (the memory of a 10,000-node chain is mostly this).
            return Ok(Box::pin(bounded(fut, token, deadline, || self.deadline_error())).await);
        };
        // Boxed: the emitting loop's state is large, and most invocations never emit.
        Box::pin(self.drive_emitting(fut, rx, feed, lineage, mint, token, deadline)).await
    }

    /// [`Actor::drive`] for a node that emits while it runs (and may be fed a live
    /// session's input from the inbox meanwhile).
    #[allow(clippy::too_many_arguments)] // the parts of one attempt, borrowed separately
    async fn drive_emitting<'f>(
        &mut self,
        mut fut: BoxFuture<'f, Result<Outputs, NodeError>>,
        mut rx: mpsc::Receiver<Emitted>,
        feed: Option<&mut Feed>,
        lineage: &Lineage,
        mint: &mut MintedTokens,
        token: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<Result<Outputs, NodeError>, Stop> {
        let sleep = deadline_sleep(deadline);
        tokio::pin!(sleep);
        let live = feed.is_some();
        let mut idle = Feed::default();
        let Feed { pending, tx, buf } = feed.unwrap_or(&mut idle);
        let mut stream_gone = false;
        let r = loop {
            // Feeding a live session: the stream ends once every input has ended and
            // nothing is pending; the inbox is read only while nothing is pending.
            let mut reading = false;
            if stream_gone {
                // The node stopped reading: what is still queued has nowhere to go.
                pending.clear();
                *tx = None;
                stream_gone = false;
            }
            if live {
                if pending.is_empty() && self.all_closed() {
                    *tx = None;
                }
                reading = pending.is_empty() && !self.all_closed();
            }
            tokio::select! {
                biased;
                e = rx.recv() => {
                    if let Some(e) = e {
                        self.route_emitted(e, lineage, mint).await?;
                    }
                }
                r = &mut fut => break r,
                permit = reserve(tx), if !pending.is_empty() => match permit {
                    Some(p) => p.send(pending.pop_front().expect("pending checked non-empty")),
                    None => stream_gone = true,
                },
                n = self.spec.rx.recv_many(buf, BATCH), if reading => {
                    if n == 0 {
                        // Every sender is gone: no input will end any other way.
                        self.open.iter_mut().for_each(|o| *o = 0);
                    }
                    let mut batch = std::mem::take(buf);
                    for m in batch.drain(..) {
                        self.stream_msg(m, pending)?;
                    }
                    *buf = batch;
                    self.flush_edge_events();
                }
                _ = token.cancelled() => break Err(NodeError::cancelled()),
                _ = &mut sleep => {
                    token.cancel();
                    break Err(self.deadline_error());
                }
            }
        };
        drop(fut);
        *tx = None;
        // Everything emitted before the invocation returned goes out before its result.
        while let Ok(e) = rx.try_recv() {
            self.route_emitted(e, lineage, mint).await?;
        }
        Ok(r)
    }
}

async fn reserve(tx: &Option<mpsc::Sender<StreamItem>>) -> Option<mpsc::Permit<'_, StreamItem>> {
    match tx {
        Some(tx) => tx.reserve().await.ok(),
        None => None,
    }
}

/// `fut`'s result, or the invocation's cancel (`token`) or its time limit (`deadline`,
/// which cancels `token` and fails with `late()`), whichever comes first.
pub(super) async fn bounded<'f>(
    mut fut: BoxFuture<'f, Result<Outputs, NodeError>>,
    token: &CancellationToken,
    deadline: Option<Instant>,
    late: impl FnOnce() -> NodeError,
) -> Result<Outputs, NodeError> {
    let sleep = deadline_sleep(deadline);
    tokio::pin!(sleep);
    tokio::select! {
        biased;
        r = &mut fut => r,
        _ = token.cancelled() => Err(NodeError::cancelled()),
        _ = &mut sleep => {
            token.cancel();
            Err(late())
        }
    }
}

/// Resolves at `deadline`, never without one.
async fn deadline_sleep(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
