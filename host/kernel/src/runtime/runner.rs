//! Running a started run to its end, in four phases: executors initialized in graph
//! order ([`initialize`]), every actor run, a ready native source inline ([`run_actors`]),
//! executors finalized ([`finalize`]), and the result built with the outcome precedence
//! cancel > suspend > failed > completed ([`build_result`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use heddle_core::plan::{NodeIdx, Plan};
use heddle_core::{
    EdgeStatus, EventKind, NodeOutcome, NodeReport, NodeReports, RunResult, RunStatus, SkipReason,
    SuspendInfo, Value,
};
use tokio::task::JoinHandle;

use super::actor::{Actor, ActorReport, Fusion, Shared, Stop};
use super::bus::{Draft, EventBus};
use super::inbox::{Inbox, InboxTx};
use super::{OUTPUT_TYPE, Run};

/// The runner: initializes executors, runs every actor, finalizes, builds the result.
/// `txs` and `rxs` are every node's inbox ends, by node index.
pub(super) async fn run_all(
    run: Run,
    txs: Arc<[Option<InboxTx>]>,
    rxs: Vec<Inbox>,
    fusion: Fusion,
    sh: Arc<Shared>,
) -> RunResult {
    run.bus.publish(EventKind::Run {
        status: RunStatus::Running,
        error: None,
    });
    if let Err(result) = initialize(&run, &sh).await {
        return result;
    }
    let ran = run_actors(&run, txs, rxs, fusion, &sh).await;
    finalize(&run, &ran.reports).await;
    build_result(&run, &sh, ran)
}

/// Initializes every executor in graph order before any actor starts. When one fails
/// (or the run is cancelled while one waits), those before it are finalized and the
/// run's result is the error: no node ran.
async fn initialize(run: &Run, sh: &Shared) -> Result<(), RunResult> {
    let plan = &run.plan;
    let executors = &run.executors;
    for (i, e) in executors.iter().enumerate() {
        // Most executors are ready at once (nothing to set up): only one that has to
        // wait races the run's cancellation, which costs a wide graph per node.
        let mut init = e.initialize();
        let r = match super::poll_once(init.as_mut()).await {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => tokio::select! {
                biased;
                r = init => r,
                _ = sh.run_token.cancelled() => Err(crate::executor::NodeError::cancelled()),
            },
        };
        let Err(err) = r else { continue };
        for e in &executors[..i] {
            e.finalize().await;
        }
        let n = &plan.nodes[i];
        let (status, error) = if sh.cancelled.load(Ordering::SeqCst) {
            (RunStatus::Cancelled, "cancelled".to_string())
        } else {
            (
                RunStatus::Failed,
                format!(
                    "node \"{}\" (type {}) failed to initialize: {}",
                    n.id, n.node_type, err.message
                ),
            )
        };
        // Nothing ran. A failed run names the node that failed and counts the graph's
        // given inputs as delivered; every other node never ran because of it. A
        // cancelled one was cancelled before any node dispatched.
        let nodes = by_id(plan, |j| {
            let failed = status == RunStatus::Failed;
            let outcome = if failed && j == i {
                NodeOutcome::Failed {
                    error: error.clone(),
                }
            } else if failed && run.inputs.get(j as NodeIdx).is_some() {
                NodeOutcome::Done
            } else if failed {
                NodeOutcome::Skipped {
                    reason: SkipReason::UpstreamFailed,
                }
            } else {
                NodeOutcome::Skipped {
                    reason: SkipReason::Cancelled,
                }
            };
            NodeReport {
                node_type: plan.nodes[j].node_type.clone(),
                outcome,
                invocations: 0,
                metrics: Default::default(),
                signature: None,
                timed_out: false,
                may_spend: plan.nodes[j].decl.origin.may_spend(),
            }
        });
        return Err(finish_result(
            &run.bus,
            status,
            Some(error),
            None,
            BTreeMap::new(),
            nodes,
        ));
    }
    Ok(())
}

/// What running the actors left: how each node ended (by plan index; `None` for one
/// whose actor panicked) and the panics, as error lines.
struct Ran {
    reports: Vec<Option<Ended>>,
    panics: Vec<String>,
}

