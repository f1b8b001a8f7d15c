//! Code nodes failing in supervised runs (subprocess mode, through the kernel): the
//! signature a policy rule matches is the code node's own (`code:exit:N`), never one read
//! from what the code printed, and lines printed on an output no edge leaves do not count
//! as emitted, so they take neither skip nor retry away.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::subprocess_nodes;
use heddle_core::builder::graph;
use heddle_core::supervise::{DecidedBy, Intervention, Verdict, VerdictAction};
use heddle_core::{GraphDoc, NodeOutcome, RunResult, RunStatus, SkipReason, Value};
use heddle_kernel::supervisor::{Policy, Supervisor};
use heddle_kernel::{Registry, RunOptions, run_graph};
use serde_json::json;

fn registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.add(Arc::new(subprocess_nodes())).unwrap();
    r
}

/// input `x` → bash `code` → output `out` (its result); with `stdout_out`, its stdout
/// also goes to output `lines`.
fn doc(code: &str, stdout_out: bool) -> GraphDoc {
    let mut nodes = vec![
        ("in", "heddle.input", json!({"name": "x"})),
        (
            "sh",
            "code.bash",
            json!({"code": code, "mode": "subprocess"}),
        ),
        ("out", "heddle.output", json!({"name": "out"})),
    ];
    let mut edges = vec![("in", "value", "sh", "x"), ("sh", "result", "out", "value")];
    if stdout_out {
        nodes.push(("lines", "heddle.output", json!({"name": "lines"})));
        edges.push(("sh", "stdout", "lines", "value"));
    }
    graph(&nodes, &edges)
}

async fn run(doc: &GraphDoc, policy: &str) -> RunResult {
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), Value::Int(7));
    let p: Arc<dyn Supervisor> = Arc::new(Policy::parse(policy, "test-policy.toml").unwrap());
    opts.supervisor = Some(p);
    tokio::time::timeout(Duration::from_secs(60), run_graph(doc, &registry(), opts))
        .await
        .expect("the run should not hang")
        .unwrap()
}

fn interventions(r: &RunResult) -> Vec<Intervention> {
    r.interventions
        .iter()
        .map(|v| Intervention::from_json(v).unwrap())
        .collect()
}

/// Echoes the item it was given, which happens to hold an HTTP-looking status, the way a
/// real script logs what it works on, then fails.
const ECHOES_AND_EXITS_3: &str = r#"echo "working on {\"id\": $x, \"status\": 404}" >&2
echo "GET /items/$x: HTTP 404 Not Found (from the item data)" >&2
exit 3"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_rule_on_code_exit_matches_and_no_signature_is_mined_from_stderr() {
    let r = run(
        &doc(ECHOES_AND_EXITS_3, false),
        "[[rule]]\nsignature = \"code:exit:*\"\nverdict = \"skip\"\n",
    )
    .await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let i = interventions(&r);
    assert_eq!(i.len(), 1, "{i:#?}");
    assert_eq!(
        i[0].escalation.failure_signature.as_deref(),
        Some("code:exit:3")
    );
    assert_eq!(i[0].verdict.action(), VerdictAction::Skip);
    assert_eq!(i[0].decided_by, DecidedBy::Policy);
    assert_eq!(
        r.nodes["sh"].outcome,
        NodeOutcome::Skipped {
            reason: SkipReason::Supervisor
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_verdict_on_a_code_exit_status_sticks() {
    // Sticky needs a signature: before, a code node's failures had none.
    let r = run(
        &doc(ECHOES_AND_EXITS_3, false),
        "[[rule]]\nsignature = \"code:exit:3\"\nverdict = \"skip\"\napply_to = \"signature\"\n",
    )
    .await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let i = interventions(&r);
    assert_eq!(
        i[0].verdict,
        Verdict::Skip {
            apply_to: heddle_core::supervise::ApplyTo::Signature
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceback_on_an_unconnected_stderr_leaves_skip_offered() {
    let code = r#"echo "Traceback (most recent call last):" >&2
echo "  File \"app.py\", line 3, in <module>" >&2
echo "ValueError: bad item $x" >&2
echo "a line on stdout nobody reads"
exit 1"#;
    let r = run(&doc(code, false), "[[rule]]\nverdict = \"skip\"\n").await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let i = interventions(&r);
    assert!(!i[0].escalation.emitted, "{:#?}", i[0].escalation);
    assert_eq!(
        i[0].escalation.allowed_actions.to_vec(),
        [VerdictAction::Skip, VerdictAction::Fail]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_sent_along_an_edge_is_emitted_and_only_end_stream_or_fail_remain() {
    let code = "echo 'partial result'\nexit 1";
    let r = run(&doc(code, true), "[[rule]]\nverdict = \"end_stream\"\n").await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let i = interventions(&r);
    assert!(i[0].escalation.emitted);
    assert_eq!(
        i[0].escalation.allowed_actions.to_vec(),
        [VerdictAction::EndStream, VerdictAction::Fail]
    );
    assert_eq!(r.outputs["lines"], vec![Value::str("partial result")]);
}
