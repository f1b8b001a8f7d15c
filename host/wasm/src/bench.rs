//! The WASM benchmark graphs, shared by `heddle bench` and the criterion bench
//! (`benches/wasm.rs`), so both measure the same thing: what users run is WASM nodes, and
//! a figure for native pass-through nodes alone says little about that.
//!
//! - `wasm-chain`: a streaming input → N `std.math.arith` nodes (each adds 1) → an
//!   output; every pushed message makes N WASM invocations.
//! - `wasm-fanout`: an input list of N items → `heddle.foreach` → 3 `std.math.arith`
//!   nodes per item → `heddle.collect` → an output (3·N per-item WASM invocations).
//!
//! - `effect-chain`: a streaming input → N `files.write_text` nodes → an output. The node
//!   is not retry-safe (it appends to a file), so a durable run writes each start ahead,
//!   synced, before its code runs: the shape measures what that costs. Its effects land
//!   in a directory the bench grants and are counted there after every run.
//! - `effect-fanout`: a list of N items → `heddle.foreach` → one `files.write_text` node
//!   appending each item to one file → `heddle.collect` → an output: N independent
//!   invocations of one node that is not retry-safe, each of whose starts a durable run
//!   writes ahead; the file must hold every item exactly once.
//!
//! `std.math.arith` declares `reuse-instance`, so these measure warm instances, the
//! common case for the first-party nodes. The native shapes (`heddle_kernel::bench`)
//! run on the same scheduler; the difference between the two is the WASM cost.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use heddle_core::{GraphBuilder, GraphDoc, INPUT_TYPE, OUTPUT_TYPE, Value};
use heddle_kernel::bench::{BenchError, BenchRun, TimedRun};
use heddle_kernel::{Journal, Registry};

/// The WASM node every shape invokes: a pure, reuse-safe `std` node.
pub const NODE_TYPE: &str = "std.math.arith";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WasmShape {
    Chain,
    Fanout,
}

impl WasmShape {
    pub const ALL: [WasmShape; 2] = [WasmShape::Chain, WasmShape::Fanout];

    pub fn name(self) -> &'static str {
        match self {
            WasmShape::Chain => "wasm-chain",
            WasmShape::Fanout => "wasm-fanout",
        }
    }

    /// A size that takes a fraction of a second: a WASM invocation costs microseconds
    /// where a native one costs a fraction of one.
    pub fn default_size(self) -> usize {
        match self {
            WasmShape::Chain => 10,
            WasmShape::Fanout => 10_000,
        }
    }
}

/// A WASM node that adds 1 to what arrives on `a`.
fn add_one(g: GraphBuilder, id: &str) -> GraphBuilder {
    g.node(id, NODE_TYPE).prop("b", 1i64).prop("op", "add")
}

/// `in` (streaming input named `in`) → `w0` … `w{n-1}` (each adds 1) → `out`.
pub fn chain(n: usize) -> GraphDoc {
    let mut g = GraphBuilder::new()
        .named(format!("wasm-chain-{n}"))
        .node("in", INPUT_TYPE)
        .prop("name", "in")
        .prop("streaming", true);
    let mut prev = ("in".to_string(), "value");
    for i in 0..n {
        let id = format!("w{i}");
        g = add_one(g, &id).edge(&prev.0, prev.1, &id, "a");
        prev = (id, "result");
    }
    g.node("out", OUTPUT_TYPE)
        .prop("name", "out")
        .edge(&prev.0, prev.1, "out", "value")
        .build()
}

