//! The interactive supervisor: a person decides. Each escalation the kernel hands this
//! handle waits at a [`Desk`] (what a server lists as pending) until someone answers it
//! with a verdict, the decision timeout passes, or the run is cancelled; the last two
//! fail closed.
//!
//! The desk checks an answer against the escalation's allowed set before anything is
//! decided, so a verdict the kernel would overrule is refused to the person instead
//! (and the escalation stays pending). The kernel still enforces the allowed set on
//! whatever arrives. The escalation on the desk is the kernel's redacted record: a
//! secret never reaches this module unmasked.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use heddle_core::Value;
use heddle_core::supervise::{
    DecidedBy, Decision, Escalation, FailureKind, UnknownVerdict, VerdictAction,
};
use heddle_kernel::executor::BoxFuture;
use heddle_kernel::supervisor::{
    ApplyTo, Bounded, Bounds, DecideCtx, Supervisor, SupervisorError, Verdict,
};
use tokio::sync::{broadcast, oneshot};

/// How long a person has to answer one escalation by default: long enough to notice it
/// on a page and read it, short enough that a forgotten run does not hold a worker
/// for hours.
pub const DEFAULT_DECISION_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Closed escalations remembered so a late answer is told what happened to it.
const REMEMBERED: usize = 256;

/// What became of an escalation that is no longer pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Closed {
    /// A person's verdict was handed to the kernel.
    Answered,
    /// The run was cancelled (or its server stopped) while the decision was pending.
    Withdrawn,
    /// Nobody answered within the decision timeout: the invocation failed.
    TimedOut,
}

impl Closed {
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Answered => "answered",
            Closed::Withdrawn => "withdrawn",
            Closed::TimedOut => "timed_out",
        }
    }
}

/// A change on a desk, for a page that refetches the pending list when one arrives.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Notice {
    pub id: String,
    pub node: String,
    /// `pending`, or how it closed (`answered`, `withdrawn`, `timed_out`).
    pub state: &'static str,
    /// The verdict applied, when answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictAction>,
}

/// One escalation waiting for a person.
#[derive(Clone, Debug)]
pub struct Pending {
    pub id: String,
    /// The kernel's record: already redacted.
    pub escalation: Escalation,
    pub created_at_ms: u64,
    /// When the decision times out and the invocation fails.
    pub deadline_ms: u64,
}

impl Pending {
    /// The notice that announced it: a subscriber that arrives later gets it too.
    pub fn notice(&self) -> Notice {
        Notice {
            id: self.id.clone(),
            node: self.escalation.node_id.clone(),
            state: "pending",
            verdict: None,
        }
    }

    /// The public shape (the server's `GET …/escalations` lists these).
    pub fn to_json(&self) -> serde_json::Value {
        let e = &self.escalation;
        let map = |m: &BTreeMap<String, Value>| -> serde_json::Value {
            m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()
        };
        let kind = match &e.failure {
            FailureKind::Trap { trap } => format!("trap: {trap}"),
            other => serde_json::to_value(other)
                .ok()
                .and_then(|v| v["kind"].as_str().map(str::to_string))
                .unwrap_or_default(),
        };
        serde_json::json!({
            "id": self.id,
            "node": e.node_id,
            "node_type": e.node_type,
            "invocation_key": e.invocation_key,
            "attempt": e.attempt,
            "repair_round": e.repair_round,
            "repair_error": e.repair_error,
            "error": {
                "kind": kind,
                "message": e.detail,
                "signature": e.failure_signature,
            },
            "allowed": e.allowed_actions.to_vec(),
            "inputs": map(&e.inputs),
            "candidate_output": e.candidate_output.as_ref().map(map),
            "declared_outputs": e.declared_outputs,
            "retry_safe": e.retry_safe,
            "created_at_ms": self.created_at_ms,
            "deadline_ms": self.deadline_ms,
        })
    }
}

/// A person's answer, as a request carries it.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub verdict: String,
    /// Substitute only: the node's outputs, by handle.
    pub outputs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Why; recorded with the verdict in the run's log, and a `fail` verdict's note
    /// becomes the run's error summary.
    pub note: Option<String>,
}

/// Why an answer was refused. Nothing was decided; a pending escalation stays pending.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("no escalation {0} on this run")]
    Unknown(String),
    #[error("escalation {id} is no longer pending: {}", how.as_str())]
    Closed { id: String, how: Closed },
    #[error(
        "verdict `{verdict}` is not allowed for escalation {id} (allowed: {})",
        allowed.iter().map(|a| a.as_str()).collect::<Vec<_>>().join(", ")
    )]
    NotAllowed {
        id: String,
        verdict: VerdictAction,
        allowed: Vec<VerdictAction>,
    },
    #[error("{0}")]
    Malformed(String),
}

