//! Buffered and streaming-output nodes: the correlated scheduler decides when a lineage
//! key has a complete set of inputs, and each complete set is one invocation.

use heddle_core::plan::RootIdx;
use heddle_core::{NodeMode, Value};
use smallvec::SmallVec;

use super::invoke::{Invocation, Settled, Work};
use super::routing::{MintedTokens, Waiting};
use super::{Actor, Msg, NodeRole, Stop, reply_not_controlled};
use crate::executor::{InputView, Inputs, Outputs};
use crate::runtime::bus::Draft;
use crate::runtime::lineage::{Key, Lineage};
use crate::runtime::sched::{DoneEffect, Firing, Limits, SchedHandle, Scheduler};

/// A scope close received from upstream: `root` closed under `parent`, which is `key`
/// over the first `depth` roots of this node's invocation scope.
struct ClosingScope {
    parent: Lineage,
    root: RootIdx,
    key: Key,
    depth: usize,
}

impl Actor {
    /// Only the hop of a native node ([`Actor::try_now`]) and an output node's value are
    /// handled in place, with nothing awaited but the inbox: every other step is a boxed
    /// future, so the state a node holds for its whole life stays small (in place, an
    /// invocation's attempt loop alone would add ~2 KB to every waiting node). A node
    /// that gets to a boxed step does real work there, beside which a box is little.
    pub(super) async fn run_buffered(&mut self) -> Result<(), Stop> {
        if self.spec.handles.is_empty() {
            return Box::pin(self.fire_source()).await;
        }
        // One plain handle fed by one edge: every value fires at once, no buckets needed.
        let fast = self.spec.handles.len() == 1
            && !self.spec.handles[0].accumulates
            && self.spec.handles[0].upstream <= 1;
        // Made by the first message that needs it (see `scheduler`): a fast node's
        // values never do, so a long chain's nodes hold none. Boxed: this future lives
        // as long as the node, and in place the scheduler would be a fifth of it.
        let mut sched: Option<Box<Scheduler>> = None;
        // Scopes that closed upstream, not yet passed on (see `release_settled`).
        let mut closing: Vec<ClosingScope> = Vec::new();
        // Firings that run together (a node that declares it), run before anything
        // else leaves the node: at the end of each batch, and before any message but a
        // value is handled.
        let mut group = self.group();
        let mut buf = Vec::new();
        while !self.all_closed() {
            let batch = if group.holds_outputs() {
                // Outputs held back for their results: delivered with the next values'
                // starts when more are ready now, else on their own before waiting.
                let ready = {
                    let next = std::pin::pin!(self.recv_batch(&mut buf));
                    crate::runtime::poll_once(next).await
                };
                match ready {
                    std::task::Poll::Ready(b) => b?,
                    std::task::Poll::Pending => {
                        Box::pin(self.run_group(&mut group, true)).await?;
                        self.recv_batch(&mut buf).await?
                    }
                }
            } else {
                self.recv_batch(&mut buf).await?
            };
            let Some(mut batch) = batch else {
                break;
            };
            for m in batch.drain(..) {
                if !group.is_empty() && !matches!(m, Msg::Data { .. }) {
                    Box::pin(self.run_group(&mut group, true)).await?;
                }
                match m {
                    Msg::Data {
                        handle,
                        value,
                        lineage,
                    } => {
                        if fast {
                            let lin = lineage.into_truncated(self.spec.scope.len());
                            let f = if self.now {
                                // The hop without a future: invoked, routed, done (a
                                // full inbox or a minted scope is settled after).
                                match self.try_now([(0, value)]) {
                                    Ok(out) => {
                                        let waiting = self.produce_now(out, &lin);
                                        if self.unsettled(&waiting) {
                                            Box::pin(self.settle_now(waiting, &lin)).await?;
                                        }
                                        continue;
                                    }
                                    Err(back) => back,
                                }
                            } else {
                                let mut f = Firing::new();
                                f.push((0, value));
                                f
                            };
                            if let NodeRole::Output { .. } = &self.spec.role {
                                self.fire_output(f);
                            } else {
                                Box::pin(self.fire_grouped(&mut group, f, lin)).await?;
                            }
                            continue;
                        }
                        let sched = self.scheduler(&mut sched);
                        match sched.push(handle as usize, value, &lineage) {
                            Err(o) => return Err(Stop::Abort(o.0)),
                            Ok(Some(key)) => {
                                Box::pin(self.fire_key(sched, &mut group, &key)).await?
                            }
                            Ok(None) => Box::pin(self.fire_ready(sched, &mut group)).await?,
                        }
                    }
                    Msg::Eos { handle, end, edge } => {
                        // A scheduler made later reads the handle closed from `open`.
                        if self.close_upstream(handle, end, edge)
                            && let Some(sched) = sched.as_mut()
                        {
                            sched.close_handle(handle as usize);
                            if !fast {
                                Box::pin(self.fire_ready(sched, &mut group)).await?;
                            }
                        }
                    }
                    Msg::RuledOut { handle, lineage } => {
                        self.ruled_out = true;
                        if fast {
                            let lin = lineage.into_truncated(self.spec.scope.len());
                            Box::pin(self.forward_dropped(&lin)).await?;
                            continue;
                        }
                        let sched = self.scheduler(&mut sched);
                        match sched.rule_out(handle as usize, &lineage) {
                            Err(o) => return Err(Stop::Abort(o.0)),
                            Ok(Some(key)) => {
                                Box::pin(self.fire_key(sched, &mut group, &key)).await?
                            }
                            Ok(None) => Box::pin(self.fire_ready(sched, &mut group)).await?,
                        }
                    }
                    Msg::EdgeFailed(message) => return Err(Stop::Failed(message.into())),
                    Msg::Done { handle, lineage } => {
                        let sched = self.scheduler(&mut sched);
                        match sched.done(handle as usize, &lineage) {
                            Err(o) => return Err(Stop::Abort(o.0)),
                            Ok(DoneEffect::Wait) => {}
                            Ok(DoneEffect::Ready(key)) => {
                                Box::pin(self.fire_key(sched, &mut group, &key)).await?
                            }
                            Ok(DoneEffect::Dropped(key)) => {
                                let l = Lineage::from_key(&self.spec.scope, &key);
                                Box::pin(self.forward_dropped(&l)).await?;
                            }
                        }
                    }
                    Msg::ScopeClosed { parent, root } => {
                        if !self.scope_close_complete(root, &parent) {
                            continue;
                        }
                        match self.spec.scope.iter().position(|r| *r == root) {
                            Some(depth) => {
                                let key = parent.key(&self.spec.scope[..depth]);
                                let sched = self.scheduler(&mut sched);
                                sched.close_scope(&key, depth);
                                Box::pin(self.fire_ready(sched, &mut group)).await?;
                                closing.push(ClosingScope {
                                    parent,
                                    root,
                                    key,
                                    depth,
                                });
                            }
                            None => Box::pin(self.send_scope_closed(&parent, root)).await?,
                        }
                    }
                    Msg::Control(ev) => reply_not_controlled(*ev, &self.spec.id),
                    Msg::ControlEos | Msg::External(_) | Msg::ExternalEos => {}
                }
                if !closing.is_empty() {
                    Box::pin(self.run_group(&mut group, true)).await?;
                    let sched = self.scheduler(&mut sched);
                    Box::pin(self.release_settled(sched, &mut closing, false)).await?;
                }
            }
            if !group.is_empty() {
                Box::pin(self.run_group(&mut group, false)).await?;
            }
            buf = batch;
            self.flush_edge_events();
        }
        // Every input closed: whatever can fire, fires (partial input takes defaults).
        if !fast {
            let sched = self.scheduler(&mut sched);
            Box::pin(self.fire_ready(sched, &mut group)).await?;
        }
        Box::pin(self.run_group(&mut group, true)).await?;
        match sched.as_mut() {
            Some(sched) => Box::pin(self.release_settled(sched, &mut closing, true)).await,
            // Nothing was ever closing: only a scope close makes the scheduler.
            None => Ok(()),
        }
    }

