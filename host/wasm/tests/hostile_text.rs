//! Text a package supplies (titles, descriptions, capability reasons, error messages,
//! log lines) reaches the operator escaped and bounded: it can neither forge a line nor
//! drive the terminal.

mod common;

use common::*;
use heddle_kernel::NodeProvider;
use heddle_wasm::{WasmConfig, WasmPackage};

/// No control character survives (newlines allowed only where `multiline`).
fn assert_clean(what: &str, s: &str, multiline: bool) {
    assert!(
        !s.chars()
            .any(|c| c.is_control() && !(multiline && c == '\n')),
        "{what} holds a raw control character: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarations_and_capability_reasons_are_escaped_and_bounded() {
    let pkg = WasmPackage::load_dir(&host(), &package_dir("spoof"))
        .await
        .unwrap();
    let d = &pkg.declarations()[0];
    assert_clean("title", &d.title, false);
    assert!(
        d.title.contains("\\u{1b}"),
        "escape made visible: {}",
        d.title
    );
    assert_clean("description", &d.description, true);
    for p in &d.inputs {
        assert_clean("port description", &p.description, false);
    }
    for c in &d.capabilities {
        assert_clean("capability target", &c.target, false);
        assert_clean("capability reason", &c.reason, false);
        assert!(c.reason.len() <= 1024, "reason of {} bytes", c.reason.len());
    }
    for c in &pkg.manifest.capabilities {
        assert_clean("manifest reason", &c.reason, false);
    }
    for (what, reasons) in pkg.requested_capabilities() {
        assert_clean("capability", &what, false);
        for r in reasons {
            assert_clean("reason", &r, false);
        }
    }
}

/// A capability target is matched against the operator's grant and shown to them: one
/// holding a control character is refused, as a name is, in a declaration or in the
/// manifest, never accepted in escaped form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_target_with_control_characters_is_refused() {
    let Err(e) = WasmPackage::load_dir(&host(), &package_dir("bad-target")).await else {
        panic!("a declared target with a newline loaded");
    };
    assert!(
        matches!(e, heddle_wasm::PackageError::BadDecl { .. }) && e.is_bad_request(),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("node declaration `bad_target.node` is invalid: capability target HOME\\n  granted\\u{1b}[2J must not contain control"),
        "{text}"
    );
    // The same target in the manifest of a package otherwise fine.
    let dir = tempfile::tempdir().unwrap();
    for f in ["heddle-package.toml", "spoof.wasm"] {
        std::fs::copy(package_dir("spoof").join(f), dir.path().join(f)).unwrap();
    }
    let manifest = dir.path().join("heddle-package.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("target = \"HOME\"", "target = \"HOME\\u001b[2J\"");
    std::fs::write(&manifest, text).unwrap();
    let Err(e) = WasmPackage::load_dir(&host(), dir.path()).await else {
        panic!("a manifest target with an escape loaded");
    };
    assert!(
        matches!(e, heddle_wasm::PackageError::BadManifest { .. }),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("capability target HOME\\u{1b}[2J"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_error_messages_and_log_lines_are_escaped() {
    let p = hostile_provider(WasmConfig::default()).await;
    let (r, _, _) = invoke(&p, "hostile.spoofed_error", inputs([]), None).await;
    let e = r.unwrap_err();
    assert_clean("error message", &e.message, false);
    assert!(
        e.message.contains("\\n"),
        "newline made visible: {}",
        e.message
    );

    let (r, _, h) = invoke(&p, "hostile.spoofed_log", inputs([]), None).await;
    r.unwrap();
    let logs = h.sink.logs();
    assert!(logs.iter().any(|l| l.contains("trust me")), "{logs:?}");
    for l in &logs {
        assert_clean("log line", l, false);
    }
    let _ = p.declarations();
}
