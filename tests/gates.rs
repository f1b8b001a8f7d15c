//! Gate nodes with the real `heddle` binary and a real run store: a durable run pauses
//! at a gate, `heddle runs approve` runs on from it, `heddle runs reject` cancels the run
//! with the gate's title and note, and a run that is not durable suspends saying so.

mod support;

use std::path::Path;

use support::store::run_id;
use support::*;

const CONFIG: &str = "[store]\npath = \"runs.db\"\n";

/// A value reviewed at gate `ship`, then upper-cased; an independent branch beside it.
const GATED: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "release notes"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it", "prompt": "Read the notes"}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

// On a store file and on PostgreSQL.
crate::both!(
    approving_a_gate_runs_on_from_it_with_its_value,
    rejecting_a_gate_cancels_the_run_with_its_title_and_note,
    an_unknown_gate_is_refused_naming_it_and_nothing_is_written,
    one_approval_opens_a_gate_for_every_item_of_a_fan_out,
);

/// [`CONFIG`] with the runs on `b`: on PostgreSQL a fresh database (`[store] url`).
fn config(b: Backend) -> String {
    match b {
        Backend::Sqlite => CONFIG.to_string(),
        Backend::Postgres => format!("{CONFIG}url = \"{}\"\n", pg::fresh_database()),
    }
}

fn setup(b: Backend) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "heddle.toml", &config(b));
    write(dir.path(), "g.json", GATED);
    dir
}

fn show(dir: &Path, run: &str) -> serde_json::Value {
    let o = heddle_in(dir, &["runs", "show", run, "--json"]);
    expect_code(&o, OK);
    json(&o)
}

