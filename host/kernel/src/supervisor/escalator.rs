//! The kernel side of one escalation, called from the actor's single failure path.

use std::sync::{Arc, Mutex};

use heddle_core::plan::NodeContract;
use heddle_core::supervise::{
    DecidedBy, Decision, Escalation, FailureKind, Intervention, LineageStep, RawEscalation,
    RedactLimits, Redactor, Verdict, signatures,
};
use heddle_core::{EventKind, InvocationMetrics, NodeDecl, NodeMode};
use tokio_util::sync::CancellationToken;

use super::allowed::{InvocationFacts, allowed_actions, declared_outputs, enforce};
use super::state::RunLedger;
use super::{DecideCtx, Supervisor, ensure_bounded};
use crate::executor::{ErrorKind, EventSink, Inputs, NodeError, Outputs, SecretRegistry};

/// Invalid substitutes a decider may propose for one failure; the third rejection fails
/// the invocation (decided by the kernel).
pub const MAX_REPAIR_ROUNDS: u32 = 3;

/// A failed invocation as the actor holds it. Borrowed: raw inputs never leave the
/// actor's stack frame except through the redactor.
pub struct FailedInvocation<'a> {
    /// The failing node's id.
    pub node_id: &'a str,
    /// Its type name.
    pub node_type: &'a str,
    /// Its declaration: retry safety and the declared outputs a substitute must match.
    pub decl: &'a NodeDecl,
    /// The fields the graph declared on one of its outputs (`output.fields`).
    pub contract: Option<&'a NodeContract>,
    /// How the actor drove this invocation (buffered, controlled, streaming...).
    pub mode: NodeMode,
    /// Lineage of the invocation, outermost root first (root name, item index).
    pub lineage: Vec<LineageStep>,
    /// Canonical lineage key (`""` at root scope).
    pub key: &'a str,
    /// The invocation's inputs, unmasked (the redactor masks them for the escalation).
    pub inputs: &'a Inputs,
    /// The failure.
    pub error: &'a NodeError,
    /// This invocation's own metrics (its `NodeCtx`), not the node's totals.
    pub metrics: &'a InvocationMetrics,
    /// Streaming: something was emitted downstream before the failure.
    pub emitted: bool,
    /// 1 for the first attempt of this invocation, then 2, 3… for each retry.
    pub attempt: u32,
}

/// What the actor must do, already checked against the allowed set.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Invoke again with the same inputs and properties.
    Retry,
    /// Route these outputs as if the node had produced them (validated per declared type).
    Substitute(Outputs),
    /// Drop this invocation: lineage_done and scope closure downstream.
    Skip,
    /// Keep what was emitted, close the output slots.
    EndStream,
    /// Fail the node with its original error. `summary` is the decider's reason, which
    /// becomes the run's error summary when present.
    Fail {
        /// The decider's reason, if it gave one.
        summary: Option<String>,
    },
}

/// Errors that never escalate: suspension is not failure, a cancelled invocation is the
/// run ending, not the node failing, and a failed assertion is the graph's own verdict on
/// its data (see [`ErrorKind::Assertion`]).
pub fn escalates(err: &NodeError) -> bool {
    !matches!(
        err.kind,
        ErrorKind::Suspend { .. } | ErrorKind::Cancelled | ErrorKind::Assertion
    )
}

/// One per supervised run. Holds the handle (always bounded), the recorded
/// interventions and the run state the agent's tools read.
pub struct Escalator {
    supervisor: Arc<dyn Supervisor>,
    secrets: Arc<SecretRegistry>,
    events: Arc<dyn EventSink>,
    cancel: CancellationToken,
    limits: RedactLimits,
    state: Arc<RunLedger>,
    interventions: Mutex<Vec<Intervention>>,
}

