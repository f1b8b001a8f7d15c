//! What supervision costs: a clean 1,000-item fan-out with and without a supervisor
//! (the hook must add nothing but the run-state recording that feeds the agent's tools),
//! and the same fan-out where every item fails once and a policy retries it
//! (1,000 escalations: redaction, allowed set, bounded queue, policy, retry).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use heddle_core::builder::graph;
use heddle_core::{GraphDoc, NodeDecl, OutputDecl, PortDecl, PortType, Value};
use heddle_kernel::runtime::{RunOptions, run_graph};
use heddle_kernel::supervisor::{Policy, Supervisor};
use heddle_kernel::{
    BoxFuture, Call, Executor, NodeError, NodeProvider, NodeSpec, Outputs, Registry,
};
use serde_json::json;

const N: i64 = 1_000;

/// Retry-safe; with `fail_once` it fails the first invocation per item.
struct Flaky {
    fail_once: bool,
    seen: Mutex<HashMap<i64, ()>>,
}

impl Executor for Flaky {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let v = call.inputs.get("value").cloned().unwrap_or(Value::Null);
            if self.fail_once {
                let k = v.as_i64().unwrap_or(0);
                // A poisoned lock cannot happen here: nothing panics while holding it.
                if self.seen.lock().unwrap().insert(k, ()).is_none() {
                    return Err(NodeError::msg("HTTP 503"));
                }
            }
            Ok(Outputs::one("value", v))
        })
    }
}

struct Provider;

impl NodeProvider for Provider {
    fn name(&self) -> &str {
        "bench"
    }
    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        let mut d = NodeDecl::new("bench.flaky");
        d.retry_safe = true;
        d.inputs.push(PortDecl::new("value", PortType::Int));
        d.properties
            .push(PortDecl::new("fail_once", PortType::Bool).with_default(false));
        d.outputs.push(OutputDecl::new("value", PortType::Int));
        vec![Arc::new(d)]
    }
    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        Ok(Arc::new(Flaky {
            fail_once: spec
                .properties
                .get("fail_once")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            seen: Mutex::new(HashMap::new()),
        }))
    }
}

fn doc(fail_once: bool) -> GraphDoc {
    graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("call", "bench.flaky", json!({"fail_once": fail_once})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "call", "value"),
            ("call", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    )
}

fn opts(supervisor: Option<Arc<dyn Supervisor>>) -> RunOptions {
    let mut o = RunOptions {
        supervisor,
        ..RunOptions::default()
    };
    o.inputs
        .insert("xs".into(), Value::list((0..N).map(Value::Int).collect()));
    o
}

fn policy() -> Arc<dyn Supervisor> {
    Arc::new(Policy::parse("[[rule]]\nverdict = \"retry\"\n", "bench.toml").expect("policy parses"))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut reg = Registry::with_builtins();
    reg.add(Arc::new(Provider)).expect("provider registers");
    let clean = doc(false);
    let failing = doc(true);
    let mut g = c.benchmark_group("supervisor");
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(20);
    g.bench_function("clean fan-out 1000, no supervisor", |b| {
        b.iter(|| {
            rt.block_on(run_graph(&clean, &reg, opts(None)))
                .expect("run")
        })
    });
    g.bench_function("clean fan-out 1000, policy supervisor", |b| {
        b.iter(|| {
            rt.block_on(run_graph(&clean, &reg, opts(Some(policy()))))
                .expect("run")
        })
    });
    g.bench_function("fan-out 1000, every item fails once, policy retry", |b| {
        b.iter(|| {
            let r = rt
                .block_on(run_graph(
                    &failing,
                    &reg,
                    opts(Some(Arc::new(heddle_kernel::supervisor::Bounded::new(
                        policy(),
                        heddle_kernel::supervisor::Bounds {
                            max_decisions: u32::MAX,
                            ..Default::default()
                        },
                    )))),
                ))
                .expect("run");
            assert_eq!(r.interventions.len(), N as usize);
            r
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
