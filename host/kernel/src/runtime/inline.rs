//! Nodes that run inline in the runner, with no actor built at all.
//!
//! An actor is a logical unit, not necessarily a task or even a struct: a native built-in
//! with no edges at all (nothing feeds it, nothing reads it, no control event reaches it)
//! fires once with its properties and ends. Its whole life is an
//! [`Executor::invoke_now`] call and two events, so it is run as exactly that, without
//! the wiring, state, future and tear-down an actor costs; a graph of many independent
//! nodes pays per node little more than the node's own work. The events and the report
//! are the ones the actor would give (`running`, a warning per undeclared output,
//! `completed` with the outputs), and a node whose executor declines the call runs as an
//! actor after all.

use heddle_core::NodeStatus;
use smallvec::SmallVec;

use super::actor::{Shared, runs_now, shows_result, undeclared_output};
use super::bus::Draft;
use super::wiring::base_inputs;
use super::{INPUT_TYPE, OUTPUT_TYPE, Run};
use crate::executor::InputView;

/// Runs node `i` inline if it is such a node and its executor takes the call: then it is
/// done, having invoked once with no metrics to report (a native built-in's), and its
/// events are in `events`, for the caller to publish (see [`EventBus::publish_all`]).
/// False: nothing was done.
///
/// [`EventBus::publish_all`]: super::bus::EventBus::publish_all
pub(super) fn run(run: &Run, i: usize, shared: &Shared, events: &mut Vec<Draft>) -> bool {
    let node = &run.plan.nodes[i];
    let isolated = node.in_edges.is_empty()
        && node.out_edges.is_empty()
        && node.controllers.is_empty()
        && &*node.node_type != INPUT_TYPE
        && &*node.node_type != OUTPUT_TYPE;
    if !isolated || !runs_now(&node.decl, node.contract.is_some(), shared) {
        return false;
    }
    let base = base_inputs(node);
    let Some(out) = run.executors[i].invoke_now(&mut InputView::new(SmallVec::new(), &base)) else {
        return false;
    };
    // Named by plan index: the bus reads the id and type from the plan if anyone reads
    // the event, and the draft stays small.
    let idx = i as heddle_core::plan::NodeIdx;
    events.push(Draft::Inline {
        node: idx,
        status: NodeStatus::Running,
        result: None,
    });
    // No output of an isolated node has a port: an undeclared one is warned about.
    for (h, _) in out.iter() {
        if let Some(warning) = undeclared_output(&node.decl, &node.id, h) {
            events.push(Draft::Built(Box::new(warning)));
        }
    }
    let result = shows_result(&node.node_type).then_some(out);
    events.push(Draft::Inline {
        node: idx,
        status: NodeStatus::Completed,
        result,
    });
    true
}
