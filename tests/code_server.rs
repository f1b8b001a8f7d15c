//! `code.server` through the binary: a server started for the run whose endpoint a
//! downstream node calls, stopped and removed when the run ends, when it is cancelled,
//! and, after its host was killed with SIGKILL, by the next process that takes the run
//! over (found by the run's label on the engine). A server that never answers, or that
//! exits first, fails its node by name within its bounded wait.
//!
//! Containers are counted by label through the engine, as a user would with
//! `docker ps -a --filter label=heddle.run=RUN`. The Docker tests skip with a loud
//! message without an engine or the `heddle/python:1` image (`HEDDLE_REQUIRE_DOCKER=1`
//! fails them instead); the subprocess ones need only `python3` and `bash`.

mod support;

use std::path::Path;
use std::time::Duration;

use support::store::{StoreDir, expect, report, run_id_in, sigkill, text, wait_line};
use support::{CANCELLED, FAILED, OK, SUSPENDED, docker};

/// A Python server answering every GET with `hello from HOSTNAME` (a container's
/// hostname is its id), listening where heddle says ($HOST, $PORT).
const PY_SERVER: &str = r#"import http.server, os, socket
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + socket.gethostname()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Hello).serve_forever()
"#;

/// A bash node (subprocess: the host side, where the endpoint is) that GETs `/` from
/// the endpoint with bash's own /dev/tcp, appends the endpoint to `endpoints.txt` and
/// the body to `calls.txt`, then waits for the file `go` before it hands the body on.
fn caller(dir: &Path) -> String {
    format!(
        r#"port="${{endpoint##*:}}"
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
body="$(cat <&3 | tail -n 1)"
echo "$endpoint" >> {d}/endpoints.txt
echo "$body" >> {d}/calls.txt
while [ ! -e {d}/go ]; do sleep 0.05; done
set_result "\"$body\"""#,
        d = dir.display()
    )
}

/// `srv` (a `code.server` with `server` as its properties) → `call` (see [`caller`])
/// → `out`.
fn graph(dir: &Path, server: serde_json::Value) -> String {
    serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "srv", "type": "code.server", "properties": server},
        {"id": "call", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": caller(dir)}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [
        {"source": "srv", "sourceHandle": "endpoint", "target": "call", "targetHandle": "endpoint"},
        {"source": "call", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]})
    .to_string()
}

fn docker_server() -> serde_json::Value {
    serde_json::json!({"language": "python", "code": PY_SERVER})
}

/// Whether the Docker tests can run here (the server image built).
fn docker_ready() -> bool {
    support::docker_image_ready("heddle/python:1")
}

