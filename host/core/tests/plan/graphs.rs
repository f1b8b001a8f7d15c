//! Graph nodes: ports from the inner graph, type checks across the boundary,
//! self-reference and depth, digests, and every kind of bad inner document as one issue
//! of the graph node.

use heddle_core::compose::{Bounds, Bundle, Composition, IncludeKey, sha256_hex};
use heddle_core::plan::plan_with;

use super::*;

/// An inner graph: `text` (str, default "hi") and `times` (int, no default) in,
/// `shout` out (fed by an upper-casing node, so typed str).
fn shout_doc() -> String {
    json!({
        "name": "shout", "description": "upper-cases its text",
        "nodes": [
            np("text", "heddle.input", json!({"type": "str", "value": "hi"})),
            np("times", "heddle.input", json!({"type": "int"})),
            n("up", "test.upper"),
            n("shout", "heddle.output")
        ],
        "edges": [
            ed("e1", "text", "value", "up", "text"),
            ed("e2", "up", "text", "shout", "value")
        ]
    })
    .to_string()
}

/// A graph node including `key`, pinned to `text`'s digest, with more properties.
fn graph_node(id: &str, key: &str, text: &str, more: serde_json::Value) -> serde_json::Value {
    let mut props = json!({"graph": key, "sha256": sha256_hex(text.as_bytes())});
    if let serde_json::Value::Object(m) = more {
        props.as_object_mut().unwrap().extend(m);
    }
    np(id, "heddle.graph", props)
}

/// Plans `top` (file `main.json`) with `docs` by key, nested at most `depth` levels.
fn composed_at(
    top: serde_json::Value,
    docs: &[(&str, &str)],
    depth: usize,
) -> Result<Plan, ValidationError> {
    let top = doc(top);
    let bundle = Bundle::new(
        docs.iter().map(|(k, t)| (k.to_string(), t.to_string())),
        "no such file (test)",
    );
    let main = IncludeKey::top(std::path::Path::new("main.json"));
    let comp = Composition::load(&top, main.as_ref(), &bundle, Bounds::depth(depth));
    plan_with(&top, &decls(), &comp)
}

fn composed(top: serde_json::Value, docs: &[(&str, &str)]) -> Result<Plan, ValidationError> {
    composed_at(top, docs, 8)
}

fn composed_err(top: serde_json::Value, docs: &[(&str, &str)]) -> ValidationError {
    match composed(top, docs) {
        Ok(_) => panic!("expected a validation error"),
        Err(e) => e,
    }
}

