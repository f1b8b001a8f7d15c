//! A fan-out into one node that is not retry-safe and runs its invocations together
//! (`files.write_text` declares it): the starts of the invocations that run at once are
//! written in one synced commit, their results committed in groups. The real binary is
//! aborted at the write-ahead boundaries and killed with SIGKILL at random moments, in
//! the middle of a group too, and the effects are counted where they land (the lines
//! appended to `data/log.txt`), against the log as the store holds it at the kill:
//!
//! - no effect without a durable start: every line written belongs to an item whose
//!   start record was on disk;
//! - a recorded result is never run again: an item whose result was on disk at the kill
//!   is appended exactly once in the end, however many resumes follow;
//! - nothing is lost: after resuming (re-offering each uncertain item, the user's
//!   decision) every item is written, only re-offered ones possibly twice.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use support::store::{Backend, PAUSED, StoreDir, expect, kill_moments, pause_event, report, text};
use support::{OK, stderr};

// On a store file and on PostgreSQL (whose group commit is its own).
crate::both!(
    a_fan_out_of_effects_runs_together_and_writes_each_item_once,
    aborts_inside_a_group_keep_the_crash_table,
    random_sigkills_inside_groups_lose_nothing_and_rerun_no_recorded_result,
    a_dispatch_budget_stops_a_group_at_the_item_it_cannot_admit,
);

fn item_line(i: usize) -> String {
    format!("item-{i}")
}

