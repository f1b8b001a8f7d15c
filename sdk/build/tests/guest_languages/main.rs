//! Nodes written in Python, JavaScript and C, built from source by the test suite with
//! `heddle-package-build` (installing the toolchains from the package registries when
//! missing), installed through the lockfile store like `heddle package add`, and run in
//! graphs by the kernel next to native built-ins and the Rust `std` package.
//!
//! Built components are cached by source hash under `target/heddle-test-cache/builds`
//! and compiled code under `target/heddle-test-cache/wasm`, so only the first run on a
//! machine pays the 15–60 s interpreter snapshot and ~10 s compile per component.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use heddle_core::builder::graph;
use heddle_core::{GraphDoc, NodeLimits, NodeOutcome, RunStatus, Value};
use heddle_kernel::runtime::RunOptions;
use heddle_kernel::{
    Call, CtxParts, ErrorKind, EventSink, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs,
    Registry, SecretRegistry,
};
use heddle_package_build::{BuildError, BuildOptions, BuiltPackage, build_package, wit_in};
use heddle_wasm::{
    DirGrant, DirMode, EngineSettings, PackageError, PackageGrant, PackageStore, WasmConfig,
    WasmHost, WasmProvider,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

// Shared support for the language modules below (one test binary, so the packages are
// built and compiled once per run).

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache_root() -> PathBuf {
    workspace().join("target/heddle-test-cache")
}

/// Builds a package source folder once per test process (cached across processes).
fn built(rel: &'static str) -> &'static BuiltPackage {
    static SLOTS: OnceLock<BTreeMap<&'static str, OnceLock<BuiltPackage>>> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| {
        [
            "sdk/python/examples/textstats",
            "sdk/js/examples/jsonkit",
            "sdk/c/examples/cstrings",
            "sdk/build/tests/fixtures/pykit",
            "sdk/build/tests/fixtures/jskit",
            "sdk/build/tests/fixtures/ckit",
        ]
        .into_iter()
        .map(|p| (p, OnceLock::new()))
        .collect()
    });
    let slot = slots
        .get(rel)
        .unwrap_or_else(|| panic!("unknown package source {rel}"));
    slot.get_or_init(|| {
        let name = Path::new(rel)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let opts = BuildOptions {
            out_dir: Some(cache_root().join("packages").join(name)),
            cache_dir: Some(cache_root().join("builds")),
            ..BuildOptions::default()
        };
        match build_package(&workspace().join(rel), &opts) {
            Ok(p) => p,
            Err(e) => panic!("building {rel} failed: {e}"),
        }
    })
}

/// One engine for the whole test process; compiled code is cached on disk.
fn host() -> WasmHost {
    static HOST: OnceLock<WasmHost> = OnceLock::new();
    HOST.get_or_init(|| {
        WasmHost::new(EngineSettings {
            cache_dir: Some(cache_root().join("wasm")),
            ..EngineSettings::default()
        })
        .expect("wasm engine starts")
    })
    .clone()
}

/// Compiles each package once per test process before the tests install it, so
/// parallel tests wait for one compile (10+ s for an interpreter) instead of each
/// compiling it too; later loads hit the on-disk compile cache.
async fn compiled(rel: &'static str) {
    /// One compile slot per package directory.
    type Slots = std::sync::Mutex<BTreeMap<&'static str, Arc<tokio::sync::OnceCell<()>>>>;
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    let cell = SLOTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(rel)
        .or_default()
        .clone();
    cell.get_or_init(|| async {
        heddle_wasm::WasmPackage::load_dir(&host(), &built(rel).dir)
            .await
            .unwrap_or_else(|e| panic!("loading {rel}: {e}"));
    })
    .await;
}

