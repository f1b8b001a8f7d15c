//! `heddle bench`: scheduler throughput measured by [`heddle_runtime::bench`] on the same
//! graph shapes as the criterion benches, so figures from either compare; printed as a
//! line per shape or as JSON.

use heddle_kernel::bench::Shape;
use heddle_runtime::bench::{BUILD, Bench, BenchOptions, BenchShape};
use heddle_wasm::bench::{Guest, GuestShape, WasmShape};

use crate::cli::{BenchArgs, Shape as ShapeArg};
use crate::exit::Exit;

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
    if args.shape == ShapeArg::ApiRuns {
        return api_runs(&args);
    }
    let shapes: Vec<BenchShape> = match args.shape {
        ShapeArg::Chain => vec![BenchShape::Native(Shape::Chain)],
        ShapeArg::ChainWhen => vec![BenchShape::Native(Shape::ChainWhen)],
        ShapeArg::Fanout => vec![BenchShape::Native(Shape::Fanout)],
        ShapeArg::Wide => vec![BenchShape::Native(Shape::Wide)],
        ShapeArg::WasmChain => vec![BenchShape::Wasm(WasmShape::Chain)],
        ShapeArg::WasmFanout => vec![BenchShape::Wasm(WasmShape::Fanout)],
        ShapeArg::EffectChain => vec![BenchShape::EffectChain],
        ShapeArg::EffectFanout => vec![BenchShape::EffectFanout],
        ShapeArg::PyChain => guest(Guest::Python, true),
        ShapeArg::JsChain => guest(Guest::JavaScript, true),
        ShapeArg::CChain => guest(Guest::C, true),
        ShapeArg::RustChain => guest(Guest::Rust, true),
        ShapeArg::PyChainWarm => guest(Guest::Python, false),
        ShapeArg::JsChainWarm => guest(Guest::JavaScript, false),
        ShapeArg::CChainWarm => guest(Guest::C, false),
        ShapeArg::RustChainWarm => guest(Guest::Rust, false),
        ShapeArg::Guests => GuestShape::all()
            .into_iter()
            .map(BenchShape::Guest)
            .collect(),
        ShapeArg::All => BenchShape::all(),
        ShapeArg::ApiRuns => unreachable!("measured above"),
    };
    let guests = build_guests(&shapes, args.json)?;
    // Durable runs on a database (`--store postgres://…`, where the bench's runs are
    // left) instead of a scratch SQLite file.
    let store = match (&args.store, args.durable) {
        (Some(url), true) => {
            let loc = heddle_store::StoreLocation::parse(url);
            if !matches!(loc, heddle_store::StoreLocation::Postgres(_)) {
                return Err(crate::usage!(
                    "--store {url}: give a postgres:// URL (without it, --durable measures on a scratch SQLite file)"
                ));
            }
            Some(heddle_store::open(&loc)?.runs())
        }
        (Some(_), false) => {
            return Err(crate::usage!(
                "--store measures durable runs: add --durable"
            ));
        }
        (None, _) => None,
    };
    let rt = heddle_runtime::tokio_runtime(args.threads)?;
    let mut bench = Bench::with_guests(&rt, &shapes, args.concurrency, &guests)?;
    if let Some(store) = store {
        bench.durable_on(store);
    }
    // With an OTLP endpoint in the environment every run is traced, and timed so; with
    // --metrics every run is counted as `heddle serve` counts its runs.
    let telemetry = heddle_runtime::telemetry::TelemetrySettings::from_env()?;
    let mut exporter = None;
    if let Some(t) = heddle_runtime::telemetry::KernelTracer::new(&telemetry, "bench", args.metrics)
    {
        if let (false, Some(to)) = (args.json, &telemetry.traces) {
            println!("traced: spans go to {}", to.endpoint);
        }
        if !args.json && args.metrics {
            println!("metrics: every run counted, as heddle serve counts them");
        }
        exporter = t.exporter();
        heddle_kernel::bench::observe(Box::new(t));
    }
    if BUILD == "debug" {
        eprintln!(
            "warning: this heddle is a debug build; its figures are many times slower than a release build's (`cargo run --release -- bench`)"
        );
    }
    if !args.json {
        println!("{}", heddle_runtime::bench::threads_line(bench.threads()));
    }
    let opts = BenchOptions {
        size: args.size,
        messages: args.messages,
        runs: args.runs,
        durable: args.durable,
    };
    let mut all = Vec::new();
    for shape in shapes {
        let figures = bench.measure(&rt, shape, &opts)?;
        if !args.json {
            print!("{}", figures.text());
        }
        all.push(figures);
    }
    // The last runs' spans, still queued, go before the process ends (untimed).
    // What the exporter took and dropped (a queue that overflows drops, never waits):
    // traced figures are only comparable alongside it.
    if let Some(e) = exporter {
        e.shutdown();
        eprintln!(
            "traced: {} spans sent to {}, {} dropped",
            e.sent(),
            e.endpoint(),
            e.dropped()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    drop(bench);
    for (_, dir) in &guests {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(Exit::Ok)
}

fn guest(guest: Guest, fresh: bool) -> Vec<BenchShape> {
    vec![BenchShape::Guest(GuestShape { guest, fresh })]
}

/// Builds the SDK examples the guest shapes run, from the source tree this binary was
/// built from (the build cache makes a second time instant; a missing toolchain is
/// installed as `heddle package build` installs it).
fn build_guests(
    shapes: &[BenchShape],
    quiet: bool,
) -> anyhow::Result<Vec<(Guest, std::path::PathBuf)>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out: Vec<(Guest, std::path::PathBuf)> = Vec::new();
    for s in shapes {
        let BenchShape::Guest(g) = s else { continue };
        let Some(example) = g.guest.example() else {
            continue;
        };
        if out.iter().any(|(w, _)| *w == g.guest) {
            continue;
        }
        let src = root.join(example);
        if !src.is_dir() {
            anyhow::bail!(
                "{}: the {} shape builds {example} from the source tree heddle was built from, and {} is gone",
                g.name(),
                g.guest.package(),
                src.display()
            );
        }
        let opts = heddle_package_build::BuildOptions {
            out_dir: Some(std::env::temp_dir().join(format!(
                "heddle-bench-guests-{}/{}",
                std::process::id(),
                g.guest.package()
            ))),
            progress: if quiet {
                None
            } else {
                Some(|m: &str| eprintln!("{m}"))
            },
            ..Default::default()
        };
        let built = heddle_package_build::build_package(&src, &opts)?;
        out.push((g.guest, built.dir));
    }
    Ok(out)
}

/// `--shape api-runs`: runs per second through a server ([`heddle_server::bench`]).
fn api_runs(args: &BenchArgs) -> anyhow::Result<Exit> {
    if let Some(url) = &args.store
        && !matches!(
            heddle_store::StoreLocation::parse(url),
            heddle_store::StoreLocation::Postgres(_)
        )
    {
        return Err(crate::usage!(
            "--store {url}: give a postgres:// URL (without it, api-runs keeps its runs in a scratch SQLite file)"
        ));
    }
    let opts = heddle_server::bench::ApiOptions {
        clients: args.clients as usize,
        runs: args.size.unwrap_or(1000),
        rounds: args.runs,
        workers: args.workers as usize,
        threads: args.threads,
        store: args.store.clone(),
    };
    if BUILD == "debug" {
        eprintln!(
            "warning: this heddle is a debug build; its figures are many times slower than a release build's (`cargo run --release -- bench`)"
        );
    }
    let f = heddle_server::bench::measure(&opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&[&f])?);
        return Ok(Exit::Ok);
    }
    print!("{}", f.text());
    Ok(Exit::Ok)
}
