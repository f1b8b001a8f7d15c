//! `heddle bench --shape effect-chain`: a chain of nodes that are not retry-safe, their
//! effects counted on disk by the bench itself, and with `--durable` what the run's log
//! wrote, so "one synced write before a node starts" is a figure, not a claim.

mod support;

use support::*;

fn effect_chain(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "--shape",
        "effect-chain",
        "--size",
        "3",
        "--messages",
        "4",
        "--runs",
        "1",
        "--threads",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
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