/// `items` (list of n ints) → `each` → `a` → `b` → `c` (each adds 1) → `gather` → `out`.
pub fn fanout(n: usize) -> GraphDoc {
    let items = Value::list((0..n as i64).map(Value::Int).collect());
    let g = GraphBuilder::new()
        .named(format!("wasm-fanout-{n}"))
        .node("items", INPUT_TYPE)
        .prop("name", "items")
        .prop("value", items)
        .node("each", "heddle.foreach");
    let g = add_one(add_one(add_one(g, "a"), "b"), "c");
    g.node("gather", "heddle.collect")
        .node("out", OUTPUT_TYPE)
        .prop("name", "out")
        .edge("items", "value", "each", "list")
        .edge("each", "item", "a", "a")
        .edge("a", "result", "b", "a")
        .edge("b", "result", "c", "a")
        .edge("c", "result", "gather", "item")
        .edge("gather", "list", "out", "value")
        .build()
}

pub fn graph(shape: WasmShape, n: usize) -> GraphDoc {
    match shape {
        WasmShape::Chain => chain(n),
        WasmShape::Fanout => fanout(n),
    }
}

/// Plans and runs one shape on the current tokio runtime and checks every value that
/// comes out (each is its input plus the number of nodes it went through), so a run
/// that drops or mangles values cannot pass for a fast one. `registry` must offer the
/// first-party `std` package. `messages` is the number of values pushed through the
/// chain (ignored for the fan-out). Timing covers the run from start to result.
/// `journal`, when given, makes the run durable (every invocation written ahead).
pub async fn run_shape(
    registry: &Registry,
    shape: WasmShape,
    n: usize,
    messages: usize,
    journal: Option<Arc<dyn Journal>>,
) -> Result<BenchRun, BenchError> {
    let timed = TimedRun::start(graph(shape, n), registry, journal)?;
    let h = &timed.handle;
    let (msgs, expect, hops) = match shape {
        WasmShape::Chain => {
            for i in 0..messages {
                h.push_input("in", Value::Int(i as i64)).await?;
            }
            h.finish_input("in").await?;
            (messages, n * messages, n as i64)
        }
        WasmShape::Fanout => (n, 3 * n, 3),
    };
    let (r, timing) = timed.finish(NODE_TYPE, expect as u64).await?;
    let out = r.outputs.get("out").map(Vec::as_slice).unwrap_or_default();
    let values: Vec<&Value> = match shape {
        WasmShape::Chain => out.iter().collect(),
        WasmShape::Fanout => match out {
            [one] => one
                .as_list()
                .map(|l| l.iter().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        },
    };
    if values.len() != msgs {
        return Err(BenchError::Output(format!(
            "expected {msgs} values out, got {}",
            values.len()
        )));
    }
    // Concurrent per-item runs may reorder a chain's stream; the fan-out's collect
    // keeps item order. Compare as a sorted multiset either way.
    let mut got: Vec<Option<i64>> = values.iter().map(|v| v.as_i64()).collect();
    got.sort_unstable();
    let want: Vec<Option<i64>> = (0..msgs as i64).map(|i| Some(i + hops)).collect();
    if got != want {
        return Err(BenchError::Output(format!(
            "values out are not the inputs plus {hops}: first few {:?}",
            &got[..got.len().min(5)]
        )));
    }
    Ok(BenchRun {
        messages: msgs as u64,
        ..timing
    })
}

/// The effect chain's node: not retry-safe, its effect (an append to a granted file) is
/// harmless and countable.
pub const EFFECT_NODE_TYPE: &str = "files.write_text";

/// Where the effect chain's nodes see the directory [`effect_grant`] grants.
const EFFECT_GUEST_DIR: &str = "/data";

/// The file node `i` of the effect chain appends to, as the guest names it.
fn effect_file(i: usize) -> String {
    format!("{EFFECT_GUEST_DIR}/e{i}.txt")
}

/// `in` (streaming input named `in`) → `e0` … `e{n-1}` → `out`. `e0` appends each message
/// to `/data/e0.txt`; every later node appends the path its predecessor wrote (what
/// `files.write_text` outputs) to its own file, so each message makes n appends.
pub fn effect_chain(n: usize) -> GraphDoc {
    let mut g = GraphBuilder::new()
        .named(format!("effect-chain-{n}"))
        .node("in", INPUT_TYPE)
        .prop("name", "in")
        .prop("streaming", true);
    let mut prev = ("in".to_string(), "value");
    for i in 0..n {
        let id = format!("e{i}");
        g = g
            .node(&id, EFFECT_NODE_TYPE)
            .prop("path", effect_file(i))
            .prop("append", true)
            .edge(&prev.0, prev.1, &id, "text");
        prev = (id, "path");
    }
    g.node("out", OUTPUT_TYPE)
        .prop("name", "out")
        .edge(&prev.0, prev.1, "out", "value")
        .build()
}

/// The `files` grant the effect chain needs: `dir` read-write, seen as `/data`.
pub fn effect_grant(dir: &Path) -> crate::PackageGrant {
    crate::PackageGrant {
        dirs: vec![crate::DirGrant {
            host: dir.to_path_buf(),
            guest: EFFECT_GUEST_DIR.into(),
            mode: crate::DirMode::Rw,
        }],
        ..Default::default()
    }
}

/// The file the effect fan-out appends every item to, as the guest names it and in the
/// granted directory.
const FANOUT_FILE: &str = "fanout.txt";

/// The line the effect fan-out appends for item `i`.
fn fanout_line(i: usize) -> String {
    format!("item {i}\n")
}

/// `items` (n lines) → `each` → `w` (appends each to `/data/fanout.txt`) → `all` → `out`.
pub fn effect_fanout(n: usize) -> GraphDoc {
    let items = Value::list((0..n).map(|i| Value::str(fanout_line(i))).collect());
    GraphBuilder::new()
        .named(format!("effect-fanout-{n}"))
        .node("items", INPUT_TYPE)
        .prop("name", "items")
        .prop("value", items)
        .node("each", "heddle.foreach")
        .node("w", EFFECT_NODE_TYPE)
        .prop("path", format!("{EFFECT_GUEST_DIR}/{FANOUT_FILE}"))
        .prop("append", true)
        .node("all", "heddle.collect")
        .node("out", OUTPUT_TYPE)
        .prop("name", "out")
        .edge("items", "value", "each", "list")
        .edge("each", "item", "w", "text")
        .edge("w", "bytes", "all", "item")
        .edge("all", "list", "out", "value")
        .build()
}

/// Runs the effect fan-out of `n` items, its file in `dir` (as for [`run_effect_chain`]),
/// and counts the effects there: the file must hold every item's line exactly once (in
/// any order: invocations that run at the same time append in the order they finish).
pub async fn run_effect_fanout(
    registry: &Registry,
    n: usize,
    dir: &Path,
    journal: Option<Arc<dyn Journal>>,
) -> Result<BenchRun, BenchError> {
    let file = dir.join(FANOUT_FILE);
    let io = |source| BenchError::Io {
        path: file.clone(),
        source,
    };
    match std::fs::remove_file(&file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
        _ => {}
    }
    let timed = TimedRun::start(effect_fanout(n), registry, journal)?;
    let (r, timing) = timed.finish(EFFECT_NODE_TYPE, n as u64).await?;
    let collected = match r.outputs.get("out").map(Vec::as_slice) {
        Some([one]) => one.as_list().map_or(0, |l| l.len()),
        _ => 0,
    };
    if collected != n {
        return Err(BenchError::Output(format!(
            "expected {n} byte counts collected, got {collected}"
        )));
    }
    let text = std::fs::read_to_string(&file).map_err(io)?;
    let mut got: Vec<&str> = text.split_inclusive('\n').collect();
    got.sort_unstable();
    let mut want: Vec<String> = (0..n).map(fanout_line).collect();
    want.sort_unstable();
    if got != want {
        return Err(BenchError::Output(format!(
            "{} holds {} lines, expected each of the {n} items once: an effect was lost or repeated",
            file.display(),
            got.len()
        )));
    }
    Ok(BenchRun {
        messages: n as u64,
        ..timing
    })
}

/// The message the effect chain's input gets `i`-th.
fn effect_message(i: usize) -> String {
    format!("{i}\n")
}

/// Runs the effect chain of `n` nodes with `messages` values pushed through, its files in
/// `dir` (the directory `registry`'s `files` package was granted as [`effect_grant`]),
/// and counts the effects there: every node's file must hold exactly one append per
/// message, so a run that skips or repeats an effect cannot pass. `journal` as for
/// [`run_shape`].
pub async fn run_effect_chain(
    registry: &Registry,
    n: usize,
    messages: usize,
    dir: &Path,
    journal: Option<Arc<dyn Journal>>,
) -> Result<BenchRun, BenchError> {
    let host_file = |i: usize| dir.join(format!("e{i}.txt"));
    let io = |path: PathBuf| move |source| BenchError::Io { path, source };
    // Every run starts from empty files: the nodes append.
    for i in 0..n {
        match std::fs::remove_file(host_file(i)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io(host_file(i))(e));
            }
            _ => {}
        }
    }
    let timed = TimedRun::start(effect_chain(n), registry, journal)?;
    let h = &timed.handle;
    for i in 0..messages {
        h.push_input("in", Value::str(effect_message(i))).await?;
    }
    h.finish_input("in").await?;
    let (r, timing) = timed
        .finish(EFFECT_NODE_TYPE, (n * messages) as u64)
        .await?;
    let got = r.outputs.get("out").map(Vec::len).unwrap_or(0);
    if got != messages {
        return Err(BenchError::Output(format!(
            "expected {messages} values out, got {got}"
        )));
    }
    for i in 0..n {
        let want: usize = match i {
            0 => (0..messages).map(|m| effect_message(m).len()).sum(),
            _ => messages * effect_file(i - 1).len(),
        };
        let len = std::fs::metadata(host_file(i))
            .map_err(io(host_file(i)))?
            .len();
        if len != want as u64 {
            return Err(BenchError::Output(format!(
                "{} holds {len} bytes, expected {want}: an effect was lost or repeated",
                host_file(i).display()
            )));
        }
    }
    Ok(BenchRun {
        messages: messages as u64,
        ..timing
    })
}

