//! `heddle bench` as a user runs it: the efficiency figures (CPU time, invocations per
//! CPU-second) next to wall time, and `--threads` choosing the runtime.

mod support;

use support::*;

fn bench_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--shape", "wide", "--size", "50", "--runs", "1"];
    all.extend_from_slice(args);
    all.push("--json");
    let o = heddle(&all);
    expect_code(&o, OK);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("bench --json is not JSON ({e}):\n{}", stdout(&o)));
    let shapes = v.as_array().expect("one entry per shape");
    assert_eq!(shapes.len(), 1, "{v}");
    shapes[0].clone()
}

fn micros(f: &serde_json::Value, key: &str) -> u64 {
    f[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a whole number of microseconds: {f}"))
}

#[test]
fn json_reports_cpu_time_and_invocations_per_cpu_second() {
    let f = bench_json(&["--threads", "1"]);
    assert_eq!(f["shape"], "wide");
    assert_eq!(
        f["threads"], 1,
        "--threads 1 is a current-thread runtime: {f}"
    );
    assert_eq!(f["invocations"], 50);
    let (user, system, total) = (
        micros(&f, "cpu_user_us"),
        micros(&f, "cpu_system_us"),
        micros(&f, "cpu_us"),
    );
    assert_eq!(total, user + system, "{f}");
    // Running 50 nodes costs some CPU; a zero here means the reading is not taken.
    assert!(total > 0, "{f}");
    let per_cpu_sec = f["invocations_per_cpu_sec"]
        .as_f64()
        .unwrap_or_else(|| panic!("no invocations_per_cpu_sec: {f}"));
    let expect = 50.0 / (total as f64 / 1e6);
    assert!(
        (per_cpu_sec - expect).abs() <= expect * 1e-9,
        "invocations_per_cpu_sec {per_cpu_sec} is not invocations / cpu time {expect}: {f}"
    );
    let cores = f["cores_busy"].as_f64().expect("cores_busy");
    let expect = total as f64 / micros(&f, "wall_us") as f64;
    // wall_us is truncated to whole microseconds, cores_busy uses the exact wall time.
    assert!(cores > 0.0 && cores <= expect, "{cores} vs {expect}: {f}");
}

#[test]
fn threads_choose_the_runtime_and_show_in_the_text_report() {
    let f = bench_json(&["--threads", "2"]);
    assert_eq!(f["threads"], 2, "{f}");

    let o = heddle(&[
        "bench",
        "--shape",
        "wide",
        "--size",
        "50",
        "--runs",
        "1",
        "--threads",
        "1",
    ]);
    expect_code(&o, OK);
    let out = stdout(&o);
    assert!(out.contains("runtime: current-thread"), "{out}");
    assert!(out.contains(" cpu "), "{out}");
    assert!(out.contains("inv/cpu-s"), "{out}");
}

#[test]
fn the_bench_says_which_build_measured() {
    // The test runs the binary of its own profile.
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    assert_eq!(bench_json(&[])["build"], build);
    let o = heddle(&["bench", "--shape", "wide", "--size", "5", "--runs", "1"]);
    expect_code(&o, OK);
    let warned = stderr(&o).contains("warning: this heddle is a debug build");
    assert_eq!(warned, build == "debug", "{}", stderr(&o));
}

#[test]
fn zero_threads_is_a_usage_error() {
    let o = heddle(&["bench", "--shape", "wide", "--threads", "0"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("--threads"), "{}", stderr(&o));
    no_panic(&o);
}

#[test]
fn wasm_shapes_run_std_nodes_and_report_cost_per_invocation() {
    for (shape, size, expect) in [("wasm-chain", "3", 60), ("wasm-fanout", "7", 21)] {
        let o = heddle(&[
            "bench",
            "--shape",
            shape,
            "--size",
            size,
            "--messages",
            "20",
            "--runs",
            "1",
            "--json",
        ]);
        expect_code(&o, OK);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o))
            .unwrap_or_else(|e| panic!("bench --json is not JSON ({e}):\n{}", stdout(&o)));
        let f = &v[0];
        assert_eq!(f["shape"], shape, "{v}");
        // Every value is checked on the way out (input + nodes passed), so a count
        // here means the WASM nodes really ran.
        assert_eq!(f["invocations"], expect, "{v}");
        let per_inv = f["cpu_us_per_invocation"]
            .as_f64()
            .expect("cpu per invocation");
        // cpu_us is whole microseconds; the per-invocation figure uses the exact time.
        let total = per_inv * expect as f64;
        let cpu_us = micros(f, "cpu_us") as f64;
        assert!(
            total > cpu_us - 1e-6 && total < cpu_us + 1.0,
            "{per_inv} × {expect} vs {cpu_us}: {v}"
        );
    }
}

