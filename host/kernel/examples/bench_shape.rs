//! One shape of `heddle bench`, run by the kernel alone: what a profiler (`perf`,
//! `valgrind --tool=callgrind`) or a whole-process timer should run, since it builds in
//! seconds where the CLI links the WASM engine too.
//!
//! ```sh
//! cargo build --release -p heddle-kernel --example bench_shape
//! target/release/examples/bench_shape SHAPE SIZE MESSAGES THREADS RUNS
//! # e.g. chain 100 10000 1 3: three runs of the 100-node chain, 10,000 messages each,
//! # on a current-thread runtime
//! ```
//!
//! Prints each run's wall time, CPU time and invocations. Instruction counts under
//! callgrind are repeatable on a loaded machine: the difference between two message
//! counts, divided by the invocations it adds, is the cost of one invocation.

use heddle_kernel::Registry;
use heddle_kernel::bench::{Shape, run_shape};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.to_string());
    let shape: Shape = arg(0, "chain").parse()?;
    let size: usize = arg(1, "100").parse()?;
    let messages: usize = arg(2, "10000").parse()?;
    let threads: usize = arg(3, "1").parse()?;
    let runs: usize = arg(4, "1").parse()?;
    let rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    let registry = Registry::with_builtins();
    for _ in 0..runs {
        let r = rt.block_on(run_shape(&registry, shape, size, messages))?;
        let cpu = r.cpu.map(|c| c.total().as_secs_f64() * 1e3);
        println!(
            "{} size {size} messages {messages} threads {threads}: {} invocations, wall {:.3} ms, cpu {} ms",
            shape.name(),
            r.invocations,
            r.elapsed.as_secs_f64() * 1e3,
            cpu.map_or("n/a".into(), |c| format!("{c:.3}")),
        );
    }
    Ok(())
}
