//! The command line, as clap sees it. Help text here is the user's reference.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "heddle",
    version,
    about = "Run node graphs whose nodes are WebAssembly components",
    after_help = "Exit codes: 0 completed, 1 failed, 2 invalid graph or usage, 3 cancelled, 4 suspended (paused), 5 unusable run store, 6 a watchdog limit ended the run, 7 run locked by another watchdog, 8 teardown incomplete, 9 stored run damaged."
)]
pub struct Cli {
    /// Show error causes in full, with a backtrace.
    #[arg(long, short, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Where node types come from; shared by every command that needs a registry.
#[derive(Debug, Args, Clone, Default)]
pub struct EnvArgs {
    /// Configuration file (default: ./heddle.toml when it exists).
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// Directory of installed node packages (overrides the config file).
    #[arg(long, value_name = "DIR", global = true)]
    pub packages: Option<PathBuf>,
    /// The run store: a file path, or `postgres://USER@HOST:PORT/DB` for a database
    /// several hosts share (over HEDDLE_STORE_URL, `[store] url` and `[store] path`).
    #[arg(long, value_name = "PATH|URL", global = true)]
    pub store: Option<String>,
    /// How log lines on stderr are written: `human` (one line of text each, the
    /// default) or `json` (one JSON object per line: `timestamp`, `level`, `target`,
    /// `message`, and `run_id` and `node_id` where known), for a log shipper. Default:
    /// `[telemetry] log_format`, else `human`.
    #[arg(long, value_name = "FORMAT", global = true)]
    pub log_format: Option<heddle_runtime::telemetry::LogFormat>,
}

impl EnvArgs {
    /// What these flags set over the configuration file.
    pub fn overrides(&self) -> heddle_runtime::Overrides {
        heddle_runtime::Overrides {
            config: self.config.clone(),
            packages: self.packages.clone(),
            store: self.store.clone(),
            log_format: self.log_format,
            ..Default::default()
        }
    }

