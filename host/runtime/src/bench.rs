//! Scheduler throughput measured on the criterion benches' graph shapes
//! (`heddle_kernel::bench` for native nodes, `heddle_wasm::bench` for WASM nodes,
//! `heddle_store::bench` for durable runs), so that `heddle bench`, an embedder's own
//! harness and `cargo bench` report figures that compare.
//!
//! A measuring hook, not the embedding API: compiled only with the `bench` feature.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use heddle_runtime::bench::{Bench, BenchOptions, BenchShape};
//! use heddle_kernel::bench::Shape;
//!
//! let rt = heddle_runtime::tokio_runtime(None)?;
//! let shapes = [BenchShape::Native(Shape::Chain)];
//! let bench = Bench::new(&rt, &shapes, None)?;
//! let figures = bench.measure(&rt, shapes[0], &BenchOptions::default())?;
//! println!("{} invocations/s", figures.invocations_per_sec);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use heddle_kernel::Registry;
use heddle_kernel::bench::{self, BenchError as RunError, BenchRun, Shape};
use heddle_wasm::bench::{self as wasm_bench, Guest, GuestShape, WasmShape};
use serde::Serialize;

/// A shape of any family: native pass-through nodes, `std` WASM nodes, or the WASM
/// nodes that are not retry-safe and write a file per invocation (the effect shapes:
/// what a durable run's synced commits cost).
#[derive(Clone, Copy, Debug)]
pub enum BenchShape {
    /// Native pass-through nodes.
    Native(Shape),
    /// First-party `std` WASM nodes.
    Wasm(WasmShape),
    /// A chain of `files` nodes, each invocation writing a file.
    EffectChain,
    /// A fan-out of `files` nodes, each invocation writing a file.
    EffectFanout,
    /// A chain of one guest language's division node, fresh or warm instances.
    Guest(GuestShape),
}

impl BenchShape {
    /// Every native and WASM shape (`heddle bench --shape all`): the effect shapes write
    /// files and are asked for by name.
    pub fn all() -> Vec<BenchShape> {
        Shape::ALL
            .into_iter()
            .map(BenchShape::Native)
            .chain(WasmShape::ALL.into_iter().map(BenchShape::Wasm))
            .collect()
    }

    /// Its name in figures and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BenchShape::Native(s) => s.name(),
            BenchShape::Wasm(s) => s.name(),
            BenchShape::EffectChain => "effect-chain",
            BenchShape::EffectFanout => "effect-fanout",
            BenchShape::Guest(g) => g.name(),
        }
    }

    /// Its size unless the options say: nodes in a chain, items in a fan-out.
    pub fn default_size(self) -> usize {
        match self {
            BenchShape::Native(Shape::Chain | Shape::ChainWhen) => 100,
            BenchShape::Native(Shape::Fanout) => 10_000,
            BenchShape::Native(Shape::Wide) => 1_000,
            BenchShape::Wasm(s) => s.default_size(),
            BenchShape::EffectChain => 10,
            BenchShape::EffectFanout => 300,
            BenchShape::Guest(g) => g.default_size(),
        }
    }

    /// Values pushed through a chain unless the options say: every effect-chain
    /// invocation waits for the disk twice in a durable run, so it takes fewer.
    pub fn default_messages(self) -> usize {
        match self {
            BenchShape::EffectChain => 100,
            BenchShape::Guest(g) => g.default_messages(),
            _ => 10_000,
        }
    }

    fn writes_files(self) -> bool {
        matches!(self, BenchShape::EffectChain | BenchShape::EffectFanout)
    }

    fn graph(self, size: usize) -> heddle_core::GraphDoc {
        match self {
            BenchShape::Native(s) => bench::graph(s, size),
            BenchShape::Wasm(s) => wasm_bench::graph(s, size),
            BenchShape::EffectChain => wasm_bench::effect_chain(size),
            BenchShape::EffectFanout => wasm_bench::effect_fanout(size),
            BenchShape::Guest(g) => wasm_bench::guest_chain(g.guest, size),
        }
    }
}

