//! The benchmark graphs, shared by the criterion benches and `heddle bench` so both
//! measure exactly the same shapes.
//!
//! - `chain`: a streaming input → N pass-through nodes → an output; messages are pushed
//!   while the run is live, so every message makes N node invocations.
//! - `fanout`: an input list of N items → `heddle.foreach` → 3 pass-through nodes per
//!   item → `heddle.collect` → an output (3·N per-item invocations, one list out).
//! - `wide`: N independent pass-through nodes, each fired once from its own property.

use std::time::{Duration, Instant};

use heddle_core::{GraphBuilder, GraphDoc, INPUT_TYPE, OUTPUT_TYPE, RunResult, RunStatus, Value};

use crate::executor::BoxFuture;
use crate::registry::Registry;
use crate::runtime::{KernelError, Run, RunHandle, RunOptions};

/// What a program timing bench runs adds to every one of them, in the timed span:
/// `heddle bench` traces its runs this way when an exporter is configured, so the
/// figures say what tracing costs.
pub trait Observer: Send + Sync {
    /// Adjusts a run's options before it is built (its trace).
    fn options(&self, opts: &mut RunOptions);
    /// The run, built and not started (subscribe to its events here). What it returns
    /// is awaited once the run's result is in, before the clocks stop.
    fn started(&self, run: &Run) -> Option<BoxFuture<'static, ()>>;
}

static OBSERVER: std::sync::OnceLock<Box<dyn Observer>> = std::sync::OnceLock::new();

/// Adds `observer` to every bench run of this process from now on (the first call
/// only).
pub fn observe(observer: Box<dyn Observer>) {
    let _ = OBSERVER.set(observer);
}

/// A synthetic graph shape of pass-through nodes, measured by `heddle bench` and the
/// criterion benches alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `n` nodes in a row, values pushed through them.
    Chain,
    /// The chain with the condition `value > 0` on every edge (what a condition costs).
    ChainWhen,
    /// A list of `n` items fanned out, each through a node, and collected.
    Fanout,
    /// `n` independent nodes.
    Wide,
}

impl Shape {
    /// Every shape `heddle bench` runs by default.
    pub const ALL: [Shape; 3] = [Shape::Chain, Shape::Fanout, Shape::Wide];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Chain => "chain",
            Shape::ChainWhen => "chain-when",
            Shape::Fanout => "fanout",
            Shape::Wide => "wide",
        }
    }
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chain" => Ok(Shape::Chain),
            "chain-when" => Ok(Shape::ChainWhen),
            "fanout" | "fan-out" => Ok(Shape::Fanout),
            "wide" => Ok(Shape::Wide),
            other => Err(format!(
                "unknown bench shape `{other}` (expected chain, chain-when, fanout or wide)"
            )),
        }
    }
}

/// `in` (streaming input named `in`) → `p0` … `p{n-1}` → `out`.
pub fn chain(n: usize) -> GraphDoc {
    chain_of(n, None)
}

/// [`chain`] with `when` on every edge.
pub fn chain_when(n: usize, when: &str) -> GraphDoc {
    chain_of(n, Some(when))
}

fn chain_of(n: usize, when: Option<&str>) -> GraphDoc {
    let cond = |g: GraphBuilder| match when {
        Some(w) => g.when(w),
        None => g,
    };
    // Sized up front: the document is alive while the graph is planned, and grown node
    // by node it would leave room behind that the plan's peak memory counts.
    let mut g = GraphBuilder::with_capacity(n + 2, n + 1)
        .named(format!("chain-{n}"))
        .node("in", INPUT_TYPE)
        .prop("name", "in")
        .prop("streaming", true);
    let mut prev = "in".to_string();
    for i in 0..n {
        let id = format!("p{i}");
        g = cond(
            g.node(&id, "heddle.passthrough")
                .edge(&prev, "value", &id, "value"),
        );
        prev = id;
    }
    cond(
        g.node("out", OUTPUT_TYPE)
            .prop("name", "out")
            .edge(&prev, "value", "out", "value"),
    )
    .build()
}

/// `items` (input, list of n ints) → `each` → `a` → `b` → `c` → `gather` → `out`.
pub fn fanout(n: usize) -> GraphDoc {
    let items = Value::list((0..n as i64).map(Value::Int).collect());
    GraphBuilder::new()
        .named(format!("fanout-{n}"))
        .node("items", INPUT_TYPE)
        .prop("name", "items")
        .prop("value", items)
        .node("each", "heddle.foreach")
        .node("a", "heddle.passthrough")
        .node("b", "heddle.passthrough")
        .node("c", "heddle.passthrough")
        .node("gather", "heddle.collect")
        .node("out", OUTPUT_TYPE)
        .prop("name", "out")
        .edge("items", "value", "each", "list")
        .edge("each", "item", "a", "value")
        .edge("a", "value", "b", "value")
        .edge("b", "value", "c", "value")
        .edge("c", "value", "gather", "item")
        .edge("gather", "list", "out", "value")
        .build()
}

