//! Controlled nodes with at least one controller: data inputs only update the latest
//! values; each `run` control event (from a controller edge, or from the caller while a
//! controller is live) is one invocation with those values and the event's properties.
//! The node ends when every controller has ended.

use std::collections::VecDeque;
use std::sync::Arc;

use heddle_core::Value;

use super::invoke::{Invocation, Settled, Work};
use super::routing::MintedTokens;
use super::{Actor, ControlEvent, Msg, Stop};
use crate::executor::Outputs;
use crate::runtime::lineage::Lineage;

impl Actor {
    pub(super) async fn run_controlled(&mut self) -> Result<(), Stop> {
        let mut latest: Vec<Option<Value>> = vec![None; self.spec.handles.len()];
        let mut held: VecDeque<ControlEvent> = VecDeque::new();
        let mut controllers = self.spec.controllers;
        let mut buf = Vec::new();
        let mut ready = false;
        loop {
            if !ready {
                ready = latest
                    .iter()
                    .zip(&self.open)
                    .all(|(l, o)| l.is_some() || *o == 0);
            }
            if ready {
                while let Some(ev) = held.pop_front() {
                    if !self.control_event(ev, &latest).await? {
                        return Ok(());
                    }
                }
            }
            if controllers == 0 {
                // Every controller has finished: answer what is still queued.
                for ev in held.drain(..) {
                    if let Some(r) = ev.reply {
                        let _ = r.send(Err(format!(
                            "node {} finished before it could run the control event",
                            self.spec.id
                        )));
                    }
                }
                return Ok(());
            }
            let Some(mut batch) = self.recv_batch(&mut buf).await? else {
                return Ok(());
            };
            for m in batch.drain(..) {
                match m {
                    Msg::Data { handle, value, .. } => {
                        latest[handle as usize] = Some(value);
                    }
                    Msg::Eos { handle, end, edge } => {
                        self.close_upstream(handle, end, edge);
                    }
                    Msg::Control(ev) => held.push_back(*ev),
                    Msg::ControlEos => controllers = controllers.saturating_sub(1),
                    m @ (Msg::RuledOut { .. } | Msg::EdgeFailed(_)) => self.edge_signal(m),
                    _ => {}
                }
            }
            buf = batch;
            self.edge_stop()?;
            self.flush_edge_events();
        }
    }

    /// Runs one control event; `false` when it was a stop.
    async fn control_event(
        &mut self,
        ev: ControlEvent,
        latest: &[Option<Value>],
    ) -> Result<bool, Stop> {
        if ev.event_type == "stop" {
            if let Some(r) = ev.reply {
                let _ = r.send(Ok(Outputs::new()));
            }
            return Ok(false);
        }
        if ev.event_type != "run" {
            if let Some(r) = ev.reply {
                let _ = r.send(Err(format!(
                    "unknown control event type `{}`",
                    ev.event_type
                )));
            }
            return Ok(true);
        }
        let mut inputs = self.spec.base_inputs.clone();
        for (i, v) in latest.iter().enumerate() {
            if let Some(v) = v {
                inputs.insert(String::from(&*self.spec.handles[i].name), v.clone());
            }
        }
        // Event properties apply to this invocation only.
        for (k, v) in ev.properties {
            inputs.insert(k, v);
        }
        self.mark_started();
        let mut mint = MintedTokens::default();
        // Keyed by the controller: a durable run counts its occurrences per controller.
        let key = match &ev.origin {
            Some(c) => Arc::from(format!("control:{c}")),
            None => self.root_key(),
        };
        let inv = Invocation {
            lineage: &Lineage::ROOT,
            key,
            work: Work::Inputs(inputs),
            emits: true,
            feed: None,
        };
        let settled = match self.invoke(inv, &mut mint).await {
            Ok(s) => s,
            Err(stop) => {
                if let Some(r) = ev.reply {
                    let _ = r.send(Err(stop.message()));
                }
                return Err(stop);
            }
        };
        match settled {
            Settled::Produced(out) => {
                self.route_outputs(&out, &Lineage::ROOT, &mut mint).await?;
                if let Some(r) = ev.reply {
                    let _ = r.send(Ok(out.clone()));
                }
                self.last_result = Some(out);
            }
            // Skipped (end_stream is not offered to a controlled node): this event
            // produces nothing; the node keeps serving events.
            Settled::Skipped { error } | Settled::Ended { error } => {
                if let Some(r) = ev.reply {
                    let _ = r.send(Err(format!("{error} (skipped by the supervisor)")));
                }
            }
        }
        Ok(true)
    }
}
