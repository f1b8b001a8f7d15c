//! An installed `heddle` (`cargo install --path .`, or the binary copied anywhere) works
//! without the build tree: the first-party packages travel inside the binary.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_copied_binary_runs_a_std_graph_away_from_the_build_tree() {
    let away = tempfile::tempdir().unwrap();
    let bin = away.path().join("bin/heddle");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_heddle"), &bin).unwrap();
    let work = away.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart.json");
    std::fs::copy(example, work.join("graph.json")).unwrap();

    let o = Command::new(&bin)
        .args(["run", "graph.json"])
        .current_dir(&work)
        // Nothing points back into the build tree, and no compile cache from it helps:
        // a fresh machine's home.
        .env_remove("HEDDLE_FIRST_PARTY_DIR")
        .env_remove("CARGO_MANIFEST_DIR")
        .env("HOME", away.path())
        .env("XDG_CACHE_HOME", away.path().join("cache"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("shouted: HELLO HEDDLE: GRAPHS OF WEBASSEMBLY NODES"),
        "{out}"
    );
    assert!(
        err.contains("compiling std (first use)…"),
        "a compile the cache cannot serve is announced: {err}"
    );
    // Only the packages the graph uses are loaded: the quickstart has no `files` node.
    assert!(!err.contains("compiling files"), "{err}");
    assert!(
        away.path().join("cache/heddle/wasm").is_dir(),
        "the compile cache is the new home's"
    );
}
