//! Typed graph inputs: listing, defaults and binding values to them.

use super::*;

#[test]
fn typed_input_narrows_its_output_and_checks_its_default() {
    let e = err(json!({
        "nodes": [np("in", "heddle.input", json!({"type": "str", "value": 3})),
                  np("bad", "heddle.input", json!({"type": "widget"})),
                  n("a", "test.add")],
        "edges": [ed("e1", "in", "value", "a", "a")]
    }));
    let t = of_kind(&e, IssueKind::TypeMismatch);
    assert_eq!(t.len(), 1, "{e}");
    assert!(
        t[0].3.contains("(str)") && t[0].3.contains("(int)"),
        "{}",
        t[0].3
    );
    let p = of_kind(&e, IssueKind::InvalidProperty);
    let at: Vec<_> = p.iter().map(|i| (i.0.unwrap(), i.2.unwrap())).collect();
    assert_eq!(at, [("bad", "type"), ("in", "value")], "{e}");

    let plan = ok(json!({
        "nodes": [np("in", "heddle.input", json!({"type": "float", "value": 3})), n("s", "test.scale")],
        "edges": [ed("e1", "in", "value", "s", "x")]
    }));
    assert_eq!(plan.nodes[0].properties["value"], Value::Float(3.0));
}

#[test]
fn inputs_are_listed_with_their_name_type_default_and_streaming_flag() {
    let p = ok(json!({
        "nodes": [np("b", "heddle.input", json!({"name": "text", "type": "str"})),
                  np("a", "heddle.input", json!({"type": "float", "value": 2})),
                  np("s", "heddle.input", json!({"name": "feed", "streaming": true})),
                  n("c", "heddle.constant")],
        "edges": []
    }));
    let got: Vec<_> = p
        .inputs()
        .iter()
        .map(|i| {
            (
                &*i.name,
                &*i.node_id,
                i.ty.to_string(),
                i.default.clone(),
                i.streaming,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("text", "b", "str".to_string(), None, false),
            (
                "a",
                "a",
                "float".to_string(),
                Some(Value::Float(2.0)),
                false
            ),
            ("feed", "s", "any".to_string(), None, true),
        ]
    );
    for i in p.inputs() {
        assert_eq!(&*p.nodes[i.node as usize].id, &*i.node_id);
    }
}

#[test]
fn binding_inputs_reports_every_problem_and_falls_back_to_defaults() {
    let p = ok(json!({
        "nodes": [np("t", "heddle.input", json!({"name": "text", "type": "str"})),
                  np("n", "heddle.input", json!({"name": "n", "type": "float", "value": 1})),
                  np("m", "heddle.input", json!({"name": "m", "type": "int"})),
                  np("s", "heddle.input", json!({"name": "feed", "streaming": true}))],
        "edges": []
    }));
    let values = |pairs: &[(&str, Value)]| -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    let e = p
        .bind_inputs(&values(&[
            ("txt", Value::from("x")),
            ("text", Value::Int(3)),
        ]))
        .unwrap_err();
    let kinds: Vec<String> = e.0.iter().map(|i| i.to_string()).collect();
    assert_eq!(kinds.len(), 3, "{e}");
    assert!(
        kinds[0].contains("no input named `txt`") && kinds[0].contains("inputs: text, n, m, feed"),
        "{e}"
    );
    assert!(
        matches!(&e.0[1], InputError::Type { name, node, .. } if name == "text" && node == "t"),
        "{e}"
    );
    assert!(
        matches!(&e.0[2], InputError::Missing { name, .. } if name == "m"),
        "{e}"
    );

    let bound = p
        .bind_inputs(&values(&[
            ("text", Value::from("hi")),
            ("m", Value::Int(4)),
        ]))
        .unwrap();
    let at = |id: &str| bound.get(node_idx(&p, id) as u32).cloned();
    assert_eq!(at("t"), Some(Value::from("hi")));
    assert_eq!(at("n"), Some(Value::Float(1.0)), "the default, as its type");
    assert_eq!(at("m"), Some(Value::Int(4)));
    assert_eq!(at("s"), None, "a streaming input waits for pushed values");
    let n = p.input("n").unwrap();
    assert_eq!(n.check(Value::Int(2)), Ok(Value::Float(2.0)));
    assert!(p.input("nope").is_err());
}

#[test]
fn outputs_sharing_a_name_are_warned() {
    let p = ok(json!({
        "nodes": [n("c", "heddle.constant"),
                  np("o1", "heddle.output", json!({"name": "r"})),
                  np("o2", "heddle.output", json!({"name": "r"}))],
        "edges": [ed("a", "c", "value", "o1", "value"), ed("b", "c", "value", "o2", "value")]
    }));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert_eq!(p.warnings[0].node.as_deref(), Some("o2"));
}

#[test]
fn control_output_handle_is_a_valid_control_source() {
    let p = ok(json!({
        "nodes": [n("agent", "test.agent"), n("g", "test.gate")],
        "edges": [{"id": "c", "source": "agent", "sourceHandle": "__control_output__",
                   "target": "g", "targetHandle": "__control__", "edge_type": "control"}]
    }));
    assert_eq!(p.edges.len(), 1);
}