/// `w0` … `w{n-1}`: independent pass-through nodes, each fired once with its property.
pub fn wide(n: usize) -> GraphDoc {
    (0..n)
        .fold(GraphBuilder::new().named(format!("wide-{n}")), |g, i| {
            g.node(&format!("w{i}"), "heddle.passthrough")
                .prop("value", i as i64)
        })
        .build()
}

/// The document of `shape` at size `n`.
pub fn graph(shape: Shape, n: usize) -> GraphDoc {
    match shape {
        Shape::Chain => chain(n),
        Shape::ChainWhen => chain_when(n, "value > 0"),
        Shape::Fanout => fanout(n),
        Shape::Wide => wide(n),
    }
}

/// CPU time the whole process used (every thread: runtime workers, the blocking pool and
/// the thread driving the run), so a figure counts the cores a run kept busy, which wall
/// time alone hides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// Time in user mode.
    pub user: Duration,
    /// Time in the kernel.
    pub system: Duration,
}

impl CpuTime {
    /// CPU time this process has used so far; `None` where the platform does not say
    /// (not a Unix, or `getrusage` failed).
    pub fn now() -> Option<CpuTime> {
        #[cfg(unix)]
        {
            // SAFETY: getrusage only writes the struct we pass; all-zero is a valid rusage.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
                return None;
            }
            let d = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            Some(CpuTime {
                user: d(ru.ru_utime),
                system: d(ru.ru_stime),
            })
        }
        #[cfg(not(unix))]
        {
            None
        }
    }

    /// CPU time used since the reading `start` was taken (`None` if either reading is).
    pub fn used_since(start: Option<CpuTime>) -> Option<CpuTime> {
        CpuTime::now().zip(start).map(|(now, then)| now.since(then))
    }

    /// User and system time together.
    pub fn total(self) -> Duration {
        self.user + self.system
    }

    /// The CPU time used between `earlier` and `self` (saturating: the counters only grow,
    /// but a kernel may round each reading differently).
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

/// What one bench run did.
#[derive(Clone, Debug)]
pub struct BenchRun {
    /// Wall time from the start to the checked result.
    pub elapsed: Duration,
    /// CPU time the process used over the same span as `elapsed`; `None` where the
    /// platform does not report it.
    pub cpu: Option<CpuTime>,
    /// Messages that entered the graph (chain: pushed values; fanout: items; wide: nodes).
    pub messages: u64,
    /// Node invocations of pass-through nodes (the work the shape is about).
    pub invocations: u64,
}

