//! The end of a node: its outcome (done, failed, skipped with the reason, suspended),
//! end-of-stream on every outgoing edge and the final events.

use heddle_core::{EdgeStatus, NodeOutcome, NodeStatus, SkipReason};

use super::{Actor, ActorReport, End, Msg, NodeRole, Stop};
use crate::executor::Outputs;

/// Whether an executor node's `completed` event carries its last outputs (a constant's
/// would only repeat its property).
pub(crate) fn shows_result(node_type: &str) -> bool {
    node_type != "heddle.constant"
}

impl Actor {
    /// Why a node that never ran was skipped, from how its feeders ended: a cause
    /// upstream (cancel, failure, suspension) wins; then `condition` when an incoming
    /// edge's condition ruled it out; `upstream_skipped` only when every feeder was
    /// skipped; otherwise its inputs closed without what it needs (`no_input`).
    pub(super) fn skip_reason(&self) -> SkipReason {
        if self.shared.run_token.is_cancelled() {
            self.shared.stopped_reason(&self.spec.id)
        } else if self.ends.contains(&End::Cancelled) {
            SkipReason::Cancelled
        } else if self.ends.contains(&End::Failed) {
            SkipReason::UpstreamFailed
        } else if self.ends.contains(&End::Suspended) {
            SkipReason::Suspended
        } else if self.ruled_out {
            SkipReason::Condition
        } else if !self.ends.is_empty() && self.ends.iter().all(|e| *e == End::Skipped) {
            SkipReason::UpstreamSkipped
        } else {
            SkipReason::NoInput
        }
    }

    /// Boxed report: it is the actor task's output, and a task's cell is as large as its
    /// future or its output, whichever is larger, for the node's whole life.
    pub(super) async fn finish(mut self, res: Result<(), Stop>) -> Box<ActorReport> {
        // An edge rule that failed late (after the node's last wake-up) still fails it.
        let res = res.and_then(|()| self.edge_stop());
        let (outcome, end, stop) = match res {
            Ok(()) => {
                let ran = self.invocations > 0 || self.started;
                if let Some(reason) = self.skipped_by.filter(|_| self.last_result.is_none()) {
                    (NodeOutcome::Skipped { reason }, End::Skipped, None)
                } else if ran || matches!(self.spec.role, NodeRole::Input { .. }) {
                    (NodeOutcome::Done, End::Done, None)
                } else {
                    let reason = self.skip_reason();
                    // Downstream learns the root cause, not just "skipped".
                    let end = match reason {
                        SkipReason::UpstreamFailed => End::Failed,
                        SkipReason::Suspended => End::Suspended,
                        SkipReason::Cancelled => End::Cancelled,
                        _ => End::Skipped,
                    };
                    (NodeOutcome::Skipped { reason }, end, None)
                }
            }
            Err(Stop::Cancelled) => {
                let reason = self.shared.stopped_reason(&self.spec.id);
                let end = match reason {
                    SkipReason::Cancelled => End::Cancelled,
                    _ => End::Failed,
                };
                (NodeOutcome::Skipped { reason }, end, Some(Stop::Cancelled))
            }
            Err(Stop::Failed(msg)) => (
                NodeOutcome::Failed { error: msg.clone() },
                End::Failed,
                Some(Stop::Failed(msg)),
            ),
            Err(Stop::Abort(msg)) => {
                // An inbox limit aborts the whole run.
                self.shared.abort(&self.spec.id);
                (
                    NodeOutcome::Failed { error: msg.clone() },
                    End::Failed,
                    Some(Stop::Abort(msg)),
                )
            }
            Err(Stop::Suspended(info)) => (
                NodeOutcome::Suspended,
                End::Suspended,
                Some(Stop::Suspended(info)),
            ),
        };
        // Closing the inbox: further sends to this node are dropped.
        self.spec.rx.close();
        // The node's ending is on the record before its end-of-stream leaves: a node
        // below can only settle (skipped, done) after receiving it, so its event always
        // follows this one and every consumer sees a node end after what fed it.
        match &outcome {
            NodeOutcome::Done => {
                let result = if matches!(self.spec.role, NodeRole::Executor)
                    && shows_result(&self.spec.node_type)
                {
                    // Taken, not cloned (the node is done with it), and only what the
                    // event shows: a foreach's last outputs carry every item.
                    self.last_result.take().map(Outputs::into_last_per_handle)
                } else {
                    None
                };
                self.node_event(NodeStatus::Completed, result, None, None);
            }
            NodeOutcome::Failed { error } => {
                self.node_event(NodeStatus::Failed, None, Some(error.clone()), None)
            }
            NodeOutcome::Skipped { reason } => {
                self.node_event(NodeStatus::Skipped, None, None, Some(*reason))
            }
            NodeOutcome::Suspended => {
                let state = match &stop {
                    Some(Stop::Suspended(i)) => Some(Outputs::one("state", i.state.clone())),
                    _ => None,
                };
                self.node_event(NodeStatus::Suspended, state, None, None)
            }
        }
        self.send_eos(end).await;
        Box::new(ActorReport {
            outcome,
            invocations: self.invocations,
            metrics: self
                .rare
                .as_mut()
                .map(|r| std::mem::take(&mut r.metrics))
                .unwrap_or_default(),
            outputs: self
                .rare
                .as_mut()
                .map(|r| std::mem::take(&mut r.outputs))
                .unwrap_or_default(),
            stop,
            ended_in: std::mem::take(&mut self.ended_in),
            sent: self
                .spec
                .ports
                .iter()
                .filter(|p| !p.control)
                .flat_map(|p| p.edges.iter().map(|e| (e.index, e.counter)))
                .collect(),
            signature: self.rare.as_mut().and_then(|r| r.signature.take()),
            timed_out: self.timed_out,
        })
    }

    /// End-of-stream on every outgoing edge (exactly once), control EOS once per
    /// controlled target, and the final edge counters.
    async fn send_eos(&mut self, end: End) {
        if self.eos_sent {
            return;
        }
        self.eos_sent = true;
        let cancelled = self.shared.run_token.is_cancelled();
        for p in 0..self.spec.ports.len() {
            let control = self.spec.ports[p].control;
            for i in 0..self.spec.ports[p].edges.len() {
                let e = &self.spec.ports[p].edges[i];
                if !control {
                    let msg = Msg::Eos {
                        handle: e.handle,
                        end,
                        edge: e.index,
                    };
                    if cancelled {
                        let _ = e.tx.try_send(msg);
                    } else {
                        let _ = self.send(&e.tx, msg).await;
                    }
                }
            }
        }
        let control_targets = self
            .spec
            .rare
            .as_mut()
            .map(|r| std::mem::take(&mut r.control_targets))
            .unwrap_or_default();
        for tx in control_targets {
            if cancelled {
                let _ = tx.try_send(Msg::ControlEos);
            } else {
                let _ = self.send(&tx, Msg::ControlEos).await;
            }
        }
        // The final counters, once every end-of-stream is out.
        for p in &self.spec.ports {
            for e in &p.edges {
                self.edge_event(e, EdgeStatus::Completed);
            }
        }
    }
}
