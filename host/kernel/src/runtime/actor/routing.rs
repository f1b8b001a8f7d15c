//! Delivering what a node produces: values (under their lineage, minting iteration
//! tokens for fan-out ports), control events, `lineage_done` and scope-close signals,
//! and the throttled edge counters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use heddle_core::plan::{Crossing, EdgeRule, RootIdx};
use heddle_core::{EdgeStatus, EventKind, Value};
use smallvec::SmallVec;
use tokio::sync::mpsc;

use super::{Actor, ControlEvent, EDGE_EVENT_INTERVAL, Link, Msg, OutEdge, Stop};
use crate::executor::{Emitted, Outputs};
use crate::runtime::lineage::Lineage;

/// A message [`Actor::route_value`] could not deliver at once (its inbox was full, or
/// one before it waits): sent by [`Actor::deliver_waiting`].
pub(super) struct Waiting {
    port: usize,
    edge: usize,
    msg: Msg,
    /// Counted on the edge once delivered (a data value or a control event).
    counts: bool,
}

/// The item an invocation is currently emitting, per minted root: outputs minting the
/// same root share one token until a port repeats (then the next item starts).
#[derive(Default)]
pub(super) struct MintedTokens {
    items: SmallVec<[MintedItem; 2]>,
}

struct MintedItem {
    root: RootIdx,
    token: u32,
    /// Ports (bit per port index) that already emitted for this item.
    ports: u64,
}

impl Actor {
    pub(super) async fn send(&self, tx: &Link, msg: Msg) -> Result<(), Stop> {
        match deliver_now(tx, msg) {
            None => Ok(()),
            // Boxed: waiting for room is rare, and in place the wait (the channel's
            // send and the cancel token side by side) would enlarge every future that
            // sends, held for a node's whole life while it waits for input.
            Some(msg) => Box::pin(self.send_when_room(tx, msg)).await,
        }
    }

    /// Waits for room in a full inbox (backpressure), unless the run is cancelled.
    async fn send_when_room(&self, tx: &Link, msg: Msg) -> Result<(), Stop> {
        tokio::select! {
            biased;
            _ = tx.send(msg) => Ok(()),
            _ = self.shared.run_token.cancelled() => Err(Stop::Cancelled),
        }
    }

    fn port_index(&self, handle: &str) -> Option<usize> {
        self.spec.ports.iter().position(|p| &*p.name == handle)
    }

    pub(super) async fn route_outputs(
        &mut self,
        out: &Outputs,
        lineage: &Lineage,
        mint: &mut MintedTokens,
    ) -> Result<(), Stop> {
        let waiting = self.route_outputs_now(out, lineage, mint);
        self.deliver_waiting(waiting).await
    }

    /// [`Actor::route_outputs`] without waiting: what could not be delivered at once is
    /// returned, for [`Actor::deliver_waiting`].
    pub(super) fn route_outputs_now(
        &mut self,
        out: &Outputs,
        lineage: &Lineage,
        mint: &mut MintedTokens,
    ) -> Vec<Waiting> {
        let mut waiting = Vec::new();
        for (h, v) in out.0.iter() {
            match self.output_port(h) {
                Some(p) => self.route_value(p, v, lineage, mint, &mut waiting),
                None => self.unknown_output(h),
            }
        }
        waiting
    }

    /// [`Actor::port_index`] of an output handle, by address when it is the one last
    /// routed (its `hot_port`).
    fn output_port(&mut self, h: &Arc<str>) -> Option<usize> {
        if let Some((hot, p)) = &self.hot_port
            && Arc::ptr_eq(hot, h)
        {
            return Some(*p);
        }
        let p = self.port_index(h)?;
        self.hot_port = Some((h.clone(), p));
        Some(p)
    }

