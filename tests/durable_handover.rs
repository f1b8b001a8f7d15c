//! A handover of a durable run is serialized: of N `heddle runs resume | approve`
//! processes started at once on one stopped run, exactly one takes it over and runs it;
//! the others exit 2 naming what won and change nothing in the store (no `opened`
//! record of theirs). `heddle runs cancel` of a run a live `heddle run --durable` owns
//! asks that owner to cancel: the owner records the cancel and ends the run (exit 3),
//! its writes never cut off. Effects are counted where they land (a file), records read
//! from the store file as another process would.

mod support;

use std::process::{Child, Output, Stdio};

use support::store::{Backend, CHAIN, GATED, StoreDir, expect, run_id, run_id_in, wait_line};
use support::{CANCELLED, INVALID, OK, SUSPENDED};

// On a store file and on PostgreSQL (where a run's lease row is what the takers race
// for).
crate::both!(
    of_concurrent_resumes_one_recovers_the_run_and_the_others_exit_2_writing_nothing,
    of_concurrent_approvals_one_runs_on_from_the_gate_and_the_others_exit_2_writing_nothing,
    a_resume_racing_an_approval_never_leaves_the_run_interrupted,
    cancelling_a_run_a_live_process_owns_asks_the_owner_which_ends_it_cancelled,
    a_cancel_request_left_behind_is_withdrawn_by_a_resume_and_kept_by_a_recovery,
);

/// Concurrent takers per trial, and trials (each on a store of its own).
const TAKERS: usize = 4;
const TRIALS: usize = 3;

/// `heddle ARGS` started `TAKERS` times at once (their output collected).
fn at_once(d: &StoreDir, args: &[&str]) -> Vec<Output> {
    let children: Vec<Child> = (0..TAKERS)
        .map(|_| {
            d.cmd(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("heddle starts")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Exactly one of `outs` exited `won`; every other exited 2 saying who has the run
/// (taken over, live with its owner's pid, or already ended by the winner).
fn one_won(outs: &[Output], won: i32, trial: usize) {
    let all: Vec<String> = outs.iter().map(text).collect();
    let winners = outs.iter().filter(|o| o.status.code() == Some(won)).count();
    assert_eq!(winners, 1, "trial {trial}: {all:#?}");
    for o in outs.iter().filter(|o| o.status.code() != Some(won)) {
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(INVALID), "trial {trial}: {all:#?}");
        assert!(
            e.contains("was taken over by another process")
                || e.contains("is live (owner process")
                || e.contains("is owned by host")
                // Read as the winner took it (PostgreSQL: between its `opened` record
                // and its lease showing as live).
                || e.contains("is not waiting at gate")
                || e.contains("is completed"),
            "trial {trial}: a loser must say what won: {e}"
        );
        assert!(
            e.contains("nothing was changed") || !e.contains("taken over"),
            "{e}"
        );
    }
}

/// How many `opened` records the store's log holds (one per take-over).
fn opened(d: &StoreDir) -> usize {
    d.records_of("opened").len()
}

fn of_concurrent_resumes_one_recovers_the_run_and_the_others_exit_2_writing_nothing(b: Backend) {
    for trial in 0..TRIALS {
        let d = StoreDir::with_graph_on(b, CHAIN);
        // Interrupted before `w` was dispatched: recovery runs it (its effect once).
        let run = d.crash("before-dispatch:w", &[]);
        assert_eq!(opened(&d), 1);
        let outs = at_once(&d, &["runs", "resume", &run]);
        one_won(&outs, OK, trial);
        assert_eq!(opened(&d), 2, "trial {trial}: one take-over");
        assert_eq!(d.lines(), ["one"], "trial {trial}: the effect landed once");
        let o = d.heddle(&["runs", "show", &run, "--json"]);
        expect(&o, OK);
        let show: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(show["state"], "completed", "trial {trial}");
    }
}

/// A gate, then an effect: the approval's run writes one line.
const GATED_EFFECT: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "shipped\n"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "bytes", "target": "out", "targetHandle": "value"}
  ]
}"#;

fn of_concurrent_approvals_one_runs_on_from_the_gate_and_the_others_exit_2_writing_nothing(
    b: Backend,
) {
    for trial in 0..TRIALS {
        let d = StoreDir::with_graph_on(b, GATED_EFFECT);
        let o = d.heddle(&["run", "--durable", "g.json"]);
        expect(&o, SUSPENDED);
        let run = run_id(&o);
        let outs = at_once(&d, &["runs", "approve", &run, "ship"]);
        one_won(&outs, OK, trial);
        assert_eq!(opened(&d), 2, "trial {trial}: one take-over");
        assert_eq!(d.records("verdict", "ship").len(), 1, "trial {trial}");
        assert_eq!(
            d.lines(),
            ["shipped"],
            "trial {trial}: the effect landed once"
        );
    }
}

