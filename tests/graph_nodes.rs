//! Graphs used as nodes (`heddle.graph`) with the real `heddle` binary: the example's
//! per-item graph node in a fan-out, digests printed and pinned, every bad inner
//! document as one issue of the graph node, a failing inner node skipped by a policy, a
//! gate inside pausing the whole run, and a durable run killed inside a graph node
//! (`HEDDLE_FAULT` and SIGKILL) and resumed from the documents it recorded, with the
//! lines its inner `files.write_text` appended counted in the file. And NodeTool's saved
//! workflows (fixtures of our own in its shape, `tests/fixtures/nodetool/`).

mod support;

use std::time::Duration;

use heddle_core::compose::sha256_hex;
use serde_json::json;
use support::store::{StoreDir, expect, kill_moments, report, run_id, text};
use support::*;

fn report_of(o: &std::process::Output) -> serde_json::Value {
    json(o)
}

/// A graph of one graph node `g` including `inner` (written at `graphs/inner.json`,
/// pinned), fed by a constant list fanned out, its output `out` collected.
fn fan_through(inner: &str) -> String {
    json!({
        "format": "heddle.graph", "version": 1,
        "nodes": [
            {"id": "items", "type": "heddle.constant", "properties": {"value": ["a\n", "b\n", "c\n", "d\n", "e\n", "f\n"]}},
            {"id": "each", "type": "heddle.foreach"},
            {"id": "g", "type": "heddle.graph", "properties": {
                "graph": "graphs/inner.json", "sha256": sha256_hex(inner.as_bytes())}},
            {"id": "all", "type": "heddle.collect"},
            {"id": "out", "type": "heddle.output"}
        ],
        "edges": [
            {"source": "items", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
            {"source": "each", "sourceHandle": "item", "target": "g", "targetHandle": "text"},
            {"source": "g", "sourceHandle": "out", "target": "all", "targetHandle": "item"},
            {"source": "all", "sourceHandle": "list", "target": "out", "targetHandle": "value"}
        ]
    })
    .to_string()
}

/// Appends its `text` to /data/log.txt (not retry-safe), then upper-cases the path.
const WRITER: &str = r#"{
  "format": "heddle.graph", "version": 1, "name": "writer",
  "nodes": [
    {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "text", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "path", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// A store directory with `graphs/inner.json` and `g.json` running it per item.
fn writer_env() -> StoreDir {
    let env = StoreDir::with_graph(&fan_through(WRITER));
    std::fs::create_dir(env.path().join("graphs")).unwrap();
    write(env.path(), "graphs/inner.json", WRITER);
    env
}

#[test]
fn the_example_runs_its_graph_node_once_per_item() {
    let o = heddle(&["run", "--json", "examples/graph-node.json"]);
    expect_code(&o, OK);
    let r = report_of(&o);
    assert_eq!(
        r["outputs"]["headlines"],
        json!([[
            "Graphs Inside Graphs",
            "One Run, One Log",
            "Pinned By Digest"
        ]])
    );
    assert_eq!(r["outputs"]["word_counts"], json!([[3, 4, 3]]));
    // Inner nodes are nodes of the report, by path, one invocation per item.
    assert_eq!(r["nodes"]["clean/recase"]["invocations"], 3, "{r:#}");
    assert_eq!(r["nodes"]["clean/recase"]["status"], "done");
    assert_eq!(r["nodes"]["clean/tidy"]["type"], "heddle.graph.output");
    let g = &r["graph_nodes"]["clean"];
    assert_eq!(g["graph"], "graphs/tidy.json");
    assert_eq!(g["status"], "done");
    assert_eq!(g["retry_safe"], false);
    assert_eq!(g["done"], 9, "{g:#}");
    assert!(
        g["nodes"]
            .as_array()
            .unwrap()
            .contains(&json!("clean/trim"))
    );

    // The progress view names inner nodes by path.
    let o = heddle(&["run", "examples/graph-node.json"]);
    expect_code(&o, OK);
    assert!(
        stderr(&o).contains("done     clean/recase (std.text.case)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn validate_prints_the_digest_to_pin_and_then_the_graph_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("graphs")).unwrap();
    let tidy = std::fs::read_to_string(root().join("examples/graphs/tidy.json")).unwrap();
    write(d, "graphs/tidy.json", &tidy);
    let sha = sha256_hex(tidy.as_bytes());
    let outer = std::fs::read_to_string(root().join("examples/graph-node.json")).unwrap();
    let unpinned = outer.replace(&format!(", \"sha256\": \"{sha}\""), "");
    assert_ne!(unpinned, outer, "the example pins the digest");
    write(d, "g.json", &unpinned);
    let o = heddle_in(d, &["validate", "g.json"]);
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains(&format!("add \"sha256\": \"{sha}\"")),
        "{}",
        stderr(&o)
    );
    let o = heddle_in(d, &["validate", "--json", "g.json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["issues"].as_array().unwrap().len(), 1, "{v:#}");
    assert_eq!(v["issues"][0]["kind"], "graph_digest");
    assert_eq!(v["issues"][0]["node"], "clean");

    write(d, "g.json", &outer);
    let o = heddle_in(d, &["validate", "g.json"]);
    expect_code(&o, OK);
    assert!(
        stdout(&o).contains(&format!(
            "graph node clean: graphs/tidy.json (sha256 {sha}), 9 nodes inside; in: text (str), case (str = \"title\"); out: tidy (str), words (int)"
        )),
        "{}",
        stdout(&o)
    );
    let o = heddle_in(d, &["validate", "--json", "g.json"]);
    expect_code(&o, OK);
    let v = json(&o);
    let g = &v["graph_nodes"][0];
    assert_eq!(g["id"], "clean");
    assert_eq!(g["sha256"], sha);
    assert_eq!(
        g["inputs"][0],
        json!({"name": "text", "node": "clean/text", "type": "str"})
    );
    assert!(
        g["nodes"]
            .as_array()
            .unwrap()
            .contains(&json!("clean/recase"))
    );

    // A changed document is refused, like a changed package.
    write(
        d,
        "graphs/tidy.json",
        &tidy.replace("\"title\"", "\"upper\""),
    );
    let o = heddle_in(d, &["run", "g.json"]);
    expect_code(&o, INVALID);
    assert!(
        stderr(&o).contains("changed since it was pinned"),
        "{}",
        stderr(&o)
    );
}

/// Each bad inner document is one validation issue of the graph node, never a crash or
/// a silent skip.
#[test]
fn a_bad_inner_document_is_one_issue_naming_the_graph_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("graphs")).unwrap();
    let graph = |inner: Option<&str>, out_edge: bool| {
        let sha = inner.map_or_else(|| "0".repeat(64), |t| sha256_hex(t.as_bytes()));
        let mut edges = vec![
            json!({"source": "src", "sourceHandle": "value", "target": "outer", "targetHandle": "text"}),
        ];
        if out_edge {
            edges.push(json!({"source": "outer", "sourceHandle": "out", "target": "o", "targetHandle": "value"}));
        }
        json!({"nodes": [
            {"id": "src", "type": "heddle.constant", "properties": {"value": "x"}},
            {"id": "outer", "type": "heddle.graph", "properties": {"graph": "graphs/inner.json", "sha256": sha}},
            {"id": "o", "type": "heddle.output"}
        ], "edges": edges})
        .to_string()
    };
    let outer = |inner: Option<&str>| graph(inner, true);
    let one = |what: &str| -> String {
        let o = heddle_in(d, &["validate", "--json", "g.json"]);
        expect_code(&o, INVALID);
        no_panic(&o);
        let v = json(&o);
        let issues = v["issues"].as_array().unwrap();
        assert_eq!(issues.len(), 1, "{what}: {v:#}");
        assert_eq!(issues[0]["node"], "outer", "{what}: {v:#}");
        issues[0]["message"].as_str().unwrap().to_string()
    };

    // Missing.
    write(d, "g.json", &outer(None));
    let m = one("missing");
    assert!(m.contains("cannot read graph document"), "{m}");
    assert!(m.contains("graphs/inner.json"), "{m}");

    // Unreadable (a directory where the file should be).
    std::fs::create_dir(d.join("graphs/inner.json")).unwrap();
    let m = one("unreadable");
    assert!(m.contains("cannot read graph document"), "{m}");
    std::fs::remove_dir(d.join("graphs/inner.json")).unwrap();

    // Not UTF-8 text.
    std::fs::write(d.join("graphs/inner.json"), b"{\"nodes\": [\xff]}").unwrap();
    let m = one("not UTF-8");
    assert!(m.contains("graphs/inner.json is not UTF-8 text"), "{m}");

    // Malformed: file, line and column.
    let bad = "{\n  \"nodes\": [\n    {\"id\": }\n  ]\n}";
    write(d, "graphs/inner.json", bad);
    write(d, "g.json", &outer(Some(bad)));
    let m = one("malformed");
    assert!(m.contains("graphs/inner.json:3:"), "{m}");
    assert!(m.contains("invalid graph JSON"), "{m}");

    // No outputs.
    let no_out =
        r#"{"nodes": [{"id": "text", "type": "heddle.input", "properties": {"type": "str"}}]}"#;
    write(d, "graphs/inner.json", no_out);
    write(d, "g.json", &graph(Some(no_out), false));
    let m = one("no outputs");
    assert!(m.contains("has no `heddle.output` node"), "{m}");

    // A port name clash.
    let clash = r#"{"nodes": [
        {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "also", "type": "heddle.input", "properties": {"name": "text"}},
        {"id": "out", "type": "heddle.output"}],
      "edges": [{"source": "text", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
    write(d, "graphs/inner.json", clash);
    write(d, "g.json", &outer(Some(clash)));
    let m = one("clash");
    assert!(m.contains("two inputs named `text`"), "{m}");

    // Itself, through the inner document: the node that closes the loop is named,
    // with the chain.
    let own = r#"{"nodes": [
        {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "me", "type": "heddle.graph", "properties": {"graph": "../g.json", "sha256": "00"}},
        {"id": "out", "type": "heddle.output"}],
      "edges": [{"source": "text", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
    write(d, "graphs/inner.json", own);
    write(d, "g.json", &outer(Some(own)));
    let o = heddle_in(d, &["validate", "--json", "g.json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["issues"].as_array().unwrap().len(), 1, "{v:#}");
    assert_eq!(v["issues"][0]["kind"], "graph_cycle");
    assert_eq!(v["issues"][0]["node"], "outer/me");
    let m = v["issues"][0]["message"].as_str().unwrap();
    assert!(
        m.contains("g.json → outer (graphs/inner.json) → outer/me (g.json)"),
        "{m}"
    );
}

/// `g/parse` fails on one item; the policy skips it, the item's downstream nodes are
/// skipped naming the path, and the other items complete.
#[test]
fn a_failing_inner_node_is_escalated_and_skipped_by_a_policy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("graphs")).unwrap();
    let inner = r#"{"nodes": [
        {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "parse", "type": "std.json.parse"},
        {"id": "out", "type": "heddle.output"}],
      "edges": [
        {"source": "text", "sourceHandle": "value", "target": "parse", "targetHandle": "text"},
        {"source": "parse", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
    write(d, "graphs/inner.json", inner);
    let outer = fan_through(inner).replace(
        r#"["a\n","b\n","c\n","d\n","e\n","f\n"]"#,
        r#"["1","x","3"]"#,
    );
    assert!(outer.contains(r#"["1","x","3"]"#));
    write(d, "g.json", &outer);
    write(
        d,
        "policy.toml",
        "[[rule]]\nnode = \"g/parse\"\nsignature = \"json:parse\"\nverdict = \"skip\"\n",
    );
    let o = heddle_in(d, &["run", "--json", "--policy", "policy.toml", "g.json"]);
    expect_code(&o, OK);
    let r = json(&o);
    assert_eq!(r["outputs"]["out"], json!([[1, 3]]), "{r:#}");
    assert_eq!(r["supervised"], true);
    let i = &r["interventions"][0];
    assert_eq!(i["escalation"]["node_id"], "g/parse", "{i:#}");
    assert_eq!(i["verdict"]["action"], "skip", "{i:#}");

    // Without the policy the failure names the full path.
    let o = heddle_in(d, &["run", "--json", "g.json"]);
    expect_code(&o, FAILED);
    let r = json(&o);
    assert_eq!(r["nodes"]["g/parse"]["status"], "failed", "{r:#}");
    assert!(r["error"].as_str().unwrap().contains("g/parse"), "{r:#}");
    assert_eq!(r["graph_nodes"]["g"]["status"], "failed");
    assert!(
        !r["skipped"].as_array().unwrap().is_empty(),
        "the failure cut something off: {r:#}"
    );

    // One value, no fan-out: what the failure cut off is skipped, inside the graph node
    // and outside it, each naming the failed inner node by its path.
    let single = json!({"nodes": [
        {"id": "c", "type": "heddle.constant", "properties": {"value": "x"}},
        {"id": "g", "type": "heddle.graph", "properties": {"graph": "graphs/inner.json", "sha256": sha256_hex(inner.as_bytes())}},
        {"id": "o", "type": "heddle.output"}
    ], "edges": [
        {"source": "c", "sourceHandle": "value", "target": "g", "targetHandle": "text"},
        {"source": "g", "sourceHandle": "out", "target": "o", "targetHandle": "value"}
    ]});
    write(d, "one.json", &single.to_string());
    let o = heddle_in(d, &["run", "--json", "one.json"]);
    expect_code(&o, FAILED);
    let r = json(&o);
    let skipped = r["skipped"].as_array().unwrap();
    for node in ["g/out", "o"] {
        let k = skipped
            .iter()
            .find(|k| k["node"] == node)
            .unwrap_or_else(|| panic!("{node} is not skipped: {r:#}"));
        assert_eq!(k["reason"], "upstream_failed", "{r:#}");
        assert_eq!(k["because"], json!(["g/parse"]), "{r:#}");
    }
    let o = heddle_in(d, &["run", "one.json"]);
    expect_code(&o, FAILED);
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        said.contains("- g/out (upstream failed: g/parse)"),
        "{said}"
    );
}

/// A gate inside a graph node pauses the whole durable run; it is approved by its path.
#[test]
fn a_gate_inside_a_graph_node_pauses_the_run() {
    let env = StoreDir::new();
    let d = env.path();
    std::fs::create_dir(d.join("graphs")).unwrap();
    let inner = r#"{"nodes": [
        {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship the item"}},
        {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
        {"id": "out", "type": "heddle.output"}],
      "edges": [
        {"source": "text", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
        {"source": "ship", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
        {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;
    write(d, "graphs/inner.json", inner);
    let outer = json!({"nodes": [
        {"id": "c", "type": "heddle.constant", "properties": {"value": "notes"}},
        {"id": "g", "type": "heddle.graph", "properties": {"graph": "graphs/inner.json", "sha256": sha256_hex(inner.as_bytes())}},
        {"id": "o", "type": "heddle.output"}
    ], "edges": [
        {"source": "c", "sourceHandle": "value", "target": "g", "targetHandle": "text"},
        {"source": "g", "sourceHandle": "out", "target": "o", "targetHandle": "value"}
    ]});
    write(d, "g.json", &outer.to_string());
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let id = run_id(&o);
    assert!(stderr(&o).contains("g/ship"), "{}", text(&o));
    let show = env.show(&id);
    assert_eq!(show["state"], "paused");
    assert_eq!(show["plan"]["graphs"][0]["id"], "g");
    assert!(
        show["plan"]["included"][0].get("text").is_none(),
        "{show:#}"
    );
    // `runs show` names the graph node with what it includes, and the gate by its path.
    let o = env.heddle(&["runs", "show", &id]);
    expect(&o, OK);
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains(&format!(
            "graph node g: graphs/inner.json (sha256 {})",
            sha256_hex(inner.as_bytes())
        )) && shown.contains("g/ship"),
        "{shown}"
    );
    // A plain resume is refused: the gate is answered.
    let o = env.heddle(&["runs", "resume", &id]);
    expect(&o, INVALID);
    assert!(stderr(&o).contains("runs approve"), "{}", text(&o));
    let o = env.heddle(&["runs", "approve", &id, "g/ship", "--json"]);
    expect(&o, OK);
    assert_eq!(report(&o)["outputs"]["o"], json!(["NOTES"]));
}

/// A durable run aborted inside the graph node, at the moment a written line's result is
/// recorded, then resumed: every item's line is in the file, none written twice unless
/// the user re-offered uncertain work. It resumes from the recorded document even after
/// the file changed.
#[test]
fn a_durable_run_killed_inside_a_graph_node_resumes_without_repeating_inner_results() {
    let t0 = std::time::Instant::now();
    let reference = {
        let env = writer_env();
        let o = env.heddle(&["run", "--durable", "--json", "g.json"]);
        expect(&o, OK);
        report(&o)["outputs"].clone()
    };
    // Kill moments are drawn over the length of an uninterrupted run (which only scales
    // the randomness; nothing asserts on it).
    let span_ms = t0.elapsed().as_millis() as u64 + 1;
    for fault in [
        "after-result:g/w:3",
        "after-start:g/w:2",
        "after-result:g/up:4",
    ] {
        let env = writer_env();
        let id = env.crash(fault, &[]);
        // The document changes after the run started: the resume uses what it recorded.
        write(env.path(), "graphs/inner.json", "{ not a graph");
        let (outputs, reoffers) = env.resume_until_done(&id, &reference, fault);
        assert_eq!(outputs, reference, "{fault}");
        env.assert_fanout_effects(reoffers, fault);
        let show = env.show(&id);
        assert_eq!(show["state"], "completed", "{fault}");
        let completed_w = show["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["occurrence"]["node"] == "g/w")
            .count();
        assert_eq!(completed_w, 6, "{fault}: {show:#}");
    }

    // Killed for real (SIGKILL) at moments spread over the run.
    let mut moment = kill_moments();
    for round in 0..4 {
        let env = writer_env();
        let delay = Duration::from_millis(moment() % span_ms);
        let Some(id) = env.run_killed_after(delay) else {
            eprintln!("round {round}: killed before the run was recorded");
            continue;
        };
        eprintln!(
            "round {round}: killed with {} lines written",
            env.lines().len()
        );
        let (outputs, reoffers) = env.resume_until_done(&id, &reference, "sigkill");
        assert_eq!(outputs, reference);
        env.assert_fanout_effects(reoffers, "sigkill");
    }
}

/// A chain of `levels` graph nodes, each including the next document: `top.json`
/// includes `l1.json`, which includes `l2.json`, … down to `l{levels}.json`, which
/// upper-cases its text. Each pinned.
fn nested(d: &std::path::Path, levels: usize) {
    let mut below = json!({"nodes": [
        {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
        {"id": "out", "type": "heddle.output"}
    ], "edges": [
        {"source": "text", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
        {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
    ]})
    .to_string();
    write(d, &format!("l{levels}.json"), &below);
    for level in (0..levels).rev() {
        let name = if level == 0 {
            "top.json".to_string()
        } else {
            format!("l{level}.json")
        };
        let input = if level == 0 {
            json!({"id": "text", "type": "heddle.constant", "properties": {"value": "deep"}})
        } else {
            json!({"id": "text", "type": "heddle.input", "properties": {"type": "str"}})
        };
        let text = json!({"nodes": [
            input,
            {"id": "n", "type": "heddle.graph", "properties": {
                "graph": format!("l{}.json", level + 1), "sha256": sha256_hex(below.as_bytes())}},
            {"id": "out", "type": "heddle.output"}
        ], "edges": [
            {"source": "text", "sourceHandle": "value", "target": "n", "targetHandle": "text"},
            {"source": "n", "sourceHandle": "out", "target": "out", "targetHandle": "value"}
        ]})
        .to_string();
        write(d, &name, &text);
        below = text;
    }
}

/// `[run] max_graph_depth`: eight levels by default, nine refused naming the setting,
/// which widens the cap when raised and is refused outside 1 to 64.
#[test]
fn the_depth_cap_is_eight_by_default_and_set_in_heddle_toml() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    nested(d, 8);
    let o = heddle_in(d, &["run", "--json", "top.json"]);
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["out"], json!(["DEEP"]));
    assert!(
        json(&o)["nodes"]["n/n/n/n/n/n/n/n/up"].is_object(),
        "{}",
        stdout(&o)
    );

    let deeper = tempfile::tempdir().unwrap();
    let d = deeper.path();
    nested(d, 9);
    let o = heddle_in(d, &["validate", "--json", "top.json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    let issues = v["issues"].as_array().unwrap();
    assert_eq!(issues.len(), 1, "{v:#}");
    assert_eq!(issues[0]["kind"], "graph_depth");
    assert_eq!(issues[0]["node"], "n/n/n/n/n/n/n/n/n");
    let m = issues[0]["message"].as_str().unwrap();
    assert!(
        m.contains("deeper than 8 levels") && m.contains("[run] max_graph_depth"),
        "{m}"
    );

    // Raised to nine, the same chain runs; lowered to two, two levels are all it takes.
    write(d, "heddle.toml", "[run]\nmax_graph_depth = 9\n");
    let o = heddle_in(d, &["run", "--json", "top.json"]);
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["out"], json!(["DEEP"]));
    write(d, "heddle.toml", "[run]\nmax_graph_depth = 2\n");
    let o = heddle_in(d, &["validate", "--json", "top.json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["issues"][0]["node"], "n/n/n", "{v:#}");
    assert!(
        v["issues"][0]["message"]
            .as_str()
            .unwrap()
            .contains("deeper than 2 levels"),
        "{v:#}"
    );

    // Out of range: the file is refused naming the key, before any graph is read.
    for bad in ["0", "65"] {
        write(
            d,
            "heddle.toml",
            &format!("[run]\nmax_graph_depth = {bad}\n"),
        );
        let o = heddle_in(d, &["validate", "top.json"]);
        expect_code(&o, INVALID);
        no_panic(&o);
        let e = stderr(&o);
        assert!(
            e.contains(&format!("max_graph_depth = {bad} is out of range (1..=64)")),
            "{e}"
        );
    }
}

/// The declarations example's triage as a graph node: each order promises its fields,
/// conditions inside send it to one branch carrying only some fields, a check inside
/// holds the result back; and the fields the inner `order` promises reach the edge
/// leaving the graph node, whose condition reads them.
const TRIAGE: &str = r#"{"name": "triage", "nodes": [
    {"id": "orders", "type": "heddle.input", "properties": {"type": "list[object]"}},
    {"id": "each", "type": "heddle.foreach"},
    {"id": "order", "type": "heddle.passthrough", "output": {"fields": [
      {"key": "id", "type": "string"}, {"key": "amount", "type": "number"}]}},
    {"id": "urgent", "type": "heddle.passthrough"},
    {"id": "routine", "type": "heddle.passthrough"},
    {"id": "join", "type": "heddle.passthrough"},
    {"id": "all", "type": "heddle.collect"},
    {"id": "complete", "type": "heddle.check", "properties": {
      "assert": "$count(upstream.all.output) = 3",
      "message": "an order went missing between triage and the result"}},
    {"id": "triaged", "type": "heddle.output"},
    {"id": "each_order", "type": "heddle.output"}
  ], "edges": [
    {"source": "orders", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
    {"source": "each", "sourceHandle": "item", "target": "order", "targetHandle": "value"},
    {"id": "to-urgent", "source": "order", "sourceHandle": "value", "target": "urgent", "targetHandle": "value",
     "when": "fields.amount >= 100", "fields": ["id", "amount"]},
    {"id": "to-routine", "source": "order", "sourceHandle": "value", "target": "routine", "targetHandle": "value",
     "when": "fields.amount < 100", "fields": ["id", "amount"]},
    {"source": "urgent", "sourceHandle": "value", "target": "join", "targetHandle": "value"},
    {"source": "routine", "sourceHandle": "value", "target": "join", "targetHandle": "value"},
    {"source": "join", "sourceHandle": "value", "target": "all", "targetHandle": "item"},
    {"source": "all", "sourceHandle": "list", "target": "complete", "targetHandle": "all"},
    {"source": "complete", "sourceHandle": "output", "target": "triaged", "targetHandle": "value"},
    {"source": "order", "sourceHandle": "value", "target": "each_order", "targetHandle": "value"}
  ]}"#;

#[test]
fn conditions_fields_and_checks_apply_inside_a_graph_node_and_its_fields_cross_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("graphs")).unwrap();
    write(d, "graphs/triage.json", TRIAGE);
    let outer = |orders: serde_json::Value| {
        json!({"nodes": [
            {"id": "orders", "type": "heddle.constant", "properties": {"value": orders}},
            {"id": "g", "type": "heddle.graph", "properties": {"graph": "graphs/triage.json", "sha256": sha256_hex(TRIAGE.as_bytes())}},
            {"id": "result", "type": "heddle.output", "properties": {"name": "triaged"}},
            {"id": "big", "type": "heddle.passthrough"},
            {"id": "bigs", "type": "heddle.collect"},
            {"id": "big_ids", "type": "heddle.output"}
        ], "edges": [
            {"source": "orders", "sourceHandle": "value", "target": "g", "targetHandle": "orders"},
            {"source": "g", "sourceHandle": "triaged", "target": "result", "targetHandle": "value"},
            {"id": "only-big", "source": "g", "sourceHandle": "each_order", "target": "big", "targetHandle": "value",
             "when": "fields.amount >= 100", "fields": ["id"]},
            {"source": "big", "sourceHandle": "value", "target": "bigs", "targetHandle": "item"},
            {"source": "bigs", "sourceHandle": "list", "target": "big_ids", "targetHandle": "value"}
        ]})
        .to_string()
    };
    let three = json!([
        {"id": "a1", "amount": 250, "note": "rush"},
        {"id": "a2", "amount": 40},
        {"id": "a3", "amount": 120}
    ]);
    write(d, "g.json", &outer(three));
    let o = heddle_in(d, &["validate", "--json", "g.json"]);
    expect_code(&o, OK);
    let o = heddle_in(d, &["run", "--json", "g.json"]);
    expect_code(&o, OK);
    let r = json(&o);
    assert_eq!(
        r["outputs"]["triaged"],
        json!([{"all": [{"id": "a1", "amount": 250}, {"id": "a2", "amount": 40}, {"id": "a3", "amount": 120}]}]),
        "{r:#}"
    );
    assert_eq!(
        r["outputs"]["big_ids"],
        json!([[{"id": "a1"}, {"id": "a3"}]]),
        "{r:#}"
    );
    assert_eq!(r["nodes"]["g/urgent"]["invocations"], 2, "{r:#}");
    assert_eq!(r["nodes"]["g/routine"]["invocations"], 1, "{r:#}");
    assert_eq!(r["nodes"]["g/complete"]["status"], "done", "{r:#}");

    // A promise broken inside fails the inner node that made it, by its path.
    write(
        d,
        "g.json",
        &outer(json!([{"id": "a1"}, {"id": "a2", "amount": 40}, {"id": "a3", "amount": 120}])),
    );
    let o = heddle_in(d, &["run", "--json", "g.json"]);
    expect_code(&o, FAILED);
    let r = json(&o);
    assert_eq!(r["nodes"]["g/order"]["status"], "failed", "{r:#}");
    assert!(
        r["nodes"]["g/order"]["error"]
            .as_str()
            .unwrap()
            .contains("output contract"),
        "{r:#}"
    );
    assert_eq!(r["nodes"]["g/each_order"]["status"], "skipped", "{r:#}");

    // The check inside holds the result back, named by its path.
    write(
        d,
        "g.json",
        &outer(json!([{"id": "a1", "amount": 250}, {"id": "a2", "amount": 40}])),
    );
    let o = heddle_in(d, &["run", "--json", "g.json"]);
    expect_code(&o, FAILED);
    let r = json(&o);
    assert_eq!(r["nodes"]["g/complete"]["status"], "failed", "{r:#}");
    assert!(
        r["error"].as_str().unwrap().contains("g/complete")
            && r["error"]
                .as_str()
                .unwrap()
                .contains("an order went missing"),
        "{r:#}"
    );

    // An edge leaving the graph node may select only what the inner producer declares.
    let wrong = outer(json!([])).replace(r#""fields":["id"]"#, r#""fields":["sku"]"#);
    assert!(wrong.contains("sku"));
    write(d, "g.json", &wrong);
    let o = heddle_in(d, &["validate", "--json", "g.json"]);
    expect_code(&o, INVALID);
    let v = json(&o);
    assert_eq!(v["issues"][0]["kind"], "invalid_edge_rule", "{v:#}");
    assert_eq!(v["issues"][0]["edge"], "only-big", "{v:#}");
}

/// `retry` and time limits written on inner nodes apply to them, reported by path.
#[test]
fn retry_and_time_limits_apply_to_inner_nodes() {
    let env = StoreDir::new();
    let d = env.path();
    std::fs::create_dir(d.join("graphs")).unwrap();
    let run_inner = |inner: &str| -> serde_json::Value {
        write(d, "graphs/inner.json", inner);
        let outer = json!({"nodes": [
            {"id": "c", "type": "heddle.constant", "properties": {"value": "x"}},
            {"id": "g", "type": "heddle.graph", "properties": {"graph": "graphs/inner.json", "sha256": sha256_hex(inner.as_bytes())}},
            {"id": "o", "type": "heddle.output"}
        ], "edges": [
            {"source": "c", "sourceHandle": "value", "target": "g", "targetHandle": "text"},
            {"source": "g", "sourceHandle": "out", "target": "o", "targetHandle": "value"}
        ]});
        write(d, "g.json", &outer.to_string());
        let o = env.heddle(&["run", "--json", "g.json"]);
        expect_code(&o, FAILED);
        json(&o)
    };
    // Read access only: every attempt's write is refused, and each is retried.
    let retried = r#"{"nodes": [
        {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "w", "type": "files.write_text", "properties": {"path": "/data/f.txt"},
         "access": "read", "retry": {"attempts": 3}},
        {"id": "out", "type": "heddle.output"}],
      "edges": [
        {"source": "text", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
        {"source": "w", "sourceHandle": "path", "target": "out", "targetHandle": "value"}]}"#;
    let r = run_inner(retried);
    assert_eq!(r["nodes"]["g/w"]["status"], "failed", "{r:#}");
    assert_eq!(r["nodes"]["g/w"]["invocations"], 3, "{r:#}");
    assert!(!d.join("data/f.txt").exists());

    let slow = |limit: &str| {
        format!(
            r#"{{"nodes": [
        {{"id": "text", "type": "heddle.input", "properties": {{"type": "str"}}}},
        {{"id": "slow", "type": "code.bash", {limit}"properties": {{"code": "sleep 60", "mode": "subprocess"}}}},
        {{"id": "out", "type": "heddle.output"}}],
      "edges": [
        {{"source": "text", "sourceHandle": "value", "target": "slow", "targetHandle": "text"}},
        {{"source": "slow", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]}}"#
        )
    };
    let r = run_inner(&slow(r#""timeout_ms": 200, "#));
    assert_eq!(r["nodes"]["g/slow"]["status"], "failed", "{r:#}");
    assert_eq!(r["nodes"]["g/slow"]["timed_out"], true, "{r:#}");

    // The run's own limit, `[run] node_timeout_ms`, reaches inner nodes too.
    let mut config = std::fs::read_to_string(d.join("heddle.toml")).unwrap();
    config.push_str("\n[run]\nnode_timeout_ms = 200\n");
    write(d, "heddle.toml", &config);
    let r = run_inner(&slow(""));
    assert_eq!(r["nodes"]["g/slow"]["timed_out"], true, "{r:#}");
}

fn fixture(name: &str) -> String {
    root()
        .join("tests/fixtures/nodetool")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn a_saved_nodetool_workflow_runs_with_its_structural_types_read_as_heddles() {
    let path = fixture("greeting.json");
    let o = heddle(&["validate", "--json", &path]);
    expect_code(&o, OK);
    let v = json(&o);
    assert_eq!(v["name"], "Greeting card");
    assert!(
        v["description"].as_str().unwrap().contains("fixture"),
        "{v:#}"
    );
    let notes: Vec<(String, String)> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["kind"] == "imported")
        .map(|w| {
            (
                w["node"].as_str().unwrap().to_string(),
                w["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let note = |node: &str| {
        notes
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, m)| m.as_str())
            .unwrap_or_else(|| panic!("no note for {node}: {notes:?}"))
    };
    assert!(note("name_in").contains("`heddle.input` of type str"));
    assert!(note("times_in").contains("of type int"));
    assert!(note("scale_in").contains("of type float"));
    assert!(note("loud_in").contains("of type bool"));
    assert!(note("sep").contains("`heddle.constant`"));
    assert!(note("card").contains("`heddle.output`"));
    assert!(note("remark").contains("comment left out"));
    assert!(note("peek").contains("preview"));

    let o = heddle(&["run", "--json", &path, "--input", "name=ada"]);
    expect_code(&o, OK);
    let r = json(&o);
    assert_eq!(r["outputs"]["card"], json!(["HELLO, ADA"]), "{r:#}");
    assert_eq!(r["outputs"]["peek"], json!(["hello, ada"]), "{r:#}");
    // Said in the report too.
    assert!(
        r["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["node"] == "remark" && w["kind"] == "imported"),
        "{r:#}"
    );
}

#[test]
fn an_unknown_nodetool_type_names_the_package_it_comes_from() {
    let o = heddle(&["validate", "--json", &fixture("unknown-types.json")]);
    expect_code(&o, INVALID);
    let v = json(&o);
    let issues = v["issues"].as_array().unwrap();
    assert_eq!(issues.len(), 2, "{v:#}");
    for (node, package) in [("concat", "nodetool.text"), ("agent", "nodetool.agents")] {
        let i = issues
            .iter()
            .find(|i| i["node"] == node)
            .unwrap_or_else(|| panic!("{node}: {v:#}"));
        assert_eq!(i["kind"], "unknown_node_type");
        let m = i["message"].as_str().unwrap();
        assert!(
            m.contains(&format!(
                "NodeTool's package `{package}`; Heddle has no such node"
            )),
            "{m}"
        );
    }
}
