//! Code node start-up: a Bash node from invoke to its first stdout line, in Docker mode
//! (fresh container per run; target ≤ 0.5 s) and subprocess mode (target ≤ 50 ms).
//!
//! `cargo bench --bench runners` (Docker mode needs the engine and images:
//! scripts/docker-up && scripts/build-images; it is skipped with a message otherwise).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use heddle_core::{EventKind, Value};
use heddle_kernel::{Call, CtxParts, EventSink, NodeCtx, NodeProvider, NodeSpec, SecretRegistry};
use heddle_runners::{CodeNodes, RunnersConfig};
use tokio_util::sync::CancellationToken;

struct NoEvents;
impl EventSink for NoEvents {
    fn emit(&self, _: EventKind) {}
}

/// Time from invoke to the first emitted line; the rest of the run (exit, container
/// removal) happens outside the measured span but before the next iteration.
async fn first_line(nodes: &CodeNodes, mode: &str) -> Duration {
    let decl = nodes
        .declarations()
        .into_iter()
        .find(|d| d.type_name == "code.bash")
        .expect("code.bash is declared");
    let props: BTreeMap<String, Value> = [
        ("code".to_string(), Value::str("echo ready")),
        ("mode".to_string(), Value::str(mode)),
    ]
    .into_iter()
    .collect();
    let exec = nodes
        .create(&NodeSpec {
            id: "bench",
            decl: &decl,
            properties: &props,
            limits: None,
        })
        .expect("valid bench node");
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let ctx = NodeCtx::new(CtxParts {
        node_id: "bench".into(),
        node_type: "code.bash".into(),
        key: "".into(),
        cancel: CancellationToken::new(),
        deadline: None,
        events: Arc::new(NoEvents),
        emit: Some(tx),
        secrets: Arc::new(SecretRegistry::default()),
    });
    let t0 = Instant::now();
    let run = tokio::spawn(async move { exec.invoke(Call { inputs: props, ctx }).await });
    let line = rx.recv().await.expect("a first line");
    let took = t0.elapsed();
    assert_eq!(line.value.as_str(), Some("ready"));
    run.await
        .expect("invoke task")
        .expect("bench node succeeds");
    took
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut g = c.benchmark_group("code_bash_first_line");

    let sub = CodeNodes::new(RunnersConfig {
        allow_subprocess: true,
        ..RunnersConfig::default()
    });
    g.bench_function("subprocess", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    total += first_line(&sub, "subprocess").await;
                }
                total
            })
        })
    });

    let docker = CodeNodes::new(RunnersConfig::default());
    let ready = rt.block_on(async {
        match docker.runner().docker().await {
            Ok(d) => d
                .inspect_image(&RunnersConfig::default().images.bash)
                .await
                .is_ok(),
            Err(_) => false,
        }
    });
    if ready {
        g.sample_size(10).measurement_time(Duration::from_secs(15));
        g.bench_function("docker", |b| {
            b.iter_custom(|n| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..n {
                        total += first_line(&docker, "docker").await;
                    }
                    total
                })
            })
        });
    } else {
        eprintln!("SKIPPED code_bash_first_line/docker: no engine or no heddle/bash image");
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
