//! A person answers the gate a durable run is paused at (`heddle runs approve | reject`,
//! the server's gate routes). The answer is a record in the run's log (a verdict decided by `user`), so
//! every later resume knows it; approving runs on from the gate, rejecting cancels the
//! run with the gate's title and the note as its reason.

use std::collections::BTreeMap;
use std::sync::Arc;

use heddle_core::gate::{GATE_TYPE, GateAsk};
use heddle_core::{Decider, Occurrence, PauseReason, Record, RecordedAction, RecordedVerdict};
use heddle_store::session::{self, Resumption, Session};
use heddle_store::{RunStore, StoreError, Stored};

use crate::error::{Error, Refused, refused};

/// A gate approved now: recorded once the run is taken over, then run on from.
#[derive(Debug)]
pub struct Approval {
    gate: String,
    title: String,
    note: String,
    /// The gate's invocations waiting for the answer.
    occurrences: Vec<Occurrence>,
}

impl Approval {
    /// The gate's title, for saying it was approved once that is recorded (not before:
    /// a process killed after saying so would leave the run waiting at the gate).
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The gate's node id.
    pub fn gate(&self) -> &str {
        &self.gate
    }

    /// The reviewer's note (maybe empty).
    pub fn note(&self) -> &str {
        &self.note
    }
}

/// Checks that `run` waits at `gate` and builds its approval (nothing is written).
pub fn approval(
    store: &dyn RunStore,
    run: &str,
    gate: &str,
    note: Option<String>,
) -> Result<(Resumption, GateAsk, Approval), Error> {
    let (r, ask, occurrences) = waiting_gate(store, run, gate)?;
    let approval = Approval {
        gate: gate.to_string(),
        title: ask.title.clone(),
        note: note.unwrap_or_default(),
        occurrences,
    };
    Ok((r, ask, approval))
}

/// Records the rejection of `gate` and the run's cancelled ending, with `secrets` (the
/// known secret values) masked out of what is written, then sends the run's span (its
/// `heddle.gate.rejected` event) and counts its ending (`watch`); returns the reason as
/// recorded.
pub fn record_rejection(
    store: Arc<dyn RunStore>,
    run: &str,
    gate: &str,
    note: &str,
    secrets: &[String],
    watch: &crate::telemetry::Watch,
) -> Result<String, Error> {
    let (_, ask, occurrences) = waiting_gate(&*store, run, gate)?;
    let decisions = occurrences
        .into_iter()
        .map(|occurrence| Record::Verdict {
            occurrence,
            verdict: RecordedVerdict::new(RecordedAction::Reject).with_note(Some(note.into())),
            decided_by: Decider::User,
        })
        .collect();
    let reason = format!("gate \"{}\" rejected: {note}", ask.title);
    session::end_cancelled(store.clone(), run, decisions, reason.clone(), secrets)?;
    watch.ended(&*store, run, secrets);
    // As recorded: the note masked.
    Ok(match heddle_store::secrets::redactor(secrets) {
        Some(r) => r.mask(&reason),
        None => reason,
    })
}

/// The gates the log approved (gate id → note), with `now` added.
pub fn approved(records: &[Stored], now: Option<&Approval>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for s in records {
        if let Record::Verdict {
            occurrence,
            verdict,
            decided_by: Decider::User,
        } = &s.record
            && verdict.action == RecordedAction::Approve
        {
            let note = verdict.note.clone().unwrap_or_default();
            out.insert(occurrence.node.clone(), note);
        }
    }
    if let Some(a) = now {
        out.insert(a.gate.clone(), a.note.clone());
    }
    out
}

/// Records `a` in the log of the run just taken over, on disk before anything runs.
pub fn record(session: &Session, a: &Approval) -> Result<(), StoreError> {
    for occ in &a.occurrences {
        session.log.append(Record::Verdict {
            occurrence: occ.clone(),
            verdict: RecordedVerdict::new(RecordedAction::Approve).with_note(Some(a.note.clone())),
            decided_by: Decider::User,
        });
    }
    session.log.flush().wait()?;
    Ok(())
}

/// Refuses a plain resume of a run waiting at a gate: it would only pause there again.
/// A gate is answered (approve or reject), which is what the refusal says to do.
pub fn refuse_resume_at_gate(r: &Resumption) -> Result<(), Refused> {
    let Some(PauseReason::Suspend { node, .. }) = r.pause.as_ref().map(|p| &p.reason) else {
        return Ok(());
    };
    // The plan as recorded names every node, inside graph nodes too, by path.
    if !r
        .header
        .run
        .plan
        .nodes
        .iter()
        .any(|n| &n.id == node && n.node_type == GATE_TYPE)
    {
        return Ok(());
    }
    let run = &r.header.run_id;
    Err(refused!(
        "run {run} waits at gate `{node}`, which is answered, not resumed: heddle runs approve {run} {node} [--note TEXT], or heddle runs reject {run} {node} --note TEXT"
    ))
}

/// The run, the ask and the waiting invocations of `gate`, or why the run is not
/// waiting at it (a usage error: nothing is written).
fn waiting_gate(
    store: &dyn RunStore,
    run: &str,
    gate: &str,
) -> Result<(Resumption, GateAsk, Vec<Occurrence>), Error> {
    let r = session::check_resume(store, run, None)?;
    // Inside graph nodes too: a gate there is named by its path.
    let doc = super::stored_flat(&r.header)?;
    let gates: Vec<&str> = doc
        .nodes
        .iter()
        .filter(|n| n.node_type == GATE_TYPE)
        .map(|n| n.id.as_str())
        .collect();
    let Some(node) = doc
        .nodes
        .iter()
        .find(|n| n.id == gate && n.node_type == GATE_TYPE)
    else {
        let known = if gates.is_empty() {
            "it has none".to_string()
        } else {
            format!("its gates: {}", gates.join(", "))
        };
        return Err(refused!("run {run}: no gate `{gate}` in its graph ({known})").into());
    };
    let waiting = match r.pause.as_ref().map(|p| &p.reason) {
        Some(PauseReason::Suspend { node, .. }) if node == gate => true,
        Some(PauseReason::Suspend { node, .. }) if gates.contains(&node.as_str()) => {
            return Err(refused!("run {run} waits at gate `{node}`, not at `{gate}`").into());
        }
        _ => false,
    };
    if !waiting {
        return Err(refused!(
            "run {run} is not waiting at gate `{gate}` (state {}); `heddle runs show {run}` says what it waits for",
            r.view.state.as_str()
        ).into());
    }
    let text_prop = |k: &str| {
        node.properties
            .get(k)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let ask = GateAsk {
        title: text_prop("title").unwrap_or_else(|| gate.to_string()),
        prompt: text_prop("prompt"),
    };
    let occurrences = r
        .view
        .occurrences
        .iter()
        .filter(|(o, v)| o.node == gate && v.result.is_none())
        .map(|(o, _)| o.clone())
        .collect();
    Ok((r, ask, occurrences))
}