/// A guest language measured on the same two-input division node: the SDK examples'
/// `ratio` node (Python `textstats`, JavaScript `jsonkit`, C `cstrings`) and its Rust
/// twin, `std.math.arith` with `op = "div"`. Every one declares `reuse-instance` (the
/// node is pure), so the shape measures warm instances unless the package's grant sets
/// `fresh_instances` ([`GuestShape::fresh`]), which is what every node that does not
/// declare reuse gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guest {
    Rust,
    Python,
    JavaScript,
    C,
}

impl Guest {
    pub const ALL: [Guest; 4] = [Guest::Rust, Guest::Python, Guest::JavaScript, Guest::C];

    /// The division node's type.
    pub fn node_type(self) -> &'static str {
        match self {
            Guest::Rust => NODE_TYPE,
            Guest::Python => "textstats.ratio",
            Guest::JavaScript => "jsonkit.ratio",
            Guest::C => "cstrings.ratio",
        }
    }

    /// The package the node is in (the Rust twin's is the first-party `std`).
    pub fn package(self) -> &'static str {
        match self {
            Guest::Rust => "std",
            Guest::Python => "textstats",
            Guest::JavaScript => "jsonkit",
            Guest::C => "cstrings",
        }
    }

    /// The SDK example holding the node, relative to the source tree (none for Rust:
    /// `std` is built into the host).
    pub fn example(self) -> Option<&'static str> {
        match self {
            Guest::Rust => None,
            Guest::Python => Some("sdk/python/examples/textstats"),
            Guest::JavaScript => Some("sdk/js/examples/jsonkit"),
            Guest::C => Some("sdk/c/examples/cstrings"),
        }
    }

    /// The second input of the division: what `b` is set to (a property).
    fn divisor_props(self, g: GraphBuilder, id: &str) -> GraphBuilder {
        let g = g.node(id, self.node_type()).prop("b", 1.0);
        match self {
            Guest::Rust => g.prop("op", "div"),
            _ => g,
        }
    }

    /// The output the node's result leaves on.
    fn output(self) -> &'static str {
        match self {
            Guest::Rust => "result",
            _ => "ratio",
        }
    }
}