/// A gated run approved and resumed at once: one of the two kinds wins; a plain resume
/// at a gate is refused anyway, so the approval is the one that may win.
fn a_resume_racing_an_approval_never_leaves_the_run_interrupted(b: Backend) {
    for trial in 0..TRIALS {
        let d = StoreDir::with_graph_on(b, GATED);
        let o = d.heddle(&["run", "--durable", "g.json"]);
        expect(&o, SUSPENDED);
        let run = run_id(&o);
        let approve = d
            .cmd(&["runs", "approve", &run, "ship"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let cancel = d
            .cmd(&["runs", "cancel", &run])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (a, c) = (
            approve.wait_with_output().unwrap(),
            cancel.wait_with_output().unwrap(),
        );
        let o = d.heddle(&["runs", "show", &run, "--json"]);
        let show: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let state = show["state"].as_str().unwrap().to_string();
        // Exactly one of the two answered the run; the state is the winner's.
        match (a.status.code(), c.status.code()) {
            (Some(OK), Some(INVALID)) => assert_eq!(state, "completed", "trial {trial}"),
            (Some(INVALID), Some(OK)) => assert_eq!(state, "cancelled", "trial {trial}"),
            _ => panic!("trial {trial}: {}\n{}", text(&a), text(&c)),
        }
        assert_eq!(opened(&d), 1 + (state == "completed") as usize);
    }
}

/// A bash node that says it started, then waits far longer than the test.
fn waiting_graph(d: &StoreDir) -> String {
    let code = format!(
        "echo started >> {}/started.txt; sleep 600",
        d.path().display()
    );
    serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "wait", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": code}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [{"source": "wait", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]})
    .to_string()
}

fn cancelling_a_run_a_live_process_owns_asks_the_owner_which_ends_it_cancelled(b: Backend) {
    for trial in 0..TRIALS {
        let d = StoreDir::on(b);
        std::fs::write(d.path().join("g.json"), waiting_graph(&d)).unwrap();
        let (mut live, rx) = d.spawn(&["run", "--durable", "g.json"]);
        let run = wait_line(&rx, run_id_in);
        let started = d.path().join("started.txt");
        while !started.exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = d.heddle(&["runs", "cancel", &run]);
        expect(&o, OK);
        let e = support::stderr(&o);
        assert!(e.contains("asked the owner of run"), "trial {trial}: {e}");
        assert!(
            e.contains(&format!("run {run} cancelled")),
            "trial {trial}: {e}"
        );
        let status = live.wait().unwrap();
        let rest: Vec<String> = rx.try_iter().collect();
        assert_eq!(
            status.code(),
            Some(CANCELLED),
            "trial {trial}: the owner ends the run itself: {rest:#?}"
        );
        assert!(
            !rest.iter().any(|l| l.contains("took the run over")),
            "trial {trial}: the owner was never fenced out: {rest:#?}"
        );
        let o = d.heddle(&["runs", "show", &run, "--json"]);
        let show: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(show["state"], "cancelled", "trial {trial}");
        assert_eq!(d.records_of("cancel_requested").len(), 1, "trial {trial}");
        // Nobody but the owner opened the run.
        assert_eq!(opened(&d), 1, "trial {trial}");
    }
}

/// A cancel request is for the owner it asked: left behind by a `heddle runs cancel`
/// killed right after asking (the request row, written here as that process writes
/// it) while the owner paused at a gate, it does not cancel the run a person later
/// approves; left behind on a run whose owner died running, the recovery carries it
/// out (nobody decided anything since it was asked).
fn a_cancel_request_left_behind_is_withdrawn_by_a_resume_and_kept_by_a_recovery(b: Backend) {
    let ask = |d: &StoreDir, run: &str| {
        d.open_store().request_cancel(run).unwrap();
    };

    // After the gate, work that takes longer than an owner takes to see a request.
    let d = StoreDir::on(b);
    let shipped = d.path().join("data/log.txt");
    let graph = serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "c", "type": "heddle.constant", "properties": {"value": "shipped"}},
        {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
        {"id": "slow", "type": "code.bash", "properties": {"mode": "subprocess", "timeout_s": 60,
         "code": format!("sleep 1; echo \"$value\" >> {}", shipped.display())}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [
        {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
        {"source": "ship", "sourceHandle": "value", "target": "slow", "targetHandle": "value"},
        {"source": "slow", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]});
    std::fs::write(d.path().join("g.json"), graph.to_string()).unwrap();
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let run = run_id(&o);
    ask(&d, &run);
    let o = d.heddle(&["runs", "approve", &run, "ship"]);
    expect(&o, OK);
    assert_eq!(d.lines(), ["shipped"], "the approved run ran on");
    assert!(d.records_of("cancel_requested").is_empty());
    // And it stays withdrawn: nothing of it is left to a later owner.
    let left: i64 = match d.url() {
        None => rusqlite::Connection::open(d.db())
            .unwrap()
            .query_row("SELECT count(*) FROM cancel_requests", [], |r| r.get(0))
            .unwrap(),
        Some(url) => support::pg::query(url, "SELECT count(*) FROM heddle.cancel_requests")[0][0]
            .as_deref()
            .unwrap()
            .parse()
            .unwrap(),
    };
    assert_eq!(left, 0);

    let d = StoreDir::with_graph_on(b, CHAIN);
    let run = d.crash("after-dispatch:w", &[]);
    ask(&d, &run);
    let o = d.heddle(&["runs", "resume", &run]);
    expect(&o, CANCELLED);
    assert_eq!(d.lines(), Vec::<String>::new(), "the cancelled run ran on");
    assert_eq!(d.records_of("cancel_requested").len(), 1);
}
