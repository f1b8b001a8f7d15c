//! A package that misbehaves must fail its own node, with the node and the cause named,
//! and never take the host down or gain authority it was not granted.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use heddle_core::graph::AccessLevel;
use heddle_core::{NodeLimits, Value};
use heddle_kernel::{Call, ErrorKind, NodeProvider, Registry};
use heddle_wasm::{DirGrant, DirMode, PackageGrant, WasmConfig, WasmPackage, WasmProvider};

fn grant(g: PackageGrant) -> WasmConfig {
    let mut c = WasmConfig::default();
    c.packages.insert("hostile".into(), g);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_stopped_by_fuel() {
    let p = hostile_provider(grant(PackageGrant {
        fuel: Some(50_000_000),
        ..Default::default()
    }))
    .await;
    let (r, ctx, _) = invoke(&p, "hostile.spin", inputs([]), None).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::FuelExhausted, "{e:?}");
    assert!(
        e.message.contains("`n1`") && e.message.contains("hostile.spin"),
        "{}",
        e.message
    );
    assert!(e.message.contains("fuel"), "{}", e.message);
    assert_eq!(ctx.metrics().fuel, Some(50_000_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_limits_lower_the_fuel_budget() {
    let p = hostile_provider(WasmConfig::default()).await;
    let limits = NodeLimits {
        fuel: Some(1_000_000),
        ..Default::default()
    };
    let (r, ctx, _) = invoke(&p, "hostile.spin", inputs([]), Some(limits)).await;
    assert_eq!(r.unwrap_err().kind, ErrorKind::FuelExhausted);
    assert_eq!(ctx.metrics().fuel, Some(1_000_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_stopped_by_the_deadline() {
    // Unlimited fuel for practical purposes: only the wall clock can stop it.
    let p = hostile_provider(grant(PackageGrant {
        fuel: Some(u64::MAX / 2),
        timeout_ms: Some(200),
        ..Default::default()
    }))
    .await;
    let (r, _, _) = invoke(&p, "hostile.spin", inputs([]), None).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadline, "{e:?}");
    assert!(
        e.message.contains("`n1`") && e.message.contains("deadline"),
        "{}",
        e.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_aborts_a_running_guest() {
    let p = hostile_provider(grant(PackageGrant {
        fuel: Some(u64::MAX / 2),
        ..Default::default()
    }))
    .await;
    let exec = create(&p, "n1", "hostile.spin", BTreeMap::new(), None);
    let (ctx, h) = ctx("n1", "hostile.spin", None, false);
    let cancel = h.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let e = exec
        .invoke(Call {
            inputs: inputs([]),
            ctx,
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_hits_the_limit() {
    let p = hostile_provider(grant(PackageGrant {
        memory_mb: Some(32),
        ..Default::default()
    }))
    .await;
    let (r, ctx, _) = invoke(
        &p,
        "hostile.alloc",
        inputs([("mb", Value::Int(4096))]),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::MemoryLimit, "{e:?}");
    assert!(e.message.contains("memory limit exceeded"), "{}", e.message);
    let peak = ctx.metrics().peak_memory_bytes.unwrap();
    assert!(peak > 0 && peak <= 32 << 20, "peak {peak}");
    // Under the limit it works.
    let (r, _, _) = invoke(&p, "hostile.alloc", inputs([("mb", Value::Int(4))]), None).await;
    assert_eq!(r.unwrap().get("out"), Some(&Value::Int(4)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_files_are_invisible_without_a_grant() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret.txt");
    std::fs::write(&secret_file, "host secret").unwrap();
    let p = hostile_provider(WasmConfig::default()).await;
    for path in [
        secret_file.to_str().unwrap(),
        "/etc/passwd",
        "/data/secret.txt",
        "../secret.txt",
    ] {
        let (r, _, _) = invoke(
            &p,
            "hostile.read",
            inputs([("path", Value::str(path))]),
            None,
        )
        .await;
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Node, "{path}: {e:?}");
        assert_eq!(e.signature.as_deref(), Some("files:denied"));
    }
    let (r, _, _) = invoke(
        &p,
        "hostile.env",
        inputs([("name", Value::str("PATH"))]),
        None,
    )
    .await;
    assert_eq!(
        r.unwrap().get("value"),
        Some(&Value::Null),
        "no ambient env"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_grant_refuses_writes_and_escapes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "granted").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x.txt"), "outside").unwrap();
    let p = hostile_provider(grant(PackageGrant {
        dirs: vec![DirGrant {
            host: dir.path().into(),
            guest: "/data".into(),
            mode: DirMode::Ro,
        }],
        ..Default::default()
    }))
    .await;
    let (r, _, _) = invoke(
        &p,
        "hostile.read",
        inputs([("path", Value::str("/data/in.txt"))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap().get("text"), Some(&Value::str("granted")));

    let (r, _, _) = invoke(
        &p,
        "hostile.write",
        inputs([("path", Value::str("/data/in.txt"))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap_err().signature.as_deref(), Some("files:denied"));
    let (r, _, _) = invoke(
        &p,
        "hostile.write",
        inputs([("path", Value::str("/data/new.txt"))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap_err().signature.as_deref(), Some("files:denied"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("in.txt")).unwrap(),
        "granted"
    );
    assert!(!dir.path().join("new.txt").exists());

    let escape = format!("/data/../{}/x.txt", outside.path().display());
    let (r, _, _) = invoke(
        &p,
        "hostile.read",
        inputs([("path", Value::str(escape.as_str()))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap_err().signature.as_deref(), Some("files:denied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_can_narrow_a_write_grant_but_not_widen_a_read_grant() {
    let dir = tempfile::tempdir().unwrap();
    let rw = grant(PackageGrant {
        dirs: vec![DirGrant {
            host: dir.path().into(),
            guest: "/data".into(),
            mode: DirMode::Rw,
        }],
        ..Default::default()
    });
    let p = hostile_provider(rw).await;
    let w = inputs([("path", Value::str("/data/a.txt"))]);
    let (r, _, _) = invoke(&p, "hostile.write", w.clone(), None).await;
    assert_eq!(r.unwrap().get("ok"), Some(&Value::Bool(true)));
    let read_only = NodeLimits {
        files: Some(AccessLevel::Read),
        ..Default::default()
    };
    let (r, _, _) = invoke(&p, "hostile.write", w.clone(), Some(read_only)).await;
    assert_eq!(r.unwrap_err().signature.as_deref(), Some("files:denied"));
    let none = NodeLimits {
        files: Some(AccessLevel::None),
        ..Default::default()
    };
    let (r, _, _) = invoke(&p, "hostile.read", w.clone(), Some(none)).await;
    assert_eq!(r.unwrap_err().signature.as_deref(), Some("files:denied"));

    let ro = grant(PackageGrant {
        dirs: vec![DirGrant {
            host: dir.path().into(),
            guest: "/data".into(),
            mode: DirMode::Ro,
        }],
        ..Default::default()
    });
    let p = hostile_provider(ro).await;
    let widen = NodeLimits {
        files: Some(AccessLevel::Write),
        ..Default::default()
    };
    let (r, _, _) = invoke(&p, "hostile.write", w, Some(widen)).await;
    assert_eq!(r.unwrap_err().signature.as_deref(), Some("files:denied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_output_is_rejected() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, _) = invoke(
        &p,
        "hostile.huge",
        inputs([("bytes", Value::Int(8_000_000))]),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutputTooLarge, "{e:?}");
    assert!(
        e.message.contains("`out`") && e.message.contains("`n1`"),
        "{}",
        e.message
    );
    let (r, _, _) = invoke(
        &p,
        "hostile.huge",
        inputs([("bytes", Value::Int(1000))]),
        None,
    )
    .await;
    assert!(r.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_panic_fails_the_node_and_the_next_invocation_works() {
    let p = hostile_provider(WasmConfig::default()).await;
    let exec = create(&p, "n1", "hostile.panic", BTreeMap::new(), None);
    let (c1, _) = ctx("n1", "hostile.panic", None, false);
    let e = exec
        .invoke(Call {
            inputs: inputs([("panic", Value::Bool(true))]),
            ctx: c1,
        })
        .await
        .unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Trap { .. }), "{e:?}");
    assert!(
        e.message.contains("hostile guest panicked on purpose"),
        "{}",
        e.message
    );
    let (c2, _) = ctx("n1", "hostile.panic", None, false);
    let ok = exec
        .invoke(Call {
            inputs: inputs([("panic", Value::Bool(false))]),
            ctx: c2,
        })
        .await
        .unwrap();
    assert_eq!(ok.get("out"), Some(&Value::str("alive")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungranted_secret_gives_nothing_and_granted_one_is_masked() {
    let mut config = grant(PackageGrant {
        secrets: vec!["GRANTED".into()],
        ..Default::default()
    });
    config
        .secrets
        .values
        .insert("GRANTED".into(), "s3cr3t-value".into());
    config
        .secrets
        .values
        .insert("OTHER".into(), "other-value".into());
    let p = hostile_provider(config).await;
    let (r, _, h) = invoke(
        &p,
        "hostile.secret",
        inputs([("name", Value::str("OTHER"))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap().get("value"), Some(&Value::Null));
    assert!(h.sink.logs().iter().any(|l| l.contains("not granted")));
    let (r, ctx, _) = invoke(
        &p,
        "hostile.secret",
        inputs([("name", Value::str("GRANTED"))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap().get("value"), Some(&Value::str("s3cr3t-value")));
    assert!(
        ctx.secrets()
            .mask("leak: s3cr3t-value")
            .contains("redacted")
    );
    // A graph narrowing to another name removes the grant.
    let narrow = NodeLimits {
        secrets: Some(vec!["OTHER".into()]),
        ..Default::default()
    };
    let (r, _, _) = invoke(
        &p,
        "hostile.secret",
        inputs([("name", Value::str("GRANTED"))]),
        Some(narrow),
    )
    .await;
    assert_eq!(r.unwrap().get("value"), Some(&Value::Null));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_output_is_capped_with_a_marker() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, h) = invoke(
        &p,
        "hostile.chatty",
        inputs([("lines", Value::Int(100_000))]),
        None,
    )
    .await;
    assert_eq!(r.unwrap().get("out"), Some(&Value::Int(100_000)));
    let logs = h.sink.logs();
    assert!(logs.iter().any(|l| l.starts_with("line 0 ")));
    assert!(
        logs.iter().any(|l| l.contains("truncated")),
        "marker missing"
    );
    let total: usize = logs.iter().map(String::len).sum();
    assert!(total < 100 << 10, "log output not capped: {total} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_handles_are_refused() {
    let p = hostile_provider(WasmConfig::default()).await;
    let exec = create(&p, "n1", "hostile.liar", BTreeMap::new(), None);
    let (c, _h) = ctx("n1", "hostile.liar", None, true);
    let e = exec
        .invoke(Call {
            inputs: inputs([]),
            ctx: c,
        })
        .await
        .unwrap_err();
    assert_eq!(e.signature.as_deref(), Some("wasm:unknown-output"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_redefining_an_existing_node_type_is_refused() {
    // A fork of `std` under another package name claims std's node types.
    let fork = tempfile::tempdir().unwrap();
    let std_dir = heddle_wasm::first_party_packages_dir().join("std");
    std::fs::copy(std_dir.join("std.wasm"), fork.path().join("std.wasm")).unwrap();
    std::fs::write(
        fork.path().join("heddle-package.toml"),
        "name = \"std-fork\"\nversion = \"9.9.9\"\ncomponent = \"std.wasm\"\n",
    )
    .unwrap();

    let first = first_party_provider(WasmConfig::default()).await;
    let forked = WasmPackage::load_dir(first.host(), fork.path())
        .await
        .unwrap();

    // Within one provider.
    let mut same = first_party_provider(WasmConfig::default()).await;
    let e = same.add(forked).unwrap_err().to_string();
    assert!(
        e.contains("std.") && e.contains("already defined by package `std`"),
        "{e}"
    );

    // Across providers, through the kernel's registry.
    let mut reg = Registry::with_builtins();
    reg.add(std::sync::Arc::new(first)).unwrap();
    let mut other = WasmProvider::new(common::host(), WasmConfig::default());
    other
        .add(
            WasmPackage::load_dir(other.host(), fork.path())
                .await
                .unwrap(),
        )
        .unwrap();
    assert!(!other.declarations().is_empty());
    let e = reg.add(std::sync::Arc::new(other)).unwrap_err().to_string();
    assert!(e.contains("already defined"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_survives_a_barrage_of_failures() {
    let p = hostile_provider(grant(PackageGrant {
        fuel: Some(10_000_000),
        memory_mb: Some(16),
        ..Default::default()
    }))
    .await;
    let start = Instant::now();
    for _ in 0..5 {
        for (t, i) in [
            ("hostile.spin", inputs([])),
            ("hostile.alloc", inputs([("mb", Value::Int(64))])),
            ("hostile.panic", inputs([])),
        ] {
            let (r, _, _) = invoke(&p, t, i, None).await;
            assert!(r.is_err());
        }
    }
    let (r, _, _) = invoke(&p, "hostile.echo", inputs([("value", Value::Int(7))]), None).await;
    assert_eq!(r.unwrap().get("value"), Some(&Value::Int(7)));
    let _ = start;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_are_fresh_unless_the_node_opts_in_and_a_trap_discards_a_warm_one() {
    let p = hostile_provider(WasmConfig::default()).await;
    let calls = |exec: std::sync::Arc<dyn heddle_kernel::Executor>, fail: bool| async move {
        let (c, _) = ctx("n1", "counter", None, false);
        exec.invoke(Call {
            inputs: inputs([("fail", Value::Bool(fail))]),
            ctx: c,
        })
        .await
        .map(|o| o.get("calls").cloned().unwrap())
    };
    let fresh = create(&p, "n1", "hostile.counter", BTreeMap::new(), None);
    for _ in 0..3 {
        assert_eq!(
            calls(fresh.clone(), false).await.unwrap(),
            Value::Int(1),
            "state leaked between invocations"
        );
    }
    let warm = create(&p, "n2", "hostile.counter_warm", BTreeMap::new(), None);
    assert_eq!(calls(warm.clone(), false).await.unwrap(), Value::Int(1));
    assert_eq!(
        calls(warm.clone(), false).await.unwrap(),
        Value::Int(2),
        "opted-in node reuses its instance"
    );
    assert!(calls(warm.clone(), true).await.is_err());
    assert_eq!(
        calls(warm.clone(), false).await.unwrap(),
        Value::Int(1),
        "a trapped instance is discarded"
    );
    // Warm instances belong to one graph node, never shared with another.
    let other = create(&p, "n3", "hostile.counter_warm", BTreeMap::new(), None);
    assert_eq!(calls(other, false).await.unwrap(), Value::Int(1));

    // The operator can take warm reuse away from a node that declares it.
    let p = hostile_provider(grant(PackageGrant {
        fresh_instances: true,
        ..Default::default()
    }))
    .await;
    let narrowed = create(&p, "n4", "hostile.counter_warm", BTreeMap::new(), None);
    for _ in 0..3 {
        assert_eq!(
            calls(narrowed.clone(), false).await.unwrap(),
            Value::Int(1),
            "fresh_instances = true still reused an instance"
        );
    }
}

/// A fresh instance reuses the pool slot of the one before it (the pool keeps a slot for
/// the module that last used it), which dirtied 3 MiB of memory in 768 separate pages,
/// or 6 MiB in one run: more than the slot resets in place (2 MiB), and more separate
/// runs than one PAGEMAP_SCAN call reports (64). Whatever the reset keeps and drops, none
/// of it may still be there for the next instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_sees_nothing_the_instance_before_it_wrote() {
    let p = hostile_provider(WasmConfig::default()).await;
    let probe = |exec: std::sync::Arc<dyn heddle_kernel::Executor>, stride: i64| async move {
        let (c, _) = ctx("r", "residue", None, false);
        let out = exec
            .invoke(Call {
                inputs: inputs([("stride", Value::Int(stride))]),
                ctx: c,
            })
            .await
            .unwrap();
        (out.get("found").cloned(), out.get("written").cloned())
    };
    // The probe sees what is there: a warm instance finds its own earlier writes.
    let warm = create(&p, "w", "hostile.residue_warm", BTreeMap::new(), None);
    assert_eq!(
        probe(warm.clone(), 2).await,
        (Some(Value::Int(0)), Some(Value::Int(768)))
    );
    assert_eq!(
        probe(warm, 1).await,
        (Some(Value::Int(768)), Some(Value::Int(1536)))
    );

    let fresh = create(&p, "r", "hostile.residue", BTreeMap::new(), None);
    for round in 0..4 {
        // Even rounds dirty every other page, odd ones every page.
        let stride = if round % 2 == 0 { 2 } else { 1 };
        assert_eq!(
            probe(fresh.clone(), stride).await,
            (Some(Value::Int(0)), Some(Value::Int(1536 / stride))),
            "round {round}: a fresh instance read pages an earlier one wrote"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_and_cancel_reach_a_guest_waiting_for_input() {
    use heddle_kernel::InputStream;
    let mut config = WasmConfig::default();
    config.packages.insert(
        "std".into(),
        PackageGrant {
            timeout_ms: Some(200),
            ..Default::default()
        },
    );
    let p = first_party_provider(config).await;
    let exec = create(&p, "sum", "std.math.running_sum", BTreeMap::new(), None);

    // Input that never closes: only the deadline ends the wait.
    let (c, _h) = ctx("sum", "std.math.running_sum", None, true);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let e = exec
        .run_stream(InputStream::new(rx, BTreeMap::new()), c)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Deadline, "{e:?}");
    assert!(e.message.contains("`sum`"), "{}", e.message);
    drop(tx);

    let (c, h) = ctx("sum", "std.math.running_sum", None, true);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    h.cancel.cancel();
    let e = exec
        .run_stream(InputStream::new(rx, BTreeMap::new()), c)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e:?}");
    drop(tx);
}
