//! A stored run is verified before anything uses it: its header (graph document, plan,
//! inputs, limits, package digests) is checksummed per field, and one flipped byte in
//! the store file makes every takeover (resume, approve, a watchdog's resume) and every
//! display (`runs show`, `runs status`) refuse with exit 9, naming the run and the
//! field, running nothing and writing nothing. Effects are counted in the file the
//! non-retry-safe node appends to. A store from before the checksums is upgraded in
//! place, and says so.

mod support;

use support::store::{CHAIN, GATED, StoreDir, expect, run_id, text};
use support::{OK, SUSPENDED};

const DAMAGED: i32 = 9;

/// Replaces the first `from` in `run`'s stored `column` with `to` (same length), as a
/// flipped byte on disk would.
fn damage(d: &StoreDir, run: &str, column: &str, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let c = rusqlite::Connection::open(d.db()).unwrap();
    let bytes: Vec<u8> = c
        .query_row(
            &format!("SELECT CAST({column} AS BLOB) FROM runs WHERE run_id = ?1"),
            [run],
            |r| r.get(0),
        )
        .unwrap();
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| {
            panic!(
                "no {from:?} in {column}: {}",
                String::from_utf8_lossy(&bytes)
            )
        });
    let mut changed = bytes.clone();
    changed[at..at + to.len()].copy_from_slice(to.as_bytes());
    let sql = format!("UPDATE runs SET {column} = ?2 WHERE run_id = ?1");
    if column == "graph_bytes" {
        c.execute(&sql, rusqlite::params![run, changed]).unwrap();
    } else {
        let t = String::from_utf8(changed).unwrap();
        c.execute(&sql, rusqlite::params![run, t]).unwrap();
    }
}

/// Every byte of the store (its file and write-ahead log).
fn store_bytes(d: &StoreDir) -> Vec<u8> {
    let mut all = Vec::new();
    for f in ["runs.db", "runs.db-wal"] {
        if let Ok(b) = std::fs::read(d.path().join(f)) {
            all.extend(b);
        }
    }
    all
}

#[track_caller]
fn refused(d: &StoreDir, args: &[&str], run: &str, field: &str) {
    let before = store_bytes(d);
    let o = d.heddle(args);
    expect(&o, DAMAGED);
    let e = support::stderr(&o);
    assert!(
        e.contains(&format!("run {run}"))
            && e.contains(&format!("`{field}`"))
            && e.contains("RUN_DAMAGED"),
        "{args:?}: {}",
        text(&o)
    );
    assert_eq!(store_bytes(d), before, "{args:?} changed the store");
}

/// The stored graph altered after a crash (the constant `w` appends, changed): the
/// resume refuses instead of running the altered graph, and so does showing the run.
#[test]
fn an_altered_stored_graph_is_refused_not_run() {
    let d = StoreDir::with_graph(CHAIN);
    let run = d.crash("after-start:w", &[]);
    damage(&d, &run, "graph_bytes", "one", "One");
    refused(&d, &["runs", "resume", &run], &run, "graph_bytes");
    refused(&d, &["runs", "show", &run, "--json"], &run, "graph_bytes");
    refused(&d, &["runs", "status", &run], &run, "graph_bytes");
    refused(&d, &["runs", "cancel", &run], &run, "graph_bytes");
    refused(
        &d,
        &["runs", "resume", "--watchdog", &run],
        &run,
        "graph_bytes",
    );
    assert!(d.lines().is_empty(), "nothing ran: {:?}", d.lines());
}

/// A dispatch budget raised by a flipped byte (5 → 9) is refused, not spent.
#[test]
fn altered_stored_limits_are_refused() {
    let d = StoreDir::with_graph(CHAIN);
    let run = d.crash("after-start:w", &["--max-dispatches", "5"]);
    damage(
        &d,
        &run,
        "limits",
        "\"max_dispatches\":5",
        "\"max_dispatches\":9",
    );
    refused(&d, &["runs", "resume", &run], &run, "limits");
    assert!(d.lines().is_empty());
}

/// A run waiting at a gate whose stored plan was altered: the approval is refused.
#[test]
fn an_approval_of_a_damaged_run_is_refused() {
    let d = StoreDir::with_graph(GATED);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let run = run_id(&o);
    damage(&d, &run, "plan", "ship", "shiq");
    refused(&d, &["runs", "approve", &run, "ship"], &run, "plan");
}

/// A store written before headers were checksummed (schema 5: no `header_sums`)
/// upgrades when first opened, says so, and its runs resume as before.
#[test]
fn a_store_from_before_the_checksums_is_upgraded_and_says_so() {
    let d = StoreDir::with_graph(GATED);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let run = run_id(&o);
    {
        let c = rusqlite::Connection::open(d.db()).unwrap();
        c.execute_batch("ALTER TABLE runs DROP COLUMN header_sums;")
            .unwrap();
        c.pragma_update(None, "user_version", 5).unwrap();
    }
    let o = d.heddle(&["runs", "list"]);
    expect(&o, OK);
    assert!(
        support::stderr(&o).contains(
            "upgraded from schema version 5 to 8; checksummed the stored headers of 1 run(s)"
        ),
        "{}",
        text(&o)
    );
    let o = d.heddle(&["runs", "approve", &run, "ship", "--json"]);
    expect(&o, OK);
    assert!(!support::stderr(&o).contains("upgraded"), "{}", text(&o));
}
