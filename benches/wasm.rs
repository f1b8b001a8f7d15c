//! WASM node overhead: a trivial node invoked with a fresh instance vs a warm one, bare
//! instantiation, the same three done with raw wasmtime on the same engine and component
//! (the floor Heddle's figures are judged against), fuel metering on vs off on a
//! compute-heavy node, loading a package from the compile cache, and the WASM graph
//! shapes of `heddle bench` (`heddle_wasm::bench`); and the same two-input division node
//! in Rust, Python, JavaScript and C, fresh and warm (`guest_invoke/*`, building the SDK
//! examples into `target/heddle-test-cache` first).
//!
//! Run: `cargo bench --bench wasm` (builds the test package in `plugins/` first).
//! Targets (issue 18): fresh ≤ 1.3× raw instantiate + call, warm ≤ 1.5× a raw call;
//! cached load ≤ 5 ms, fuel ≤ 10 %.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use heddle_core::{EventKind, Value};
use heddle_kernel::{
    Call, CtxParts, EventSink, Executor, NodeCtx, NodeProvider, NodeSpec, Registry, SecretRegistry,
};
use heddle_wasm::bench::WasmShape;
use heddle_wasm::{EngineSettings, WasmConfig, WasmHost, WasmPackage, WasmProvider};
use tokio_util::sync::CancellationToken;

struct NullSink;
impl EventSink for NullSink {
    fn emit(&self, _: EventKind) {}
}

/// Builds `plugins/testing/hostile` (it holds the trivial and compute nodes) and
/// assembles its package directory.
fn hostile_package() -> PathBuf {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&plugins)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            "heddle-hostile",
            "--target-dir",
        ])
        .arg(plugins.join("target"))
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the hostile test package failed");
    let dir = std::env::temp_dir().join("heddle-bench-hostile");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        plugins.join("testing/hostile/heddle-package.toml"),
        dir.join("heddle-package.toml"),
    )
    .unwrap();
    std::fs::copy(
        plugins.join("target/wasm32-wasip2/release/heddle_hostile.wasm"),
        dir.join("hostile.wasm"),
    )
    .unwrap();
    dir
}

fn settings(fuel: bool, cache: &Path) -> EngineSettings {
    EngineSettings {
        fuel,
        cache_dir: Some(cache.to_path_buf()),
        ..Default::default()
    }
}

fn ctx() -> NodeCtx {
    NodeCtx::new(CtxParts {
        node_id: "n".into(),
        node_type: "t".into(),
        key: "".into(),
        cancel: CancellationToken::new(),
        deadline: None,
        events: Arc::new(NullSink),
        emit: None,
        secrets: Arc::new(SecretRegistry::default()),
    })
}

fn executor(p: &WasmProvider, type_name: &str) -> Arc<dyn Executor> {
    let decl = p
        .declarations()
        .into_iter()
        .find(|d| d.type_name == type_name)
        .unwrap();
    p.create(&NodeSpec {
        id: "n",
        decl: &decl,
        properties: &BTreeMap::new(),
        limits: None,
    })
    .unwrap()
}