/// `items` lines → `each` → `w` (appends each to /data/log.txt) → `all` → `out`.
fn graph(items: usize) -> String {
    let items: Vec<String> = (0..items).map(|i| format!("{}\n", item_line(i))).collect();
    serde_json::json!({
        "format": "heddle.graph", "version": 1,
        "nodes": [
            {"id": "c", "type": "heddle.constant", "properties": {"value": items}},
            {"id": "each", "type": "heddle.foreach"},
            {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
            {"id": "all", "type": "heddle.collect"},
            {"id": "out", "type": "heddle.output"}
        ],
        "edges": [
            {"source": "c", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
            {"source": "each", "sourceHandle": "item", "target": "w", "targetHandle": "text"},
            {"source": "w", "sourceHandle": "bytes", "target": "all", "targetHandle": "item"},
            {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}
        ]
    })
    .to_string()
}

/// The item an occurrence of `w` is about (its key is `each:item=N`).
fn item_of(r: &heddle_core::Record) -> usize {
    let key = &r.occurrence().expect("a record of w").key;
    key.rsplit('=')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected key {key}"))
}

/// What the store holds about `w`: the items with a start record, and with a result.
fn logged(d: &StoreDir) -> (BTreeSet<usize>, BTreeSet<usize>) {
    let of = |kind: &str| -> BTreeSet<usize> {
        d.records_of(kind)
            .iter()
            .filter(|r| r.occurrence().is_some_and(|o| o.node == "w"))
            .map(item_of)
            .collect()
    };
    (of("started"), of("completed"))
}

/// How many times each item was appended.
fn effects(d: &StoreDir) -> BTreeMap<usize, usize> {
    let mut out = BTreeMap::new();
    for line in d.lines() {
        let i = line
            .strip_prefix("item-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        *out.entry(i).or_insert(0) += 1;
    }
    out
}

/// Checks the crash invariants for a run of `items` killed or aborted at `what`, then
/// resumes it until it completes and checks what the resumes did.
fn check_after_crash(d: &StoreDir, run: &str, items: usize, what: &str) {
    let (started, completed) = logged(d);
    let before = effects(d);
    for (i, n) in &before {
        assert!(
            started.contains(i),
            "{what}: item {i} was written without a durable start"
        );
        assert_eq!(
            *n, 1,
            "{what}: item {i} written {n} times before any resume"
        );
    }
    assert!(
        completed.is_subset(&started),
        "{what}: a result without a start"
    );
    let mut pause: Option<u64> = None;
    let mut reoffered = BTreeSet::new();
    let mut done = false;
    for _ in 0..(items + 5) {
        let p = pause.map(|p| p.to_string());
        let mut args = vec!["runs", "resume", run, "--json"];
        if let Some(p) = &p {
            args.extend(["--pause", p.as_str()]);
        }
        let o = d.heddle(&args);
        match o.status.code() {
            Some(OK) => {
                let list = &report(&o)["outputs"]["out"][0];
                assert_eq!(list.as_array().map(Vec::len), Some(items), "{what}: {list}");
                done = true;
                break;
            }
            Some(PAUSED) => {
                let e = stderr(&o);
                let item = e
                    .split("node w[each:item=")
                    .nth(1)
                    .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or_else(|| panic!("{what}: a pause not about w:\n{}", text(&o)));
                assert!(
                    started.contains(&item) && !completed.contains(&item),
                    "{what}: paused on item {item}, which was not uncertain"
                );
                reoffered.insert(item);
                pause = Some(pause_event(&o));
            }
            // The killed process had recorded the ending already.
            Some(2) if e_contains(&o, "is completed") => {
                done = true;
                break;
            }
            _ => panic!("{what}: {}", text(&o)),
        }
    }
    assert!(done, "{what}: no end in sight");
    let after = effects(d);
    for i in 0..items {
        let n = after.get(&i).copied().unwrap_or(0);
        assert!(n >= 1, "{what}: item {i} lost");
        if completed.contains(&i) || !started.contains(&i) {
            assert_eq!(
                n,
                before.get(&i).copied().unwrap_or(0).max(1),
                "{what}: item {i} (result recorded: {}) ran again",
                completed.contains(&i)
            );
        } else {
            assert!(
                n <= 1 + usize::from(reoffered.contains(&i)),
                "{what}: uncertain item {i} written {n} times, re-offered: {}",
                reoffered.contains(&i)
            );
        }
    }
}

fn e_contains(o: &std::process::Output, s: &str) -> bool {
    stderr(o).contains(s)
}

/// An uninterrupted run writes every item once, in far fewer synced commits than
/// invocations (the starts of those that ran together shared one).
fn a_fan_out_of_effects_runs_together_and_writes_each_item_once(b: Backend) {
    let d = StoreDir::with_graph_on(b, &graph(120));
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    assert_eq!(effects(&d).len(), 120);
    assert!(effects(&d).values().all(|n| *n == 1));
    let (started, completed) = logged(&d);
    assert_eq!((started.len(), completed.len()), (120, 120));
}

/// Aborted at the named boundaries inside a group: after the group's starts are on disk
/// (no code ran), inside the commit of a start (it never committed), after a result was
/// appended (the others of the group ran too).
fn aborts_inside_a_group_keep_the_crash_table(b: Backend) {
    for fault in [
        "after-start:w",
        "after-start:w:3",
        "mid-commit:w:7",
        "after-result:w:2",
        "after-result:w:20",
    ] {
        let d = StoreDir::with_graph_on(b, &graph(24));
        let run = d.crash(fault, &[]);
        check_after_crash(&d, &run, 24, fault);
    }
}

/// SIGKILL at random moments over the run's length, so rounds die before, between and
/// in the middle of groups.
fn random_sigkills_inside_groups_lose_nothing_and_rerun_no_recorded_result(b: Backend) {
    let t0 = std::time::Instant::now();
    const ITEMS: usize = 60;
    let probe = StoreDir::with_graph_on(b, &graph(ITEMS));
    expect(&probe.heddle(&["run", "--durable", "g.json"]), OK);
    let span_ms = t0.elapsed().as_millis() as u64 + 1;
    let mut next = kill_moments();
    for round in 0..8 {
        let d = StoreDir::with_graph_on(b, &graph(ITEMS));
        let what = format!("round {round}");
        let delay = std::time::Duration::from_millis(next() % span_ms);
        let Some(run) = d.run_killed_after(delay) else {
            continue;
        };
        eprintln!("{what}: killed with {} lines written", d.lines().len());
        check_after_crash(&d, &run, ITEMS, &what);
    }
}

/// The dispatch budget holds inside a group: items past it are refused before they
/// start (the run ends failed, exit 6), and every item written was admitted and
/// started.
fn a_dispatch_budget_stops_a_group_at_the_item_it_cannot_admit(b: Backend) {
    let d = StoreDir::with_graph_on(b, &graph(24));
    let o = d.heddle(&["run", "--durable", "--max-dispatches", "10", "g.json"]);
    expect(&o, support::store::LIMIT);
    let (started, completed) = logged(&d);
    let written: BTreeSet<usize> = effects(&d).into_keys().collect();
    // The constant, foreach and collect are not journaled: every dispatch is `w`'s.
    assert_eq!(started.len(), 10, "{started:?}");
    assert_eq!(written, started, "written exactly the items admitted");
    assert_eq!(completed, started);
    assert!(effects(&d).values().all(|n| *n == 1));
}
