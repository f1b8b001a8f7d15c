//! A node package from a language without a Heddle SDK, the way `wit/README.md` ("Bring
//! your own language") says to build one: `sdk/wat/cases.wat`, a core module written by
//! hand, made a component with `wasm-tools`, installed with `heddle package add` and run
//! in a graph. What the page claims is checked here: the core exports the world needs,
//! that no WASI import is required, that properties arrive merged into `inputs` (and
//! alone in `properties`), and which `value` case each port type's value arrives as.
//!
//! Needs `wasm-tools` (`scripts/install-guest-toolchains wasm-tools`, or `cargo install
//! wasm-tools`); without it the test says loudly that it skipped, and under `CI=true` it
//! fails.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

/// `wasm-tools`: `$HEDDLE_WASM_TOOLS`, the one `install-guest-toolchains` installs, or
/// the one on PATH.
fn wasm_tools() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HEDDLE_WASM_TOOLS") {
        return Some(PathBuf::from(p));
    }
    let toolchains = std::env::var_os("HEDDLE_TOOLCHAINS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/heddle/toolchains"))
        });
    let installed = toolchains.map(|t| t.join("wasm-tools/bin/wasm-tools"));
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("wasm-tools"))
            .find(|p| p.is_file())
    });
    installed.filter(|p| p.is_file()).or(on_path)
}

fn tool(bin: &Path, args: &[&str]) -> String {
    let o = Command::new(bin)
        .args(args)
        .output()
        .expect("wasm-tools runs");
    assert!(
        o.status.success(),
        "wasm-tools {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The value each input of `byo.cases` gets, by input name (all are its port names).
const FED: &[(&str, &str)] = &[
    ("b", "true"),
    ("i", "7"),
    ("f", "2.5"),
    ("n", "3"),
    ("s", "\"text\""),
    ("l", "[1, 2]"),
    ("o", "{\"k\": 1}"),
    ("a", "1.5"),
];

/// `byo.cases` fed one value per port type from constants, with its property `p` set,
/// and each of its outputs into an output node of the same name.
fn graph() -> String {
    let mut nodes = vec![serde_json::json!(
        {"id": "cases", "type": "byo.cases", "properties": {"p": "a property"}}
    )];
    let mut edges = Vec::new();
    for (name, value) in FED {
        let value: serde_json::Value = serde_json::from_str(value).unwrap();
        nodes.push(serde_json::json!(
            {"id": format!("in_{name}"), "type": "heddle.constant", "properties": {"value": value}}
        ));
        edges.push(
            serde_json::json!({"source": format!("in_{name}"), "sourceHandle": "value",
            "target": "cases", "targetHandle": name}),
        );
    }
    let outputs = FED.iter().map(|(n, _)| *n).chain(["p", "properties"]);
    for name in outputs {
        nodes.push(serde_json::json!(
            {"id": format!("out_{name}"), "type": "heddle.output", "properties": {"name": name}}
        ));
        edges.push(serde_json::json!({"source": "cases", "sourceHandle": name,
            "target": format!("out_{name}"), "targetHandle": "value"}));
    }
    serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": nodes, "edges": edges})
        .to_string()
}

#[test]
fn a_component_written_in_wat_with_no_sdk_runs_as_the_page_says() {
    let Some(wasm_tools) = wasm_tools() else {
        let why = "wasm-tools is not installed (scripts/install-guest-toolchains wasm-tools, or cargo install wasm-tools)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why}; under CI=true this test is required"
        );
        // Written to stderr itself: the harness captures `eprintln!` of a passing test.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED: the bring-your-own-language test did not run: {why} ***\n"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("byo");
    std::fs::create_dir(&pkg).unwrap();
    let src = root().join("sdk/wat");
    std::fs::copy(
        src.join("heddle-package.toml"),
        pkg.join("heddle-package.toml"),
    )
    .unwrap();
    let core = dir.path().join("cases.core.wasm");
    let component = pkg.join("cases.wasm");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // The page's two commands.
    tool(
        &wasm_tools,
        &[
            "component",
            "embed",
            &s(&root().join("wit")),
            "--world",
            "node-package",
            &s(&src.join("cases.wat")),
            "-o",
            &s(&core),
        ],
    );
    tool(
        &wasm_tools,
        &["component", "new", &s(&core), "-o", &s(&component)],
    );

    // The core module exports exactly what the world needs, and imports only the host.
    let module = tool(&wasm_tools, &["print", &s(&core)]);
    let mut exports: Vec<&str> = module
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(export \""))
        .filter_map(|l| l.split('"').next())
        .collect();
    exports.sort_unstable();
    assert_eq!(
        exports,
        [
            "cabi_realloc",
            "heddle:node/node@0.1.0#describe",
            "heddle:node/node@0.1.0#invoke",
            "memory"
        ],
        "{module}"
    );
    // The component needs no WASI: its world imports the host interface alone.
    let world = tool(&wasm_tools, &["component", "wit", &s(&component)]);
    assert!(!world.contains("wasi:"), "{world}");
    assert!(world.contains("import heddle:node/host@0.1.0;"), "{world}");
    assert!(world.contains("export heddle:node/node@0.1.0;"), "{world}");

    // Installed and run like any package.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let o = heddle_in(&work, &["package", "add", &s(&pkg)]);
    expect_code(&o, OK);
    let graph = write(&work, "g.json", &graph());
    let o = heddle_in(&work, &["run", &s(&graph), "--json"]);
    expect_code(&o, OK);
    let v = json(&o);
    let case = |name: &str| {
        v["outputs"][name][0]
            .as_i64()
            .unwrap_or_else(|| panic!("{name}: {v:#}"))
    };
    // The case of the WIT `value` each port type's value arrives as (0 null, 1 boolean,
    // 2 s64, 3 f64, 4 string, 5 bytes, 6 json), as the page's table says.
    for (name, want) in [
        ("b", 1),
        ("i", 2),
        ("f", 3),
        ("n", 2),
        ("s", 4),
        ("l", 6),
        ("o", 6),
        ("a", 3),
    ] {
        assert_eq!(case(name), want, "input `{name}`: {v:#}");
    }
    // The property arrives merged into `inputs` (a string), and alone in `properties`.
    assert_eq!(case("p"), 4, "{v:#}");
    assert_eq!(case("properties"), 1, "{v:#}");
    // The host's imports work without WASI: the node's log line is in the run.
    let o = heddle_in(&work, &["run", &s(&graph)]);
    expect_code(&o, OK);
    assert!(
        stderr(&o).contains("log      cases: cases computed"),
        "{}",
        stderr(&o)
    );
}
