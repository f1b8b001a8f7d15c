//! The package store under concurrent and hostile use, through the real binary: two
//! `heddle package add` processes at once, a run during a re-install, reserved names
//! and node types, and a lockfile that names paths outside the store.

#[path = "package_store/build.rs"]
mod build;
#[path = "../host/wasm/tests/common/mod.rs"]
mod common;
#[path = "package_store/registry.rs"]
mod registry;
mod support;

use std::path::Path;
use std::process::Stdio;

use support::*;

fn spawn_in(dir: &Path, args: &[&str]) -> std::process::Child {
    command(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the heddle binary starts")
}

fn names(dir: &Path) -> Vec<String> {
    let o = heddle_in(dir, &["package", "list", "--json"]);
    expect_code(&o, OK);
    json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn concurrent_adds_of_different_packages_keep_both() {
    let hostile = common::package_dir("hostile");
    let spoof = common::package_dir("spoof");
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let a = spawn_in(dir.path(), &["package", "add", hostile.to_str().unwrap()]);
        let b = spawn_in(dir.path(), &["package", "add", spoof.to_str().unwrap()]);
        expect_code(&a.wait_with_output().unwrap(), OK);
        expect_code(&b.wait_with_output().unwrap(), OK);
        let mut got = names(dir.path());
        got.sort();
        assert_eq!(got, ["hostile", "spoof"], "round {round}");
        let o = heddle_in(dir.path(), &["package", "verify"]);
        expect_code(&o, OK);
    }
}

pub(crate) const ECHO: &str = r#"{"format": "heddle.graph", "version": 1, "nodes": [
  {"id": "in", "type": "heddle.input", "properties": {"type": "int", "value": 7}},
  {"id": "echo", "type": "hostile.echo"},
  {"id": "out", "type": "heddle.output"}],
 "edges": [
  {"source": "in", "sourceHandle": "value", "target": "echo", "targetHandle": "value"},
  {"source": "echo", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn a_run_during_a_reinstall_sees_the_old_or_the_new_package() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = common::package_dir("hostile");
    let hostile = hostile.to_str().unwrap();
    expect_code(&heddle_in(dir.path(), &["package", "add", hostile]), OK);
    std::fs::write(dir.path().join("echo.json"), ECHO).unwrap();
    let adds = {
        let dir = dir.path().to_path_buf();
        let hostile = hostile.to_string();
        std::thread::spawn(move || {
            for _ in 0..6 {
                expect_code(&heddle_in(&dir, &["package", "add", &hostile]), OK);
            }
        })
    };
    while !adds.is_finished() {
        let o = heddle_in(dir.path(), &["run", "echo.json"]);
        expect_code(&o, OK);
        assert!(stdout(&o).contains("out: 7"), "{}", stdout(&o));
    }
    adds.join().unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path().join(".heddle/packages"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "replaced installs are removed: {left:?}");
}

#[test]
fn first_party_names_and_existing_node_types_are_refused_at_add() {
    let dir = tempfile::tempdir().unwrap();
    let first = heddle_wasm::first_party_packages_dir();

    let o = heddle_in(
        dir.path(),
        &["package", "add", first.join("std").to_str().unwrap()],
    );
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("`std` is reserved"), "{}", stderr(&o));

    // The `files` package under another name still redefines its node types.
    let src = dir.path().join("myfiles");
    std::fs::create_dir_all(&src).unwrap();
    for f in ["heddle-package.toml", "files.wasm"] {
        std::fs::copy(first.join("files").join(f), src.join(f)).unwrap();
    }
    let manifest = std::fs::read_to_string(src.join("heddle-package.toml")).unwrap();
    std::fs::write(
        src.join("heddle-package.toml"),
        manifest.replace("name = \"files\"", "name = \"myfiles\""),
    )
    .unwrap();
    let o = heddle_in(dir.path(), &["package", "add", "myfiles"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("package `myfiles` declares node type `files.")
            && e.contains("the first-party package `files` already defines"),
        "{e}"
    );
    assert!(names(dir.path()).is_empty(), "nothing was installed");
    // Runs are unaffected.
    let o = heddle_in(dir.path(), &["nodes", "files.read_text"]);
    expect_code(&o, OK);
}

#[test]
fn lockfile_names_never_reach_outside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = common::package_dir("hostile");
    expect_code(
        &heddle_in(dir.path(), &["package", "add", hostile.to_str().unwrap()]),
        OK,
    );
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), "precious").unwrap();

    let o = heddle_in(dir.path(), &["package", "remove", "../../victim"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("not a package name"), "{}", stderr(&o));

    let lock = dir.path().join(".heddle/heddle.lock");
    let text = std::fs::read_to_string(&lock).unwrap();
    for (from, to) in [
        ("name = \"hostile\"", "name = \"../../victim\""),
        ("dir = \"", "dir = \"../../victim\"\nold_dir = \""),
    ] {
        std::fs::write(&lock, text.replacen(from, to, 1)).unwrap();
        for args in [
            &["package", "remove", "hostile"][..],
            &["package", "list"][..],
        ] {
            let o = heddle_in(dir.path(), args);
            expect_code(&o, FAILED);
            assert!(stderr(&o).contains("heddle.lock"), "{}", stderr(&o));
        }
        assert!(
            victim.join("keep.txt").is_file(),
            "outside the store untouched"
        );
    }
}

