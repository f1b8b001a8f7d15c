//! The `heddle:node/host@0.2.0` imports: 0.1's, answered by the same code, plus the
//! controller's `control-send` and `control-reply`.
//!
//! A controller's events go through the kernel ([`heddle_kernel::NodeCtx::dispatch_control`]),
//! which checks the target and the overridden properties against the target's
//! declaration; the guest holds a ticket per event and awaits each reply when it
//! chooses, so it may keep many in flight (answered in the order sent).

use std::collections::BTreeMap;

use crate::bindings::heddle::node::host as v1;
use crate::bindings::v0_2::heddle::node::host;
use crate::bindings::{WitLogLevel, WitValue};
use crate::deadline::{Interrupt, until};
use crate::host_state::State;
use crate::value::{from_wit, to_wit, wit_size};

/// Events one invocation may send: each holds a reply until the guest takes it.
pub(crate) const MAX_CONTROL_EVENTS: usize = 10_000;

impl host::Host for State {
    async fn log(&mut self, lvl: WitLogLevel, message: String) {
        v1::Host::log(self, lvl, message).await
    }

    async fn emit(&mut self, handle: String, value: WitValue) -> Result<(), String> {
        v1::Host::emit(self, handle, value).await
    }

    async fn next_input(&mut self) -> Option<(String, WitValue)> {
        v1::Host::next_input(self).await
    }

    async fn report_cost(&mut self, usd: f64) {
        v1::Host::report_cost(self, usd).await
    }

    async fn record_asset(&mut self, id: String) {
        v1::Host::record_asset(self, id).await
    }

    async fn cancelled(&mut self) -> bool {
        v1::Host::cancelled(self).await
    }

    async fn deadline_ms(&mut self) -> Option<u64> {
        v1::Host::deadline_ms(self).await
    }

    async fn get_secret(&mut self, name: String) -> Option<String> {
        v1::Host::get_secret(self, name).await
    }

    async fn control_send(
        &mut self,
        target: String,
        properties: Vec<(String, WitValue)>,
    ) -> Result<u64, String> {
        self.budget.charge(
            target.len()
                + properties
                    .iter()
                    .map(|(k, v)| k.len() + wit_size(v))
                    .sum::<usize>(),
        );
        let Some(inv) = self.inv.as_ref() else {
            return Err("control events can only be sent during an invocation".into());
        };
        if inv.replies.len() >= MAX_CONTROL_EVENTS {
            return Err(format!(
                "node {} sent more than {MAX_CONTROL_EVENTS} control events in one invocation",
                inv.ctx.node_id()
            ));
        }
        let mut props = BTreeMap::new();
        for (k, v) in properties {
            let v = from_wit(v).map_err(|e| format!("control event property `{k}`: {e}"))?;
            props.insert(k, v);
        }
        let ctx = inv.ctx.clone();
        let deadline = inv.deadline.clone();
        let _wait = deadline.waiting();
        // Sending waits only for room in the target's inbox.
        let reply = tokio::select! {
            r = ctx.dispatch_control(&target, props) => r.map_err(|e| e.message)?,
            _ = ctx.cancel_token().cancelled() => {
                self.interrupt = Some(Interrupt::Cancelled);
                return Err("cancelled".into());
            }
            _ = until(deadline.hard()) => {
                self.interrupt = Some(Interrupt::Deadline);
                return Err("deadline exceeded".into());
            }
        };
        let inv = self.inv.as_mut().expect("checked above");
        inv.replies.push(Some(reply));
        Ok((inv.replies.len() - 1) as u64)
    }

    async fn control_reply(&mut self, ticket: u64) -> Result<Vec<(String, WitValue)>, String> {
        self.budget.charge(0);
        let Some(inv) = self.inv.as_mut() else {
            return Err("control replies can only be awaited during an invocation".into());
        };
        let Some(reply) = usize::try_from(ticket)
            .ok()
            .and_then(|i| inv.replies.get_mut(i))
            .and_then(Option::take)
        else {
            return Err(format!(
                "no control event with ticket {ticket} is waiting for its reply"
            ));
        };
        let ctx = inv.ctx.clone();
        let deadline = inv.deadline.clone();
        let _wait = deadline.waiting();
        let out = tokio::select! {
            r = reply.outputs() => r.map_err(|e| e.message)?,
            _ = ctx.cancel_token().cancelled() => {
                self.interrupt = Some(Interrupt::Cancelled);
                return Err("cancelled".into());
            }
            _ = until(deadline.hard()) => {
                self.interrupt = Some(Interrupt::Deadline);
                return Err("deadline exceeded".into());
            }
        };
        let entries: Vec<(String, WitValue)> = out
            .iter()
            .map(|(h, v)| (h.to_string(), to_wit(v)))
            .collect();
        self.budget
            .charge(entries.iter().map(|(k, v)| k.len() + wit_size(v)).sum());
        Ok(entries)
    }
}
