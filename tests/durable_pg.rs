//! Durable runs of the real `heddle` binary on a PostgreSQL run store (`[store] url`):
//! aborted at named write-ahead boundaries (`HEDDLE_FAULT`), resumed by another process
//! once the dead one's lease on the run expired, and the effects counted where they
//! land (the lines `files.write_text` appended to `data/log.txt`). The same crash table
//! as on SQLite (tests/durable.rs), and no store file is ever created. Several
//! `heddle serve` hosts sharing one database are in `hosts`.
//!
//! The server: `HEDDLE_TEST_PG_URL` (scripts/test starts one), else one started for
//! this binary by scripts/pg-up; each test gets a database of its own. Under `CI=true`
//! a test without a server fails.

use std::process::Output;
use std::time::{Duration, Instant};

mod support;
use support::pg;

/// Several `heddle serve` hosts on one database.
#[path = "durable_pg/hosts.rs"]
mod hosts;

use support::store::{
    CHAIN, FANOUT, INVALID, OK, PAUSED, StoreDir, expect, pause_event, run_id_in, text, wait_line,
};
use support::{CANCELLED, stderr};

/// `graph` in a directory whose `heddle.toml` puts the runs in a fresh database (the
/// `[store] path` it also names is never created); `None` when PostgreSQL tests are
/// skipped (`HEDDLE_SKIP_PG=1`, never under CI).
fn on_postgres(graph: &str, one_at_a_time: bool) -> Option<(StoreDir, String)> {
    if pg::skip_pg() {
        return None;
    }
    let url = pg::fresh_database();
    let mut env = StoreDir::with_graph(graph);
    if one_at_a_time {
        env = env.one_at_a_time();
    }
    let config = env.path().join("heddle.toml");
    let mut toml = std::fs::read_to_string(&config).unwrap();
    // `[store]` is the file's last section.
    toml.push_str(&format!("url = \"{url}\"\n"));
    std::fs::write(&config, toml).unwrap();
    Some((env, url))
}

/// `heddle runs resume ARGS`, at once: the process that died was of this machine, so
/// its lease (live for up to a TTL more) binds nobody, and nobody waits it out.
fn resume(env: &StoreDir, args: &[&str]) -> Output {
    let mut all = vec!["runs", "resume"];
    all.extend_from_slice(args);
    let o = env.heddle(&all);
    assert!(
        !stderr(&o).contains("is owned by host"),
        "a dead process's lease was waited out:\n{}",
        text(&o)
    );
    o
}

/// The `started` count of `node` in `heddle runs show --json`.
fn started(env: &StoreDir, id: &str, node: &str) -> u64 {
    let show = env.show(id);
    show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["occurrence"]["node"] == node)
        .unwrap_or_else(|| panic!("no occurrence of {node}: {show:#}"))["started"]
        .as_u64()
        .unwrap()
}

fn outputs(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)));
    v["outputs"].clone()
}

#[test]
fn a_durable_run_on_postgres_killed_at_each_boundary_resumes_without_repeating_an_effect() {
    // (fault, lines on disk after the crash): a completed write is never repeated; one
    // that never started is started on recovery.
    for (fault, after_crash) in [
        ("after-result:w", vec!["one"]),
        ("before-dispatch:w", vec![]),
        ("mid-commit:w", vec![]),
        ("after-result:up", vec!["one"]),
    ] {
        let Some((env, url)) = on_postgres(CHAIN, false) else {
            return;
        };
        let id = env.crash(fault, &[]);
        assert_eq!(env.lines(), after_crash, "{fault}");
        assert_eq!(env.show(&id)["state"], "interrupted", "{fault}");
        let o = resume(&env, &[&id, "--json"]);
        expect(&o, OK);
        assert_eq!(
            outputs(&o)["out"],
            serde_json::json!(["/DATA/LOG.TXT"]),
            "{fault}"
        );
        assert_eq!(env.lines(), ["one"], "{fault}");
        assert_eq!(started(&env, &id, "w"), 1, "{fault}");
        assert_eq!(env.show(&id)["state"], "completed", "{fault}");
        // The runs are in the database, listed from there; no store file was made.
        let list = env.heddle(&["runs", "list"]);
        expect(&list, OK);
        assert!(
            String::from_utf8_lossy(&list.stdout).contains(&id),
            "{fault}"
        );
        assert!(!env.db().exists(), "{fault}: a store file was created");
        let n = pg::query(
            &url,
            &format!("SELECT count(*) FROM heddle.events WHERE run_id = '{id}'"),
        );
        assert_ne!(n[0][0].as_deref(), Some("0"), "{fault}");
    }
}

