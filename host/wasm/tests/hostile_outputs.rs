//! What a package returns is checked at the boundary, and its failures are reported as
//! one honest line: the lying node and port are named, the limit that stopped a guest is
//! named, and nothing a guest sends is repeated or grows without bound.

mod common;

use std::collections::BTreeMap;

use common::*;
use heddle_core::Value;
use heddle_kernel::{ErrorKind, NodeError};
use heddle_wasm::{PackageError, PackageGrant, WasmConfig, WasmPackage};

fn assert_one_line(e: &NodeError) {
    assert!(
        !e.message.contains('\n') && !e.message.to_lowercase().contains("backtrace"),
        "not one line: {}",
        e.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_value_of_the_wrong_type_blames_the_node_and_port() {
    let p = hostile_provider(WasmConfig::default()).await;
    for (node, declared, detail) in [
        ("hostile.say_int_give_str", "int", "got str"),
        ("hostile.say_ints_give_mixed", "list[int]", "item 1"),
    ] {
        let (r, _, _) = invoke(&p, node, inputs([]), None).await;
        let e = r.unwrap_err();
        assert_eq!(e.signature.as_deref(), Some("wasm:output-type"), "{e:?}");
        assert!(
            e.message.contains("`n1`")
                && e.message.contains(node)
                && e.message.contains("`out`")
                && e.message.contains(declared)
                && e.message.contains(detail),
            "{}",
            e.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_value_of_the_wrong_type_fails_the_emitting_node() {
    let p = hostile_provider(WasmConfig::default()).await;
    let exec = create(&p, "n1", "hostile.emit_str_on_int", BTreeMap::new(), None);
    let (c, mut h) = ctx("n1", "hostile.emit_str_on_int", None, true);
    let e = exec
        .invoke(heddle_kernel::Call {
            inputs: inputs([]),
            ctx: c,
        })
        .await
        .unwrap_err();
    assert_eq!(e.signature.as_deref(), Some("wasm:output-type"), "{e:?}");
    assert!(
        e.message.contains("`n1`") && e.message.contains("`out`") && e.message.contains("int"),
        "{}",
        e.message
    );
    let mut rx = h.emitted.take().unwrap();
    assert!(rx.try_recv().is_err(), "the lie never went downstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_emit_fails_the_node_as_output_too_large() {
    let p = hostile_provider(WasmConfig::default()).await;
    let exec = create(&p, "n1", "hostile.re_emit", BTreeMap::new(), None);
    let (c, _h) = ctx("n1", "hostile.re_emit", None, true);
    let e = exec
        .invoke(heddle_kernel::Call {
            inputs: inputs([("count", Value::Int(1)), ("bytes", Value::Int(2 << 20))]),
            ctx: c,
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutputTooLarge, "{e:?}");
    assert_eq!(e.signature.as_deref(), Some("wasm:output-too-large"));
    assert!(
        e.message.contains("`n1`") && e.message.contains("`out`"),
        "{}",
        e.message
    );
    // The size, the limit and where the operator raises it.
    assert!(
        e.message.contains("is 2097") && e.message.contains("1048576-byte limit"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("`max_value_bytes` in the `[wasm]` section of heddle.toml"),
        "{}",
        e.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_that_is_not_one_fails_the_node() {
    let p = hostile_provider(WasmConfig::default()).await;
    for usd in [f64::NAN, f64::INFINITY, -1.0] {
        let (r, ctx, _) = invoke(
            &p,
            "hostile.bad_cost",
            inputs([("usd", Value::Float(usd))]),
            None,
        )
        .await;
        let e = r.unwrap_err();
        assert_eq!(
            e.signature.as_deref(),
            Some("wasm:bad-call"),
            "{usd}: {e:?}"
        );
        assert!(e.message.contains("`n1`"), "{}", e.message);
        assert_eq!(ctx.metrics().cost_usd, 0.0, "never added to the run's cost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_returned_twice_is_refused() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, _) = invoke(&p, "hostile.same_handle_twice", inputs([]), None).await;
    let e = r.unwrap_err();
    assert_eq!(
        e.signature.as_deref(),
        Some("wasm:duplicate-output"),
        "{e:?}"
    );
    assert!(e.message.contains("`out`"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_floats_are_refused() {
    let p = hostile_provider(WasmConfig::default()).await;
    for (node, what) in [("hostile.not_a_number", "NaN"), ("hostile.infinity", "inf")] {
        let (r, _, _) = invoke(&p, node, inputs([]), None).await;
        let e = r.unwrap_err();
        assert_eq!(e.signature.as_deref(), Some("wasm:bad-output"), "{e:?}");
        assert!(
            e.message.contains("`out`") && e.message.contains(what),
            "{}",
            e.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_over_the_host_call_limit_is_output_too_large() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, _) = invoke(
        &p,
        "hostile.huge",
        inputs([("bytes", Value::Int(20 << 20))]),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutputTooLarge, "{e:?}");
    assert_eq!(e.signature.as_deref(), Some("wasm:output-too-large"));
    assert!(e.message.contains("`n1`"), "{}", e.message);
    assert!(
        e.message
            .contains("`max_value_bytes` in the `[wasm]` section of heddle.toml (now 1048576"),
        "{}",
        e.message
    );
    assert_one_line(&e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_error_message_is_cut_once() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, _) = invoke(
        &p,
        "hostile.big_error",
        inputs([("bytes", Value::Int(8 << 20))]),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert!(e.message.len() <= 16 << 10, "{} bytes", e.message.len());
    assert!(e.message.contains("truncated"), "no marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_is_one_line_naming_the_exit_status() {
    let p = hostile_provider(WasmConfig::default()).await;
    // WASI 0.2 carries only success or failure: every non-zero code arrives as 1.
    let (r, _, _) = invoke(&p, "hostile.exit", inputs([("code", Value::Int(3))]), None).await;
    let e = r.unwrap_err();
    assert_eq!(e.signature.as_deref(), Some("wasm:exit"), "{e:?}");
    assert!(
        e.message.contains("exit(1)") && e.message.contains("`n1`"),
        "{}",
        e.message
    );
    assert_one_line(&e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_limits_are_one_line_naming_the_limit() {
    let p = hostile_provider(grant_memory(16)).await;
    let (r, _, _) = invoke(&p, "hostile.recurse", inputs([]), None).await;
    let e = r.unwrap_err();
    assert!(e.message.contains("stack"), "{}", e.message);
    assert_one_line(&e);
    let (r, _, _) = invoke(&p, "hostile.alloc", inputs([("mb", Value::Int(64))]), None).await;
    let e = r.unwrap_err();
    assert!(e.message.contains("16 MiB"), "{}", e.message);
    assert_one_line(&e);
}

fn grant_memory(mb: u64) -> WasmConfig {
    let mut c = WasmConfig::default();
    c.packages.insert(
        "hostile".into(),
        PackageGrant {
            memory_mb: Some(mb),
            ..Default::default()
        },
    );
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_describe_keeps_its_message() {
    let e = WasmPackage::load_dir(&host(), &package_dir("describe-panic"))
        .await
        .unwrap_err();
    assert!(matches!(e, PackageError::Describe { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("describe panicked on purpose"), "{text}");
    assert!(!text.to_lowercase().contains("backtrace"), "{text}");
}
