//! All four languages in one graph, failures naming the node, and instance lifecycle
//! (no state leaks between fresh invocations; a foreign WIT version is refused).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_js_c_and_rust_nodes_share_one_graph() {
    let (p, _store) = provider(
        &[
            "sdk/python/examples/textstats",
            "sdk/js/examples/jsonkit",
            "sdk/c/examples/cstrings",
        ],
        WasmConfig::default(),
    )
    .await;
    let reg = registry(p);
    // JSON text -> JS parse -> JS pick -> Rust json.get -> Python word_count ->
    // Rust text.join -> C crc32.
    let g = graph(
        &[
            ("doc", "heddle.input", json!({"type": "str"})),
            ("parse", "jsonkit.parse", json!({})),
            ("pick", "jsonkit.pick", json!({"fields": ["body"]})),
            ("get", "std.json.get", json!({"path": "body"})),
            ("wc", "textstats.word_count", json!({"top": 3})),
            ("join", "std.text.join", json!({"sep": " "})),
            ("crc", "cstrings.crc32", json!({})),
            ("top", "heddle.output", json!({})),
            ("crc32", "heddle.output", json!({})),
        ],
        &[
            ("doc", "value", "parse", "text"),
            ("parse", "value", "pick", "object"),
            ("pick", "picked", "get", "value"),
            ("get", "value", "wc", "text"),
            ("wc", "top_words", "join", "items"),
            ("join", "text", "top", "value"),
            ("join", "text", "crc", "text"),
            ("crc", "crc32", "crc32", "value"),
        ],
    );
    let doc = r#"{"title":"x","body":"b a c a b a"}"#;
    let r = run(&reg, &g, &[("doc", Value::str(doc))]).await;
    assert_completed(&r);
    assert_eq!(outs(&r, "top"), vec![serde_json::json!("a b c")]);
    assert_eq!(outs(&r, "crc32"), vec![serde_json::json!(crc32(b"a b c"))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_foreign_node_fails_the_run_naming_the_node() {
    let (p, _store) = provider(&["sdk/python/examples/textstats"], WasmConfig::default()).await;
    let reg = registry(p);
    let g = graph(
        &[
            ("line", "heddle.input", json!({"type": "str"})),
            ("parse", "textstats.parse_record", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("line", "value", "parse", "line"),
            ("parse", "record", "out", "value"),
        ],
    );
    let r = run(&reg, &g, &[("line", Value::str("nonsense"))]).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        failed_with(&r, "parse").contains("malformed"),
        "{:?}",
        r.nodes["parse"]
    );
    assert!(outs(&r, "out").is_empty());
}

// ---- lifecycle -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interpreter_state_never_leaks_between_fresh_invocations() {
    let (p, _store) = provider(
        &[
            "sdk/build/tests/fixtures/pykit",
            "sdk/build/tests/fixtures/jskit",
        ],
        WasmConfig::default(),
    )
    .await;
    for ty in ["pykit.counter", "jskit.counter"] {
        for _ in 0..3 {
            let out = invoke(&p, ty, &[], None).await.unwrap();
            assert_eq!(
                out.get("calls"),
                Some(&Value::Int(1)),
                "{ty}: a fresh instance per invocation"
            );
        }
    }
    // The warm variants answer correctly across reuse.
    for ty in ["pykit.echo_warm", "jskit.echo_warm"] {
        for i in 0..3i64 {
            let out = invoke(&p, ty, &[("value", Value::Int(i))], None)
                .await
                .unwrap();
            assert_eq!(out.get("value"), Some(&Value::Int(i)));
        }
    }
}
