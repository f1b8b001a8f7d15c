//! Installing, pinning, verifying and loading packages; refusing bad ones with a message
//! that names the file and the problem.

mod common;

use std::path::Path;

use common::*;
use heddle_wasm::{PackageError, PackageStore, WasmPackage};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test]
async fn install_list_verify_load_remove() {
    let host = host();
    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    let pkg = store.install(&host, &package_dir("hostile")).await.unwrap();
    assert_eq!(pkg.name(), "hostile");
    assert!(
        pkg.declarations()
            .iter()
            .any(|d| d.type_name == "hostile.spin")
    );
    assert_eq!(
        pkg.declarations()[0].origin,
        heddle_core::Origin::Package {
            name: "hostile".into(),
            version: "0.1.0".into()
        }
    );

    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].sha256.len(), 64);
    let lock = std::fs::read_to_string(store.lockfile_path()).unwrap();
    assert!(lock.contains(&list[0].sha256));

    assert!(store.verify().unwrap().iter().all(|r| r.result.is_ok()));
    store.load(&host, "hostile").await.unwrap();

    store.remove("hostile").unwrap();
    assert!(store.list().unwrap().is_empty());
    assert!(matches!(
        store.load(&host, "hostile").await.unwrap_err(),
        PackageError::NotInstalled { .. }
    ));
}

#[tokio::test]
async fn changed_bytes_after_lock_are_refused() {
    let host = host();
    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    store.install(&host, &package_dir("hostile")).await.unwrap();
    let wasm = store
        .entry_dir(&store.list().unwrap()[0])
        .join("hostile.wasm");
    let mut bytes = std::fs::read(&wasm).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&wasm, &bytes).unwrap();

    let e = store.load(&host, "hostile").await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PackageError::Changed { .. }), "{msg}");
    assert!(
        msg.contains("hostile.wasm") && msg.contains("changed since it was locked"),
        "{msg}"
    );
    let reports = store.verify().unwrap();
    assert!(reports[0].result.is_err());

    // An edited manifest (e.g. new capability requests) is refused the same way.
    store.install(&host, &package_dir("hostile")).await.unwrap();
    let manifest = store
        .entry_dir(&store.list().unwrap()[0])
        .join("heddle-package.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("Never grant", "Please grant")).unwrap();
    let msg = store.load(&host, "hostile").await.unwrap_err().to_string();
    assert!(msg.contains("heddle-package.toml"), "{msg}");
}

#[tokio::test]
async fn bad_packages_are_refused_at_install_naming_file_and_problem() {
    let host = host();
    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());

    // Missing manifest.
    let empty = tempfile::tempdir().unwrap();
    let msg = store
        .install(&host, empty.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("heddle-package.toml") && msg.contains("missing"),
        "{msg}"
    );

    // Malformed manifest.
    let bad = tempfile::tempdir().unwrap();
    copy_dir(&package_dir("hostile"), bad.path());
    std::fs::write(
        bad.path().join("heddle-package.toml"),
        "name = \"x\"\nversion = 3\n",
    )
    .unwrap();
    let msg = store
        .install(&host, bad.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("heddle-package.toml") && msg.contains("malformed"),
        "{msg}"
    );

    // No `component` and nothing else wrong: a source folder, told how to build it.
    std::fs::write(
        bad.path().join("heddle-package.toml"),
        "name = \"x\"\nversion = \"1\"\n",
    )
    .unwrap();
    let e = store.install(&host, bad.path()).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PackageError::SourceDir { .. }), "{msg}");
    assert!(msg.contains("heddle package build"), "{msg}");

    // Component path escaping the package directory.
    std::fs::write(
        bad.path().join("heddle-package.toml"),
        "name = \"x\"\nversion = \"1\"\ncomponent = \"../x.wasm\"\n",
    )
    .unwrap();
    let msg = store
        .install(&host, bad.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("relative path inside"), "{msg}");

    // Missing component file.
    std::fs::write(
        bad.path().join("heddle-package.toml"),
        "name = \"x\"\nversion = \"1\"\ncomponent = \"nope.wasm\"\n",
    )
    .unwrap();
    let msg = store
        .install(&host, bad.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("nope.wasm") && msg.contains("does not exist"),
        "{msg}"
    );

    // Not a component at all.
    std::fs::write(bad.path().join("nope.wasm"), b"\0asm garbage").unwrap();
    let msg = store
        .install(&host, bad.path())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("nope.wasm") && msg.contains("not a valid WebAssembly component"),
        "{msg}"
    );

    // A component of another world.
    let msg = store
        .install(&host, &package_dir("mismatch"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("mismatch.wasm") && msg.contains("does not match the heddle:node WIT"),
        "{msg}"
    );

    // Built against an unsupported WIT version.
    let e = store
        .install(&host, &package_dir("future"))
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, PackageError::UnsupportedVersion { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("future.wasm") && msg.contains("heddle:node@0.9.0") && msg.contains("0.1.x"),
        "{msg}"
    );

    assert!(
        store.list().unwrap().is_empty(),
        "nothing bad was installed"
    );
}

