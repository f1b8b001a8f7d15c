//! Runs created, listed, shown, cancelled and resumed; the event stream and
//! `Last-Event-ID`; refused requests; gates: on a store file and on a database several
//! hosts share.

use std::time::Duration;

use axum::body::Body;
use serde_json::{Value, json};

use crate::support::*;

crate::on_both_stores!(
    a_created_run_finishes_and_its_events_resume_after_last_event_id,
    a_last_event_id_past_the_end_is_an_empty_stream_and_a_malformed_one_is_refused,
    refused_requests_get_their_status_and_change_nothing,
    a_gate_is_approved_or_rejected_through_the_api,
    a_graph_node_runs_from_the_documents_sent_with_it_and_its_gate_is_answered_by_path,
    a_run_this_server_drives_is_refused_as_driven_here,
);

/// Names a node type nothing provides and wires a handle that does not exist.
const BROKEN: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": 1}},
    {"id": "x", "type": "nowhere.nothing"},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "nope", "target": "out", "targetHandle": "value"},
    {"source": "c", "sourceHandle": "value", "target": "x", "targetHandle": "in"}
  ]
}"#;

async fn a_created_run_finishes_and_its_events_resume_after_last_event_id(store: Store) {
    let s = TestServer::on(store).await;
    let id = s.create(CHAIN).await;
    let all = s.events(&id, None).await;
    let ids: Vec<u64> = all.iter().map(|e| e.0).collect();
    assert_eq!(ids, (0..all.len() as u64).collect::<Vec<_>>(), "gapless");
    assert_eq!(all[0].1, "opened");
    assert_eq!(all.last().unwrap().1, "finished");
    assert_eq!(all.last().unwrap().2["status"], "completed", "{all:#?}");
    // What the `id:` and `event:` lines carry is not repeated in `data:`.
    for (_, _, data) in &all {
        assert!(
            data.get("seq").is_none() && data.get("kind").is_none(),
            "{data}"
        );
        assert!(data["at_ms"].is_u64(), "{data}");
    }

    // A client that saw record 2 gets exactly what followed it.
    let rest = s.events(&id, Some(2)).await;
    assert_eq!(rest, all[3..].to_vec());
    let none = s.events(&id, Some(all.len() as u64 - 1)).await;
    assert!(none.is_empty(), "{none:?}");

    let show = s.show(&id).await;
    assert_eq!(show["state"], "completed");
    assert_eq!(show["records"], all.len());
    let list = s.runs().await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["run_id"], id.as_str());
    // A finished run cannot be cancelled or resumed; the refusals write nothing.
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/cancel"), None)
        .await;
    assert_eq!(status, 409, "{body:#}");
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/resume"), None)
        .await;
    assert_eq!(status, 409, "{body:#}");
    assert_eq!(s.show(&id).await["records"], all.len());
    let (status, _) = s.call("GET", "/api/runs/nope", None).await;
    assert_eq!(status, 404);
    assert_eq!(s.lines(), ["one"]);
}

/// A `Last-Event-ID` past the end of the log, up to the largest number a header can
/// carry, is an empty stream (nothing follows it), not a panic or a replay of the whole
/// log; one that is not a record's number is refused.
async fn a_last_event_id_past_the_end_is_an_empty_stream_and_a_malformed_one_is_refused(
    store: Store,
) {
    let s = TestServer::on(store).await;
    let id = s.create(CHAIN).await;
    let all = s.events(&id, None).await;
    assert!(!all.is_empty());
    let past = [
        all.len().to_string(),
        (i64::MAX as u64 - 1).to_string(),
        i64::MAX.to_string(),
        (i64::MAX as u64 + 1).to_string(),
        (u64::MAX - 1).to_string(),
        u64::MAX.to_string(),
    ];
    for last in &past {
        let text = s.stream(&id, Some(last)).await;
        assert_eq!(parse_sse(&text), Vec::new(), "after {last}: {text}");
    }
    let bad: [&[u8]; 6] = [
        b"-1",
        b"abc",
        b"18446744073709551616",
        b"1.5",
        b"",
        b"\xff3",
    ];
    for bad in bad {
        let req = s
            .request("GET", &format!("/api/runs/{id}/events"))
            .header(
                "last-event-id",
                axum::http::HeaderValue::from_bytes(bad).unwrap(),
            )
            .body(Body::empty())
            .unwrap();
        let resp = s.send(req).await;
        assert_eq!(resp.status().as_u16(), 400, "{bad:?}");
        let body: Value = serde_json::from_slice(&body_bytes(resp).await).unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("Last-Event-ID"),
            "{body}"
        );
    }
    // An unknown run is still unknown, whatever the id.
    let (status, _) = s.call("GET", "/api/runs/nope/events", None).await;
    assert_eq!(status, 404);
}