impl BenchRun {
    /// Messages per second of wall time.
    pub fn messages_per_sec(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
    /// Invocations per second of wall time.
    pub fn invocations_per_sec(&self) -> f64 {
        self.invocations as f64 / self.elapsed.as_secs_f64()
    }
    /// Invocations per second of CPU time: the efficiency figure, comparable across
    /// thread counts where `invocations_per_sec` rewards burning more cores.
    /// `None` without a CPU reading or when the run used no measurable CPU time.
    pub fn invocations_per_cpu_sec(&self) -> Option<f64> {
        let cpu = self.cpu?.total();
        (!cpu.is_zero()).then(|| self.invocations as f64 / cpu.as_secs_f64())
    }
    /// Average cores kept busy over the run (CPU time / wall time).
    pub fn cores_busy(&self) -> Option<f64> {
        let wall = self.elapsed.as_secs_f64();
        let cpu = self.cpu?.total().as_secs_f64();
        (wall > 0.0).then(|| cpu / wall)
    }
}

/// Why a bench run did not give a figure.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The kernel refused the shape.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The run did not complete.
    #[error("bench run ended {status:?}: {error}")]
    Run {
        /// How it ended.
        status: RunStatus,
        /// Why.
        error: String,
    },
    /// The run completed with the wrong result (a figure for wrong work is no figure).
    #[error("bench run produced the wrong output: {0}")]
    Output(String),
    /// A file a bench shape's effects go to could not be read or cleared.
    #[error("{}: cannot read or clear the bench's effect file", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Plans and runs one shape on the current tokio runtime and checks its output.
/// `messages` is the number of values pushed through the chain (ignored otherwise).
/// Timing (wall and CPU) covers the run from start to result, not planning.
pub async fn run_shape(
    registry: &Registry,
    shape: Shape,
    n: usize,
    messages: usize,
) -> Result<BenchRun, BenchError> {
    run_shape_journaled(registry, shape, n, messages, None).await
}

/// [`run_shape`] with every invocation written ahead to `journal` (a durable run).
pub async fn run_shape_journaled(
    registry: &Registry,
    shape: Shape,
    n: usize,
    messages: usize,
    journal: Option<std::sync::Arc<dyn crate::journal::Journal>>,
) -> Result<BenchRun, BenchError> {
    let timed = TimedRun::start(graph(shape, n), registry, journal)?;
    let h = &timed.handle;
    let (msgs, expect) = match shape {
        Shape::Chain | Shape::ChainWhen => {
            // From 1, so every value passes `value > 0`.
            for i in 1..=messages {
                h.push_input("in", Value::Int(i as i64)).await?;
            }
            h.finish_input("in").await?;
            (messages as u64, (n * messages) as u64)
        }
        Shape::Fanout => (n as u64, 3 * n as u64),
        Shape::Wide => (n as u64, n as u64),
    };
    let (r, timing) = timed.finish("heddle.passthrough", expect).await?;
    match shape {
        Shape::Chain | Shape::ChainWhen => {
            let got = r.outputs.get("out").map(|v| v.len()).unwrap_or(0);
            if got != messages {
                return Err(BenchError::Output(format!(
                    "expected {messages} outputs, got {got}"
                )));
            }
        }
        Shape::Fanout => {
            let ok = r
                .outputs
                .get("out")
                .and_then(|v| v.first())
                .and_then(|l| l.as_list())
                .map(|l| l.len());
            if ok != Some(n) {
                return Err(BenchError::Output(format!(
                    "expected one list of {n} items, got {ok:?}"
                )));
            }
        }
        Shape::Wide => {}
    }
    Ok(BenchRun {
        messages: msgs,
        ..timing
    })
}

/// A bench run between its start and its checked result: one way to time a shape, so
/// every shape (the kernel's here, the WASM ones in `heddle_wasm::bench`) measures the
/// same span and refuses the same wrong results.
pub struct TimedRun {
    /// The started run.
    pub handle: RunHandle,
    cpu0: Option<CpuTime>,
    t0: Instant,
    /// The [`Observer`]'s work, done once the result is in.
    observed: Option<BoxFuture<'static, ()>>,
}

impl TimedRun {
    /// Plans `doc` and starts it (retaining few events, written ahead to `journal` when
    /// given); the clocks start here. `doc` is freed before they do: building it is not
    /// timed, so neither is freeing it (as the caller's temporary it was freed after the
    /// clocks started: on the wide graph, an eighth of the instructions timed), and it is
    /// not held while the run uses its memory (on the 100,000-node wide graph ~36 MB of peak RSS).
    pub fn start(
        doc: GraphDoc,
        registry: &Registry,
        journal: Option<std::sync::Arc<dyn crate::journal::Journal>>,
    ) -> Result<TimedRun, BenchError> {
        let plan = heddle_core::plan::plan(&doc, registry).map_err(KernelError::from)?;
        drop(doc);
        let mut opts = RunOptions {
            event_cap: 1_000,
            journal,
            ..RunOptions::default()
        };
        if let Some(o) = OBSERVER.get() {
            o.options(&mut opts);
        }
        let run = Run::new(plan, registry, opts)?;
        let observed = OBSERVER.get().and_then(|o| o.started(&run));
        let cpu0 = CpuTime::now();
        let t0 = Instant::now();
        Ok(TimedRun {
            handle: run.start(),
            cpu0,
            t0,
            observed,
        })
    }

    /// Waits for the result and stops the clocks. A run that did not complete, or whose
    /// `node_type` nodes did not make exactly `expect` invocations, is an error: a bench
    /// that drops work cannot pass for a fast one. The timing's `messages` is left 0 for
    /// the caller to set.
    pub async fn finish(
        self,
        node_type: &str,
        expect: u64,
    ) -> Result<(RunResult, BenchRun), BenchError> {
        let r = self.handle.wait().await;
        if let Some(o) = self.observed {
            o.await;
        }
        let elapsed = self.t0.elapsed();
        let cpu = CpuTime::used_since(self.cpu0);
        if r.status != RunStatus::Completed {
            return Err(BenchError::Run {
                status: r.status,
                error: r.error.unwrap_or_default(),
            });
        }
        let invocations: u64 = r
            .nodes
            .values()
            .filter(|n| &*n.node_type == node_type)
            .map(|n| n.invocations)
            .sum();
        if invocations != expect {
            return Err(BenchError::Output(format!(
                "expected {expect} invocations, counted {invocations}"
            )));
        }
        let timing = BenchRun {
            elapsed,
            cpu,
            messages: 0,
            invocations,
        };
        Ok((r, timing))
    }
}
