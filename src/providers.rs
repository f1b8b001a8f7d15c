//! The node registry a command works with: native built-ins, then WASM packages (the
//! first-party `std` and `files`, then the installed ones), then code nodes. The
//! registry refuses a provider that redefines a type, so a package cannot shadow a
//! built-in.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use heddle_core::graph::GraphDoc;
use heddle_core::plan::{Plan, ValidationError};
use heddle_kernel::Registry;
use heddle_runners::{CodeNodes, RunnersConfig};
use heddle_wasm::{PackageStore, WasmConfig, WasmHost, WasmProvider};
use serde::Deserialize;

use crate::cli::EnvArgs;
use crate::config::Config;

/// Default store of installed packages, relative to the working directory.
pub const DEFAULT_PACKAGES_DIR: &str = ".heddle";

/// The command line's own settings (`[cli]`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliSection {
    /// Where installed packages and their lockfile live (default `.heddle`).
    #[serde(default)]
    pub packages_dir: Option<PathBuf>,
}

/// Everything a command needs to build executors.
pub struct Env {
    pub config: Config,
    pub wasm_config: WasmConfig,
    pub runners_config: RunnersConfig,
    pub packages_dir: PathBuf,
    pub registry: Registry,
    /// sha256 of every loaded WASM package's component, by package name (a durable run
    /// records the ones it uses and refuses to resume on changed bytes).
    pub package_digests: std::collections::BTreeMap<String, String>,
}

/// Config sections of every crate, parsed once.
pub struct Settings {
    pub config: Config,
    pub wasm: WasmConfig,
    pub runners: RunnersConfig,
    pub packages_dir: PathBuf,
}

impl Settings {
    pub fn load(args: &EnvArgs) -> anyhow::Result<Settings> {
        let config = Config::load(args.config.as_deref())?;
        let wasm: WasmConfig = config.whole()?;
        let runners: RunnersConfig = config.section("runners")?.unwrap_or_default();
        let cli: CliSection = config.section("cli")?.unwrap_or_default();
        let packages_dir = match (&args.packages, cli.packages_dir) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) => config.resolve(&p),
            (None, None) => PathBuf::from(DEFAULT_PACKAGES_DIR),
        };
        Ok(Settings {
            config,
            wasm,
            runners,
            packages_dir,
        })
    }

    pub fn store(&self) -> PackageStore {
        PackageStore::open(&self.packages_dir)
    }

    /// Starts the wasmtime engine (compile cache, epoch ticker). A compile the cache
    /// cannot serve takes seconds for a large package: the user is told which.
    pub fn wasm_host(&self) -> anyhow::Result<WasmHost> {
        let host = WasmHost::new(self.wasm.wasm.clone()).context("starting the WASM engine")?;
        host.on_compile(|name| eprintln!("compiling {name} (first use)…"));
        Ok(host)
    }
}

impl Env {
    /// Loads the configuration and every provider, with the installed packages that
    /// declare one of the `wanted` node types (all of them when `None`). Async because
    /// loading a package compiles it (or reads the compile cache).
    pub async fn load(args: &EnvArgs, wanted: Option<&BTreeSet<String>>) -> anyhow::Result<Env> {
        let s = Settings::load(args)?;
        let mut registry = Registry::with_builtins();

        let wasm = WasmProvider::load_on(
            s.wasm_host()?,
            s.wasm.clone(),
            Some(&s.packages_dir),
            wanted,
        )
        .await
        .with_context(|| {
            format!(
                "loading the WASM packages (first-party and installed in {})",
                s.packages_dir.display()
            )
        })?;
        let package_digests = wasm
            .packages()
            .iter()
            .map(|p| (p.name().to_string(), p.digest.clone()))
            .collect();
        registry.add(Arc::new(wasm))?;
        registry.add(Arc::new(CodeNodes::new(s.runners.clone())))?;
        registry.set_searched(searched(&s.packages_dir));

        Ok(Env {
            config: s.config,
            wasm_config: s.wasm,
            runners_config: s.runners,
            packages_dir: s.packages_dir,
            registry,
            package_digests,
        })
    }
}

/// Where node types come from, for the error about an unknown one: what is installed in
/// the package store, and how to point at another.
fn searched(packages_dir: &Path) -> String {
    let installed = match heddle_wasm::PackageStore::open(packages_dir).list() {
        Ok(l) if !l.is_empty() => {
            let names: Vec<&str> = l.iter().map(|e| e.name.as_str()).collect();
            format!("installed: {}", names.join(", "))
        }
        Ok(_) => "nothing installed".to_string(),
        Err(e) => format!("unreadable: {e}"),
    };
    format!(
        "node types come from the built-ins, the code runners, the first-party packages ({}) and the package store {} ({installed}); install one with `heddle package add DIR`, or use another store with `--packages DIR` or `[cli] packages_dir` in heddle.toml",
        heddle_wasm::FIRST_PARTY.join(", "),
        packages_dir.display()
    )
}

/// The node types a graph uses: what a run or validation needs loaded.
pub fn graph_types(doc: &GraphDoc) -> BTreeSet<String> {
    doc.nodes.iter().map(|n| n.node_type.clone()).collect()
}

/// Reads a graph file; a missing file or malformed JSON is a usage error naming the
/// file (and line:column).
pub fn load_graph(path: &Path) -> anyhow::Result<GraphDoc> {
    Ok(GraphDoc::load(path)?)
}

/// Plans a graph against the registry; the error lists every problem.
pub fn plan_graph(doc: &GraphDoc, registry: &Registry, path: &Path) -> anyhow::Result<Plan> {
    heddle_core::plan::plan(doc, registry)
        .map_err(|e: ValidationError| anyhow::Error::from(e))
        .with_context(|| format!("{}", path.display()))
}
