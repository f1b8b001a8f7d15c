//! `heddle bench`: scheduler throughput on the same graph shapes as the criterion
//! benches (`heddle_kernel::bench` for native nodes, `heddle_wasm::bench` for WASM
//! nodes), so figures from either compare.

use std::time::Duration;

use anyhow::Context as _;
use heddle_kernel::Registry;
use heddle_kernel::bench::{self, Shape};
use heddle_wasm::bench::{self as wasm_bench, WasmShape};
use serde::Serialize;

use crate::cli::{BenchArgs, Shape as ShapeArg};
use crate::exit::Exit;

/// A shape of any family: native pass-through nodes, `std` WASM nodes, or the chain of
/// WASM nodes that are not retry-safe.
#[derive(Clone, Copy, Debug)]
enum AnyShape {
    Native(Shape),
    Wasm(WasmShape),
    Effect,
    EffectFanout,
}

impl AnyShape {
    fn name(self) -> &'static str {
        match self {
            AnyShape::Native(s) => s.name(),
            AnyShape::Wasm(s) => s.name(),
            AnyShape::Effect => "effect-chain",
            AnyShape::EffectFanout => "effect-fanout",
        }
    }

    fn default_size(self) -> usize {
        match self {
            AnyShape::Native(s) => default_size(s),
            AnyShape::Wasm(s) => s.default_size(),
            AnyShape::Effect => 10,
            AnyShape::EffectFanout => 300,
        }
    }

    /// Values pushed through a chain unless `--messages` says: every effect-chain
    /// invocation waits for the disk twice in a durable run, so it takes fewer.
    fn default_messages(self) -> usize {
        match self {
            AnyShape::Effect => 100,
            _ => 10_000,
        }
    }

    fn graph(self, size: usize) -> heddle_core::GraphDoc {
        match self {
            AnyShape::Native(s) => bench::graph(s, size),
            AnyShape::Wasm(s) => wasm_bench::graph(s, size),
            AnyShape::Effect => wasm_bench::effect_chain(size),
            AnyShape::EffectFanout => wasm_bench::effect_fanout(size),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ShapeFigures {
    pub shape: &'static str,
    /// `debug` or `release`: which build of heddle measured (a debug build's figures
    /// say little about Heddle's speed).
    pub build: &'static str,
    pub size: usize,
    pub nodes: usize,
    pub edges: usize,
    pub messages: u64,
    pub invocations: u64,
    /// Median wall time of the measured runs, in microseconds.
    pub wall_us: u64,
    pub invocations_per_sec: f64,
    pub messages_per_sec: f64,
    /// Runtime worker threads the runs used (1: a current-thread runtime).
    pub threads: usize,
    /// CPU time (user, system, and their sum) the whole process used during the median
    /// run, in microseconds; `null` where the platform does not report it. The sum is
    /// exact; Linux apportions user/system by tick sampling, so short runs skew the split.
    pub cpu_user_us: Option<u64>,
    pub cpu_system_us: Option<u64>,
    pub cpu_us: Option<u64>,
    /// Node invocations per second of CPU time: throughput per core actually used.
    pub invocations_per_cpu_sec: Option<f64>,
    /// CPU time per invocation, in microseconds: what one node invocation costs, the
    /// figure to set beside raw wasmtime's call cost for the WASM shapes.
    pub cpu_us_per_invocation: Option<f64>,
    /// CPU time / wall time: how many cores the run kept busy on average.
    pub cores_busy: Option<f64>,
    /// The process's peak resident set size so far (VmHWM), in KiB; it only grows, so a
    /// later shape's figure includes the earlier ones' peak.
    pub peak_rss_kib: Option<u64>,
    pub runs: usize,
    /// With `--durable`: what the median run's log wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogFigures>,
}

/// What a durable run's log wrote, from its counters (the run and its final flush).
#[derive(Debug, Serialize)]
pub struct LogFigures {
    pub records: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Commits that waited for stable storage (fsync).
    pub synced_commits: u64,
    /// Synced commits per node invocation. A node that is not retry-safe waits for one
    /// before its code runs (its start) and one after (its result); commits that several
    /// invocations waited on together count once, so this can be below 2 for it.
    pub synced_commits_per_invocation: f64,
    /// Appends a caller waited on (synced starts and results, flushes).
    pub waits: u64,
}

impl LogFigures {
    fn of(c: heddle_store::LogCounters, invocations: u64) -> LogFigures {
        LogFigures {
            records: c.records,
            commits: c.commits,
            synced_commits: c.synced_commits,
            synced_commits_per_invocation: c.synced_commits as f64 / invocations.max(1) as f64,
            waits: c.waits,
        }
    }
}

fn default_size(shape: Shape) -> usize {
    match shape {
        Shape::Chain | Shape::ChainWhen => 100,
        Shape::Fanout => 10_000,
        Shape::Wide => 1_000,
    }
}

/// Peak resident set size of this process, from `/proc/self/status` (Linux only).
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Where `--durable` keeps its scratch run stores and effect-chain its files (removed
/// when the bench ends).
fn scratch_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("heddle-bench-{}", std::process::id()))
}

/// The directory the effect chain's nodes write into (granted to the `files` package).
fn effects_dir() -> std::path::PathBuf {
    scratch_dir().join("effects")
}

/// Which build measures: what the figures are worth.
const BUILD: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

pub fn run(args: BenchArgs) -> anyhow::Result<Exit> {
    if args.size == Some(0) {
        return Err(crate::usage!("--size must be at least 1"));
    }
    if args.runs == 0 {
        return Err(crate::usage!("--runs must be at least 1"));
    }
    if args.threads == Some(0) {
        return Err(crate::usage!("--threads must be at least 1"));
    }
    let shapes: Vec<AnyShape> = match args.shape {
        ShapeArg::Chain => vec![AnyShape::Native(Shape::Chain)],
        ShapeArg::ChainWhen => vec![AnyShape::Native(Shape::ChainWhen)],
        ShapeArg::Fanout => vec![AnyShape::Native(Shape::Fanout)],
        ShapeArg::Wide => vec![AnyShape::Native(Shape::Wide)],
        ShapeArg::WasmChain => vec![AnyShape::Wasm(WasmShape::Chain)],
        ShapeArg::WasmFanout => vec![AnyShape::Wasm(WasmShape::Fanout)],
        ShapeArg::EffectChain => vec![AnyShape::Effect],
        ShapeArg::EffectFanout => vec![AnyShape::EffectFanout],
        ShapeArg::All => Shape::ALL
            .into_iter()
            .map(AnyShape::Native)
            .chain(WasmShape::ALL.into_iter().map(AnyShape::Wasm))
            .collect(),
    };
    let rt = heddle_runtime::tokio_runtime(args.threads)?;
    // With an OTLP endpoint in the environment every run is traced, and timed so.
    let settings = heddle_runtime::telemetry::TelemetrySettings::from_env()?;
    if let Some(t) = heddle_runtime::telemetry::KernelTracer::new(&settings, "bench") {
        if !args.json {
            println!(
                "traced: spans go to {}",
                settings.traces.as_ref().map_or("", |t| t.endpoint.as_str())
            );
        }
        bench::observe(Box::new(Traced(t)));
    }
    let mut registry = Registry::with_builtins();
    let effects = shapes
        .iter()
        .any(|s| matches!(s, AnyShape::Effect | AnyShape::EffectFanout))
        .then(effects_dir);
    if let Some(dir) = &effects {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the bench's scratch directory {}", dir.display()))?;
    }
    if shapes.iter().any(|s| !matches!(s, AnyShape::Native(_))) {
        registry.add(std::sync::Arc::new(
            rt.block_on(wasm_provider(effects.as_deref(), args.concurrency))?,
        ))?;
    }
    let threads = rt.metrics().num_workers();
    if BUILD == "debug" {
        eprintln!(
            "warning: this heddle is a debug build; its figures are many times slower than a release build's (`cargo run --release -- bench`)"
        );
    }
    if !args.json {
        println!("{}", threads_line(threads));
    }
    let mut all = Vec::new();
    for shape in shapes {
        let size = args.size.unwrap_or_else(|| shape.default_size());
        let messages = args.messages.unwrap_or_else(|| shape.default_messages());
        // Counted, not kept: a graph document held across the runs would count in the
        // peak RSS the bench reports as the runtime's (~1 KB per chain node).
        let (nodes, edges) = {
            let doc = shape.graph(size);
            (doc.nodes.len(), doc.edges.len())
        };
        let run_once = |journal| -> Result<bench::BenchRun, bench::BenchError> {
            rt.block_on(async {
                match shape {
                    AnyShape::Native(s) => {
                        bench::run_shape_journaled(&registry, s, size, messages, journal).await
                    }
                    AnyShape::Wasm(s) => {
                        wasm_bench::run_shape(&registry, s, size, messages, journal).await
                    }
                    AnyShape::Effect => {
                        let dir = effects.as_deref().expect("created for the effect shapes");
                        wasm_bench::run_effect_chain(&registry, size, messages, dir, journal).await
                    }
                    AnyShape::EffectFanout => {
                        let dir = effects.as_deref().expect("created for the effect shapes");
                        wasm_bench::run_effect_fanout(&registry, size, dir, journal).await
                    }
                }
            })
        };
        let one = || -> anyhow::Result<(bench::BenchRun, Option<LogFigures>)> {
            if !args.durable {
                return Ok((run_once(None)?, None));
            }
            let d = heddle_store::bench::timed(&scratch_dir().join("runs.db"), |journal| {
                run_once(Some(journal))
            })?;
            let log = LogFigures::of(d.log, d.run.invocations);
            Ok((d.run, Some(log)))
        };
        // Warm-up: first-touch allocations and thread start-up are not the scheduler.
        one()?;
        let mut runs = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            runs.push(one()?);
        }
        runs.sort_by_key(|(r, _)| r.elapsed);
        let (median, log) = runs.swap_remove(runs.len() / 2);
        let figures = ShapeFigures {
            shape: shape.name(),
            build: BUILD,
            size,
            nodes,
            edges,
            messages: median.messages,
            invocations: median.invocations,
            wall_us: median.elapsed.as_micros() as u64,
            invocations_per_sec: median.invocations_per_sec(),
            messages_per_sec: median.messages_per_sec(),
            threads,
            cpu_user_us: median.cpu.map(|c| c.user.as_micros() as u64),
            cpu_system_us: median.cpu.map(|c| c.system.as_micros() as u64),
            cpu_us: median.cpu.map(|c| c.total().as_micros() as u64),
            invocations_per_cpu_sec: median.invocations_per_cpu_sec(),
            cpu_us_per_invocation: median
                .cpu
                .filter(|_| median.invocations > 0)
                .map(|c| c.total().as_secs_f64() * 1e6 / median.invocations as f64),
            cores_busy: median.cores_busy(),
            peak_rss_kib: peak_rss_kib(),
            runs: args.runs,
            log,
        };
        if !args.json {
            print_human(&figures, median.elapsed);
        }
        all.push(figures);
    }
    if args.durable || effects.is_some() {
        // The stores and files were scratch space for this process only.
        let _ = std::fs::remove_dir_all(scratch_dir());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(Exit::Ok)
}

/// Every bench run traced ([`heddle_runtime::telemetry::KernelTracer`]).
struct Traced(heddle_runtime::telemetry::KernelTracer);

impl bench::Observer for Traced {
    fn options(&self, opts: &mut heddle_kernel::runtime::RunOptions) {
        self.0.prepare(opts);
    }

    fn started(
        &self,
        run: &heddle_kernel::runtime::Run,
    ) -> Option<heddle_kernel::BoxFuture<'static, ()>> {
        self.0.start(run)
    }
}

