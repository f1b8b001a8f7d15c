//! Supervised runs with the real binary: `heddle run --watchdog` runs the graph in a
//! worker process; workers are killed with SIGKILL (or abort at a fault boundary), and
//! effects are counted on the provider side (lines a `files.write_text` node appended
//! to a granted file), as in tests/durable.rs.

use std::sync::mpsc;
use std::time::Duration;

mod support;

use support::store::{
    FANOUT, INVALID, LIMIT, LOCKED, OK, PAUSED, StoreDir, expect, kill_moments, reference_outputs,
    report, run_id_in, sigkill, text, wait_line,
};
use support::{docker, docker_image_ready, stderr};

/// A code node that takes its time, so the run is live while a test looks at it.
fn slow_graph(mode: &str, code: &str) -> String {
    let code = serde_json::to_string(code).unwrap();
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "slow", "type": "code.bash", "properties": {{"code": {code}, "mode": "{mode}"}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [{{"source": "slow", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]
}}"#
    )
}

/// `watchdog: worker N running run ID (pid P)` → P.
fn worker_pid_in(line: &str) -> Option<i32> {
    let rest = line.strip_prefix("watchdog: worker ")?;
    let pid = rest.split("(pid ").nth(1)?.trim_end_matches(')');
    pid.parse().ok()
}

