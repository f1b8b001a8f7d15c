//! Who decides a failed node invocation in a run driven by this process: rules from a
//! policy document, the decisions of a recorded run replayed, or the LLM agent, each
//! wrapped in the bounds the kernel enforces (decisions per run, retries per node).
//!
//! Here so that every front end builds a supervisor the same way from the same
//! configuration: the LLM agent's endpoint, key, prices and ceiling resolve from the
//! caller's choice, then the environment, then `[supervisor]` of heddle.toml, and a
//! configuration that cannot hold the agent to its ceiling (a model without a price)
//! refuses the run before anything starts.

use std::path::PathBuf;
use std::sync::Arc;

use heddle_kernel::supervisor::{Bounded, Bounds, Policy, Replay, Supervisor};
use heddle_supervisor::{LlmConfig, LlmSupervisor, SupervisorSection};

use crate::Config;
use crate::error::{ConfigError, Error};

/// The decider a run's failures go to.
#[derive(Clone, Debug, PartialEq)]
pub enum Decider {
    /// The rules of a policy file (TOML: node type, failure signature, message pattern
    /// to verdict).
    PolicyFile(PathBuf),
    /// The rules of a policy document given as text; `origin` names it in errors.
    Policy {
        /// The document (TOML).
        text: String,
        /// Where it came from, for messages (`the request's policy`).
        origin: String,
    },
    /// The decisions a recorded run made, replayed from its `--json` report.
    Replay(PathBuf),
    /// The LLM agent over an OpenAI-compatible chat-completions endpoint.
    Llm {
        /// The model, over `HEDDLE_SUPERVISOR_MODEL` and `[supervisor] model`.
        model: Option<String>,
        /// The run's spending ceiling in USD, over the environment and the config.
        cost_cap_usd: Option<f64>,
    },
}

/// The bounds a decider is held to; `None` keeps the kernel's default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeciderBounds {
    /// Decisions the decider may make in one run.
    pub max_decisions: Option<u32>,
    /// Retries it may grant per node and invocation.
    pub max_retries_per_node: Option<u32>,
}

/// The supervisor handle for `decider`, wrapped in `bounds`.
pub fn supervisor(
    config: &Config,
    decider: &Decider,
    bounds: DeciderBounds,
) -> Result<Arc<dyn Supervisor>, Error> {
    let inner: Arc<dyn Supervisor> = match decider {
        Decider::PolicyFile(path) => Arc::new(Policy::load(path)?),
        Decider::Policy { text, origin } => Arc::new(Policy::parse(text, origin)?),
        Decider::Replay(path) => Arc::new(Replay::load(path)?),
        Decider::Llm {
            model,
            cost_cap_usd,
        } => Arc::new(llm(config, model.as_deref(), *cost_cap_usd)?),
    };
    let defaults = Bounds::default();
    let bounds = Bounds {
        max_decisions: bounds.max_decisions.unwrap_or(defaults.max_decisions),
        max_retries_per_node: bounds
            .max_retries_per_node
            .unwrap_or(defaults.max_retries_per_node),
        ..defaults
    };
    Ok(Arc::new(Bounded::new(inner, bounds)))
}

/// The LLM agent: every configuration problem (no endpoint, a model without a price, a
/// ceiling that is not a non-negative amount) refuses the run before it starts.
fn llm(
    config: &Config,
    model: Option<&str>,
    cost_cap_usd: Option<f64>,
) -> Result<LlmSupervisor, Error> {
    let file: Option<SupervisorSection> = config.section("supervisor")?;
    let mut cfg = LlmConfig::from_env(model, file.as_ref())
        .map_err(|e| ConfigError::new(format!("the LLM supervisor: {e}")))?;
    if let Some(cap) = cost_cap_usd {
        if !(cap.is_finite() && cap >= 0.0) {
            return Err(ConfigError::new(format!(
                "the LLM supervisor's cost cap `{cap}` is not a non-negative number of USD"
            ))
            .into());
        }
        cfg.cost_cap_usd = cap;
    }
    LlmSupervisor::new(cfg).map_err(|e| ConfigError::new(format!("the LLM supervisor: {e}")).into())
}
