//! Durable runs with the real `heddle` binary: it is aborted at each named write-ahead
//! boundary (`HEDDLE_FAULT`) or killed with SIGKILL, then resumed, and effects are
//! counted on the provider side (lines a `files.write_text` node appended to a granted
//! file), not in the engine's own log.

use std::process::Output;

mod support;

use support::stderr;
use support::store::{
    BAD_STORE, Backend, CHAIN, FANOUT, INVALID, LIMIT as BUDGET, OK, PAUSED, StoreDir, expect,
    kill_moments, pause_event, reference_outputs, run_id, text,
};

// Each as a test on a store file and on PostgreSQL (`mod sqlite`, `mod postgres`): the
// crash table, the answers and the budgets do not depend on the store.
crate::both!(
    an_uninterrupted_durable_run_is_recorded_and_cannot_be_resumed,
    a_started_non_retry_safe_node_pauses_until_an_explicit_resume,
    a_recorded_result_is_never_repeated,
    work_that_never_started_is_started_on_recovery,
    a_crash_in_a_fan_out_repeats_no_completed_item,
    random_sigkills_of_a_fan_out_lose_nothing_and_repeat_only_reoffered_work,
    a_spent_dispatch_budget_ends_the_run_with_its_own_exit_code,
    recovered_dispatches_count_once_against_the_budget,
    the_run_time_limit_ends_a_run_that_outlives_it,
    a_recorded_verdict_is_carried_out_on_recovery_never_asked_again,
    a_reconcile_pause_answered_completed_runs_on_without_running_the_node,
    a_recorded_answer_is_carried_out_after_a_later_crash_and_never_asked_again,
    a_wrong_answer_to_a_reconcile_pause_is_refused_and_writes_nothing,
    a_post_cut_off_by_a_crash_pauses_instead_of_being_sent_again,
    a_get_cut_off_by_a_crash_runs_again_on_resume,
);

fn outputs(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)));
    v["outputs"].clone()
}

fn occurrence<'a>(show: &'a serde_json::Value, node: &str) -> &'a serde_json::Value {
    show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == node)
        .unwrap_or_else(|| panic!("no occurrence of {node}: {show:#}"))
}

fn an_uninterrupted_durable_run_is_recorded_and_cannot_be_resumed(b: Backend) {
    let env = StoreDir::with_graph_on(b, CHAIN);
    let o = env.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    let id = run_id(&o);
    assert_eq!(outputs(&o)["out"], serde_json::json!(["/DATA/LOG.TXT"]));
    assert_eq!(env.lines(), ["one"]);
    let show = env.show(&id);
    assert_eq!(show["state"], "completed");
    assert_eq!(occurrence(&show, "w")["started"], 1);
    let list = env.heddle(&["runs", "list"]);
    expect(&list, OK);
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));

    // A finished run is not resumable; the refusal writes nothing.
    let before = show["records"].clone();
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, INVALID);
    assert!(
        stderr(&o).contains(&format!("run {id} is completed")),
        "{}",
        text(&o)
    );
    assert_eq!(env.show(&id)["records"], before);
    assert_eq!(env.lines(), ["one"]);
}

fn a_started_non_retry_safe_node_pauses_until_an_explicit_resume(b: Backend) {
    let reference = reference_outputs(CHAIN);
    let env = StoreDir::with_graph_on(b, CHAIN);
    let id = env.crash("after-start:w", &[]);
    // The start record is on disk and node code never ran.
    assert_eq!(env.lines(), Vec::<String>::new());
    assert_eq!(env.show(&id)["state"], "interrupted");

    // Recovery never re-runs it: the run pauses for reconciliation.
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, PAUSED);
    let event = pause_event(&o);
    assert_eq!(env.lines(), Vec::<String>::new());
    let show = env.show(&id);
    assert_eq!(show["state"], "paused");
    assert_eq!(show["pause"]["event"], event);
    assert_eq!(show["pause"]["why"], "reconcile");

    // The wrong pause id is refused naming both ids, and changes nothing.
    let records = show["records"].clone();
    let o = env.heddle(&["runs", "resume", &id, "--pause", "999"]);
    expect(&o, INVALID);
    assert!(
        stderr(&o).contains(&format!(
            "Resume expected pause event \"999\" but found \"{event}\""
        )),
        "{}",
        text(&o)
    );
    assert_eq!(env.show(&id)["records"], records);

    // The user's resume of that pause offers the uncertain work again.
    let o = env.heddle(&[
        "runs",
        "resume",
        &id,
        "--pause",
        &event.to_string(),
        "--json",
    ]);
    expect(&o, OK);
    assert_eq!(outputs(&o), reference);
    assert_eq!(env.lines(), ["one"]);
    assert_eq!(env.show(&id)["state"], "completed");
}

