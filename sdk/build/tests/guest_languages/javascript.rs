//! JavaScript nodes: a mixed graph, recoverable errors, fuel and deadline, fetch().

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_nodes_run_in_a_graph_with_rust_and_native_nodes() {
    let (p, _store) = provider(&["sdk/js/examples/jsonkit"], WasmConfig::default()).await;
    let reg = registry(p);
    let g = graph(
        &[
            ("doc", "heddle.input", json!({"type": "str"})),
            ("parse", "jsonkit.parse", json!({})),
            (
                "pick",
                "jsonkit.pick",
                json!({"fields": ["name", "tags", "nope"]}),
            ),
            ("str", "std.json.stringify", json!({})),
            ("entries", "jsonkit.entries", json!({})),
            ("picked", "heddle.output", json!({})),
            ("missing", "heddle.output", json!({})),
            ("entry", "heddle.output", json!({})),
        ],
        &[
            ("doc", "value", "parse", "text"),
            ("parse", "value", "pick", "object"),
            ("pick", "picked", "str", "value"),
            ("str", "text", "picked", "value"),
            ("pick", "missing", "missing", "value"),
            ("parse", "value", "entries", "object"),
            ("entries", "entry", "entry", "value"),
        ],
    );
    let doc = r#"{"name":"heddle","size":3,"tags":["a","b"]}"#;
    let r = run(&reg, &g, &[("doc", Value::str(doc))]).await;
    assert_completed(&r);
    let picked: serde_json::Value = serde_json::from_str(
        outs(&r, "picked")[0]
            .as_str()
            .expect("stringify gives text"),
    )
    .unwrap();
    assert_eq!(
        picked,
        serde_json::json!({"name": "heddle", "tags": ["a", "b"]})
    );
    assert_eq!(outs(&r, "missing"), vec![serde_json::json!(["nope"])]);
    assert_eq!(
        outs(&r, "entry"),
        vec![
            serde_json::json!(["name", "heddle"]),
            serde_json::json!(["size", 3]),
            serde_json::json!(["tags", ["a", "b"]])
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_recoverable_error_carries_the_raw_text_as_candidate() {
    let (p, _store) = provider(&["sdk/js/examples/jsonkit"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "jsonkit.parse",
        &[("text", Value::str("{\"a\": 1,,}"))],
        None,
    )
    .await
    .expect_err("bad JSON");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(err.signature.as_deref(), Some("json:parse"));
    assert!(err.message.starts_with("invalid JSON"), "{}", err.message);
    let candidate = err.candidate.expect("raw text as candidate");
    assert_eq!(candidate.get("value"), Some(&Value::str("{\"a\": 1,,}")));

    // A plain exception (wrong input type) fails the node with a js: signature.
    let err = invoke(
        &p,
        "jsonkit.pick",
        &[
            ("object", Value::from(serde_json::json!({"a": 1}))),
            ("fields", Value::from(5i64)),
        ],
        None,
    )
    .await
    .expect_err("fields is not iterable");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(
        err.signature.as_deref(),
        Some("js:TypeError"),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_infinite_loop_is_stopped_by_fuel_and_by_the_deadline() {
    let grant = PackageGrant {
        fuel: Some(500_000_000),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/jskit"],
        kit_config("jskit", grant),
    )
    .await;
    let err = invoke(&p, "jskit.spin", &[], None)
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::FuelExhausted, "{}", err.message);

    let grant = PackageGrant {
        fuel: Some(u64::MAX / 2),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/jskit"],
        kit_config("jskit", grant),
    )
    .await;
    let limits = NodeLimits {
        timeout_ms: Some(300),
        ..Default::default()
    };
    let err = invoke(&p, "jskit.spin", &[], Some(limits))
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::Deadline, "{}", err.message);
    assert!(err.message.contains("n1"), "{}", err.message);
    let ok = invoke(
        &p,
        "jskit.echo",
        &[("value", Value::str("still alive"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.get("value"), Some(&Value::str("still alive")));
}

/// `fetch()` in an async `run` goes out through the host's wasi:http: a granted
/// destination answers (the request's headers arrive as the guest set them), an error
/// status becomes the guest's `http:<status>` failure, and an ungranted port is refused
/// before any connection (its server never sees one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_fetch_reaches_the_granted_destinations_and_nothing_else() {
    let Fetch {
        echo,
        failing,
        ungranted,
        config,
    } = Fetch::start("jskit", 404).await;
    let (p, _store) = provider(&["sdk/build/tests/fixtures/jskit"], config).await;

    let out = invoke(
        &p,
        "jskit.fetch",
        &[("url", fetch_url(&echo, "/hello"))],
        None,
    )
    .await
    .expect("a granted destination answers");
    assert_eq!(out.get("status").map(json), Some(serde_json::json!(200)));
    let body = out
        .get("body")
        .and_then(|v| v.as_str())
        .expect("a text body");
    let headers: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(headers["x-probe"], "jskit", "{headers}");
    let got = echo.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("GET", "/hello")
    );

    let err = invoke(
        &p,
        "jskit.fetch",
        &[("url", fetch_url(&failing, "/nope"))],
        None,
    )
    .await
    .expect_err("404 fails the node");
    assert_eq!(
        err.signature.as_deref(),
        Some("http:404"),
        "{}",
        err.message
    );
    assert_eq!(failing.received().len(), 1);

    let err = invoke(
        &p,
        "jskit.fetch",
        &[("url", fetch_url(&ungranted, "/"))],
        None,
    )
    .await
    .expect_err("an ungranted port is refused");
    assert_eq!(
        err.signature.as_deref(),
        Some("js:TypeError"),
        "{}",
        err.message
    );
    assert!(err.message.contains("NetworkError"), "{}", err.message);
    assert_eq!(ungranted.connections(), 0, "refused before connecting");
}
