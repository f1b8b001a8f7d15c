//! Durable overhead on the kernel bench shapes with retry-safe (native pass-through)
//! nodes: each shape runs in memory and as a durable run (a fresh run in a scratch
//! SQLite store, every invocation written ahead, timed to the last record on disk), so
//! the two figures of a group give the durable/in-memory ratio the issue targets
//! (≤ 1.5×):
//! - chain: 20 pass-through nodes, 1,000 messages streamed through;
//! - fanout: 2,000 items through 3 per-item nodes into a collect.
//!
//! `cargo bench --bench durable`

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use heddle_kernel::Registry;
use heddle_kernel::bench::{BenchRun, Shape, run_shape};

fn durable(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let reg = Registry::with_builtins();
    let dir = tempfile::tempdir().expect("a scratch directory");
    let store = dir.path().join("runs.db");
    for (shape, n, messages, name) in [
        (Shape::Chain, 20, 1_000, "chain_20x1k"),
        (Shape::Fanout, 2_000, 0, "fanout_2k_x3"),
    ] {
        let in_memory = || -> BenchRun {
            rt.block_on(run_shape(&reg, shape, n, messages))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let durable = || -> BenchRun {
            heddle_store::bench::run_shape(&rt, &reg, shape, n, messages, &store)
                .unwrap_or_else(|e| panic!("{name} durable: {e}"))
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
