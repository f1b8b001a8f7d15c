//! C nodes: a mixed graph, recoverable errors, fuel and file grants.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nodes_run_in_a_graph_with_rust_and_native_nodes() {
    let (p, _store) = provider(&["sdk/c/examples/cstrings"], WasmConfig::default()).await;
    let reg = registry(p);
    let g = graph(
        &[
            ("text", "heddle.input", json!({"type": "str"})),
            ("nums", "heddle.input", json!({"type": "list[str]"})),
            ("upper", "std.text.case", json!({"mode": "upper"})),
            ("crc", "cstrings.crc32", json!({})),
            ("each", "heddle.foreach", json!({})),
            ("int", "cstrings.parse_int", json!({})),
            ("all", "heddle.collect", json!({})),
            ("sum", "std.math.aggregate", json!({"op": "sum"})),
            ("crc32", "heddle.output", json!({})),
            ("length", "heddle.output", json!({})),
            ("total", "heddle.output", json!({})),
        ],
        &[
            ("text", "value", "upper", "text"),
            ("upper", "text", "crc", "text"),
            ("crc", "crc32", "crc32", "value"),
            ("crc", "length", "length", "value"),
            ("nums", "value", "each", "list"),
            ("each", "item", "int", "text"),
            ("int", "value", "all", "item"),
            ("all", "list", "sum", "items"),
            ("sum", "result", "total", "value"),
        ],
    );
    let nums = Value::from(vec![Value::str("40"), Value::str(" 2 "), Value::str("-10")]);
    let r = run(
        &reg,
        &g,
        &[("text", Value::str("hello, world")), ("nums", nums)],
    )
    .await;
    assert_completed(&r);
    assert_eq!(
        outs(&r, "crc32"),
        vec![serde_json::json!(crc32(b"HELLO, WORLD"))]
    );
    assert_eq!(outs(&r, "length"), vec![serde_json::json!(12)]);
    assert_eq!(outs(&r, "total").len(), 1);
    assert_eq!(outs(&r, "total")[0].as_f64(), Some(32.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_recoverable_error_carries_the_number_read_as_candidate() {
    let (p, _store) = provider(&["sdk/c/examples/cstrings"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "cstrings.parse_int",
        &[("text", Value::str("42abc"))],
        None,
    )
    .await
    .expect_err("trailing characters");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(err.signature.as_deref(), Some("int:trailing"));
    assert!(err.message.contains("\"abc\""), "{}", err.message);
    assert_eq!(
        err.candidate.expect("candidate").get("value"),
        Some(&Value::Int(42))
    );
    let err = invoke(&p, "cstrings.parse_int", &[("text", Value::str("x"))], None)
        .await
        .unwrap_err();
    assert_eq!(err.signature.as_deref(), Some("int:parse"));
    assert!(err.candidate.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_guest_is_stopped_by_fuel_and_reads_no_file_without_a_grant() {
    let grant = PackageGrant {
        fuel: Some(200_000_000),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/ckit"],
        kit_config("ckit", grant),
    )
    .await;
    let err = invoke(&p, "ckit.spin", &[], None)
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::FuelExhausted, "{}", err.message);
    let err = invoke(
        &p,
        "ckit.read_file",
        &[("path", Value::str("/etc/passwd"))],
        None,
    )
    .await
    .expect_err("no grant");
    assert_eq!(err.signature.as_deref(), Some("io:open"), "{}", err.message);

    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("x.txt"), "granted").unwrap();
    let grant = PackageGrant {
        dirs: vec![DirGrant {
            host: data.path().to_path_buf(),
            guest: "/data".into(),
            mode: DirMode::Ro,
        }],
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/ckit"],
        kit_config("ckit", grant),
    )
    .await;
    let ok = invoke(
        &p,
        "ckit.read_file",
        &[("path", Value::str("/data/x.txt"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.get("text"), Some(&Value::str("granted")));
}
