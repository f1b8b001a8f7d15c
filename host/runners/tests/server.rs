//! `code.server` through the executor seam (provider → executor → invoke → finalize
//! with a real NodeCtx and a real engine): the server answers at its endpoint from this
//! host, its container is isolated as documented (its own network, the port on
//! 127.0.0.1 only, the code nodes' limits), and finalize removes it. The graph-level
//! behaviour (downstream calls, cancel, SIGKILL and resume) is in tests/code_server.rs.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use common::{docker_ready, node_id};
use heddle_core::{EventKind, Value};
use heddle_kernel::{
    Call, CtxParts, EventSink, Executor, NodeCtx, NodeProvider, NodeSpec, SecretRegistry,
};
use heddle_runners::{CodeNodes, LABEL_NODE, LABEL_RUN, LABEL_RUNNER, RunnersConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const PY_SERVER: &str = r#"import http.server, os
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello " + who).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Hello).serve_forever()
"#;

/// The node's log lines.
#[derive(Default)]
struct Logs(Mutex<Vec<String>>);

impl EventSink for Logs {
    fn emit(&self, event: EventKind) {
        if let EventKind::Log { message, .. } = event {
            self.0.lock().unwrap().push(message);
        }
    }
}

fn executor(nodes: &CodeNodes, id: &str, props: &BTreeMap<String, Value>) -> Arc<dyn Executor> {
    let decl = nodes
        .declarations()
        .into_iter()
        .find(|d| d.type_name == "code.server")
        .expect("code.server is declared");
    let spec = NodeSpec {
        id,
        decl: &decl,
        properties: props,
        limits: None,
    };
    nodes.create(&spec).expect("the server node is created")
}

fn ctx(id: &str, logs: Arc<Logs>, run: Option<&str>) -> NodeCtx {
    let ctx = NodeCtx::new(CtxParts {
        node_id: id.into(),
        node_type: "code.server".into(),
        key: "".into(),
        cancel: CancellationToken::new(),
        deadline: None,
        events: logs,
        emit: None,
        secrets: Arc::new(SecretRegistry::default()),
    });
    match run {
        Some(r) => ctx.in_run(r.into()),
        None => ctx,
    }
}

/// GET / from 127.0.0.1:`port`; the response's body.
async fn get(port: u16) -> String {
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    c.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).await.unwrap();
    text.rsplit("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

async fn containers(labels: Vec<String>) -> Vec<bollard::models::ContainerSummary> {
    let docker = heddle_runners::connect_docker(None).await.unwrap();
    let filters = HashMap::from([("label".to_string(), labels)]);
    docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_server_answers_on_loopback_in_its_sandbox_and_finalize_removes_it() {
    if !docker_ready().await {
        return;
    }
    let id = node_id("server-up");
    let run = format!("run-{id}");
    let nodes = CodeNodes::new(RunnersConfig::default());
    let props: BTreeMap<String, Value> = [
        ("language", Value::str("python")),
        ("code", Value::str(PY_SERVER)),
        ("who", Value::str("world")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let exec = executor(&nodes, &id, &props);
    exec.initialize().await.expect("engine, image and network");
    assert!(exec.run_scoped(), "a server lives as long as its run");
    let logs = Arc::new(Logs::default());
    let out = exec
        .invoke(Call {
            inputs: props.clone(),
            ctx: ctx(&id, logs.clone(), Some(&run)),
        })
        .await
        .expect("the server answers");
    let endpoint = out
        .get("endpoint")
        .and_then(Value::as_str)
        .unwrap()
        .to_string();
    let port = out.get("port").and_then(Value::as_i64).unwrap() as u16;
    assert_eq!(endpoint, format!("http://127.0.0.1:{port}"));
    assert_eq!(get(port).await, "hello world");

    let mine = containers(vec![
        format!("{LABEL_RUNNER}=1"),
        format!("{LABEL_NODE}={id}"),
        format!("{LABEL_RUN}={run}"),
    ])
    .await;
    assert_eq!(mine.len(), 1, "one container, labelled with node and run");
    let docker = heddle_runners::connect_docker(None).await.unwrap();
    let info = docker
        .inspect_container(mine[0].id.as_deref().unwrap(), None)
        .await
        .unwrap();
    let host = info.host_config.unwrap();
    let network = heddle_runners::server_network(&docker).await.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some(network.as_str()));
    let bindings = host.port_bindings.unwrap();
    let bound = bindings["8080/tcp"].as_ref().unwrap();
    assert!(
        bound
            .iter()
            .all(|b| b.host_ip.as_deref() == Some("127.0.0.1")),
        "published on loopback only: {bound:?}"
    );
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(host.memory, Some(256 * 1024 * 1024));
    assert_eq!(info.config.unwrap().user.as_deref(), Some("1000:1000"));
    let net = docker
        .inspect_network(
            &network,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .unwrap();
    let options = net.options.unwrap_or_default();
    assert_eq!(
        options
            .get("com.docker.network.bridge.enable_icc")
            .map(String::as_str),
        Some("false")
    );
    assert_eq!(
        options
            .get("com.docker.network.bridge.enable_ip_masquerade")
            .map(String::as_str),
        Some("false")
    );

    exec.finalize().await;
    let left = containers(vec![format!("{LABEL_NODE}={id}")]).await;
    assert!(left.is_empty(), "finalize left {left:?}");
    let logged = logs.0.lock().unwrap().join("\n");
    assert!(
        logged.contains("server answers at http://127.0.0.1:"),
        "{logged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_server_that_never_answers_fails_within_its_wait_and_is_removed() {
    if !docker_ready().await {
        return;
    }
    let id = node_id("server-mute");
    let nodes = CodeNodes::new(RunnersConfig::default());
    let props: BTreeMap<String, Value> = [
        ("code", Value::str("echo up; sleep 600")),
        ("ready_timeout_s", Value::Float(1.5)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let exec = executor(&nodes, &id, &props);
    let logs = Arc::new(Logs::default());
    let err = exec
        .invoke(Call {
            inputs: props.clone(),
            ctx: ctx(&id, logs.clone(), None),
        })
        .await
        .expect_err("never answers");
    assert!(
        err.message.starts_with(&format!(
            "node {id}: the server did not answer at http://127.0.0.1:"
        )),
        "{}",
        err.message
    );
    assert_eq!(err.signature.as_deref(), Some("code:server-unready"));
    // Removed by the failed invocation itself, before any finalize.
    let left = containers(vec![format!("{LABEL_NODE}={id}")]).await;
    assert!(left.is_empty(), "left {left:?}");
    exec.finalize().await;
    let logged = logs.0.lock().unwrap().join("\n");
    assert!(logged.contains("server stdout: up"), "{logged}");
}