/// A package whose declaration is bad (here a capability target with control
/// characters) is a bad package directory like any other: exit 2, nothing installed.
#[test]
fn a_bad_declaration_is_refused_with_exit_2_like_every_bad_package() {
    let dir = tempfile::tempdir().unwrap();
    let bad = common::package_dir("bad-target");
    let o = heddle_in(dir.path(), &["package", "add", bad.to_str().unwrap()]);
    expect_code(&o, INVALID);
    no_panic(&o);
    let e = stderr(&o);
    assert!(
        e.contains("node declaration `bad_target.node` is invalid: capability target"),
        "{e}"
    );
    assert!(names(dir.path()).is_empty());
}

#[test]
fn package_add_list_verify_remove() {
    let dir = tempfile::tempdir().unwrap();
    let spoof = common::package_dir("spoof");
    let o = heddle_in(dir.path(), &["package", "add", spoof.to_str().unwrap()]);
    expect_code(&o, OK);
    let out = stdout(&o);
    assert!(out.contains("installed spoof@0.1.0"), "{out}");
    assert!(out.contains("NOT granted env `HOME`"), "{out}");

    // A grant in heddle.toml shows up as granted ...
    let granted = |dir: &Path| {
        let o = heddle_in(dir, &["package", "list", "--json"]);
        expect_code(&o, OK);
        let v = json(&o);
        let caps = v[0]["capabilities"].as_array().unwrap().clone();
        let env = caps.iter().find(|c| c["kind"] == "env").unwrap().clone();
        (env["granted"] == true, v[0]["grant"].clone())
    };
    std::fs::write(
        dir.path().join("heddle.toml"),
        "[packages.spoof]\nenv = [\"HOME\"]\n",
    )
    .unwrap();
    assert!(granted(dir.path()).0);
    // ... unless it is pinned to other bytes than the installed ones.
    std::fs::write(
        dir.path().join("heddle.toml"),
        format!(
            "[packages.spoof]\nenv = [\"HOME\"]\nsha256 = \"{}\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    let (ok, grant) = granted(dir.path());
    assert!(!ok, "{grant}");
    assert_eq!(grant["state"], "pin-mismatch", "{grant}");
    assert_eq!(grant["pinned"], "0".repeat(64), "{grant}");

    let o = heddle_in(dir.path(), &["package", "verify"]);
    expect_code(&o, OK);
    let lock = std::fs::read_to_string(dir.path().join(".heddle/heddle.lock")).unwrap();
    let installed = lock
        .lines()
        .find_map(|l| l.strip_prefix("dir = \""))
        .unwrap()
        .trim_end_matches('"');
    let wasm = dir
        .path()
        .join(".heddle/packages")
        .join(installed)
        .join("spoof.wasm");
    let mut bytes = std::fs::read(&wasm).unwrap();
    bytes.push(0);
    std::fs::write(&wasm, bytes).unwrap();
    let o = heddle_in(dir.path(), &["package", "verify"]);
    expect_code(&o, FAILED);
    assert!(stdout(&o).contains("CHANGED  spoof"), "{}", stdout(&o));

    expect_code(&heddle_in(dir.path(), &["package", "remove", "spoof"]), OK);
    let o = heddle_in(dir.path(), &["package", "remove", "spoof"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("not installed"), "{}", stderr(&o));

    std::fs::create_dir_all(dir.path().join("empty")).unwrap();
    let o = heddle_in(dir.path(), &["package", "add", "empty"]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("heddle-package.toml"), "{}", stderr(&o));
}

/// A copy of the `hostile` package that provides the graph `graphs/echo.json` (its
/// `hostile.echo` between an input and an output), listed in its manifest.
fn package_with_graph(dir: &Path, graph: &str) -> std::path::PathBuf {
    let src = common::package_dir("hostile");
    let pkg = dir.join("pkg");
    std::fs::create_dir_all(pkg.join("graphs")).unwrap();
    for f in ["heddle-package.toml", "hostile.wasm"] {
        std::fs::copy(src.join(f), pkg.join(f)).unwrap();
    }
    let manifest = std::fs::read_to_string(pkg.join("heddle-package.toml")).unwrap();
    write(
        &pkg,
        "heddle-package.toml",
        &format!("{manifest}graphs = [\"graphs/echo.json\"]\n"),
    );
    write(&pkg, "graphs/echo.json", graph);
    pkg
}

/// A graph whose graph node `g` includes the `hostile` package's `graphs/echo.json`
/// ([`ECHO_GRAPH`], pinned), fed 41; its output `out`.
fn graph_of_package_graph() -> String {
    let sha = heddle_core::compose::sha256_hex(ECHO_GRAPH.as_bytes());
    format!(
        r#"{{"nodes": [
          {{"id": "n", "type": "heddle.constant", "properties": {{"value": 41}}}},
          {{"id": "g", "type": "heddle.graph", "properties": {{"package": "hostile", "graph": "graphs/echo.json", "sha256": "{sha}"}}}},
          {{"id": "out", "type": "heddle.output"}}],
         "edges": [
          {{"source": "n", "sourceHandle": "value", "target": "g", "targetHandle": "value"}},
          {{"source": "g", "sourceHandle": "echoed", "target": "out", "targetHandle": "value"}}]}}"#
    )
}