#[test]
fn a_graph_nodes_ports_are_its_inner_inputs_and_outputs_with_their_types() {
    let inner = shout_doc();
    let p = composed(
        json!({
            "nodes": [
                n("src", "test.text"),
                graph_node("g", "graphs/shout.json", &inner, json!({"times": 3})),
                n("after", "test.upper")
            ],
            "edges": [
                ed("in", "src", "text", "g", "text"),
                ed("out", "g", "shout", "after", "text")
            ]
        }),
        &[("graphs/shout.json", &inner)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = p.nodes.iter().map(|n| &*n.id).collect();
    for id in ["src", "g/text", "g/times", "g/up", "g/shout", "after"] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    assert!(
        !ids.contains(&"g"),
        "the graph node itself is expanded away"
    );
    let g = &p.graphs[0];
    assert_eq!(g.id, "g");
    assert_eq!(g.name.as_deref(), Some("shout"));
    assert!(!g.retry_safe, "a graph node is never retry-safe as a whole");
    let ports: Vec<(&str, String)> = g
        .inputs
        .iter()
        .chain(&g.outputs)
        .map(|p| (p.name.as_str(), p.ty.to_string()))
        .collect();
    assert_eq!(
        ports,
        [
            ("text", "str".to_string()),
            ("times", "int".to_string()),
            ("shout", "str".to_string())
        ]
    );
    assert_eq!(g.inputs[0].default, Some(Value::from("hi")));
    assert_eq!(g.nodes, ["g/shout", "g/text", "g/times", "g/up"]);
    // The unfed input takes the graph node's property of its name.
    let times = &p.nodes[node_idx(&p, "g/times")];
    assert_eq!(times.properties.get("value"), Some(&Value::Int(3)));
    // Edges keep their ids; inner ones are named under the graph node.
    let edge_ids: Vec<&str> = p.edges.iter().map(|e| &*e.id).collect();
    for id in ["in", "out", "g/e1", "g/e2"] {
        assert!(edge_ids.contains(&id), "{id} in {edge_ids:?}");
    }
    // What a durable run records to plan the same graph again.
    assert_eq!(p.included.len(), 1);
    assert_eq!(p.included[0].key.as_str(), "graphs/shout.json");
    assert_eq!(p.included[0].sha256, sha256_hex(inner.as_bytes()));
    assert_eq!(p.included[0].text, inner);
    // Inner nodes are plan nodes like any: the port nodes are retry-safe built-ins.
    assert!(p.nodes[node_idx(&p, "g/text")].decl.retry_safe);
}

#[test]
fn edges_across_the_boundary_are_type_checked_and_named_by_the_graph_nodes_handle() {
    let inner = shout_doc();
    let e = composed_err(
        json!({
            "nodes": [
                np("num", "test.add", json!({"a": 1})),
                graph_node("g", "shout.json", &inner, json!({"times": 1})),
                n("sum", "test.add")
            ],
            "edges": [
                ed("in", "num", "sum", "g", "text"),
                ed("out", "g", "shout", "sum", "a")
            ]
        }),
        &[("shout.json", &inner)],
    );
    let found = of_kind(&e, IssueKind::TypeMismatch);
    assert_eq!(found.len(), 2, "{e}");
    let (node, edge, handle, msg) = found[0];
    assert_eq!(
        (node, edge, handle),
        (Some("g"), Some("in"), Some("text")),
        "{e}"
    );
    assert!(msg.contains("`g.text` (str)"), "{msg}");
    let (node, edge, handle, msg) = found[1];
    assert_eq!(
        (node, edge, handle),
        (Some("sum"), Some("out"), Some("a")),
        "{e}"
    );
    assert!(msg.contains("output `g/shout.value` (str)"), "{msg}");
    assert_eq!(e.issues.len(), 2, "{e}");
}

#[test]
fn an_unknown_port_and_an_unfed_input_are_issues_of_the_graph_node() {
    let inner = shout_doc();
    let e = composed_err(
        json!({
            "nodes": [
                n("src", "test.text"),
                graph_node("g", "shout.json", &inner, json!({"loud": true})),
                n("after", "test.upper")
            ],
            "edges": [
                ed("in", "src", "text", "g", "txt"),
                ed("out", "g", "shout", "after", "text")
            ]
        }),
        &[("shout.json", &inner)],
    );
    let unknown = of_kind(&e, IssueKind::UnknownInputHandle);
    assert_eq!(unknown.len(), 1, "{e}");
    assert_eq!(unknown[0].0, Some("g"));
    assert!(
        unknown[0].3.contains("did you mean `text`"),
        "{}",
        unknown[0].3
    );
    let missing = of_kind(&e, IssueKind::MissingRequiredInput);
    assert_eq!(missing.len(), 1, "{e}");
    assert_eq!((missing[0].0, missing[0].2), (Some("g"), Some("times")));
    let property = of_kind(&e, IssueKind::UnknownProperty);
    assert_eq!(
        (property[0].0, property[0].2),
        (Some("g"), Some("loud")),
        "{e}"
    );
    assert_eq!(e.issues.len(), 3, "{e}");
}

#[test]
fn a_per_item_graph_node_runs_in_the_fan_outs_scope() {
    let inner = shout_doc();
    let p = composed(
        json!({
            "nodes": [
                np("list", "heddle.constant", json!({"value": ["a", "b"]})),
                n("each", "heddle.foreach"),
                graph_node("g", "shout.json", &inner, json!({"times": 2})),
                n("all", "heddle.collect")
            ],
            "edges": [
                ed("e1", "list", "value", "each", "list"),
                ed("e2", "each", "item", "g", "text"),
                ed("e3", "g", "shout", "all", "item")
            ]
        }),
        &[("shout.json", &inner)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inv_scope(&p, "g/up"), ["each:item"]);
    assert_eq!(out_scope(&p, "g/shout", "value"), ["each:item"]);
    assert_eq!(out_scope(&p, "all", "list"), Vec::<String>::new());
}

#[test]
fn graph_nodes_nest_and_name_their_nodes_by_path() {
    let inner = shout_doc();
    // `wrap.json` holds a graph node including `shout.json` beside it.
    let wrap = json!({
        "nodes": [
            np("words", "heddle.input", json!({"type": "str"})),
            graph_node("s", "shout.json", &inner, json!({"times": 1})),
            n("loud", "heddle.output")
        ],
        "edges": [
            ed("a", "words", "value", "s", "text"),
            ed("b", "s", "shout", "loud", "value")
        ]
    })
    .to_string();
    let p = composed(
        json!({
            "nodes": [
                n("src", "test.text"),
                graph_node("w", "lib/wrap.json", &wrap, json!({})),
                n("after", "test.upper")
            ],
            "edges": [
                ed("in", "src", "text", "w", "words"),
                ed("out", "w", "loud", "after", "text")
            ]
        }),
        &[("lib/wrap.json", &wrap), ("lib/shout.json", &inner)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(p.node_index("w/s/up").is_some());
    assert_eq!(p.graphs.len(), 2);
    assert_eq!(p.graphs[1].id, "w/s");
    assert_eq!(p.graphs[1].key.as_str(), "lib/shout.json");
    // The output type flows out through both boundaries.
    assert_eq!(p.graphs[0].outputs[0].ty, t("str"));
    assert!(p.graphs[0].nodes.contains(&"w/s/up".to_string()));
}

#[test]
fn a_graph_that_includes_itself_is_refused_naming_the_chain() {
    // Directly: main.json includes main.json.
    let e = composed_err(
        json!({"nodes": [np("g", "heddle.graph", json!({"graph": "main.json", "sha256": "00"}))]}),
        &[],
    );
    let found = of_kind(&e, IssueKind::GraphCycle);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].0, Some("g"));
    assert!(
        found[0].3.contains("main.json → g (main.json)"),
        "{}",
        found[0].3
    );
    assert_eq!(e.issues.len(), 1, "{e}");

    // Indirectly: a.json includes b.json, which includes a.json.
    let b_text = |a_sha: &str| {
        json!({"nodes": [
            np("back", "heddle.graph", json!({"graph": "a.json", "sha256": a_sha})),
            n("o", "heddle.output")
        ]})
        .to_string()
    };
    let b = b_text("unused");
    let a = json!({"nodes": [
        graph_node("to_b", "b.json", &b, json!({})),
        n("o", "heddle.output")
    ]})
    .to_string();
    let e = composed_err(
        json!({"nodes": [graph_node("g", "a.json", &a, json!({}))]}),
        &[("a.json", &a), ("b.json", &b)],
    );
    let found = of_kind(&e, IssueKind::GraphCycle);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].0, Some("g/to_b/back"));
    assert!(
        found[0]
            .3
            .contains("main.json → g (a.json) → g/to_b (b.json) → g/to_b/back (a.json)"),
        "{}",
        found[0].3
    );
}

#[test]
fn nesting_deeper_than_the_cap_is_refused() {
    // d0 includes d1 includes d2 includes leaf: three levels below the top.
    let leaf = shout_doc();
    let mut docs: Vec<(String, String)> = vec![("leaf.json".into(), leaf.clone())];
    let mut below = ("leaf.json".to_string(), leaf);
    for i in (0..2).rev() {
        let (props, out) = if i == 1 {
            (json!({"times": 1}), "shout")
        } else {
            (json!({}), "o")
        };
        let text = json!({"nodes": [
            graph_node("next", &below.0, &below.1, props),
            n("o", "heddle.output")
        ], "edges": [ed("x", "next", out, "o", "value")]})
        .to_string();
        below = (format!("d{i}.json"), text.clone());
        docs.push(below.clone());
    }
    let top = json!({"nodes": [graph_node("g", &below.0, &below.1, json!({})), n("o", "heddle.output")],
                     "edges": [ed("x", "g", "o", "o", "value")]});
    let refs: Vec<(&str, &str)> = docs.iter().map(|(k, t)| (k.as_str(), t.as_str())).collect();
    if let Err(e) = composed_at(top.clone(), &refs, 3) {
        panic!("{e}");
    }
    let e = composed_at(top, &refs, 2).unwrap_err();
    let found = of_kind(&e, IssueKind::GraphDepth);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].0, Some("g/next/next"));
    assert!(
        found[0].3.contains("deeper than 2 levels"),
        "{}",
        found[0].3
    );
    assert_eq!(e.issues.len(), 1, "{e}");
}