/// Runs every actor to its end: a ready native source inline, a native node fed by
/// another in its producer's task, every other actor in a task of its own.
async fn run_actors(
    run: &Run,
    txs: Arc<[Option<InboxTx>]>,
    rxs: Vec<Inbox>,
    mut fusion: Fusion,
    sh: &Arc<Shared>,
) -> Ran {
    let plan = &run.plan;
    let bus = &run.bus;
    let mut joins: Vec<(usize, JoinHandle<Box<ActorReport>>)> = Vec::new();
    let mut reports: Vec<Option<Ended>> = (0..plan.nodes.len()).map(|_| None).collect();
    // Events of nodes run inline, published a batch at a time (see `INLINE_BATCH`).
    let mut held: Vec<Draft> = Vec::new();
    for (idx, rx) in rxs.into_iter().enumerate() {
        if super::inline::run(run, idx, sh, &mut held) {
            reports[idx] = Some(Ended::Inline);
            if held.len() >= INLINE_BATCH {
                bus.publish_all(&mut held);
            }
            continue;
        }
        // In the record before anything a node started after them does.
        bus.publish_all(&mut held);
        // Boxed once, where it lives while it runs (a group's member, a task's future).
        let a = Box::new(Actor::new(run.spec(idx, &txs, rx), sh.clone()));
        // A native node fed by another runs in its producer's task (see `Fusion`).
        let Some(a) = fusion.take(idx, a) else {
            continue;
        };
        if a.inline_source() {
            // An actor is a logical unit, not necessarily a task: a ready native source
            // runs to completion right here unless it has to wait (a full downstream
            // inbox), in which case the rest of it becomes a task.
            let mut fut = Box::pin((*a).run_source());
            match super::poll_once(fut.as_mut()).await {
                std::task::Poll::Ready(r) => reports[idx] = Some(Ended::Actor(r)),
                std::task::Poll::Pending => joins.push((idx, tokio::spawn(fut))),
            }
        } else {
            joins.push((idx, tokio::spawn(a.run())));
        }
    }
    bus.publish_all(&mut held);
    let groups: Vec<_> = fusion
        .into_groups()
        .into_iter()
        .map(|(nodes, g)| (nodes, tokio::spawn(g.run())))
        .collect();
    // Every actor holds its own senders now: the inboxes close as their producers end.
    drop(txs);
    let mut panics = Vec::new();
    let panicked = |idx: usize, e: &dyn std::fmt::Display| {
        let n = &plan.nodes[idx];
        format!("node \"{}\" (type {}) panicked: {e}", n.id, n.node_type)
    };
    for (nodes, j) in groups {
        let ends = match j.await {
            Ok(ends) => ends,
            // The group's own driver panicked: every member it ran is lost.
            Err(e) => nodes
                .into_iter()
                .map(|idx| (idx, Err(e.to_string())))
                .collect(),
        };
        for (idx, end) in ends {
            match end {
                Ok(r) => reports[idx] = Some(Ended::Actor(r)),
                Err(e) => panics.push(panicked(idx, &e)),
            }
        }
    }
    for (idx, j) in joins {
        match j.await {
            Ok(r) => reports[idx] = Some(Ended::Actor(r)),
            Err(e) => panics.push(panicked(idx, &e)),
        }
    }
    Ran { reports, panics }
}

/// Finalizes every executor once every actor has stopped, then marks the edges whose
/// target stopped before their end.
async fn finalize(run: &Run, reports: &[Option<Ended>]) {
    for e in &run.executors {
        e.finalize().await;
    }
    publish_drained(&run.plan, &run.bus, reports);
}

