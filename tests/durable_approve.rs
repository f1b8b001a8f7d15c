//! `heddle runs approve` says a gate is approved only once the approval is on disk: the
//! real binary is killed with SIGKILL the moment that line appears, and the approval
//! must be in the log (read from the store file), so the next resume runs on from the
//! gate instead of waiting there again.

mod support;

use support::store::{Backend, GATED, StoreDir, expect, report, run_id, sigkill, wait_line};
use support::{OK, SUSPENDED};

// On a store file and on PostgreSQL.
crate::both!(an_approval_announced_is_on_disk_when_the_process_is_killed_right_after,);

fn an_approval_announced_is_on_disk_when_the_process_is_killed_right_after(b: Backend) {
    let d = StoreDir::with_graph_on(b, GATED);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let run = run_id(&o);

    let (mut child, rx) = d.spawn(&["runs", "approve", &run, "ship", "--note", "go"]);
    wait_line(&rx, |l| l.contains("approved").then_some(()));
    sigkill(child.id() as i32);
    let _ = child.wait();

    let approvals: Vec<_> = d
        .records_of("verdict")
        .into_iter()
        .map(|r| serde_json::to_value(&r).unwrap())
        .filter(|v| v["decided_by"] == "user" && v["verdict"]["verdict"] == "approve")
        .collect();
    assert_eq!(approvals.len(), 1, "the announced approval is in the log");
    assert_eq!(approvals[0]["occurrence"]["node"], "ship");

    // The killed process had taken the run over: recovery runs on from the approved
    // gate, it does not wait there again. The kill lands a moment after the line, and
    // a three-node run may have ended in that moment (seen on PostgreSQL under load):
    // then it ended past the gate, which is the same claim.
    let show = d.heddle(&["runs", "show", &run, "--json"]);
    expect(&show, OK);
    if report(&show)["state"] == "completed" {
        return;
    }
    let o = d.heddle(&["runs", "resume", &run, "--json"]);
    expect(&o, OK);
    assert_eq!(report(&o)["outputs"]["out"], serde_json::json!(["notes"]));
}