/// `--durable --store postgres://…` measures durable runs on that database: the bench's
/// runs are recorded there (the figures come from real commits, not a scratch file);
/// `--store` without `--durable` is refused saying to add it.
#[test]
fn durable_runs_are_measured_on_the_database_store_names() {
    if skip_pg() {
        return;
    }
    let url = pg::fresh_database();
    let o = heddle(&[
        "bench",
        "--shape",
        "wasm-chain",
        "--size",
        "3",
        "--messages",
        "20",
        "--runs",
        "1",
        "--durable",
        "--store",
        &url,
        "--json",
    ]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v[0]["invocations"], 60, "{v}");
    let runs = pg::query(&url, "SELECT count(*) FROM heddle.runs");
    assert_ne!(
        runs[0][0].as_deref(),
        Some("0"),
        "no run was recorded there"
    );
    let records = pg::query(&url, "SELECT count(*) FROM heddle.events");
    assert_ne!(
        records[0][0].as_deref(),
        Some("0"),
        "no record was written there"
    );

    let o = heddle(&[
        "bench", "--shape", "wide", "--size", "5", "--runs", "1", "--store", &url,
    ]);
    assert_ne!(code(&o), OK, "{}", stderr(&o));
    assert!(stderr(&o).contains("add --durable"), "{}", stderr(&o));
    no_panic(&o);
}

/// `--shape api-runs` runs a real server on loopback and reports what it measured; its
/// figures are checked for sense (every field there, the runs counted), never for speed.
#[test]
fn api_runs_reports_runs_per_second_latency_and_commits_per_run() {
    let o = heddle(&[
        "bench",
        "--shape",
        "api-runs",
        "--size",
        "40",
        "--runs",
        "1",
        "--clients",
        "4",
        "--json",
    ]);
    expect_code(&o, OK);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("bench --json is not JSON ({e}):\n{}", stdout(&o)));
    let f = &v[0];
    assert_eq!(f["shape"], "api-runs", "{v}");
    assert_eq!(f["store"], "sqlite", "{f}");
    assert_eq!(f["runs"], 40, "{f}");
    assert_eq!(f["clients"], 4, "{f}");
    assert_eq!(f["workers"], 4, "{f}");
    assert_eq!(f["nodes"], 3, "{f}");
    let rate = f["runs_per_sec"].as_f64().expect("runs_per_sec");
    let wall = micros(f, "wall_us");
    assert!(rate > 0.0 && wall > 0, "{f}");
    let expect = 40.0 / (wall as f64 / 1e6);
    assert!(
        (rate - expect).abs() <= expect * 1e-3,
        "{rate} vs {expect}: {f}"
    );
    let (p50, p99, max) = (
        micros(f, "create_p50_us"),
        micros(f, "create_p99_us"),
        micros(f, "create_max_us"),
    );
    assert!(0 < p50 && p50 <= p99 && p99 <= max && max <= wall, "{f}");
    // Every run writes durably (its creation, its ending); a commit several runs shared
    // counts once, so a run may cost less than one.
    let commits = f["commits_per_run"].as_f64().expect("commits_per_run");
    let synced = f["synced_commits_per_run"]
        .as_f64()
        .expect("synced_commits_per_run");
    assert!(synced > 0.0 && synced <= commits, "{f}");
    assert!(
        f["cpu_us_per_run"].as_f64().expect("cpu_us_per_run") > 0.0,
        "{f}"
    );

    let o = heddle(&[
        "bench",
        "--shape",
        "api-runs",
        "--size",
        "10",
        "--runs",
        "1",
        "--clients",
        "2",
    ]);
    expect_code(&o, OK);
    let out = stdout(&o);
    assert!(
        out.contains("runs/s") && out.contains("create p50"),
        "{out}"
    );
    assert!(out.contains("per run:") && out.contains("synced"), "{out}");
}