/// The run's result from how its nodes ended, with the outcome precedence cancel >
/// suspend > failed > completed, and the supervisor's interventions.
fn build_result(run: &Run, sh: &Shared, ran: Ran) -> RunResult {
    let plan = &run.plan;
    let Ran { reports, panics } = ran;
    let mut outputs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    // By plan index here (outputs, errors and the suspension are taken in plan order);
    // handed to the map in id order below.
    let mut done: Vec<Option<NodeReport>> = Vec::with_capacity(plan.nodes.len());
    let mut errors = Vec::new();
    let mut aborts = Vec::new();
    let mut suspend: Option<SuspendInfo> = None;
    for (i, r) in reports.into_iter().enumerate() {
        let n = &plan.nodes[i];
        let report = |outcome, invocations, metrics| NodeReport {
            node_type: n.node_type.clone(),
            outcome,
            invocations,
            metrics,
            signature: None,
            timed_out: false,
            may_spend: n.decl.origin.may_spend(),
        };
        let r = match r {
            None => {
                let error = "the node's actor panicked".into();
                done.push(Some(report(
                    NodeOutcome::Failed { error },
                    0,
                    Default::default(),
                )));
                continue;
            }
            Some(Ended::Inline) => {
                done.push(Some(report(NodeOutcome::Done, 1, Default::default())));
                continue;
            }
            Some(Ended::Actor(r)) => *r,
        };
        if &*n.node_type == OUTPUT_TYPE {
            outputs
                .entry(String::from(&*n.name))
                .or_default()
                .extend(r.outputs);
        }
        match r.stop {
            Some(Stop::Failed(m)) => errors.push(m),
            Some(Stop::Abort(m)) => aborts.push(m),
            Some(Stop::Suspended(info)) if suspend.is_none() => suspend = Some(info),
            _ => {}
        }
        done.push(Some(NodeReport {
            signature: r.signature.map(String::from),
            timed_out: r.timed_out,
            ..report(r.outcome, r.invocations, r.metrics)
        }));
    }
    // Each index once: the report is there.
    let nodes = by_id(plan, |i| done[i].take().expect("one report per node"));
    errors.extend(panics);
    let all_errors: Vec<String> = aborts.into_iter().chain(errors).collect();
    let (status, error) = if sh.cancelled.load(Ordering::SeqCst) {
        (RunStatus::Cancelled, Some("cancelled".to_string()))
    } else if let Some(s) = &suspend {
        (
            RunStatus::Suspended,
            Some(format!("suspended by node \"{}\": {}", s.node_id, s.reason)),
        )
    } else if !all_errors.is_empty() {
        (RunStatus::Failed, Some(all_errors.join("; ")))
    } else {
        (RunStatus::Completed, None)
    };
    let mut result = finish_result(&run.bus, status, error, suspend, outputs, nodes);
    if let Some(esc) = &sh.escalator {
        result.interventions = esc.interventions_json();
        esc.close();
    }
    result
}

/// Events of inline nodes held back before they are published together: one clock
/// reading and one lock per batch rather than per event. Small, so an event's time is
/// late by no more than a few dozen inline nodes' work.
const INLINE_BATCH: usize = 64;

/// How a node ended, kept until the result is built.
enum Ended {
    /// Ran once inline and is done (see `inline`): no actor, nothing else to report.
    Inline,
    /// Boxed (see `Actor::finish`): the table is held for every node from the start.
    Actor(Box<ActorReport>),
}

/// The result's node reports, `report(i)` giving node `i`'s: taken in the plan's id
/// order, so the list is sorted as it is built, its ids shared with the plan's nodes.
fn by_id(plan: &Plan, mut report: impl FnMut(usize) -> NodeReport) -> NodeReports {
    NodeReports::from_sorted(plan.by_id().iter().map(|&i| {
        let i = i as usize;
        (plan.nodes[i].id.clone(), report(i))
    }))
}

/// `drained` for every data edge whose target stopped before consuming its end: values
/// on it were still buffered, or could still have come. Published once every actor has
/// stopped, so it follows the source's `completed` and is the edge's last status.
fn publish_drained(plan: &Plan, bus: &EventBus, reports: &[Option<Ended>]) {
    let actors = || {
        reports.iter().filter_map(|r| match r {
            Some(Ended::Actor(r)) => Some(r),
            _ => None,
        })
    };
    let ended: HashSet<u32> = actors().flat_map(|r| r.ended_in.iter().copied()).collect();
    for r in actors() {
        for &(edge, counter) in &r.sent {
            if !ended.contains(&edge) {
                bus.publish_draft(Draft::Edge {
                    edge_id: plan.edges[edge as usize].id.clone(),
                    status: EdgeStatus::Drained,
                    counter,
                });
            }
        }
    }
}

fn finish_result(
    bus: &EventBus,
    status: RunStatus,
    error: Option<String>,
    suspend: Option<SuspendInfo>,
    outputs: BTreeMap<String, Vec<Value>>,
    nodes: NodeReports,
) -> RunResult {
    // On the events' clock, read before the last event: the run ends no earlier than
    // any event it stamped.
    let wall_us = bus.now_us();
    bus.publish(EventKind::Run {
        status,
        error: error.clone(),
    });
    // The record stays on the bus for late subscribers; `RunHandle::wait` moves it here.
    let dropped = bus.close();
    RunResult {
        status,
        outputs,
        error,
        suspend,
        nodes,
        interventions: Vec::new(),
        events: Vec::new(),
        events_dropped: dropped,
        wall_us,
    }
}