#[test]
fn a_changed_or_unpinned_document_is_refused_with_the_digest_to_pin() {
    let inner = shout_doc();
    let sha = sha256_hex(inner.as_bytes());
    let top = |pin: serde_json::Value| {
        json!({"nodes": [
            np("g", "heddle.graph", json!({"graph": "shout.json", "sha256": pin, "times": 1})),
            n("o", "heddle.output")
        ], "edges": [ed("x", "g", "shout", "o", "value")]})
    };
    let e = composed_err(top(json!(null)), &[("shout.json", &inner)]);
    let found = of_kind(&e, IssueKind::GraphDigest);
    assert_eq!(found.len(), 1, "{e}");
    assert!(
        found[0].3.contains(&format!("\"sha256\": \"{sha}\"")),
        "{}",
        found[0].3
    );
    assert_eq!(e.issues.len(), 1, "{e}");

    let old = "0".repeat(64);
    let e = composed_err(top(json!(old)), &[("shout.json", &inner)]);
    let found = of_kind(&e, IssueKind::GraphDigest);
    assert_eq!(found.len(), 1, "{e}");
    assert!(
        found[0].3.contains("changed since it was pinned"),
        "{}",
        found[0].3
    );
    assert!(found[0].3.contains(&sha), "{}", found[0].3);
    assert_eq!(e.issues.len(), 1, "{e}");
}