/// How a shape is measured.
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    /// The shape's size; its [`BenchShape::default_size`] when `None`.
    pub size: Option<usize>,
    /// Values pushed through a chain; its [`BenchShape::default_messages`] when `None`.
    pub messages: Option<usize>,
    /// Measured runs after one warm-up; the median is reported. At least 1.
    pub runs: usize,
    /// Each run durable: on a scratch SQLite store, or on the store given to
    /// [`Bench::durable_on`].
    pub durable: bool,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            size: None,
            messages: None,
            runs: 5,
            durable: false,
        }
    }
}

/// Which build measures: what the figures are worth (a debug build's figures say
/// little about Heddle's speed).
pub const BUILD: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The figures of one shape: the median of the measured runs.
#[derive(Debug, Serialize)]
pub struct ShapeFigures {
    /// The shape's name.
    pub shape: &'static str,
    /// `debug` or `release`: which build of heddle measured ([`BUILD`]).
    pub build: &'static str,
    /// The shape's size.
    pub size: usize,
    /// Nodes in its graph.
    pub nodes: usize,
    /// Edges in its graph.
    pub edges: usize,
    /// Values the run carried.
    pub messages: u64,
    /// Node invocations the run made.
    pub invocations: u64,
    /// Median wall time of the measured runs, in microseconds.
    pub wall_us: u64,
    /// Node invocations per second of wall time.
    pub invocations_per_sec: f64,
    /// Values per second of wall time.
    pub messages_per_sec: f64,
    /// Runtime worker threads the runs used (1: a current-thread runtime).
    pub threads: usize,
    /// User CPU time of the whole process during the median run, in microseconds;
    /// `null` where the platform does not report it. Linux apportions user and system
    /// time by tick sampling, so short runs skew the split; the sum is exact.
    pub cpu_user_us: Option<u64>,
    /// System CPU time, as `cpu_user_us`.
    pub cpu_system_us: Option<u64>,
    /// User and system CPU time together.
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
    /// Measured runs.
    pub runs: usize,
    /// With [`BenchOptions::durable`]: what the median run's log wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogFigures>,
}

