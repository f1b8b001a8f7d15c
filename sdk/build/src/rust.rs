//! Rust guests: `cargo build --release --target wasm32-wasip2` emits a component
//! directly (the crate uses `heddle-sdk`; see sdk/rust).

use std::path::{Path, PathBuf};

use crate::{BuildError, BuildOptions, command, run_tool};

pub fn build(src: &Path, out: &Path, opts: &BuildOptions) -> Result<(), BuildError> {
    ensure_target(opts)?;
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let target_dir = src.join("target");
    let mut cmd = command(&cargo, opts.nice);
    cmd.args([
        "build",
        "--release",
        "--target",
        "wasm32-wasip2",
        "--manifest-path",
    ])
    .arg(src.join("Cargo.toml"))
    .arg("--target-dir")
    .arg(&target_dir)
    .arg("--message-format=short");
    run_tool("cargo", cmd, src)?;
    let release = target_dir.join("wasm32-wasip2/release");
    let wasm = crate::list_files(&release, &["wasm"])?;
    match wasm.as_slice() {
        [one] => std::fs::copy(one, out)
            .map(|_| ())
            .map_err(|e| BuildError::io(one, e)),
        _ => Err(BuildError::NoEntry {
            dir: src.to_path_buf(),
            expected: format!(
                "exactly one cdylib .wasm in {} (found {})",
                release.display(),
                wasm.len()
            ),
        }),
    }
}

/// With rustup, makes sure the `wasm32-wasip2` target is installed (adding it when
/// allowed), so a missing target is one clear message instead of cargo's
/// "can't find crate for `core`". Without rustup the build says what is wrong itself.
fn ensure_target(opts: &BuildOptions) -> Result<(), BuildError> {
    let installed = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == "wasm32-wasip2")
    };
    let Ok(out) = std::process::Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
    else {
        return Ok(());
    };
    if installed(&out) {
        return Ok(());
    }
    if opts.toolchains.install_missing {
        let mut cmd = std::process::Command::new("rustup");
        cmd.args(["target", "add", "wasm32-wasip2"]);
        return run_tool("rustup target add", cmd, Path::new("."));
    }
    Err(BuildError::MissingTool {
        tool: "the wasm32-wasip2 Rust target".into(),
        hint: "rustup target add wasm32-wasip2".into(),
    })
}