#[tokio::test]
async fn compiled_code_is_cached_by_digest_and_engine_config() {
    let cache = tempfile::tempdir().unwrap();
    let mk = |fuel: bool| {
        heddle_wasm::WasmHost::new(heddle_wasm::EngineSettings {
            cache_dir: Some(cache.path().into()),
            fuel,
            ..Default::default()
        })
        .unwrap()
    };
    let count = || {
        std::fs::read_dir(cache.path())
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let h1 = mk(true);
    WasmPackage::load_dir(&h1, &package_dir("hostile"))
        .await
        .unwrap();
    assert_eq!(count(), 1);
    // Same engine configuration: served from the cache (no new entry).
    let h2 = mk(true);
    let p = WasmPackage::load_dir(&h2, &package_dir("hostile"))
        .await
        .unwrap();
    assert_eq!(count(), 1);
    assert!(!p.declarations().is_empty());
    // Another configuration (no fuel instrumentation) compiles separately.
    let h3 = mk(false);
    WasmPackage::load_dir(&h3, &package_dir("hostile"))
        .await
        .unwrap();
    assert_eq!(count(), 2);
    drop(p);
    // A corrupted cache entry is discarded and recompiled, not trusted. (Replaced by
    // rename, as the host writes them: a compiled artifact is mapped into memory, so
    // nothing may rewrite one in place while it is loaded.)
    for e in std::fs::read_dir(cache.path()).unwrap() {
        let path = e.unwrap().path();
        let tmp = path.with_extension("corrupt");
        std::fs::write(&tmp, b"corrupt").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    WasmPackage::load_dir(&mk(true), &package_dir("hostile"))
        .await
        .unwrap();
}

#[tokio::test]
async fn first_party_packages_load_by_default() {
    let p = first_party_provider(Default::default()).await;
    let names: Vec<String> = heddle_kernel::NodeProvider::declarations(&p)
        .iter()
        .map(|d| d.type_name.clone())
        .collect();
    for t in [
        "std.text.concat",
        "std.json.parse",
        "std.list.zip",
        "files.read_text",
        "files.write_text",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} missing from {names:?}");
    }
    let files = p.packages().iter().find(|p| p.name() == "files").unwrap();
    assert!(!files.requested_capabilities().is_empty());
    assert!(
        files.dir.starts_with("(built in)"),
        "loaded from the bytes embedded in the host, not from the build tree: {}",
        files.dir.display()
    );
}

#[tokio::test]
async fn engine_falls_back_when_the_pool_cannot_be_reserved() {
    // A pool far larger than any address space: the pooling allocator cannot start.
    let host = heddle_wasm::WasmHost::new(heddle_wasm::EngineSettings {
        cache_dir: Some(tmp_root().join("cache")),
        pool_instances: u32::MAX / 16,
        max_memory_mb: 4096,
        ..Default::default()
    })
    .unwrap();
    assert!(!host.is_pooling());
    let pkg = WasmPackage::load_dir(&host, &package_dir("hostile"))
        .await
        .unwrap();
    assert!(pkg.instantiate_only().await.is_ok());
    assert!(
        common::host().is_pooling(),
        "the default pool starts on this machine"
    );
}

#[test]
fn wit_versions_outside_0_1_and_0_2_are_unsupported() {
    assert!(heddle_wasm::wit_version_supported("0.1.0"));
    assert!(heddle_wasm::wit_version_supported("0.1.7"));
    assert!(heddle_wasm::wit_version_supported("0.2.0"));
    assert!(!heddle_wasm::wit_version_supported("0.3.0"));
    assert!(!heddle_wasm::wit_version_supported("1.1.0"));
}

#[tokio::test]
async fn provider_loads_first_party_and_installed_packages() {
    let store_dir = tempfile::tempdir().unwrap();
    PackageStore::open(store_dir.path())
        .install(&host(), &package_dir("hostile"))
        .await
        .unwrap();
    let config = heddle_wasm::WasmConfig {
        wasm: settings(),
        ..Default::default()
    };
    let p = heddle_wasm::WasmProvider::load(config, Some(store_dir.path()), None)
        .await
        .unwrap();
    let names: Vec<&str> = p.packages().iter().map(|p| p.name()).collect();
    let mut want = heddle_wasm::FIRST_PARTY.to_vec();
    want.push("hostile");
    assert_eq!(names, want);
}

#[tokio::test]
async fn a_graph_loads_and_compiles_only_the_packages_it_uses() {
    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    store
        .install(&host(), &package_dir("hostile"))
        .await
        .unwrap();
    assert!(
        store.list().unwrap()[0]
            .node_types
            .iter()
            .any(|t| t == "hostile.spin"),
        "install pins the node types the package declared"
    );
    // A machine that never compiled the package: its own, empty compile cache.
    let cache = tempfile::tempdir().unwrap();
    let compiled = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let run_host = || {
        let h = heddle_wasm::WasmHost::new(heddle_wasm::EngineSettings {
            cache_dir: Some(cache.path().into()),
            ..Default::default()
        })
        .unwrap();
        let seen = compiled.clone();
        h.on_compile(move |name| seen.lock().unwrap().push(name.to_string()));
        h
    };
    let config = || heddle_wasm::WasmConfig::default();

    let std_only: std::collections::BTreeSet<String> =
        ["heddle.input", "std.text.case"].map(String::from).into();
    let p = heddle_wasm::WasmProvider::load_on(
        run_host(),
        config(),
        Some(store_dir.path()),
        Some(&std_only),
    )
    .await
    .unwrap();
    let names: Vec<&str> = p.packages().iter().map(|p| p.name()).collect();
    assert_eq!(
        names,
        vec!["std"],
        "the unused packages (first-party `files` too) are not loaded"
    );
    assert_eq!(
        *compiled.lock().unwrap(),
        vec!["std"],
        "only the packages loaded were compiled"
    );

    let uses_hostile: std::collections::BTreeSet<String> =
        ["hostile.spin"].map(String::from).into();
    let p = heddle_wasm::WasmProvider::load_on(
        run_host(),
        config(),
        Some(store_dir.path()),
        Some(&uses_hostile),
    )
    .await
    .unwrap();
    let names: Vec<&str> = p.packages().iter().map(|p| p.name()).collect();
    assert_eq!(names, vec!["hostile"]);
    assert_eq!(
        compiled.lock().unwrap().last().map(String::as_str),
        Some("hostile"),
        "its first use compiles it, and says so"
    );
}

/// A manifest says how many invocations of a node type may run at once: the number
/// reaches the type's declaration (the first-party appends declare 128); a type the
/// component does not declare, or a number out of range, is refused at install, naming
/// the file and the entry; a type it does not list runs one at a time.
#[tokio::test]
async fn a_manifest_declares_how_many_invocations_of_a_type_run_at_once() {
    let host = host();
    let first = first_party_provider(Default::default()).await;
    let decl = |p: &dyn heddle_kernel::NodeProvider, t: &str| {
        p.declarations()
            .into_iter()
            .find(|d| d.type_name == t)
            .unwrap_or_else(|| panic!("no {t}"))
    };
    assert_eq!(decl(&first, "files.write_text").max_concurrent(), 128);
    assert_eq!(decl(&first, "std.text.case").max_concurrent(), 1);
    // The operator's grant narrows it, never widens it.
    for (cap, want_write, want_case) in [(4, 4, 1), (1, 1, 1), (128, 128, 1)] {
        let mut config = heddle_wasm::WasmConfig::default();
        for pkg in ["files", "std"] {
            config.packages.insert(
                pkg.into(),
                heddle_wasm::PackageGrant {
                    concurrency: Some(cap),
                    ..Default::default()
                },
            );
        }
        let capped = first_party_provider(config).await;
        assert_eq!(
            decl(&capped, "files.write_text").max_concurrent(),
            want_write
        );
        assert_eq!(decl(&capped, "std.text.case").max_concurrent(), want_case);
    }
    for bad in ["0", "129"] {
        let e = heddle_wasm::WasmConfig::from_toml_str(&format!(
            "[packages.files]\nconcurrency = {bad}\n"
        ))
        .unwrap_err();
        // The key and range are in the TOML error the config error keeps as its source.
        let source = std::error::Error::source(&e).map(ToString::to_string);
        let e = format!("{e}: {}", source.unwrap_or_default());
        assert!(
            e.contains("concurrency") && e.contains("from "),
            "{bad}: {e}"
        );
    }

    let store_dir = tempfile::tempdir().unwrap();
    let store = PackageStore::open(store_dir.path());
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&package_dir("hostile"), dir.path());
    let manifest = dir.path().join("heddle-package.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    for (entry, problem) in [
        ("\"hostile.nope\" = 4", "declares no such node type"),
        ("\"hostile.read\" = 0", "give 1 to 128"),
        ("\"hostile.read\" = 129", "give 1 to 128"),
    ] {
        std::fs::write(&manifest, format!("{text}\n[concurrency]\n{entry}\n")).unwrap();
        let msg = store
            .install(&host, dir.path())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("heddle-package.toml")
                && msg.contains("concurrency.")
                && msg.contains(problem),
            "{entry}: {msg}"
        );
    }
    std::fs::write(
        &manifest,
        format!("{text}\n[concurrency]\n\"hostile.read\" = 8\n"),
    )
    .unwrap();
    let pkg = store.install(&host, dir.path()).await.unwrap();
    let read = pkg
        .declarations()
        .iter()
        .find(|d| d.type_name == "hostile.read")
        .unwrap();
    assert_eq!(read.max_concurrent(), 8);
    let spin = pkg
        .declarations()
        .iter()
        .find(|d| d.type_name == "hostile.spin")
        .unwrap();
    assert_eq!(spin.max_concurrent(), 1);
}

/// Which first-party package a graph needs is read off its node types' names, before
/// any is compiled: each first-party type is named after its package.
#[tokio::test]
async fn every_first_party_node_type_is_named_after_its_package() {
    let config = heddle_wasm::WasmConfig {
        wasm: settings(),
        ..Default::default()
    };
    let p = heddle_wasm::WasmProvider::load(config, None, None)
        .await
        .unwrap();
    assert_eq!(p.packages().len(), heddle_wasm::FIRST_PARTY.len());
    for pkg in p.packages() {
        for d in pkg.declarations() {
            assert!(
                d.type_name.starts_with(&format!("{}.", pkg.name())),
                "{} of package {}",
                d.type_name,
                pkg.name()
            );
        }
    }
}
