//! The `chain` and `chain-when` shapes of `heddle bench`, run by the kernel alone, so what
//! a condition costs per hop can be measured without building the CLI and its WASM engine:
//!
//! ```sh
//! cargo run --release -p heddle-kernel --example bench_chain [runs]
//! ```
//!
//! Prints the median invocations per second of each shape (100 nodes × 10,000 messages)
//! and their ratio. `heddle bench --shape chain-when` measures the same graph.

use heddle_kernel::Registry;
use heddle_kernel::bench::{Shape, run_shape};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let registry = Registry::with_builtins();
    let mut medians = Vec::new();
    for shape in [Shape::Chain, Shape::ChainWhen] {
        // One warm-up run, then the measured ones.
        rt.block_on(run_shape(&registry, shape, 100, 10_000))?;
        let mut rates: Vec<f64> = (0..runs)
            .map(|_| rt.block_on(run_shape(&registry, shape, 100, 10_000)))
            .map(|r| r.map(|r| r.invocations_per_sec()))
            .collect::<Result<_, _>>()?;
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        println!(
            "{:<10} {:>12.0} invocations/s median of {runs} (best {:.0})",
            shape.name(),
            median,
            rates[rates.len() - 1]
        );
        medians.push(median);
    }
    println!(
        "chain-when runs at {:.2}x the plain chain's throughput",
        medians[1] / medians[0]
    );
    Ok(())
}