/// What a durable run's log wrote, from its counters (the run and its final flush).
#[derive(Debug, Serialize)]
pub struct LogFigures {
    /// Records appended.
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

/// Why a measurement stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Options out of range (a size, a run count of 0).
    #[error("{0}")]
    Options(String),
    /// A run of the shape was refused or did not complete.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A durable run's scratch store failed.
    #[error(transparent)]
    Store(#[from] heddle_store::StoreError),
    /// The WASM engine or the first-party packages would not load.
    #[error("loading the first-party WASM packages")]
    Packages(#[source] Box<heddle_wasm::PackageError>),
    /// The shapes' providers clash (an invariant: they declare distinct types).
    #[error(transparent)]
    Registry(#[from] heddle_kernel::RegistryError),
    /// A guest shape's package was not given ([`Bench::with_guests`]) or would not load.
    #[error("the {shape} shape needs the {package} package (built from {example})")]
    GuestPackage {
        /// The shape.
        shape: &'static str,
        /// The package it runs.
        package: &'static str,
        /// Where its source is.
        example: &'static str,
        /// Why it would not load, when it was given.
        #[source]
        source: Option<Box<heddle_wasm::PackageError>>,
    },
    /// The scratch directory could not be made.
    #[error("creating the bench's scratch directory {}", path.display())]
    Scratch {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<heddle_store::bench::DurableBenchError> for BenchError {
    fn from(e: heddle_store::bench::DurableBenchError) -> BenchError {
        match e {
            heddle_store::bench::DurableBenchError::Store(e) => BenchError::Store(e),
            heddle_store::bench::DurableBenchError::Bench(e) => BenchError::Run(e),
        }
    }
}

/// The providers the shapes need, and the scratch space of this process's durable
/// stores and effect files (removed when the `Bench` is dropped). Create it once for
/// every shape to measure: the WASM packages load once.
pub struct Bench {
    shapes: Vec<&'static str>,
    registry: Registry,
    /// The guest packages (and the first-party ones) granted `fresh_instances`, for the
    /// fresh guest shapes: the same nodes as in `registry`, a fresh instance each time.
    fresh: Option<Registry>,
    scratch: PathBuf,
    effects: Option<PathBuf>,
    threads: usize,
    /// Where durable runs go instead of the scratch SQLite file (a PostgreSQL database:
    /// the bench's runs are left there).
    store: Option<Arc<dyn heddle_store::RunStore>>,
}

impl Bench {
    /// Registers what `shapes` need on the runtime `rt` will run them on: the built-in
    /// nodes, and the first-party WASM packages on the default engine settings (what a
    /// fresh install runs) when a WASM shape is among them. For the effect shapes the
    /// `files` package may write into the scratch directory, with at most `concurrency`
    /// of a node's invocations at once.
    pub fn new(
        rt: &tokio::runtime::Runtime,
        shapes: &[BenchShape],
        concurrency: Option<u32>,
    ) -> Result<Bench, BenchError> {
        Bench::with_guests(rt, shapes, concurrency, &[])
    }

    /// [`Bench::new`] with the built packages of the guest shapes (Python, JavaScript
    /// and C: the SDK examples built by `heddle_package_build`; Rust's twin is in the
    /// first-party `std`).
    pub fn with_guests(
        rt: &tokio::runtime::Runtime,
        shapes: &[BenchShape],
        concurrency: Option<u32>,
        guests: &[(Guest, PathBuf)],
    ) -> Result<Bench, BenchError> {
        let scratch = std::env::temp_dir().join(format!("heddle-bench-{}", std::process::id()));
        let effects = shapes
            .iter()
            .any(|s| s.writes_files())
            .then(|| scratch.join("effects"));
        if let Some(dir) = &effects {
            std::fs::create_dir_all(dir).map_err(|source| BenchError::Scratch {
                path: dir.clone(),
                source,
            })?;
        }
        let guest_shapes: Vec<GuestShape> = shapes
            .iter()
            .filter_map(|s| match s {
                BenchShape::Guest(g) => Some(*g),
                _ => None,
            })
            .collect();
        // Every guest a shape needs, with its package directory (none for Rust).
        let mut wanted: Vec<(Guest, Option<&Path>)> = Vec::new();
        for g in &guest_shapes {
            if wanted.iter().any(|(w, _)| *w == g.guest) {
                continue;
            }
            let dir = guests
                .iter()
                .find(|(w, _)| *w == g.guest)
                .map(|(_, d)| d.as_path());
            if dir.is_none() && g.guest != Guest::Rust {
                return Err(guest_error(*g, None));
            }
            wanted.push((g.guest, dir));
        }
        let mut registry = Registry::with_builtins();
        if shapes.iter().any(|s| !matches!(s, BenchShape::Native(_))) {
            let provider = rt
                .block_on(wasm_provider(
                    effects.as_deref(),
                    concurrency,
                    &wanted,
                    false,
                ))
                .map_err(|e| BenchError::Packages(Box::new(e)))?;
            registry.add(Arc::new(provider))?;
        }
        let fresh = match guest_shapes.iter().any(|g| g.fresh) {
            true => {
                let provider = rt
                    .block_on(wasm_provider(None, concurrency, &wanted, true))
                    .map_err(|e| BenchError::Packages(Box::new(e)))?;
                let mut r = Registry::with_builtins();
                r.add(Arc::new(provider))?;
                Some(r)
            }
            false => None,
        };
        Ok(Bench {
            shapes: shapes.iter().map(|s| s.name()).collect(),
            registry,
            fresh,
            scratch,
            effects,
            threads: rt.metrics().num_workers(),
            store: None,
        })
    }

    /// Measures durable runs on `store` (e.g. a PostgreSQL database) instead of a scratch
    /// SQLite file: what its log costs there.
    pub fn durable_on(&mut self, store: Arc<dyn heddle_store::RunStore>) {
        self.store = Some(store);
    }

    /// Runtime worker threads the runs use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Measures `shape`: one warm-up run (first-touch allocations and thread start-up
    /// are not the scheduler), then `opts.runs` runs, reporting the median.
    pub fn measure(
        &self,
        rt: &tokio::runtime::Runtime,
        shape: BenchShape,
        opts: &BenchOptions,
    ) -> Result<ShapeFigures, BenchError> {
        if opts.runs == 0 {
            return Err(BenchError::Options("runs must be at least 1".into()));
        }
        if !self.shapes.contains(&shape.name()) {
            return Err(BenchError::Options(format!(
                "{} is not among the shapes this bench was created for",
                shape.name()
            )));
        }
        if opts.size == Some(0) {
            return Err(BenchError::Options("size must be at least 1".into()));
        }
        let size = opts.size.unwrap_or_else(|| shape.default_size());
        let messages = opts.messages.unwrap_or_else(|| shape.default_messages());
        // Counted, not kept: a graph document held across the runs would count in the
        // peak RSS reported as the runtime's (~1 KB per chain node).
        let (nodes, edges) = {
            let doc = shape.graph(size);
            (doc.nodes.len(), doc.edges.len())
        };
        let store: Option<Arc<dyn heddle_store::RunStore>> = match (&self.store, opts.durable) {
            (_, false) => None,
            (Some(s), true) => Some(s.clone()),
            (None, true) => Some(Arc::new(heddle_store::SqliteStore::open(
                &self.scratch.join("runs.db"),
            )?)),
        };
        let one = || -> Result<(BenchRun, Option<LogFigures>), BenchError> {
            let Some(store) = store.clone() else {
                return Ok((self.run_once(rt, shape, size, messages, None)?, None));
            };
            let d = heddle_store::bench::timed(store, |journal| {
                self.run_once(rt, shape, size, messages, Some(journal))
            })?;
            let log = LogFigures::of(d.log, d.run.invocations);
            Ok((d.run, Some(log)))
        };
        one()?;
        let mut runs = Vec::with_capacity(opts.runs);
        for _ in 0..opts.runs {
            runs.push(one()?);
        }
        runs.sort_by_key(|(r, _)| r.elapsed);
        let (median, log) = runs.swap_remove(runs.len() / 2);
        let cpu_us_per_invocation = median
            .cpu
            .filter(|_| median.invocations > 0)
            .map(|c| c.total().as_secs_f64() * 1e6 / median.invocations as f64);
        Ok(ShapeFigures {
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
            threads: self.threads,
            cpu_user_us: median.cpu.map(|c| c.user.as_micros() as u64),
            cpu_system_us: median.cpu.map(|c| c.system.as_micros() as u64),
            cpu_us: median.cpu.map(|c| c.total().as_micros() as u64),
            invocations_per_cpu_sec: median.invocations_per_cpu_sec(),
            cpu_us_per_invocation,
            cores_busy: median.cores_busy(),
            peak_rss_kib: peak_rss_kib(),
            runs: opts.runs,
            log,
        })
    }

    fn run_once(
        &self,
        rt: &tokio::runtime::Runtime,
        shape: BenchShape,
        size: usize,
        messages: usize,
        journal: Option<Arc<dyn heddle_kernel::Journal>>,
    ) -> Result<BenchRun, RunError> {
        let registry = &self.registry;
        rt.block_on(async {
            match (shape, self.effects.as_deref()) {
                (BenchShape::Native(s), _) => {
                    bench::run_shape_journaled(registry, s, size, messages, journal).await
                }
                (BenchShape::Wasm(s), _) => {
                    wasm_bench::run_shape(registry, s, size, messages, journal).await
                }
                (BenchShape::EffectChain, Some(dir)) => {
                    wasm_bench::run_effect_chain(registry, size, messages, dir, journal).await
                }
                (BenchShape::EffectFanout, Some(dir)) => {
                    wasm_bench::run_effect_fanout(registry, size, dir, journal).await
                }
                // Invariant: `measure` refuses a shape `new` was not given, and `new`
                // made the directory for any effect shape.
                (BenchShape::EffectChain | BenchShape::EffectFanout, None) => {
                    unreachable!("effect shape without its directory")
                }
                (BenchShape::Guest(g), _) => {
                    // Invariant: `with_guests` made `fresh` when a fresh shape was given.
                    let registry = match (g.fresh, &self.fresh) {
                        (true, Some(r)) => r,
                        _ => registry,
                    };
                    wasm_bench::run_guest_chain(registry, g.guest, size, messages, journal).await
                }
            }
        })
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // The stores and files were scratch space for this process only.
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

fn guest_error(g: GuestShape, source: Option<heddle_wasm::PackageError>) -> BenchError {
    BenchError::GuestPackage {
        shape: g.name(),
        package: g.guest.package(),
        example: g.guest.example().unwrap_or("plugins/std"),
        source: source.map(Box::new),
    }
}

/// The WASM provider with the first-party packages on the default engine settings, and
/// the guest packages in `guests`; with `fresh`, every one of them granted
/// `fresh_instances`.
async fn wasm_provider(
    effects: Option<&Path>,
    concurrency: Option<u32>,
    guests: &[(Guest, Option<&Path>)],
    fresh: bool,
) -> Result<heddle_wasm::WasmProvider, heddle_wasm::PackageError> {
    let mut config = heddle_wasm::WasmConfig::default();
    if fresh {
        for (g, _) in guests {
            config.packages.insert(
                g.package().into(),
                heddle_wasm::PackageGrant {
                    fresh_instances: true,
                    ..Default::default()
                },
            );
        }
    }
    if let Some(dir) = effects {
        let grant = heddle_wasm::PackageGrant {
            concurrency,
            ..wasm_bench::effect_grant(dir)
        };
        config.packages.insert("files".into(), grant);
    }
    let host = heddle_wasm::WasmHost::new(config.wasm.clone())?;
    host.on_compile(|name| tracing::info!("compiling {name} (first use)…"));
    let mut p = heddle_wasm::WasmProvider::new(host.clone(), config);
    p.add_first_party().await?;
    for (_, dir) in guests {
        if let Some(dir) = dir {
            p.add(heddle_wasm::WasmPackage::load_dir(&host, dir).await?)?;
        }
    }
    Ok(p)
}

/// Peak resident set size of this process, from `/proc/self/status` (Linux only).
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The line `heddle bench` starts with: the tokio runtime the figures are of.
pub fn threads_line(threads: usize) -> String {
    if threads == 1 {
        "runtime: current-thread (1 thread)".into()
    } else {
        format!("runtime: multi-thread, {threads} workers")
    }
}

impl ShapeFigures {
    /// As `heddle bench` prints them: a line, and one more for a durable run's log.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let f = self;
        // Writing to a String cannot fail.
        let mut out = String::new();
        let wall = std::time::Duration::from_micros(f.wall_us);
        let cpu = match (f.cpu_us, f.cores_busy) {
            (Some(us), Some(cores)) => format!("{:>9.3} ms ({cores:.2} cores)", us as f64 / 1e3),
            _ => "n/a".into(),
        };
        let _ = writeln!(
            out,
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
            let _ = writeln!(
                out,
                "{:<11} log: {} records in {} commits, {} synced ({:.3} per invocation)",
                "", l.records, l.commits, l.synced_commits, l.synced_commits_per_invocation
            );
        }
        out
    }
}

/// A rate as a person reads it: `1.23M`, `4.5k`, `678`.
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
