//! Builds the first-party node packages (`plugins/std`, `plugins/files`, `plugins/http`) for
//! wasm32-wasip2, assembles their package directories under `$OUT_DIR/packages` and
//! writes `$OUT_DIR/packages/embedded.rs`, which embeds them in the host: a plain
//! `cargo build` produces a host that has them, with no manual step, and the binary
//! keeps them when it is installed or copied away from the build tree.
//!
//! The plugins are their own cargo workspace with their own target dir
//! (`plugins/target`), so this nested build never waits on the outer build's lock.
//! `HEDDLE_SKIP_PLUGIN_BUILD=1` skips the nested build and reuses whatever
//! `plugins/target` already holds.
//!
//! rustup installs the targets `rust-toolchain.toml` lists only when it installs the
//! toolchain itself; a machine that already had the toolchain lacks `wasm32-wasip2`.
//! So before the nested build this script checks the sysroot of the compiler cargo is
//! using and, when the target is missing, adds it with rustup for that toolchain: the
//! README's first command works without a setup step.

use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGES: &[(&str, &str, &str)] = &[
    // (package name, plugin dir, cargo package)
    ("std", "std", "heddle-std"),
    ("files", "files", "heddle-files"),
    ("http", "http", "heddle-http"),
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
        ensure_wasm_target();
        build_plugins(&plugins);
    }
    let release = plugins.join("target/wasm32-wasip2/release");
    let mut embedded = Vec::new();
    for (name, dir, krate) in PACKAGES {
        let wasm = release.join(format!("{}.wasm", krate.replace('-', "_")));
        if !wasm.is_file() {
            println!(
                "cargo:warning=first-party package `{name}` is missing ({} not built); the host will start without it",
                wasm.display()
            );
            continue;
        }
        embedded.push(assemble(&out.join(name), &plugins.join(dir), &wasm, name));
    }
    write_embedded(&out.join("embedded.rs"), &embedded);
    println!(
        "cargo:rustc-env=HEDDLE_EMBEDDED_PACKAGES={}",
        out.join("embedded.rs").display()
    );
}

/// The package files the host embeds: (name, manifest path, component path).
type Assembled = (&'static str, PathBuf, PathBuf);

/// Writes the list of embedded first-party packages that `src/first_party.rs` includes,
/// so a `heddle` binary carries them wherever it is installed or copied.
fn write_embedded(path: &Path, packages: &[Assembled]) {
    let mut text = String::from("&[\n");
    for (name, manifest, component) in packages {
        // `{:?}` of a str is a valid Rust string literal, escapes included.
        text.push_str(&format!(
            "    Embedded {{ name: {name:?}, manifest: include_str!({:?}), component: include_bytes!({:?}) }},\n",
            manifest.display().to_string(),
            component.display().to_string()
        ));
    }
    text.push(']');
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create OUT_DIR/packages");
    }
    std::fs::write(path, text).expect("write the embedded package list in OUT_DIR");
}

const WASM_TARGET: &str = "wasm32-wasip2";

/// Adds the wasm target to the toolchain cargo is using when its sysroot lacks it.
fn ensure_wasm_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .unwrap_or_else(|e| panic!("could not run `{rustc} --print sysroot`: {e}"));
    if !out.status.success() {
        panic!(
            "`{rustc} --print sysroot` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if has_std(&sysroot.join("lib/rustlib").join(WASM_TARGET).join("lib")) {
        return;
    }
    // The proxy names the toolchain it picked; a cargo run without the proxy still has
    // a sysroot under rustup's `toolchains/<name>`.
    let toolchain = std::env::var("RUSTUP_TOOLCHAIN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| {
            let parent = sysroot.parent()?;
            (parent.file_name()? == "toolchains")
                .then(|| sysroot.file_name()?.to_str().map(str::to_string))?
        });
    let Some(rustup) = find_rustup() else {
        panic!(
            "the {WASM_TARGET} target (needed to build the first-party node packages) is not installed for the Rust toolchain at {}, and rustup was not found to add it; install the target for that toolchain (with rustup: `rustup target add {WASM_TARGET}`) and build again",
            sysroot.display()
        );
    };
    let Some(toolchain) = toolchain else {
        panic!(
            "the {WASM_TARGET} target (needed to build the first-party node packages) is not installed for the Rust toolchain at {}, which is not a rustup toolchain; install the target for it and build again",
            sysroot.display()
        );
    };
    // Build scripts' stderr is shown only on failure; the warning tells a user who
    // watched a long pause what happened.
    println!(
        "cargo:warning=installed the {WASM_TARGET} target for toolchain `{toolchain}` (needed to build the first-party node packages): {} target add {WASM_TARGET} --toolchain {toolchain}",
        rustup.display()
    );
    eprintln!("installing the {WASM_TARGET} target for toolchain `{toolchain}`");
    let status = Command::new(&rustup)
        .args(["target", "add", WASM_TARGET, "--toolchain", &toolchain])
        .status()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", rustup.display()));
    if !status.success() {
        panic!(
            "`{} target add {WASM_TARGET} --toolchain {toolchain}` failed ({status}); the {WASM_TARGET} target is needed to build the first-party node packages",
            rustup.display()
        );
    }
}

/// Whether a target's library directory holds its `std` (rustup leaves the directory
/// behind when it removes a target).
fn has_std(libdir: &Path) -> bool {
    std::fs::read_dir(libdir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libstd-") && name.ends_with(".rlib")
        })
    })
}

/// rustup on PATH, else where rustup-init puts it (`$CARGO_HOME/bin`, `~/.cargo/bin`).
fn find_rustup() -> Option<PathBuf> {
    let on_path = Command::new("rustup")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if on_path {
        return Some(PathBuf::from("rustup"));
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    Some(cargo_home.join("bin/rustup")).filter(|p| p.is_file())
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

fn assemble(dest: &Path, src: &Path, wasm: &Path, name: &'static str) -> Assembled {
    std::fs::create_dir_all(dest).expect("create package dir in OUT_DIR");
    let manifest = std::fs::read_to_string(src.join("heddle-package.toml"))
        .unwrap_or_else(|e| panic!("{}: {e}", src.join("heddle-package.toml").display()));
    let manifest_path = dest.join("heddle-package.toml");
    std::fs::write(&manifest_path, manifest).expect("write manifest");
    let component = dest.join(format!("{name}.wasm"));
    std::fs::copy(wasm, &component).expect("copy component");
    (name, manifest_path, component)
}
