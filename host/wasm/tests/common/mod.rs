//! Shared setup: builds the test packages (real components, from `plugins/testing`),
//! creates hosts with a test-local compile cache, and runs single invocations through the
//! executor seam with a collecting event sink.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use heddle_core::{EventKind, NodeLimits, Value};
use heddle_kernel::{
    Call, CtxParts, Emitted, EventSink, Executor, InputStream, NodeCtx, NodeError, NodeProvider,
    NodeSpec, Outputs, SecretRegistry, StreamItem,
};
use heddle_wasm::{EngineSettings, WasmConfig, WasmHost, WasmPackage, WasmProvider};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub fn tmp_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("heddle-wasm-tests")
}

/// (package name, crate dir under plugins/testing, cargo package)
const TEST_PACKAGES: &[(&str, &str, &str)] = &[
    ("hostile", "hostile", "heddle-hostile"),
    ("future", "future-version", "heddle-future-version"),
    ("mismatch", "mismatch", "heddle-mismatch"),
    ("describe-sleep", "describe-sleep", "heddle-describe-sleep"),
    ("describe-panic", "describe-panic", "heddle-describe-panic"),
    ("spoof", "spoof", "heddle-spoof"),
    ("bad-target", "bad-target", "heddle-bad-target"),
];

/// Builds the test packages once per test process and returns the directory holding
/// one package directory per name.
pub fn test_packages() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Shared with the CLI's tests, whose manifest dir is the repository root.
        let plugins = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|d| d.join("plugins"))
            .find(|p| p.join("Cargo.toml").is_file())
            .expect("the plugins workspace is above this crate");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&plugins)
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(plugins.join("target"));
        for (_, _, krate) in TEST_PACKAGES {
            cmd.args(["-p", krate]);
        }
        for v in [
            "CARGO_TARGET_DIR",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
        ] {
            cmd.env_remove(v);
        }
        let status = cmd.status().expect("run cargo for the test packages");
        assert!(status.success(), "building the test packages failed");
        let out = tmp_root().join(format!("packages-{}", std::process::id()));
        for (name, dir, krate) in TEST_PACKAGES {
            let dest = out.join(name);
            std::fs::create_dir_all(&dest).unwrap();
            std::fs::copy(
                plugins
                    .join("testing")
                    .join(dir)
                    .join("heddle-package.toml"),
                dest.join("heddle-package.toml"),
            )
            .unwrap();
            std::fs::copy(
                plugins
                    .join("target/wasm32-wasip2/release")
                    .join(format!("{}.wasm", krate.replace('-', "_"))),
                dest.join(format!("{name}.wasm")),
            )
            .unwrap();
        }
        out
    })
}

pub fn package_dir(name: &str) -> PathBuf {
    test_packages().join(name)
}

pub fn settings() -> EngineSettings {
    EngineSettings {
        cache_dir: Some(tmp_root().join("cache")),
        ..Default::default()
    }
}

pub fn host() -> WasmHost {
    WasmHost::new(settings()).expect("engine starts")
}

/// A provider holding the hostile package, with `config` as the operator config.
pub async fn hostile_provider(config: WasmConfig) -> WasmProvider {
    let host = WasmHost::new(EngineSettings {
        cache_dir: Some(tmp_root().join("cache")),
        ..config.wasm.clone()
    })
    .unwrap();
    let pkg = WasmPackage::load_dir(&host, &package_dir("hostile"))
        .await
        .unwrap();
    let mut p = WasmProvider::new(host, config);
    p.add(pkg).unwrap();
    p
}

pub async fn first_party_provider(config: WasmConfig) -> WasmProvider {
    let host = WasmHost::new(EngineSettings {
        cache_dir: Some(tmp_root().join("cache")),
        ..config.wasm.clone()
    })
    .unwrap();
    let mut p = WasmProvider::new(host, config);
    p.add_first_party().await.unwrap();
    p
}

#[derive(Default)]
pub struct Sink(pub Mutex<Vec<EventKind>>);

impl EventSink for Sink {
    fn emit(&self, event: EventKind) {
        self.0.lock().unwrap().push(event);
    }
}

impl Sink {
    pub fn logs(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::Log { message, .. } => Some(message.clone()),
                _ => None,
            })
            .collect()
    }
}

pub struct Harness {
    pub sink: Arc<Sink>,
    pub cancel: CancellationToken,
    pub secrets: Arc<SecretRegistry>,
    pub emitted: Option<mpsc::Receiver<Emitted>>,
}

pub fn ctx(
    node_id: &str,
    node_type: &str,
    deadline: Option<Instant>,
    streaming: bool,
) -> (NodeCtx, Harness) {
    let sink = Arc::new(Sink::default());
    let cancel = CancellationToken::new();
    let secrets = Arc::new(SecretRegistry::default());
    let (tx, rx) = if streaming {
        let (tx, rx) = mpsc::channel(1024);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let ctx = NodeCtx::new(CtxParts {
        node_id: node_id.into(),
        node_type: node_type.into(),
        key: "".into(),
        cancel: cancel.clone(),
        deadline,
        events: sink.clone(),
        emit: tx,
        secrets: secrets.clone(),
    });
    (
        ctx,
        Harness {
            sink,
            cancel,
            secrets,
            emitted: rx,
        },
    )
}

pub fn create(
    provider: &WasmProvider,
    id: &str,
    type_name: &str,
    properties: BTreeMap<String, Value>,
    limits: Option<NodeLimits>,
) -> Arc<dyn Executor> {
    let decl = heddle_kernel::NodeProvider::declarations(provider)
        .into_iter()
        .find(|d| d.type_name == type_name)
        .unwrap_or_else(|| panic!("no declaration for {type_name}"));
    provider
        .create(&NodeSpec {
            id,
            decl: &decl,
            properties: &properties,
            limits: limits.as_ref(),
        })
        .unwrap()
}

pub fn inputs<const N: usize>(pairs: [(&str, Value); N]) -> BTreeMap<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Runs one invocation of a fresh node `id` of `type_name`.
pub async fn invoke(
    provider: &WasmProvider,
    type_name: &str,
    ins: BTreeMap<String, Value>,
    limits: Option<NodeLimits>,
) -> (Result<Outputs, NodeError>, NodeCtx, Harness) {
    let exec = create(provider, "n1", type_name, BTreeMap::new(), limits);
    let (ctx, h) = ctx("n1", type_name, None, false);
    let r = exec
        .invoke(Call {
            inputs: ins,
            ctx: ctx.clone(),
        })
        .await;
    (r, ctx, h)
}

/// Streams `items` into a streaming-input node and returns (result, emitted values).
pub async fn run_stream(
    provider: &WasmProvider,
    type_name: &str,
    items: Vec<(&str, Value)>,
) -> (Result<Outputs, NodeError>, Vec<(String, Value)>) {
    let exec = create(provider, "s1", type_name, BTreeMap::new(), None);
    let (ctx, mut h) = ctx("s1", type_name, None, true);
    let (tx, rx) = mpsc::channel(16);
    let feed = async move {
        for (handle, value) in items {
            tx.send(StreamItem {
                handle: handle.into(),
                value,
            })
            .await
            .unwrap();
        }
    };
    let stream = InputStream::new(rx, BTreeMap::new());
    let (r, _) = tokio::join!(exec.run_stream(stream, ctx), feed);
    let mut out = Vec::new();
    let mut rx = h.emitted.take().unwrap();
    while let Ok(e) = rx.try_recv() {
        out.push((e.handle.to_string(), e.value));
    }
    (r, out)
}
