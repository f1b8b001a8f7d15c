//! A substitute is checked against everything the node promised (its declared output
//! types and the fields the graph declared on an output) before it is accepted; a broken
//! promise is a repair round the decider can correct, and the escalation shows the fields.

use super::*;

/// `judge` (a constant, its `value` promised as `{id: string}`) → output `out`.
fn judged(value: serde_json::Value) -> GraphDoc {
    let mut doc = graph(
        &[
            ("judge", "heddle.constant", json!({ "value": value })),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[("judge", "value", "out", "value")],
    );
    doc.nodes[0].output =
        Some(serde_json::from_value(json!({"fields": [{"key": "id", "type": "string"}]})).unwrap());
    doc
}

/// Answers with `first` in the first round and `then` in every repair round.
struct Repairs {
    first: Verdict,
    then: Verdict,
    seen: Mutex<Vec<Escalation>>,
}

impl Supervisor for Repairs {
    fn name(&self) -> &str {
        "repairs"
    }
    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        self.seen.lock().unwrap().push(e.clone());
        let v = if e.repair_round == 0 {
            self.first.clone()
        } else {
            self.then.clone()
        };
        Box::pin(async move { Ok(Decision::new(v, DecidedBy::Agent)) })
    }
}

fn substitute(v: serde_json::Value) -> Verdict {
    Verdict::Substitute {
        outputs: [("value".to_string(), Value::from_json(v))].into(),
    }
}

#[tokio::test]
async fn a_substitute_breaking_the_declared_fields_is_a_repair_round_the_decider_corrects() {
    let h = Arc::new(Repairs {
        first: substitute(json!({"id": 7})),
        then: substitute(json!({"id": "7"})),
        seen: Mutex::new(Vec::new()),
    });
    let opts = RunOptions {
        supervisor: Some(h.clone()),
        ..RunOptions::default()
    };
    let r = run(&judged(json!({"id": 7})), opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::from_json(json!({"id": "7"}))]);
    let i = interventions(&r);
    assert_eq!(i.len(), 2, "{i:#?}");
    let rejected = i[0]
        .rejected
        .as_deref()
        .expect("the first substitute is refused");
    assert!(
        rejected.contains("field `id` must be string, got int"),
        "{rejected}"
    );
    assert!(i[1].rejected.is_none());
    // The decider was told why, and shown what the node promised.
    let seen = h.seen.lock().unwrap();
    assert_eq!(seen[1].repair_round, 1);
    assert!(
        seen[1]
            .repair_error
            .as_deref()
            .unwrap()
            .contains("field `id`")
    );
    let declared = serde_json::to_value(&seen[0].declared_outputs["value"]).unwrap();
    assert_eq!(declared["type"], "any", "{declared}");
    assert_eq!(declared["fields"][0]["key"], "id", "{declared}");
    assert_eq!(declared["fields"][0]["type"], "string", "{declared}");
}

#[tokio::test]
async fn a_policy_substitute_that_breaks_the_fields_is_refused_three_times_never_accepted() {
    let opts = RunOptions {
        supervisor: policy(
            "[[rule]]\nverdict = \"substitute\"\noutputs = { value = { id = 7 } }\n",
        ),
        ..RunOptions::default()
    };
    let r = run(&judged(json!({"id": 7})), opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let i = interventions(&r);
    assert_eq!(i.len(), 4, "{i:#?}");
    assert!(i[..3].iter().all(|x| x.rejected.is_some()), "{i:#?}");
    assert_eq!(i[3].decided_by, DecidedBy::Kernel);
    let error = r.error.unwrap();
    assert!(
        error.contains("valid substitute") && error.contains("field `id`"),
        "{error}"
    );
    assert!(r.outputs.get("out").is_none_or(Vec::is_empty));
}
