//! The bounded handle: one decision at a time, sticky skip/fail by (node, signature),
//! caps on decisions and retries, and a per-decision timeout that cancels the inner
//! handle's work. Degradation is deterministic: at any bound the answer is `fail`
//! decided by `bounds`, never a cheaper guess.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use heddle_core::supervise::{DecidedBy, Decision, Escalation, Verdict, VerdictAction};

use super::{DecideCtx, Supervisor, SupervisorError};
use crate::executor::BoxFuture;

/// What a [`Bounded`] supervisor holds its inner handle to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Decisions the inner handle may make in one run (sticky answers are free).
    pub max_decisions: u32,
    /// Retries granted per (node, invocation key).
    pub max_retries_per_node: u32,
    /// Wall-clock limit on one decision, after which the inner handle is cancelled.
    pub decision_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_decisions: 10,
            max_retries_per_node: 2,
            decision_timeout: Duration::from_secs(60),
        }
    }
}

/// A supervisor handle in front of another: decisions serialized (in the order the
/// failures came), a verdict sticky per node and failure signature, and the number of
/// decisions, retries and each decision's time bounded.
pub struct Bounded {
    inner: Arc<dyn Supervisor>,
    bounds: Bounds,
    /// FIFO (tokio's mutex is fair): consecutive failures are usually related, so the
    /// inner handle sees them in order and a sticky verdict drains the rest for free.
    queue: tokio::sync::Mutex<()>,
    state: Mutex<BoundedState>,
}

#[derive(Default)]
struct BoundedState {
    decisions: u32,
    retries: HashMap<(String, String), u32>,
    sticky: HashMap<(String, String), Verdict>,
}

impl Bounded {
    /// `inner` held to `bounds`.
    pub fn new(inner: Arc<dyn Supervisor>, bounds: Bounds) -> Self {
        Bounded {
            inner,
            bounds,
            queue: tokio::sync::Mutex::new(()),
            state: Mutex::new(BoundedState::default()),
        }
    }

    /// The bounds it holds.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Decisions the inner handle has made so far.
    pub fn decisions(&self) -> u32 {
        self.lock().decisions
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoundedState> {
        // A poisoned lock only means a panic elsewhere mid-update; the counters stay usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn decide_serialized(
        &self,
        e: &Escalation,
        ctx: &DecideCtx,
    ) -> Result<Decision, SupervisorError> {
        if let Some(sig) = &e.failure_signature {
            let key = (e.node_id.clone(), sig.clone());
            if let Some(v) = self.lock().sticky.get(&key)
                && e.allowed_actions.contains(v.action())
            {
                return Ok(Decision::new(v.clone(), DecidedBy::Sticky));
            }
        }
        {
            let mut st = self.lock();
            if st.decisions >= self.bounds.max_decisions {
                return Ok(Decision::fail(
                    format!(
                        "supervisor decision limit reached ({} decisions)",
                        self.bounds.max_decisions
                    ),
                    DecidedBy::Bounds,
                ));
            }
            st.decisions += 1;
        }

        let child = ctx.cancel.child_token();
        let inner_ctx = DecideCtx {
            cancel: child.clone(),
            ..ctx.clone()
        };
        let decided = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => Err(SupervisorError::Cancelled),
            r = tokio::time::timeout(self.bounds.decision_timeout, self.inner.decide(e, &inner_ctx)) => {
                r.unwrap_or(Err(SupervisorError::Timeout(self.bounds.decision_timeout)))
            }
        };
        // Whatever happened, the inner handle's work for this decision is over: cancel
        // it so a timed-out model request stops consuming tokens.
        child.cancel();
        let d = match decided {
            Ok(d) => d,
            Err(err) => return Ok(Decision::fail(err.to_string(), DecidedBy::Bounds)),
        };

        let mut st = self.lock();
        if d.verdict.action() == VerdictAction::Retry
            && e.allowed_actions.contains(VerdictAction::Retry)
        {
            let n = st
                .retries
                .entry((e.node_id.clone(), e.invocation_key.clone()))
                .or_insert(0);
            if *n >= self.bounds.max_retries_per_node {
                return Ok(Decision::fail(
                    format!(
                        "supervisor retry limit reached for node {} ({} retries)",
                        e.node_id, self.bounds.max_retries_per_node
                    ),
                    DecidedBy::Bounds,
                )
                .with_cost(d.cost_usd));
            }
            *n += 1;
        }
        if d.verdict.is_sticky()
            && let Some(sig) = &e.failure_signature
        {
            st.sticky
                .insert((e.node_id.clone(), sig.clone()), d.verdict.clone());
        }
        Ok(d)
    }
}

impl Supervisor for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn is_bounded(&self) -> bool {
        true
    }

    fn secrets(&self) -> Vec<String> {
        self.inner.secrets()
    }

    fn wants_run_state(&self) -> bool {
        self.inner.wants_run_state()
    }

    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(async move {
            // Waiting in the queue is also interrupted by cancel, so cancel stays instant
            // even with a backlog of escalations.
            let _turn = tokio::select! {
                biased;
                _ = ctx.cancel.cancelled() => {
                    return Ok(Decision::fail(SupervisorError::Cancelled.to_string(), DecidedBy::Bounds));
                }
                g = self.queue.lock() => g,
            };
            if ctx.cancel.is_cancelled() {
                return Ok(Decision::fail(
                    SupervisorError::Cancelled.to_string(),
                    DecidedBy::Bounds,
                ));
            }
            self.decide_serialized(e, ctx).await
        })
    }

    fn close(&self) {
        self.inner.close();
    }
}
