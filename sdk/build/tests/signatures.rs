//! Failure signatures as each SDK hands them to the host: a well-formed one arrives
//! intact; a malformed one (which the supervisor would ignore) is refused where the
//! author wrote it, with a message naming it; one that still reaches the host (an old
//! SDK, hand-written bindings) is reported as a warning naming the node. Also the C
//! SDK's JSON builder, through the C example's object output.
//!
//! Packages are built from source like `guest_languages.rs` does, into the same cache
//! (`target/heddle-test-cache`), so the two test binaries share the builds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use heddle_core::{EventKind, LogLevel, Value};
use heddle_kernel::{
    Call, CtxParts, ErrorKind, EventSink, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs,
    SecretRegistry,
};
use heddle_package_build::{BuildOptions, build_package};
use heddle_wasm::{EngineSettings, WasmConfig, WasmHost, WasmPackage, WasmProvider};
use tokio_util::sync::CancellationToken;

const MALFORMED: &str = "mypython.wordfreq:empty-text";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the package source folder `rel` and loads it into a provider of its own.
async fn provider(rel: &str) -> WasmProvider {
    let cache = workspace().join("target/heddle-test-cache");
    let name = Path::new(rel).file_name().unwrap().to_owned();
    let opts = BuildOptions {
        out_dir: Some(cache.join("packages").join(name)),
        cache_dir: Some(cache.join("builds")),
        ..BuildOptions::default()
    };
    let built = build_package(&workspace().join(rel), &opts)
        .unwrap_or_else(|e| panic!("building {rel} failed: {e}"));
    let host = WasmHost::new(EngineSettings {
        cache_dir: Some(cache.join("wasm")),
        ..EngineSettings::default()
    })
    .expect("wasm engine starts");
    let pkg = WasmPackage::load_dir(&host, &built.dir)
        .await
        .unwrap_or_else(|e| panic!("loading {rel}: {e}"));
    let mut provider = WasmProvider::new(host, WasmConfig::default());
    provider.add(pkg).unwrap();
    provider
}

#[derive(Default)]
struct Events(Mutex<Vec<EventKind>>);
impl EventSink for Events {
    fn emit(&self, event: EventKind) {
        self.0.lock().unwrap().push(event);
    }
}

impl Events {
    fn warnings(&self) -> Vec<(String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                EventKind::Log {
                    node_id,
                    level: LogLevel::Warn,
                    message,
                } => Some((node_id.clone(), message.clone())),
                _ => None,
            })
            .collect()
    }
}

/// One invocation of `type_name` as graph node `node-7`, through the executor seam, to
/// see the whole `NodeError` and the events it logged.
async fn invoke(
    provider: &WasmProvider,
    type_name: &str,
    inputs: &[(&str, Value)],
) -> (Result<Outputs, NodeError>, Arc<Events>) {
    let decl = provider
        .declarations()
        .into_iter()
        .find(|d| d.type_name == type_name)
        .unwrap_or_else(|| panic!("no node type {type_name}"));
    let exec = provider
        .create(&NodeSpec {
            id: "node-7",
            decl: &decl,
            properties: &BTreeMap::new(),
            limits: None,
        })
        .unwrap();
    let events = Arc::new(Events::default());
    let ctx = NodeCtx::new(CtxParts {
        node_id: "node-7".into(),
        node_type: type_name.into(),
        key: "".into(),
        cancel: CancellationToken::new(),
        deadline: None,
        events: events.clone(),
        emit: None,
        secrets: Arc::new(SecretRegistry::default()),
    });
    let inputs = inputs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    (exec.invoke(Call { inputs, ctx }).await, events)
}

/// Fails `kit.fail_with` with `signature` and returns the node error and the warnings.
async fn fail_with(
    p: &WasmProvider,
    type_name: &str,
    signature: &str,
) -> (NodeError, Vec<(String, String)>) {
    let (r, events) = invoke(p, type_name, &[("signature", Value::str(signature))]).await;
    let err = r.expect_err("the node fails on purpose");
    assert_eq!(err.kind, ErrorKind::Node, "{err:?}");
    (err, events.warnings())
}

