//! `heddle bench --shape effect-chain` and `effect-fanout`: nodes that are not
//! retry-safe, their effects counted on disk by the bench itself, and with `--durable`
//! what the run's log wrote, so "one synced write before a node starts" (and shared by
//! the invocations that run together) is a figure, not a claim.

mod support;

use support::*;

fn effect_chain(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--shape", "effect-chain", "--size", "3", "--messages", "4"];
    args.extend_from_slice(extra);
    bench(&args)
}

/// `heddle bench ARGS --runs 1 --threads 2 --json`: the one shape's figures.
fn bench(args: &[&str]) -> serde_json::Value {
    let mut args: Vec<&str> = [&["bench"], args].concat();
    args.extend(["--runs", "1", "--threads", "2", "--json"]);
    let o = heddle(&args);
    expect_code(&o, OK);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("bench --json is not JSON ({e}):\n{}", stdout(&o)));
    v[0].clone()
}

#[test]
fn a_durable_effect_chain_waits_for_each_start_and_result_and_reports_its_syncs() {
    let f = effect_chain(&["--durable"]);
    assert_eq!(f["shape"], "effect-chain");
    assert_eq!(f["invocations"], 12, "{f:#}");
    let log = &f["log"];
    // Per invocation: its dispatch, its start and its result.
    assert_eq!(log["records"], 36, "{f:#}");
    // The start (before its code) and the result were waited on, and the final flush.
    assert_eq!(log["waits"], 25, "{f:#}");
    let synced = log["synced_commits"].as_u64().unwrap();
    assert!(
        (1..=25).contains(&synced),
        "synced commits must serve the waits: {f:#}"
    );
    let per = log["synced_commits_per_invocation"].as_f64().unwrap();
    assert_eq!(per, synced as f64 / 12.0, "{f:#}");
}

#[test]
fn an_in_memory_effect_chain_has_no_log_figures() {
    let f = effect_chain(&[]);
    assert_eq!(f["invocations"], 12, "{f:#}");
    assert!(f.get("log").is_none(), "{f:#}");
}

fn effect_fanout(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--shape", "effect-fanout", "--size", "300"];
    args.extend_from_slice(extra);
    bench(&args)
}

#[test]
fn a_durable_effect_fan_out_shares_synced_commits_between_invocations() {
    let f = effect_fanout(&["--durable"]);
    assert_eq!(f["shape"], "effect-fanout");
    assert_eq!(f["invocations"], 300, "{f:#}");
    let log = &f["log"];
    // Per invocation: its dispatch, its start and its result.
    assert_eq!(log["records"], 900, "{f:#}");
    // The items arrive in a few inbox batches, each run 128 at a time: a handful of
    // synced commits, each shared by many starts (one per invocation would be 300;
    // one at a time with a synced result, 600).
    let synced = log["synced_commits"].as_u64().unwrap();
    assert!(synced * 4 <= 300, "{synced} synced commits: {f:#}");

    // Capped at one at a time (as a node that declares nothing runs): a synced start and
    // a synced result per invocation, one after another.
    let f = effect_fanout(&["--durable", "--concurrency", "1"]);
    let synced = f["log"]["synced_commits"].as_u64().unwrap();
    assert!(synced >= 300, "{synced} synced commits: {f:#}");
}

#[test]
fn an_in_memory_effect_fan_out_has_no_log_figures() {
    let f = effect_fanout(&[]);
    assert_eq!(f["invocations"], 300, "{f:#}");
    assert!(f.get("log").is_none(), "{f:#}");
}