const ECHO_GRAPH: &str = r#"{"nodes": [
  {"id": "value", "type": "heddle.input", "properties": {"type": "int"}},
  {"id": "echo", "type": "hostile.echo"},
  {"id": "echoed", "type": "heddle.output"}],
 "edges": [
  {"source": "value", "sourceHandle": "value", "target": "echo", "targetHandle": "value"},
  {"source": "echo", "sourceHandle": "value", "target": "echoed", "targetHandle": "value"}]}"#;

#[test]
fn a_package_provides_graphs_that_graph_nodes_include() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pkg = package_with_graph(d, ECHO_GRAPH);
    let o = heddle_in(d, &["package", "add", pkg.to_str().unwrap()]);
    expect_code(&o, OK);
    // The package's copy is what is read: the source directory can go.
    std::fs::remove_dir_all(&pkg).unwrap();
    write(d, "g.json", &graph_of_package_graph());
    let o = heddle_in(d, &["run", "--json", "g.json"]);
    expect_code(&o, OK);
    let r = json(&o);
    assert_eq!(r["outputs"]["out"], serde_json::json!([41]), "{r:#}");
    assert_eq!(
        r["graph_nodes"]["g"]["graph"],
        "package:hostile/graphs/echo.json"
    );

    // A package naming a graph that is not one is refused at install, naming the file.
    let bad = package_with_graph(&d.join("bad"), "{ not json");
    let o = heddle_in(d, &["package", "add", bad.to_str().unwrap()]);
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("graphs/echo.json"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not a graph document"),
        "{}",
        stderr(&o)
    );
}