/// Bad inner documents: each is one issue, of the graph node, and nothing else.
#[test]
fn a_bad_inner_document_is_one_issue_of_the_graph_node() {
    let with = |text: &str| {
        json!({"nodes": [
            n("src", "test.text"),
            graph_node("g", "bad.json", text, json!({})),
            n("after", "test.upper")
        ], "edges": [
            ed("in", "src", "text", "g", "text"),
            ed("out", "g", "shout", "after", "text")
        ]})
    };
    let one = |top: serde_json::Value, docs: &[(&str, &str)]| -> (IssueKind, String) {
        let e = composed_err(top, docs);
        assert_eq!(e.issues.len(), 1, "{e}");
        assert_eq!(e.issues[0].node.as_deref(), Some("g"), "{e}");
        (e.issues[0].kind, e.issues[0].message.clone())
    };

    // Missing.
    let (kind, msg) = one(with("{}"), &[]);
    assert_eq!(kind, IssueKind::InvalidGraphNode);
    assert!(msg.contains("cannot read graph document bad.json"), "{msg}");

    // Malformed, with file, line and column.
    let bad = "{\n  \"nodes\": [\n    {\"id\": }\n  ]\n}";
    let (kind, msg) = one(with(bad), &[("bad.json", bad)]);
    assert_eq!(kind, IssueKind::InvalidGraphNode);
    assert!(msg.starts_with("bad.json:3:"), "{msg}");
    assert!(msg.contains("invalid graph JSON"), "{msg}");

    // Not UTF-8 cannot reach a bundle (text); no outputs can.
    let no_out = json!({"nodes": [np("text", "heddle.input", json!({"type": "str"}))]}).to_string();
    let top = json!({"nodes": [n("src", "test.text"), graph_node("g", "bad.json", &no_out, json!({}))],
                     "edges": [ed("in", "src", "text", "g", "text")]});
    let (kind, msg) = one(top, &[("bad.json", &no_out)]);
    assert_eq!(kind, IssueKind::InvalidGraphNode);
    assert!(msg.contains("has no `heddle.output` node"), "{msg}");

    // Two outputs of one name.
    let clash = json!({"nodes": [
        np("text", "heddle.input", json!({"type": "str"})),
        n("up", "test.upper"),
        n("shout", "heddle.output"),
        np("again", "heddle.output", json!({"name": "shout"}))
    ], "edges": [
        ed("a", "text", "value", "up", "text"),
        ed("b", "up", "text", "shout", "value"),
        ed("c", "up", "text", "again", "value")
    ]})
    .to_string();
    let (kind, msg) = one(with(&clash), &[("bad.json", &clash)]);
    assert_eq!(kind, IssueKind::InvalidGraphNode);
    assert!(msg.contains("two outputs named `shout`"), "{msg}");
}

