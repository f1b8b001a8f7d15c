//! A recorded run as people and programs read it: JSON for `runs list|show --json` and
//! the server's API, text for a terminal. Both are folded from the log alone
//! ([`RunView`]), so any process may read them while another drives the run.

use std::collections::BTreeMap;

use heddle_core::PlanSummary;
use heddle_store::status::{Outcome, RunView};
use heddle_store::{RunHeader, RunState, RunStore, RunSummary, StoreError};

/// Every run with its state, folded from its lifecycle records.
pub fn list_states(store: &dyn RunStore) -> Result<Vec<(RunSummary, RunState)>, StoreError> {
    let mut rows = Vec::new();
    for s in store.list()? {
        let state = heddle_store::status::state_of(store, &s.run_id)?;
        rows.push((s, state));
    }
    Ok(rows)
}

/// A run in a listing, as `runs list --json` and the server's API give it.
pub fn list_json(s: &RunSummary, state: RunState) -> serde_json::Value {
    serde_json::json!({
        "run_id": s.run_id, "created_ms": s.created_ms, "graph": s.graph_name,
        "state": state, "records": s.records,
    })
}

/// Provider usage per node as the log knows it, without the nodes that cannot spend (by
/// their origin in the run's plan: native built-ins and package nodes, see
/// [`heddle_core::Origin::may_spend`]), which have no usage to speak of unless they
/// reported a cost anyway.
pub fn usage(
    header: &RunHeader,
    view: &RunView,
) -> BTreeMap<String, heddle_store::status::NodeUsage> {
    let cannot = cannot_spend(header);
    view.usage()
        .into_iter()
        .filter(|(node, u)| u.receipts > 0 || !cannot.contains(node.as_str()))
        .collect()
}

/// The nodes of a run's plan that cannot spend (see [`usage`]).
pub fn cannot_spend(header: &RunHeader) -> std::collections::BTreeSet<&str> {
    header
        .run
        .plan
        .nodes
        .iter()
        .filter(|n| !n.origin.may_spend())
        .map(|n| n.id.as_str())
        .collect()
}

/// One run in full, as `runs show --json` and the server's API give it.
pub fn show_json(header: &RunHeader, view: &RunView) -> serde_json::Value {
    serde_json::json!({
        "run_id": header.run_id,
        "created_ms": header.created_ms,
        "graph": header.run.graph_name,
        "graph_sha256": header.graph_sha256,
        "inputs": header.run.inputs,
        "packages": header.run.packages,
        "limits": header.run.limits,
        "plan": plan_json(&header.run.plan),
        "state": view.state,
        "owner_pid": view.owner_pid,
        "owner_host": view.owner_host,
        "lease_left_ms": view.lease_left_ms,
        "epoch": view.epoch,
        "pause": view.pause,
        "error": view.error,
        "dispatches": view.dispatches,
        "execution_ms": view.execution_ms,
        "budget": header.run.limits.budget,
        "usage": usage(header, view),
        "records": view.records,
        "skipped": view.skipped,
        "occurrences": view.occurrences.iter().map(|(o, v)| {
            let mut e = serde_json::to_value(v).unwrap_or_default();
            e["occurrence"] = serde_json::to_value(o).unwrap_or_default();
            e
        }).collect::<Vec<_>>(),
    })
}

/// A run's plan as `runs show` gives it: the documents its graph nodes include by key
/// and digest, without their text (the run keeps that to resume from).
fn plan_json(plan: &PlanSummary) -> serde_json::Value {
    let mut v = serde_json::to_value(plan).unwrap_or_default();
    if let Some(docs) = v.get_mut("included").and_then(|d| d.as_array_mut()) {
        for d in docs.iter_mut().filter_map(|d| d.as_object_mut()) {
            d.remove("text");
        }
    }
    v
}

/// A run in a listing, as `runs list` prints it: one line, id first.
pub fn list_line(s: &RunSummary, state: RunState) -> String {
    format!(
        "{}  {:<11}  {:>6} records  {}",
        s.run_id,
        state.as_str(),
        s.records,
        s.graph_name
    )
}

/// One run in full, as `runs show` prints it: header, state, budget, provider usage, and
/// a line per occurrence saying what became of it.
pub fn show_text(header: &RunHeader, view: &RunView) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!("run       {}", header.run_id));
    line(format!(
        "graph     {} (sha256 {})",
        header.run.graph_name, header.graph_sha256
    ));
    for g in &header.run.plan.graphs {
        line(format!(
            "  graph node {}: {} (sha256 {})",
            g.id, g.graph, g.sha256
        ));
    }
    let owner = view
        .owner_pid
        .map(|p| format!(" (owner pid {p}, epoch {})", view.epoch))
        .unwrap_or_default();
    line(format!("state     {}{owner}", view.state.as_str()));
    if let Some(p) = &view.pause {
        let reason = serde_json::to_string(&p.reason).unwrap_or_default();
        line(format!("pause     event {}: {reason}", p.event));
    }
    if let Some(e) = &view.error {
        line(format!("error     {e}"));
    }
    let budget = header.run.limits.budget;
    let of = |limit: Option<u64>| limit.map(|l| format!(" of {l}")).unwrap_or_default();
    line(format!(
        "progress  {} dispatches{}, {} ms executed{}, {} records, opened {} times",
        view.dispatches,
        of(budget.max_dispatches),
        view.execution_ms,
        of(budget.time_limit_ms),
        view.records,
        view.opens
    ));
    for (node, u) in usage(header, view) {
        let state = serde_json::to_value(u.state).unwrap_or_default();
        line(format!(
            "usage     {node}: {} (${:.6} from {} of {} calls)",
            state.as_str().unwrap_or_default(),
            u.cost_usd,
            u.receipts,
            u.calls
        ));
    }
    for (occ, o) in &view.occurrences {
        let answered =
            |action: heddle_core::RecordedAction| o.verdicts.iter().any(|v| v.action == action);
        let reconciled = o.reconciled.as_ref().map(|a| {
            let said = match a.answer {
                heddle_core::ReconcileAnswer::Completed => "completed",
                heddle_core::ReconcileAnswer::Skipped => "skipped",
            };
            format!("{said} (reconciled by {})", a.by)
        });
        let result = match &o.result {
            _ if reconciled.is_some() => reconciled.as_deref().unwrap_or_default(),
            Some(Outcome::Completed { .. }) => "completed",
            Some(Outcome::Failed { .. }) => "failed",
            None if answered(heddle_core::RecordedAction::Reject) => "cancelled (gate rejected)",
            // An approved gate passes its value on and records no result of its own.
            None if answered(heddle_core::RecordedAction::Approve) => "approved (gate)",
            None if o.started > 0 => "started, no result",
            None => "dispatched",
        };
        // Starts are recorded for work that is not retry-safe (what a crash leaves
        // uncertain); retry-safe work is recomputed and its starts are not counted.
        let starts = if o.retry_safe && o.started == 0 {
            "retry-safe".to_string()
        } else if o.retry_safe {
            format!("starts {}, retry-safe", o.started)
        } else {
            format!("starts {}, not retry-safe", o.started)
        };
        // Padded as text: an occurrence's `Display` writes its parts and ignores width.
        let occ = occ.to_string();
        line(format!("  {occ:<30} {result:<26} ({starts})"));
    }
    out
}
