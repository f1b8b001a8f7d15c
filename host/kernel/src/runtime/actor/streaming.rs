//! Streaming-input nodes: either one live session over the whole input stream (items
//! fed as they arrive), or, for a node that aggregates a fan-out, one session per parent
//! scope once that scope has closed.

use std::collections::{BTreeMap, VecDeque};

use heddle_core::{OutputCorrelation, SkipReason, Value};
use tokio::sync::mpsc;

use super::invoke::{Feed, Invocation, Settled, Work};
use super::routing::MintedTokens;
use super::{Actor, BATCH, Msg, Stop, reply_not_controlled};
use crate::executor::{InputStream, StreamItem};
use crate::runtime::lineage::{Key, Lineage};

impl Actor {
    pub(super) async fn run_streaming_input(&mut self) -> Result<(), Stop> {
        let aggregate = !self.spec.scope.is_empty()
            && self
                .spec
                .decl
                .outputs
                .iter()
                .any(|o| matches!(o.correlation, OutputCorrelation::Aggregate));
        if aggregate {
            self.run_aggregate().await
        } else {
            self.run_live_stream().await
        }
    }

    /// One session over the whole input stream, items fed as they arrive.
    async fn run_live_stream(&mut self) -> Result<(), Stop> {
        let mut feed = Feed {
            buf: Vec::new(),
            ..Feed::default()
        };
        // Wait for the first item (or the end) before starting the node. A stream that
        // ended cleanly with no item is still a stream: the node runs and sees its end
        // (a sum reports its empty total). Only a stream that never was (every feeder
        // failed, was skipped, suspended or cancelled) skips the node.
        if !self.spec.handles.is_empty() {
            while feed.pending.is_empty() && !self.all_closed() {
                let n = tokio::select! {
                    biased;
                    n = self.spec.rx.recv_many(&mut feed.buf, BATCH) => n,
                    _ = self.shared.run_token.cancelled() => return Err(Stop::Cancelled),
                };
                if n == 0 {
                    break;
                }
                let mut batch = std::mem::take(&mut feed.buf);
                for m in batch.drain(..) {
                    self.stream_msg(m, &mut feed.pending)?;
                }
                feed.buf = batch;
            }
            if feed.pending.is_empty() && self.skip_reason() != SkipReason::NoInput {
                return Ok(());
            }
        }
        self.mark_started();
        let (stx, srx) = mpsc::channel::<StreamItem>(self.shared.limits.buffer.max(1));
        feed.tx = Some(stx);
        let stream = InputStream::new(srx, self.spec.base_inputs.clone());
        let key = self.root_key();
        let mut mint = MintedTokens::default();
        let inv = Invocation {
            lineage: &Lineage::ROOT,
            key,
            work: Work::Stream(Some(stream)),
            emits: true,
            feed: Some(&mut feed),
        };
        // A streaming-input node may only be ended (end_stream) or failed: what it
        // emitted stays, the rest of its input is dropped.
        if let Settled::Produced(out) = self.invoke(inv, &mut mint).await? {
            self.route_outputs(&out, &Lineage::ROOT, &mut mint).await?;
            self.close_minted(&Lineage::ROOT).await?;
            self.last_result = Some(out);
        }
        Ok(())
    }

    /// Takes one inbox message of a live session: items join `pending`.
    pub(super) fn stream_msg(
        &mut self,
        m: Msg,
        pending: &mut VecDeque<StreamItem>,
    ) -> Result<(), Stop> {
        match m {
            Msg::Data {
                handle, mut value, ..
            } => {
                let handle = self.spec.handles[handle as usize].name.clone();
                self.check_item(&handle, &mut value)?;
                pending.push_back(StreamItem { handle, value });
            }
            Msg::Eos { handle, end, edge } => {
                self.close_upstream(handle, end, edge);
            }
            Msg::Control(ev) => reply_not_controlled(*ev, &self.spec.id),
            m @ (Msg::RuledOut { .. } | Msg::EdgeFailed(_)) => self.edge_signal(m),
            _ => {}
        }
        Ok(())
    }

