//! Planning cost on the graph shapes the kernel benches run: a run plans its graph once
//! before any node starts, so this is fixed latency added to every run.
//!
//! `cargo bench -p heddle-core --bench plan`

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use heddle_core::plan::plan;
use heddle_core::{
    DeclLookup, GraphDoc, NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl, PortType,
};
use serde_json::json;

struct Decls(HashMap<String, Arc<NodeDecl>>);

impl DeclLookup for Decls {
    fn decl(&self, type_name: &str) -> Option<Arc<NodeDecl>> {
        self.0.get(type_name).cloned()
    }
}

fn decls() -> Decls {
    let any = PortType::Any;
    let list = PortType::list_of(PortType::Any);
    let mut m = HashMap::new();
    let mut add = |d: NodeDecl| {
        m.insert(d.type_name.clone(), Arc::new(d));
    };
    add(NodeDecl {
        properties: vec![PortDecl::new("value", any.clone())],
        outputs: vec![OutputDecl::new("value", any.clone())],
        ..NodeDecl::new("heddle.constant")
    });
    add(NodeDecl {
        inputs: vec![PortDecl::new("value", any.clone())],
        outputs: vec![OutputDecl::new("value", any.clone())],
        ..NodeDecl::new("heddle.passthrough")
    });
    add(NodeDecl {
        inputs: vec![PortDecl::new("list", list.clone()).required()],
        outputs: vec![
            OutputDecl::new("item", any.clone()).correlated(OutputCorrelation::Iteration {
                group: Some("item".into()),
            }),
            OutputDecl::new("index", PortType::Int).correlated(OutputCorrelation::Iteration {
                group: Some("item".into()),
            }),
        ],
        ..NodeDecl::new("heddle.foreach")
    });
    add(NodeDecl {
        mode: NodeMode::StreamingInput,
        inputs: vec![PortDecl::new("item", any.clone())],
        outputs: vec![OutputDecl::new("list", list).correlated(OutputCorrelation::Aggregate)],
        ..NodeDecl::new("heddle.collect")
    });
    Decls(m)
}

fn edge(s: &str, t: &str, th: &str, sh: &str) -> serde_json::Value {
    json!({"source": s, "sourceHandle": sh, "target": t, "targetHandle": th})
}

fn chain(n: usize) -> GraphDoc {
    let mut nodes = vec![json!({"id": "src", "type": "heddle.constant", "data": {"value": 1}})];
    let mut edges = Vec::new();
    let mut prev = "src".to_string();
    for i in 0..n {
        let id = format!("p{i}");
        nodes.push(json!({"id": id, "type": "heddle.passthrough"}));
        edges.push(edge(&prev, &id, "value", "value"));
        prev = id;
    }
    GraphDoc::parse(
        &json!({"nodes": nodes, "edges": edges}).to_string(),
        "chain",
    )
    .unwrap()
}

fn wide(n: usize) -> GraphDoc {
    let nodes: Vec<_> = (0..n)
        .map(|i| json!({"id": format!("c{i}"), "type": "heddle.constant", "data": {"value": i}}))
        .collect();
    GraphDoc::parse(&json!({"nodes": nodes}).to_string(), "wide").unwrap()
}

fn fanout() -> GraphDoc {
    let v = json!({
        "nodes": [{"id": "l", "type": "heddle.constant", "data": {"value": [1, 2, 3]}},
                  {"id": "f", "type": "heddle.foreach"},
                  {"id": "a", "type": "heddle.passthrough"}, {"id": "b", "type": "heddle.passthrough"},
                  {"id": "c", "type": "heddle.passthrough"}, {"id": "col", "type": "heddle.collect"}],
        "edges": [edge("l", "f", "list", "value"), edge("f", "a", "value", "item"),
                  edge("a", "b", "value", "value"), edge("b", "c", "value", "value"),
                  edge("c", "col", "item", "value")]
    });
    GraphDoc::parse(&v.to_string(), "fanout").unwrap()
}

fn bench(c: &mut Criterion) {
    let d = decls();
    for (name, doc) in [
        ("plan/chain_100", chain(100)),
        ("plan/wide_1000", wide(1000)),
        ("plan/fanout_3", fanout()),
        ("plan/chain_10000", chain(10_000)),
    ] {
        plan(&doc, &d).expect("bench graphs are valid");
        c.bench_function(name, |b| b.iter(|| plan(black_box(&doc), &d).unwrap()));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
