//! Values through chains, graph inputs (typed, streaming), streaming outputs and
//! controlled nodes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_chain_delivers_outputs_and_a_gapless_event_record() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x", "type": "int"})),
            ("p", "heddle.passthrough", json!({})),
            ("out", "heddle.output", json!({"name": "result"})),
        ],
        &[
            ("in", "value", "p", "value"),
            ("p", "value", "out", "value"),
        ],
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), Value::Int(5));
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["result"], vec![Value::Int(5)]);
    assert_eq!(r.nodes["p"].invocations, 1);
    for (i, e) in r.events.iter().enumerate() {
        assert_eq!(e.seq, i as u64);
    }
    assert!(matches!(
        r.events.first().unwrap().kind,
        EventKind::Run {
            status: RunStatus::Running,
            ..
        }
    ));
    assert!(matches!(
        r.events.last().unwrap().kind,
        EventKind::Run {
            status: RunStatus::Completed,
            ..
        }
    ));
    let completed_p = r.events.iter().find_map(|e| match &e.kind {
        EventKind::Node {
            node_id,
            status: NodeStatus::Completed,
            result,
            ..
        } if node_id == "p" => result.clone(),
        _ => None,
    });
    assert_eq!(completed_p.unwrap()["value"], Value::Int(5));
    assert!(r.events.iter().any(|e| matches!(&e.kind, EventKind::Output { name, value, .. } if name == "result" && *value == Value::Int(5))));
    assert!(r.events.iter().any(|e| matches!(
        &e.kind,
        EventKind::Edge {
            status: EdgeStatus::Completed,
            counter: 1,
            ..
        }
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_input_type_or_missing_input_is_refused_before_the_run() {
    let (reg, _) = registry();
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "x", "type": "int"})),
            ("out", "heddle.output", json!({})),
        ],
        &[("in", "value", "out", "value")],
    );
    let e = run_graph(&doc, &reg, RunOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, KernelError::Inputs(InputErrors(v))
            if matches!(&v[..], [InputError::Missing { name, .. }] if name == "x")),
        "{e}"
    );
    let mut opts = RunOptions::default();
    opts.inputs.insert("x".into(), Value::str("nope"));
    let e = run_graph(&doc, &reg, opts).await.unwrap_err();
    assert!(e.to_string().contains("input `x` (node in)"), "{e}");
    let bad = graph(&[("a", "no.such.type", json!({}))], &[]);
    let e = run_graph(&bad, &reg, RunOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, KernelError::Invalid(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_input_pushed_while_live_reaches_a_streaming_input_node() {
    let (reg, _) = registry();
    let doc = graph(
        &[
            (
                "in",
                "heddle.input",
                json!({"name": "nums", "streaming": true, "type": "int"}),
            ),
            ("sum", "test.running_sum", json!({})),
            ("sums", "heddle.output", json!({})),
            ("total", "heddle.output", json!({})),
        ],
        &[
            ("in", "value", "sum", "value"),
            ("sum", "sum", "sums", "value"),
            ("sum", "total", "total", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let run = Run::new(plan, &reg, RunOptions::default()).unwrap();
    let mut events = run.subscribe();
    let h = run.start();
    for v in [1, 2, 3] {
        h.push_input("nums", Value::Int(v)).await.unwrap();
        // The running sum for this value arrives while the input is still open.
        within(async {
            loop {
                let e = events.next().await.expect("run still live");
                if let EventKind::Output { name, value, .. } = &e.kind
                    && name == "sums"
                    && value.as_i64() == Some(v * (v + 1) / 2)
                {
                    break;
                }
            }
        })
        .await;
    }
    assert!(matches!(
        h.push_input("nope", Value::Int(1)).await,
        Err(KernelError::Input(InputError::Unknown { .. }))
    ));
    assert!(
        h.push_input("nums", Value::str("x")).await.is_err(),
        "type-checked"
    );
    h.finish_input("nums").await.unwrap();
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["sums"]), vec![1, 3, 6]);
    assert_eq!(ints(&r.outputs["total"]), vec![6]);
    assert_eq!(r.nodes["sum"].invocations, 1, "one stream session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_output_is_routed_while_the_invocation_runs() {
    let doc = graph(
        &[
            ("n", "heddle.constant", json!({"value": 3})),
            ("e", "test.emit", json!({})),
            ("p", "test.probe", json!({})),
            ("out", "heddle.output", json!({})),
            ("done", "heddle.output", json!({})),
        ],
        &[
            ("n", "value", "e", "n"),
            ("e", "value", "p", "value"),
            ("p", "value", "out", "value"),
            ("e", "done", "done", "value"),
        ],
    );
    // test.emit waits after each emit until test.probe has seen the value: this run only
    // finishes if emitted values travel downstream before the invocation returns.
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![0, 1, 2]);
    assert_eq!(r.outputs["done"], vec![Value::Bool(true)]);
    assert_eq!(r.nodes["e"].invocations, 1);
    assert_eq!(r.nodes["p"].invocations, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controlled_node_runs_per_control_event_with_latest_data_and_non_persisting_properties() {
    let doc = graph(
        &[
            ("x", "heddle.constant", json!({"value": 10})),
            (
                "ctl",
                "test.controller",
                json!({"events": [
                    {"factor": 2},
                    {"event_type": "run", "properties": {"factor": 3}},
                    {},
                    {"properties": {"factor": 5}},
                    7
                ]}),
            ),
            ("s", "test.scale", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("x", "value", "s", "x"),
            ("ctl", "__control__", "s", "__control__"),
            ("s", "out", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    // {} runs with the declared default factor: earlier event properties did not stick;
    // the non-object 7 is not a control event.
    assert_eq!(ints(&r.outputs["out"]), vec![20, 30, 10, 50]);
    assert_eq!(r.nodes["s"].invocations, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_control_answers_concurrent_callers_in_fifo_order() {
    let (reg, _) = registry();
    // A streaming input behind a control edge keeps a controller live until the end,
    // so the caller can drive the node alongside it.
    let doc = graph(
        &[
            ("ctl", "heddle.input", json!({"streaming": true})),
            ("p", "heddle.passthrough", json!({})),
            ("x", "heddle.constant", json!({"value": 10})),
            ("s", "test.scale", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("ctl", "value", "p", "value"),
            ("p", "value", "s", "__control__"),
            ("x", "value", "s", "x"),
            ("s", "out", "out", "value"),
        ],
    );
    let plan = heddle_core::plan::plan(&doc, &reg).unwrap();
    let h = Run::new(plan, &reg, RunOptions::default()).unwrap().start();
    let call = |f: i64| {
        let mut p = BTreeMap::new();
        p.insert("factor".to_string(), Value::Int(f));
        h.send_control("s", p)
    };
    let (a, b, c) = within(async { tokio::join!(call(1), call(2), call(3)) }).await;
    let got: Vec<i64> = [a, b, c]
        .into_iter()
        .map(|r| r.unwrap().get("out").unwrap().as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![10, 20, 30]);
    assert!(matches!(
        h.send_control("x", BTreeMap::new()).await,
        Err(KernelError::NotControlled(_))
    ));
    assert!(matches!(
        h.send_control("nope", BTreeMap::new()).await,
        Err(KernelError::UnknownNode(id)) if id == "nope"
    ));
    let r = within(h.wait()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ints(&r.outputs["out"]), vec![10, 20, 30]);
}
