//! Builds the first-party node packages (`plugins/std`, `plugins/files`) for
//! wasm32-wasip2 and assembles their package directories under `$OUT_DIR/packages`, so
//! a plain `cargo build` produces a host that has them, with no manual step.
//!
//! The plugins are their own cargo workspace with their own target dir
//! (`plugins/target`), so this nested build never waits on the outer build's lock.
//! `HEDDLE_SKIP_PLUGIN_BUILD=1` skips the nested build and reuses whatever
//! `plugins/target` already holds.

use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGES: &[(&str, &str, &str)] = &[
    // (package name, plugin dir, cargo package)
    ("std", "std", "heddle-std"),
    ("files", "files", "heddle-files"),
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir.join("../..");
    let plugins = root.join("plugins");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("packages");

    for p in [
        plugins.join("Cargo.toml"),
        plugins.join("Cargo.lock"),
        root.join("sdk/rust/src"),
        root.join("sdk/rust/Cargo.toml"),
        root.join("wit"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    for (_, dir, _) in PACKAGES {
        println!("cargo:rerun-if-changed={}", plugins.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=HEDDLE_SKIP_PLUGIN_BUILD");
    println!("cargo:rustc-env=HEDDLE_FIRST_PARTY_DIR={}", out.display());
    println!(
        "cargo:rustc-env=HEDDLE_PLUGINS_DIR={}",
        plugins.canonicalize().unwrap_or(plugins.clone()).display()
    );

    let skip = std::env::var("HEDDLE_SKIP_PLUGIN_BUILD").is_ok_and(|v| v == "1");
    if !skip {
        build_plugins(&plugins);
    }
    let release = plugins.join("target/wasm32-wasip2/release");
    for (name, dir, krate) in PACKAGES {
        let wasm = release.join(format!("{}.wasm", krate.replace('-', "_")));
        if !wasm.is_file() {
            println!(
                "cargo:warning=first-party package `{name}` is missing ({} not built); the host will start without it",
                wasm.display()
            );
            continue;
        }
        assemble(&out.join(name), &plugins.join(dir), &wasm, name);
    }
}

fn build_plugins(plugins: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(plugins)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(plugins.join("target"));
    for (_, _, krate) in PACKAGES {
        cmd.args(["-p", krate]);
    }
    // The outer build's settings describe the host build, not this one.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "building the first-party node packages failed ({s}); run `cargo build --release --target wasm32-wasip2` in {} to see why (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)",
            plugins.display()
        ),
        Err(e) => panic!("could not run cargo to build the first-party node packages: {e}"),
    }
}

fn assemble(dest: &Path, src: &Path, wasm: &Path, name: &str) {
    std::fs::create_dir_all(dest).expect("create package dir in OUT_DIR");
    let manifest = std::fs::read_to_string(src.join("heddle-package.toml"))
        .unwrap_or_else(|e| panic!("{}: {e}", src.join("heddle-package.toml").display()));
    std::fs::write(dest.join("heddle-package.toml"), manifest).expect("write manifest");
    std::fs::copy(wasm, dest.join(format!("{name}.wasm"))).expect("copy component");
}