#[test]
fn a_graph_node_without_a_source_is_refused_by_plain_planning() {
    let e = err(json!({"nodes": [
        np("g", "heddle.graph", json!({"graph": "x.json", "sha256": "00"})),
        n("o", "heddle.output")
    ], "edges": [ed("e", "g", "out", "o", "value")]}));
    assert_eq!(e.issues.len(), 1, "{e}");
    assert_eq!(e.issues[0].kind, IssueKind::InvalidGraphNode);
    assert!(e.issues[0].message.contains("no graph source"), "{e}");
}

#[test]
fn limits_written_on_a_graph_node_are_refused() {
    let inner = shout_doc();
    let e = composed_err(
        json!({"nodes": [
            {"id": "g", "type": "heddle.graph", "timeout_ms": 100,
             "properties": {"graph": "s.json", "sha256": sha256_hex(inner.as_bytes()), "times": 1}},
            n("o", "heddle.output")
        ], "edges": [ed("e", "g", "shout", "o", "value")]}),
        &[("s.json", &inner)],
    );
    let found = of_kind(&e, IssueKind::InvalidLimits);
    assert_eq!(found.len(), 1, "{e}");
    assert!(found[0].3.contains("timeout_ms"), "{}", found[0].3);
}

#[test]
fn nodetool_structural_types_are_read_as_heddles() {
    let d = GraphDoc::parse(
        &json!({
            "id": "wf1", "name": "Greeter", "description": "says hello",
            "graph": {
                "nodes": [
                    {"id": "who", "type": "nodetool.input.StringInput",
                     "data": {"name": "who", "value": "ada", "label": "Who", "description": ""}},
                    {"id": "n", "type": "nodetool.constant.Integer", "data": {"value": 2}},
                    {"id": "note", "type": "nodetool.workflows.base_node.Comment", "data": {"comment": "hi"}},
                    {"id": "up", "type": "test.upper", "data": {}},
                    {"id": "show", "type": "nodetool.workflows.base_node.Preview", "data": {"name": "seen"}},
                    {"id": "out", "type": "nodetool.output.StringOutput", "data": {"name": "greeting"}},
                    {"id": "sink", "type": "test.add", "data": {}}
                ],
                "edges": [
                    {"id": "e1", "source": "who", "sourceHandle": "output", "target": "up", "targetHandle": "text"},
                    {"id": "e2", "source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"},
                    {"id": "e3", "source": "up", "sourceHandle": "text", "target": "show", "targetHandle": "value"},
                    {"id": "e4", "source": "n", "sourceHandle": "output", "target": "sink", "targetHandle": "a"}
                ]
            }
        })
        .to_string(),
        "greeter.json",
    )
    .unwrap();
    assert_eq!(d.name.as_deref(), Some("Greeter"));
    assert_eq!(d.description.as_deref(), Some("says hello"));
    let p = plan(&d, &decls()).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.node_index("note").is_none(), "comments are left out");
    let input = p.input("who").unwrap();
    assert_eq!(input.ty, t("str"));
    assert_eq!(input.default, Some(Value::from("ada")));
    let notes: Vec<(&str, &str)> = p
        .warnings
        .iter()
        .filter(|w| w.kind == IssueKind::Imported)
        .map(|w| (w.node.as_deref().unwrap(), w.message.as_str()))
        .collect();
    assert_eq!(notes.len(), 5, "{notes:?}");
    assert!(
        notes
            .iter()
            .any(|(n, m)| *n == "show" && m.contains("output `seen`"))
    );
}

