//! A run's limits as recorded when it is created: every process that continues the run
//! (a resume, a recovery, a watchdog's worker, a server adopting it) reads them from
//! here, never from its own command line.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Budget;

/// A run's recorded limits. Stored as one JSON object with the keys
/// `max_dispatches`, `time_limit_ms` (the budget, each only when set),
/// `node_timeout_ms` (always, `null` for none), then `supervise` (a run created through
/// `heddle serve`) or `watchdog` (a supervised run), and `trace` (a run queued traced):
/// the text earlier runs wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunLimits {
    #[serde(flatten)]
    pub budget: Budget,
    /// The run's node time limit (`--node-timeout-ms`) for nodes that set none.
    #[serde(default)]
    pub node_timeout_ms: Option<u64>,
    /// The supervisor handle the run's failures go to: data of the run, so whoever
    /// adopts or resumes it supervises it the same way. Absent: recorded from the
    /// command line, whose `--policy`/`--supervise` are not kept (none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervise: Option<SuperviseMode>,
    /// The watchdog's own limits of a supervised run (`heddle run --watchdog`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<WatchdogLimits>,
    /// The trace a run was created under when it is recorded before any process takes
    /// it (queued on a shared store): the host that claims it continues its creator's
    /// trace (a caller's `traceparent`) instead of starting one. A run taken at once
    /// records its trace with its first `opened` record instead
    /// ([`crate::session::recorded_trace`] reads both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<heddle_core::trace::RunTrace>,
}

impl RunLimits {
    pub fn node_timeout(&self) -> Option<Duration> {
        self.node_timeout_ms.map(Duration::from_millis)
    }
}

/// How a run recorded by `heddle serve` has its failures decided.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuperviseMode {
    /// No supervisor: a failure fails its node.
    #[default]
    None,
    /// A person answers each failure through the server's API or viewer; a command-line
    /// process, with nobody to ask, refuses to run such a run.
    Interactive,
    /// The rules of a policy document, recorded whole: whoever adopts or resumes the
    /// run decides by the same rules, whatever files its machine has.
    Policy {
        /// The document (TOML), as it was given.
        document: String,
    },
    /// The LLM agent. The model and endpoint asked for are recorded (`None`: the
    /// configured one of whoever drives the run); the API key never is: each process
    /// reads its own.
    Llm {
        /// The model asked for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// The endpoint asked for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
    },
}

/// A watchdog's limits (restarts, backoff, its own clock's time limit) as it recorded
/// them. The watchdog owns their shape: the store keeps them for it and reads nothing
/// in them, so they are encoded and decoded by the watchdog's own type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WatchdogLimits(serde_json::Value);

impl WatchdogLimits {
    /// `limits` as they are recorded.
    pub fn new<T: Serialize>(limits: &T) -> Result<WatchdogLimits, serde_json::Error> {
        serde_json::to_value(limits).map(WatchdogLimits)
    }

    /// The recorded limits as the watchdog's type.
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.0)
    }
}
