//! Kernel throughput on the three bench shapes of `heddle_kernel::bench` (the same
//! graphs `heddle bench` runs):
//! - chain: 100 pass-through nodes, 10,000 messages streamed through (1,000,000
//!   node invocations per run);
//! - fanout: 10,000 items through 3 per-item nodes into a collect;
//! - wide: 1,000 independent nodes, each fired once.
//!
//! Each shape is measured twice with the same work: once with messages as the throughput
//! unit (messages/s) and once with pass-through node invocations (invocations/s).
//! Planning is outside the timed part; run start to result is inside.
//!
//! `cargo bench --bench kernel`

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use heddle_kernel::Registry;
use heddle_kernel::bench::{Shape, run_shape};

fn shapes() -> [(Shape, usize, usize, &'static str); 3] {
    [
        (Shape::Chain, 100, 10_000, "chain_100x10k"),
        (Shape::Fanout, 10_000, 0, "fanout_10k_x3"),
        (Shape::Wide, 1_000, 0, "wide_1000"),
    ]
}

fn kernel(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let reg = Registry::with_builtins();
    for (shape, n, messages, name) in shapes() {
        let probe = rt
            .block_on(run_shape(&reg, shape, n, messages))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut g = c.benchmark_group(format!("kernel/{name}"));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(if shape == Shape::Chain {
            15
        } else {
            5
        }));
        for (unit, count) in [
            ("messages", probe.messages),
            ("invocations", probe.invocations),
        ] {
            g.throughput(Throughput::Elements(count));
            g.bench_function(unit, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let r = rt
                            .block_on(run_shape(&reg, shape, n, messages))
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                        total += r.elapsed;
                    }
                    total
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, kernel);
criterion_main!(benches);
