//! The first-party `std` package, one invocation at a time through the executor seam.

mod common;

use common::*;
use heddle_core::{NodeMode, Value};
use heddle_kernel::{ErrorKind, NodeProvider};
use heddle_wasm::WasmProvider;
use serde_json::json;
use tokio::sync::OnceCell;

async fn std_provider() -> &'static WasmProvider {
    static P: OnceCell<WasmProvider> = OnceCell::const_new();
    P.get_or_init(|| first_party_provider(Default::default()))
        .await
}

fn j(v: serde_json::Value) -> Value {
    Value::from_json(v)
}

async fn ok(t: &str, ins: serde_json::Value) -> Value {
    let i = ins
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), j(v.clone())))
        .collect();
    let (r, _, _) = invoke(std_provider().await, t, i, None).await;
    let out = r.unwrap_or_else(|e| panic!("{t}: {e:?}"));
    Value::object(out.to_map().into_iter().collect())
}

async fn err(t: &str, ins: serde_json::Value) -> heddle_kernel::NodeError {
    let i = ins
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), j(v.clone())))
        .collect();
    let (r, _, _) = invoke(std_provider().await, t, i, None).await;
    r.expect_err(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarations_are_typed_and_pure_nodes_retry_safe() {
    let decls = std_provider().await.declarations();
    let concat = decls
        .iter()
        .find(|d| d.type_name == "std.text.concat")
        .unwrap();
    assert_eq!(concat.title, "Concatenate strings");
    assert!(concat.retry_safe);
    assert_eq!(concat.input("a").unwrap().ty.to_string(), "str");
    assert!(concat.input("a").unwrap().required);
    assert_eq!(concat.input("sep").unwrap().default, Some(Value::str("")));
    assert_eq!(concat.output("text").unwrap().ty.to_string(), "str");
    let zip = decls
        .iter()
        .find(|d| d.type_name == "std.list.zip")
        .unwrap();
    assert_eq!(
        zip.output("pairs").unwrap().ty.to_string(),
        "list[list[any]]"
    );
    let split = decls
        .iter()
        .find(|d| d.type_name == "std.text.split")
        .unwrap();
    assert!(
        !split.input("sep").unwrap().required,
        "Option<T> is optional"
    );
    let lines = decls
        .iter()
        .find(|d| d.type_name == "std.text.lines")
        .unwrap();
    assert_eq!(lines.mode, NodeMode::StreamingOutput);
    let rs = decls
        .iter()
        .find(|d| d.type_name == "std.math.running_sum")
        .unwrap();
    assert_eq!(rs.mode, NodeMode::StreamingInput);
    for d in decls.iter().filter(|d| d.type_name.starts_with("std.")) {
        if d.type_name != "std.math.running_sum" {
            assert!(d.retry_safe, "{} should be retry-safe", d.type_name);
        }
    }
    let files = decls
        .iter()
        .find(|d| d.type_name == "files.write_text")
        .unwrap();
    assert!(!files.retry_safe);
    assert!(!files.capabilities.is_empty() && !files.capabilities[0].reason.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_nodes() {
    assert_eq!(
        ok("std.text.concat", json!({"a": "x", "b": "y", "sep": "-"})).await,
        j(json!({"text": "x-y"}))
    );
    assert_eq!(
        ok(
            "std.text.format",
            json!({"template": "{{ {name} is {age} }}", "values": {"name": "Ada", "age": 36}})
        )
        .await,
        j(json!({"text": "{ Ada is 36 }"}))
    );
    let e = err(
        "std.text.format",
        json!({"template": "{missing}", "values": {}}),
    )
    .await;
    assert_eq!(e.signature.as_deref(), Some("format:missing"));
    assert_eq!(
        ok("std.text.split", json!({"text": "a,b,,c", "sep": ","})).await,
        j(json!({"parts": ["a", "b", "", "c"]}))
    );
    assert_eq!(
        ok("std.text.split", json!({"text": " a  b "})).await,
        j(json!({"parts": ["a", "b"]}))
    );
    assert_eq!(
        ok(
            "std.text.join",
            json!({"items": ["a", 1, true], "sep": "/"})
        )
        .await,
        j(json!({"text": "a/1/true"}))
    );
    assert_eq!(
        ok(
            "std.text.regex_match",
            json!({"text": "id=42 id=7", "pattern": "id=(\\d+)"})
        )
        .await,
        j(json!({"matched": true, "first": "id=42", "groups": ["42"], "all": ["id=42", "id=7"]}))
    );
    assert_eq!(
        ok(
            "std.text.regex_replace",
            json!({"text": "a1b22", "pattern": "\\d+", "replacement": "#"})
        )
        .await,
        j(json!({"text": "a#b#"}))
    );
    let e = err("std.text.regex_match", json!({"text": "x", "pattern": "("})).await;
    assert_eq!(e.kind, ErrorKind::Node);
    assert_eq!(e.signature.as_deref(), Some("regex:syntax"));
    assert_eq!(
        ok(
            "std.text.case",
            json!({"text": "Hello World", "mode": "snake"})
        )
        .await,
        j(json!({"text": "hello_world"}))
    );
    assert_eq!(
        ok(
            "std.text.case",
            json!({"text": "hello world", "mode": "title"})
        )
        .await,
        j(json!({"text": "Hello World"}))
    );
    let e = err("std.text.concat", json!({"a": 1, "b": "y"})).await;
    assert!(e.message.contains("input `a`"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn math_nodes() {
    assert_eq!(
        ok("std.math.arith", json!({"a": 2, "b": 3, "op": "pow"})).await,
        j(json!({"result": 8}))
    );
    assert_eq!(
        ok("std.math.arith", json!({"a": 7, "b": 2, "op": "div"})).await,
        j(json!({"result": 3.5}))
    );
    assert_eq!(
        err("std.math.arith", json!({"a": 1, "b": 0, "op": "div"}))
            .await
            .signature
            .as_deref(),
        Some("math:div0")
    );
    assert_eq!(
        ok("std.math.compare", json!({"a": 2, "b": 2.5, "op": "lt"})).await,
        j(json!({"result": true}))
    );
    assert_eq!(
        ok("std.math.compare", json!({"a": "b", "b": "a", "op": "gt"})).await,
        j(json!({"result": true}))
    );
    assert_eq!(
        ok(
            "std.math.aggregate",
            json!({"items": [1, 2, 3, 4], "op": "mean"})
        )
        .await,
        j(json!({"result": 2.5}))
    );
    assert_eq!(
        ok(
            "std.math.aggregate",
            json!({"items": [4, 1.5], "op": "min"})
        )
        .await,
        j(json!({"result": 1.5}))
    );
    assert_eq!(
        err("std.math.aggregate", json!({"items": [], "op": "max"}))
            .await
            .signature
            .as_deref(),
        Some("math:empty")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nodes() {
    assert_eq!(
        ok(
            "std.json.parse",
            json!({"text": "{\"a\": [1, {\"b\": \"c\"}]}"})
        )
        .await,
        j(json!({"value": {"a": [1, {"b": "c"}]}}))
    );
    let e = err("std.json.parse", json!({"text": "{broken"})).await;
    assert_eq!(e.kind, ErrorKind::Node);
    assert_eq!(e.signature.as_deref(), Some("json:parse"));
    assert_eq!(
        e.candidate.unwrap().get("value"),
        Some(&Value::str("{broken")),
        "raw text is the candidate"
    );
    assert_eq!(
        ok(
            "std.json.get",
            json!({"value": {"a": [1, {"b": "c"}]}, "path": "a.-1.b"})
        )
        .await,
        j(json!({"value": "c"}))
    );
    assert_eq!(
        err("std.json.get", json!({"value": {}, "path": "x.y"}))
            .await
            .signature
            .as_deref(),
        Some("json:path")
    );
    assert_eq!(
        ok(
            "std.json.get",
            json!({"value": {}, "path": "x", "default": 5})
        )
        .await,
        j(json!({"value": 5}))
    );
    assert_eq!(
        ok("std.json.stringify", json!({"value": {"a": [1, 2]}})).await,
        j(json!({"text": "{\"a\":[1,2]}"}))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_nodes() {
    assert_eq!(
        ok("std.list.length", json!({"items": [1, 2, 3]})).await,
        j(json!({"length": 3}))
    );
    assert_eq!(
        ok(
            "std.list.slice",
            json!({"items": [1, 2, 3, 4], "start": 1, "end": -1})
        )
        .await,
        j(json!({"items": [2, 3]}))
    );
    assert_eq!(
        ok("std.list.sort", json!({"items": [3, 1.5, 2]})).await,
        j(json!({"items": [1.5, 2, 3]}))
    );
    assert_eq!(
        ok(
            "std.list.sort",
            json!({"items": [{"n": "b"}, {"n": "a"}], "key": "n", "descending": true})
        )
        .await,
        j(json!({"items": [{"n": "b"}, {"n": "a"}]}))
    );
    assert_eq!(
        ok("std.list.unique", json!({"items": [1, 2, 1, "1", 2]})).await,
        j(json!({"items": [1, 2, "1"]}))
    );
    assert_eq!(
        ok("std.list.zip", json!({"a": [1, 2, 3], "b": ["x", "y"]})).await,
        j(json!({"pairs": [[1, "x"], [2, "y"]]}))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_input_node_pulls_and_emits() {
    let (r, emitted) = run_stream(
        std_provider().await,
        "std.math.running_sum",
        vec![
            ("value", Value::Int(1)),
            ("value", Value::Float(2.5)),
            ("value", Value::Int(3)),
        ],
    )
    .await;
    assert_eq!(r.unwrap().get("sum"), Some(&Value::Float(6.5)));
    let totals: Vec<Value> = emitted.into_iter().map(|(_, v)| v).collect();
    assert_eq!(
        totals,
        vec![Value::Float(1.0), Value::Float(3.5), Value::Float(6.5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_instances_are_reused_only_when_the_node_opts_in() {
    // `std.text.case` opts in; repeated invocations on one executor keep working.
    let p = std_provider().await;
    let exec = create(p, "w", "std.text.case", Default::default(), None);
    for i in 0..5 {
        let (c, _) = ctx("w", "std.text.case", None, false);
        let out = exec
            .invoke(heddle_kernel::Call {
                inputs: inputs([("text", Value::str(format!("v{i}").as_str()))]),
                ctx: c,
            })
            .await
            .unwrap();
        assert_eq!(out.get("text"), Some(&Value::str(format!("V{i}").as_str())));
    }
}