#[test]
fn a_supervised_run_completes_reports_its_supervision_and_frees_its_lock() {
    let reference = reference_outputs(FANOUT);
    let env = StoreDir::with_graph(FANOUT);
    let o = env.heddle(&["run", "--watchdog", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    assert_eq!(r["outputs"], reference, "{r:#}");
    assert_eq!(r["supervision"]["launches"], 1, "{r:#}");
    assert_eq!(r["supervision"]["restarts"], 0, "{r:#}");
    assert_eq!(r["supervision"]["cleanup_verified"], true, "{r:#}");
    let id = r["supervision"]["run_id"].as_str().unwrap().to_string();
    let s = env.status(&id);
    assert_eq!(s["phase"], "completed", "{s:#}");
    assert_eq!(s["lock"]["lock"], "free", "{s:#}");
    assert_eq!(s["cleanup_verified"], true, "{s:#}");
    // `w` writes files and can reach no paid service (a package node with no
    // network): no usage is claimed for it, known or not.
    assert!(
        !s["usage"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["node"] == "w"),
        "{s:#}"
    );
    let mut lines = env.lines();
    lines.sort();
    assert_eq!(lines, ["a", "b", "c", "d", "e", "f"]);
}

/// Workers of fan-out runs killed with SIGKILL at pseudo-random moments; the watchdog
/// replaces them and the run finishes with nothing lost and no completed item repeated
/// (a reconcile pause is re-offered explicitly, as in tests/durable.rs).
#[test]
fn random_sigkills_of_workers_lose_nothing_and_repeat_only_reoffered_work() {
    let t0 = std::time::Instant::now();
    let reference = reference_outputs(FANOUT);
    let span_ms = t0.elapsed().as_millis() as u64 + 1;
    let mut next = kill_moments();
    for round in 0..8 {
        let env = StoreDir::with_graph(FANOUT);
        let (child, rx) = env.spawn(&[
            "run",
            "--watchdog",
            "--max-restarts",
            "10",
            "--json",
            "g.json",
        ]);
        let id = wait_line(&rx, run_id_in);
        // Kill the first one or two workers, each after a pseudo-random delay.
        let kills = 1 + next() % 2;
        for _ in 0..kills {
            let Ok(pid) = (|| loop {
                let line = rx.recv_timeout(Duration::from_secs(120))?;
                if let Some(p) = worker_pid_in(&line) {
                    return Ok::<_, mpsc::RecvTimeoutError>(p);
                }
            })() else {
                break;
            };
            std::thread::sleep(Duration::from_millis(next() % span_ms));
            sigkill(pid);
        }
        let o = child.wait_with_output().unwrap();
        let r = report(&o);
        eprintln!(
            "round {round}: {} kills, exit {:?}, {} launches, {} lines",
            kills,
            o.status.code(),
            r["supervision"]["launches"],
            env.lines().len()
        );
        assert_eq!(r["supervision"]["cleanup_verified"], true, "{r:#}");
        let mut reoffers = 0;
        let mut last = o;
        let final_out = loop {
            match last.status.code() {
                Some(OK) => break report(&last)["outputs"].clone(),
                Some(PAUSED) => {
                    // The first watchdog's stderr went to the kill loop: read the pause
                    // from the log.
                    let show = env.heddle(&["runs", "show", &id, "--json"]);
                    expect(&show, OK);
                    let event = report(&show)["pause"]["event"].as_u64().unwrap();
                    assert_eq!(report(&show)["pause"]["why"], "reconcile");
                    assert_eq!(report(&last)["supervision"]["phase"], "paused");
                    reoffers += 1;
                    assert!(reoffers < 10, "round {round}: no progress");
                    last = env.heddle(&[
                        "runs",
                        "resume",
                        "--watchdog",
                        &id,
                        "--pause",
                        &event.to_string(),
                        "--json",
                    ]);
                }
                _ => panic!("round {round}: {}", text(&last)),
            }
        };
        assert_eq!(final_out, reference, "round {round}");
        env.assert_fanout_effects(reoffers, &format!("round {round}"));
        assert_eq!(env.status(&id)["state"], "completed");
        // A finished run is refused (exit 2) and its lock stays free.
        let o = env.heddle(&["runs", "resume", "--watchdog", &id]);
        expect(&o, INVALID);
        assert_eq!(env.status(&id)["lock"]["lock"], "free", "round {round}");
    }
}

#[test]
fn a_worker_that_keeps_crashing_stops_at_the_restart_limit() {
    let env = StoreDir::with_graph(FANOUT);
    // Every worker aborts when it dispatches the first write (the fault is read from the
    // environment only because the watchdog was told to pass it on).
    let o = env
        .cmd(&[
            "run",
            "--watchdog",
            "--max-restarts",
            "2",
            "--backoff-initial-ms",
            "1",
            "--env",
            "HEDDLE_FAULT",
            "--json",
            "g.json",
        ])
        .env("HEDDLE_FAULT", "after-dispatch:w")
        .output()
        .unwrap();
    expect(&o, LIMIT);
    let r = report(&o);
    assert_eq!(r["code"], "RESTART_LIMIT", "{r:#}");
    assert_eq!(r["supervision"]["launches"], 3, "{r:#}");
    assert_eq!(r["supervision"]["restarts"], 2, "{r:#}");
    // The first worker starts the run, each replacement recovers it from the log.
    let e = stderr(&o);
    assert_eq!(e.matches("starting run ").count(), 1, "{e}");
    assert_eq!(e.matches("recovering interrupted run ").count(), 2, "{e}");
    // Items run concurrently, so a write may finish before its worker aborts; none is
    // ever repeated by a replacement.
    let mut lines = env.lines();
    let n = lines.len();
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), n, "an effect was repeated: {lines:?}");
    // Without `--env`, the variable never reaches the worker: the run completes.
    let env = StoreDir::with_graph(FANOUT);
    let o = env
        .cmd(&["run", "--watchdog", "--json", "g.json"])
        .env("HEDDLE_FAULT", "after-dispatch:w")
        .output()
        .unwrap();
    expect(&o, OK);
    assert_eq!(report(&o)["supervision"]["launches"], 1);
}