    /// The settings these flags and the configuration file resolve to.
    pub fn settings(&self) -> Result<heddle_runtime::Settings, heddle_runtime::ConfigError> {
        heddle_runtime::Settings::load(&self.overrides())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a graph and print its outputs.
    Run(RunArgs),
    /// Check a graph without running it; reports every problem at once.
    Validate(ValidateArgs),
    /// List every available node type with its ports.
    Nodes(NodesArgs),
    /// Measure scheduler throughput on synthetic graphs.
    Bench(BenchArgs),
    /// Install, list, verify and remove WASM node packages.
    Package(PackageArgs),
    /// Build the code runners' container images (needs Docker; idempotent).
    Images(ImagesArgs),
    /// List, inspect, resume and cancel durable runs (`heddle run --durable`).
    Runs(RunsArgs),
    /// Runs or recovers one durable run for a watchdog (`heddle run --watchdog`), which
    /// starts it; not for direct use.
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Own the run store as a long-lived host with an HTTP API (runs, event streams);
    /// adopts the runs a previous owner left running.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback unless told otherwise; port 0 picks a free one,
    /// printed at start).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Runs executing at once (1 to 64); more wait for a free worker.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// How long shutdown waits for running work to stop, in milliseconds (at least 1).
    #[arg(long, value_name = "MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub shutdown_timeout_ms: u64,
    /// Who decides a failed node invocation of a run created without a `supervise` of
    /// its own: `none` (it fails) or `interactive` (a person, through the API). Default:
    /// `[serve] supervise`, else `none`.
    #[arg(long, value_name = "HANDLE")]
    pub supervise: Option<Supervise>,
    /// How long an interactive escalation waits for a person, in milliseconds; then the
    /// invocation fails (at least 1). Default: `[serve] decision_timeout_ms`, else 10
    /// minutes.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub decision_timeout_ms: Option<u64>,
    /// Length of the store's owner lease, in milliseconds (renewed every third of it):
    /// how long a crashed server keeps another from taking the store, or on a shared
    /// database its runs (1000 to 600000). Default: `[serve] lease_ttl_ms`, else 10000.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1000..=600_000))]
    pub lease_ttl_ms: Option<u64>,
    /// This server's id among the hosts of a shared database (what leases and
    /// `GET /api/hosts` name; a live host with the same id refuses the start).
    /// Default: `[serve] host_id`, else MACHINE-PID-RANDOM.
    #[arg(long, value_name = "ID")]
    pub host_id: Option<String>,
    /// Also answer `GET /metrics` (Prometheus's text format) on this address, WITHOUT
    /// the API token: for a scraper on a private network. Without it the metrics are
    /// on the API's address, behind the token like the rest of the API.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub env: EnvArgs,
}

/// The supervisor handle of a run the server drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Supervise {
    /// Failures fail, as in an unsupervised `heddle run`.
    #[default]
    None,
    /// Each failure waits for a person's verdict through the API.
    Interactive,
}

impl From<Supervise> for heddle_runtime::Supervise {
    fn from(s: Supervise) -> heddle_runtime::Supervise {
        match s {
            Supervise::None => heddle_runtime::Supervise::None,
            Supervise::Interactive => heddle_runtime::Supervise::Interactive,
        }
    }
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The stored run to run or recover.
    pub run: String,
    /// The pause event this worker reopens (the watchdog's resume).
    #[arg(long, value_name = "EVENT")]
    pub pause: Option<u64>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub env: EnvArgs,
}

/// A watched run (`--watchdog`): this process records the run and runs it in a worker
/// process it restarts after a crash, within these limits. Each is checked before
/// anything starts; defaults in the README.
#[derive(Debug, Args, Clone, Default)]
pub struct WatchdogArgs {
    /// Watch the run: a worker process runs it, and a replacement recovers it from
    /// the run store when the worker dies (implies --durable).
    #[arg(long)]
    pub watchdog: bool,
    /// Replacement workers allowed after crashes (default 3).
    #[arg(long, value_name = "N", requires = "watchdog", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_restarts: Option<u32>,
    /// Wait before the first replacement, in milliseconds; doubles per restart (default 100).
    #[arg(long, value_name = "MS", requires = "watchdog", allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub backoff_initial_ms: Option<u64>,
    /// Longest wait between replacements, in milliseconds (default 5000).
    #[arg(long, value_name = "MS", requires = "watchdog", allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub backoff_max_ms: Option<u64>,
    /// Pass the environment variable NAME to the worker (repeatable). The worker gets
    /// only PATH, HOME, TMPDIR, TMP, TEMP and these; their values are never stored.
    #[arg(long = "env", value_name = "NAME", requires = "watchdog")]
    pub env_vars: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Every recorded run with its state (from its event log).
    List {
        #[arg(long)]
        json: bool,
    },
    /// One run: state, open pause, and what each occurrence recorded. Readable while the
    /// run is live.
    Show {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Continue a paused or interrupted run with its stored graph, inputs and package
    /// digests. Completed work is never repeated. A reconcile pause (work that started
    /// and whose result was never recorded) takes one of three answers: `--pause N`
    /// alone offers the uncertain work again; with `--completed-with OUTPUTS.json` it is
    /// recorded as completed with those outputs, or with `--skip` as skipped (reason
    /// `reconciled`), and not run. An answer is recorded with `--by` and `--note`, and
    /// every later recovery carries it out.
    #[command(group(clap::ArgGroup::new("answer").args(["completed_with", "skip"]).requires_all(["pause", "note"])))]
    Resume {
        run: String,
        /// The pause event to reopen (as `runs show` prints it); refused if the run
        /// holds a different one.
        #[arg(long, value_name = "EVENT")]
        pause: Option<u64>,
        /// Answer the reconcile pause: its work completed, and OUTPUTS.json (a JSON
        /// object, output handle to value) holds its outputs, checked against the
        /// node's declared outputs and types. The node is not run.
        #[arg(long, value_name = "OUTPUTS.json", conflicts_with = "watchdog")]
        completed_with: Option<PathBuf>,
        /// Answer the reconcile pause: skip its work (reason `reconciled`); what it
        /// feeds is skipped as after any skip. The node is not run.
        #[arg(long, conflicts_with = "watchdog")]
        skip: bool,
        /// Why (what tells you the work did or did not happen), recorded with the
        /// answer. Required with --completed-with or --skip.
        #[arg(long, requires = "answer")]
        note: Option<String>,
        /// Who answers, recorded with the answer (default: the login name, $USER).
        #[arg(long, value_name = "NAME", requires = "answer")]
        by: Option<String>,
        /// Print the JSON report instead of progress and outputs.
        #[arg(long)]
        json: bool,
        /// Watch the resumed run (`--watchdog`, `--env NAME`; the limits are the
        /// stored run's).
        #[command(flatten)]
        watchdog: WatchdogArgs,
    },
    /// Approve the gate a paused run waits at, and run on from it: the gate passes its
    /// value downstream.
    Approve {
        run: String,
        /// The gate node's id.
        gate: String,
        /// The reviewer's note, kept in the run's log.
        #[arg(long)]
        note: Option<String>,
        /// Print the JSON report instead of progress and outputs.
        #[arg(long)]
        json: bool,
    },
    /// Reject the gate a paused run waits at: the run is cancelled with the gate's title
    /// and the note as its reason, and nothing below the gate runs.
    Reject {
        run: String,
        /// The gate node's id.
        gate: String,
        /// Why it was rejected (required: a rejection is a decision someone reads).
        #[arg(long)]
        note: String,
    },
    /// Cancel a run that is not finished; it can no longer be resumed.
    Cancel { run: String },
    /// A watched run's progress, from any process, without taking it over: phase,
    /// worker, restarts, time used and left, active work, usage, cleanup, lock.
    Status {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Release the process lock a dead watchdog left on RUN (refused while its process
    /// runs).
    Unlock { run: String },
}

#[derive(Debug, Args)]
pub struct PackageArgs {
    #[command(subcommand)]
    pub command: PackageCommand,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Install a package and pin its digests: a built package directory (manifest +
    /// component), a registry reference `oci://REGISTRY/NAMESPACE/NAME:VERSION` (or
    /// `@sha256:DIGEST`), or wkg's `namespace:name@version`.
    Add {
        /// Directory holding heddle-package.toml and the component, or a reference.
        source: String,
        #[arg(long)]
        json: bool,
        /// Take the moving tag `latest` (or a wkg package's newest version).
        #[arg(long)]
        allow_latest: bool,
        /// Accept an update that asks for more capabilities than the installed version.
        #[arg(long)]
        yes: bool,
    },
    /// Build a package source folder (Rust, Python, JavaScript or C) into DIR/dist.
    Build {
        /// The source folder: heddle-package.toml and the sources.
        dir: PathBuf,
        /// Output folder (default: DIR/dist).
        #[arg(long, value_name = "OUT")]
        out: Option<PathBuf>,
        /// Fail naming what to install instead of installing a missing toolchain.
        #[arg(long)]
        no_install: bool,
        /// Neither use nor fill the build cache (~/.cache/heddle/builds).
        #[arg(long)]
        no_cache: bool,
    },
    /// Publish a built package directory to an OCI registry in the Wasm OCI artifact
    /// layout (as `wkg oci push` writes it).
    Push {
        /// Directory holding heddle-package.toml and the component (DIR/dist of a build).
        dir: PathBuf,
        /// `oci://REGISTRY/NAMESPACE/NAME:VERSION`, or wkg's `namespace:name@version`.
        reference: String,
        /// Allow pushing to the tag `latest`.
        #[arg(long)]
        allow_latest: bool,
        /// Sign what was pushed with this private key (see `package keygen`).
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Sign a package in a registry with a private key, in cosign's layout (a manifest
    /// tagged sha256-<digest>.sig beside it); `package add` checks it against [trust].
    Sign {
        /// `oci://REGISTRY/NAMESPACE/NAME:VERSION` (or `@sha256:DIGEST`), or
        /// `namespace:name@version`.
        reference: String,
        /// The private key (PKCS#8 PEM, ECDSA P-256).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        #[arg(long)]
        allow_latest: bool,
    },
    /// Make a signing key pair: FILE (private, mode 600) and FILE.pub (for [trust.keys]).
    Keygen {
        /// Where the private key is written (never overwritten).
        file: PathBuf,
    },
    /// List installed packages with requested and granted capabilities.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every installed package against the lockfile.
    Verify,
    /// Remove an installed package.
    Remove { name: String },
}

#[derive(Debug, Args)]
pub struct ImagesArgs {
    #[command(subcommand)]
    pub command: ImagesCommand,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Build the images named in [runners.images] that Docker does not have yet.
    Build {
        /// Rebuild even when present.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The graph document (JSON).
    pub graph: PathBuf,
    /// A value for an external input: NAME=VALUE (JSON, else text) or NAME=@FILE.
    #[arg(long = "input", short = 'i', value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// Feed the streaming input NAME from standard input, one value per line (JSON, else
    /// text), until end of input.
    #[arg(long, value_name = "NAME")]
    pub stream: Option<String>,
    /// Print one machine-readable JSON report on stdout instead of progress and outputs.
    #[arg(long)]
    pub json: bool,
    /// Record the run in the run store (`[store] path`, default .heddle/runs.db) so it
    /// survives a crash or Ctrl-C and can be resumed (`heddle runs resume`); prints the
    /// run id first. `[store] durable = true` makes it the default.
    #[arg(long)]
    pub durable: bool,
    /// Durable runs: logical dispatches the run may make in all, counted across restarts
    /// and resumes (overrides [store] max_dispatches).
    #[arg(long, value_name = "N")]
    pub max_dispatches: Option<u64>,
    /// Durable runs: execution time the run may use in all, in milliseconds; frozen
    /// while paused or interrupted (overrides [store] time_limit_ms). Under --watchdog
    /// the watchdog holds the run to it too, counting the backoff between workers.
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=heddle_runtime::config::MAX_TIME_LIMIT_MS))]
    pub time_limit_ms: Option<u64>,
    /// Wall-clock limit per node invocation in milliseconds, at least 1 (overrides [run]
    /// node_timeout_ms).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(heddle_runtime::config::NODE_TIMEOUT_MS))]
    pub node_timeout_ms: Option<u64>,
    /// Supervise failures with a policy file (TOML rules: node type / signature /
    /// message pattern → verdict).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["replay", "supervise"])]
    pub policy: Option<PathBuf>,
    /// Supervise failures by replaying the decisions of a recorded run (a `--json` report).
    #[arg(long, value_name = "REPORT", conflicts_with = "supervise")]
    pub replay: Option<PathBuf>,
    /// Supervise failures with the LLM agent over an OpenAI-compatible chat-completions
    /// endpoint (HEDDLE_SUPERVISOR_ENDPOINT, HEDDLE_SUPERVISOR_API_KEY, ..., or the
    /// [supervisor] section of heddle.toml; see README).
    #[arg(long, alias = "llm")]
    pub supervise: bool,
    /// Model for `--supervise` (overrides HEDDLE_SUPERVISOR_MODEL and [supervisor] model);
    /// it must have a price.
    #[arg(long, value_name = "MODEL", requires = "supervise")]
    pub supervisor_model: Option<String>,
    /// Spending ceiling for `--supervise` in USD for the whole run (default 0.50).
    #[arg(long, value_name = "USD", requires = "supervise")]
    pub supervisor_cost_cap: Option<f64>,
    /// Supervisor bound: decisions per run (default 10).
    #[arg(long, value_name = "N")]
    pub max_decisions: Option<u32>,
    /// Supervisor bound: retries per node invocation (default 2).
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    #[command(flatten)]
    pub watchdog: WatchdogArgs,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The graph document (JSON).
    pub graph: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Args)]
pub struct NodesArgs {
    /// Print the declarations as JSON.
    #[arg(long)]
    pub json: bool,
    /// Only node types whose name starts with this prefix (e.g. `std.text`).
    #[arg(value_name = "PREFIX")]
    pub prefix: Option<String>,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shape {
    Chain,
    /// The chain with the condition `value > 0` on every edge.
    ChainWhen,
    Fanout,
    Wide,
    /// A chain of `std` WASM nodes (warm instances).
    WasmChain,
    /// A fan-out whose per-item nodes are `std` WASM nodes.
    WasmFanout,
    /// A chain of `files.write_text` nodes (not retry-safe: each appends to a file in a
    /// scratch directory); with `--durable`, what a synced start per invocation costs.
    EffectChain,
    /// A fan-out of `files.write_text` invocations (not retry-safe: each appends an item
    /// to one file): one node's independent invocations, whose starts a durable run
    /// writes ahead.
    EffectFanout,
    /// A chain of the Python SDK example's division node (`textstats.ratio`), a fresh
    /// instance per invocation. The guest shapes build the SDK examples from the source
    /// tree this heddle was built from (toolchains installed on first use, builds cached).
    PyChain,
    /// The same with the JavaScript SDK example's (`jsonkit.ratio`).
    JsChain,
    /// The same with the C SDK example's (`cstrings.ratio`).
    CChain,
    /// The same with the Rust twin (`std.math.arith`, `op = "div"`).
    RustChain,
    /// `py-chain` with warm instances (the node declares `reuse_instance`).
    PyChainWarm,
    /// `js-chain` with warm instances.
    JsChainWarm,
    /// `c-chain` with warm instances.
    CChainWarm,
    /// `rust-chain` with warm instances.
    RustChainWarm,
    /// Every guest shape, fresh then warm.
    Guests,
    /// Small durable runs (a 3-node WASM graph) created through a real server's HTTP API
    /// (`POST /api/runs` on loopback, the store on disk) by `--clients` clients: runs
    /// completed per second, create latency, store commits per run. `--size` is the runs
    /// per round (default 1000), `--runs` the rounds.
    ApiRuns,
    /// Every shape above but the effect shapes and api-runs (whose figures are mostly the
    /// disk's) and the guest shapes (which build packages).
    All,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which graph shape to measure.
    #[arg(long, value_enum, default_value_t = Shape::All)]
    pub shape: Shape,
    /// Size of the shape: chain length (default 100; wasm-chain, effect-chain and the
    /// guest chains 10),
    /// fan-out items (default 10000) or width (default 1000).
    #[arg(long, value_name = "N")]
    pub size: Option<usize>,
    /// Values pushed through the chain (chain shapes only; default 10000, effect-chain
    /// and the guest chains 100).
    #[arg(long, value_name = "M")]
    pub messages: Option<usize>,
    /// Measured runs per shape (after one warm-up run); the median is reported.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub runs: usize,
    /// Make each run durable (a run store in a temporary directory; every invocation is
    /// written ahead); the time includes making the last record durable.
    #[arg(long)]
    pub durable: bool,
    /// With --durable: measure on this PostgreSQL database (`postgres://…`) instead of a
    /// scratch SQLite file; the bench's runs are left in it.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Runtime worker threads (default: one per core); 1 runs everything on a
    /// current-thread runtime. Compare invocations per CPU-second across values to see
    /// how the scheduler scales.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Cap how many invocations of one `files` node run at once in the effect shapes (the
    /// operator's `[packages.files] concurrency`); 1 runs them one at a time, as a node
    /// that declares nothing runs. Default: as the package declares (128).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=128))]
    pub concurrency: Option<u32>,
    /// Count every run in metrics as `heddle serve` does for all its runs (every
    /// invocation reported and counted): what the server's always-on metrics cost.
    #[arg(long)]
    pub metrics: bool,
    /// api-runs: clients creating runs at once, each waiting for its answer before its
    /// next request.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub clients: u16,
    /// api-runs: runs the server executes at once (`heddle serve --workers`).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}