#[test]
fn an_unknown_nodetool_type_names_its_package() {
    let e = err(json!({"nodes": [{"id": "cat", "type": "nodetool.text.Concat", "data": {}}]}));
    let found = of_kind(&e, IssueKind::UnknownNodeType);
    assert!(
        found[0]
            .3
            .contains("NodeTool's package `nodetool.text`; Heddle has no such node"),
        "{}",
        found[0].3
    );
}

#[test]
fn expansion_stops_at_its_node_bound() {
    // Each level includes the one below three times: 3 + 9 + 27 inner nodes and more.
    let mut below = shout_doc();
    let mut docs: Vec<(String, String)> = vec![("l0.json".into(), below.clone())];
    for i in 1..4 {
        let key = format!("l{}.json", i - 1);
        let nodes: Vec<serde_json::Value> = (0..3)
            .map(|k| graph_node(&format!("g{k}"), &key, &below, json!({"times": 1})))
            .chain([n("o", "heddle.output")])
            .collect();
        below = json!({"nodes": nodes}).to_string();
        docs.push((format!("l{i}.json"), below.clone()));
    }
    let top = doc(json!({"nodes": [graph_node("g", "l3.json", &below, json!({}))]}));
    let bundle = Bundle::new(docs, "no such file (test)");
    let comp = Composition::load(
        &top,
        None,
        &bundle,
        Bounds {
            depth: 8,
            nodes: 50,
        },
    );
    let over: Vec<_> = comp
        .issues()
        .iter()
        .filter(|i| i.message.contains("expand into more than 50 nodes"))
        .collect();
    assert_eq!(over.len(), 1, "{:?}", comp.issues());
}

/// An inner graph whose input `s` takes a stream (`streaming: true`) into `up`.
fn streaming_doc() -> String {
    json!({"nodes": [
        np("s", "heddle.input", json!({"type": "str", "streaming": true})),
        n("up", "test.upper"),
        n("o", "heddle.output")
    ], "edges": [
        ed("a", "s", "value", "up", "text"),
        ed("b", "up", "text", "o", "value")
    ]})
    .to_string()
}

#[test]
fn a_streaming_inner_input_is_planned_as_a_stream_whatever_feeds_it() {
    let inner = streaming_doc();
    let through = |source: serde_json::Value| {
        composed(
            json!({"nodes": [
                source,
                graph_node("g", "s.json", &inner, json!({})),
                n("out", "heddle.output")
            ], "edges": [
                ed("in", "src", "value", "g", "s"),
                ed("x", "g", "o", "out", "value")
            ]}),
            &[("s.json", &inner)],
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    // Fed by a stream outside, or by one value: inside, `up` is driven by a stream as
    // it is when the inner graph runs on its own.
    for source in [
        np("src", "heddle.input", json!({"streaming": true})),
        np("src", "heddle.constant", json!({"value": "one"})),
    ] {
        let p = through(source);
        assert!(p.graphs[0].inputs[0].streaming);
        let port = &p.correlation.nodes[node_idx(&p, "g/s")];
        assert!(port.outputs["value"].repeats_per_key);
        let up = &p.correlation.nodes[node_idx(&p, "g/up")];
        assert_eq!(up.repeating_driver.as_deref(), Some("text"));
        assert!(
            p.correlation.nodes[node_idx(&p, "g/o")].outputs["value"].repeats_per_key,
            "the stream leaves the graph node as one"
        );
    }

    // What the inner graph may not do on its own, it may not do inside a graph node: a
    // plain node combining the stream with itself needs a join.
    let diamond = json!({"nodes": [
        np("s", "heddle.input", json!({"streaming": true})),
        n("a", "heddle.passthrough"), n("b", "heddle.passthrough"),
        n("c", "test.pair"), n("o", "heddle.output")
    ], "edges": [
        ed("sa", "s", "value", "a", "value"), ed("sb", "s", "value", "b", "value"),
        ed("ac", "a", "value", "c", "a"), ed("bc", "b", "value", "c", "b"),
        ed("co", "c", "pair", "o", "value")
    ]})
    .to_string();
    let alone = err(serde_json::from_str(&diamond).unwrap());
    assert_eq!(of_kind(&alone, IssueKind::Correlation).len(), 1, "{alone}");
    let e = composed_err(
        json!({"nodes": [
            np("src", "heddle.constant", json!({"value": 1})),
            graph_node("g", "d.json", &diamond, json!({}))
        ], "edges": [ed("in", "src", "value", "g", "s")]}),
        &[("d.json", &diamond)],
    );
    let found = of_kind(&e, IssueKind::Correlation);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].0, Some("g/c"), "{e}");

    // Nothing pushes into a graph node's streaming input: unfed, it is refused saying so.
    let e = composed_err(
        json!({"nodes": [graph_node("g", "s.json", &inner, json!({}))]}),
        &[("s.json", &inner)],
    );
    let found = of_kind(&e, IssueKind::MissingRequiredInput);
    assert_eq!(found.len(), 1, "{e}");
    assert!(found[0].3.contains("streaming input"), "{}", found[0].3);
}

