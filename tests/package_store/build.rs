//! `heddle package build` from the binary: a missing toolchain is one message naming
//! what to install and how, and nothing half-built is left for `package add`.

use crate::support::*;

#[test]
fn a_missing_toolchain_is_named_with_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("py-nodes");
    std::fs::create_dir(&src).unwrap();
    write(
        &src,
        "heddle-package.toml",
        "name = \"py-nodes\"\nversion = \"0.1.0\"\n[build]\nlanguage = \"python\"\n",
    );
    write(&src, "app.py", "from heddle import node\n");
    let o = command(dir.path())
        .args(["package", "build", "py-nodes", "--no-install", "--no-cache"])
        .env("HEDDLE_TOOLCHAINS", dir.path().join("no-toolchains"))
        .output()
        .unwrap();
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("componentize-py is not installed")
            && e.contains("pip install componentize-py==")
            && e.contains("without --no-install"),
        "{e}"
    );
    no_panic(&o);
    assert!(!src.join("dist/py-nodes.wasm").exists());

    // A folder that is not a package source is named.
    let o = command(dir.path())
        .args(["package", "build", "nowhere"])
        .output()
        .unwrap();
    assert_ne!(code(&o), OK);
    assert!(stderr(&o).contains("nowhere"), "{}", stderr(&o));
}

/// Upper-cases its `text` with the C template's `myc.shout`: the graph the built
/// package provides.
const LOUD: &str = r#"{"name": "loud", "nodes": [
  {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
  {"id": "shout", "type": "myc.shout"},
  {"id": "loud", "type": "heddle.output"}],
 "edges": [
  {"source": "text", "sourceHandle": "value", "target": "shout", "targetHandle": "text"},
  {"source": "shout", "sourceHandle": "text", "target": "loud", "targetHandle": "value"}]}"#;

/// A package folder whose manifest lists `graphs`: the build copies them into the
/// output folder beside the component, so the built package installs and its graph runs
/// as a graph node. A listed graph the folder lacks is refused before anything compiles.
#[test]
fn a_build_carries_the_graphs_its_manifest_lists() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("shouty");
    std::fs::create_dir_all(src.join("graphs")).unwrap();
    std::fs::copy(root().join("sdk/c/template/nodes.c"), src.join("nodes.c")).unwrap();
    write(
        &src,
        "heddle-package.toml",
        "name = \"shouty\"\nversion = \"0.1.0\"\ngraphs = [\"graphs/loud.json\"]\n\n[build]\nlanguage = \"c\"\n",
    );
    let build = || {
        command(d)
            .args(["package", "build", "shouty", "--no-install", "--no-cache"])
            .output()
            .unwrap()
    };
    let o = build();
    expect_code(&o, INVALID);
    no_panic(&o);
    assert!(
        stderr(&o).contains("`graphs` lists `graphs/loud.json`, which is not a file"),
        "{}",
        stderr(&o)
    );
    assert!(!src.join("dist/shouty.wasm").exists());

    write(&src, "graphs/loud.json", LOUD);
    let o = build();
    if code(&o) != OK && stderr(&o).contains("is not installed") {
        let why = format!("the C toolchain is missing: {}", stderr(&o));
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("SKIPPED: {why}");
        return;
    }
    expect_code(&o, OK);
    assert_eq!(
        std::fs::read_to_string(src.join("dist/graphs/loud.json")).unwrap(),
        LOUD
    );
    let o = heddle_in(d, &["package", "add", "shouty/dist"]);
    expect_code(&o, OK);
    let sha = heddle_core::compose::sha256_hex(LOUD.as_bytes());
    write(
        d,
        "g.json",
        &serde_json::json!({"nodes": [
            {"id": "c", "type": "heddle.constant", "properties": {"value": "hey"}},
            {"id": "g", "type": "heddle.graph", "properties": {"package": "shouty", "graph": "graphs/loud.json", "sha256": sha}},
            {"id": "out", "type": "heddle.output"}
        ], "edges": [
            {"source": "c", "sourceHandle": "value", "target": "g", "targetHandle": "text"},
            {"source": "g", "sourceHandle": "loud", "target": "out", "targetHandle": "value"}
        ]})
        .to_string(),
    );
    let o = heddle_in(d, &["run", "--json", "g.json"]);
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["out"], serde_json::json!(["HEY!"]));
}
