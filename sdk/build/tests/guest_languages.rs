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

// ---- support ---------------------------------------------------------------------

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

// ---- Python ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_nodes_run_in_a_graph_with_rust_and_native_nodes() {
    let (p, _store) = provider(&["sdk/python/examples/textstats"], WasmConfig::default()).await;
    let reg = registry(p);
    // word_count (Python) feeds std.text.join (Rust); a list fans out over
    // parse_record (Python) and is collected; streamed tokens pass std.text.case (Rust).
    let g = graph(
        &[
            ("text", "heddle.input", json!({"type": "str"})),
            ("lines", "heddle.input", json!({"type": "list[str]"})),
            ("wc", "textstats.word_count", json!({"top": 2})),
            ("join", "std.text.join", json!({"sep": "+"})),
            ("each", "heddle.foreach", json!({})),
            ("parse", "textstats.parse_record", json!({})),
            ("all", "heddle.collect", json!({})),
            ("tok", "textstats.tokens", json!({})),
            ("up", "std.text.case", json!({"mode": "upper"})),
            ("words", "heddle.output", json!({})),
            ("top", "heddle.output", json!({})),
            ("records", "heddle.output", json!({})),
            ("tokens", "heddle.output", json!({})),
        ],
        &[
            ("text", "value", "wc", "text"),
            ("wc", "words", "words", "value"),
            ("wc", "top_words", "join", "items"),
            ("join", "text", "top", "value"),
            ("lines", "value", "each", "list"),
            ("each", "item", "parse", "line"),
            ("parse", "record", "all", "item"),
            ("all", "list", "records", "value"),
            ("text", "value", "tok", "text"),
            ("tok", "token", "up", "text"),
            ("up", "text", "tokens", "value"),
        ],
    );
    let lines = Value::from(vec![Value::str("a=1; b=two"), Value::str("c=3")]);
    let r = run(
        &reg,
        &g,
        &[
            ("text", Value::str("the cat saw the dog")),
            ("lines", lines),
        ],
    )
    .await;
    assert_completed(&r);
    assert_eq!(outs(&r, "words"), vec![serde_json::json!(5)]);
    assert_eq!(outs(&r, "top"), vec![serde_json::json!("the+cat")]);
    assert_eq!(
        outs(&r, "records"),
        vec![serde_json::json!([{"a": 1, "b": "two"}, {"c": 3}])]
    );
    assert_eq!(
        outs(&r, "tokens"),
        ["THE", "CAT", "SAW", "THE", "DOG"]
            .map(serde_json::Value::from)
            .to_vec()
    );
    let wc = &r.nodes["wc"].metrics;
    assert!(
        wc.fuel.is_some_and(|f| f > 0),
        "fuel is metered per invocation: {wc:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_recoverable_error_carries_signature_and_candidate() {
    let (p, _store) = provider(&["sdk/python/examples/textstats"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "textstats.parse_record",
        &[("line", Value::str("a=1; oops; b=2"))],
        None,
    )
    .await
    .expect_err("a malformed field fails the node");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(err.signature.as_deref(), Some("textstats:parse"));
    assert!(err.message.contains("'oops'"), "{}", err.message);
    let candidate = err
        .candidate
        .expect("the fields that parsed are the candidate");
    assert_eq!(
        json(candidate.get("record").unwrap()),
        serde_json::json!({"a": 1, "b": 2})
    );

    // Any other exception fails the node (not the host) with a python: signature.
    let err = invoke(
        &p,
        "textstats.word_count",
        &[("text", Value::str("x")), ("top", Value::str("two"))],
        None,
    )
    .await
    .expect_err("int('two') raises");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(
        err.signature.as_deref(),
        Some("python:ValueError"),
        "{}",
        err.message
    );
    // ...and the same package keeps working afterwards.
    let ok = invoke(
        &p,
        "textstats.word_count",
        &[("text", Value::str("a b a"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        json(ok.get("top_words").unwrap()),
        serde_json::json!(["a", "b"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_infinite_loop_is_stopped_by_fuel() {
    let grant = PackageGrant {
        fuel: Some(300_000_000),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/pykit"],
        kit_config("pykit", grant),
    )
    .await;
    let err = invoke(&p, "pykit.spin", &[], None)
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::FuelExhausted, "{}", err.message);
    assert!(
        err.message.contains("n1") && err.message.contains("fuel"),
        "{}",
        err.message
    );
    // A trap discards the instance; the next invocation starts clean.
    let ok = invoke(&p, "pykit.echo", &[("value", Value::from(7i64))], None)
        .await
        .unwrap();
    assert_eq!(ok.get("value"), Some(&Value::Int(7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_infinite_loop_is_stopped_by_the_deadline() {
    // Fuel large enough that only the wall clock can stop it.
    let grant = PackageGrant {
        fuel: Some(u64::MAX / 2),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/pykit"],
        kit_config("pykit", grant),
    )
    .await;
    let limits = NodeLimits {
        timeout_ms: Some(300),
        ..Default::default()
    };
    let err = invoke(&p, "pykit.spin", &[], Some(limits))
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::Deadline, "{}", err.message);
    assert!(
        err.message.contains("n1") && err.message.contains("deadline"),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_files_only_inside_a_granted_directory() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("hello.txt"), "hi from the host").unwrap();
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "secret").unwrap();
    let outside = outside.path().to_string_lossy().into_owned();

    // No grant: the guest sees no filesystem at all.
    let (p, _store) = provider(&["sdk/build/tests/fixtures/pykit"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "pykit.read_file",
        &[("path", Value::str(outside.clone()))],
        None,
    )
    .await
    .expect_err("no file access without a grant");
    assert_eq!(
        err.signature.as_deref(),
        Some("python:FileNotFoundError"),
        "{}",
        err.message
    );

    // A read-only grant of one directory: inside works, outside still does not.
    let grant = PackageGrant {
        dirs: vec![DirGrant {
            host: data.path().to_path_buf(),
            guest: "/data".into(),
            mode: DirMode::Ro,
        }],
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/pykit"],
        kit_config("pykit", grant),
    )
    .await;
    let ok = invoke(
        &p,
        "pykit.read_file",
        &[("path", Value::str("/data/hello.txt"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.get("text"), Some(&Value::str("hi from the host")));
    for path in [outside.as_str(), "/data/../etc/passwd"] {
        let err = invoke(&p, "pykit.read_file", &[("path", Value::str(path))], None)
            .await
            .expect_err("outside the grant");
        assert!(
            err.signature
                .as_deref()
                .is_some_and(|s| s.starts_with("python:")),
            "{path}: {err:?}"
        );
    }
}

// ---- JavaScript ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_nodes_run_in_a_graph_with_rust_and_native_nodes() {
    let (p, _store) = provider(&["sdk/js/examples/jsonkit"], WasmConfig::default()).await;
    let reg = registry(p);
    let g = graph(
        &[
            ("doc", "heddle.input", json!({"type": "str"})),
            ("parse", "jsonkit.parse", json!({})),
            (
                "pick",
                "jsonkit.pick",
                json!({"fields": ["name", "tags", "nope"]}),
            ),
            ("str", "std.json.stringify", json!({})),
            ("entries", "jsonkit.entries", json!({})),
            ("picked", "heddle.output", json!({})),
            ("missing", "heddle.output", json!({})),
            ("entry", "heddle.output", json!({})),
        ],
        &[
            ("doc", "value", "parse", "text"),
            ("parse", "value", "pick", "object"),
            ("pick", "picked", "str", "value"),
            ("str", "text", "picked", "value"),
            ("pick", "missing", "missing", "value"),
            ("parse", "value", "entries", "object"),
            ("entries", "entry", "entry", "value"),
        ],
    );
    let doc = r#"{"name":"heddle","size":3,"tags":["a","b"]}"#;
    let r = run(&reg, &g, &[("doc", Value::str(doc))]).await;
    assert_completed(&r);
    let picked: serde_json::Value = serde_json::from_str(
        outs(&r, "picked")[0]
            .as_str()
            .expect("stringify gives text"),
    )
    .unwrap();
    assert_eq!(
        picked,
        serde_json::json!({"name": "heddle", "tags": ["a", "b"]})
    );
    assert_eq!(outs(&r, "missing"), vec![serde_json::json!(["nope"])]);
    assert_eq!(
        outs(&r, "entry"),
        vec![
            serde_json::json!(["name", "heddle"]),
            serde_json::json!(["size", 3]),
            serde_json::json!(["tags", ["a", "b"]])
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_recoverable_error_carries_the_raw_text_as_candidate() {
    let (p, _store) = provider(&["sdk/js/examples/jsonkit"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "jsonkit.parse",
        &[("text", Value::str("{\"a\": 1,,}"))],
        None,
    )
    .await
    .expect_err("bad JSON");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(err.signature.as_deref(), Some("json:parse"));
    assert!(err.message.starts_with("invalid JSON"), "{}", err.message);
    let candidate = err.candidate.expect("raw text as candidate");
    assert_eq!(candidate.get("value"), Some(&Value::str("{\"a\": 1,,}")));

    // A plain exception (wrong input type) fails the node with a js: signature.
    let err = invoke(
        &p,
        "jsonkit.pick",
        &[
            ("object", Value::from(serde_json::json!({"a": 1}))),
            ("fields", Value::from(5i64)),
        ],
        None,
    )
    .await
    .expect_err("fields is not iterable");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(
        err.signature.as_deref(),
        Some("js:TypeError"),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_infinite_loop_is_stopped_by_fuel_and_by_the_deadline() {
    let grant = PackageGrant {
        fuel: Some(500_000_000),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/jskit"],
        kit_config("jskit", grant),
    )
    .await;
    let err = invoke(&p, "jskit.spin", &[], None)
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::FuelExhausted, "{}", err.message);

    let grant = PackageGrant {
        fuel: Some(u64::MAX / 2),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/jskit"],
        kit_config("jskit", grant),
    )
    .await;
    let limits = NodeLimits {
        timeout_ms: Some(300),
        ..Default::default()
    };
    let err = invoke(&p, "jskit.spin", &[], Some(limits))
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::Deadline, "{}", err.message);
    assert!(err.message.contains("n1"), "{}", err.message);
    let ok = invoke(
        &p,
        "jskit.echo",
        &[("value", Value::str("still alive"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.get("value"), Some(&Value::str("still alive")));
}

// ---- C ---------------------------------------------------------------------------

/// CRC-32 (IEEE), to check the C node's arithmetic independently.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_nodes_run_in_a_graph_with_rust_and_native_nodes() {
    let (p, _store) = provider(&["sdk/c/examples/cstrings"], WasmConfig::default()).await;
    let reg = registry(p);
    let g = graph(
        &[
            ("text", "heddle.input", json!({"type": "str"})),
            ("nums", "heddle.input", json!({"type": "list[str]"})),
            ("upper", "std.text.case", json!({"mode": "upper"})),
            ("crc", "cstrings.crc32", json!({})),
            ("each", "heddle.foreach", json!({})),
            ("int", "cstrings.parse_int", json!({})),
            ("all", "heddle.collect", json!({})),
            ("sum", "std.math.aggregate", json!({"op": "sum"})),
            ("crc32", "heddle.output", json!({})),
            ("length", "heddle.output", json!({})),
            ("total", "heddle.output", json!({})),
        ],
        &[
            ("text", "value", "upper", "text"),
            ("upper", "text", "crc", "text"),
            ("crc", "crc32", "crc32", "value"),
            ("crc", "length", "length", "value"),
            ("nums", "value", "each", "list"),
            ("each", "item", "int", "text"),
            ("int", "value", "all", "item"),
            ("all", "list", "sum", "items"),
            ("sum", "result", "total", "value"),
        ],
    );
    let nums = Value::from(vec![Value::str("40"), Value::str(" 2 "), Value::str("-10")]);
    let r = run(
        &reg,
        &g,
        &[("text", Value::str("hello, world")), ("nums", nums)],
    )
    .await;
    assert_completed(&r);
    assert_eq!(
        outs(&r, "crc32"),
        vec![serde_json::json!(crc32(b"HELLO, WORLD"))]
    );
    assert_eq!(outs(&r, "length"), vec![serde_json::json!(12)]);
    assert_eq!(outs(&r, "total").len(), 1);
    assert_eq!(outs(&r, "total")[0].as_f64(), Some(32.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_recoverable_error_carries_the_number_read_as_candidate() {
    let (p, _store) = provider(&["sdk/c/examples/cstrings"], WasmConfig::default()).await;
    let err = invoke(
        &p,
        "cstrings.parse_int",
        &[("text", Value::str("42abc"))],
        None,
    )
    .await
    .expect_err("trailing characters");
    assert_eq!(err.kind, ErrorKind::Node);
    assert_eq!(err.signature.as_deref(), Some("int:trailing"));
    assert!(err.message.contains("\"abc\""), "{}", err.message);
    assert_eq!(
        err.candidate.expect("candidate").get("value"),
        Some(&Value::Int(42))
    );
    let err = invoke(&p, "cstrings.parse_int", &[("text", Value::str("x"))], None)
        .await
        .unwrap_err();
    assert_eq!(err.signature.as_deref(), Some("int:parse"));
    assert!(err.candidate.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_guest_is_stopped_by_fuel_and_reads_no_file_without_a_grant() {
    let grant = PackageGrant {
        fuel: Some(200_000_000),
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/ckit"],
        kit_config("ckit", grant),
    )
    .await;
    let err = invoke(&p, "ckit.spin", &[], None)
        .await
        .expect_err("spins forever");
    assert_eq!(err.kind, ErrorKind::FuelExhausted, "{}", err.message);
    let err = invoke(
        &p,
        "ckit.read_file",
        &[("path", Value::str("/etc/passwd"))],
        None,
    )
    .await
    .expect_err("no grant");
    assert_eq!(err.signature.as_deref(), Some("io:open"), "{}", err.message);

    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("x.txt"), "granted").unwrap();
    let grant = PackageGrant {
        dirs: vec![DirGrant {
            host: data.path().to_path_buf(),
            guest: "/data".into(),
            mode: DirMode::Ro,
        }],
        ..Default::default()
    };
    let (p, _store) = provider(
        &["sdk/build/tests/fixtures/ckit"],
        kit_config("ckit", grant),
    )
    .await;
    let ok = invoke(
        &p,
        "ckit.read_file",
        &[("path", Value::str("/data/x.txt"))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.get("text"), Some(&Value::str("granted")));
}

// ---- all together ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_js_c_and_rust_nodes_share_one_graph() {
    let (p, _store) = provider(
        &[
            "sdk/python/examples/textstats",
            "sdk/js/examples/jsonkit",
            "sdk/c/examples/cstrings",
        ],
        WasmConfig::default(),
    )
    .await;
    let reg = registry(p);
    // JSON text -> JS parse -> JS pick -> Rust json.get -> Python word_count ->
    // Rust text.join -> C crc32.
    let g = graph(
        &[
            ("doc", "heddle.input", json!({"type": "str"})),
            ("parse", "jsonkit.parse", json!({})),
            ("pick", "jsonkit.pick", json!({"fields": ["body"]})),
            ("get", "std.json.get", json!({"path": "body"})),
            ("wc", "textstats.word_count", json!({"top": 3})),
            ("join", "std.text.join", json!({"sep": " "})),
            ("crc", "cstrings.crc32", json!({})),
            ("top", "heddle.output", json!({})),
            ("crc32", "heddle.output", json!({})),
        ],
        &[
            ("doc", "value", "parse", "text"),
            ("parse", "value", "pick", "object"),
            ("pick", "picked", "get", "value"),
            ("get", "value", "wc", "text"),
            ("wc", "top_words", "join", "items"),
            ("join", "text", "top", "value"),
            ("join", "text", "crc", "text"),
            ("crc", "crc32", "crc32", "value"),
        ],
    );
    let doc = r#"{"title":"x","body":"b a c a b a"}"#;
    let r = run(&reg, &g, &[("doc", Value::str(doc))]).await;
    assert_completed(&r);
    assert_eq!(outs(&r, "top"), vec![serde_json::json!("a b c")]);
    assert_eq!(outs(&r, "crc32"), vec![serde_json::json!(crc32(b"a b c"))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_foreign_node_fails_the_run_naming_the_node() {
    let (p, _store) = provider(&["sdk/python/examples/textstats"], WasmConfig::default()).await;
    let reg = registry(p);
    let g = graph(
        &[
            ("line", "heddle.input", json!({"type": "str"})),
            ("parse", "textstats.parse_record", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("line", "value", "parse", "line"),
            ("parse", "record", "out", "value"),
        ],
    );
    let r = run(&reg, &g, &[("line", Value::str("nonsense"))]).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert!(
        failed_with(&r, "parse").contains("malformed"),
        "{:?}",
        r.nodes["parse"]
    );
    assert!(outs(&r, "out").is_empty());
}

// ---- lifecycle -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interpreter_state_never_leaks_between_fresh_invocations() {
    let (p, _store) = provider(
        &[
            "sdk/build/tests/fixtures/pykit",
            "sdk/build/tests/fixtures/jskit",
        ],
        WasmConfig::default(),
    )
    .await;
    for ty in ["pykit.counter", "jskit.counter"] {
        for _ in 0..3 {
            let out = invoke(&p, ty, &[], None).await.unwrap();
            assert_eq!(
                out.get("calls"),
                Some(&Value::Int(1)),
                "{ty}: a fresh instance per invocation"
            );
        }
    }
    // The warm variants answer correctly across reuse.
    for ty in ["pykit.echo_warm", "jskit.echo_warm"] {
        for i in 0..3i64 {
            let out = invoke(&p, ty, &[("value", Value::Int(i))], None)
                .await
                .unwrap();
            assert_eq!(out.get("value"), Some(&Value::Int(i)));
        }
    }
}

// ---- building --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_built_against_another_wit_version_is_refused() {
    let wit = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(workspace().join("wit/node.wit")).unwrap();
    let newer = text.replace("package heddle:node@0.1.0;", "package heddle:node@0.2.0;");
    assert_ne!(text, newer, "the WIT declares heddle:node@0.1.0");
    std::fs::write(wit.path().join("node.wit"), newer).unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        wit: Some(wit_in(wit.path()).unwrap()),
        out_dir: Some(out.path().to_path_buf()),
        cache_dir: None,
        ..BuildOptions::default()
    };
    let pkg = build_package(&workspace().join("sdk/c/template"), &opts).unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let err = PackageStore::open(store_dir.path())
        .install(&host(), &pkg.dir)
        .await
        .expect_err("WIT 0.2.0 is outside the supported range");
    assert!(
        matches!(err, PackageError::UnsupportedVersion { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("0.2.0") && msg.contains("0.1.x"), "{msg}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn c_build_failure_shows_the_compiler_error_and_file() {
    let src = tempfile::tempdir().unwrap();
    copy_dir(&workspace().join("sdk/c/template"), src.path());
    std::fs::write(
        src.path().join("broken.c"),
        "int broken(void) { return 1 +; }\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        out_dir: Some(out.path().into()),
        cache_dir: None,
        ..BuildOptions::default()
    };
    let err = build_package(src.path(), &opts).expect_err("syntax error");
    let BuildError::Tool { tool, output, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(tool, "clang");
    assert!(output.contains("broken.c:1:"), "{output}");
}

#[test]
fn js_build_failure_shows_the_file_and_line() {
    let src = tempfile::tempdir().unwrap();
    copy_dir(&workspace().join("sdk/js/template"), src.path());
    std::fs::write(
        src.path().join("index.js"),
        "export const node = {\n  describe() { return [ }\n};\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        out_dir: Some(out.path().into()),
        cache_dir: None,
        ..BuildOptions::default()
    };
    let err = build_package(src.path(), &opts).expect_err("syntax error");
    let BuildError::Tool { output, .. } = &err else {
        panic!("{err:?}")
    };
    let shown = format!(
        "{}/index.js:2",
        src.path().canonicalize().unwrap().display()
    );
    assert!(
        output.contains(&shown) && output.contains("SyntaxError"),
        "{output}"
    );
}

#[test]
fn python_build_failure_shows_the_traceback_with_the_authors_file() {
    let src = tempfile::tempdir().unwrap();
    copy_dir(&workspace().join("sdk/python/template"), src.path());
    std::fs::write(
        src.path().join("app.py"),
        "from heddle import Node\n\ndef broken(:\n    pass\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        out_dir: Some(out.path().into()),
        cache_dir: None,
        ..BuildOptions::default()
    };
    let err = build_package(src.path(), &opts).expect_err("syntax error");
    let BuildError::Tool { tool, output, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(tool, "componentize-py");
    let shown = format!(
        "{}/app.py\", line 3",
        src.path().canonicalize().unwrap().display()
    );
    assert!(
        output.contains(&shown) && output.contains("SyntaxError"),
        "{output}"
    );
    assert!(!output.contains("Stack backtrace"), "{output}");
}

#[test]
fn the_build_cache_is_keyed_by_source_and_the_manifest_is_heddle_wasms() {
    let src = tempfile::tempdir().unwrap();
    copy_dir(&workspace().join("sdk/c/template"), src.path());
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        out_dir: Some(out.path().into()),
        cache_dir: Some(cache.path().into()),
        ..BuildOptions::default()
    };
    let first = build_package(src.path(), &opts).unwrap();
    assert!(!first.cached);
    assert!(
        build_package(src.path(), &opts).unwrap().cached,
        "unchanged source is a cache hit"
    );
    let c = src.path().join("nodes.c");
    let text = std::fs::read_to_string(&c).unwrap();
    std::fs::write(&c, text.replace("shouted", "shouted loudly")).unwrap();
    assert!(
        !build_package(src.path(), &opts).unwrap().cached,
        "a changed source rebuilds"
    );

    // The written manifest is exactly what heddle-wasm reads (no [build] table left).
    let m = heddle_wasm::Manifest::read(&first.dir).unwrap();
    assert_eq!(m.name, "my-c-nodes");
    assert_eq!(m.component, "my-c-nodes.wasm");
    assert!(first.dir.join(&m.component).is_file());
}

#[test]
fn the_language_is_detected_from_the_sources() {
    use heddle_package_build::{Language, detect_language};
    let m = Path::new("heddle-package.toml");
    for (dir, lang) in [
        ("sdk/python/template", Language::Python),
        ("sdk/js/template", Language::JavaScript),
        ("sdk/c/template", Language::C),
        ("sdk/rust/template", Language::Rust),
    ] {
        assert_eq!(
            detect_language(&workspace().join(dir), None, m).unwrap(),
            lang,
            "{dir}"
        );
    }
    let mixed = tempfile::tempdir().unwrap();
    std::fs::write(mixed.path().join("a.py"), "").unwrap();
    std::fs::write(mixed.path().join("b.c"), "").unwrap();
    let err = detect_language(mixed.path(), None, m).unwrap_err();
    assert!(err.to_string().contains("python, c"), "{err}");
    assert!(detect_language(mixed.path(), Some("c"), m).is_ok());
    assert!(detect_language(mixed.path(), Some("cobol"), m).is_err());
}