/// An inner graph whose `parse` declares the fields of its result and whose edge to the
/// output keeps only `ok` results and their `status` and `n`.
fn declared_doc() -> String {
    json!({"nodes": [
        np("text", "heddle.input", json!({"type": "str"})),
        {"id": "parse", "type": "test.code", "properties": {"code": "parse"},
         "output": {"fields": [{"key": "status", "type": "string"}, {"key": "n", "type": "integer"}]}},
        n("o", "heddle.output")
    ], "edges": [
        ed("a", "text", "value", "parse", "text"),
        {"id": "keep", "source": "parse", "sourceHandle": "result", "target": "o",
         "targetHandle": "value", "when": "fields.status = \"ok\"", "fields": ["status", "n"]}
    ]})
    .to_string()
}

#[test]
fn declarations_inside_a_graph_node_apply_and_its_outputs_carry_the_declared_fields() {
    let inner = declared_doc();
    let top = |edge: serde_json::Value| {
        json!({"nodes": [
            n("src", "test.text"),
            graph_node("g", "d.json", &inner, json!({})),
            np("after", "test.code", json!({"code": "after"}))
        ], "edges": [
            ed("in", "src", "text", "g", "text"),
            edge
        ]})
    };
    let leave = |rule: serde_json::Value| {
        let mut e = json!({"id": "out", "source": "g", "sourceHandle": "o",
                           "target": "after", "targetHandle": "x"});
        e.as_object_mut()
            .unwrap()
            .extend(rule.as_object().unwrap().clone());
        e
    };
    let p = composed(
        top(leave(json!({"when": "fields.n > 1", "fields": ["n"]}))),
        &[("d.json", &inner)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The inner edge keeps its rule under the graph node's path.
    let keep = p.edges.iter().find(|e| &*e.id == "g/keep").unwrap();
    let rule = keep.rule.as_deref().expect("the inner edge's rule");
    assert!(rule.when.is_some() && rule.source_fields);
    assert_eq!(
        rule.fields.as_deref().map(|f| f.len()),
        Some(2),
        "{:?}",
        rule.fields
    );
    // The inner producer's contract is kept, and its output port carries its fields.
    let parse = &p.nodes[node_idx(&p, "g/parse")];
    assert_eq!(parse.contract.as_ref().unwrap().contract.fields.len(), 2);
    let port = &p.nodes[node_idx(&p, "g/o")];
    let forwarded = port.contract.as_ref().expect("the port's fields");
    assert_eq!(&*forwarded.handle, "value");
    let keys: Vec<&str> = forwarded
        .contract
        .fields
        .iter()
        .map(|f| f.key.as_str())
        .collect();
    assert_eq!(keys, ["status", "n"]);
    // So an edge leaving the graph node reads `fields.…` and selects declared keys...
    let out = p.edges.iter().find(|e| &*e.id == "out").unwrap();
    assert!(out.rule.as_deref().unwrap().source_fields);

    // ...and one selecting a key the producer does not declare is refused, as it would
    // be on an edge leaving the producer itself.
    let e = composed_err(
        top(leave(json!({"fields": ["nope"]}))),
        &[("d.json", &inner)],
    );
    let found = of_kind(&e, IssueKind::InvalidEdgeRule);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].1, Some("out"), "{e}");
    assert!(
        found[0].3.contains("nope") && found[0].3.contains("does not declare"),
        "{}",
        found[0].3
    );

    // A condition inside that cannot be evaluated is refused under its path.
    let broken = inner.replace("fields.status = \\\"ok\\\"", "fields.status = = 1");
    assert_ne!(broken, inner);
    let e = composed_err(
        json!({"nodes": [n("src", "test.text"), graph_node("g", "d.json", &broken, json!({}))],
               "edges": [ed("in", "src", "text", "g", "text")]}),
        &[("d.json", &broken)],
    );
    let found = of_kind(&e, IssueKind::InvalidEdgeRule);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].1, Some("g/keep"), "{e}");
}

