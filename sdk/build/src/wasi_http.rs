//! The world Python guests are built against: the node world plus `wasi:http`'s
//! outgoing handler. componentize-py binds only the imports of its world, and the node
//! world imports no `wasi:http`, so without this a Python node could not reach the
//! host's outgoing HTTP at all. The host links `wasi:http` for every package (and
//! lets a request through only to what the operator grants), so importing it costs a
//! package without a grant nothing but refused requests.
//!
//! The WASI WIT is vendored from the host's `wasmtime-wasi-http` (`sdk/build/wasi/`),
//! so the guest imports the same `wasi:http` version the host links.

use std::path::Path;

use crate::{BuildError, Wit};

/// The `wasi:http` version the vendored WIT declares (the host's).
const WASI_HTTP: &str = "wasi:http/outgoing-handler@0.2.12";

/// The vendored WASI packages, written as `deps/<file>`.
const DEPS: &[(&str, &str)] = &[
    ("cli.wit", include_str!("../wasi/cli.wit")),
    ("clocks.wit", include_str!("../wasi/clocks.wit")),
    ("filesystem.wit", include_str!("../wasi/filesystem.wit")),
    ("http.wit", include_str!("../wasi/http.wit")),
    ("io.wit", include_str!("../wasi/io.wit")),
    ("random.wit", include_str!("../wasi/random.wit")),
    ("sockets.wit", include_str!("../wasi/sockets.wit")),
];

/// What the Python build's cache key must change with besides the node WIT.
pub fn fingerprint_parts() -> impl Iterator<Item = &'static str> {
    DEPS.iter().map(|(_, text)| *text).chain([WASI_HTTP])
}

/// A copy of `wit` in `work/wit` with a world `<world>-http` that includes `wit`'s world
/// and imports the outgoing handler, and the WASI packages it needs under `deps/`.
pub fn with_outgoing_http(wit: &Wit, work: &Path) -> Result<Wit, BuildError> {
    let dir = work.join("wit");
    crate::js::copy_tree(&wit.dir, &dir)?;
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) = resolve.push_dir(&wit.dir).map_err(|e| BuildError::Wit {
        dir: wit.dir.clone(),
        message: format!("{e:#}"),
    })?;
    let package = &resolve.packages[pkg].name;
    let world = format!("{}-http", wit.world);
    let text = format!(
        // No comment above `package`: componentize-py's WIT parser counts it as the
        // package's doc comment, which node.wit already has.
        "package {package};\n\n// Written by heddle-package-build: the node world plus outgoing HTTP.\n\
         world {world} {{\n    include {};\n    import {WASI_HTTP};\n}}\n",
        wit.world
    );
    let file = dir.join("heddle-build-http.wit");
    std::fs::write(&file, text).map_err(|e| BuildError::io(&file, e))?;
    let deps = dir.join("deps");
    std::fs::create_dir_all(&deps).map_err(|e| BuildError::io(&deps, e))?;
    for (name, text) in DEPS {
        let path = deps.join(name);
        // A deps folder of the caller's WIT that already has a WASI package keeps it.
        if !path.exists() {
            std::fs::write(&path, text).map_err(|e| BuildError::io(&path, e))?;
        }
    }
    Ok(Wit { dir, world })
}
