//! `WasmProvider` offers the node types of the loaded packages to the kernel and creates
//! a `WasmExecutor` with the node's grant for each graph node of those types.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use heddle_core::NodeDecl;
use heddle_kernel::{Executor, NodeError, NodeProvider, NodeSpec};

use crate::config::{SecretsConfig, WasmConfig};
use crate::engine::WasmHost;
use crate::error::{PackageError, chain};
use crate::executor::WasmExecutor;
use crate::grants::NodeGrant;
use crate::package::WasmPackage;
use crate::store::PackageStore;
use crate::value::to_wit;

/// The provider of every WASM node type loaded into this host.
pub struct WasmProvider {
    host: WasmHost,
    config: Arc<WasmConfig>,
    secrets: Arc<SecretsConfig>,
    packages: Vec<Arc<WasmPackage>>,
    types: HashMap<String, usize>,
}

impl WasmProvider {
    pub fn new(host: WasmHost, config: WasmConfig) -> Self {
        let secrets = Arc::new(config.secrets.clone());
        WasmProvider {
            host,
            config: Arc::new(config),
            secrets,
            packages: Vec::new(),
            types: HashMap::new(),
        }
    }

    pub fn host(&self) -> &WasmHost {
        &self.host
    }

    /// Adds a loaded package; refused whole if one of its node types is already offered
    /// by another package of this provider (clashes with other providers are refused by
    /// the kernel's registry).
    pub fn add(&mut self, pkg: WasmPackage) -> Result<(), PackageError> {
        for d in pkg.declarations() {
            if let Some(&i) = self.types.get(&d.type_name) {
                return Err(PackageError::BadDecl {
                    path: pkg.dir.clone(),
                    type_name: d.type_name.clone(),
                    message: format!(
                        "already defined by package `{}`; a package may not redefine an existing node type",
                        self.packages[i].name()
                    ),
                });
            }
        }
        let idx = self.packages.len();
        for d in pkg.declarations() {
            self.types.insert(d.type_name.clone(), idx);
        }
        self.packages.push(Arc::new(pkg));
        Ok(())
    }

    /// Loads the first-party packages embedded in this host (`std`, `files`).
    pub async fn add_first_party(&mut self) -> Result<(), PackageError> {
        self.add_first_party_providing(None).await
    }

    /// The first-party packages that may declare one of the `wanted` node types (all of
    /// them when `None`).
    pub async fn add_first_party_providing(
        &mut self,
        wanted: Option<&BTreeSet<String>>,
    ) -> Result<(), PackageError> {
        for pkg in crate::first_party::load_providing(&self.host, wanted).await? {
            self.add(pkg)?;
        }
        Ok(())
    }

    /// The provider a command line uses: an engine from `config`, then the first-party
    /// packages and the packages installed in the store at `store_dir` (each checked
    /// against its lockfile pin) that declare one of the `wanted` node types (every
    /// package when `None`). Loading compiles, or reads the compile cache, so a run pays
    /// only for the packages its graph uses.
    pub async fn load(
        config: WasmConfig,
        store_dir: Option<&Path>,
        wanted: Option<&BTreeSet<String>>,
    ) -> Result<Self, PackageError> {
        let host = WasmHost::new(config.wasm.clone())?;
        Self::load_on(host, config, store_dir, wanted).await
    }

    /// [`WasmProvider::load`] on an engine the caller made (e.g. one with a compile
    /// notice set).
    pub async fn load_on(
        host: WasmHost,
        config: WasmConfig,
        store_dir: Option<&Path>,
        wanted: Option<&BTreeSet<String>>,
    ) -> Result<Self, PackageError> {
        let mut p = WasmProvider::new(host, config);
        p.add_first_party_providing(wanted).await?;
        if let Some(dir) = store_dir {
            let store = PackageStore::open(dir);
            for pkg in store.load_providing(&p.host, wanted).await? {
                p.add(pkg)?;
            }
        }
        Ok(p)
    }

    pub fn packages(&self) -> &[Arc<WasmPackage>] {
        &self.packages
    }
}

impl NodeProvider for WasmProvider {
    fn name(&self) -> &str {
        "wasm"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        let mut out = Vec::new();
        for p in &self.packages {
            // The operator's cap on how many invocations run at once narrows the
            // package's own word.
            let cap = self
                .config
                .packages
                .get(p.name())
                .and_then(|g| g.concurrency);
            for d in p.declarations() {
                out.push(match cap {
                    Some(c) if d.concurrency > c => Arc::new(NodeDecl {
                        concurrency: c,
                        ..(**d).clone()
                    }),
                    _ => d.clone(),
                });
            }
        }
        out
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        let type_name = &spec.decl.type_name;
        let Some(&idx) = self.types.get(type_name) else {
            return Err(NodeError::host(format!(
                "node {}: no WASM package provides `{type_name}`",
                spec.id
            )));
        };
        let pkg = self.packages[idx].clone();
        let grant = self
            .config
            .grant_for(pkg.name(), &pkg.digest)
            .map_err(|e| NodeError::host(format!("node {}: {}", spec.id, chain(&e))))?;
        let grant = NodeGrant::new(&grant, spec.limits, self.config.wasm.max_memory_mb);
        let properties = spec
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), to_wit(v)))
            .collect();
        Ok(Arc::new(WasmExecutor::new(
            spec.id.to_string(),
            type_name.clone(),
            pkg,
            grant,
            self.secrets.clone(),
            properties,
        )))
    }
}