/// A chain of one guest's division nodes, each instance fresh or warm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestShape {
    pub guest: Guest,
    /// A fresh instance per invocation (the package granted `fresh_instances`), the
    /// default of a node that does not declare reuse; else warm, as the node declares.
    pub fresh: bool,
}

impl GuestShape {
    /// Every guest, fresh then warm.
    pub fn all() -> Vec<GuestShape> {
        [true, false]
            .into_iter()
            .flat_map(|fresh| Guest::ALL.map(|guest| GuestShape { guest, fresh }))
            .collect()
    }

    pub fn name(self) -> &'static str {
        match (self.guest, self.fresh) {
            (Guest::Rust, true) => "rust-chain",
            (Guest::Python, true) => "py-chain",
            (Guest::JavaScript, true) => "js-chain",
            (Guest::C, true) => "c-chain",
            (Guest::Rust, false) => "rust-chain-warm",
            (Guest::Python, false) => "py-chain-warm",
            (Guest::JavaScript, false) => "js-chain-warm",
            (Guest::C, false) => "c-chain-warm",
        }
    }

    /// A size that takes about a second with fresh Python instances (~1–3 ms each).
    pub fn default_size(self) -> usize {
        10
    }

    /// Values pushed through the chain unless told: 10 nodes × 100 values is 1,000
    /// invocations, as the figures were taken over.
    pub fn default_messages(self) -> usize {
        100
    }
}