/// Ids of the containers, running or not, labelled with run `run`.
fn containers_of(run: &str) -> Vec<String> {
    let filter = format!("label=heddle.run={run}");
    docker(&["ps", "-aq", "--no-trunc", "--filter", &filter])
        .expect("the engine lists containers")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Waits until the downstream node has called the server (bounded: a generous limit
/// so a slow machine does not fail the test; nothing is asserted about the time).
fn wait_called(dir: &Path) -> String {
    let calls = dir.join("calls.txt");
    for _ in 0..6000 {
        if let Ok(t) = std::fs::read_to_string(&calls)
            && t.ends_with('\n')
        {
            return t;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the downstream node never called the server");
}

/// A container the test made itself, removed however the test ends.
struct RemovedOnDrop(String);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

fn allow_go(dir: &Path) {
    std::fs::write(dir.join("go"), "").unwrap();
}

#[test]
fn a_docker_servers_endpoint_is_called_downstream_and_the_server_is_removed_when_the_run_ends() {
    if !docker_ready() {
        return;
    }
    let d = StoreDir::new();
    std::fs::write(d.path().join("g.json"), graph(d.path(), docker_server())).unwrap();
    allow_go(d.path());
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    let answer = r["outputs"]["out"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(answer.starts_with("hello from "), "{r:#}");
    let run = support::store::run_id(&o);
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left after the run"
    );
}

#[test]
fn a_cancelled_runs_server_is_removed() {
    if !docker_ready() {
        return;
    }
    let d = StoreDir::new();
    std::fs::write(d.path().join("g.json"), graph(d.path(), docker_server())).unwrap();
    let (mut live, rx) = d.spawn(&["run", "--durable", "g.json"]);
    let run = wait_line(&rx, run_id_in);
    let called = wait_called(d.path());
    assert!(called.starts_with("hello from "), "{called}");
    assert_eq!(containers_of(&run).len(), 1, "the server runs meanwhile");
    let o = d.heddle(&["runs", "cancel", &run]);
    expect(&o, OK);
    let status = live.wait().unwrap();
    assert_eq!(status.code(), Some(CANCELLED));
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left after the cancel"
    );
}

#[test]
fn a_killed_hosts_server_is_removed_when_the_run_is_resumed_and_started_again() {
    if !docker_ready() {
        return;
    }
    let d = StoreDir::new();
    std::fs::write(d.path().join("g.json"), graph(d.path(), docker_server())).unwrap();
    let (mut live, rx) = d.spawn(&["run", "--durable", "g.json"]);
    let run = wait_line(&rx, run_id_in);
    let first = wait_called(d.path());
    assert_eq!(containers_of(&run).len(), 1, "the server runs meanwhile");
    sigkill(live.id() as i32);
    live.wait().unwrap();
    // Nothing ran a finalize, so the server stays until someone removes it: the run's
    // next owner, or sooner any heddle of this host that connects to the engine for the
    // first time (its owner is gone), which a test running beside this one may be. So
    // only its end is asserted, below.
    // A container another host left for the run: its owner cannot be judged from
    // here, so only the run's label finds it.
    let theirs = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        "heddle.runner=1",
        "--label",
        &format!("heddle.run={run}"),
        "--label",
        "heddle.owner=0123456789abcdef-0123456789ab-1-1",
        "heddle/python:1",
        "sleep",
        "600",
    ])
    .expect("a container starts");
    let theirs = theirs.trim().to_string();
    let _cleanup = RemovedOnDrop(theirs.clone());
    assert!(containers_of(&run).contains(&theirs));

    allow_go(d.path());
    let reference = serde_json::Value::Null;
    let (outputs, _) = d.resume_until_done(&run, &reference, "resumed after SIGKILL");
    let second = outputs["out"][0].as_str().unwrap_or_default().to_string();
    assert!(second.starts_with("hello from "), "{outputs:#}");
    assert_ne!(
        format!("{second}\n"),
        first,
        "the run called a new server, not the killed host's"
    );
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left after the resumed run"
    );
    assert!(
        docker(&["inspect", &theirs]).is_none(),
        "the other host's container for the run was not removed"
    );
}

#[test]
fn a_docker_server_that_never_answers_fails_its_node_by_name_within_its_wait() {
    if !docker_ready() {
        return;
    }
    let d = StoreDir::new();
    let server = serde_json::json!({"language": "python", "ready_timeout_s": 2,
        "code": "import time\nprint('not listening', flush=True)\ntime.sleep(600)"});
    std::fs::write(d.path().join("g.json"), graph(d.path(), server)).unwrap();
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, FAILED);
    let all = text(&o);
    assert!(
        all.contains("node srv: the server did not answer at http://127.0.0.1:"),
        "{all}"
    );
    assert!(all.contains("within 2s"), "{all}");
    let run = support::store::run_id(&o);
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left after the failure"
    );
}