    pub(super) async fn route_emitted(
        &mut self,
        e: Emitted,
        lineage: &Lineage,
        mint: &mut MintedTokens,
    ) -> Result<(), Stop> {
        self.keep_emitted_promise(&e.handle, &e.value)?;
        let port = self.port_index(&e.handle);
        if let Some(p) = port
            && !self.spec.ports[p].edges.is_empty()
        {
            // Refused before it crosses an edge. On an output no edge leaves (a code
            // node's stderr) it reaches nobody; a durable run's store still refuses it
            // when it records the invocation's result.
            self.refuse_known_secrets([(&*e.handle, &e.value)])?;
        }
        if let Some(rec) = self.rare.as_mut().and_then(|r| r.emitted.as_mut()) {
            rec.push((e.handle.clone(), e.value.clone()));
        }
        match port {
            Some(p) => {
                self.sent_downstream |= !self.spec.ports[p].edges.is_empty();
                self.route_port_values(&[(p, e.value)], lineage, mint).await
            }
            None => {
                self.unknown_output(&e.handle);
                Ok(())
            }
        }
    }

    fn unknown_output(&self, h: &str) {
        if let Some(warning) = undeclared_output(&self.spec.decl, &self.spec.id, h) {
            self.emit(warning);
        }
    }

    fn next_token(&mut self, root: RootIdx, parent: &Lineage) -> u32 {
        let k = (root, parent.key(&self.spec.scope));
        let c = self.rare().counters.entry(k).or_insert(0);
        let t = *c;
        *c += 1;
        t
    }

    pub(super) async fn route_port_values(
        &mut self,
        vals: &[(usize, Value)],
        lineage: &Lineage,
        mint: &mut MintedTokens,
    ) -> Result<(), Stop> {
        let mut waiting = Vec::new();
        for (p, v) in vals {
            self.route_value(*p, v, lineage, mint, &mut waiting);
        }
        self.deliver_waiting(waiting).await
    }

    /// Routes one value of port `p` without waiting: every message goes into its
    /// target's inbox at once, until an inbox is full; from then on messages queue in
    /// `waiting`, in order, for [`Actor::deliver_waiting`]. A hop whose inboxes have room
    /// (nearly every one) thus runs no future at all.
    fn route_value(
        &mut self,
        p: usize,
        v: &Value,
        lineage: &Lineage,
        mint: &mut MintedTokens,
        waiting: &mut Vec<Waiting>,
    ) {
        let port = &self.spec.ports[p];
        if port.edges.is_empty() {
            return;
        }
        if port.control {
            let Some(ev) = to_control_event(v) else {
                return;
            };
            for i in 0..self.spec.ports[p].edges.len() {
                let ev = ControlEvent {
                    event_type: ev.0.clone(),
                    properties: ev.1.clone(),
                    origin: Some(self.spec.id.clone()),
                    reply: None,
                };
                self.offer(p, i, Msg::Control(Box::new(ev)), true, waiting);
            }
            return;
        }
        let base = lineage.truncate(port.keep);
        let lin = match port.mints {
            None => base,
            Some(root) => {
                let bit = 1u64 << (p % 64);
                let pos = mint.items.iter().position(|g| g.root == root);
                let token = match pos {
                    Some(i) if mint.items[i].ports & bit == 0 => {
                        mint.items[i].ports |= bit;
                        mint.items[i].token
                    }
                    _ => {
                        let token = self.next_token(root, &base);
                        let item = MintedItem {
                            root,
                            token,
                            ports: bit,
                        };
                        match pos {
                            Some(i) => mint.items[i] = item,
                            None => mint.items.push(item),
                        }
                        token
                    }
                };
                base.child(root, token)
            }
        };
        let n = self.spec.ports[p].edges.len();
        for i in 0..n {
            let e = &self.spec.ports[p].edges[i];
            let msg = match &e.rule {
                None => Msg::Data {
                    handle: e.handle,
                    value: v.clone(),
                    lineage: lin.clone(),
                },
                Some(rule) => self.cross(rule, e, v, &lin),
            };
            let crossed = matches!(msg, Msg::Data { .. });
            self.offer(p, i, msg, crossed, waiting);
        }
    }

