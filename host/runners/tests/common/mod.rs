//! Shared test harness: runs one code node through the real executor seam (provider →
//! executor → invoke with a real NodeCtx) and collects what it emitted and logged.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bollard::query_parameters::ListContainersOptionsBuilder;
use heddle_core::{EventKind, Value};
use heddle_kernel::{
    Call, CtxParts, EventSink, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs, SecretRegistry,
};
use heddle_runners::{CodeNodes, LABEL_NODE, LABEL_RUNNER, RunnersConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub struct Logs(Mutex<Vec<String>>);

impl EventSink for Logs {
    fn emit(&self, event: EventKind) {
        if let EventKind::Log { message, .. } = event {
            self.0.lock().unwrap().push(message);
        }
    }
}

pub struct NodeRun {
    pub result: Result<Outputs, NodeError>,
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
    pub logs: Vec<String>,
}

impl NodeRun {
    pub fn value(&self) -> serde_json::Value {
        match &self.result {
            Ok(o) => o
                .get("result")
                .map(Value::to_json)
                .unwrap_or(serde_json::Value::Null),
            Err(e) => panic!(
                "node failed: {e:?}\nstdout: {:?}\nstderr: {:?}",
                self.stdout, self.stderr
            ),
        }
    }

    pub fn error(&self) -> &NodeError {
        match &self.result {
            Err(e) => e,
            Ok(o) => panic!("node succeeded with {o:?}, expected a failure"),
        }
    }
}

/// A unique node id per test, so container checks by label see only this test's work.
pub fn node_id(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

pub fn props(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

pub fn json(v: serde_json::Value) -> Value {
    Value::from_json(v)
}

/// Runs `node_type` with `properties` (inputs included, as the kernel passes them).
pub async fn run_node(
    nodes: &CodeNodes,
    id: &str,
    node_type: &str,
    properties: BTreeMap<String, Value>,
) -> NodeRun {
    run_node_with(
        nodes,
        id,
        node_type,
        properties,
        CancellationToken::new(),
        |_| {},
    )
    .await
}

/// Like [`run_node`]; `on_line` sees each emitted line as it arrives (and may cancel).
pub async fn run_node_with(
    nodes: &CodeNodes,
    id: &str,
    node_type: &str,
    properties: BTreeMap<String, Value>,
    cancel: CancellationToken,
    on_line: impl FnMut(&str) + Send + 'static,
) -> NodeRun {
    run_node_full(nodes, id, node_type, properties, None, cancel, on_line).await
}

/// Runs a node with the workflow author's `limits` as well.
pub async fn run_node_full(
    nodes: &CodeNodes,
    id: &str,
    node_type: &str,
    properties: BTreeMap<String, Value>,
    limits: Option<&heddle_core::NodeLimits>,
    cancel: CancellationToken,
    mut on_line: impl FnMut(&str) + Send + 'static,
) -> NodeRun {
    let decl = nodes
        .declarations()
        .into_iter()
        .find(|d| d.type_name == node_type)
        .expect("known code node type");
    let spec = NodeSpec {
        id,
        decl: &decl,
        properties: &properties,
        limits,
    };
    let logs = Arc::new(Logs::default());
    let exec = match nodes.create(&spec) {
        Ok(e) => e,
        Err(e) => {
            return NodeRun {
                result: Err(e),
                stdout: vec![],
                stderr: vec![],
                logs: vec![],
            };
        }
    };
    let (tx, mut rx) = mpsc::channel(64);
    let ctx = NodeCtx::new(CtxParts {
        node_id: id.into(),
        node_type: node_type.into(),
        key: "".into(),
        cancel,
        deadline: None,
        events: logs.clone(),
        emit: Some(tx),
        secrets: Arc::new(SecretRegistry::default()),
    });
    let collector = tokio::spawn(async move {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(e) = rx.recv().await {
            let text = e.value.as_str().unwrap_or_default().to_string();
            on_line(&text);
            match &*e.handle {
                "stdout" => out.push(text),
                "stderr" => err.push(text),
                other => panic!("emitted on unexpected handle {other}"),
            }
        }
        (out, err)
    });
    let result = exec
        .invoke(Call {
            inputs: properties.clone(),
            ctx,
        })
        .await;
    drop(exec);
    let (stdout, stderr) = collector.await.unwrap();
    let logs = logs.0.lock().unwrap().clone();
    NodeRun {
        result,
        stdout,
        stderr,
        logs,
    }
}

/// Whether Docker tests can run. With `HEDDLE_REQUIRE_DOCKER=1` a missing engine or
/// image fails the test; otherwise the test is skipped with a loud message.
pub async fn docker_ready() -> bool {
    let required = std::env::var("HEDDLE_REQUIRE_DOCKER").is_ok_and(|v| v == "1");
    let problem = match heddle_runners::connect_docker(None).await {
        Err(e) => Some(e.to_string()),
        Ok(d) => {
            let mut missing = None;
            let images = RunnersConfig::default().images;
            for img in [&images.python, &images.javascript, &images.bash] {
                if d.inspect_image(img).await.is_err() {
                    missing = Some(format!(
                        "image {img} is missing; build it with scripts/build-images"
                    ));
                }
            }
            missing
        }
    };
    match problem {
        None => true,
        Some(p) if required => panic!("HEDDLE_REQUIRE_DOCKER=1 but Docker is not usable: {p}"),
        Some(p) => {
            eprintln!(
                "\n!!!!!!!! SKIPPED: Docker tests need an engine and the runner images: {p}\n\
                 !!!!!!!! run scripts/test (starts dockerd, builds images) to run them\n"
            );
            false
        }
    }
}

/// Containers (running or not) that carry our runner label and this node's id.
pub async fn containers_of(node: &str) -> Vec<String> {
    let docker = heddle_runners::connect_docker(None).await.unwrap();
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("{LABEL_RUNNER}=1"), format!("{LABEL_NODE}={node}")],
    )]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

pub fn code_nodes() -> CodeNodes {
    CodeNodes::new(RunnersConfig::default())
}

pub fn subprocess_nodes() -> CodeNodes {
    CodeNodes::new(RunnersConfig {
        allow_subprocess: true,
        ..RunnersConfig::default()
    })
}