#[test]
fn an_inner_id_with_a_slash_and_an_input_named_like_a_property_are_refused() {
    let slash = json!({"nodes": [
        np("text", "heddle.input", json!({"type": "str"})),
        n("a/b", "test.upper"),
        n("o", "heddle.output")
    ], "edges": [
        ed("x", "text", "value", "a/b", "text"),
        ed("y", "a/b", "text", "o", "value")
    ]})
    .to_string();
    let e = composed_err(
        json!({"nodes": [n("src", "test.text"), graph_node("g", "s.json", &slash, json!({}))],
               "edges": [ed("in", "src", "text", "g", "text")]}),
        &[("s.json", &slash)],
    );
    let found = of_kind(&e, IssueKind::InvalidGraphNode);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].0, Some("g/a/b"), "{e}");
    assert!(
        found[0].3.contains("node id contains `/`"),
        "{}",
        found[0].3
    );

    let named = json!({"nodes": [
        np("graph", "heddle.input", json!({"type": "str", "value": "x"})),
        n("up", "test.upper"),
        n("o", "heddle.output")
    ], "edges": [
        ed("x", "graph", "value", "up", "text"),
        ed("y", "up", "text", "o", "value")
    ]})
    .to_string();
    let e = composed_err(
        json!({"nodes": [graph_node("g", "n.json", &named, json!({}))]}),
        &[("n.json", &named)],
    );
    let found = of_kind(&e, IssueKind::InvalidGraphNode);
    assert_eq!(found.len(), 1, "{e}");
    assert_eq!(found[0].0, Some("g"), "{e}");
    assert_eq!(found[0].2, Some("graph"), "{e}");
    assert!(
        found[0].3.contains("name of a graph node's own property"),
        "{}",
        found[0].3
    );
}

#[test]
fn a_loop_back_to_the_top_through_another_spelling_is_a_cycle() {
    use heddle_core::compose::FileSource;
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("dir");
    std::fs::create_dir(&sub).unwrap();
    // dir/g.json includes ../dir/g.json: itself, spelt through its parent.
    let text = json!({"nodes": [
        np("again", "heddle.graph", json!({"graph": "../dir/g.json", "sha256": "00"})),
        n("o", "heddle.output")
    ]})
    .to_string();
    let path = sub.join("g.json");
    std::fs::write(&path, &text).unwrap();
    let top = doc(serde_json::from_str(&text).unwrap());
    let comp = Composition::load(
        &top,
        IncludeKey::top(&path).as_ref(),
        &FileSource::beside(&path),
        Bounds::default(),
    );
    let cycles: Vec<_> = comp
        .issues()
        .iter()
        .filter(|i| i.kind == IssueKind::GraphCycle)
        .collect();
    assert_eq!(cycles.len(), 1, "{:?}", comp.issues());
    assert_eq!(cycles[0].node.as_deref(), Some("again"));
    assert!(
        cycles[0].message.contains("g.json → again (../dir/g.json)"),
        "{}",
        cycles[0].message
    );
    assert_eq!(comp.issues().len(), 1, "{:?}", comp.issues());
}
