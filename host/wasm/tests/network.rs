//! Outgoing HTTP with real sockets on loopback: an HTTPS server with a CA made in the test
//! and plain HTTP ones, each counting the connections it accepts, so a refusal "before
//! connecting" is one the server never saw, and an abort is a connection the server saw
//! close. The guests are the first-party `http` package and `hostile`'s network nodes.

mod common;
#[path = "common/netserver.rs"]
mod netserver;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use common::*;
use heddle_core::{NodeLimits, Value};
use heddle_kernel::{Call, ErrorKind, NodeError, Outputs};
use heddle_wasm::{EngineSettings, WasmConfig, WasmHost, WasmPackage, WasmProvider};
use netserver::{Behavior, Seen, Server, TestCa};

fn ok_json(body: &str) -> Behavior {
    Behavior::Respond {
        status: 200,
        content_type: "application/json",
        body: body.as_bytes().to_vec(),
    }
}

/// `[wasm]` settings and `[packages.<pkg>]` lines as heddle.toml would hold them.
fn config(wasm: &str, pkg: &str, grant: &str) -> WasmConfig {
    WasmConfig::from_toml_str(&format!("[wasm]\n{wasm}\n[packages.{pkg}]\n{grant}\n"))
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn host_for(config: &WasmConfig) -> WasmHost {
    WasmHost::new(EngineSettings {
        cache_dir: Some(tmp_root().join("cache")),
        ..config.wasm.clone()
    })
    .unwrap()
}

/// A provider of the first-party packages (and `hostile`) whose host answers
/// `api.example.com` with 127.0.0.1, as a hostile DNS server would.
async fn provider(config: WasmConfig) -> WasmProvider {
    let host = host_for(&config);
    host.on_resolve(|name| {
        (name == "api.example.com").then(|| vec!["127.0.0.1".parse::<IpAddr>().unwrap()])
    });
    let hostile = WasmPackage::load_dir(&host, &package_dir("hostile"))
        .await
        .unwrap();
    let mut p = WasmProvider::new(host, config);
    p.add_first_party().await.unwrap();
    p.add(hostile).unwrap();
    p
}

async fn call(
    p: &WasmProvider,
    node_type: &str,
    ins: BTreeMap<String, Value>,
) -> (Result<Outputs, NodeError>, heddle_kernel::NodeCtx, Harness) {
    tokio::time::timeout(Duration::from_secs(120), invoke(p, node_type, ins, None))
        .await
        .expect("the invocation hangs")
}

fn url(u: String) -> BTreeMap<String, Value> {
    inputs([("url", Value::str(u))])
}

fn sig(r: &Result<Outputs, NodeError>) -> String {
    match r {
        Ok(o) => panic!("expected a failure, got {o:?}"),
        Err(e) => e
            .signature
            .clone()
            .unwrap_or_else(|| format!("none: {}", e.message)),
    }
}

fn logs_mention(h: &Harness, needles: &[&str]) -> String {
    let logs = h.sink.logs().join("\n");
    for n in needles {
        assert!(logs.contains(n), "the log does not say `{n}`:\n{logs}");
    }
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_a_granted_host_verifies_against_the_configured_ca() {
    let ca = TestCa::new();
    let srv = Server::https(ok_json(r#"{"ok": true, "n": 7}"#), &ca).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let grant = format!("network = [\"https://localhost:{}\"]", srv.port);
    let with_ca = config(&format!("http_ca_files = [{ca_file:?}]"), "http", &grant);
    let p = provider(with_ca).await;
    let (r, ctx, _) = call(
        &p,
        "http.get_json",
        url(srv.url("https", "localhost", "/v1")),
    )
    .await;
    let out = r.unwrap();
    assert_eq!(out.get("status"), Some(&Value::Int(200)));
    assert_eq!(
        out.get("value"),
        Some(&Value::from_json(serde_json::json!({"ok": true, "n": 7})))
    );
    let m = ctx.metrics();
    assert_eq!(m.http_requests, 1);
    assert!(m.http_bytes > 20, "{m:?}");
    assert_eq!(srv.received()[0].path, "/v1");

    // The system's roots do not know the test CA: the same request fails verification.
    let p = provider(config("", "http", &grant)).await;
    let (r, _, _) = call(
        &p,
        "http.get_json",
        url(srv.url("https", "localhost", "/v1")),
    )
    .await;
    assert_eq!(sig(&r), "http:tls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_needs_a_grant_that_says_http() {
    let srv = Server::http(ok_json("[1, 2]")).await;
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config("", "http", &grant)).await;
    let (r, _, _) = call(&p, "http.get_json", url(srv.url("http", "127.0.0.1", "/"))).await;
    assert_eq!(
        r.unwrap().get("value"),
        Some(&Value::from_json(serde_json::json!([1, 2])))
    );
    assert_eq!(srv.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungranted_hosts_ports_and_schemes_are_refused_before_any_connection() {
    let granted = Server::http(ok_json("{}")).await;
    let other_port = Server::http(ok_json("{}")).await;
    let https_only = Server::http(ok_json("{}")).await;
    let grant = format!(
        "network = [\"http://127.0.0.1:{}\", \"https://127.0.0.1:{}\"]",
        granted.port, https_only.port
    );
    let p = provider(config("", "http", &grant)).await;
    for (target, srv) in [
        // Another host name for the same socket: a grant names what it names.
        (granted.url("http", "localhost", "/"), &granted),
        (other_port.url("http", "127.0.0.1", "/"), &other_port),
        // Granted for https only.
        (https_only.url("http", "127.0.0.1", "/"), &https_only),
    ] {
        let (r, _, h) = call(&p, "http.get", url(target.clone())).await;
        assert_eq!(sig(&r), "http:denied", "{target}");
        let shown = target.trim_end_matches('/');
        logs_mention(
            &h,
            &[
                "package `http`",
                "node `n1`",
                shown,
                "refused",
                "[packages.http]",
            ],
        );
        assert_eq!(
            srv.connections(),
            0,
            "{target}: the server saw a connection"
        );
    }
    let (r, _, _) = call(&p, "http.get", url(granted.url("http", "127.0.0.1", "/"))).await;
    assert_eq!(r.unwrap().get("status"), Some(&Value::Int(200)));
    assert_eq!(granted.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_granted_no_network_is_told_the_grant_to_add() {
    let srv = Server::http(ok_json("{}")).await;
    let p = provider(config("", "other", "")).await;
    let (r, _, h) = call(&p, "http.get", url(srv.url("http", "127.0.0.1", "/x"))).await;
    assert_eq!(sig(&r), "http:denied");
    let e = r.unwrap_err();
    assert!(e.message.contains("refused"), "{}", e.message);
    logs_mention(
        &h,
        &[&format!(
            "add `network = [\"http://127.0.0.1:{}\"]` to [packages.http]",
            srv.port
        )],
    );
    assert_eq!(srv.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_an_ungranted_host_is_refused() {
    let target = Server::http(ok_json("{}")).await;
    let also_granted = Server::http(ok_json(r#"{"here": 1}"#)).await;
    let to_ungranted =
        Server::http(Behavior::Redirect(target.url("http", "127.0.0.1", "/next"))).await;
    let to_granted = Server::http(Behavior::Redirect(also_granted.url(
        "http",
        "127.0.0.1",
        "/ok",
    )))
    .await;
    let grant = format!(
        "network = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\"]",
        to_ungranted.port, to_granted.port, also_granted.port
    );
    let p = provider(config("", "http", &grant)).await;
    let (r, _, h) = call(
        &p,
        "http.get",
        url(to_ungranted.url("http", "127.0.0.1", "/")),
    )
    .await;
    assert_eq!(sig(&r), "http:denied");
    logs_mention(&h, &[&format!("http://127.0.0.1:{}", target.port)]);
    assert_eq!(to_ungranted.connections(), 1);
    assert_eq!(target.connections(), 0);
    // A redirect inside the grant is followed, a new request judged like the first.
    let (r, _, _) = call(
        &p,
        "http.get_json",
        url(to_granted.url("http", "127.0.0.1", "/")),
    )
    .await;
    assert_eq!(
        r.unwrap().get("value"),
        Some(&Value::from_json(serde_json::json!({"here": 1})))
    );
    assert_eq!(also_granted.received()[0].path, "/ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_name_resolving_to_loopback_is_refused() {
    let srv = Server::http(ok_json("{}")).await;
    let grant = format!("network = [\"http://api.example.com:{}\"]", srv.port);
    let p = provider(config("", "http", &grant)).await;
    let (r, _, h) = call(&p, "http.get", url(srv.url("http", "api.example.com", "/"))).await;
    assert_eq!(sig(&r), "http:denied");
    logs_mention(
        &h,
        &[
            "127.0.0.1",
            "loopback 127.0.0.0/8",
            "grant the address itself",
        ],
    );
    assert_eq!(srv.connections(), 0);
    // Granting the address itself opens it.
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config("", "http", &grant)).await;
    let (r, _, _) = call(&p, "http.get", url(srv.url("http", "127.0.0.1", "/"))).await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_narrows_destinations_and_cannot_widen_them() {
    let a = Server::http(ok_json("{}")).await;
    let b = Server::http(ok_json("{}")).await;
    let c = Server::http(ok_json("{}")).await;
    let grant = format!(
        "network = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\"]",
        a.port, b.port
    );
    let p = provider(config("", "http", &grant)).await;
    let limits = NodeLimits {
        network: Some(vec![
            a.url("http", "127.0.0.1", "").parse().unwrap(),
            // Not granted: naming it grants nothing.
            c.url("http", "127.0.0.1", "").parse().unwrap(),
        ]),
        ..Default::default()
    };
    for (srv, ok) in [(&a, true), (&b, false), (&c, false)] {
        let exec = create(&p, "n1", "http.get", BTreeMap::new(), Some(limits.clone()));
        let (ctx, h) = ctx("n1", "http.get", None, false);
        let r = exec
            .invoke(Call {
                inputs: url(srv.url("http", "127.0.0.1", "/")),
                ctx,
            })
            .await;
        assert_eq!(r.is_ok(), ok, "{}: {r:?}", srv.port);
        if srv.port == b.port {
            logs_mention(&h, &["narrowed this node's destinations"]);
        }
    }
    assert_eq!(
        (a.connections(), b.connections(), c.connections()),
        (1, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_hits_the_request_timeout() {
    let mut srv = Server::http(Behavior::Silent).await;
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config("http_timeout_ms = 300", "http", &grant)).await;
    let (r, _, _) = call(&p, "http.get", url(srv.url("http", "127.0.0.1", "/slow"))).await;
    assert_eq!(sig(&r), "http:timeout");
    assert_eq!(srv.next().await, Seen::Connected);
    assert_eq!(
        srv.next().await,
        Seen::Request("GET".into(), "/slow".into())
    );
    // The host hung up: the request is over on the server's side too.
    assert_eq!(srv.next().await, Seen::Closed);
}

/// No timeout would ever end these requests (none for the request, none for the
/// invocation): only the cancel or the end of the invocation can, so a server that sees
/// its connection close saw the abort.
const NO_TIMEOUTS: &str = "http_timeout_ms = 604800000\ndefault_timeout_ms = 0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aborts_the_request_in_flight() {
    let mut srv = Server::http(Behavior::Silent).await;
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config(NO_TIMEOUTS, "http", &grant)).await;
    let exec = create(&p, "n1", "http.get", BTreeMap::new(), None);
    let (c, h) = ctx("n1", "http.get", None, false);
    let ins = url(srv.url("http", "127.0.0.1", "/wait"));
    let running = tokio::spawn(async move {
        exec.invoke(Call {
            inputs: ins,
            ctx: c,
        })
        .await
    });
    assert_eq!(srv.next().await, Seen::Connected);
    assert_eq!(
        srv.next().await,
        Seen::Request("GET".into(), "/wait".into())
    );
    h.cancel.cancel();
    let r = tokio::time::timeout(Duration::from_secs(120), running)
        .await
        .expect("the cancel did not end the invocation")
        .unwrap();
    assert_eq!(r.unwrap_err().kind, ErrorKind::Cancelled);
    assert_eq!(srv.next().await, Seen::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_left_in_flight_ends_with_the_invocation() {
    let mut srv = Server::http(Behavior::Endless).await;
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config(NO_TIMEOUTS, "hostile", &grant)).await;
    let (r, _, _) = call(
        &p,
        "hostile.http_leak",
        url(srv.url("http", "127.0.0.1", "/")),
    )
    .await;
    assert_eq!(r.unwrap().get("status"), Some(&Value::Int(200)));
    assert_eq!(srv.next().await, Seen::Connected);
    assert!(matches!(srv.next().await, Seen::Request(..)));
    assert_eq!(srv.next().await, Seen::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_cap_are_cut_off() {
    let mut endless = Server::http(Behavior::Endless).await;
    let claims = Server::http(Behavior::Claims(10 << 30)).await;
    let sink = Server::http(ok_json("{}")).await;
    let grant = format!(
        "network = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\"]",
        endless.port, claims.port, sink.port
    );
    let p = provider(config("max_http_body_bytes = 100000", "http", &grant)).await;
    let (r, ctx, h) = call(&p, "http.get", url(endless.url("http", "127.0.0.1", "/"))).await;
    assert_eq!(sig(&r), "http:body-too-large");
    logs_mention(&h, &["passed the 100000-byte limit"]);
    assert!(ctx.metrics().http_bytes > 100_000);
    assert_eq!(endless.next().await, Seen::Connected);
    assert!(matches!(endless.next().await, Seen::Request(..)));
    assert_eq!(endless.next().await, Seen::Closed);

    // A declared length over the cap is refused before a byte of the body is read.
    let (r, ctx, _) = call(&p, "http.get", url(claims.url("http", "127.0.0.1", "/"))).await;
    assert_eq!(sig(&r), "http:body-too-large");
    assert!(ctx.metrics().http_bytes < 1000);

    // And a request body over it never gets out whole, declared (refused before
    // connecting) or streamed (cut off at the cap).
    let p = provider(config("max_http_body_bytes = 100000", "hostile", &grant)).await;
    for declare in [true, false] {
        let (r, _, h) = call(
            &p,
            "hostile.http_upload",
            inputs([
                ("url", Value::str(sink.url("http", "127.0.0.1", "/up"))),
                ("bytes", Value::Int(300_000)),
                ("declare", Value::Bool(declare)),
            ]),
        )
        .await;
        assert!(format!("{r:?}").contains("http:body-too-large"), "{r:?}");
        logs_mention(&h, &["100000-byte limit"]);
    }
    assert_eq!(sink.connections(), 1, "only the streamed body connected");
    assert!(
        sink.received().iter().all(|r| r.body.len() <= 100_000),
        "the server got more than the cap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_injected_secret_reaches_the_server_and_nothing_else() {
    const SECRET: &str = "s3cr3t-token-4242";
    let srv = Server::http(ok_json(r#"{"authorized": true}"#)).await;
    let dest = format!("http://127.0.0.1:{}", srv.port);
    let text = format!(
        "[packages.http]\nnetwork = [\"{dest}\"]\n[packages.http.network_auth]\n\"{dest}\" = {{ header = \"Authorization\", secret = \"API_TOKEN\", format = \"Bearer {{}}\" }}\n[secrets.values]\nAPI_TOKEN = \"{SECRET}\"\n"
    );
    let p = provider(WasmConfig::from_toml_str(&text).unwrap()).await;
    let (r, ctx, h) = call(&p, "http.request", url(format!("{dest}/me"))).await;
    let out = r.unwrap();
    let seen = &srv.received()[0];
    assert!(
        seen.headers
            .contains(&("authorization".into(), format!("Bearer {SECRET}"))),
        "{:?}",
        seen.headers
    );
    let everything = format!("{out:?} {:?} {:?}", h.sink.0.lock().unwrap(), ctx.metrics());
    assert!(!everything.contains(SECRET), "{everything}");
    // Registered for masking: were a server to echo it, the run would show it masked.
    assert!(!h.secrets.mask(&format!("echo {SECRET}")).contains(SECRET));

    // The guest may not set the header the host injects: refused before connecting.
    let before = srv.connections();
    let ins = inputs([
        ("url", Value::str(format!("{dest}/me"))),
        (
            "headers",
            Value::from_json(serde_json::json!({"AUTHORIZATION": "Bearer mine"})),
        ),
    ]);
    let (r, _, h) = call(&p, "http.request", ins).await;
    assert_eq!(sig(&r), "http:denied");
    logs_mention(&h, &["sets the header `authorization`"]);
    assert_eq!(srv.connections(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_and_the_report_grow_with_the_bytes_sent() {
    let srv = Server::http(ok_json("{}")).await;
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config("", "hostile", &grant)).await;
    let mut figures = Vec::new();
    for bytes in [1_000i64, 4_000_000] {
        let ins = inputs([
            ("url", Value::str(srv.url("http", "127.0.0.1", "/up"))),
            ("bytes", Value::Int(bytes)),
        ]);
        let (r, ctx, _) = call(&p, "hostile.http_upload", ins).await;
        assert_eq!(r.unwrap().get("status"), Some(&Value::Int(200)));
        let m = ctx.metrics();
        assert_eq!(m.http_requests, 1);
        figures.push((m.fuel.unwrap(), m.http_bytes));
    }
    let (fuel_small, bytes_small) = figures[0];
    let (fuel_big, bytes_big) = figures[1];
    assert!(bytes_big - bytes_small >= 3_999_000, "{figures:?}");
    // Every byte moved is charged (1 unit each), over what the guest itself computes.
    assert!(
        fuel_big - fuel_small >= bytes_big - bytes_small,
        "fuel grew by {} for {} more bytes",
        fuel_big - fuel_small,
        bytes_big - bytes_small
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_at_once_are_capped() {
    let srv = Server::http(ok_json("{}")).await;
    let grant = format!("network = [\"http://127.0.0.1:{}\"]", srv.port);
    let p = provider(config("http_max_concurrent = 2", "hostile", &grant)).await;
    let ins = inputs([
        ("url", Value::str(srv.url("http", "127.0.0.1", "/"))),
        ("n", Value::Int(5)),
    ]);
    let (r, _, h) = call(&p, "hostile.http_burst", ins).await;
    assert_eq!(
        r.unwrap().get("outcomes"),
        Some(&Value::from_json(serde_json::json!([
            "200",
            "200",
            "http:too-many",
            "http:too-many",
            "http:too-many"
        ])))
    );
    logs_mention(&h, &["2 requests of this invocation are in flight"]);
    assert_eq!(srv.connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_streams_downstream_in_pieces() {
    let lines = Server::http(Behavior::Respond {
        status: 200,
        content_type: "application/x-ndjson",
        body: b"{\"n\": 1}\r\n{\"n\": 2}\n{\"n\": 3}".to_vec(),
    })
    .await;
    let big = Server::http(Behavior::Respond {
        status: 200,
        content_type: "application/octet-stream",
        body: vec![7u8; 300_000],
    })
    .await;
    let grant = format!(
        "network = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{}\"]",
        lines.port, big.port
    );
    // Bodies far over the value limit pass, as pieces under it.
    let p = provider(config("max_value_bytes = 70000", "http", &grant)).await;
    let run = |u: String, mode: &str| {
        let exec = create(&p, "s1", "http.stream", BTreeMap::new(), None);
        let (c, h) = ctx("s1", "http.stream", None, true);
        let ins = inputs([("url", Value::str(u)), ("mode", Value::str(mode))]);
        async move {
            let r = exec
                .invoke(Call {
                    inputs: ins,
                    ctx: c,
                })
                .await;
            (r, h)
        }
    };
    let (r, mut h) = run(lines.url("http", "127.0.0.1", "/"), "lines").await;
    assert_eq!(r.unwrap().get("bytes"), Some(&Value::Int(27)));
    let mut rx = h.emitted.take().unwrap();
    let mut got = Vec::new();
    while let Ok(e) = rx.try_recv() {
        got.push((e.handle.to_string(), e.value));
    }
    assert_eq!(
        got,
        ["{\"n\": 1}", "{\"n\": 2}", "{\"n\": 3}"].map(|l| ("line".to_string(), Value::str(l)))
    );

    let (r, mut h) = run(big.url("http", "127.0.0.1", "/"), "chunks").await;
    assert_eq!(r.unwrap().get("bytes"), Some(&Value::Int(300_000)));
    let mut rx = h.emitted.take().unwrap();
    let (mut total, mut pieces) = (0, 0);
    while let Ok(e) = rx.try_recv() {
        let Value::Bytes(b) = e.value else {
            panic!("{:?}", e.value)
        };
        assert!(b.len() <= 64 << 10);
        total += b.len();
        pieces += 1;
    }
    assert_eq!(total, 300_000);
    assert!(pieces >= 5, "{pieces}");
}