fn a_recorded_result_is_never_repeated(b: Backend) {
    for fault in ["after-result:w", "after-start:up", "after-result:up"] {
        let reference = reference_outputs(CHAIN);
        let env = StoreDir::with_graph_on(b, CHAIN);
        let id = env.crash(fault, &[]);
        assert_eq!(env.lines(), ["one"], "{fault}");
        let o = env.heddle(&["runs", "resume", &id, "--json"]);
        expect(&o, OK);
        assert_eq!(outputs(&o), reference, "{fault}");
        // The completed write ran exactly once.
        assert_eq!(env.lines(), ["one"], "{fault}");
        let show = env.show(&id);
        assert_eq!(occurrence(&show, "w")["started"], 1, "{fault}");
        // A retry-safe node records no dispatch (a crash before its result runs it
        // again); its start is group-committed only to account usage, so a crash may
        // have lost it.
        let up = occurrence(&show, "up");
        assert_eq!(up["result"]["outcome"], "completed", "{show:#}");
        assert_eq!(up["retry_safe"], true, "{show:#}");
        assert_eq!(up["dispatched"], 0, "{show:#}");
    }
}

fn work_that_never_started_is_started_on_recovery(b: Backend) {
    for fault in ["before-dispatch:w", "after-dispatch:w", "mid-commit:w"] {
        let reference = reference_outputs(CHAIN);
        let env = StoreDir::with_graph_on(b, CHAIN);
        let id = env.crash(fault, &[]);
        assert_eq!(env.lines(), Vec::<String>::new(), "{fault}");
        let o = env.heddle(&["runs", "resume", &id, "--json"]);
        expect(&o, OK);
        assert_eq!(outputs(&o), reference, "{fault}");
        assert_eq!(env.lines(), ["one"], "{fault}");
        let show = env.show(&id);
        assert_eq!(occurrence(&show, "w")["dispatched"], 1, "{fault}: {show:#}");
    }
}

fn a_crash_in_a_fan_out_repeats_no_completed_item(b: Backend) {
    let reference = reference_outputs(FANOUT);
    // One item at a time (the items running together: `tests/durable_group.rs`).
    let env = StoreDir::with_graph_on(b, FANOUT).one_at_a_time();
    // The third item's write completes, then the process dies.
    let id = env.crash("after-result:w:3", &[]);
    assert_eq!(env.lines().len(), 3);
    let o = env.heddle(&["runs", "resume", &id, "--json"]);
    expect(&o, OK);
    assert_eq!(outputs(&o), reference);
    let mut lines = env.lines();
    lines.sort();
    assert_eq!(lines, ["a", "b", "c", "d", "e", "f"]);
}

/// Many runs of the fan-out graph killed with SIGKILL after a pseudo-random delay, then
/// resumed (explicitly re-offering any reconcile pause) until they complete.
fn random_sigkills_of_a_fan_out_lose_nothing_and_repeat_only_reoffered_work(b: Backend) {
    // Kill moments are drawn over the length of an uninterrupted run, so most rounds die
    // somewhere inside it (the length only scales the randomness; nothing asserts on it).
    let t0 = std::time::Instant::now();
    let reference = reference_outputs(FANOUT);
    let span_ms = t0.elapsed().as_millis() as u64 + 1;
    let mut next = kill_moments();
    for round in 0..12 {
        let env = StoreDir::with_graph_on(b, FANOUT);
        let delay = std::time::Duration::from_millis(next() % span_ms);
        let Some(id) = env.run_killed_after(delay) else {
            eprintln!("round {round}: killed before the run was recorded");
            continue;
        };
        eprintln!(
            "round {round}: killed with {} lines written",
            env.lines().len()
        );
        let (final_out, reoffers) =
            env.resume_until_done(&id, &reference, &format!("round {round}"));
        assert_eq!(final_out, reference, "round {round}");
        env.assert_fanout_effects(reoffers, &format!("round {round}"));
        assert_eq!(env.show(&id)["state"], "completed");
    }
}