    /// Delivers `msg` along edge `i` of port `p` now if nothing waits before it and its
    /// inbox has room (counting it when `counts`), else queues it.
    fn offer(&mut self, p: usize, i: usize, msg: Msg, counts: bool, waiting: &mut Vec<Waiting>) {
        let msg = match waiting.is_empty() {
            true => deliver_now(&self.spec.ports[p].edges[i].tx, msg),
            false => Some(msg),
        };
        match msg {
            None if counts => self.count_edge(p, i),
            None => {}
            Some(msg) => waiting.push(Waiting {
                port: p,
                edge: i,
                msg,
                counts,
            }),
        }
    }

    /// Sends what [`Actor::route_value`] queued, in order, waiting for room in each
    /// inbox (backpressure) unless the run is cancelled.
    pub(super) async fn deliver_waiting(&mut self, waiting: Vec<Waiting>) -> Result<(), Stop> {
        if waiting.is_empty() {
            return Ok(());
        }
        // Boxed: waiting is rare, and its state would enlarge every hop.
        Box::pin(async move {
            for w in waiting {
                let tx = &self.spec.ports[w.port].edges[w.edge].tx;
                // Tried first without a future: after one wait the consumer usually
                // took a whole batch, and the messages behind go in at once (a large
                // fan-out's items wait here by the thousand, so a wait on the cancel
                // token per message cost more than delivering it).
                if let Some(msg) = deliver_now(tx, w.msg) {
                    self.send_when_room(tx, msg).await?;
                }
                if w.counts {
                    self.count_edge(w.port, w.edge);
                }
            }
            Ok(())
        })
        .await
    }

    /// What an edge with a rule delivers for `v`: the (narrowed) value, a veto for the
    /// item, or the failure that stops the target, naming the edge.
    fn cross(&self, rule: &EdgeRule, e: &OutEdge, v: &Value, lineage: &Lineage) -> Msg {
        match rule.apply(v) {
            Crossing::Pass(value) => Msg::Data {
                handle: e.handle,
                value,
                lineage: lineage.clone(),
            },
            Crossing::RuledOut => Msg::RuledOut {
                handle: e.handle,
                lineage: lineage.clone(),
            },
            Crossing::Failed(why) => Msg::EdgeFailed(
                format!(
                    "edge {} from node \"{}\": {why}",
                    self.edge_id(e),
                    self.spec.id
                )
                .into(),
            ),
        }
    }

    fn count_edge(&mut self, p: usize, i: usize) {
        let e = &mut self.spec.ports[p].edges[i];
        e.counter += 1;
        if e.last_event.is_none() {
            e.last_event = Some(Instant::now());
            let e = &self.spec.ports[p].edges[i];
            self.edge_event(e, EdgeStatus::Active);
        } else {
            e.dirty = true;
        }
    }

    /// Publishes throttled edge counters (at most one per edge per second).
    pub(super) fn flush_edge_events(&mut self) {
        let mut now: Option<Instant> = None;
        for p in 0..self.spec.ports.len() {
            for i in 0..self.spec.ports[p].edges.len() {
                let e = &mut self.spec.ports[p].edges[i];
                if !e.dirty {
                    continue;
                }
                let t = *now.get_or_insert_with(Instant::now);
                if e.last_event
                    .is_some_and(|l| t.duration_since(l) >= EDGE_EVENT_INTERVAL)
                {
                    e.dirty = false;
                    e.last_event = Some(t);
                    let e = &self.spec.ports[p].edges[i];
                    self.edge_event(e, EdgeStatus::Active);
                }
            }
        }
    }

