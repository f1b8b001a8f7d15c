//! The supervisor hook: what happens when a node invocation fails.
//!
//! Without a supervisor nothing here runs and no escalation is ever built. With one, the
//! actor's single failure path hands the failed invocation to an [`Escalator`], which
//! computes the allowed verdicts, builds the redacted escalation, asks the handle,
//! enforces the allowed set (whatever the handle returned), validates substitutes and
//! records every intervention as events and as data for the run result.
//!
//! Handles compose: [`FailClosed`] (the default), [`Bounded`] (serialized, sticky,
//! bounded, timed out; the kernel always wraps a handle in it), [`Policy`] (a TOML rules
//! file), [`Replay`] (a recorded run's decisions) and, outside the kernel, the LLM agent
//! crate `heddle-supervisor`.

mod allowed;
mod bounded;
mod escalator;
mod policy;
mod replay;
mod state;

use std::sync::Arc;

use heddle_core::supervise::{Decision, Escalation};
use tokio_util::sync::CancellationToken;

use crate::executor::{BoxFuture, SecretRegistry};

pub use allowed::{InvocationFacts, allowed_actions, declared_outputs, enforce};
pub use bounded::{Bounded, Bounds};
pub(crate) use escalator::failure_kind;
pub use escalator::{Escalator, FailedInvocation, MAX_REPAIR_ROUNDS, Resolution, escalates};
pub use heddle_core::supervise::{
    AllowedSet, ApplyTo, DecidedBy, Intervention, LineageStep, Verdict, VerdictAction,
};
pub use policy::{Policy, PolicyError, PolicyLoadError};
pub use replay::{Replay, ReplayError};
pub use state::{ReadOutputError, RunLedger, RunLedgerReader};

/// Why a handle could not decide. The kernel turns every one of these into `fail`
/// (decided by `bounds`): a supervisor failing never lets a failure through.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SupervisorError {
    /// The run was cancelled before the handle answered.
    #[error("the run was cancelled while the decision was pending")]
    Cancelled,
    /// The handle took longer than the supervisor's decision timeout.
    #[error("the decision took longer than {0:?}")]
    Timeout(std::time::Duration),
    /// Text, not a source error, on purpose: a transport error can carry the provider's
    /// URL or reply, which may hold a credential, so the handle passes it through the
    /// run's redactor and keeps only the masked words (this type is also `Clone`, for
    /// the escalation record).
    #[error("supervisor provider error: {0}")]
    Provider(String),
    /// The handle's answer could not be read as a verdict (an LLM's reply off schema).
    #[error("supervisor reply was malformed: {0}")]
    Malformed(String),
    /// Deciding ran out of what it may spend: the run's money budget refused the next
    /// model call, or no verdict came within the allowed turns.
    #[error("supervisor budget: {0}")]
    Budget(String),
    /// Anything else a handle reports, as text for the same reason as `Provider`.
    #[error("{0}")]
    Other(String),
}

/// What a handle gets besides the escalation.
#[derive(Clone)]
pub struct DecideCtx {
    /// Cancelled when the run is cancelled or the decision times out; a handle must stop
    /// its work (an in-flight model request above all) when it fires.
    pub cancel: CancellationToken,
    /// Read-only view of the run for tools (`get_run_state`, `read_node_output`).
    pub state: Option<Arc<dyn RunLedgerReader>>,
    /// The run's registry of secret values: a handle masks tool results against it and
    /// registers its own credentials in it.
    pub secrets: Arc<SecretRegistry>,
}

impl DecideCtx {
    /// A context for driving a handle outside a run (tests, tools).
    pub fn detached() -> Self {
        DecideCtx {
            cancel: CancellationToken::new(),
            state: None,
            secrets: Arc::new(SecretRegistry::default()),
        }
    }
}

/// Something that decides escalations. Object-safe so the run holds an
/// `Arc<dyn Supervisor>`; decisions are serialized by the [`Bounded`] wrapper, so an
/// implementation need not be re-entrant-friendly beyond `Send + Sync`.
pub trait Supervisor: Send + Sync + 'static {
    /// Short name for logs and reports (`fail-closed`, `policy`, `replay`, `llm`).
    fn name(&self) -> &str;

    /// Decides one escalation. Whatever it answers, the kernel checks it against the
    /// escalation's allowed set and overrules what falls outside; an error becomes
    /// `fail`, so a supervisor can never let a failure through by failing itself.
    fn decide<'a>(
        &'a self,
        escalation: &'a Escalation,
        ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>>;

    /// Whether the handle reads run state (the agent's `read_node_output` tool). Only
    /// then does the runtime keep outputs per lineage, so a policy- or replay-supervised
    /// run that never fails costs what an unsupervised one does.
    fn wants_run_state(&self) -> bool {
        false
    }

    /// Secret values the handle itself holds (an API key). The kernel registers them
    /// before the run starts, so they are masked in every escalation, error and report
    /// from the first failure on, including the escalation sent to this very handle.
    fn secrets(&self) -> Vec<String> {
        Vec::new()
    }

    /// True for [`Bounded`], so the kernel does not wrap a handle twice.
    fn is_bounded(&self) -> bool {
        false
    }

    /// Called once when the run ends.
    fn close(&self) {}
}

impl std::fmt::Debug for dyn Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Supervisor({})", self.name())
    }
}

/// The default: every failure fails, exactly as an unsupervised run.
#[derive(Debug, Default, Clone, Copy)]
pub struct FailClosed;

impl Supervisor for FailClosed {
    fn name(&self) -> &str {
        "fail-closed"
    }

    fn decide<'a>(
        &'a self,
        _escalation: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(async {
            Ok(Decision::new(
                Verdict::Fail {
                    reason: None,
                    apply_to: ApplyTo::Invocation,
                },
                DecidedBy::Default,
            ))
        })
    }
}

/// Wraps a handle in [`Bounded`] with default bounds unless it already is bounded. The
/// kernel calls this for every supervisor it is given: without bounds a policy that says
/// `retry` to a node that always fails would loop forever.
pub fn ensure_bounded(sup: Arc<dyn Supervisor>) -> Arc<dyn Supervisor> {
    if sup.is_bounded() {
        sup
    } else {
        Arc::new(Bounded::new(sup, Bounds::default()))
    }
}

#[cfg(test)]
mod tests;
