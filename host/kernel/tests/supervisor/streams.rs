//! Streaming outputs and inputs, and controlled nodes: the verdicts each may take.

use super::*;

#[tokio::test]
async fn streaming_output_after_emit_offers_end_stream_and_keeps_what_was_emitted() {
    let (doc, mut opts) = chain("sup.stream", json!({}), Value::Int(3));
    let h = Always::new(Verdict::EndStream);
    opts.supervisor = Some(h);
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(
        r.outputs["out"],
        vec![Value::Int(0), Value::Int(1), Value::Int(2)]
    );
    let i = interventions(&r);
    assert!(i[0].escalation.emitted);
    assert_eq!(
        i[0].escalation.allowed_actions.to_vec(),
        [
            heddle_core::supervise::VerdictAction::EndStream,
            heddle_core::supervise::VerdictAction::Fail
        ]
    );
}

#[tokio::test]
async fn streaming_input_node_may_only_end_the_stream_or_fail() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("sum", "sup.sum", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "sum", "value"),
            ("sum", "sum", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert(
        "xs".into(),
        Value::list(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(-1),
            Value::Int(5),
        ]),
    );
    // A handle asking for skip is overruled: only end_stream/fail are offered.
    opts.supervisor = Some(Always::new(Verdict::skip()));
    let r = run(&doc, opts.clone()).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(interventions(&r)[0].decided_by, DecidedBy::Kernel);
    opts.supervisor = Some(Always::new(Verdict::EndStream));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::Int(1), Value::Int(3)]);
}

#[tokio::test]
async fn controlled_node_retry_reruns_the_control_event() {
    // A streaming input behind a control edge keeps a controller live until the end,
    // so the caller can drive the node alongside it.
    let doc = graph(
        &[
            ("ctl", "heddle.input", json!({"streaming": true})),
            ("p", "heddle.passthrough", json!({})),
            ("c", "sup.ctl", json!({"x": 4})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("ctl", "value", "p", "value"),
            ("p", "value", "c", "__control__"),
            ("c", "out", "out", "value"),
        ],
    );
    let opts = RunOptions {
        supervisor: policy("[[rule]]\nverdict = \"retry\"\n"),
        ..Default::default()
    };
    let plan = heddle_core::plan::plan(&doc, &registry()).unwrap();
    let handle = Run::new(plan, &registry(), opts).unwrap().start();
    let out = handle.send_control("c", BTreeMap::new()).await.unwrap();
    assert_eq!(out.get("out"), Some(&Value::Int(40)));
    let r = handle.wait().await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(interventions(&r)[0].verdict, Verdict::Retry);
}

#[tokio::test]
async fn a_controller_is_offered_a_retry_only_when_the_node_it_ran_may_run_again() {
    use heddle_core::supervise::VerdictAction;
    for (target, retry) in [("sup.safe_target", true), ("sup.unsafe_target", false)] {
        let doc = graph(
            &[
                ("d", "sup.drive", json!({"target": "t"})),
                ("t", target, json!({})),
            ],
            &[("d", "__control__", "t", "__control__")],
        );
        let opts = RunOptions {
            supervisor: Some(Always::new(Verdict::Skip {
                apply_to: ApplyTo::Invocation,
            })),
            ..RunOptions::default()
        };
        let r = run(&doc, opts).await;
        let i = interventions(&r);
        let d = i
            .iter()
            .find(|v| v.escalation.node_id == "d")
            .unwrap_or_else(|| panic!("no escalation of d: {i:?}"));
        assert_eq!(
            d.escalation.allowed_actions.contains(VerdictAction::Retry),
            retry,
            "{target}: {:?}",
            d.escalation.allowed_actions
        );
        assert_eq!(r.nodes["t"].invocations, 1, "{target}");
    }
}