/// `heddle serve` reads the documents its installed packages provide: a request whose
/// graph node names one need not send it. Any other document is still read only from
/// the request, never from the server's files.
#[test]
fn the_server_reads_the_graphs_its_installed_packages_provide() {
    let env = support::store::StoreDir::new();
    let d = env.path();
    let pkg = package_with_graph(d, ECHO_GRAPH);
    expect_code(&env.heddle(&["package", "add", pkg.to_str().unwrap()]), OK);
    std::fs::create_dir(d.join("graphs")).unwrap();
    write(d, "graphs/local.json", ECHO_GRAPH);
    let server = env.serve(None);
    let api = support::serve::Api::of(&server);
    support::serve::rt().block_on(async {
        let id = api.create(&graph_of_package_graph()).await;
        let (show, _) = api.drive_to_end(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        let events = api.events(&id, None).await;
        let echoed = events
            .iter()
            .find(|(_, k, e)| k == "completed" && e["occurrence"]["node"] == "g/echo")
            .unwrap_or_else(|| panic!("g/echo did not complete: {events:#?}"));
        assert_eq!(echoed.2["outputs"][0][1], 41, "{echoed:?}");

        let local = graph_of_package_graph().replace(
            r#""package": "hostile", "graph": "graphs/echo.json""#,
            r#""graph": "graphs/local.json""#,
        );
        assert!(local.contains("graphs/local.json"));
        let graph: serde_json::Value = serde_json::from_str(&local).unwrap();
        let (status, body) = api
            .call(
                "POST",
                "/api/runs",
                Some(serde_json::json!({ "graph": graph })),
            )
            .await;
        assert_eq!(status, 422, "{body:#}");
        assert_eq!(body["issues"][0]["node"], "g", "{body:#}");
        assert!(
            body["issues"][0]["message"]
                .as_str()
                .unwrap()
                .contains("not sent"),
            "{body:#}"
        );
    });
}

/// The capability review shows a `network` request as granted or not, then the
/// destinations granted and the headers the host adds (the secret's name, never its
/// value).
#[test]
fn package_review_shows_requested_and_granted_destinations() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("netpkg");
    std::fs::create_dir(&pkg).unwrap();
    let spoof = common::package_dir("spoof");
    std::fs::copy(spoof.join("spoof.wasm"), pkg.join("spoof.wasm")).unwrap();
    std::fs::write(
        pkg.join("heddle-package.toml"),
        "name = \"spoof\"\nversion = \"0.1.0\"\ncomponent = \"spoof.wasm\"\n\n[[capabilities]]\nkind = \"network\"\ntarget = \"https://api.example.com\"\nreason = \"calls the example API\"\n",
    )
    .unwrap();
    let o = heddle_in(dir.path(), &["package", "add", pkg.to_str().unwrap()]);
    expect_code(&o, OK);
    let out = stdout(&o);
    assert!(
        out.contains("NOT granted network `https://api.example.com`"),
        "{out}"
    );

    std::fs::write(
        dir.path().join("heddle.toml"),
        "[packages.spoof]\nnetwork = [\"https://*.example.com\", \"http://127.0.0.1:8080\"]\n[packages.spoof.network_auth]\n\"https://*.example.com\" = { header = \"X-Api-Key\", secret = \"EXAMPLE_KEY\" }\n[secrets.values]\nEXAMPLE_KEY = \"k-93f1-not-shown\"\n",
    )
    .unwrap();
    let o = heddle_in(dir.path(), &["package", "list"]);
    expect_code(&o, OK);
    let out = stdout(&o);
    for want in [
        "granted     network `https://api.example.com`",
        "network granted: https://*.example.com, http://127.0.0.1:8080",
        "header `x-api-key` added to requests to https://*.example.com from secret `EXAMPLE_KEY`",
    ] {
        assert!(out.contains(want), "`{want}` missing:\n{out}");
    }
    assert!(!out.contains("k-93f1-not-shown"), "{out}");
    let v = json(&heddle_in(dir.path(), &["package", "list", "--json"]));
    assert_eq!(
        v[0]["network_granted"],
        serde_json::json!(["https://*.example.com", "http://127.0.0.1:8080"])
    );

    // A graph of that config cannot even load with a secret that is not set: refused
    // naming the line.
    std::fs::write(
        dir.path().join("heddle.toml"),
        "[packages.spoof]\nnetwork = [\"https://*.example.com\"]\n[packages.spoof.network_auth]\n\"https://*.example.com\" = { header = \"X-Api-Key\", secret = \"NOT_SET_ANYWHERE\" }\n",
    )
    .unwrap();
    let o = heddle_in(dir.path(), &["package", "list"]);
    expect_code(&o, INVALID);
    let err = stderr(&o);
    assert!(
        err.contains("line 4") && err.contains("NOT_SET_ANYWHERE"),
        "{err}"
    );
}
