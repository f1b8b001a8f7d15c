//! Instance lifecycle of interpreter guests (issue 7): what loading a package from the
//! compile cache, a fresh-instance invocation and a warm (reused-instance) invocation
//! cost for a trivial Python, JavaScript and C node.
//!
//! `cargo bench -p heddle-package-build --bench guest_invoke`
//! (builds the test-kit packages first when the build cache lacks them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use heddle_core::Value;
use heddle_kernel::{
    Call, CtxParts, EventSink, Executor, NodeCtx, NodeProvider, NodeSpec, SecretRegistry,
};
use heddle_package_build::{BuildOptions, BuiltPackage, build_package};
use heddle_wasm::{EngineSettings, WasmConfig, WasmHost, WasmPackage, WasmProvider};
use tokio_util::sync::CancellationToken;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn build(kit: &str) -> BuiltPackage {
    let cache = workspace().join("target/heddle-test-cache");
    let opts = BuildOptions {
        out_dir: Some(cache.join("packages").join(kit)),
        cache_dir: Some(cache.join("builds")),
        ..BuildOptions::default()
    };
    build_package(
        &workspace().join("sdk/build/tests/fixtures").join(kit),
        &opts,
    )
    .unwrap_or_else(|e| panic!("building {kit}: {e}"))
}

struct NoEvents;
impl EventSink for NoEvents {
    fn emit(&self, _event: heddle_core::EventKind) {}
}

fn ctx(type_name: &str) -> NodeCtx {
    NodeCtx::new(CtxParts {
        node_id: "bench".into(),
        node_type: type_name.into(),
        key: "".into(),
        cancel: CancellationToken::new(),
        deadline: None,
        events: Arc::new(NoEvents),
        emit: None,
        secrets: Arc::new(SecretRegistry::default()),
    })
}

fn executor(p: &WasmProvider, type_name: &str) -> Arc<dyn Executor> {
    let decl = p
        .declarations()
        .into_iter()
        .find(|d| d.type_name == type_name)
        .expect("declared");
    p.create(&NodeSpec {
        id: "bench",
        decl: &decl,
        properties: &BTreeMap::new(),
        limits: None,
    })
    .expect("executor")
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let host = WasmHost::new(EngineSettings {
        cache_dir: Some(workspace().join("target/heddle-test-cache/wasm")),
        ..EngineSettings::default()
    })
    .unwrap();
    for (kit, prefix) in [("pykit", "pykit"), ("jskit", "jskit"), ("ckit", "ckit")] {
        let built = build(kit);
        let size = std::fs::metadata(&built.component)
            .map(|m| m.len())
            .unwrap_or(0);
        eprintln!("{kit}: component {size} bytes");
        // Warm the compile cache so `load` measures the cached path only.
        let pkg = rt
            .block_on(WasmPackage::load_dir(&host, &built.dir))
            .unwrap();
        let mut g = c.benchmark_group(kit);
        g.sample_size(20);
        g.bench_function("load_cached", |b| {
            b.iter(|| {
                rt.block_on(WasmPackage::load_dir(&host, &built.dir))
                    .unwrap()
            })
        });
        let mut provider = WasmProvider::new(host.clone(), WasmConfig::default());
        provider.add(pkg).unwrap();
        for (label, ty) in [
            ("invoke_fresh", format!("{prefix}.echo")),
            ("invoke_warm", format!("{prefix}.echo_warm")),
        ] {
            let exec = executor(&provider, &ty);
            g.bench_function(label, |b| {
                b.iter(|| {
                    let mut inputs = BTreeMap::new();
                    inputs.insert("value".to_string(), Value::Int(1));
                    rt.block_on(exec.invoke(Call {
                        inputs,
                        ctx: ctx(&ty),
                    }))
                    .unwrap()
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