#[test]
fn a_bad_store_or_unknown_run_is_refused_with_its_own_exit_code() {
    let env = StoreDir::with_graph(CHAIN);
    let o = env.heddle(&["runs", "show", "nope"]);
    expect(&o, INVALID);
    assert!(stderr(&o).contains("nope"), "{}", text(&o));

    std::fs::write(env.db(), b"garbage, not a database\n".repeat(100)).unwrap();
    let before = std::fs::read(env.db()).unwrap();
    for args in [
        &["runs", "list"][..],
        &["runs", "show", "x"],
        &["runs", "resume", "x"],
        &["run", "--durable", "g.json"],
    ] {
        let o = env.heddle(args);
        expect(&o, BAD_STORE);
        assert!(
            stderr(&o).contains("not a Heddle run store"),
            "{args:?}: {}",
            text(&o)
        );
        assert_eq!(std::fs::read(env.db()).unwrap(), before, "{args:?}");
    }
    assert_eq!(env.lines(), Vec::<String>::new());
}

/// Dispatches an uninterrupted run of `graph` makes.
fn reference_dispatches(graph: &str) -> u64 {
    let env = StoreDir::with_graph(graph);
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, OK);
    env.show(&run_id(&o))["dispatches"].as_u64().unwrap()
}

fn a_spent_dispatch_budget_ends_the_run_with_its_own_exit_code(b: Backend) {
    let d = reference_dispatches(CHAIN);
    let env = StoreDir::with_graph_on(b, CHAIN);
    let budget = (d - 1).to_string();
    let o = env.heddle(&[
        "run",
        "--durable",
        "--json",
        "--max-dispatches",
        &budget,
        "g.json",
    ]);
    expect(&o, BUDGET);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["exit_code"], BUDGET, "{report:#}");
    let id = run_id(&o);
    let show = env.show(&id);
    assert_eq!(show["state"], "failed", "{show:#}");
    assert!(
        show["error"]
            .as_str()
            .unwrap()
            .contains("dispatch budget exhausted"),
        "{show:#}"
    );
    assert_eq!(show["dispatches"], d - 1, "{show:#}");
    assert_eq!(show["budget"]["max_dispatches"], d - 1);
    // The run ended: nothing resumes it.
    expect(&env.heddle(&["runs", "resume", &id]), INVALID);

    // Asking for a budget on a run that keeps none is refused, not ignored.
    let o = env.heddle(&["run", "--max-dispatches", "1", "g.json"]);
    expect(&o, INVALID);
    assert!(stderr(&o).contains("--durable"), "{}", text(&o));
}

fn recovered_dispatches_count_once_against_the_budget(b: Backend) {
    let reference = reference_outputs(FANOUT);
    let d = reference_dispatches(FANOUT);
    // Exactly the budget an uninterrupted run needs: a crash and resume fit in it,
    // because what was recorded before the crash is not dispatched again. One item at
    // a time, so the crash comes with half of them run.
    let env = StoreDir::with_graph_on(b, FANOUT).one_at_a_time();
    let id = env.crash("after-result:w:3", &["--max-dispatches", &d.to_string()]);
    assert_eq!(env.lines().len(), 3);
    let o = env.heddle(&["runs", "resume", &id, "--json"]);
    expect(&o, OK);
    assert_eq!(outputs(&o), reference);
    assert_eq!(env.lines().len(), 6);
    assert_eq!(env.show(&id)["dispatches"], d);

    // One less, and the resumed run (which keeps the recorded budget) runs out.
    let env = StoreDir::with_graph_on(b, FANOUT).one_at_a_time();
    let id = env.crash(
        "after-result:w:3",
        &["--max-dispatches", &(d - 1).to_string()],
    );
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, BUDGET);
    let show = env.show(&id);
    assert_eq!(show["state"], "failed", "{show:#}");
    assert_eq!(show["dispatches"], d - 1, "{show:#}");
}

/// A streaming input nobody ever ends: the run waits until its time limit stops it.
const WAITING: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "in", "type": "heddle.input", "properties": {"name": "in", "streaming": true}},
    {"id": "out", "type": "heddle.output", "properties": {"name": "out"}}
  ],
  "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]
}"#;

