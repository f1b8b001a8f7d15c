//! A package must not be able to hold the host: not by waiting in WASI (sleep, poll),
//! not by calling cheap host functions forever, not by handing the host large strings,
//! and not in `describe()` at load. Every deadline reaches a guest wherever it waits.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use heddle_core::builder::graph;
use heddle_core::{EventKind, RunStatus, Value};
use heddle_kernel::runtime::RunOptions;
use heddle_kernel::{Call, ErrorKind, Registry, run_graph};
use heddle_wasm::{
    EngineSettings, PackageError, PackageGrant, PackageStore, WasmConfig, WasmHost, WasmPackage,
};
use serde_json::json;

/// Fails the test instead of hanging it when the guest is never interrupted. The bound
/// is far above the deadlines under test: only a missing interrupt reaches it.
async fn or_hang<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("the guest was never interrupted: the host hangs")
}

fn grant(g: PackageGrant) -> WasmConfig {
    let mut c = WasmConfig::default();
    c.packages.insert("hostile".into(), g);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_deadline_interrupts_a_guest_waiting_in_a_wasi_sleep() {
    let p = hostile_provider(grant(PackageGrant {
        timeout_ms: Some(300),
        ..Default::default()
    }))
    .await;
    for node in ["hostile.sleep", "hostile.sleep_in_loop"] {
        let (r, _, _) = or_hang(invoke(&p, node, inputs([]), None)).await;
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Deadline, "{node}: {e:?}");
        assert!(
            e.message.contains("`n1`") && e.message.contains("deadline"),
            "{}",
            e.message
        );
    }
    // The executor stays usable after an interrupted wait.
    let (r, _, _) = invoke(&p, "hostile.sleep", inputs([("ms", Value::Int(1))]), None).await;
    assert_eq!(r.unwrap().get("out"), Some(&Value::Int(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_interrupts_a_guest_waiting_in_a_wasi_sleep() {
    let p = hostile_provider(WasmConfig::default()).await;
    let exec = create(&p, "n1", "hostile.sleep", BTreeMap::new(), None);
    let (c, h) = ctx("n1", "hostile.sleep", None, false);
    let cancel = h.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let e = or_hang(exec.invoke(Call {
        inputs: inputs([]),
        ctx: c,
    }))
    .await
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_deadline_applies_to_packages_without_one() {
    let mut config = WasmConfig::default();
    config.wasm.default_timeout_ms = 300;
    let p = hostile_provider(config).await;
    let (r, _, _) = or_hang(invoke(&p, "hostile.sleep", inputs([]), None)).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadline, "{e:?}");
    assert!(e.message.contains("300 ms"), "{}", e.message);
    // A package grant's own timeout replaces the default (here: a longer one).
    let mut config = grant(PackageGrant {
        timeout_ms: Some(60_000),
        ..Default::default()
    });
    config.wasm.default_timeout_ms = 300;
    let p = hostile_provider(config).await;
    let (r, _, _) = invoke(&p, "hostile.sleep", inputs([("ms", Value::Int(600))]), None).await;
    assert_eq!(r.unwrap().get("out"), Some(&Value::Int(600)));
}

#[test]
fn the_default_deadline_is_on_out_of_the_box() {
    assert!(EngineSettings::default().default_timeout_ms > 0);
}

fn describe_host(ms: u64) -> WasmHost {
    WasmHost::new(EngineSettings {
        describe_timeout_ms: ms,
        ..settings()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_deadline_interrupts_a_sleeping_describe_at_load_and_install() {
    let host = describe_host(300);
    let e = or_hang(WasmPackage::load_dir(&host, &package_dir("describe-sleep")))
        .await
        .unwrap_err();
    assert!(matches!(e, PackageError::Describe { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("describe-sleep") && text.contains("300 ms"),
        "{text}"
    );

    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    let e = or_hang(store.install(&host, &package_dir("describe-sleep")))
        .await
        .unwrap_err();
    assert!(matches!(e, PackageError::Describe { .. }), "{e:?}");
    assert!(store.list().unwrap().is_empty(), "refused, not installed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_cost_fuel() {
    // Only fuel charged for host calls can stop this loop before the (long) deadline.
    let p = hostile_provider(grant(PackageGrant {
        fuel: Some(1_000_000_000),
        timeout_ms: Some(60_000),
        ..Default::default()
    }))
    .await;
    let (r, ctx, _) = or_hang(invoke(&p, "hostile.poll_cancelled", inputs([]), None)).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::FuelExhausted, "{e:?}");
    assert_eq!(ctx.metrics().fuel, Some(1_000_000_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_secret_names_are_bounded_in_size_and_count() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, h) = invoke(
        &p,
        "hostile.secret_flood",
        inputs([("count", Value::Int(1000)), ("bytes", Value::Int(1 << 20))]),
        None,
    )
    .await;
    r.unwrap();
    let logs = h.sink.logs();
    let total: usize = logs.iter().map(String::len).sum();
    assert!(
        total <= 128 << 10,
        "refusals logged {total} bytes in {} lines",
        logs.len()
    );
    assert!(logs.iter().any(|l| l.contains("not granted")), "{logs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asset_ids_are_bounded_in_size_and_count() {
    let p = hostile_provider(WasmConfig::default()).await;
    // Too long.
    let (r, ctx, _) = invoke(
        &p,
        "hostile.asset_flood",
        inputs([("count", Value::Int(1)), ("bytes", Value::Int(1 << 20))]),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.signature.as_deref(), Some("wasm:host-limit"), "{e:?}");
    assert!(
        e.message.contains("asset id") && e.message.contains("`n1`"),
        "{}",
        e.message
    );
    assert!(ctx.metrics().assets.is_empty());
    // Too many.
    let (r, ctx, _) = invoke(
        &p,
        "hostile.asset_flood",
        inputs([("count", Value::Int(100_000)), ("bytes", Value::Int(10))]),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.signature.as_deref(), Some("wasm:host-limit"), "{e:?}");
    assert!(ctx.metrics().assets.len() <= 1000);
    // Within the limits they are all recorded.
    let (r, ctx, _) = invoke(
        &p,
        "hostile.asset_flood",
        inputs([("count", Value::Int(3)), ("bytes", Value::Int(10))]),
        None,
    )
    .await;
    r.unwrap();
    assert_eq!(ctx.metrics().assets.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_log_lines_are_cut_and_counted_against_the_cap() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, h) = invoke(
        &p,
        "hostile.log_flood",
        inputs([("count", Value::Int(1000)), ("bytes", Value::Int(1 << 20))]),
        None,
    )
    .await;
    r.unwrap();
    let logs = h.sink.logs();
    let total: usize = logs.iter().map(String::len).sum();
    assert!(total <= 128 << 10, "{total} bytes of logs kept");
    assert!(logs.iter().any(|l| l.contains("truncated")), "no marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_run_outputs_are_capped_with_a_marker() {
    let doc = graph(
        &[
            (
                "emit",
                "hostile.re_emit",
                json!({"count": 200, "bytes": 1048576}),
            ),
            ("out", "heddle.output", json!({"name": "result"})),
        ],
        &[("emit", "out", "out", "value")],
    );
    let mut reg = Registry::with_builtins();
    reg.add(Arc::new(hostile_provider(WasmConfig::default()).await))
        .unwrap();
    let opts = RunOptions {
        output_cap_bytes: 8 << 20,
        ..Default::default()
    };
    let r = run_graph(&doc, &reg, opts).await.unwrap();
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let values = &r.outputs["result"];
    assert_eq!(values.len(), 200, "every value is accounted for");
    let kept: usize = values.iter().filter_map(|v| v.as_str()).map(str::len).sum();
    assert!(kept <= 9 << 20, "{kept} bytes of outputs retained");
    assert!(
        values
            .iter()
            .any(|v| v.as_str().is_some_and(|s| s.contains("not retained"))),
        "no marker"
    );
    // The events retained with the run are bounded the same way.
    let in_events: usize = r
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Output { value, .. } => value.as_str().map(str::len),
            _ => None,
        })
        .sum();
    assert!(in_events <= 9 << 20, "{in_events} bytes of output events");
}