/// The WASM provider with the first-party packages (the shapes use `std`), on the
/// default engine settings: what a fresh install runs. With `effects`, the `files`
/// package may write there (the effect shapes' grant), with at most `concurrency` of a
/// node's invocations at once.
async fn wasm_provider(
    effects: Option<&std::path::Path>,
    concurrency: Option<u32>,
) -> anyhow::Result<heddle_wasm::WasmProvider> {
    let mut config = heddle_wasm::WasmConfig::default();
    if let Some(dir) = effects {
        let grant = heddle_wasm::PackageGrant {
            concurrency,
            ..wasm_bench::effect_grant(dir)
        };
        config.packages.insert("files".into(), grant);
    }
    let host =
        heddle_wasm::WasmHost::new(config.wasm.clone()).context("starting the WASM engine")?;
    host.on_compile(|name| eprintln!("compiling {name} (first use)…"));
    let mut p = heddle_wasm::WasmProvider::new(host, config);
    p.add_first_party()
        .await
        .context("loading the first-party WASM packages")?;
    Ok(p)
}

fn threads_line(threads: usize) -> String {
    if threads == 1 {
        "runtime: current-thread (1 thread)".into()
    } else {
        format!("runtime: multi-thread, {threads} workers")
    }
}

fn print_human(f: &ShapeFigures, wall: Duration) {
    let cpu = match (f.cpu_us, f.cores_busy) {
        (Some(us), Some(cores)) => format!("{:>9.3} ms ({cores:.2} cores)", us as f64 / 1e3),
        _ => "n/a".into(),
    };
    println!(
        "{:<11} size {:>6}  nodes {:>6}  messages {:>7}  invocations {:>8}  wall {:>9.3} ms  cpu {cpu}  {:>8} inv/s  {:>8} inv/cpu-s  {} cpu/inv  {:>8} msg/s  peak RSS {}",
        f.shape,
        f.size,
        f.nodes,
        f.messages,
        f.invocations,
        wall.as_secs_f64() * 1e3,
        human_rate(f.invocations_per_sec),
        f.invocations_per_cpu_sec
            .map(human_rate)
            .unwrap_or_else(|| "n/a".into()),
        f.cpu_us_per_invocation
            .map(|us| format!("{us:.3} µs"))
            .unwrap_or_else(|| "n/a".into()),
        human_rate(f.messages_per_sec),
        f.peak_rss_kib
            .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
            .unwrap_or_else(|| "n/a".into()),
    );
    if let Some(l) = &f.log {
        println!(
            "{:<11} log: {} records in {} commits, {} synced ({:.3} per invocation)",
            "", l.records, l.commits, l.synced_commits, l.synced_commits_per_invocation
        );
    }
}

fn human_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_peak_rss() {
        let kib = super::peak_rss_kib().expect("Linux exposes VmHWM");
        assert!(kib > 0);
    }
}