async fn refused_requests_get_their_status_and_change_nothing(store: Store) {
    let s = TestServer::on(store).await;
    let graph = graph(CHAIN);
    // Wrong and missing tokens: 401, before anything is read or run.
    for token in [Some("wrong"), Some(""), None] {
        let mut req = axum::http::Request::builder()
            .method("POST")
            .uri("/api/runs");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = Body::from(json!({ "graph": graph }).to_string());
        let resp = s.send(req.body(body).unwrap()).await;
        assert_eq!(resp.status().as_u16(), 401, "{token:?}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    }

    // An oversized body: 413.
    let big = json!({ "graph": graph, "inputs": { "pad": "x".repeat(5 << 20) } });
    let (status, body) = s.call("POST", "/api/runs", Some(big)).await;
    assert_eq!(status, 413, "{body:#}");

    // A graph over the size bound: 413, naming the bound.
    let nodes: Vec<Value> = (0..20_001)
        .map(|i| json!({"id": format!("n{i}"), "type": "heddle.constant", "properties": {"value": 1}}))
        .collect();
    let huge = json!({ "graph": { "nodes": nodes, "edges": [] } });
    let (status, body) = s.call("POST", "/api/runs", Some(huge)).await;
    assert_eq!(status, 413, "{body:#}");
    assert!(
        body["error"].as_str().unwrap().contains("at most 20000"),
        "{body:#}"
    );

    // A malformed graph: 422 with exactly the problems the planner lists (what
    // `heddle validate --json` prints).
    let doc = heddle_core::GraphDoc::parse(BROKEN, "broken.json").unwrap();
    let issues = heddle_core::plan::plan(&doc, s.host.runtime().registry())
        .unwrap_err()
        .issues;
    assert!(!issues.is_empty());
    let (status, body) = s
        .call(
            "POST",
            "/api/runs",
            Some(json!({ "graph": super::support::graph(BROKEN) })),
        )
        .await;
    assert_eq!(status, 422, "{body:#}");
    assert_eq!(body["issues"], serde_json::to_value(&issues).unwrap());
    assert_eq!(body["valid"], false);

    // A body that is not the request: 422 naming the problem.
    let (status, body) = s
        .call("POST", "/api/runs", Some(json!({ "graf": graph })))
        .await;
    assert_eq!(status, 422, "{body:#}");
    assert!(body["error"].as_str().unwrap().contains("graf"), "{body:#}");
    // A missing input value: 422 naming it.
    let input = json!({ "nodes": [
        {"id": "in", "type": "heddle.input", "properties": {"name": "text", "type": "str"}},
        {"id": "out", "type": "heddle.output"}],
        "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}] });
    let (status, body) = s
        .call("POST", "/api/runs", Some(json!({ "graph": input })))
        .await;
    assert_eq!(status, 422, "{body:#}");
    assert!(
        body["error"].as_str().unwrap().contains("`text`"),
        "{body:#}"
    );

    assert_eq!(s.runs().await, Vec::<Value>::new());
    assert!(s.stored_runs().is_empty());
    assert_eq!(s.lines(), Vec::<String>::new());
}

/// A value reviewed at gate `ship`, then written (the effect happens only after it).
const GATED: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "shipped\n"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it", "prompt": "Read the notes"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "path", "target": "out", "targetHandle": "value"}
  ]
}"#;

async fn a_gate_is_approved_or_rejected_through_the_api(store: Store) {
    let s = TestServer::on(store).await;
    let id = s.create(GATED).await;
    // The stream ends when the run stops here: paused at the gate.
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "paused", "{show:#}");
    assert_eq!(s.lines(), Vec::<String>::new());
    let records = show["records"].clone();

    // Refusals change nothing: no such gate, a plain resume, a rejection without a note.
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/gates/nope/approve"), None)
        .await;
    assert_eq!(status, 409, "{body:#}");
    assert!(
        body["error"].as_str().unwrap().contains("its gates: ship"),
        "{body:#}"
    );
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/resume"), None)
        .await;
    assert_eq!(status, 422, "{body:#}");
    let (status, _) = s
        .call("POST", &format!("/api/runs/{id}/gates/ship/reject"), None)
        .await;
    assert_eq!(status, 422);
    assert_eq!(s.show(&id).await["records"], records);

    let (status, body) = s
        .call(
            "POST",
            &format!("/api/runs/{id}/gates/ship/approve"),
            Some(json!({ "note": "looks good" })),
        )
        .await;
    assert_eq!(status, 202, "{body:#}");
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "completed", "{show:#}");
    assert_eq!(s.lines(), ["shipped"]);

    // Another run, rejected: cancelled with the gate's title and the note.
    let id = s.create(GATED).await;
    assert_eq!(s.ended(&id).await["state"], "paused");
    let (status, body) = s
        .call(
            "POST",
            &format!("/api/runs/{id}/gates/ship/reject"),
            Some(json!({ "note": "not yet" })),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let show = s.show(&id).await;
    assert_eq!(show["state"], "cancelled", "{show:#}");
    let error = show["error"].as_str().unwrap();
    assert!(error.contains("not yet"), "{show:#}");
    assert!(error.contains("Ship it"), "{show:#}");
    assert_eq!(s.lines(), ["shipped"]);
}

/// A graph node whose inner graph writes a line, waits at a gate, then upper-cases it.
const INNER_GATED: &str = r#"{"nodes": [
  {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
  {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
  {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
  {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
  {"id": "out", "type": "heddle.output"}],
 "edges": [
  {"source": "text", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
  {"source": "w", "sourceHandle": "path", "target": "ship", "targetHandle": "value"},
  {"source": "ship", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
  {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

async fn a_graph_node_runs_from_the_documents_sent_with_it_and_its_gate_is_answered_by_path(
    store: Store,
) {
    let s = TestServer::on(store).await;
    let sha = heddle_core::compose::sha256_hex(INNER_GATED.as_bytes());
    let outer = json!({"nodes": [
        {"id": "c", "type": "heddle.constant", "properties": {"value": "one\n"}},
        {"id": "g", "type": "heddle.graph", "properties": {"graph": "./graphs/inner.json", "sha256": sha}},
        {"id": "o", "type": "heddle.output"}
    ], "edges": [
        {"source": "c", "sourceHandle": "value", "target": "g", "targetHandle": "text"},
        {"source": "g", "sourceHandle": "out", "target": "o", "targetHandle": "value"}
    ]});

    // Without the document: refused naming the graph node, nothing recorded.
    let (status, body) = s
        .call("POST", "/api/runs", Some(json!({ "graph": outer })))
        .await;
    assert_eq!(status, 422, "{body:#}");
    assert_eq!(body["issues"][0]["node"], "g", "{body:#}");
    assert!(
        body["issues"][0]["message"]
            .as_str()
            .unwrap()
            .contains("not sent"),
        "{body:#}"
    );
    assert!(s.runs().await.is_empty());

    let (status, body) = s
        .call(
            "POST",
            "/api/runs",
            Some(json!({ "graph": outer, "graphs": {"graphs/inner.json": INNER_GATED} })),
        )
        .await;
    assert_eq!(status, 201, "{body:#}");
    let id = body["run_id"].as_str().unwrap().to_string();
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "paused", "{show:#}");
    assert_eq!(s.lines(), ["one"]);
    assert_eq!(show["plan"]["graphs"][0]["graph"], "graphs/inner.json");

    // The gate inside is named by its path (its `/` escaped in the URL).
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/gates/ship/approve"), None)
        .await;
    assert_eq!(status, 409, "{body:#}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("its gates: g/ship"),
        "{body:#}"
    );
    let (status, body) = s
        .call(
            "POST",
            &format!("/api/runs/{id}/gates/g%2Fship/approve"),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body:#}");
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "completed", "{show:#}");
    // The write inside the graph node ran once.
    assert_eq!(s.lines(), ["one"]);
}

/// A request to take over a run this server drives is refused saying so, never naming
/// the server's own process as if it were another owner; the refusal writes nothing.
async fn a_run_this_server_drives_is_refused_as_driven_here(store: Store) {
    let s = TestServer::on(store).await;
    let release = s.dir.path().join("release");
    let started = s.dir.path().join("started");
    let graph = json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "wait", "type": "code.bash", "properties": {"mode": "subprocess", "timeout_s": 600,
         "code": format!("touch {0}; while [ ! -e {1} ]; do sleep 0.02; done; echo done",
                         started.display(), release.display())}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [{"source": "wait", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]});
    let id = s.create(&graph.to_string()).await;
    for _ in 0..3000 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(started.exists(), "the node never started");
    let records = s.show(&id).await["records"].clone();
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/resume"), None)
        .await;
    assert_eq!(status, 409, "{body:#}");
    let e = body["error"].as_str().unwrap();
    assert!(e.contains("this server drives it"), "{e}");
    assert!(
        !e.contains(&std::process::id().to_string()),
        "names the server's own process: {e}"
    );
    assert_eq!(s.show(&id).await["records"], records);
    std::fs::write(&release, "").unwrap();
    assert_eq!(s.ended(&id).await["state"], "completed");
}
