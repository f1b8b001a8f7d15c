//! JavaScript guests via `componentize-js` (StarlingMonkey). It reads the entry and
//! its relative imports from disk while snapshotting, so the sources are copied into
//! a scratch folder next to the SDK's `heddle.js`, which the entry imports as
//! `./heddle.js`.

use std::path::Path;

use crate::{BuildError, BuildOptions, Wit, command, run_tool};

pub fn build(
    src: &Path,
    wit: &Wit,
    work: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<(), BuildError> {
    let tool = opts.toolchains.componentize_js()?;
    let manifest = crate::manifest::SourceManifest::load(&src.join(crate::MANIFEST_FILE))?;
    let entry = match manifest.entry {
        Some(e) => e,
        None => ["index.js", "node.js", "main.js"]
            .into_iter()
            .find(|f| src.join(f).is_file())
            .map(str::to_string)
            .ok_or_else(|| BuildError::NoEntry {
                dir: src.to_path_buf(),
                expected: "index.js, or `entry = \"file.js\"` under [build]".into(),
            })?,
    };
    if !src.join(&entry).is_file() {
        return Err(BuildError::NoEntry {
            dir: src.to_path_buf(),
            expected: entry,
        });
    }
    let staged = work.join("src");
    copy_tree(src, &staged)?;
    crate::sdkfiles::write_js(&staged, &crate::wit_version(wit)?)?;
    syntax_check(src, &staged)?;
    let mut cmd = command(&tool, opts.nice);
    cmd.arg(staged.join(&entry))
        .arg("--wit")
        .arg(&wit.dir)
        .arg("--world-name")
        .arg(&wit.world)
        // `fetch()` stays (the host offers wasi:http's outgoing handler, and reaches only
        // what the operator grants); a node package handles no incoming requests.
        .args(["-d", "fetch-event"])
        .arg("-o")
        .arg(out);
    run_tool("componentize-js", cmd, src)
}

/// componentize-js reports a syntax error without saying where; `node --check` does
/// (file, line and a caret), so every module is checked first when Node is around.
fn syntax_check(src: &Path, staged: &Path) -> Result<(), BuildError> {
    let package_json = staged.join("package.json");
    if !package_json.is_file() {
        // Parse *.js as ES modules, as componentize-js does.
        std::fs::write(&package_json, "{\"type\": \"module\"}\n")
            .map_err(|e| BuildError::io(&package_json, e))?;
    }
    let mut files = Vec::new();
    collect_js(staged, &mut files)?;
    for file in files {
        let mut cmd = std::process::Command::new("node");
        cmd.arg("--check").arg(&file);
        match run_tool("node --check", cmd, src) {
            Ok(()) => {}
            Err(BuildError::MissingTool { .. }) => return Ok(()),
            Err(BuildError::Tool { tool, dir, output }) => {
                let shown =
                    output.replace(&staged.display().to_string(), &src.display().to_string());
                return Err(BuildError::Tool {
                    tool,
                    dir,
                    output: shown,
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn collect_js(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<(), BuildError> {
    for entry in std::fs::read_dir(dir).map_err(|e| BuildError::io(dir, e))? {
        let path = entry.map_err(|e| BuildError::io(dir, e))?.path();
        if path.is_dir() {
            collect_js(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "js" || e == "mjs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<(), BuildError> {
    std::fs::create_dir_all(to).map_err(|e| BuildError::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| BuildError::io(from, e))? {
        let entry = entry.map_err(|e| BuildError::io(from, e))?;
        let name = entry.file_name();
        if matches!(name.to_str(), Some("dist" | "node_modules" | ".git")) {
            continue;
        }
        let path = entry.path();
        let ft = entry.file_type().map_err(|e| BuildError::io(&path, e))?;
        if ft.is_dir() {
            copy_tree(&path, &to.join(&name))?;
        } else if ft.is_file() {
            std::fs::copy(&path, to.join(&name)).map_err(|e| BuildError::io(&path, e))?;
        }
    }
    Ok(())
}