fn the_run_time_limit_ends_a_run_that_outlives_it(b: Backend) {
    let env = StoreDir::with_graph_on(b, WAITING);
    let mut child = env
        .cmd(&[
            "run",
            "--durable",
            "--stream",
            "in",
            "--time-limit-ms",
            "300",
            "g.json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Standard input stays open (never written, never closed) until the run ended.
    let stdin = child.stdin.take();
    let o = child.wait_with_output().unwrap();
    drop(stdin);
    expect(&o, BUDGET);
    assert!(
        stderr(&o).contains("run time limit exhausted"),
        "{}",
        text(&o)
    );
    let show = env.show(&run_id(&o));
    assert_eq!(show["state"], "failed", "{show:#}");
    assert_eq!(show["budget"]["time_limit_ms"], 300);
    assert!(show["execution_ms"].as_u64().unwrap() >= 300, "{show:#}");
}

/// A supervisor's verdict is on disk before it is carried out; a crash right after it
/// and a resume carry it out from the log, and the supervisor is asked once in all.
fn a_recorded_verdict_is_carried_out_on_recovery_never_asked_again(b: Backend) {
    use support::{PARSE_EACH, chat_server, tool_call};
    let env = StoreDir::with_graph_on(b, PARSE_EACH);
    let (url, requests) = chat_server(vec![
        tool_call(
            "submit_verdict",
            r#"{"action":"skip","reason":"not a number"}"#,
        ),
        // A second question would get a different verdict (and show in the count).
        tool_call(
            "submit_verdict",
            r#"{"action":"fail","reason":"asked twice"}"#,
        ),
    ]);
    let o = env
        .cmd(&["run", "--durable", "--supervise", "g.json"])
        .env("HEDDLE_FAULT", "after-verdict:parse")
        .env("HEDDLE_SUPERVISOR_ENDPOINT", &url)
        .env("HEDDLE_SUPERVISOR_MODEL", "test-model")
        .env("HEDDLE_SUPERVISOR_PRICE", "1.0,2.0")
        .env("HEDDLE_SUPERVISOR_API_KEY", "sk-durable-test")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), None, "not aborted:\n{}", text(&o));
    let id = run_id(&o);
    // The resumed run has no supervisor: the failure it recorded a verdict for can only
    // be carried out from the log.
    let o = env.heddle(&["runs", "resume", &id, "--json"]);
    expect(&o, OK);
    assert_eq!(outputs(&o)["numbers"], serde_json::json!([[1, 3]]));
    assert_eq!(
        requests.try_iter().count(),
        1,
        "the supervisor was asked again"
    );
    let show = env.show(&id);
    let skipped = show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == "parse" && !o["verdicts"].is_null())
        .unwrap_or_else(|| panic!("no verdict recorded: {show:#}"));
    assert_eq!(skipped["verdicts"][0]["verdict"], "skip", "{show:#}");
}

/// `w1` then `w2` append to the log file (neither retry-safe); `w2` appends what `w1`
/// said it wrote (its `path`), and `up` upper-cases where `w2` wrote.
const TWO_EFFECTS: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "one\n"}},
    {"id": "w1", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "w2", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "w1", "targetHandle": "text"},
    {"source": "w1", "sourceHandle": "path", "target": "w2", "targetHandle": "text"},
    {"source": "w2", "sourceHandle": "path", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// The run crashed after `node` recorded its start, then a plain resume paused it for
/// reconciliation: returns the run and the pause's event.
fn reconcile_pause(env: &StoreDir, node: &str) -> (String, u64) {
    let id = env.crash(&format!("after-start:{node}"), &[]);
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, PAUSED);
    let show = env.show(&id);
    assert_eq!(show["pause"]["why"], "reconcile", "{show:#}");
    assert_eq!(show["pause"]["occurrence"]["node"], node, "{show:#}");
    (id, pause_event(&o))
}

