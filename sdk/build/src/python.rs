//! Python guests via `componentize-py`: it generates the `wit_world` bindings from the
//! WIT at build time and snapshots CPython with the app module imported.

use std::path::Path;

use crate::{BuildError, BuildOptions, Wit, command, run_tool};

pub fn build(
    src: &Path,
    wit: &Wit,
    work: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<(), BuildError> {
    let tool = opts.toolchains.componentize_py()?;
    let manifest = crate::manifest::SourceManifest::load(&src.join(crate::MANIFEST_FILE))?;
    let entry = match manifest.entry {
        Some(e) => e.trim_end_matches(".py").to_string(),
        None if src.join("app.py").is_file() => "app".into(),
        None => {
            return Err(BuildError::NoEntry {
                dir: src.to_path_buf(),
                expected: "app.py, or `entry = \"module\"` under [build]".into(),
            });
        }
    };
    if !src.join(format!("{entry}.py")).is_file() && !src.join(&entry).join("__init__.py").is_file()
    {
        return Err(BuildError::NoEntry {
            dir: src.to_path_buf(),
            expected: format!("{entry}.py"),
        });
    }
    let sdk = crate::sdkfiles::write_python(work, &entry)?;
    // The node world plus outgoing HTTP, so `heddle.http` has bindings to call.
    let wit = crate::wasi_http::with_outgoing_http(wit, work)?;
    let mut cmd = command(&tool, opts.nice);
    cmd.arg("-d")
        .arg(&wit.dir)
        .arg("-w")
        .arg(&wit.world)
        .arg("componentize")
        .arg("-p")
        .arg(src)
        .arg("-p")
        .arg(&sdk)
        .arg(crate::sdkfiles::PYTHON_MAIN_MODULE)
        .arg("-o")
        .arg(out)
        // Keep Python from writing __pycache__ into the author's folder.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // The tool's own Rust backtrace says nothing about the author's code.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    run_tool("componentize-py", cmd, src).map_err(|e| readable(e, src, &sdk))
}

/// componentize-py names the folders of its Python path `/0`, `/1`, ... in tracebacks;
/// put the real paths back so the message says which file to fix, and drop the
/// tool's own stack trace.
fn readable(err: BuildError, src: &Path, sdk: &Path) -> BuildError {
    match err {
        BuildError::Tool { tool, dir, output } => {
            let mut text = output
                .split("\nStack backtrace:")
                .next()
                .unwrap_or_default()
                .to_string();
            text = text.replace("\"/0/", &format!("\"{}/", src.display()));
            text = text.replace("\"/1/", &format!("\"{}/", sdk.display()));
            BuildError::Tool {
                tool,
                dir,
                output: text.trim_end().to_string(),
            }
        }
        other => other,
    }
}
