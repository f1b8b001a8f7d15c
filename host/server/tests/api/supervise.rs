//! The interactive supervisor through the API: a failure waits for a person's verdict,
//! a verdict outside the kernel's allowed set is refused, a decision nobody makes fails
//! closed, a cancel withdraws it; and a run's budget and streaming inputs.

use std::time::Duration;

use heddle_runtime::Supervise;
use serde_json::{Value, json};

use crate::support::*;

crate::on_both_stores!(
    a_failure_waits_for_a_person_and_their_retry_completes_the_run,
    a_verdict_outside_the_allowed_set_is_refused_and_changes_nothing,
    a_decision_nobody_makes_fails_closed_at_the_timeout,
    cancelling_the_run_withdraws_its_pending_decision,
    a_skip_is_recorded_with_the_persons_note,
    the_server_holds_a_run_to_its_time_limit,
    an_api_runs_streaming_input_ends_so_the_run_completes,
);

/// Writes into a directory that does not exist (not retry-safe: retry is not allowed).
const WRITE: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "t", "type": "heddle.constant", "properties": {"value": "x"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/missing/x.txt"}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "t", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "bytes", "target": "out", "targetHandle": "value"}]}"#;

/// Runs for a minute unless stopped.
const SLOW: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "slow", "type": "code.bash", "properties": {"code": "exec sleep 60", "mode": "subprocess"}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [{"source": "slow", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]}"#;

async fn interactive(store: Store) -> TestServer {
    TestServer::with(Setup {
        store,
        supervise: Some(Supervise::Interactive),
        ..Setup::default()
    })
    .await
}

/// Whether run `id`'s log holds its escalation yet (read as `heddle runs show` reads).
fn escalated(s: &TestServer, id: &str) -> bool {
    let read = s.store().read(id, 0).unwrap();
    read.records.iter().any(|r| r.record.kind() == "escalated")
}

fn kinds(events: &[(u64, String, Value)]) -> Vec<&str> {
    events.iter().map(|(_, k, _)| k.as_str()).collect()
}

/// The escalation notices (`event: escalation`, no id) in a stream's text, up to its
/// last whole event.
fn notices(stream: &str) -> Vec<Value> {
    let whole = &stream[..stream.rfind("\n\n").unwrap_or(0)];
    whole
        .split("\n\n")
        .filter(|b| b.starts_with("event: escalation"))
        .map(|b| {
            assert!(!b.contains("\nid:"), "a notice carries no id: {b}");
            serde_json::from_str(b.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap()
        })
        .collect()
}

/// Reads run `id`'s live stream until an `escalation` notice in `state` arrives.
async fn notice(s: &TestServer, id: &str, state: &str) -> Value {
    use http_body_util::BodyExt as _;
    let req = s
        .request("GET", &format!("/api/runs/{id}/events"))
        .body(axum::body::Body::empty())
        .unwrap();
    let mut body = s.send(req).await.into_body();
    let mut text = String::new();
    let wait = async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                text.push_str(std::str::from_utf8(&data).unwrap());
            }
            if let Some(n) = notices(&text).into_iter().find(|n| n["state"] == state) {
                return n;
            }
        }
        panic!("the stream ended without a {state} escalation notice:\n{text}");
    };
    tokio::time::timeout(Duration::from_secs(120), wait)
        .await
        .expect("the notice arrived")
}