    /// Aggregating streaming-input node: one session per parent key, run when the
    /// child scope closes, items in item-index order.
    async fn run_aggregate(&mut self) -> Result<(), Stop> {
        let depth = self.spec.scope.len() - 1;
        let inner = self.spec.scope[depth];
        let mut sessions: BTreeMap<Key, Vec<(u32, u16, Value)>> = BTreeMap::new();
        let mut buf = Vec::new();
        while !self.all_closed() {
            let Some(mut batch) = self.recv_batch(&mut buf).await? else {
                break;
            };
            for m in batch.drain(..) {
                match m {
                    Msg::Data {
                        handle,
                        mut value,
                        lineage,
                    } => {
                        if !self.spec.typed_inputs().is_empty() {
                            let name = self.spec.handles[handle as usize].name.clone();
                            self.check_item(&name, &mut value)?;
                        }
                        let key = lineage.key(&self.spec.scope);
                        let parent: Key = key[..depth].iter().copied().collect();
                        sessions
                            .entry(parent)
                            .or_default()
                            .push((key[depth], handle, value));
                    }
                    Msg::Eos { handle, end, edge } => {
                        self.close_upstream(handle, end, edge);
                    }
                    Msg::ScopeClosed { parent, root, .. } => {
                        if !self.scope_close_complete(root, &parent) {
                            continue;
                        }
                        if root == inner {
                            let pk = parent.key(&self.spec.scope[..depth]);
                            let items = sessions.remove(&pk).unwrap_or_default();
                            self.run_session(pk, items).await?;
                        } else if let Some(d) = self.spec.scope.iter().position(|r| *r == root) {
                            let pk = parent.key(&self.spec.scope[..d]);
                            let under: Vec<Key> =
                                sessions.keys().filter(|k| k[..d] == *pk).cloned().collect();
                            for k in under {
                                let items = sessions.remove(&k).unwrap_or_default();
                                self.run_session(k, items).await?;
                            }
                            self.send_scope_closed(&parent, root).await?;
                        }
                    }
                    Msg::Done { .. } => {}
                    Msg::Control(ev) => reply_not_controlled(*ev, &self.spec.id),
                    m @ (Msg::RuledOut { .. } | Msg::EdgeFailed(_)) => self.edge_signal(m),
                    _ => {}
                }
            }
            self.edge_stop()?;
            buf = batch;
            self.flush_edge_events();
        }
        // Sessions still open belong to a scope that never closed: its fan-out did not
        // finish (an upstream failed or suspended). No partial aggregate is emitted; a
        // node that emitted none is skipped with that upstream's reason.
        Ok(())
    }

    /// One aggregate: a session over the items of one parent key, in item order.
    async fn run_session(
        &mut self,
        parent: Key,
        mut items: Vec<(u32, u16, Value)>,
    ) -> Result<(), Stop> {
        self.mark_started();
        items.sort_by_key(|(i, _, _)| *i);
        let depth = self.spec.scope.len() - 1;
        let lineage = Lineage::from_key(&self.spec.scope[..depth], &parent);
        let key = self.key_text(&lineage);
        let (stx, srx) = mpsc::channel::<StreamItem>(items.len().max(1));
        // Drained, not consumed: the emptied list is freed once the aggregate is built.
        // Freed here, a large one (a 10,000-item fan-out's) was often the top of the
        // heap, which the allocator then gave back to the system, only for the
        // aggregate's own list to take those pages again, fault by fault, moments later.
        for (_, h, v) in items.drain(..) {
            // Capacity equals the item count, so this cannot fail.
            let _ = stx.try_send(StreamItem {
                handle: self.spec.handles[h as usize].name.clone(),
                value: v,
            });
        }
        drop(stx);
        let stream = InputStream::new(srx, self.spec.base_inputs.clone());
        let mut mint = MintedTokens::default();
        let inv = Invocation {
            lineage: &lineage,
            key,
            work: Work::Stream(Some(stream)),
            emits: true,
            feed: None,
        };
        // Streaming input: end_stream (keep what was emitted) or fail only.
        let produced = self.invoke(inv, &mut mint).await?;
        drop(items);
        if let Settled::Produced(out) = produced {
            self.route_outputs(&out, &lineage, &mut mint).await?;
            self.last_result = Some(out);
        }
        Ok(())
    }
}