    /// After an invocation of an iterating node: the children it minted under this key
    /// are complete, so aggregates downstream may finish (even with zero children).
    pub(super) async fn close_minted(&mut self, lineage: &Lineage) -> Result<(), Stop> {
        if !self.has_mints {
            return Ok(());
        }
        let mut done: SmallVec<[RootIdx; 2]> = SmallVec::new();
        for p in 0..self.spec.ports.len() {
            let Some(root) = self.spec.ports[p].mints else {
                continue;
            };
            if done.contains(&root) {
                continue;
            }
            done.push(root);
            let parent = lineage.truncate(self.spec.ports[p].keep);
            self.send_scope_closed(&parent, root).await?;
        }
        Ok(())
    }

    /// Sends `ScopeClosed(parent, root)` on every outgoing data edge whose scope
    /// carries `root`.
    pub(super) async fn send_scope_closed(
        &mut self,
        parent: &Lineage,
        root: RootIdx,
    ) -> Result<(), Stop> {
        for p in 0..self.spec.ports.len() {
            if self.spec.ports[p].control || !self.spec.ports[p].scope.contains(&root) {
                continue;
            }
            for i in 0..self.spec.ports[p].edges.len() {
                let e = &self.spec.ports[p].edges[i];
                let msg = Msg::ScopeClosed {
                    parent: parent.clone(),
                    root,
                };
                self.send(&e.tx, msg).await?;
            }
        }
        Ok(())
    }

    /// A key this node will never fire for: tell downstream (done for its outputs,
    /// scope closed for the children it would have minted).
    pub(super) async fn forward_dropped(&mut self, lineage: &Lineage) -> Result<(), Stop> {
        let mut minted: SmallVec<[RootIdx; 2]> = SmallVec::new();
        for p in 0..self.spec.ports.len() {
            if self.spec.ports[p].control {
                continue;
            }
            if let Some(root) = self.spec.ports[p].mints {
                if !minted.contains(&root) {
                    minted.push(root);
                }
                continue;
            }
            let lin = lineage.truncate(self.spec.ports[p].keep);
            for i in 0..self.spec.ports[p].edges.len() {
                let e = &self.spec.ports[p].edges[i];
                let msg = Msg::Done {
                    handle: e.handle,
                    lineage: lin.clone(),
                };
                self.send(&e.tx, msg).await?;
            }
        }
        for root in minted {
            self.send_scope_closed(lineage, root).await?;
        }
        Ok(())
    }
}

/// The warning for a value on output `h` that no port carries: none when the node
/// declares `h` (an output nothing is connected to drops its values quietly).
pub(crate) fn undeclared_output(
    decl: &heddle_core::NodeDecl,
    node_id: &str,
    h: &str,
) -> Option<EventKind> {
    decl.output(h).is_none().then(|| EventKind::Log {
        node_id: node_id.to_string(),
        level: heddle_core::LogLevel::Warn,
        message: format!("node produced a value on undeclared output `{h}`; dropped"),
    })
}

/// Puts `msg` into `tx`'s inbox if it has room; hands it back when the inbox is full.
/// A closed inbox (its node has stopped) drops it.
fn deliver_now(tx: &Link, msg: Msg) -> Option<Msg> {
    match tx.try_send(msg) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => None,
        Err(mpsc::error::TrySendError::Full(msg)) => Some(msg),
    }
}

/// A value on a control port becomes a control event: one with `event_type` is a control event as is; a plain object is a
/// `run` event with those properties (a nested `properties` object is unwrapped);
/// anything else is ignored.
fn to_control_event(v: &Value) -> Option<(String, BTreeMap<String, Value>)> {
    let obj = v.as_object()?;
    if let Some(t) = obj.get("event_type").and_then(|t| t.as_str()) {
        let props = obj
            .get("properties")
            .and_then(|p| p.as_object())
            .cloned()
            .unwrap_or_default();
        return Some((t.to_string(), props));
    }
    let props = match obj.get("properties").and_then(|p| p.as_object()) {
        Some(p) => p.clone(),
        None => obj.clone(),
    };
    Some(("run".to_string(), props))
}
