//! A crash between an artifact's commit and the commit of the record pointing at it
//! leaves a blob nothing refers to. With the real binary aborted at exactly that point
//! (`HEDDLE_FAULT=after-artifact:NODE`) and the SQLite file read directly: taking the
//! run over drops the orphan, so it neither counts against the run's artifact quota nor
//! stays in the store.

mod support;

use support::store::{StoreDir, expect, report};
use support::{OK, SUSPENDED};

const BIG: usize = 20_000;

/// `big` prints 20,000 `x` the first time and 20,000 `y` after (it leaves `mark`), so
/// its second result is a different artifact of the same size.
fn graph(mark: &std::path::Path) -> String {
    let code = serde_json::to_string(&format!(
        "if [ -e {m} ]; then c=y; else touch {m}; c=x; fi; head -c {BIG} /dev/zero | tr '\\0' $c; echo",
        m = mark.display()
    ))
    .unwrap();
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "big", "type": "code.bash", "properties": {{"code": {code}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [{{"source": "big", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]
}}"#
    )
}

/// The run's artifacts as stored: (sha256, size).
fn artifacts(d: &StoreDir, run: &str) -> Vec<(String, i64)> {
    let db = rusqlite::Connection::open(d.db()).unwrap();
    let mut q = db
        .prepare("SELECT sha256, size FROM artifacts WHERE run_id = ?1 ORDER BY sha256")
        .unwrap();
    q.query_map([run], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn an_artifact_orphaned_by_a_crash_is_dropped_when_the_run_is_taken_over() {
    let d = StoreDir::new();
    let mark = d.path().join("mark");
    support::write(d.path(), "g.json", &graph(&mark));
    // Room for one of the two values, not both: an orphan still counted would refuse
    // the second.
    support::write(
        d.path(),
        "heddle.toml",
        &format!(
            "{}inline_output_bytes = 4096\nmax_artifact_bytes = 25000\nmax_run_artifact_bytes = 30000\n",
            support::store::CONFIG
        ),
    );
    let run = d.crash("after-artifact:big", &[]);
    let orphan = artifacts(&d, &run);
    assert_eq!(orphan.len(), 1, "the first value's artifact committed");
    assert_eq!(orphan[0].1, (BIG + 2) as i64);

    // Recovery finds `big` started without a result; not retry-safe work waits for an
    // explicit resume, which offers it again.
    let mut o = d.heddle(&["runs", "resume", &run, "--json"]);
    for _ in 0..2 {
        if o.status.code() != Some(SUSPENDED) {
            break;
        }
        o = d.heddle(&["runs", "resume", &run, "--json"]);
    }
    expect(&o, OK);
    let r = report(&o);
    // The second run's value (not printed: 20,000 characters).
    let value = r["outputs"]["out"].to_string();
    assert!(
        value.contains(&"y".repeat(BIG)) && !value.contains('x'),
        "outputs: {:.200}",
        value
    );
    let kept = artifacts(&d, &run);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_ne!(kept[0].0, orphan[0].0, "the orphan was dropped");
}
