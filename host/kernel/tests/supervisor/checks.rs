//! A failed `heddle.check` is the graph's verdict on its data, not a node failure to
//! repair: it fails the run whatever the supervisor would say, and is never escalated.

use super::*;

/// `verify` (a constant) → check `verify.output = 1` → output.
fn checked(value: i64) -> GraphDoc {
    graph(
        &[
            ("verify", "heddle.constant", json!({"value": value})),
            (
                "gate",
                "heddle.check",
                json!({"assert": "upstream.verify.output = 1", "message": "verify must be 1"}),
            ),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("verify", "value", "gate", "verify"),
            ("gate", "output", "out", "value"),
        ],
    )
}

#[tokio::test]
async fn a_failed_check_fails_the_run_under_a_policy_that_skips_or_retries_everything() {
    for policy_text in [
        "default = \"skip\"\n",
        "[[rule]]\nverdict = \"skip\"\n",
        "[[rule]]\nsignature = \"check:failed\"\nverdict = \"retry\"\n",
    ] {
        let opts = RunOptions {
            supervisor: policy(policy_text),
            ..RunOptions::default()
        };
        let r = run(&checked(2), opts).await;
        assert_eq!(r.status, RunStatus::Failed, "{policy_text}: {:?}", r.error);
        assert!(
            r.interventions.is_empty(),
            "{policy_text}: {:?}",
            r.interventions
        );
        assert!(
            !r.events.iter().any(|e| matches!(
                e.kind,
                EventKind::Escalation { .. } | EventKind::Decision { .. }
            )),
            "{policy_text}"
        );
        // Checked once: a check is deterministic, a retry would only repeat it.
        assert_eq!(r.nodes["gate"].invocations, 1, "{policy_text}");
        let NodeOutcome::Failed { error } = &r.nodes["gate"].outcome else {
            panic!("{policy_text}: {:?}", r.nodes["gate"].outcome)
        };
        assert!(error.contains("verify must be 1"), "{error}");
        assert!(r.outputs.get("out").is_none_or(Vec::is_empty));
    }
}

#[tokio::test]
async fn a_check_with_a_retry_policy_of_its_own_is_not_retried() {
    let mut doc = checked(2);
    doc.nodes[1].retry = serde_json::from_value(json!({"attempts": 3, "backoff_ms": 0})).unwrap();
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.nodes["gate"].invocations, 1);
}

#[tokio::test]
async fn a_check_that_holds_passes_under_supervision() {
    let opts = RunOptions {
        supervisor: policy("default = \"skip\"\n"),
        ..RunOptions::default()
    };
    let r = run(&checked(1), opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), 1);
}
