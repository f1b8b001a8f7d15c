//! Kernel throughput on the bench shapes of `heddle_kernel::bench` (the same graphs
//! `heddle bench` runs):
//! - chain: 100 pass-through nodes, 10,000 messages streamed through (1,000,000
//!   node invocations per run);
//! - fanout: 10,000 items through 3 per-item nodes into a collect;
//! - wide: 1,000 and 100,000 independent nodes, each fired once.
//!
//! Every shape runs on a current-thread runtime (`threads_1`, no cross-thread wake-ups)
//! and on two workers (`threads_2`), as `heddle bench --threads 1|2` does. Each is
//! measured with messages and with pass-through node invocations as the throughput
//! unit. Planning is outside the timed part; run start to result is inside.
//!
//! `cargo bench --bench kernel` (all), `cargo bench --bench kernel -- wide_1000` (one).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use heddle_kernel::Registry;
use heddle_kernel::bench::{Shape, run_shape};

fn shapes() -> [(Shape, usize, usize, &'static str); 4] {
    [
        (Shape::Chain, 100, 10_000, "chain_100x10k"),
        (Shape::Fanout, 10_000, 0, "fanout_10k_x3"),
        (Shape::Wide, 1_000, 0, "wide_1000"),
        (Shape::Wide, 100_000, 0, "wide_100000"),
    ]
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    let mut b = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    b.enable_all().build().expect("tokio runtime")
}

fn kernel(c: &mut Criterion) {
    let reg = Registry::with_builtins();
    for threads in [1, 2] {
        let rt = runtime(threads);
        for (shape, n, messages, name) in shapes() {
            let probe = rt
                .block_on(run_shape(&reg, shape, n, messages))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut g = c.benchmark_group(format!("kernel/{name}/threads_{threads}"));
            g.sample_size(10);
            let long = shape == Shape::Chain || n > 10_000;
            g.measurement_time(Duration::from_secs(if long { 15 } else { 5 }));
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
}

criterion_group!(benches, kernel);
criterion_main!(benches);
