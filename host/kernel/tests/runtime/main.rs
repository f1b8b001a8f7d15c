//! The runtime's behaviour, one property per test: actor modes, correlation-aware
//! scheduling, end-of-stream, skips, failures, suspension, cancellation, limits, control.
//! One test binary; this file holds the fixtures its modules share.

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use common::{graph, ilist, ints, registry, within};
use heddle_core::plan::{InputError, InputErrors};
use heddle_core::{
    EdgeStatus, EventKind, NodeOutcome, NodeStatus, RunResult, RunStatus, SkipReason, Value,
};
use heddle_kernel::runtime::{InboxLimits, KernelError, Run, RunOptions, run_graph};
use serde_json::json;

async fn run(doc: &heddle_core::GraphDoc, opts: RunOptions) -> RunResult {
    let (reg, _) = registry();
    within(run_graph(doc, &reg, opts)).await.unwrap()
}

fn outcome(r: &RunResult, id: &str) -> NodeOutcome {
    r.nodes
        .get(id)
        .unwrap_or_else(|| panic!("no node {id}"))
        .outcome
        .clone()
}

fn skipped(reason: SkipReason) -> NodeOutcome {
    NodeOutcome::Skipped { reason }
}

mod control;
mod endings;
mod flow;
mod fused;
mod group;
mod init;
mod isolated;
mod limits;
mod lineage;
mod secrets;
mod typed;