async fn a_failure_waits_for_a_person_and_their_retry_completes_the_run(store: Store) {
    let s = interactive(store).await;
    let id = s.create(READ).await;
    let n = notice(&s, &id, "pending").await;
    let list = s.pending_escalations(&id).await;
    assert_eq!(list.len(), 1, "{list:#?}");
    let e = &list[0];
    assert_eq!(e["id"], n["id"], "the notice names the escalation listed");
    assert_eq!(e["node"], "read");
    assert_eq!(e["attempt"], 1);
    assert_eq!(e["allowed"], json!(["retry", "skip", "fail"]), "{e:#}");
    assert_eq!(e["error"]["signature"], "files:not-found", "{e:#}");
    let (created, deadline) = (
        e["created_at_ms"].as_u64().unwrap(),
        e["deadline_ms"].as_u64().unwrap(),
    );
    assert_eq!(deadline - created, 600_000, "the default decision timeout");

    // The person fixes the cause and says retry: the second attempt reads the file.
    std::fs::write(s.dir.path().join("data/ready.txt"), "ready\n").unwrap();
    let eid = e["id"].as_str().unwrap();
    let (status, body) = s
        .answer(
            &id,
            eid,
            json!({"verdict": "retry", "note": "file is there now"}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["verdict"], "retry");
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "completed", "{show:#}");
    let events = s.events(&id, None).await;
    let k = kinds(&events);
    assert_eq!(k.iter().filter(|k| **k == "escalated").count(), 1, "{k:?}");
    let verdict = events.iter().find(|(_, k, _)| k == "verdict").unwrap();
    assert_eq!(verdict.2["verdict"]["verdict"], "retry", "{verdict:?}");
    // The person's reason is in the log with any verdict, not only with a fail.
    assert_eq!(
        verdict.2["verdict"]["note"], "file is there now",
        "{verdict:?}"
    );
    let completed = events
        .iter()
        .find(|(_, k, d)| k == "completed" && d["occurrence"]["node"] == "read")
        .unwrap();
    assert_eq!(completed.2["outputs"][0][1], "ready\n", "{completed:?}");
    // Nothing is pending any more, and the answered escalation cannot be answered again.
    let (_, after) = s
        .call("GET", &format!("/api/runs/{id}/escalations"), None)
        .await;
    assert_eq!(after["escalations"], json!([]));
    let (status, body) = s.answer(&id, eid, json!({"verdict": "skip"})).await;
    assert_eq!(status, 404, "{body:#}");
}

async fn a_verdict_outside_the_allowed_set_is_refused_and_changes_nothing(store: Store) {
    // The server's default is no supervision; the run asks for a person itself.
    let s = TestServer::on(store).await;
    let body = json!({"graph": graph(WRITE), "supervise": "interactive"});
    let (status, created) = s.call("POST", "/api/runs", Some(body)).await;
    assert_eq!(status, 201, "{created:#}");
    let id = created["run_id"].as_str().unwrap().to_string();
    let e = s.pending_escalations(&id).await.remove(0);
    assert_eq!(
        e["allowed"],
        json!(["skip", "fail"]),
        "not retry-safe: {e:#}"
    );
    let eid = e["id"].as_str().unwrap();
    // The escalated record is the last one until the decision (nothing else runs).
    while !escalated(&s, &id) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let records = s.show(&id).await["records"].clone();

    for refused in ["retry", "end_stream", "substitute"] {
        let (status, body) = s.answer(&id, eid, json!({"verdict": refused})).await;
        assert_eq!(status, 409, "{refused}: {body:#}");
        assert_eq!(body["allowed"], json!(["skip", "fail"]), "{body:#}");
    }
    let (status, body) = s.answer(&id, eid, json!({"verdict": "explode"})).await;
    assert_eq!(status, 422, "{body:#}");
    let (status, body) = s
        .answer(&id, eid, json!({"verdict": "skip", "outputs": {}}))
        .await;
    assert_eq!(status, 422, "outputs without a substitute: {body:#}");
    let (status, body) = s
        .answer(&id, "no-such-escalation", json!({"verdict": "skip"}))
        .await;
    assert_eq!(status, 404, "{body:#}");
    let (status, body) = s
        .call("GET", "/api/runs/no-such-run/escalations", None)
        .await;
    assert_eq!(status, 404, "{body:#}");
    let (status, body) = s
        .answer("no-such-run", eid, json!({"verdict": "skip"}))
        .await;
    assert_eq!(status, 404, "{body:#}");

    assert_eq!(s.show(&id).await["records"], records, "nothing was written");
    let still = s.pending_escalations(&id).await;
    assert_eq!(still[0]["id"], e["id"], "still waiting for a verdict");

    let (status, body) = s
        .answer(
            &id,
            eid,
            json!({"verdict": "fail", "note": "the directory is gone"}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "failed", "{show:#}");
    assert!(
        show["error"]
            .as_str()
            .unwrap()
            .contains("the directory is gone"),
        "the note is the run's error: {show:#}"
    );
}

async fn a_decision_nobody_makes_fails_closed_at_the_timeout(store: Store) {
    let s = TestServer::with(Setup {
        store,
        supervise: Some(Supervise::Interactive),
        decision_timeout_ms: Some(1000),
        ..Setup::default()
    })
    .await;
    let id = s.create(READ).await;
    // The whole stream: it ends with the run.
    let stream = s.stream(&id, None).await;
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "failed", "{show:#}");
    let error = show["error"].as_str().unwrap();
    assert!(error.contains("took longer than"), "{show:#}");
    let (_, list) = s
        .call("GET", &format!("/api/runs/{id}/escalations"), None)
        .await;
    assert_eq!(list["escalations"], json!([]));
    // A stream opened after the escalation had already timed out has no notice of it;
    // one that saw it pending saw it time out.
    let notices = notices(&stream);
    if let Some(p) = notices.iter().find(|n| n["state"] == "pending") {
        let closed = notices
            .iter()
            .find(|n| n["id"] == p["id"] && n["state"] != "pending");
        assert_eq!(closed.unwrap()["state"], "timed_out", "{notices:?}");
        let eid = p["id"].as_str().unwrap();
        let (status, body) = s.answer(&id, eid, json!({"verdict": "retry"})).await;
        assert_eq!(status, 404, "{body:#}");
        assert_eq!(body["closed"], "timed_out", "{body:#}");
    }
}