/// A person who knows the uncertain work happened says so with its outputs: they are
/// checked against the node's declaration, recorded with who and why, fed downstream,
/// and the node is not run.
fn a_reconcile_pause_answered_completed_runs_on_without_running_the_node(b: Backend) {
    let reference = reference_outputs(CHAIN);
    let env = StoreDir::with_graph_on(b, CHAIN);
    let (id, event) = reconcile_pause(&env, "w");
    assert_eq!(env.lines(), Vec::<String>::new());
    // What `w` would have answered had its result been recorded (an int given as 4).
    std::fs::write(
        env.path().join("outputs.json"),
        r#"{"path": "/data/log.txt", "bytes": 4}"#,
    )
    .unwrap();
    let o = env.heddle(&[
        "runs",
        "resume",
        &id,
        "--pause",
        &event.to_string(),
        "--completed-with",
        "outputs.json",
        "--by",
        "alice",
        "--note",
        "the line is in the file",
        "--json",
    ]);
    expect(&o, OK);
    assert!(
        stderr(&o).contains(&format!("recorded: w of run {id} completed")),
        "{}",
        text(&o)
    );
    assert_eq!(outputs(&o), reference);
    assert_eq!(env.lines(), Vec::<String>::new(), "w ran after all");
    let show = env.show(&id);
    assert_eq!(show["state"], "completed", "{show:#}");
    let w = occurrence(&show, "w");
    assert_eq!(w["started"], 1, "{show:#}");
    assert_eq!(
        w["result"]["outputs"],
        serde_json::json!([["path", "/data/log.txt"], ["bytes", 4]])
    );
    assert_eq!(w["reconciled"]["answer"], "completed");
    assert_eq!(w["reconciled"]["by"], "alice");
    assert_eq!(w["reconciled"]["note"], "the line is in the file");
    let human = env.heddle(&["runs", "show", &id]);
    expect(&human, OK);
    assert!(
        support::stdout(&human).contains("completed (reconciled by alice)"),
        "{}",
        text(&human)
    );
}

/// An answer is on disk with the take-over that closes the pause: a crash later in the
/// same process, and a recovery, carry it out (the node is never run, never asked
/// about again), large supplied values included; a skip drops what the node feeds, with
/// reason `reconciled`.
fn a_recorded_answer_is_carried_out_after_a_later_crash_and_never_asked_again(b: Backend) {
    let env = StoreDir::with_graph_on(b, TWO_EFFECTS);
    // Small inline values: the supplied path is stored as an artifact of the run.
    let config = std::fs::read_to_string(env.path().join("heddle.toml")).unwrap();
    std::fs::write(
        env.path().join("heddle.toml"),
        config.replace("[store]\n", "[store]\ninline_output_bytes = 64\n"),
    )
    .unwrap();
    let (id, event) = reconcile_pause(&env, "w1");
    let long = format!("/data/{}", "x".repeat(200));
    std::fs::write(
        env.path().join("outputs.json"),
        serde_json::json!({"path": long, "bytes": 4}).to_string(),
    )
    .unwrap();
    // The answer is recorded, then the process dies after `w2` recorded its start.
    let o = env
        .cmd(&[
            "runs",
            "resume",
            &id,
            "--pause",
            &event.to_string(),
            "--completed-with",
            "outputs.json",
            "--note",
            "one line is there",
        ])
        .env("HEDDLE_FAULT", "after-start:w2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), None, "not aborted:\n{}", text(&o));
    assert_eq!(env.lines(), Vec::<String>::new());
    let show = env.show(&id);
    assert_eq!(show["state"], "interrupted", "{show:#}");
    assert_eq!(occurrence(&show, "w1")["reconciled"]["answer"], "completed");

    // Recovery carries the answer out: it pauses at `w2`, never at `w1` again, and the
    // value it feeds `w2` is the one supplied (read back from its artifact).
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, PAUSED);
    let second = pause_event(&o);
    let show = env.show(&id);
    assert_eq!(show["pause"]["occurrence"]["node"], "w2", "{show:#}");
    assert_eq!(
        occurrence(&show, "w1")["result"]["outputs"][0][1],
        serde_json::json!(long)
    );
    assert_eq!(env.lines(), Vec::<String>::new());

    // Skipped: `w2` does not run, what it feeds is skipped, the run ends.
    let o = env.heddle(&[
        "runs",
        "resume",
        &id,
        "--pause",
        &second.to_string(),
        "--skip",
        "--by",
        "bob",
        "--note",
        "the second line must not be written",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(&o)));
    assert_eq!(
        report["nodes"]["w2"]["skip_reason"],
        "reconciled",
        "{report:#}\n{}",
        text(&o)
    );
    assert_eq!(env.lines(), Vec::<String>::new(), "an answered node ran");
    let show = env.show(&id);
    assert!(
        ["completed", "failed"].contains(&show["state"].as_str().unwrap()),
        "{show:#}"
    );
    let w2 = occurrence(&show, "w2");
    assert_eq!(w2["reconciled"]["answer"], "skipped", "{show:#}");
    assert_eq!(w2["reconciled"]["by"], "bob");
    assert_eq!(show["skipped"]["w2"], "reconciled", "{show:#}");
    assert_eq!(show["skipped"]["up"], "upstream_skipped", "{show:#}");
    // Each answer is one record; nothing asked or ran twice.
    let answers = env.records_of("reconciled");
    assert_eq!(answers.len(), 2, "{answers:#?}");
}

