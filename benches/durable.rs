//! Durable overhead: each shape runs in memory and as a durable run (a fresh run in a
//! scratch SQLite store, every invocation written ahead, timed to the last record on
//! disk), so the two figures of a group give the durable/in-memory ratio.
//! - chain: 20 native pass-through nodes, 1,000 messages streamed through;
//! - fanout: 2,000 items through 3 per-item native nodes into a collect;
//! - wasm-chain: 10 `std.math.arith` nodes (retry-safe WASM), 1,000 messages;
//! - effect-chain: 10 `files.write_text` nodes (not retry-safe: each start is synced
//!   before the node runs), 20 messages, appending to files in a scratch directory.
//!
//! The retry-safe shapes are what the ≤ 1.5× target is about; the effect chain shows
//! what a synced write ahead of every invocation costs on this disk.
//!
//! `cargo bench --bench durable`

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use heddle_kernel::bench::{BenchError, BenchRun, Shape, run_shape_journaled};
use heddle_kernel::{Journal, Registry};
use heddle_wasm::bench::{self as wasm_bench, WasmShape};
use heddle_wasm::{WasmConfig, WasmHost, WasmProvider};

/// A shape run once, in memory (no journal) or written through the journal given.
#[derive(Clone, Copy)]
enum Bench {
    Native(Shape, usize, usize),
    Wasm(WasmShape, usize, usize),
    Effect(usize, usize),
}

impl Bench {
    fn name(self) -> String {
        match self {
            Bench::Native(s, n, m) => format!("{}_{n}x{m}", s.name()),
            Bench::Wasm(s, n, m) => format!("{}_{n}x{m}", s.name()),
            Bench::Effect(n, m) => format!("effect-chain_{n}x{m}"),
        }
    }

    fn run(
        self,
        rt: &tokio::runtime::Runtime,
        reg: &Registry,
        effects: &Path,
        journal: Option<Arc<dyn Journal>>,
    ) -> Result<BenchRun, BenchError> {
        rt.block_on(async {
            match self {
                Bench::Native(s, n, m) => run_shape_journaled(reg, s, n, m, journal).await,
                Bench::Wasm(s, n, m) => wasm_bench::run_shape(reg, s, n, m, journal).await,
                Bench::Effect(n, m) => {
                    wasm_bench::run_effect_chain(reg, n, m, effects, journal).await
                }
            }
        })
    }
}

fn durable(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::tempdir().expect("a scratch directory");
    let store: Arc<dyn heddle_store::RunStore> = Arc::new(
        heddle_store::SqliteStore::open(&dir.path().join("runs.db")).expect("the run store"),
    );
    let effects = dir.path().join("effects");
    std::fs::create_dir_all(&effects).expect("the effects directory");
    let mut reg = Registry::with_builtins();
    let wasm = rt.block_on(async {
        let mut config = WasmConfig::default();
        config
            .packages
            .insert("files".into(), wasm_bench::effect_grant(&effects));
        let host = WasmHost::new(config.wasm.clone()).expect("the WASM engine");
        let mut p = WasmProvider::new(host, config);
        p.add_first_party().await.expect("the first-party packages");
        p
    });
    reg.add(Arc::new(wasm)).expect("the WASM provider");
    for bench in [
        Bench::Native(Shape::Chain, 20, 1_000),
        Bench::Native(Shape::Fanout, 2_000, 0),
        Bench::Wasm(WasmShape::Chain, 10, 1_000),
        Bench::Effect(10, 20),
    ] {
        let name = bench.name();
        let in_memory = || -> BenchRun {
            bench
                .run(&rt, &reg, &effects, None)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let durable = || -> BenchRun {
            heddle_store::bench::timed(store.clone(), |j| bench.run(&rt, &reg, &effects, Some(j)))
                .unwrap_or_else(|e| panic!("{name} durable: {e}"))
                .run
        };
        let probe = in_memory();
        let mut g = c.benchmark_group(format!("durable/{name}"));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(5));
        g.throughput(Throughput::Elements(probe.invocations));
        for (mode, run) in [
            ("in_memory", &in_memory as &dyn Fn() -> BenchRun),
            ("durable", &durable),
        ] {
            g.bench_function(mode, |b| {
                b.iter_custom(|iters| (0..iters).map(|_| run().elapsed).sum())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, durable);
criterion_main!(benches);