/// `in` (streaming input named `in`) → `g0` … `g{n-1}` (each divides by 1) → `out`.
pub fn guest_chain(guest: Guest, n: usize) -> GraphDoc {
    let mut g = GraphBuilder::new()
        .named(format!("{}-chain-{n}", guest.package()))
        .node("in", INPUT_TYPE)
        .prop("name", "in")
        .prop("streaming", true);
    let mut prev = ("in".to_string(), "value");
    for i in 0..n {
        let id = format!("g{i}");
        g = guest.divisor_props(g, &id).edge(&prev.0, prev.1, &id, "a");
        prev = (id, guest.output());
    }
    g.node("out", OUTPUT_TYPE)
        .prop("name", "out")
        .edge(&prev.0, prev.1, "out", "value")
        .build()
}

/// Runs a guest chain of `n` nodes with `messages` values (0.5, 1.5, …) pushed through,
/// and checks that every value comes out unchanged (each node divides by 1), so a run
/// that drops or mangles values cannot pass for a fast one. `registry` must offer the
/// guest's package; whether instances are fresh is its grant's doing.
pub async fn run_guest_chain(
    registry: &Registry,
    guest: Guest,
    n: usize,
    messages: usize,
    journal: Option<Arc<dyn Journal>>,
) -> Result<BenchRun, BenchError> {
    let timed = TimedRun::start(guest_chain(guest, n), registry, journal)?;
    let h = &timed.handle;
    let value = |i: usize| i as f64 + 0.5;
    for i in 0..messages {
        h.push_input("in", Value::Float(value(i))).await?;
    }
    h.finish_input("in").await?;
    let (r, timing) = timed
        .finish(guest.node_type(), (n * messages) as u64)
        .await?;
    let out = r.outputs.get("out").map(Vec::as_slice).unwrap_or_default();
    let mut got: Vec<f64> = out.iter().filter_map(Value::as_f64).collect();
    got.sort_by(f64::total_cmp);
    let want: Vec<f64> = (0..messages).map(value).collect();
    if got != want {
        return Err(BenchError::Output(format!(
            "expected the {messages} values pushed in back unchanged, got {} values (first few {:?})",
            out.len(),
            &got[..got.len().min(5)]
        )));
    }
    Ok(BenchRun {
        messages: messages as u64,
        ..timing
    })
}