#[test]
fn a_started_non_retry_safe_node_on_postgres_pauses_until_a_person_resumes_it() {
    let Some((env, _)) = on_postgres(CHAIN, false) else {
        return;
    };
    let id = env.crash("after-start:w", &[]);
    assert!(env.lines().is_empty());
    // Recovery never runs uncertain work again by itself.
    let o = resume(&env, &[&id]);
    expect(&o, PAUSED);
    let event = pause_event(&o);
    assert!(env.lines().is_empty());
    assert_eq!(env.show(&id)["pause"]["why"], "reconcile");
    // The paused run's lease was given back: the person's resume is taken at once.
    let o = env.heddle(&["runs", "resume", &id, "--pause", &event.to_string()]);
    expect(&o, OK);
    assert_eq!(env.lines(), ["one"]);
}

#[test]
fn a_fan_out_on_postgres_killed_after_its_third_item_repeats_none() {
    let Some((env, _)) = on_postgres(FANOUT, true) else {
        return;
    };
    let id = env.crash("after-result:w:3", &[]);
    assert_eq!(env.lines().len(), 3);
    let o = resume(&env, &[&id, "--json"]);
    expect(&o, OK);
    let mut lines = env.lines();
    lines.sort();
    assert_eq!(lines, ["a", "b", "c", "d", "e", "f"]);
}

/// How many records of `kind` the run's log holds (`opened` and the other lifecycle
/// records are rows of their own).
fn rows_of(url: &str, id: &str, kind: &str) -> u64 {
    let n = pg::query(
        url,
        &format!("SELECT count(*) FROM heddle.events WHERE run_id = '{id}' AND kind = '{kind}'"),
    );
    n[0][0].as_deref().unwrap().parse().unwrap()
}

/// Waits until the lease a killed process held on run `id` has expired (nobody renews
/// it): from then on any process may take the run.
fn wait_for_expiry(url: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let expired = pg::query(
            url,
            &format!(
                "SELECT coalesce(expires_at <= now(), true) FROM heddle.leases WHERE run_id = '{id}'"
            ),
        );
        if expired[0][0].as_deref() == Some("t") {
            return;
        }
        assert!(Instant::now() < deadline, "the lease of {id} never expired");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Of four `heddle runs resume` started at once on a run a killed process left, on
/// PostgreSQL, exactly one takes it over and runs it (its effect once); the others exit
/// 2 naming what won and write nothing (one `opened` record more, the winner's).
#[test]
fn of_concurrent_resumes_on_postgres_one_recovers_the_run_and_the_others_exit_2() {
    for trial in 0..2 {
        let Some((env, url)) = on_postgres(CHAIN, false) else {
            return;
        };
        let id = env.crash("before-dispatch:w", &[]);
        assert_eq!(rows_of(&url, &id, "opened"), 1);
        wait_for_expiry(&url, &id);
        let children: Vec<_> = (0..4)
            .map(|_| {
                env.cmd(&["runs", "resume", &id])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("heddle starts")
            })
            .collect();
        let outs: Vec<Output> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let all: Vec<String> = outs.iter().map(text).collect();
        assert_eq!(
            outs.iter().filter(|o| o.status.code() == Some(OK)).count(),
            1,
            "trial {trial}: {all:#?}"
        );
        for o in outs.iter().filter(|o| o.status.code() != Some(OK)) {
            let e = stderr(o);
            assert_eq!(o.status.code(), Some(INVALID), "trial {trial}: {all:#?}");
            assert!(
                e.contains("was taken over by another process")
                    || e.contains("is owned by host")
                    || e.contains("is completed"),
                "trial {trial}: a loser must say what won: {e}"
            );
        }
        assert_eq!(
            rows_of(&url, &id, "opened"),
            2,
            "trial {trial}: one take-over"
        );
        assert_eq!(
            env.lines(),
            ["one"],
            "trial {trial}: the effect landed once"
        );
        assert_eq!(env.show(&id)["state"], "completed", "trial {trial}");
    }
}

/// `heddle runs cancel` of a run a live process drives on PostgreSQL asks that owner
/// through the store (a `cancel_requests` row): the owner records the cancel and ends
/// the run itself (exit 3), and nobody else ever opened it.
#[test]
fn cancelling_a_live_run_on_postgres_asks_its_owner_which_ends_it_cancelled() {
    let Some((env, url)) = on_postgres(CHAIN, false) else {
        return;
    };
    let started = env.path().join("started.txt");
    let code = format!("echo started >> {}; sleep 600", started.display());
    let graph = serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "wait", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": code}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [{"source": "wait", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]});
    std::fs::write(env.path().join("g.json"), graph.to_string()).unwrap();
    let (mut live, rx) = env.spawn(&["run", "--durable", "g.json"]);
    let id = wait_line(&rx, run_id_in);
    while !started.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = env.heddle(&["runs", "cancel", &id]);
    expect(&o, OK);
    let e = stderr(&o);
    assert!(e.contains("asked the owner of run"), "{e}");
    assert!(e.contains(&format!("run {id} cancelled")), "{e}");
    let status = live.wait().unwrap();
    let rest: Vec<String> = rx.try_iter().collect();
    assert_eq!(status.code(), Some(CANCELLED), "{rest:#?}");
    assert_eq!(env.show(&id)["state"], "cancelled");
    let asked = pg::query(
        &url,
        &format!("SELECT count(*) FROM heddle.cancel_requests WHERE run_id = '{id}'"),
    );
    assert_eq!(asked[0][0].as_deref(), Some("1"));
    assert_eq!(
        rows_of(&url, &id, "opened"),
        1,
        "only the owner opened the run"
    );
}

/// `heddle runs cancel` of a run a killed process left on PostgreSQL takes it over to
/// record the cancel and the ending (one transaction), and hands the lease back: the
/// run is cancelled, its lease idle (nobody waits it out), and it is never resumed.
#[test]
fn cancelling_an_interrupted_run_on_postgres_ends_it_and_hands_its_lease_back() {
    let Some((env, url)) = on_postgres(CHAIN, false) else {
        return;
    };
    let id = env.crash("before-dispatch:w", &[]);
    wait_for_expiry(&url, &id);
    let o = env.heddle(&["runs", "cancel", &id]);
    expect(&o, OK);
    assert_eq!(env.show(&id)["state"], "cancelled");
    let lease = pg::query(
        &url,
        &format!("SELECT state FROM heddle.leases WHERE run_id = '{id}'"),
    );
    assert_eq!(lease[0][0].as_deref(), Some("idle"));
    expect(&env.heddle(&["runs", "resume", &id]), INVALID);
    assert!(env.lines().is_empty(), "nothing ran");
    assert_eq!(rows_of(&url, &id, "opened"), 1, "the cancel opened nothing");
}

/// The watchdog supervises runs in a store file (its lock, state and worker are one
/// machine's); on a database several hosts share the hosts are the watchdogs, so it is
/// refused there, saying so, before anything is written.
#[test]
fn the_watchdog_refuses_a_shared_store_saying_who_watches_runs_there() {
    let Some((env, url)) = on_postgres(CHAIN, false) else {
        return;
    };
    let o = env.heddle(&["run", "--durable", "--watchdog", "g.json"]);
    expect(&o, INVALID);
    assert!(
        stderr(&o).contains("the watchdog supervises runs in a store file"),
        "{}",
        text(&o)
    );
    let tables = pg::query(
        &url,
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'heddle'",
    );
    assert_eq!(
        tables[0][0].as_deref(),
        Some("0"),
        "the store was not even made"
    );
    assert!(!env.db().exists());
}

/// `HEDDLE_STORE_URL` alone (no `[store] url`) puts the runs in that database, as the
/// README's recipe uses it: the run is recorded there, listed and shown through it, and
/// no store file is made; without it the same directory's store file knows nothing.
#[test]
fn heddle_store_url_alone_puts_the_runs_in_the_database() {
    if pg::skip_pg() {
        return;
    }
    let url = pg::fresh_database();
    let env = StoreDir::with_graph(CHAIN);
    let with_url = |args: &[&str]| {
        env.cmd(args)
            .env("HEDDLE_STORE_URL", &url)
            .output()
            .expect("heddle starts")
    };
    let o = with_url(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    let id = support::store::run_id(&o);
    assert_eq!(env.lines(), ["one"]);
    assert_ne!(rows_of(&url, &id, "opened"), 0, "not in the database");
    assert!(!env.db().exists(), "a store file was created");
    let o = with_url(&["runs", "list"]);
    expect(&o, OK);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&id),
        "{}",
        text(&o)
    );
    let o = with_url(&["runs", "show", &id, "--json"]);
    expect(&o, OK);
    let show: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(show["state"], "completed", "{show:#}");
    // Without it, the directory's own store (the file) is used: the run is not there.
    let o = env.heddle(&["runs", "show", &id]);
    expect(&o, INVALID);
}