/// A wrong answer names what is wrong, exits 2 and writes nothing: outputs that are not
/// the node's declared outputs and types, a file that is not an outputs object, both
/// answers at once, no note, no pause named, a value holding a known secret, a pause
/// that is not a reconcile pause.
fn a_wrong_answer_to_a_reconcile_pause_is_refused_and_writes_nothing(b: Backend) {
    const SECRET: &str = "s3cr3t-reconcile-value";
    let env = StoreDir::with_graph_on(b, CHAIN);
    let config = std::fs::read_to_string(env.path().join("heddle.toml")).unwrap();
    std::fs::write(
        env.path().join("heddle.toml"),
        format!("{config}\n[secrets]\nvalues = {{ TOKEN = \"{SECRET}\" }}\n"),
    )
    .unwrap();
    let (id, event) = reconcile_pause(&env, "w");
    let pause = event.to_string();
    let before = env.show(&id)["records"].clone();
    let refused = |args: &[&str], says: &[&str]| {
        let mut all = vec!["runs", "resume", id.as_str()];
        all.extend_from_slice(args);
        let o = env.heddle(&all);
        expect(&o, INVALID);
        for s in says {
            assert!(stderr(&o).contains(s), "expected `{s}`:\n{}", text(&o));
        }
        assert_eq!(env.show(&id)["records"], before, "{args:?} wrote");
        assert_eq!(env.lines(), Vec::<String>::new());
    };
    let file = |name: &str, body: &str| {
        std::fs::write(env.path().join(name), body).unwrap();
    };
    file("missing.json", r#"{"path": "/data/log.txt"}"#);
    file("typed.json", r#"{"path": 7, "bytes": 4}"#);
    file(
        "extra.json",
        r#"{"path": "/data/log.txt", "bytes": 4, "size": 1}"#,
    );
    file("list.json", r#"["/data/log.txt"]"#);
    file("broken.json", "{\"path\": \n");
    file("ok.json", r#"{"path": "/data/log.txt", "bytes": 4}"#);
    file(
        "secret.json",
        &format!(r#"{{"path": "/data/{SECRET}", "bytes": 4}}"#),
    );
    let answer = |f: &'static str| {
        [
            "--pause",
            pause.as_str(),
            "--completed-with",
            f,
            "--note",
            "n",
        ]
        .map(String::from)
    };
    let run = |args: [String; 6], says: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, says)
    };
    run(
        answer("missing.json"),
        &[
            "node `w`",
            "output `bytes` (int) is missing",
            "nothing was written",
        ],
    );
    run(answer("typed.json"), &["node `w`", "output `path`"]);
    run(
        answer("extra.json"),
        &["`size` is not an output of this node"],
    );
    run(
        answer("list.json"),
        &["list.json", "expected a JSON object", "a list"],
    );
    run(
        answer("broken.json"),
        &["broken.json", "not JSON", "line 2"],
    );
    run(
        answer("secret.json"),
        &["KNOWN_SECRET", "nothing was written"],
    );
    assert!(!env.store_holds(SECRET), "the secret reached the store");
    refused(
        &[
            "--pause",
            &pause,
            "--completed-with",
            "ok.json",
            "--skip",
            "--note",
            "n",
        ],
        &["cannot be used with"],
    );
    refused(&["--pause", &pause, "--skip"], &["--note"]);
    refused(&["--skip", "--note", "n"], &["--pause"]);
    refused(&["--pause", &pause, "--note", "n"], &["--completed-with"]);
    refused(
        &["--pause", &pause, "--skip", "--note", "   "],
        &["a note saying why"],
    );
    refused(
        &["--pause", "999", "--skip", "--note", "n"],
        &[&format!(
            "Resume expected pause event \"999\" but found \"{event}\""
        )],
    );

    // A pause that is not a reconcile pause: a gate's.
    let gated = StoreDir::with_graph_on(b, support::store::GATED);
    let o = gated.heddle(&["run", "--durable", "g.json"]);
    expect(&o, PAUSED);
    let gid = run_id(&o);
    let gate_pause = pause_event(&o).to_string();
    let records = gated.show(&gid)["records"].clone();
    let o = gated.heddle(&[
        "runs",
        "resume",
        &gid,
        "--pause",
        &gate_pause,
        "--skip",
        "--note",
        "n",
    ]);
    expect(&o, INVALID);
    assert!(
        stderr(&o).contains(&format!("run {gid} is not paused for reconciliation")),
        "{}",
        text(&o)
    );
    assert_eq!(gated.show(&gid)["records"], records);
}

/// `order` sent by `node_type` (`method`) to the test server, its answer the output.
fn http_graph(node_type: &str, method: &str, port: u16) -> String {
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "order", "type": "heddle.constant", "properties": {{"value": {value}}}}},
    {{"id": "call", "type": "{node_type}", "properties": {{"url": "http://127.0.0.1:{port}/orders", "method": "{method}"}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [
    {{"source": "order", "sourceHandle": "value", "target": "call", "targetHandle": "{input}"}},
    {{"source": "call", "sourceHandle": "value", "target": "out", "targetHandle": "value"}}
  ]
}}"#,
        input = if node_type == "http.json" {
            "body"
        } else {
            "headers"
        },
        value = if node_type == "http.json" {
            r#"{"item": "tea", "qty": 2}"#
        } else {
            r#"{"x-item": "tea"}"#
        }
    )
}