async fn cancelling_the_run_withdraws_its_pending_decision(store: Store) {
    let s = interactive(store).await;
    let id = s.create(READ).await;
    let eid = s.pending_escalations(&id).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = s
        .call("POST", &format!("/api/runs/{id}/cancel"), None)
        .await;
    assert_eq!(status, 202, "{body:#}");
    // Withdrawn before the cancel answered: no decision about a run going away.
    let (_, list) = s
        .call("GET", &format!("/api/runs/{id}/escalations"), None)
        .await;
    assert_eq!(list["escalations"], json!([]));
    let (status, body) = s.answer(&id, &eid, json!({"verdict": "retry"})).await;
    assert_eq!(status, 404, "{body:#}");
    assert_eq!(body["closed"], "withdrawn", "{body:#}");
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "cancelled", "{show:#}");
}

/// A skip is recorded with the person's note too, and the run as shown reads it back
/// from the log like any verdict's.
async fn a_skip_is_recorded_with_the_persons_note(store: Store) {
    let s = interactive(store).await;
    let id = s.create(READ).await;
    let e = s.pending_escalations(&id).await.remove(0);
    let eid = e["id"].as_str().unwrap();
    let (status, body) = s
        .answer(
            &id,
            eid,
            json!({"verdict": "skip", "note": "not needed this week"}),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let show = s.ended(&id).await;
    let verdicts: Vec<&Value> = show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["occurrence"]["node"] == "read")
        .flat_map(|o| o["verdicts"].as_array().unwrap())
        .collect();
    assert_eq!(verdicts.len(), 1, "{show:#}");
    assert_eq!(verdicts[0]["verdict"], "skip", "{show:#}");
    assert_eq!(verdicts[0]["note"], "not needed this week", "{show:#}");
}

async fn the_server_holds_a_run_to_its_time_limit(store: Store) {
    let s = TestServer::on(store).await;
    let body = json!({"graph": graph(SLOW), "time_limit_ms": 300});
    let (status, created) = s.call("POST", "/api/runs", Some(body)).await;
    assert_eq!(status, 201, "{created:#}");
    let id = created["run_id"].as_str().unwrap().to_string();
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "failed", "{show:#}");
    assert!(
        show["error"].as_str().unwrap().contains("time limit"),
        "{show:#}"
    );
    assert_eq!(show["budget"]["time_limit_ms"], 300, "{show:#}");

    let body = json!({"graph": graph(SLOW), "time_limit_ms": 0});
    let (status, refused) = s.call("POST", "/api/runs", Some(body)).await;
    assert_eq!(status, 422, "{refused:#}");
    let body = json!({"graph": graph(SLOW), "supervise": "llm"});
    let (status, refused) = s.call("POST", "/api/runs", Some(body)).await;
    assert_eq!(status, 422, "{refused:#}");
}

/// The API has no live feed into a run: a streaming input gets the value its request
/// gave (if any) as its only item and ends, so the run completes instead of waiting for
/// a stream nobody feeds.
async fn an_api_runs_streaming_input_ends_so_the_run_completes(store: Store) {
    let s = TestServer::on(store).await;
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/running-sum.json"),
    )
    .unwrap();
    for inputs in [json!({"numbers": 7}), json!({})] {
        let body = json!({"graph": graph(&doc), "inputs": inputs});
        let (status, created) = s.call("POST", "/api/runs", Some(body)).await;
        assert_eq!(status, 201, "{created:#}");
        let id = created["run_id"].as_str().unwrap().to_string();
        let show = s.ended(&id).await;
        assert_eq!(show["state"], "completed", "{inputs}: {show:#}");
    }
}