struct Open {
    pending: Pending,
    reply: oneshot::Sender<Decision>,
}

#[derive(Default)]
struct State {
    open: HashMap<String, Open>,
    closed: VecDeque<(String, Closed)>,
    /// Set by [`Desk::withdraw_all`]: the run is going away, nothing new is taken.
    withdrawn: bool,
}

/// The escalations of one run waiting for a person, shared by the run's handle (which
/// puts them there) and whoever answers (a server's API).
pub struct Desk {
    state: Mutex<State>,
    notices: broadcast::Sender<Notice>,
    timeout: Duration,
}

impl Desk {
    pub fn new(timeout: Duration) -> Arc<Desk> {
        Arc::new(Desk {
            state: Mutex::new(State::default()),
            notices: broadcast::channel(64).0,
            timeout,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned map is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The escalations waiting now, oldest first.
    pub fn pending(&self) -> Vec<Pending> {
        let mut v: Vec<Pending> = self
            .lock()
            .open
            .values()
            .map(|o| o.pending.clone())
            .collect();
        v.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// Changes from now on (pending, answered, withdrawn, timed out).
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// Answers escalation `id`: checked against its allowed set (and a substitute
    /// against the node's declared outputs) before the kernel gets it. Returns the
    /// verdict handed over.
    pub fn answer(&self, id: &str, answer: Answer) -> Result<Verdict, AnswerError> {
        let mut st = self.lock();
        let Some(open) = st.open.get(id) else {
            return Err(match st.closed.iter().find(|(c, _)| c == id) {
                Some((_, how)) => AnswerError::Closed {
                    id: id.to_string(),
                    how: *how,
                },
                None => AnswerError::Unknown(id.to_string()),
            });
        };
        let note = answer.note.clone();
        let verdict = verdict_of(id, &open.pending.escalation, answer)?;
        let open = st
            .open
            .remove(id)
            .expect("looked up above under the same lock");
        remember(&mut st, id, Closed::Answered);
        drop(st);
        let action = verdict.action();
        if open
            .reply
            .send(Decision::new(verdict.clone(), DecidedBy::Agent).with_note(note))
            .is_err()
        {
            // The handle stopped waiting in between (its timeout fired as the answer
            // came): the kernel never saw this verdict.
            return Err(AnswerError::Closed {
                id: id.to_string(),
                how: Closed::TimedOut,
            });
        }
        self.notify(&open.pending, Closed::Answered.as_str(), Some(action));
        Ok(verdict)
    }

    /// Withdraws every pending escalation and refuses new ones: the run is being
    /// cancelled. Each waiting decision fails closed at once.
    pub fn withdraw_all(&self) {
        let drained: Vec<Open> = {
            let mut st = self.lock();
            st.withdrawn = true;
            let ids: Vec<String> = st.open.keys().cloned().collect();
            let mut out = Vec::new();
            for id in ids {
                if let Some(o) = st.open.remove(&id) {
                    remember(&mut st, &id, Closed::Withdrawn);
                    out.push(o);
                }
            }
            out
        };
        for o in drained {
            self.notify(&o.pending, Closed::Withdrawn.as_str(), None);
            // Dropping `o.reply` wakes the handle with no decision.
        }
    }

    fn open(&self, escalation: &Escalation) -> Option<(String, oneshot::Receiver<Decision>)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = now_ms();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Unique across server restarts too (the start time), so an answer meant for
        // an escalation before a restart never lands on the one asked again after it.
        let id = format!("{}-{n}", process_stamp());
        let (tx, rx) = oneshot::channel();
        let pending = Pending {
            id: id.clone(),
            escalation: escalation.clone(),
            created_at_ms: now,
            deadline_ms: now.saturating_add(self.timeout.as_millis() as u64),
        };
        let mut st = self.lock();
        if st.withdrawn {
            return None;
        }
        st.open.insert(
            id.clone(),
            Open {
                pending: pending.clone(),
                reply: tx,
            },
        );
        drop(st);
        self.notify(&pending, "pending", None);
        Some((id, rx))
    }

    /// Closes `id` if it is still open (the handle stopped waiting).
    fn close(&self, id: &str, how: Closed) {
        let mut st = self.lock();
        if let Some(o) = st.open.remove(id) {
            remember(&mut st, id, how);
            drop(st);
            self.notify(&o.pending, how.as_str(), None);
        }
    }

    fn notify(&self, p: &Pending, state: &'static str, verdict: Option<VerdictAction>) {
        // Nobody listening is fine: the list is there to be fetched.
        let _ = self.notices.send(Notice {
            state,
            verdict,
            ..p.notice()
        });
    }
}

fn remember(st: &mut State, id: &str, how: Closed) {
    if st.closed.len() >= REMEMBERED {
        st.closed.pop_front();
    }
    st.closed.push_back((id.to_string(), how));
}

/// The verdict an answer asks for, or why it cannot be given to this escalation.
fn verdict_of(id: &str, e: &Escalation, a: Answer) -> Result<Verdict, AnswerError> {
    let action: VerdictAction = a
        .verdict
        .parse()
        .map_err(|err: UnknownVerdict| AnswerError::Malformed(err.to_string()))?;
    if !e.allowed_actions.contains(action) {
        return Err(AnswerError::NotAllowed {
            id: id.to_string(),
            verdict: action,
            allowed: e.allowed_actions.to_vec(),
        });
    }
    if a.outputs.is_some() && action != VerdictAction::Substitute {
        return Err(AnswerError::Malformed(format!(
            "`outputs` goes with a substitute verdict, not `{action}`"
        )));
    }
    Ok(match action {
        VerdictAction::Retry => Verdict::Retry,
        VerdictAction::Skip => Verdict::Skip {
            apply_to: ApplyTo::Invocation,
        },
        VerdictAction::EndStream => Verdict::EndStream,
        VerdictAction::Fail => Verdict::Fail {
            reason: a.note.filter(|n| !n.trim().is_empty()),
            apply_to: ApplyTo::Invocation,
        },
        VerdictAction::Substitute => {
            let Some(outputs) = a.outputs else {
                return Err(AnswerError::Malformed(
                    "a substitute verdict needs `outputs`: the node's outputs by handle".into(),
                ));
            };
            let outputs: BTreeMap<String, Value> = outputs
                .into_iter()
                .map(|(k, v)| (k, Value::from_json(v)))
                .collect();
            // The kernel checks again; checking here refuses a wrong substitute to the
            // person instead of spending one of the escalation's repair rounds on it.
            let outputs = e
                .check_substitute(&outputs)
                .map_err(|m| AnswerError::Malformed(format!("substitute refused: {m}")))?;
            Verdict::Substitute { outputs }
        }
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// This process's start, in base 36: the prefix of its escalation ids.
fn process_stamp() -> &'static str {
    static STAMP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    STAMP.get_or_init(|| {
        let mut n = now_ms();
        let mut s = Vec::new();
        while n > 0 {
            s.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
            n /= 36;
        }
        s.reverse();
        String::from_utf8(s).unwrap_or_default()
    })
}

/// The handle: puts each escalation on its desk and waits for the answer.
pub struct Interactive {
    desk: Arc<Desk>,
}

impl Interactive {
    /// The handle for `desk`, wrapped in `bounds` with the desk's timeout as the
    /// decision timeout (so the deadline a person is shown is the one enforced).
    pub fn bounded(desk: Arc<Desk>, bounds: Bounds) -> Arc<dyn Supervisor> {
        let bounds = Bounds {
            decision_timeout: desk.timeout(),
            ..bounds
        };
        Arc::new(Bounded::new(Arc::new(Interactive { desk }), bounds))
    }
}

/// Closes the escalation when the handle stops waiting for any reason but an answer:
/// dropped by the bounded wrapper's timeout, or woken by a cancel.
struct Waiting<'a> {
    desk: &'a Desk,
    id: String,
    cancel: &'a tokio_util::sync::CancellationToken,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // The bounded wrapper cancels this handle's token only after a timeout has
        // already dropped the wait, so a cancelled token here means the run's cancel.
        let how = if self.cancel.is_cancelled() {
            Closed::Withdrawn
        } else {
            Closed::TimedOut
        };
        self.desk.close(&self.id, how);
    }
}

impl Supervisor for Interactive {
    fn name(&self) -> &str {
        "interactive"
    }

    fn decide<'a>(
        &'a self,
        escalation: &'a Escalation,
        ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(async move {
            let Some((id, reply)) = self.desk.open(escalation) else {
                return Err(SupervisorError::Cancelled);
            };
            let _waiting = Waiting {
                desk: &self.desk,
                id,
                cancel: &ctx.cancel,
            };
            tokio::select! {
                biased;
                _ = ctx.cancel.cancelled() => Err(SupervisorError::Cancelled),
                // A dropped sender is a withdrawal (the run is being cancelled).
                r = reply => r.map_err(|_| SupervisorError::Cancelled),
            }
        })
    }
}

#[cfg(test)]
mod tests;