/// Kills `heddle run --durable` while its request is at the server (answered only
/// later), and returns the run id.
fn kill_mid_request(env: &StoreDir, srv: &support::http::HttpServer) -> String {
    let (mut child, lines) = env.spawn(&["run", "--durable", "g.json"]);
    srv.wait_for(1);
    child.kill().unwrap();
    child.wait().unwrap();
    lines
        .try_iter()
        .find_map(|l| support::store::run_id_in(&l))
        .expect("the run id was printed before the node ran")
}

/// A request that is not retry-safe (a POST, `http.json`) has its start on disk before
/// it goes out: a crash while it is in flight pauses the run for a person, and the
/// server, which counts what arrives, never receives it twice unless that person says
/// so.
fn a_post_cut_off_by_a_crash_pauses_instead_of_being_sent_again(b: Backend) {
    let srv = support::http::HttpServer::start(200, r#"{"order": 17}"#, true);
    let env = StoreDir::with_graph_on(b, &http_graph("http.json", "POST", srv.port)).with_config(
        &format!(
            "\n[packages.http]\nnetwork = [\"http://127.0.0.1:{}\"]\n",
            srv.port
        ),
    );
    let id = kill_mid_request(&env, &srv);
    assert_eq!(srv.requests()[0].method, "POST");
    assert_eq!(srv.requests()[0].body, r#"{"item":"tea","qty":2}"#);

    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, PAUSED);
    assert_eq!(env.show(&id)["pause"]["why"], "reconcile");
    assert_eq!(srv.count(), 1, "recovery sent the POST again");

    srv.release();
    let event = pause_event(&o).to_string();
    let o = env.heddle(&["runs", "resume", &id, "--pause", &event, "--json"]);
    expect(&o, OK);
    assert_eq!(outputs(&o)["out"], serde_json::json!([{"order": 17}]));
    assert_eq!(srv.count(), 2, "the person's resume offers it once more");
}

/// A GET (`http.get_json`, retry-safe) lost in a crash is simply run again.
fn a_get_cut_off_by_a_crash_runs_again_on_resume(b: Backend) {
    let srv = support::http::HttpServer::start(200, r#"{"stock": 3}"#, true);
    let env = StoreDir::with_graph_on(b, &http_graph("http.get_json", "GET", srv.port))
        .with_config(&format!(
            "\n[packages.http]\nnetwork = [\"http://127.0.0.1:{}\"]\n",
            srv.port
        ));
    let id = kill_mid_request(&env, &srv);
    srv.release();
    let o = env.heddle(&["runs", "resume", &id, "--json"]);
    expect(&o, OK);
    assert_eq!(outputs(&o)["out"], serde_json::json!([{"stock": 3}]));
    assert_eq!(srv.count(), 2);
}