/// Installs the packages into a fresh lockfile store (as `heddle package add` does),
/// loads them back through the lock check and adds the first-party Rust packages.
async fn provider(
    sources: &[&'static str],
    config: WasmConfig,
) -> (WasmProvider, tempfile::TempDir) {
    let host = host();
    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    let mut provider = WasmProvider::new(host.clone(), config);
    for rel in sources {
        compiled(rel).await;
        let pkg = built(rel);
        let installed = store
            .install(&host, &pkg.dir)
            .await
            .unwrap_or_else(|e| panic!("installing {}: {e}", pkg.dir.display()));
        assert_eq!(installed.name(), pkg.name);
        let loaded = store.load(&host, &pkg.name).await.unwrap();
        provider.add(loaded).unwrap();
    }
    provider
        .add_first_party()
        .await
        .expect("first-party Rust packages load");
    (provider, store_dir)
}

fn registry(provider: WasmProvider) -> Registry {
    let mut reg = Registry::with_builtins();
    reg.add(Arc::new(provider)).unwrap();
    reg
}

async fn run(reg: &Registry, doc: &GraphDoc, inputs: &[(&str, Value)]) -> heddle_core::RunResult {
    let mut opts = RunOptions::default();
    for (k, v) in inputs {
        opts.inputs.insert(k.to_string(), v.clone());
    }
    heddle_kernel::run_graph(doc, reg, opts)
        .await
        .expect("graph is valid")
}

fn assert_completed(r: &heddle_core::RunResult) {
    assert_eq!(
        r.status,
        RunStatus::Completed,
        "run failed: {:?}\nnodes: {:#?}",
        r.error,
        r.nodes
    );
}

fn json(v: &Value) -> serde_json::Value {
    v.to_json()
}

fn outs(r: &heddle_core::RunResult, name: &str) -> Vec<serde_json::Value> {
    r.outputs
        .get(name)
        .map(|vs| vs.iter().map(json).collect())
        .unwrap_or_default()
}

struct NoEvents;
impl EventSink for NoEvents {
    fn emit(&self, _event: heddle_core::EventKind) {}
}

/// One invocation through the executor seam, to see the full `NodeError`.
async fn invoke(
    provider: &WasmProvider,
    type_name: &str,
    inputs: &[(&str, Value)],
    limits: Option<NodeLimits>,
) -> Result<Outputs, NodeError> {
    let decl = provider
        .declarations()
        .into_iter()
        .find(|d| d.type_name == type_name)
        .unwrap_or_else(|| panic!("no node type {type_name}"));
    let exec = provider
        .create(&NodeSpec {
            id: "n1",
            decl: &decl,
            properties: &BTreeMap::new(),
            limits: limits.as_ref(),
        })
        .unwrap();
    let ctx = NodeCtx::new(CtxParts {
        node_id: "n1".into(),
        node_type: type_name.into(),
        key: "".into(),
        cancel: CancellationToken::new(),
        deadline: None,
        events: Arc::new(NoEvents),
        emit: None,
        secrets: Arc::new(SecretRegistry::default()),
    });
    let inputs = inputs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    exec.invoke(Call { inputs, ctx }).await
}

fn failed_with(r: &heddle_core::RunResult, node: &str) -> String {
    match &r.nodes[node].outcome {
        NodeOutcome::Failed { error } => error.clone(),
        other => panic!("node {node} did not fail: {other:?}"),
    }
}

fn kit_config(package: &str, grant: PackageGrant) -> WasmConfig {
    let mut config = WasmConfig::default();
    config.packages.insert(package.into(), grant);
    config
}

/// CRC-32 (IEEE), to check the C nodes' arithmetic independently (the C and mixed-language graphs).
fn crc32(bytes: &[u8]) -> i64 {
    let mut c = 0xFFFF_FFFFu32;
    for b in bytes {
        c ^= *b as u32;
        for _ in 0..8 {
            c = (c >> 1) ^ (0xEDB8_8320 & (c & 1).wrapping_neg());
        }
    }
    (!c) as i64
}

// Loopback HTTP servers that count connections, shared with heddle-wasm's network tests.
#[path = "../../../../host/wasm/tests/common/netserver.rs"]
mod netserver;

/// Loopback servers for a kit's fetch node: `echo` answers with the request's headers
/// as JSON and `failing` with `status`, both granted to `package` in `config`;
/// `ungranted` is not.
struct Fetch {
    echo: netserver::Server,
    failing: netserver::Server,
    ungranted: netserver::Server,
    config: WasmConfig,
}

impl Fetch {
    async fn start(package: &str, status: u16) -> Fetch {
        use netserver::{Behavior, Server};
        let echo = Server::http(Behavior::EchoHeaders).await;
        let failing = Server::http(Behavior::Respond {
            status,
            content_type: "text/plain",
            body: b"not today".to_vec(),
        })
        .await;
        let ungranted = Server::http(Behavior::EchoHeaders).await;
        let config = WasmConfig::from_toml_str(&format!(
            "[packages.{package}]\nnetwork = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\"]\n",
            echo.port, failing.port
        ))
        .unwrap();
        Fetch {
            echo,
            failing,
            ungranted,
            config,
        }
    }
}

/// `path` on `server` as a node's `url` input.
fn fetch_url(server: &netserver::Server, path: &str) -> Value {
    Value::str(server.url("http", "127.0.0.1", path))
}

mod building;
mod c;
mod javascript;
mod python;
mod together;