/// What every SDK says about a refused signature, wherever the message is shown.
fn assert_refused(err: &NodeError) {
    let m = &err.message;
    assert!(
        m.contains(&format!("invalid failure signature \"{MALFORMED}\"")),
        "names the signature: {m}"
    );
    assert!(
        m.contains("the family before ':' must be a lowercase letter"),
        "says why: {m}"
    );
    assert!(m.contains("asked to fail"), "keeps the original error: {m}");
    assert_ne!(err.signature.as_deref(), Some(MALFORMED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_refuses_a_malformed_signature_where_it_is_written() {
    let p = provider("sdk/build/tests/fixtures/pykit").await;
    let (ok, warnings) = fail_with(&p, "pykit.fail_with", "pykit:asked").await;
    assert_eq!(ok.signature.as_deref(), Some("pykit:asked"));
    assert_eq!(ok.message, "asked to fail");
    assert!(warnings.is_empty(), "{warnings:?}");

    let (err, _) = fail_with(&p, "pykit.fail_with", MALFORMED).await;
    assert_refused(&err);
    assert!(
        err.message.contains("app.py:"),
        "the author's line: {}",
        err.message
    );
    // Refusing is an exception like any other in Python nodes.
    assert_eq!(err.signature.as_deref(), Some("python:SignatureError"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_refuses_a_malformed_signature_where_it_is_written() {
    let p = provider("sdk/build/tests/fixtures/jskit").await;
    let (ok, warnings) = fail_with(&p, "jskit.fail_with", "jskit:asked").await;
    assert_eq!(ok.signature.as_deref(), Some("jskit:asked"));
    assert_eq!(ok.message, "asked to fail");
    assert!(warnings.is_empty(), "{warnings:?}");

    let (err, _) = fail_with(&p, "jskit.fail_with", MALFORMED).await;
    assert_refused(&err);
    assert_eq!(err.signature.as_deref(), Some("js:SignatureError"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_refuses_a_malformed_signature_where_it_is_written() {
    let p = provider("sdk/build/tests/fixtures/ckit").await;
    let (ok, warnings) = fail_with(&p, "ckit.fail_with", "ckit:asked").await;
    assert_eq!(ok.signature.as_deref(), Some("ckit:asked"));
    assert_eq!(ok.message, "asked to fail");
    assert!(warnings.is_empty(), "{warnings:?}");

    let (err, _) = fail_with(&p, "ckit.fail_with", MALFORMED).await;
    assert_refused(&err);
    assert!(
        err.message.contains("kit.c:"),
        "the author's line: {}",
        err.message
    );
    assert_eq!(err.signature, None);

    let (err, _) = fail_with(&p, "ckit.fail_with", "limit:fuel").await;
    assert!(err.message.contains("reserved"), "{}", err.message);
    assert_eq!(err.signature, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_signature_reaching_the_host_is_a_warning_naming_the_node() {
    // `pykit.fail_raw` hands the host its error through the generated bindings, past
    // the SDK's check, as a package built with an older SDK would.
    let p = provider("sdk/build/tests/fixtures/pykit").await;
    let (err, warnings) = fail_with(&p, "pykit.fail_raw", MALFORMED).await;
    assert_eq!(err.message, "asked to fail");
    assert_eq!(
        err.signature, None,
        "the host keeps no signature it cannot use"
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (node, message) = &warnings[0];
    assert_eq!(node, "node-7");
    assert!(
        message.contains("node `node-7` (pykit.fail_raw)"),
        "{message}"
    );
    assert!(
        message.contains(&format!("ignored failure signature \"{MALFORMED}\"")),
        "{message}"
    );

    let (ok, warnings) = fail_with(&p, "pykit.fail_raw", "pykit:raw").await;
    assert_eq!(ok.signature.as_deref(), Some("pykit:raw"));
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_json_builder_makes_an_object_output_with_escaped_strings() {
    let p = provider("sdk/c/examples/cstrings").await;
    let text = "a \"quoted\"\tword\n\\ end";
    let (r, _) = invoke(&p, "cstrings.word_stats", &[("text", Value::str(text))]).await;
    let out = r.expect("word_stats succeeds");
    let stats = out.get("stats").expect("stats output").to_json();
    assert_eq!(
        stats,
        serde_json::json!({
            "words": 5,
            "longest": "\"quoted\"",
            "mean_length": 17.0 / 5.0,
            "empty": false,
        })
    );

    let (r, _) = invoke(&p, "cstrings.word_stats", &[("text", Value::str(" \n "))]).await;
    let stats = r.unwrap().get("stats").unwrap().to_json();
    assert_eq!(
        stats,
        serde_json::json!({"words": 0, "longest": "", "mean_length": null, "empty": true})
    );
}