/// Outputs are not console output: a run whose output value alone is over the 1 MB
/// console limit completes under a watchdog, its outputs read back from the store.
/// (The limit itself is tested on a real flooding process in `watchdog::launch`.)
#[test]
fn outputs_larger_than_the_console_limit_travel_through_the_store() {
    let big = "x".repeat(1_200_000);
    let graph = format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [{{"id": "c", "type": "heddle.constant", "properties": {{"value": "{big}"}}}},
            {{"id": "out", "type": "heddle.output"}}],
  "edges": [{{"source": "c", "sourceHandle": "value", "target": "out", "targetHandle": "value"}}]}}"#
    );
    let env = StoreDir::with_graph(&graph);
    let o = env.heddle(&["run", "--watchdog", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    assert_eq!(
        r["outputs"]["out"][0].as_str().map(str::len),
        Some(1_200_000)
    );
    let worker_output = r["supervision"]["workers"][0]["output_bytes"]
        .as_u64()
        .unwrap();
    assert!(worker_output < 1_000_000, "{worker_output} console bytes");
}

#[test]
fn bad_limits_are_refused_before_anything_starts() {
    let env = StoreDir::with_graph(FANOUT);
    for (args, flag) in [
        (&["--max-restarts", "0"][..], "--max-restarts"),
        (&["--backoff-initial-ms", "-5"], "--backoff-initial-ms"),
        (&["--time-limit-ms", "99999999999999"], "--time-limit-ms"),
        (
            &["--backoff-initial-ms", "500", "--backoff-max-ms", "100"],
            "--backoff-max-ms",
        ),
        (&["--env", "TOKEN=hunter2"], "--env"),
    ] {
        let mut a = vec!["run", "--watchdog"];
        a.extend_from_slice(args);
        a.push("g.json");
        let o = env.heddle(&a);
        expect(&o, INVALID);
        assert!(stderr(&o).contains(flag), "{args:?}: {}", text(&o));
        assert!(!stderr(&o).contains("hunter2"), "{}", text(&o));
    }
    // A limit without --watchdog is a usage error too.
    expect(
        &env.heddle(&["run", "--max-restarts", "2", "g.json"]),
        INVALID,
    );
    assert!(!env.db().exists(), "nothing was recorded");
    assert_eq!(env.lines(), Vec::<String>::new());
}

/// A live supervised run: status from another process, a second watchdog refused from
/// another directory, the worker killed (its code node goes with it), and then the
/// watchdog itself killed: its lock is stale until unlocked.
#[test]
fn status_while_live_a_second_watchdog_refused_and_a_dead_watchdogs_lock_is_stale() {
    // `exec`: the sleep is the code node's process (it dies with the worker).
    let graph = slow_graph("subprocess", "exec sleep 60").replace(
        r#""type": "code.bash","#,
        r#""type": "code.bash", "timeout_ms": 600000,"#,
    );
    let env = StoreDir::with_graph(&graph);
    let (mut watchdog, rx) = env.spawn(&["run", "--watchdog", "--json", "g.json"]);
    let id = wait_line(&rx, run_id_in);
    let worker = wait_line(&rx, worker_pid_in);
    // The code node has started once the run's status shows it active.
    let s = loop {
        let s = env.status(&id);
        if s["active"].as_array().is_some_and(|a| !a.is_empty()) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(s["phase"], "running", "{s:#}");
    assert_eq!(s["worker"]["pid"], worker, "{s:#}");
    assert_eq!(s["worker"]["alive"], true, "{s:#}");
    assert_eq!(s["lock"]["lock"], "held", "{s:#}");
    assert_eq!(s["active"][0]["node"], "slow", "{s:#}");
    // The node's own time limit, counting down from its start.
    let left = s["active"][0]["remaining_node_timeout_ms"]
        .as_u64()
        .unwrap();
    assert!(left <= 600_000, "{s:#}");
    assert_eq!(s["cleanup_verified"], serde_json::Value::Null, "{s:#}");
    assert_eq!(s["usage"][0]["state"], "unknown", "{s:#}");

    // A second watchdog, from another directory with the same store, is refused.
    let elsewhere = tempfile::tempdir().unwrap();
    let config = env.path().join("heddle.toml");
    let o = support::command(elsewhere.path())
        .args(["runs", "resume", "--watchdog", &id, "--config"])
        .arg(&config)
        .output()
        .unwrap();
    expect(&o, LOCKED);
    assert!(stderr(&o).contains("PROCESS_LOCKED"), "{}", text(&o));
    // So is a plain resume.
    expect(&env.heddle(&["runs", "resume", &id]), LOCKED);

    // The watchdog dies: its worker dies with it, and the lock it held reads stale.
    sigkill(watchdog.id() as i32);
    watchdog.wait().unwrap();
    let s = loop {
        let s = env.status(&id);
        if s["worker"]["alive"] == false {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(s["phase"], "watchdog_gone", "{s:#}");
    assert_eq!(s["lock"]["lock"], "stale", "{s:#}");
    let o = env.heddle(&["runs", "resume", "--watchdog", &id]);
    expect(&o, LOCKED);
    assert!(stderr(&o).contains("heddle runs unlock"), "{}", text(&o));
    let o = env.heddle(&["runs", "unlock", &id]);
    expect(&o, OK);
    assert_eq!(env.status(&id)["lock"]["lock"], "free");
    // Unlocking an unknown run is a usage error; a free lock is not "unlocked" again.
    expect(&env.heddle(&["runs", "unlock", "nope"]), INVALID);
    expect(&env.heddle(&["runs", "unlock", &id]), INVALID);
}

fn alive(pid: i32) -> bool {
    // Zombies count as gone (they hold nothing and are reaped by init).
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with(['Z', 'X']))
    })
}

/// A killed worker's code node left a background process in its own process group
/// (which outlives its parent); the watchdog's cleanup finds it by its owner marker and
/// stops it before the replacement runs.
#[test]
fn a_killed_workers_code_node_processes_are_stopped_before_the_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("sleep.pid");
    let code = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let env = StoreDir::with_graph(&slow_graph("subprocess", &code));
    let (watchdog, rx) = env.spawn(&["run", "--watchdog", "--json", "g.json"]);
    let worker = wait_line(&rx, worker_pid_in);
    let sleeper: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break p;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(alive(sleeper));
    sigkill(worker);
    let o = watchdog.wait_with_output().unwrap();
    // The replacement found the code node started without a result (not retry-safe):
    // the run pauses for reconciliation rather than running it twice.
    expect(&o, PAUSED);
    let r = report(&o);
    assert_eq!(r["supervision"]["restarts"], 1, "{r:#}");
    assert_eq!(r["supervision"]["cleanup_verified"], true, "{r:#}");
    assert!(
        !alive(sleeper),
        "the code node's process survived the cleanup"
    );
}

