//! Building from source: compiler errors point at the author's file and line, the build
//! cache key, language detection.

use super::*;

/// The C template built against the 0.1 WIT relabelled `version`, installed.
async fn install_relabelled(version: &str) -> PackageError {
    let wit = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(workspace().join("wit/node.wit")).unwrap();
    let other = text.replace(
        "package heddle:node@0.1.0;",
        &format!("package heddle:node@{version};"),
    );
    assert_ne!(text, other, "the WIT declares heddle:node@0.1.0");
    std::fs::write(wit.path().join("node.wit"), other).unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        wit: Some(wit_in(wit.path()).unwrap()),
        out_dir: Some(out.path().to_path_buf()),
        cache_dir: None,
        ..BuildOptions::default()
    };
    let pkg = build_package(&workspace().join("sdk/c/template"), &opts).unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    PackageStore::open(store_dir.path())
        .install(&host(), &pkg.dir)
        .await
        .expect_err("a contract the component does not implement")
}

/// A version outside the supported range (0.1 and 0.2) is refused as such, naming both;
/// a component that claims 0.2.0 but implements 0.1's world (no `controlled` export) is
/// refused as not matching the contract it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_built_against_another_wit_version_is_refused() {
    let err = install_relabelled("0.3.0").await;
    assert!(
        matches!(err, PackageError::UnsupportedVersion { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("0.3.0") && msg.contains("0.1.x") && msg.contains("0.2.x"),
        "{msg}"
    );
    let err = install_relabelled("0.2.0").await;
    assert!(matches!(err, PackageError::WitLink { .. }), "{err:?}");
    let msg = format!("{err:?}");
    assert!(msg.contains("controlled"), "{msg}");
}

/// The SDKs build against 0.2 by default; the C SDK still builds against the 0.1 WIT
/// (`--wit`, for a host older than 0.2), without its control half: the package exports
/// 0.1, loads beside 0.2 ones and runs, and its controlled node is a plain one there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_sdk_builds_against_0_2_by_default_and_still_against_0_1() {
    let exports = |pkg: &heddle_wasm::WasmPackage| {
        pkg.world()
            .0
            .into_iter()
            .filter(|e| e.starts_with("heddle:node/node@"))
            .collect::<Vec<_>>()
    };
    let mode = |pkg: &heddle_wasm::WasmPackage, ty: &str| {
        pkg.declarations()
            .iter()
            .find(|d| d.type_name == ty)
            .map(|d| d.mode)
            .unwrap_or_else(|| panic!("no {ty}"))
    };
    let current = built("sdk/c/examples/cstrings");
    let pkg = heddle_wasm::WasmPackage::load_dir(&host(), &current.dir)
        .await
        .unwrap();
    assert_eq!(exports(&pkg), ["heddle:node/node@0.2.0"]);
    assert_eq!(
        mode(&pkg, "cstrings.pad"),
        heddle_core::NodeMode::Controlled
    );

    let out = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        wit: Some(wit_in(&workspace().join("wit")).unwrap()),
        out_dir: Some(out.path().to_path_buf()),
        cache_dir: None,
        ..BuildOptions::default()
    };
    let old = build_package(&workspace().join("sdk/c/examples/cstrings"), &opts).unwrap();
    let pkg = heddle_wasm::WasmPackage::load_dir(&host(), &old.dir)
        .await
        .unwrap();
    assert_eq!(exports(&pkg), ["heddle:node/node@0.1.0"]);
    assert_ne!(
        mode(&pkg, "cstrings.pad"),
        heddle_core::NodeMode::Controlled
    );
    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    store.install(&host(), &old.dir).await.unwrap();
    let mut p = WasmProvider::new(host(), WasmConfig::default());
    p.add(store.load(&host(), "cstrings").await.unwrap())
        .unwrap();
    let out = invoke(
        &p,
        "cstrings.pad",
        &[("text", Value::str("ab")), ("width", Value::Int(4))],
        None,
    )
    .await
    .unwrap();
    assert_eq!(out.get("text"), Some(&Value::str("ab..")));
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
