//! Python nodes: a mixed graph, recoverable errors, fuel and deadline, file grants,
//! outgoing HTTP (heddle.http).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_nodes_run_in_a_graph_with_rust_and_native_nodes() {
    let (p, _store) = provider(&["sdk/python/examples/textstats"], WasmConfig::default()).await;
    let reg = registry(p);
    // word_count (Python) feeds std.text.join (Rust); a list fans out over
    // parse_record (Python) and is collected; streamed tokens pass std.text.case (Rust).
    let g = graph(
        &[
            ("text", "heddle.input", json!({"type": "str"})),
            ("lines", "heddle.input", json!({"type": "list[str]"})),
            ("wc", "textstats.word_count", json!({"top": 2})),
            ("join", "std.text.join", json!({"sep": "+"})),
            ("each", "heddle.foreach", json!({})),
            ("parse", "textstats.parse_record", json!({})),
            ("all", "heddle.collect", json!({})),
            ("tok", "textstats.tokens", json!({})),
            ("up", "std.text.case", json!({"mode": "upper"})),
            ("words", "heddle.output", json!({})),
            ("top", "heddle.output", json!({})),
            ("records", "heddle.output", json!({})),
            ("tokens", "heddle.output", json!({})),
        ],
        &[
            ("text", "value", "wc", "text"),
            ("wc", "words", "words", "value"),
            ("wc", "top_words", "join", "items"),
            ("join", "text", "top", "value"),
            ("lines", "value", "each", "list"),
            ("each", "item", "parse", "line"),
            ("parse", "record", "all", "item"),
            ("all", "list", "records", "value"),
            ("text", "value", "tok", "text"),
            ("tok", "token", "up", "text"),
            ("up", "text", "tokens", "value"),
        ],
    );
    let lines = Value::from(vec![Value::str("a=1; b=two"), Value::str("c=3")]);
    let r = run(
        &reg,
        &g,
        &[
            ("text", Value::str("the cat saw the dog")),
            ("lines", lines),
        ],
    )
    .await;
    assert_completed(&r);
    assert_eq!(outs(&r, "words"), vec![serde_json::json!(5)]);
    assert_eq!(outs(&r, "top"), vec![serde_json::json!("the+cat")]);
    assert_eq!(
        outs(&r, "records"),
        vec![serde_json::json!([{"a": 1, "b": "two"}, {"c": 3}])]
    );
    assert_eq!(
        outs(&r, "tokens"),
        ["THE", "CAT", "SAW", "THE", "DOG"]
            .map(serde_json::Value::from)
            .to_vec()
    );
    let wc = &r.nodes["wc"].metrics;
    assert!(
        wc.fuel.is_some_and(|f| f > 0),
        "fuel is metered per invocation: {wc:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_recoverable_error_carries_signature_and_candidate() {
    let (p, _store) = provider(&["sdk/python/examples/textstats"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "textstats.parse_record",
        &[("line", Value::str("a=1; oops; b=2"))],
        None,
    )
    .await
    .expect_err("a malformed field fails the node");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(err.signature.as_deref(), Some("textstats:parse"));
    assert!(err.message.contains("'oops'"), "{}", err.message);
    let candidate = err
        .candidate
        .expect("the fields that parsed are the candidate");
    assert_eq!(
        json(candidate.get("record").unwrap()),
        serde_json::json!({"a": 1, "b": 2})
    );

    // Any other exception fails the node (not the host) with a python: signature.
    let err = invoke(
        &p,
        "textstats.word_count",
        &[("text", Value::str("x")), ("top", Value::str("two"))],
        None,
    )
    .await
    .expect_err("int('two') raises");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(
        err.signature.as_deref(),
        Some("python:ValueError"),
        "{}",
        err.message
    );
    // ...and the same package keeps working afterwards.
    let ok = invoke(
        &p,
        "textstats.word_count",
        &[("text", Value::str("a b a"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        json(ok.get("top_words").unwrap()),
        serde_json::json!(["a", "b"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_infinite_loop_is_stopped_by_fuel() {
    let grant = PackageGrant {
        fuel: Some(300_000_000),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/pykit"],
        kit_config("pykit", grant),
    )
    .await;
    let err = invoke(&p, "pykit.spin", &[], None)
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::FuelExhausted, "{}", err.message);
    assert!(
        err.message.contains("n1") && err.message.contains("fuel"),
        "{}",
        err.message
    );
    // A trap discards the instance; the next invocation starts clean.
    let ok = invoke(&p, "pykit.echo", &[("value", Value::from(7i64))], None)
        .await
        .unwrap();
    assert_eq!(ok.get("value"), Some(&Value::Int(7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_infinite_loop_is_stopped_by_the_deadline() {
    // Fuel large enough that only the wall clock can stop it.
    let grant = PackageGrant {
        fuel: Some(u64::MAX / 2),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/pykit"],
        kit_config("pykit", grant),
    )
    .await;
    let limits = NodeLimits {
        timeout_ms: Some(300),
        ..Default::default()
    };
    let err = invoke(&p, "pykit.spin", &[], Some(limits))
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::Deadline, "{}", err.message);
    assert!(
        err.message.contains("n1") && err.message.contains("deadline"),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_files_only_inside_a_granted_directory() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("hello.txt"), "hi from the host").unwrap();
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "secret").unwrap();
    let outside = outside.path().to_string_lossy().into_owned();

    // No grant: the guest sees no filesystem at all.
    let (p, _store) = provider(&["sdk/build/tests/fixtures/pykit"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "pykit.read_file",
        &[("path", Value::str(outside.clone()))],
        None,
    )
    .await
    .expect_err("no file access without a grant");
    assert_eq!(
        err.signature.as_deref(),
        Some("python:FileNotFoundError"),
        "{}",
        err.message
    );

    // A read-only grant of one directory: inside works, outside still does not.
    let grant = PackageGrant {
        dirs: vec![DirGrant {
            host: data.path().to_path_buf(),
            guest: "/data".into(),
            mode: DirMode::Ro,
        }],
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/pykit"],
        kit_config("pykit", grant),
    )
    .await;
    let ok = invoke(
        &p,
        "pykit.read_file",
        &[("path", Value::str("/data/hello.txt"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.get("text"), Some(&Value::str("hi from the host")));
    for path in [outside.as_str(), "/data/../etc/passwd"] {
        let err = invoke(&p, "pykit.read_file", &[("path", Value::str(path))], None)
            .await
            .expect_err("outside the grant");
        assert!(
            err.signature
                .as_deref()
                .is_some_and(|s| s.starts_with("python:")),
            "{path}: {err:?}"
        );
    }
}

/// `heddle.http` goes out through the host's wasi:http (the build adds its import to the
/// world): a granted destination answers and sees the request as the guest made it
/// (method, path, header, body), an error status becomes `http:<status>`, and an
/// ungranted port is refused before any connection with `http:denied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_reaches_the_granted_destinations_and_nothing_else() {
    let Fetch {
        echo,
        failing,
        ungranted,
        config,
    } = Fetch::start("pykit", 503).await;
    let (p, _store) = provider(&["sdk/build/tests/fixtures/pykit"], config).await;

    let out = invoke(
        &p,
        "pykit.fetch",
        &[
            ("url", fetch_url(&echo, "/items?page=2")),
            ("body", Value::str("hello from python")),
        ],
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
    assert_eq!(headers["x-probe"], "pykit", "{headers}");
    // Declared, not chunked: the host's body cap refuses a long one before sending it.
    assert_eq!(headers["content-length"], "17", "{headers}");
    let got = echo.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("POST", "/items?page=2")
    );
    assert_eq!(got[0].body, b"hello from python");

    let err = invoke(
        &p,
        "pykit.fetch",
        &[("url", fetch_url(&failing, "/"))],
        None,
    )
    .await
    .expect_err("503 fails the node");
    assert_eq!(
        err.signature.as_deref(),
        Some("http:503"),
        "{}",
        err.message
    );
    assert_eq!(failing.received().len(), 1);

    let err = invoke(
        &p,
        "pykit.fetch",
        &[("url", fetch_url(&ungranted, "/"))],
        None,
    )
    .await
    .expect_err("an ungranted port is refused");
    assert_eq!(
        err.signature.as_deref(),
        Some("http:denied"),
        "{}",
        err.message
    );
    assert_eq!(ungranted.connections(), 0, "refused before connecting");
}
