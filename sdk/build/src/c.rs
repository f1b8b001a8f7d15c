//! C guests: bindings come from the `wit-bindgen-c` library (so no `cargo install
//! wit-bindgen-cli`), the core module from Debian's clang + wasi-libc (WASI preview 1
//! only), and the component from `wit-component` with the preview-1 reactor adapter.

use std::path::{Path, PathBuf};
use std::process::Command;

use wit_bindgen_core::Files;
use wit_parser::Resolve;

use crate::{BuildError, Wit, run_tool};

/// Writes the C bindings for `wit`'s world into `out`: `<world>.h`, `<world>.c` and
/// `<world>_component_type.o` (the component type the encoder needs, linked in).
pub fn generate_bindings(wit: &Wit, out: &Path) -> Result<Vec<PathBuf>, BuildError> {
    bindings(wit, out).map(|(files, _)| files)
}

/// [`generate_bindings`], and whether the world has 0.2's control functions (the
/// `controlled` export): `heddle.c` compiles its controller and controlled-node half
/// only then (`-DHEDDLE_NODE_CONTROL`), so the SDK still builds against a 0.1 WIT for
/// a host older than 0.2.
fn bindings(wit: &Wit, out: &Path) -> Result<(Vec<PathBuf>, bool), BuildError> {
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve.push_dir(&wit.dir).map_err(|e| BuildError::Wit {
        dir: wit.dir.clone(),
        message: format!("{e:#}"),
    })?;
    let world = resolve
        .select_world(&[pkg], Some(&wit.world))
        .map_err(|e| BuildError::Wit {
            dir: wit.dir.clone(),
            message: format!("{e:#}"),
        })?;
    let control = resolve.worlds[world]
        .exports
        .values()
        .any(|item| match item {
            wit_parser::WorldItem::Interface { id, .. } => {
                resolve.interfaces[*id].functions.contains_key("controlled")
            }
            _ => false,
        });
    let mut files = Files::default();
    let opts = wit_bindgen_c::Opts::default();
    opts.build()
        .generate(&mut resolve, world, &mut files)
        .map_err(|e| BuildError::Wit {
            dir: wit.dir.clone(),
            message: format!("C bindings: {e:#}"),
        })?;
    std::fs::create_dir_all(out).map_err(|e| BuildError::io(out, e))?;
    let mut written = Vec::new();
    for (name, bytes) in files.iter() {
        let path = out.join(name);
        std::fs::write(&path, bytes).map_err(|e| BuildError::io(&path, e))?;
        written.push(path);
    }
    written.sort();
    Ok((written, control))
}

/// Where Debian's `wasi-libc` puts its headers and libraries (`--sysroot=/usr`).
const DEBIAN_WASI_SYSROOT: &str = "/usr";

/// Compiles every `*.c` of `src` with the SDK helper and the generated bindings into a
/// core module, then wraps it as a component.
pub fn build(
    src: &Path,
    sdk_c: &Path,
    wit: &Wit,
    work: &Path,
    out_component: &Path,
) -> Result<(), BuildError> {
    let gen_dir = work.join("gen");
    let (generated, control) = bindings(wit, &gen_dir)?;
    let mut sources: Vec<PathBuf> = crate::list_files(src, &["c"])?;
    if sources.is_empty() {
        return Err(BuildError::NoEntry {
            dir: src.to_path_buf(),
            expected: "at least one *.c file".into(),
        });
    }
    sources.push(sdk_c.join("heddle.c"));
    sources.push(sdk_c.join("heddle_json.c"));
    sources.extend(
        generated
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "c" || e == "o"))
            .cloned(),
    );

    let core = work.join("core.wasm");
    let clang = std::env::var_os("HEDDLE_CLANG").unwrap_or_else(|| "clang".into());
    let mut cmd = Command::new(clang);
    cmd.arg("--target=wasm32-wasi")
        .arg(format!("--sysroot={DEBIAN_WASI_SYSROOT}"))
        .arg("-mexec-model=reactor")
        .args(["-O2", "-std=c11", "-Wall", "-Wno-unused-function"])
        .args(control.then_some("-DHEDDLE_NODE_CONTROL=1"))
        .arg("-I")
        .arg(&gen_dir)
        .arg("-I")
        .arg(sdk_c)
        .arg("-I")
        .arg(src)
        .arg("-o")
        .arg(&core)
        .args(&sources);
    run_tool("clang", cmd, src)?;

    let module = std::fs::read(&core).map_err(|e| BuildError::io(&core, e))?;
    let component = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .and_then(|enc| {
            enc.adapter(
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .and_then(|mut enc| enc.encode())
        .map_err(|e| BuildError::Tool {
            tool: "wit-component".into(),
            dir: src.to_path_buf(),
            output: format!("{e:#}"),
        })?;
    std::fs::write(out_component, component).map_err(|e| BuildError::io(out_component, e))
}
