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