/// `heddle runs status` reads a run on PostgreSQL from any process, never taking it:
/// a run a live command line drives is `running` with its owner host (the lease, as
/// there is no watchdog there), and once cancelled it says so, the owner gone.
#[test]
fn runs_status_on_postgres_names_the_runs_state_and_owner_host() {
    let Some((env, _)) = on_postgres(CHAIN, false) else {
        return;
    };
    let started = env.path().join("started.txt");
    let code = format!("echo started >> {}; sleep 600", started.display());
    let graph = serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "wait", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": code}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [{"source": "wait", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]});
    std::fs::write(env.path().join("g.json"), graph.to_string()).unwrap();
    let (mut live, rx) = env.spawn(&["run", "--durable", "g.json"]);
    let id = wait_line(&rx, run_id_in);
    while !started.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = env.status(&id);
    assert_eq!(status["run_id"], id.as_str(), "{status:#}");
    assert_eq!(status["state"], "running", "{status:#}");
    assert_eq!(status["supervised"], false, "{status:#}");
    let owner = status["owner_host"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!owner.is_empty(), "no owner host: {status:#}");
    assert_eq!(env.show(&id)["owner_host"], owner.as_str());
    expect(&env.heddle(&["runs", "cancel", &id]), OK);
    assert_eq!(live.wait().unwrap().code(), Some(CANCELLED));
    let status = env.status(&id);
    assert_eq!(status["state"], "cancelled", "{status:#}");
}