/// The verdicts recorded on node `node`'s occurrences.
fn verdicts(view: &serde_json::Value, node: &str) -> Vec<serde_json::Value> {
    view["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["occurrence"]["node"] == node)
        .flat_map(|o| o["verdicts"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// A durable run paused at the gate: its id.
fn paused_at_gate(dir: &Path) -> String {
    let o = heddle_in(dir, &["run", "--durable", "g.json"]);
    expect_code(&o, SUSPENDED);
    let e = stderr(&o);
    assert!(
        e.contains("gate \"Ship it\" awaits a decision: Read the notes"),
        "{e}"
    );
    let run = run_id(&o);
    assert!(
        e.contains(&format!("heddle runs approve {run} ship")),
        "{e}"
    );
    assert!(stdout(&o).is_empty() || !stdout(&o).contains("RELEASE"));
    run
}

fn approving_a_gate_runs_on_from_it_with_its_value(b: Backend) {
    let dir = setup(b);
    let run = paused_at_gate(dir.path());
    let view = show(dir.path(), &run);
    assert_eq!(view["state"], "paused");
    assert_eq!(view["pause"]["node"], "ship");
    // Nothing below the gate ran.
    assert!(
        !view["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["occurrence"]["node"] == "up")
    );

    // A plain resume would only pause at the gate again: it is refused, naming the way.
    let o = heddle_in(dir.path(), &["runs", "resume", &run]);
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains(&format!("heddle runs approve {run} ship")),
        "{}",
        stderr(&o)
    );
    let o = heddle_in(
        dir.path(),
        &[
            "runs",
            "approve",
            &run,
            "ship",
            "--note",
            "looks right",
            "--json",
        ],
    );
    expect_code(&o, OK);
    assert_eq!(
        json(&o)["outputs"]["out"],
        serde_json::json!(["RELEASE NOTES"])
    );
    let view = show(dir.path(), &run);
    assert_eq!(view["state"], "completed");
    assert_eq!(
        verdicts(&view, "ship"),
        [serde_json::json!({"verdict": "approve", "note": "looks right"})]
    );
    assert_eq!(view["pause"], serde_json::Value::Null, "{view:#}");
    // `up` (a std node) cannot spend: no usage is claimed for it, known or not.
    assert_eq!(view["usage"], serde_json::json!({}), "{view:#}");
    let text = stdout(&heddle_in(dir.path(), &["runs", "show", &run]));
    assert!(
        text.contains("ship                           approved (gate)"),
        "{text}"
    );
    assert!(
        !text.contains("dispatched") && !text.contains("starts 0"),
        "{text}"
    );
    assert!(!text.contains("usage"), "{text}");
    // Answered once: the finished run has no gate waiting any more.
    let o = heddle_in(dir.path(), &["runs", "approve", &run, "ship"]);
    expect_code(&o, INVALID);
    no_panic(&o);
}

fn rejecting_a_gate_cancels_the_run_with_its_title_and_note(b: Backend) {
    let dir = setup(b);
    let run = paused_at_gate(dir.path());
    // The note is required: a rejection is a decision someone reads.
    let o = heddle_in(dir.path(), &["runs", "reject", &run, "ship"]);
    expect_code(&o, INVALID);
    let o = heddle_in(
        dir.path(),
        &["runs", "reject", &run, "ship", "--note", "not this week"],
    );
    expect_code(&o, OK);
    let view = show(dir.path(), &run);
    assert_eq!(view["state"], "cancelled");
    assert_eq!(view["error"], "gate \"Ship it\" rejected: not this week");
    // The rejection ended the run: the pause it was answered from is closed.
    assert_eq!(view["pause"], serde_json::Value::Null, "{view:#}");
    assert_eq!(
        verdicts(&view, "ship"),
        [serde_json::json!({"verdict": "reject", "note": "not this week"})]
    );
    assert!(
        !view["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["occurrence"]["node"] == "up")
    );
    let text = heddle_in(dir.path(), &["runs", "show", &run]);
    assert!(
        stdout(&text).contains("cancelled (gate rejected)"),
        "{}",
        stdout(&text)
    );
    assert!(!stdout(&text).contains("pause "), "{}", stdout(&text));
    // A cancelled run cannot be resumed past the gate.
    let o = heddle_in(dir.path(), &["runs", "approve", &run, "ship"]);
    expect_code(&o, INVALID);
}

fn an_unknown_gate_is_refused_naming_it_and_nothing_is_written(b: Backend) {
    let dir = setup(b);
    let run = paused_at_gate(dir.path());
    let before = show(dir.path(), &run)["records"].clone();
    for (gate, says) in [("nope", "no gate `nope`"), ("up", "no gate `up`")] {
        let o = heddle_in(dir.path(), &["runs", "approve", &run, gate]);
        expect_code(&o, INVALID);
        no_panic(&o);
        let e = stderr(&o);
        assert!(e.contains(says) && e.contains("its gates: ship"), "{e}");
        let o = heddle_in(dir.path(), &["runs", "reject", &run, gate, "--note", "x"]);
        expect_code(&o, INVALID);
    }
    let o = heddle_in(dir.path(), &["runs", "approve", "no-such-run", "ship"]);
    expect_code(&o, INVALID);
    assert_eq!(show(dir.path(), &run)["records"], before);
}

#[test]
fn a_gate_in_a_run_that_is_not_durable_suspends_saying_answering_needs_one() {
    let dir = setup(Backend::Sqlite);
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect_code(&o, SUSPENDED);
    let e = stderr(&o);
    assert!(e.contains("gate \"Ship it\" awaits a decision"), "{e}");
    assert!(e.contains("needs a durable run"), "{e}");
    let o = heddle_in(dir.path(), &["run", "g.json", "--json"]);
    expect_code(&o, SUSPENDED);
    let r = json(&o);
    assert_eq!(r["outcome"], "suspended");
    assert_eq!(r["nodes"]["ship"]["status"], "suspended");
    assert_eq!(r["nodes"]["up"]["status"], "skipped");
}

#[test]
fn the_gate_example_pauses_then_announces_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "heddle.toml", CONFIG);
    let example = std::fs::read_to_string(root().join("examples/gate.json")).unwrap();
    write(dir.path(), "g.json", &example);
    let o = heddle_in(dir.path(), &["run", "--durable", "g.json"]);
    expect_code(&o, SUSPENDED);
    let run = run_id(&o);
    let o = heddle_in(
        dir.path(),
        &["runs", "approve", &run, "approve_release", "--json"],
    );
    expect_code(&o, OK);
    assert_eq!(
        json(&o)["outputs"]["announcement"],
        serde_json::json!(["RELEASE 1.2: FASTER GRAPHS"])
    );
}

/// The example with every declaration in one graph: the diamond and the check run, the
/// result waits at the gate, and the approval releases exactly what the check passed.
#[test]
fn the_review_example_runs_diamond_fields_and_check_then_waits_at_its_gate() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "heddle.toml", CONFIG);
    let example = std::fs::read_to_string(root().join("examples/review.json")).unwrap();
    write(dir.path(), "g.json", &example);
    let o = heddle_in(dir.path(), &["run", "--durable", "g.json"]);
    expect_code(&o, SUSPENDED);
    let run = run_id(&o);
    assert!(
        stderr(&o).contains(&format!("heddle runs approve {run} release")),
        "{}",
        stderr(&o)
    );
    let view = show(dir.path(), &run);
    assert_eq!(view["pause"]["node"], "release", "{view:#}");
    let o = heddle_in(dir.path(), &["runs", "approve", &run, "release", "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(
        v["outputs"]["triaged"],
        serde_json::json!([{"all": [
            {"id": "a1", "amount": 250}, {"id": "a2", "amount": 40}, {"id": "a3", "amount": 120}
        ]}]),
        "{v:#}"
    );
}

fn one_approval_opens_a_gate_for_every_item_of_a_fan_out(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "heddle.toml", &config(b));
    write(
        dir.path(),
        "g.json",
        r#"{"nodes": [
  {"id": "c", "type": "heddle.constant", "properties": {"value": ["a", "b", "c"]}},
  {"id": "each", "type": "heddle.foreach"},
  {"id": "review", "type": "heddle.gate", "properties": {"title": "Each item"}},
  {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
  {"id": "all", "type": "heddle.collect"},
  {"id": "out", "type": "heddle.output"}
], "edges": [
  {"source": "c", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
  {"source": "each", "sourceHandle": "item", "target": "review", "targetHandle": "value"},
  {"source": "review", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
  {"source": "up", "sourceHandle": "text", "target": "all", "targetHandle": "item"},
  {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}
]}"#,
    );
    let o = heddle_in(dir.path(), &["run", "--durable", "g.json"]);
    expect_code(&o, SUSPENDED);
    let run = run_id(&o);
    let o = heddle_in(dir.path(), &["runs", "approve", &run, "review", "--json"]);
    expect_code(&o, OK);
    assert_eq!(
        json(&o)["outputs"]["out"],
        serde_json::json!([["A", "B", "C"]])
    );
}

/// On a store file only: it uses the watchdog, which supervises runs in a store file.
#[test]
fn a_supervised_run_at_a_gate_says_to_answer_it_not_to_resume_it() {
    let dir = setup(Backend::Sqlite);
    let o = heddle_in(dir.path(), &["run", "--watchdog", "g.json"]);
    expect_code(&o, SUSPENDED);
    let e = stderr(&o);
    let run = run_id(&o);
    assert!(
        e.contains(&format!("approve with: heddle runs approve {run} ship")),
        "{e}"
    );
    assert!(!e.contains("resume with"), "{e}");
    // The watchdog let go of the run: the answer is taken and the run completes.
    let o = heddle_in(dir.path(), &["runs", "approve", &run, "ship"]);
    expect_code(&o, OK);
    assert_eq!(show(dir.path(), &run)["state"], "completed");
}
