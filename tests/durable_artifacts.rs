//! Large values of a run that is taken over, with the real binary: a value over the
//! inline limit lives in an artifact the log refers to, and every takeover (a resume
//! after a crash, a resume at a pause, a watchdog's replacement worker) must keep it.
//! Artifacts are counted in the SQLite file itself; effects in the file the
//! non-retry-safe node appends to.

mod support;

use std::time::Duration;

use support::store::{StoreDir, expect, pause_event, report, run_id_in, sigkill, wait_line};
use support::{OK, SUSPENDED};

/// Longer than the inline limit below (1024 bytes), so `up`'s result leaves the log.
const BIG: usize = 2048;

/// `c` (a constant: recomputed, never recorded) → `up` (WASM, retry-safe: its 2 KB
/// result is recorded, as a reference) → `w` (not retry-safe: appends it) → `out`
/// (the byte count only: the large value is no output of the graph).
fn graph() -> String {
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "c", "type": "heddle.constant", "properties": {{"value": "{x}\n"}}}},
    {{"id": "up", "type": "std.text.case", "properties": {{"mode": "upper"}}}},
    {{"id": "w", "type": "files.write_text", "properties": {{"path": "/data/log.txt", "append": true}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [
    {{"source": "c", "sourceHandle": "value", "target": "up", "targetHandle": "text"}},
    {{"source": "up", "sourceHandle": "text", "target": "w", "targetHandle": "text"}},
    {{"source": "w", "sourceHandle": "bytes", "target": "out", "targetHandle": "value"}}
  ]
}}"#,
        x = "x".repeat(BIG - 1)
    )
}

fn store_dir() -> StoreDir {
    let d = StoreDir::with_graph(&graph());
    support::write(
        d.path(),
        "heddle.toml",
        &format!("{}inline_output_bytes = 1024\n", support::store::CONFIG),
    );
    d
}

/// Whether every one of `before` is still among the run's artifacts.
#[track_caller]
fn assert_kept(d: &StoreDir, run: &str, before: &[String], what: &str) {
    let now = artifacts(d, run);
    assert!(
        before.iter().all(|a| now.contains(a)),
        "{what}: had {before:?}, now {now:?}"
    );
}

/// The run's artifacts as stored (sha256), read from the file.
fn artifacts(d: &StoreDir, run: &str) -> Vec<String> {
    let db = rusqlite::Connection::open(d.db()).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut q = db
        .prepare("SELECT sha256 FROM artifacts WHERE run_id = ?1 ORDER BY sha256")
        .unwrap();
    q.query_map([run], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The issue's repro: aborted right after `w`'s start, the run is recovered (it pauses
/// on `w`, whose effect is uncertain), then resumed at that pause. The artifact `up`'s
/// recorded result refers to survives both takeovers, so `runs show` reads it and the
/// resume feeds it to `w` (the appended line is the upper-cased value).
#[test]
fn taking_a_run_over_keeps_the_artifacts_its_log_refers_to() {
    let d = store_dir();
    let run = d.crash("after-start:w", &[]);
    let stored = artifacts(&d, &run);
    assert_eq!(stored.len(), 1, "up's result is an artifact");

    let o = d.heddle(&["runs", "resume", &run]);
    expect(&o, SUSPENDED);
    assert_kept(&d, &run, &stored, "recovery");
    let show = d.heddle(&["runs", "show", &run, "--json"]);
    expect(&show, OK);
    assert!(
        !support::stdout(&show).contains("$unreadable"),
        "{}",
        support::stdout(&show)
    );

    let pause = pause_event(&o).to_string();
    let o = d.heddle(&["runs", "resume", &run, "--pause", &pause, "--json"]);
    expect(&o, OK);
    assert_eq!(report(&o)["outputs"]["out"], serde_json::json!([BIG]));
    assert_kept(&d, &run, &stored, "the resume at the pause");
    // Aborted after its start and before its code: the re-offered attempt is the one
    // effect.
    assert_eq!(d.lines(), ["X".repeat(BIG - 1)]);
}

/// `slow` waits (the first time only: it leaves `mark`) so the worker can be killed
/// while it runs; it reports the length of the large value `big` gave it.
fn big_then_slow(mark: &std::path::Path) -> String {
    let code = |c: &str| serde_json::to_string(c).unwrap();
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "big", "type": "code.bash", "properties": {{"code": {big}, "mode": "subprocess"}}}},
    {{"id": "slow", "type": "code.bash", "properties": {{"code": {slow}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [
    {{"source": "big", "sourceHandle": "result", "target": "slow", "targetHandle": "input"}},
    {{"source": "slow", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}
  ]
}}"#,
        big = code(&format!("head -c {BIG} /dev/zero | tr '\\0' x; echo")),
        slow = code(&format!(
            "if [ ! -e {m} ]; then touch {m}; sleep 600; fi; echo ${{#input}}",
            m = mark.display()
        )),
    )
}

/// `watchdog: worker N running run ID (pid P)` → P.
fn worker_pid_in(line: &str) -> Option<i32> {
    let rest = line.strip_prefix("watchdog: worker ")?;
    let pid = rest.split("(pid ").nth(1)?.trim_end_matches(')');
    pid.parse().ok()
}

/// Under the watchdog, with the large value no output of the graph (so no final report
/// stores it again): the replacement of a worker killed while `slow` runs recovers
/// `big`'s result and pauses on `slow`; the artifact is still there, and resuming gives
/// `slow` the value.
#[test]
fn a_replacement_worker_keeps_the_artifacts_its_log_refers_to() {
    let d = store_dir();
    let mark = d.path().join("data/slow-started");
    support::write(d.path(), "g.json", &big_then_slow(&mark));
    let (child, rx) = d.spawn(&["run", "--watchdog", "--json", "g.json"]);
    let run = wait_line(&rx, run_id_in);
    let worker = wait_line(&rx, worker_pid_in);
    let t0 = std::time::Instant::now();
    while !mark.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "slow never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stored = artifacts(&d, &run);
    assert_eq!(stored.len(), 1, "big's result is an artifact");
    sigkill(worker);
    let o = child.wait_with_output().unwrap();
    expect(&o, SUSPENDED);
    // The worker's final report is an artifact of its own.
    assert_kept(&d, &run, &stored, "the replacement worker");

    let show = d.heddle(&["runs", "show", &run, "--json"]);
    expect(&show, OK);
    let pause = report(&show)["pause"]["event"]
        .as_u64()
        .unwrap()
        .to_string();
    let o = d.heddle(&[
        "runs",
        "resume",
        "--watchdog",
        &run,
        "--pause",
        &pause,
        "--json",
    ]);
    expect(&o, OK);
    // `echo ${#input}`: the length of the value `slow` was given (the code node reads
    // its printed number as one).
    assert_eq!(report(&o)["outputs"]["out"], serde_json::json!([BIG]));
}