impl Escalator {
    /// `cancel` is the run's token: cancelling the run cancels a pending decision.
    pub fn new(
        supervisor: Arc<dyn Supervisor>,
        secrets: Arc<SecretRegistry>,
        events: Arc<dyn EventSink>,
        cancel: CancellationToken,
    ) -> Self {
        // Before any escalation exists: the handle's own credentials are masked in the
        // very first one (which is also what the handle is sent).
        for secret in supervisor.secrets() {
            secrets.register(&secret);
        }
        let state = if supervisor.wants_run_state() {
            RunLedger::new()
        } else {
            RunLedger::disabled()
        };
        Escalator {
            supervisor: ensure_bounded(supervisor),
            secrets,
            events,
            cancel,
            limits: RedactLimits::default(),
            state: Arc::new(state),
            interventions: Mutex::new(Vec::new()),
        }
    }

    /// The escalator with other size caps for what escalations carry.
    pub fn with_limits(mut self, limits: RedactLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The run state the runtime records into (outputs per lineage, statuses) for the
    /// supervisor's read-only tools.
    pub fn state(&self) -> &Arc<RunLedger> {
        &self.state
    }

    /// Every intervention so far, as the run result carries them.
    pub fn interventions(&self) -> Vec<Intervention> {
        self.interventions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// [`Escalator::interventions`] as JSON, the shape a run result's `interventions`
    /// holds.
    pub fn interventions_json(&self) -> Vec<serde_json::Value> {
        self.interventions()
            .iter()
            .map(Intervention::to_json)
            .collect()
    }

    /// Total spent on decisions.
    pub fn cost_usd(&self) -> f64 {
        self.interventions().iter().map(|i| i.cost_usd).sum()
    }

    /// Called when the run ends.
    pub fn close(&self) {
        self.supervisor.close();
    }

    /// The hook. Call it from the actor's one failure path for errors that
    /// [`escalates`]; routing (delivery) failures must not come here, because a retry
    /// after a partial delivery would duplicate what was delivered.
    pub async fn on_failure(&self, f: FailedInvocation<'_>) -> Resolution {
        self.on_failure_noted(f).await.0
    }

    /// [`Escalator::on_failure`] with the decider's note (masked), which the caller
    /// records with the verdict.
    pub async fn on_failure_noted(&self, f: FailedInvocation<'_>) -> (Resolution, Option<String>) {
        if !escalates(f.error) {
            return (Resolution::Fail { summary: None }, None);
        }
        let failure = failure_kind(&f.error.kind);
        let signature = signatures::signature(&failure, f.error.signature.as_deref());
        let allowed = allowed_actions(&InvocationFacts {
            decl: f.decl,
            mode: f.mode,
            cost_usd: f.metrics.cost_usd,
            created_assets: !f.metrics.assets.is_empty(),
            has_candidate: f.error.candidate.is_some(),
            emitted: f.emitted,
            fails_again: matches!(f.error.kind, ErrorKind::Input),
        });
        let candidate = f.error.candidate.as_ref().map(Outputs::to_map);
        let declared = declared_outputs(f.decl, f.contract);
        // One rule for every text of this escalation, the decider's answers about it
        // included: known secrets, and whatever its inputs hold under a sensitive name.
        let redactor = Redactor::new(self.secrets.snapshot(), self.limits)
            .for_escalation(f.inputs, candidate.as_ref());
        let mut esc = redactor.escalation(RawEscalation {
            node_id: f.node_id,
            node_type: f.node_type,
            lineage: &f.lineage,
            invocation_key: f.key,
            mode: f.mode,
            allowed,
            failure: &failure,
            detail: &f.error.message,
            signature: signature.as_deref(),
            candidate: candidate.as_ref(),
            inputs: f.inputs,
            declared_outputs: &declared,
            attempt: f.attempt,
            spent_cost_usd: f.metrics.cost_usd,
            created_assets: !f.metrics.assets.is_empty(),
            retry_safe: f.decl.retry_safe,
            emitted: f.emitted,
        });
        let ctx = DecideCtx {
            cancel: self.cancel.clone(),
            state: Some(self.state.clone()),
            secrets: self.secrets.clone(),
        };
        loop {
            self.events.emit(EventKind::Escalation {
                node_id: f.node_id.to_string(),
                escalation: serde_json::to_value(&esc).unwrap_or_default(),
            });
            let asked = self
                .supervisor
                .decide(&esc, &ctx)
                .await
                .unwrap_or_else(|e| Decision::fail(e.to_string(), DecidedBy::Bounds));
            let (mut d, overruled) = enforce(esc.allowed_actions, asked);
            if let Verdict::Fail {
                reason: Some(r), ..
            } = &mut d.verdict
            {
                // The decider only saw redacted data, but a reason is free text from
                // outside the kernel and becomes the run's error summary.
                *r = redactor.text(r);
            }
            // Free text from outside the kernel too, recorded in the run's log.
            let note = d.note.as_deref().map(|n| redactor.text(n));
            let mut rejected = None;
            let mut resolution = None;
            if let Verdict::Substitute { outputs } = &d.verdict {
                // Everything the node promised (types and declared fields), before the
                // substitute is accepted: a failure is a repair round, not a node failing
                // after the fact.
                match esc.check_substitute(outputs) {
                    Ok(valid) => {
                        resolution = Some(Resolution::Substitute(valid.into_iter().collect()))
                    }
                    Err(msg) => rejected = Some(msg),
                }
            }
            let rounds_left = esc.repair_round + 1 < MAX_REPAIR_ROUNDS;
            self.record(&f, &esc, &d, overruled, rejected.clone());
            if let Some(msg) = rejected {
                if rounds_left && !self.cancel.is_cancelled() {
                    esc = redactor.repair_round(&esc, &format!("substitute rejected: {msg}"));
                    continue;
                }
                let d = Decision::fail(
                    format!(
                        "supervisor could not produce a valid substitute in {MAX_REPAIR_ROUNDS} rounds; last problem: {}",
                        redactor.text(&msg)
                    ),
                    DecidedBy::Kernel,
                );
                self.record(&f, &esc, &d, None, None);
                return (
                    Resolution::Fail {
                        summary: d.verdict.reason().map(str::to_string),
                    },
                    note,
                );
            }
            let resolution = resolution.unwrap_or(match d.verdict {
                Verdict::Retry => Resolution::Retry,
                Verdict::Skip { .. } => Resolution::Skip,
                Verdict::EndStream => Resolution::EndStream,
                Verdict::Fail { reason, .. } => Resolution::Fail { summary: reason },
                // Handled above: a substitute is either valid or rejected.
                Verdict::Substitute { .. } => Resolution::Fail { summary: None },
            });
            return (resolution, note);
        }
    }

    fn record(
        &self,
        f: &FailedInvocation<'_>,
        esc: &Escalation,
        d: &Decision,
        overruled: Option<heddle_core::supervise::Overruled>,
        rejected: Option<String>,
    ) {
        self.events.emit(EventKind::Decision {
            node_id: f.node_id.to_string(),
            verdict: serde_json::to_value(&d.verdict).unwrap_or_default(),
            decided_by: d.decided_by.as_str().to_string(),
            cost_usd: d.cost_usd,
        });
        self.interventions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Intervention {
                escalation: esc.clone(),
                verdict: d.verdict.clone(),
                decided_by: d.decided_by,
                cost_usd: d.cost_usd,
                overruled,
                rejected,
            });
    }
}

pub(crate) fn failure_kind(k: &ErrorKind) -> FailureKind {
    match k {
        ErrorKind::Node => FailureKind::Node,
        ErrorKind::FuelExhausted => FailureKind::FuelExhausted,
        ErrorKind::Deadline => FailureKind::Deadline,
        ErrorKind::MemoryLimit => FailureKind::MemoryLimit,
        ErrorKind::OutputTooLarge => FailureKind::OutputTooLarge,
        ErrorKind::Trap { trap } => FailureKind::Trap { trap: trap.clone() },
        ErrorKind::Input => FailureKind::Input,
        ErrorKind::Host => FailureKind::Host,
        // Never escalated (`escalates`): named for completeness.
        ErrorKind::Cancelled | ErrorKind::Suspend { .. } | ErrorKind::Assertion => {
            FailureKind::Host
        }
    }
}