/// Subprocess mode: the same endpoint, no engine needed.
#[test]
fn a_subprocess_servers_endpoint_is_called_downstream() {
    let d = StoreDir::new();
    let server = serde_json::json!({"language": "python", "mode": "subprocess", "code": PY_SERVER});
    std::fs::write(d.path().join("g.json"), graph(d.path(), server)).unwrap();
    allow_go(d.path());
    let o = d.heddle(&["run", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    let answer = r["outputs"]["out"][0].as_str().unwrap_or_default();
    assert!(answer.starts_with("hello from "), "{r:#}");
}

#[test]
fn a_subprocess_server_that_never_answers_or_exits_first_fails_its_node_by_name() {
    let d = StoreDir::new();
    for (code, want) in [
        (
            "sleep 600",
            "node srv: the server did not answer at http://127.0.0.1:",
        ),
        (
            "echo broken >&2; exit 3",
            "node srv: the server exited with code 3 before it answered",
        ),
    ] {
        let server = serde_json::json!({"mode": "subprocess", "ready_timeout_s": 1, "code": code});
        std::fs::write(d.path().join("g.json"), graph(d.path(), server)).unwrap();
        let o = d.heddle(&["run", "g.json"]);
        expect(&o, FAILED);
        let all = text(&o);
        assert!(all.contains(want), "{all}");
        if code.contains("broken") {
            assert!(
                all.contains("broken"),
                "the server's stderr is shown: {all}"
            );
        }
    }
}

#[test]
fn bad_server_settings_are_refused_while_planning_naming_node_and_property() {
    let d = StoreDir::new();
    let server = serde_json::json!({"language": "cobol", "code": "x", "probe": "ping",
        "ready_timeout_s": 0, "network": true, "port": 70000});
    std::fs::write(d.path().join("g.json"), graph(d.path(), server)).unwrap();
    let o = d.heddle(&["validate", "g.json"]);
    expect(&o, support::INVALID);
    let all = text(&o);
    for property in ["language", "probe", "ready_timeout_s", "network", "port"] {
        assert!(
            all.contains(&format!("property `{property}`")),
            "{property}: {all}"
        );
    }
    assert!(all.contains("srv"), "{all}");
}

/// A port on 127.0.0.1 free now, for a server the operator grants by address.
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `http` package's `http.get` calls the endpoint: the operator grants exactly the
/// address the server is given (`host_port`).
#[test]
fn an_http_node_calls_a_docker_servers_endpoint_at_the_granted_address() {
    if !docker_ready() {
        return;
    }
    let port = free_port();
    let d = StoreDir::new().with_config(&format!(
        "\n[packages.http]\nnetwork = [\"http://127.0.0.1:{port}\"]\n"
    ));
    let g = serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "srv", "type": "code.server",
         "properties": {"language": "python", "host_port": port, "code": PY_SERVER}},
        {"id": "get", "type": "http.get"},
        {"id": "out", "type": "heddle.output"}],
     "edges": [
        {"source": "srv", "sourceHandle": "endpoint", "target": "get", "targetHandle": "url"},
        {"source": "get", "sourceHandle": "body", "target": "out", "targetHandle": "value"}]});
    std::fs::write(d.path().join("g.json"), g.to_string()).unwrap();
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    let body = r["outputs"]["out"][0].as_str().unwrap_or_default();
    assert!(body.starts_with("hello from "), "{r:#}");
    let run = support::store::run_id(&o);
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left after the run"
    );
}

/// A run paused at a gate after the server stopped it with the run; approving the gate
/// starts it again and the node after the gate calls the new one.
#[test]
fn a_server_stops_when_its_run_pauses_at_a_gate_and_starts_again_when_approved() {
    if !docker_ready() {
        return;
    }
    let d = StoreDir::new();
    let g = serde_json::json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "srv", "type": "code.server", "properties": docker_server()},
        {"id": "ship", "type": "heddle.gate", "properties": {"title": "Call it"}},
        {"id": "call", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": caller(d.path())}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [
        {"source": "srv", "sourceHandle": "endpoint", "target": "ship", "targetHandle": "value"},
        {"source": "ship", "sourceHandle": "value", "target": "call", "targetHandle": "endpoint"},
        {"source": "call", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]});
    std::fs::write(d.path().join("g.json"), g.to_string()).unwrap();
    allow_go(d.path());
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let run = support::store::run_id(&o);
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left while paused"
    );
    let o = d.heddle(&["runs", "approve", &run, "ship", "--json"]);
    expect(&o, OK);
    let r = report(&o);
    let answer = r["outputs"]["out"][0].as_str().unwrap_or_default();
    assert!(answer.starts_with("hello from "), "{r:#}");
    assert_eq!(
        containers_of(&run),
        Vec::<String>::new(),
        "left after the run"
    );
}

/// A subprocess server dies with its host (its process group's guard); the resumed run
/// starts another on a port of its own.
#[test]
fn a_subprocess_server_dies_with_its_killed_host_and_the_resumed_run_starts_another() {
    let d = StoreDir::new();
    let server = serde_json::json!({"language": "python", "mode": "subprocess", "code": PY_SERVER});
    std::fs::write(d.path().join("g.json"), graph(d.path(), server)).unwrap();
    let (mut live, rx) = d.spawn(&["run", "--durable", "g.json"]);
    let run = wait_line(&rx, run_id_in);
    wait_called(d.path());
    let endpoint = std::fs::read_to_string(d.path().join("endpoints.txt")).unwrap();
    let port: u16 = endpoint.trim().rsplit(':').next().unwrap().parse().unwrap();
    sigkill(live.id() as i32);
    live.wait().unwrap();
    // The guard kills the group as soon as it sees its parent die; bounded so a server
    // that survives fails the test instead of hanging it.
    let mut gone = false;
    for _ in 0..3000 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone, "the server outlived its killed host on port {port}");
    allow_go(d.path());
    let (outputs, _) = d.resume_until_done(&run, &serde_json::Value::Null, "resumed");
    let answer = outputs["out"][0].as_str().unwrap_or_default();
    assert!(answer.starts_with("hello from "), "{outputs:#}");
}
