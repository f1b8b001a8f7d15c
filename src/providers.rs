//! The node registry a command works with: native built-ins, then WASM packages (the
//! first-party `std` and `files`, then the installed ones), then code nodes. The
//! registry refuses a provider that redefines a type, so a package cannot shadow a
//! built-in.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
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

    /// Starts the wasmtime engine (compile cache, epoch ticker).
    pub fn wasm_host(&self) -> anyhow::Result<WasmHost> {
        WasmHost::new(self.wasm.wasm.clone()).context("starting the WASM engine")
    }
}

impl Env {
    /// Loads the configuration and every provider. Async because loading a package
    /// compiles it (or reads the compile cache).
    pub async fn load(args: &EnvArgs) -> anyhow::Result<Env> {
        let s = Settings::load(args)?;
        let mut registry = Registry::with_builtins();

        let host = s.wasm_host()?;
        let store = s.store();
        let mut wasm = WasmProvider::new(host, s.wasm.clone());
        wasm.add_first_party()
            .await
            .context("loading the first-party packages (std, files)")?;
        if has_lockfile(&store) {
            let packages = store.load_all(wasm.host()).await.with_context(|| {
                format!(
                    "loading installed packages from {}",
                    s.packages_dir.display()
                )
            })?;
            for p in packages {
                wasm.add(p)?;
            }
        }
        registry.add(Arc::new(wasm))?;
        registry.add(Arc::new(CodeNodes::new(s.runners.clone())))?;

        Ok(Env {
            config: s.config,
            wasm_config: s.wasm,
            runners_config: s.runners,
            packages_dir: s.packages_dir,
            registry,
        })
    }
}

fn has_lockfile(store: &PackageStore) -> bool {
    Path::new(&store.lockfile_path()).is_file()
}
