//! The replay handle: answers escalations from a recorded run's interventions, matched
//! on (node, invocation key, attempt). A miss is `fail`: replay never improvises. It
//! consumes the intervention record the run result already carries, so a run report
//! is all it needs.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;

use heddle_core::supervise::{DecidedBy, Decision, Escalation, Intervention, Verdict};

use super::{DecideCtx, Supervisor, SupervisorError};
use crate::executor::BoxFuture;

/// Why a recorded run cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read.
    #[error("{origin}: cannot read recorded run: {source}")]
    Read {
        /// The file.
        origin: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is not JSON.
    #[error("{origin}: not JSON: {source}")]
    Json {
        /// The file.
        origin: String,
        /// Where the JSON breaks.
        source: serde_json::Error,
    },
    /// It is JSON, but not a run report nor a list of interventions.
    #[error("{origin}: expected a run report with `interventions`, or a list of interventions")]
    Shape {
        /// The file.
        origin: String,
    },
    /// One intervention is malformed.
    #[error("{origin}: intervention {index}: {source}")]
    Intervention {
        /// The file.
        origin: String,
        /// Which, from 0.
        index: usize,
        /// What is wrong with it.
        source: serde_json::Error,
    },
}

type Key = (String, String, u32);

/// A supervisor handle that decides every escalation as a recorded run's decision for
/// the same node, invocation key and attempt was decided (`heddle run --replay`).
pub struct Replay {
    /// Several decisions share a key when substitutes were bounced (repair rounds);
    /// they are replayed in recorded order.
    decisions: Mutex<HashMap<Key, VecDeque<Verdict>>>,
    total: usize,
}

impl Replay {
    /// The decisions of `list` (a run report's `interventions`).
    pub fn from_interventions(list: impl IntoIterator<Item = Intervention>) -> Self {
        let mut decisions: HashMap<Key, VecDeque<Verdict>> = HashMap::new();
        let mut total = 0;
        for i in list {
            let e = &i.escalation;
            decisions
                .entry((e.node_id.clone(), e.invocation_key.clone(), e.attempt))
                .or_default()
                .push_back(i.verdict);
            total += 1;
        }
        Replay {
            decisions: Mutex::new(decisions),
            total,
        }
    }

    /// Accepts a run report (`{"interventions": [...], ...}`, as `heddle run --json`
    /// writes it) or a bare list of interventions.
    pub fn from_json(v: &serde_json::Value, origin: &str) -> Result<Self, ReplayError> {
        let list = match v {
            serde_json::Value::Array(a) => a.as_slice(),
            serde_json::Value::Object(o) => match o.get("interventions") {
                Some(serde_json::Value::Array(a)) => a.as_slice(),
                // A report of a run without interventions omits the field.
                None if o.contains_key("status") => &[],
                _ => {
                    return Err(ReplayError::Shape {
                        origin: origin.into(),
                    });
                }
            },
            _ => {
                return Err(ReplayError::Shape {
                    origin: origin.into(),
                });
            }
        };
        let parsed = list
            .iter()
            .enumerate()
            .map(|(index, x)| {
                Intervention::from_json(x).map_err(|source| ReplayError::Intervention {
                    origin: origin.into(),
                    index,
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Replay::from_interventions(parsed))
    }

    /// The decisions of the run report (or list of interventions) in the file `path`.
    pub fn load(path: &Path) -> Result<Self, ReplayError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Read {
            origin: origin.clone(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ReplayError::Json {
                origin: origin.clone(),
                source,
            })?;
        Replay::from_json(&v, &origin)
    }

    /// Recorded decisions loaded.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether it has no decision to replay.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl Supervisor for Replay {
    fn name(&self) -> &str {
        "replay"
    }

    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(async move {
            let key = (e.node_id.clone(), e.invocation_key.clone(), e.attempt);
            let found = self
                .decisions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(&key)
                .and_then(VecDeque::pop_front);
            Ok(match found {
                Some(v) => Decision::new(v, DecidedBy::Replay),
                None => Decision::fail(
                    format!(
                        "replay: the recorded run has no decision for node {} key {:?} attempt {}",
                        e.node_id, e.invocation_key, e.attempt
                    ),
                    DecidedBy::Replay,
                ),
            })
        })
    }
}