    /// The node's scheduler in `slot`, made on first use with the handles' state so far:
    /// a handle whose every edge ended before then is closed, as `close_handle` would
    /// have marked it (the only change a message that needs no scheduler makes to one).
    fn scheduler<'s>(&self, slot: &'s mut Option<Box<Scheduler>>) -> &'s mut Scheduler {
        slot.get_or_insert_with(|| {
            let handles: Vec<SchedHandle> = self
                .spec
                .handles
                .iter()
                .zip(&self.open)
                .map(|(h, open)| SchedHandle {
                    name: h.name.clone(),
                    class: h.class,
                    scope: h.scope.to_vec(),
                    accumulates: h.accumulates,
                    closed: *open == 0,
                    edges: h.upstream,
                })
                .collect();
            let keep = self.spec.handles.iter().any(|h| h.repeats);
            Box::new(Scheduler::new(
                self.spec.id.clone(),
                handles,
                self.spec.scope.to_vec(),
                self.spec.driver,
                keep,
                Limits {
                    max_pending_keys: self.shared.limits.max_pending_keys,
                    max_pending_messages_per_key: self.shared.limits.max_pending_messages_per_key,
                },
                self.shared.roots.clone(),
            ))
        })
    }

    /// A source: fires once with its properties.
    pub(super) async fn fire_source(&mut self) -> Result<(), Stop> {
        if self.now
            && let Ok(out) = self.try_now(Firing::new())
        {
            return self.produced_now(out, &Lineage::ROOT).await;
        }
        let inputs = self.spec.base_inputs.clone();
        self.fire(inputs, SmallVec::new(), Lineage::ROOT).await
    }

    /// Passes on the scope closes whose items have all settled (fired or dropped); with
    /// `all`, every one (nothing can fire any more). Until then an aggregate downstream
    /// must not finish: items still waiting for a late side input belong to the scope.
    /// (An outer scope is pending while any scope under it is, so nested closes still
    /// leave in order.)
    async fn release_settled(
        &mut self,
        sched: &mut Scheduler,
        closing: &mut Vec<ClosingScope>,
        all: bool,
    ) -> Result<(), Stop> {
        let mut i = 0;
        while i < closing.len() {
            let c = &closing[i];
            if !all && sched.pending_under(&c.key, c.depth) {
                i += 1;
                continue;
            }
            let c = closing.remove(i);
            sched.retire_scope(&c.key, c.depth);
            self.send_scope_closed(&c.parent, c.root).await?;
        }
        Ok(())
    }

    async fn fire_key(
        &mut self,
        sched: &mut Scheduler,
        group: &mut super::group::Group,
        key: &Key,
    ) -> Result<(), Stop> {
        while let Some((f, vetoed)) = sched.take_ruled(key) {
            let lin = Lineage::from_key(sched.scope(), key);
            if vetoed {
                // An edge's condition chose another branch for this item: the node does
                // not run for it, and downstream learns the item is done.
                self.forward_dropped(&lin).await?;
            } else {
                self.fire_grouped(group, f, lin).await?;
            }
        }
        Ok(())
    }

    async fn fire_ready(
        &mut self,
        sched: &mut Scheduler,
        group: &mut super::group::Group,
    ) -> Result<(), Stop> {
        loop {
            let keys = sched.ready_keys();
            if keys.is_empty() {
                return Ok(());
            }
            for k in keys {
                self.fire_key(sched, group, &k).await?;
            }
        }
    }

    pub(super) async fn fire_firing(&mut self, f: Firing, lineage: Lineage) -> Result<(), Stop> {
        if let NodeRole::Output { .. } = &self.spec.role {
            self.fire_output(f);
            return Ok(());
        }
        if self.lacks_required(&f) {
            // A required input never arrived for this key: the node cannot run for it,
            // and downstream learns the key is done. If it never runs at all, its skip
            // reason says why the input is missing.
            return self.forward_dropped(&lineage).await;
        }
        let f = if self.now {
            match self.try_now(f) {
                Ok(out) => return self.produced_now(out, &lineage).await,
                Err(f) => f,
            }
        } else {
            f
        };
        let inputs = self.rebuild_inputs(&f);
        self.fire(inputs, f, lineage).await
    }

    /// An output node's firing: the kernel's own, the value becomes a run output.
    fn fire_output(&mut self, f: Firing) {
        let NodeRole::Output { name } = &self.spec.role else {
            return;
        };
        let name = name.clone();
        let v = f
            .into_iter()
            .next()
            .map(|(_, v)| v)
            .or_else(|| self.spec.defaults.first().cloned().flatten())
            .unwrap_or(Value::Null);
        let v = self.shared.outputs_retained.admit(v);
        self.mark_started();
        self.invocations += 1;
        self.shared.bus.publish_draft(Draft::Output {
            node_id: self.spec.id.clone(),
            name,
            value: v.clone(),
        });
        self.rare().outputs.push(v);
    }

    /// One invocation through [`Executor::invoke_now`]: the firing's values are read in
    /// place (no input map, context or future). Hands the firing back, untouched, when
    /// the executor declines (then [`Actor::fire`] runs it the usual way).
    fn try_now(&mut self, f: impl IntoIterator<Item = (usize, Value)>) -> Result<Outputs, Firing> {
        let handles = &self.spec.handles;
        let mut edges = SmallVec::new();
        for (h, v) in f {
            edges.push((&*handles[h].name, v));
        }
        let mut view = InputView::new(edges, &self.spec.base_inputs);
        // The last outputs, for the executor to reuse (they are the last ones again once
        // routed, see `produce_now`).
        let last = self.last_result.take();
        let had = last.is_some();
        let mut out = last.unwrap_or_default();
        if self.spec.exec.invoke_now_into(&mut view, &mut out) {
            return Ok(out);
        }
        // Declined: `out` is untouched, and nothing was taken, so the values come back
        // in firing order and each handle's index is where its (unique) name is.
        if had {
            self.last_result = Some(out);
        }
        Err(view
            .into_edges()
            .map(|(name, v)| {
                let h = handles.iter().position(|h| &*h.name == name);
                (h.expect("a firing's handle is one of the node's"), v)
            })
            .collect())
    }

    /// What [`Actor::fire`] does with produced outputs, for an invocation
    /// [`Actor::try_now`] ran: counted, routed, its minted scopes closed.
    async fn produced_now(&mut self, out: Outputs, lineage: &Lineage) -> Result<(), Stop> {
        let waiting = self.produce_now(out, lineage);
        self.settle_now(waiting, lineage).await
    }

    /// The part of [`Actor::produced_now`] that never waits: counted, and routed into
    /// every inbox with room. What is left is for [`Actor::settle_now`].
    fn produce_now(&mut self, out: Outputs, lineage: &Lineage) -> Vec<Waiting> {
        self.mark_started();
        self.invocations += 1;
        self.sent_downstream = false;
        let waiting = self.route_outputs_now(&out, lineage, &mut MintedTokens::default());
        self.last_result = Some(out);
        waiting
    }

    /// Whether [`Actor::settle_now`] has anything to do after [`Actor::produce_now`].
    fn unsettled(&self, waiting: &[Waiting]) -> bool {
        !waiting.is_empty() || self.has_mints
    }

    /// Delivers what waits for room, then closes the scopes this invocation minted.
    async fn settle_now(&mut self, waiting: Vec<Waiting>, lineage: &Lineage) -> Result<(), Stop> {
        self.deliver_waiting(waiting).await?;
        if self.has_mints {
            self.close_minted(lineage).await?;
        }
        Ok(())
    }

    pub(super) fn lacks_required(&self, f: &Firing) -> bool {
        self.spec
            .handles
            .iter()
            .enumerate()
            .any(|(i, h)| h.required && !f.iter().any(|(j, _)| *j == i))
    }

    /// Runs one invocation (buffered, streaming output) and routes what it produces.
    async fn fire(&mut self, inputs: Inputs, used: Firing, lineage: Lineage) -> Result<(), Stop> {
        self.mark_started();
        let key = self.key_text(&lineage);
        let mut mint = MintedTokens::default();
        let inv = Invocation {
            lineage: &lineage,
            key,
            work: Work::Firing {
                first: Some(inputs),
                used,
            },
            emits: self.spec.decl.mode == NodeMode::StreamingOutput,
            feed: None,
        };
        let settled = self.invoke(inv, &mut mint).await?;
        self.deliver(settled, &lineage, &mut mint).await
    }

    /// Routes what a settled invocation at `lineage` produced (under `mint`'s iteration
    /// tokens, continued from what it emitted), or tells downstream it produced nothing.
    pub(super) async fn deliver(
        &mut self,
        settled: Settled,
        lineage: &Lineage,
        mint: &mut MintedTokens,
    ) -> Result<(), Stop> {
        match settled {
            Settled::Produced(out) => {
                self.route_outputs(&out, lineage, mint).await?;
                self.close_minted(lineage).await?;
                self.last_result = Some(out);
                Ok(())
            }
            Settled::Skipped { .. } => self.forward_dropped(lineage).await,
            // What was emitted stays; the children minted so far are complete.
            Settled::Ended { .. } => self.close_minted(lineage).await,
        }
    }
}