/// A worker killed while its code node's container runs: the watchdog removes the
/// run's containers (found by the run id label) before the replacement.
#[test]
fn a_killed_workers_containers_are_removed_by_the_watchdog() {
    if !docker_image_ready("heddle/bash:1") {
        return;
    }
    let env = StoreDir::with_graph(&slow_graph("docker", "sleep 60"));
    let (watchdog, rx) = env.spawn(&["run", "--watchdog", "--json", "g.json"]);
    let id = wait_line(&rx, run_id_in);
    let worker = wait_line(&rx, worker_pid_in);
    let filter = format!("label=heddle.run={id}");
    loop {
        let ps = docker(&["ps", "-q", "--filter", &filter]).unwrap_or_default();
        if !ps.trim().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sigkill(worker);
    let o = watchdog.wait_with_output().unwrap();
    expect(&o, PAUSED);
    let r = report(&o);
    assert_eq!(r["supervision"]["cleanup_verified"], true, "{r:#}");
    let left = docker(&["ps", "-aq", "--filter", &filter]).unwrap();
    assert!(left.trim().is_empty(), "containers left: {left}");
    let status = env.status(&id);
    assert_eq!(status["cleanup_verified"], true, "{status:#}");
}

/// The figure the README reports: from a worker killed with SIGKILL to its replacement
/// starting the next node (the first start record written after the kill), with the
/// default backoff. A measurement, not a timed test:
/// `cargo test --test watchdog -- --ignored --nocapture sigkill_to_replacement`.
#[test]
#[ignore]
fn sigkill_to_replacement_running_the_next_node() {
    use heddle_store::RunStore as _;
    let mut samples = Vec::new();
    for _ in 0..7 {
        let env = StoreDir::with_graph(FANOUT);
        let (watchdog, rx) = env.spawn(&["run", "--watchdog", "--json", "g.json"]);
        let id = wait_line(&rx, run_id_in);
        let worker = wait_line(&rx, worker_pid_in);
        // Once the worker has opened the run (before any write is under way, so the
        // replacement has a next node to start rather than a pause to record).
        let store = heddle_store::SqliteStore::open(&env.db()).unwrap();
        while store.read(&id, 0).unwrap().records.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let killed_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        sigkill(worker);
        let o = watchdog.wait_with_output().unwrap();
        let records = store.read(&id, 0).unwrap().records;
        let next = records.iter().find(|r| {
            r.at_ms >= killed_ms && matches!(r.record, heddle_core::Record::Started { .. })
        });
        match next {
            Some(r) => samples.push(r.at_ms - killed_ms),
            None => eprintln!(
                "no node started after the kill (exit {:?})",
                o.status.code()
            ),
        }
    }
    samples.sort();
    eprintln!(
        "SIGKILL -> replacement's next node start, ms: {samples:?} (median {})",
        samples.get(samples.len() / 2).copied().unwrap_or(0)
    );
}

/// The run's time limit (`--time-limit-ms`, the durable budget's) stops a live worker
/// from outside (`TIMEOUT`), and a resume with no time left starts no worker at all.
#[test]
fn the_run_time_limit_stops_the_run_and_stays_spent_across_a_resume() {
    let env = StoreDir::with_graph(&slow_graph("subprocess", "exec sleep 60"));
    let o = env.heddle(&[
        "run",
        "--watchdog",
        "--time-limit-ms",
        "1500",
        "--json",
        "g.json",
    ]);
    expect(&o, LIMIT);
    let r = report(&o);
    assert_eq!(r["code"], "TIMEOUT", "{r:#}");
    assert_eq!(r["supervision"]["launches"], 1, "{r:#}");
    assert_eq!(r["supervision"]["cleanup_verified"], true, "{r:#}");
    let id = r["supervision"]["run_id"].as_str().unwrap().to_string();
    let s = env.status(&id);
    assert_eq!(s["remaining_ms"], 0, "{s:#}");
    assert_eq!(s["lock"]["lock"], "free", "{s:#}");

    let o = env.heddle(&["runs", "resume", "--watchdog", &id, "--json"]);
    expect(&o, LIMIT);
    let r = report(&o);
    assert_eq!(r["code"], "TIMEOUT", "{r:#}");
    assert_eq!(
        r["supervision"]["launches"], 1,
        "no worker was started: {r:#}"
    );
    // A refused resume leaves the lock free (it is not taken over, and not left stale).
    let o = env.heddle(&["runs", "resume", "--watchdog", "nope"]);
    expect(&o, INVALID);
    assert_eq!(env.status(&id)["lock"]["lock"], "free");
    // A resume keeps the recorded limits.
    let o = env.heddle(&["runs", "resume", "--watchdog", &id, "--max-restarts", "9"]);
    expect(&o, INVALID);
    assert!(stderr(&o).contains("--max-restarts"), "{}", text(&o));
    // The one time limit has no second spelling left over from the watchdog.
    let o = env.heddle(&["run", "--watchdog", "--run-time-limit-ms", "5", "g.json"]);
    expect(&o, INVALID);
}

/// Ctrl-C to a watchdog asks its worker to pause the run (resumable, exit 4); the
/// watchdog reports the pause the worker recorded and frees the lock.
#[test]
fn an_interrupted_watchdog_leaves_the_run_paused_and_resumable() {
    let env = StoreDir::with_graph(&slow_graph("subprocess", "exec sleep 60"));
    let (watchdog, rx) = env.spawn(&["run", "--watchdog", "--json", "g.json"]);
    let id = wait_line(&rx, run_id_in);
    while env.status(&id)["active"]
        .as_array()
        .is_none_or(|a| a.is_empty())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the child we started; touches no memory.
    unsafe { libc::kill(watchdog.id() as i32, libc::SIGINT) };
    let o = watchdog.wait_with_output().unwrap();
    expect(&o, PAUSED);
    let r = report(&o);
    assert_eq!(r["supervision"]["phase"], "paused", "{r:#}");
    assert_eq!(r["supervision"]["restarts"], 0, "{r:#}");
    let s = env.status(&id);
    assert_eq!(s["state"], "paused", "{s:#}");
    assert_eq!(s["lock"]["lock"], "free", "{s:#}");
    let show = env.heddle(&["runs", "show", &id, "--json"]);
    assert_eq!(report(&show)["pause"]["why"], "interrupted");
}

/// The final report travels through the run store: the watchdog reports only bytes it
/// read back and verified against their sha256. A store that hands back other bytes
/// (here a trigger overwrites every artifact as it is written) ends the run with
/// `TERMINAL_ARTIFACT`, never a report made from them.
#[test]
fn the_final_report_is_verified_against_its_digest_before_it_is_reported() {
    let env = StoreDir::with_graph(FANOUT);
    let o = env.heddle(&["run", "--watchdog", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    let sha = r["supervision"]["final_report"]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64, "{r:#}");

    let db = rusqlite::Connection::open(env.db()).unwrap();
    db.execute_batch(
        "CREATE TRIGGER corrupt AFTER INSERT ON artifact_pieces BEGIN
           UPDATE artifact_pieces SET bytes = x'7b7d' WHERE rowid = NEW.rowid;
         END;",
    )
    .unwrap();
    drop(db);
    let o = env.heddle(&["run", "--watchdog", "--json", "g.json"]);
    expect(&o, 1);
    let r = report(&o);
    assert_eq!(r["code"], "TERMINAL_ARTIFACT", "{r:#}");
    assert!(
        r.get("outputs").is_none(),
        "no outputs from unverified bytes: {r:#}"
    );
}

/// The durable budgets (`--max-dispatches`, counted across workers) hold under a
/// watchdog, and the run exits as the same run unsupervised does.
#[test]
fn a_dispatch_budget_holds_across_workers_and_exits_as_unsupervised() {
    let plain = StoreDir::with_graph(FANOUT);
    let unsupervised = plain.heddle(&[
        "run",
        "--durable",
        "--max-dispatches",
        "3",
        "--json",
        "g.json",
    ]);
    let env = StoreDir::with_graph(FANOUT);
    let o = env.heddle(&[
        "run",
        "--watchdog",
        "--max-dispatches",
        "3",
        "--json",
        "g.json",
    ]);
    expect(&o, unsupervised.status.code().unwrap());
    let r = report(&o);
    assert_eq!(r["supervision"]["phase"], "failed", "{r:#}");
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("dispatch budget")),
        "{r:#}"
    );
    assert!(env.lines().len() < 6, "the budget stopped the fan-out");
}

