//! The one place an invocation failure is decided and its resolution applied.

use heddle_core::{SkipReason, SuspendInfo};

use super::invoke::{InvocationRecord, Settled};
use super::{Actor, Stop};
use crate::executor::{ErrorKind, NodeError};
use crate::runtime::lineage::Lineage;
use crate::supervisor::{FailedInvocation, LineageStep, Resolution, escalates};

impl Actor {
    /// Decides a failed invocation. With a supervisor the failure is escalated
    /// (suspension and cancellation never are) and its verdict, already checked against
    /// the allowed set, is applied here; without one a failure fails the node. Routing
    /// failures never come here.
    ///
    /// `Ok(None)` means invoke again with the same inputs; `Ok(Some(_))` how the
    /// invocation settled; `Err` stops the node.
    pub(super) async fn recover(
        &mut self,
        err: NodeError,
        rec: InvocationRecord,
    ) -> Result<Option<Settled>, Stop> {
        let mut summary = None;
        if let Some(esc) = self.shared.escalator.clone()
            && escalates(&err)
        {
            esc.state().record_invocation(
                &self.spec.id,
                &rec.lineage.entries(),
                None,
                rec.metrics.cost_usd,
            );
            let (resolution, note) = esc
                .on_failure_noted(FailedInvocation {
                    node_id: &self.spec.id,
                    node_type: &self.spec.node_type,
                    decl: &self.spec.decl,
                    contract: self.spec.contract().map(|c| &**c),
                    mode: self.spec.decl.mode,
                    lineage: self.lineage_steps(&rec.lineage),
                    key: &rec.key,
                    inputs: &rec.inputs,
                    error: &err,
                    metrics: &rec.metrics,
                    emitted: rec.emitted,
                    attempt: rec.attempt,
                })
                .await;
            if self.shared.run_token.is_cancelled() {
                return Err(Stop::Cancelled);
            }
            // Recorded with the verdict by whoever writes it (a retry's or a skip's).
            if note.is_some() || self.rare.is_some() {
                self.rare().decision_note = note;
            }
            match resolution {
                Resolution::Retry => return Ok(None),
                // Already checked against everything the node declared, its fields
                // included, before it was accepted.
                Resolution::Substitute(o) => return Ok(Some(Settled::Produced(o))),
                Resolution::Skip => {
                    self.skipped_by.get_or_insert(SkipReason::Supervisor);
                    return Ok(Some(Settled::Skipped { error: err.message }));
                }
                Resolution::EndStream => return Ok(Some(Settled::Ended { error: err.message })),
                Resolution::Fail { summary: s } => summary = s,
            }
        }
        match err.kind {
            ErrorKind::Suspend { reason, state } => Err(Stop::Suspended(SuspendInfo {
                node_id: self.spec.id.to_string(),
                reason,
                state,
            })),
            ErrorKind::Cancelled if self.shared.run_token.is_cancelled() => Err(Stop::Cancelled),
            kind => {
                let what = match kind {
                    ErrorKind::Deadline => "deadline exceeded: ",
                    ErrorKind::FuelExhausted => "fuel exhausted: ",
                    ErrorKind::MemoryLimit => "memory limit: ",
                    ErrorKind::OutputTooLarge => "output too large: ",
                    ErrorKind::Trap { .. } => "trap: ",
                    ErrorKind::Host => "host error: ",
                    _ => "",
                };
                let key = if rec.key.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", rec.key)
                };
                // A node's own signature is what its author and policy rules match on;
                // host failures are already named by `what`.
                self.rare().signature = match (&kind, &err.signature) {
                    (ErrorKind::Node | ErrorKind::Assertion | ErrorKind::Input, Some(sig)) => {
                        Some(sig.as_str().into())
                    }
                    _ => None,
                };
                let signature = match self.rare.as_ref().and_then(|r| r.signature.as_ref()) {
                    Some(sig) => format!(" (signature {sig})"),
                    None => String::new(),
                };
                let original = format!(
                    "node \"{}\" (type {}) failed{key}: {what}{}{signature}",
                    self.spec.id,
                    self.spec.node_type,
                    self.shared.secrets.mask(&err.message)
                );
                // The decider's reason leads the run's error summary; the original error
                // stays with it (and in the intervention record).
                Err(Stop::Failed(match summary {
                    Some(reason) => format!("{reason} [supervisor; {original}]"),
                    None => original,
                }))
            }
        }
    }

    fn lineage_steps(&self, lineage: &Lineage) -> Vec<LineageStep> {
        lineage
            .entries()
            .iter()
            .map(|(r, i)| LineageStep {
                root: self
                    .shared
                    .roots
                    .get(*r as usize)
                    .map(|x| x.name.to_string())
                    .unwrap_or_default(),
                index: u64::from(*i),
            })
            .collect()
    }
}
