//! `heddle.input` nodes: the kernel itself dispatches the value given at start and, for a
//! streaming input, every value the caller pushes until it finishes the input.

use heddle_core::Value;

use super::routing::MintedTokens;
use super::{Actor, Msg, Stop, reply_not_controlled};
use crate::executor::Outputs;
use crate::runtime::lineage::Lineage;

impl Actor {
    pub(super) async fn run_input(
        &mut self,
        streaming: bool,
        initial: Option<Value>,
    ) -> Result<(), Stop> {
        self.mark_started();
        if let Some(v) = initial {
            self.invocations += 1;
            self.record_input(&v);
            self.route_port_values(&[(0, v)], &Lineage::ROOT, &mut MintedTokens::default())
                .await?;
        }
        if !streaming {
            return Ok(());
        }
        let mut buf = Vec::new();
        while let Some(mut batch) = self.recv_batch(&mut buf).await? {
            for m in batch.drain(..) {
                match m {
                    Msg::External(v) => {
                        self.invocations += 1;
                        self.record_input(&v);
                        self.route_port_values(
                            &[(0, v)],
                            &Lineage::ROOT,
                            &mut MintedTokens::default(),
                        )
                        .await?;
                    }
                    Msg::ExternalEos => return Ok(()),
                    Msg::Control(ev) => reply_not_controlled(*ev, &self.spec.id),
                    _ => {}
                }
            }
            buf = batch;
            self.flush_edge_events();
        }
        Ok(())
    }

    /// An input's value is its output, as a supervisor's tools see it: the node that fed
    /// the failing one is an ancestor like any other.
    fn record_input(&self, v: &Value) {
        if self
            .shared
            .escalator
            .as_ref()
            .is_some_and(|e| e.state().recording())
        {
            let out = Outputs::one(self.spec.ports[0].name.clone(), v.clone());
            self.record_for_supervisor(&Lineage::ROOT, &out, || 0.0);
        }
    }
}