/// Without `--json` the outputs are printed as an unsupervised run prints them, from the
/// report read back verified from the store (the worker's own stdout is not passed on).
#[test]
fn without_json_the_outputs_print_as_an_unsupervised_run_prints_them() {
    let plain = StoreDir::with_graph(FANOUT);
    let unsupervised = plain.heddle(&["run", "--durable", "g.json"]);
    expect(&unsupervised, OK);
    let env = StoreDir::with_graph(FANOUT);
    let o = env.heddle(&["run", "--watchdog", "g.json"]);
    expect(&o, OK);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&unsupervised.stdout)
    );
    assert!(!o.stdout.is_empty());

    // A failed run's summary lists what did not run, as unsupervised.
    let failing = slow_graph("subprocess", "exit 1");
    let plain = StoreDir::with_graph(&failing);
    let unsupervised = plain.heddle(&["run", "--durable", "g.json"]);
    let env = StoreDir::with_graph(&failing);
    let o = env.heddle(&["run", "--watchdog", "g.json"]);
    assert_eq!(o.status.code(), unsupervised.status.code(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&unsupervised.stdout)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("skipped"),
        "{}",
        text(&o)
    );
}

/// `heddle runs cancel` from another process ends a supervised run at once, even while
/// its worker waits on a long node: the watchdog sees the cancel in the log, stops the
/// worker, cleans up and reports the run cancelled without a replacement.
#[test]
fn a_cancel_from_another_process_stops_the_worker_without_a_replacement() {
    let env = StoreDir::with_graph(&slow_graph("subprocess", "exec sleep 60"));
    let (watchdog, rx) = env.spawn(&["run", "--watchdog", "--json", "g.json"]);
    let id = wait_line(&rx, run_id_in);
    while env.status(&id)["active"]
        .as_array()
        .is_none_or(|a| a.is_empty())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    expect(&env.heddle(&["runs", "cancel", &id]), OK);
    let o = watchdog.wait_with_output().unwrap();
    expect(&o, 3);
    let r = report(&o);
    assert_eq!(r["supervision"]["phase"], "cancelled", "{r:#}");
    assert_eq!(r["supervision"]["launches"], 1, "{r:#}");
    assert_eq!(r["supervision"]["cleanup_verified"], true, "{r:#}");
    assert_eq!(env.status(&id)["lock"]["lock"], "free");
}
