//! One redaction rule for every text an escalation carries: a value masked in its inputs
//! (a sensitive field name, at any depth) never goes out verbatim in its error text.

use super::*;

#[tokio::test]
async fn credentials_masked_in_the_inputs_are_masked_in_the_error_text_too() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "req"})),
            (
                "login",
                "sup.echo_creds",
                json!({"password": "hunter2-pw", "api_token": "tok-777-abc"}),
            ),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "login", "req"),
            ("login", "value", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "req".into(),
        Value::from_json(json!({"url": "https://api.example/login",
                                 "headers": {"authorization": "Bearer zzz-hdr-999"}})),
    );
    opts.supervisor = policy("[[rule]]\nverdict = \"fail\"\nreason = \"bad login\"\n");
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let i = interventions(&r);
    let e = &i[0].escalation;
    assert_eq!(e.inputs["password"], Value::from("«redacted»"));
    assert!(e.detail.contains("pw=«redacted»"), "{}", e.detail);
    // The whole record, as the report and the event feed carry it.
    let record = serde_json::to_string(&r.interventions).unwrap()
        + &serde_json::to_string(
            &r.events
                .iter()
                .filter(|e| {
                    matches!(
                        e.kind,
                        EventKind::Escalation { .. } | EventKind::Decision { .. }
                    )
                })
                .collect::<Vec<_>>(),
        )
        .unwrap();
    for leaked in ["hunter2-pw", "tok-777-abc", "zzz-hdr-999"] {
        assert!(!record.contains(leaked), "{leaked} in {record}");
    }
    // What is not sensitive stays readable.
    assert!(record.contains("https://api.example/login"), "{record}");
}