/// Times `iters` sequential invocations inside one runtime entry, so the figure is the
/// invocation and not `block_on`.
fn time_invocations(
    rt: &tokio::runtime::Runtime,
    exec: &Arc<dyn Executor>,
    inputs: &BTreeMap<String, Value>,
    iters: u64,
) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let out = exec
                .invoke(Call {
                    inputs: inputs.clone(),
                    ctx: ctx(),
                })
                .await
                .unwrap();
            std::hint::black_box(out);
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let pkg_dir = hostile_package();
    let cache = std::env::temp_dir().join("heddle-bench-cache");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let provider = |fuel: bool| {
        rt.block_on(async {
            let host = WasmHost::new(settings(fuel, &cache)).unwrap();
            let pkg = WasmPackage::load_dir(&host, &pkg_dir).await.unwrap();
            let mut p = WasmProvider::new(host, WasmConfig::default());
            p.add(pkg).unwrap();
            p
        })
    };
    guests(c, &rt, &cache);
    let metered = provider(true);
    let unmetered = provider(false);
    eprintln!("pooling allocator in use: {}", metered.host().is_pooling());

    let echo_in: BTreeMap<String, Value> = [("value".to_string(), Value::str("hello"))].into();
    let mut g = c.benchmark_group("wasm_invoke");
    let fresh = executor(&metered, "hostile.echo");
    g.bench_function("trivial_fresh_instance", |b| {
        b.iter_custom(|n| time_invocations(&rt, &fresh, &echo_in, n))
    });
    let warm = executor(&metered, "hostile.echo_warm");
    g.bench_function("trivial_warm_instance", |b| {
        b.iter_custom(|n| time_invocations(&rt, &warm, &echo_in, n))
    });
    let raw = raw::Raw::new(metered.host().engine(), &pkg_dir.join("hostile.wasm"));
    g.bench_function("raw_wasmtime_fresh_instance", |b| {
        b.iter_custom(|n| rt.block_on(raw.time_fresh(n)))
    });
    g.bench_function("raw_wasmtime_warm_call", |b| {
        b.iter_custom(|n| rt.block_on(raw.time_warm(n)))
    });
    g.bench_function("raw_wasmtime_instantiate_only", |b| {
        b.iter_custom(|n| rt.block_on(raw.time_instantiate(n)))
    });
    let pkg = metered.packages()[0].clone();
    g.bench_function("instantiate_only", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..n {
                    pkg.instantiate_only().await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.finish();

    let mut g = c.benchmark_group("wasm_fuel");
    g.sample_size(20);
    let heavy: BTreeMap<String, Value> = [("n".to_string(), Value::Int(20_000_000))].into();
    let on = executor(&metered, "hostile.compute");
    let off = executor(&unmetered, "hostile.compute");
    g.bench_function("compute_20M_fuel_on", |b| {
        b.iter_custom(|n| time_invocations(&rt, &on, &heavy, n))
    });
    g.bench_function("compute_20M_fuel_off", |b| {
        b.iter_custom(|n| time_invocations(&rt, &off, &heavy, n))
    });
    g.finish();

    let mut g = c.benchmark_group("wasm_load");
    let host = WasmHost::new(settings(true, &cache)).unwrap();
    // Prime the cache, then every load below is served from it.
    rt.block_on(WasmPackage::load_dir(&host, &pkg_dir)).unwrap();
    g.bench_function("load_package_from_compile_cache", |b| {
        b.iter(|| {
            std::hint::black_box(rt.block_on(WasmPackage::load_dir(&host, &pkg_dir)).unwrap())
        })
    });
    g.finish();

    let mut g = c.benchmark_group("wasm_graph");
    g.sample_size(10);
    let mut registry = Registry::with_builtins();
    let std_nodes = rt.block_on(async {
        let mut p = WasmProvider::new(
            WasmHost::new(settings(true, &cache)).unwrap(),
            WasmConfig::default(),
        );
        p.add_first_party().await.unwrap();
        p
    });
    registry.add(Arc::new(std_nodes)).unwrap();
    let multi = tokio::runtime::Runtime::new().unwrap();
    for (shape, n, messages) in [(WasmShape::Chain, 10, 1_000), (WasmShape::Fanout, 1_000, 0)] {
        g.bench_function(format!("{}_{n}", shape.name()), |b| {
            b.iter(|| {
                multi
                    .block_on(heddle_wasm::bench::run_shape(
                        &registry, shape, n, messages, None,
                    ))
                    .unwrap()
            })
        });
    }
    g.finish();
}

/// The same two-input division node in each guest language (the SDK examples' `ratio`,
/// `std.math.arith` with `op = "div"` for Rust), invoked with a fresh instance (the
/// package granted `fresh_instances`: what every node that does not declare reuse gets)
/// and warm (as the node declares): `guest_invoke/<lang>_fresh` and `<lang>_warm`. The
/// issue-34 targets are ratios to Rust's figures: fresh within 5×, warm within 3×.
fn guests(c: &mut Criterion, rt: &tokio::runtime::Runtime, cache: &Path) {
    use heddle_wasm::bench::Guest;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let build = root.join("target/heddle-test-cache");
    let mut g = c.benchmark_group("guest_invoke");
    g.sample_size(20);
    for guest in Guest::ALL {
        let dir = guest.example().map(|example| {
            let opts = heddle_package_build::BuildOptions {
                out_dir: Some(build.join("packages").join(guest.package())),
                cache_dir: Some(build.join("builds")),
                ..Default::default()
            };
            heddle_package_build::build_package(&root.join(example), &opts)
                .unwrap_or_else(|e| panic!("building {example}: {e}"))
                .dir
        });
        for fresh in [true, false] {
            let mut config = WasmConfig::default();
            config.packages.insert(
                guest.package().into(),
                heddle_wasm::PackageGrant {
                    fresh_instances: fresh,
                    ..Default::default()
                },
            );
            let p = rt.block_on(async {
                let host = WasmHost::new(settings(true, cache)).unwrap();
                let mut p = WasmProvider::new(host.clone(), config);
                match &dir {
                    Some(d) => p
                        .add(WasmPackage::load_dir(&host, d).await.unwrap())
                        .unwrap(),
                    None => p.add_first_party().await.unwrap(),
                }
                p
            });
            let decl = p
                .declarations()
                .into_iter()
                .find(|d| d.type_name == guest.node_type())
                .unwrap();
            let mut properties = BTreeMap::new();
            properties.insert("b".to_string(), Value::Float(2.0));
            if guest == Guest::Rust {
                properties.insert("op".to_string(), Value::str("div"));
            }
            let exec = p
                .create(&NodeSpec {
                    id: "n",
                    decl: &decl,
                    properties: &properties,
                    limits: None,
                })
                .unwrap();
            let inputs: BTreeMap<String, Value> = [("a".to_string(), Value::Float(3.0))].into();
            let name = match guest {
                Guest::Rust => "rust",
                Guest::Python => "python",
                Guest::JavaScript => "javascript",
                Guest::C => "c",
            };
            let lifecycle = if fresh { "fresh" } else { "warm" };
            g.bench_function(format!("{name}_{lifecycle}"), |b| {
                b.iter_custom(|n| time_invocations(rt, &exec, &inputs, n))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

/// Raw wasmtime, nothing of Heddle's: the same engine (so the same pooling, fuel and epoch
/// settings) and the same component, a bare WASI context, the `heddle:node` imports
/// defined as traps (the echo node calls none), and the generated bindings called
/// directly. The gap between these figures and `trivial_*` is what Heddle adds.
mod raw {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use wasmtime::component::{Component, Linker, ResourceTable};
    use wasmtime::{Engine, Store};
    use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
    use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

    wasmtime::component::bindgen!({
        world: "node-package",
        // The contract the Rust SDK builds the hostile package against.
        path: "wit/v0.2",
        imports: { default: async },
        exports: { default: async },
    });
    use self::heddle::node::types::Value;

    pub struct State {
        wasi: WasiCtx,
        http: WasiHttpCtx,
        table: ResourceTable,
        net: NoNet,
    }

    /// Outgoing HTTP refused: the node measured sends none.
    struct NoNet;

    impl WasiHttpHooks for NoNet {
        fn send_request(
            &mut self,
            _request: http::Request<wasmtime_wasi_http::WasiBody>,
            _options: Option<wasmtime_wasi_http::RequestOptions>,
            _fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
        ) -> Box<
            dyn Future<
                    Output = Result<
                        (
                            http::Response<wasmtime_wasi_http::WasiBody>,
                            Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                        ),
                        wasmtime_wasi_http::Error,
                    >,
                > + Send,
        > {
            Box::new(std::future::ready(Err(
                wasmtime_wasi_http::Error::HttpRequestDenied,
            )))
        }
    }

    /// The least host a node runs against: values emitted go nowhere, no input
    /// streams, no secrets, no deadline.
    impl self::heddle::node::host::Host for State {
        async fn log(&mut self, _level: self::heddle::node::types::LogLevel, _message: String) {}
        async fn emit(&mut self, _handle: String, _value: Value) -> Result<(), String> {
            Ok(())
        }
        async fn next_input(&mut self) -> Option<(String, Value)> {
            None
        }
        async fn report_cost(&mut self, _usd: f64) {}
        async fn record_asset(&mut self, _id: String) {}
        async fn cancelled(&mut self) -> bool {
            false
        }
        async fn deadline_ms(&mut self) -> Option<u64> {
            None
        }
        async fn get_secret(&mut self, _name: String) -> Option<String> {
            None
        }
        async fn control_send(
            &mut self,
            _target: String,
            _properties: Vec<(String, Value)>,
        ) -> Result<u64, String> {
            Err("no control edges here".into())
        }
        async fn control_reply(&mut self, _ticket: u64) -> Result<Vec<(String, Value)>, String> {
            Err("no control edges here".into())
        }
    }

    impl self::heddle::node::types::Host for State {}

    impl WasiHttpView for State {
        fn http(&mut self) -> WasiHttpCtxView<'_> {
            WasiHttpCtxView {
                ctx: &mut self.http,
                table: &mut self.table,
                hooks: &mut self.net,
            }
        }
    }

    impl WasiView for State {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }

    pub struct Raw {
        engine: Engine,
        pre: NodePackagePre<State>,
        inputs: Vec<(String, Value)>,
    }

    impl Raw {
        pub fn new(engine: &Engine, component: &Path) -> Raw {
            let component = Component::from_file(engine, component).unwrap();
            let mut linker = Linker::<State>::new(engine);
            // WASI, wasi:http and `heddle:node/host` as the host links them, nothing
            // left to trap: traps for an import the linker holds at another patch version
            // (`wasi:io/poll@0.2.12`) would redefine `pollable` beside the real one, and
            // the clocks that use it would no longer link.
            wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).unwrap();
            NodePackage::add_to_linker::<State, wasmtime::component::HasSelf<State>>(
                &mut linker,
                |s| s,
            )
            .unwrap();
            let pre = NodePackagePre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
            Raw {
                engine: engine.clone(),
                pre,
                inputs: vec![("value".into(), Value::String("hello".into()))],
            }
        }

        fn store(&self) -> Store<State> {
            let mut store = Store::new(
                &self.engine,
                State {
                    wasi: WasiCtx::builder().build(),
                    http: WasiHttpCtx::new(),
                    table: ResourceTable::new(),
                    net: NoNet,
                },
            );
            // The engine meters fuel and checks epochs: give both enough never to stop.
            store.set_fuel(u64::MAX).unwrap();
            store.set_epoch_deadline(u64::MAX / 2);
            store
        }

        async fn call(&self, store: &mut Store<State>, instance: &NodePackage) {
            let out = instance
                .heddle_node_node()
                .call_invoke(&mut *store, "hostile.echo", &self.inputs, &Vec::new())
                .await
                .unwrap()
                .unwrap();
            std::hint::black_box(out);
        }

        /// A store, an instance and one call, `iters` times.
        pub async fn time_fresh(&self, iters: u64) -> Duration {
            let start = Instant::now();
            for _ in 0..iters {
                let mut store = self.store();
                let instance = self.pre.instantiate_async(&mut store).await.unwrap();
                self.call(&mut store, &instance).await;
            }
            start.elapsed()
        }

        /// `iters` calls on one instance.
        pub async fn time_warm(&self, iters: u64) -> Duration {
            let mut store = self.store();
            let instance = self.pre.instantiate_async(&mut store).await.unwrap();
            self.call(&mut store, &instance).await;
            let start = Instant::now();
            for _ in 0..iters {
                self.call(&mut store, &instance).await;
            }
            start.elapsed()
        }

        /// A store and an instance, `iters` times.
        pub async fn time_instantiate(&self, iters: u64) -> Duration {
            let start = Instant::now();
            for _ in 0..iters {
                let mut store = self.store();
                std::hint::black_box(self.pre.instantiate_async(&mut store).await.unwrap());
            }
            start.elapsed()
        }
    }
}
