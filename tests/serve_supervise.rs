//! `heddle serve` with the interactive supervisor: a failure waits for a person's
//! verdict through the API, a verdict outside the kernel's allowed set is refused, a
//! decision nobody makes fails closed, a cancel withdraws it, and a secret never
//! leaves the server. Also the server's run budgets. All against the real binary.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::serve::*;
use support::store::*;

/// Reads `/data/ready.txt` (retry-safe): fails until the file exists.
const READ: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/ready.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

/// Writes into a directory that does not exist (not retry-safe: retry is not allowed).
const WRITE: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "t", "type": "heddle.constant", "properties": {"value": "x"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/missing/x.txt"}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "t", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "bytes", "target": "out", "targetHandle": "value"}]}"#;

const INTERACTIVE: &[&str] = &["--supervise", "interactive"];

fn graph(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

async fn answer(api: &Api, id: &str, eid: &str, body: Value) -> (u16, Value) {
    api.call(
        "POST",
        &format!("/api/runs/{id}/escalations/{eid}"),
        Some(body),
    )
    .await
}

/// The run's whole event stream, as text, once it ended.
async fn stream_text(api: &Api, id: &str) -> String {
    let mut resp = api
        .http
        .get(format!("{}/api/runs/{id}/events", api.url))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut text = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    text
}

/// Reads run `id`'s live stream until an `escalation` notice in `state` arrives.
async fn notice(api: &Api, id: &str, state: &str) -> Value {
    let mut resp = api
        .http
        .get(format!("{}/api/runs/{id}/events", api.url))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    let wait = async {
        while let Some(chunk) = resp.chunk().await.unwrap() {
            text.push_str(std::str::from_utf8(&chunk).unwrap());
            for block in text.split("\n\n") {
                if !block.lines().any(|l| l == "event: escalation") {
                    continue;
                }
                let data = block
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap();
                let n: Value = serde_json::from_str(data).unwrap();
                assert!(
                    !block.lines().any(|l| l.starts_with("id:")),
                    "a notice carries no id: {block}"
                );
                if n["state"] == state {
                    return n;
                }
            }
        }
        panic!("the stream ended without a {state} escalation notice:\n{text}");
    };
    tokio::time::timeout(Duration::from_secs(120), wait)
        .await
        .expect("the notice arrived")
}

async fn ended(api: &Api, id: &str) -> Value {
    let (show, reoffers) = api.drive_to_end(id).await;
    assert_eq!(reoffers, 0, "{show:#}");
    show
}

/// Whether run `id`'s log holds its escalation yet (read as `heddle runs show` reads).
fn escalated(env: &StoreDir, id: &str) -> bool {
    use heddle_store::RunStore as _;
    let store = heddle_store::SqliteStore::open(&env.db()).unwrap();
    let read = store.read(id, 0).unwrap();
    read.records.iter().any(|r| r.record.kind() == "escalated")
}

fn kinds(events: &[(u64, String, Value)]) -> Vec<&str> {
    events.iter().map(|(_, k, _)| k.as_str()).collect()
}

#[test]
fn a_failure_waits_for_a_person_and_their_retry_completes_the_run() {
    let env = StoreDir::new();
    let server = env.serve_with(INTERACTIVE, &[]);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(READ).await;
        let n = notice(&api, &id, "pending").await;
        let list = api.pending_escalations(&id).await;
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
        std::fs::write(env.path().join("data/ready.txt"), "ready\n").unwrap();
        let eid = e["id"].as_str().unwrap();
        let (status, body) = answer(
            &api,
            &id,
            eid,
            json!({"verdict": "retry", "note": "file is there now"}),
        )
        .await;
        assert_eq!(status, 200, "{body:#}");
        assert_eq!(body["verdict"], "retry");
        let show = ended(&api, &id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        let events = api.events(&id, None).await;
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
        let (_, after) = api
            .call("GET", &format!("/api/runs/{id}/escalations"), None)
            .await;
        assert_eq!(after["escalations"], json!([]));
        let (status, body) = answer(&api, &id, eid, json!({"verdict": "skip"})).await;
        assert_eq!(status, 404, "{body:#}");
    });
}

#[test]
fn a_verdict_outside_the_allowed_set_is_refused_and_changes_nothing() {
    let env = StoreDir::new();
    // The server's default is no supervision; the run asks for a person itself.
    let server = env.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let body = json!({"graph": graph(WRITE), "supervise": "interactive"});
        let (status, created) = api.call("POST", "/api/runs", Some(body)).await;
        assert_eq!(status, 201, "{created:#}");
        let id = created["run_id"].as_str().unwrap().to_string();
        let e = api.pending_escalations(&id).await.remove(0);
        assert_eq!(
            e["allowed"],
            json!(["skip", "fail"]),
            "not retry-safe: {e:#}"
        );
        let eid = e["id"].as_str().unwrap();
        // The escalated record is the last one until the decision (nothing else runs).
        while !escalated(&env, &id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let records = api.show(&id).await["records"].clone();

        for refused in ["retry", "end_stream", "substitute"] {
            let (status, body) = answer(&api, &id, eid, json!({"verdict": refused})).await;
            assert_eq!(status, 409, "{refused}: {body:#}");
            assert_eq!(body["allowed"], json!(["skip", "fail"]), "{body:#}");
        }
        let (status, body) = answer(&api, &id, eid, json!({"verdict": "explode"})).await;
        assert_eq!(status, 422, "{body:#}");
        let (status, body) =
            answer(&api, &id, eid, json!({"verdict": "skip", "outputs": {}})).await;
        assert_eq!(status, 422, "outputs without a substitute: {body:#}");
        let (status, body) =
            answer(&api, &id, "no-such-escalation", json!({"verdict": "skip"})).await;
        assert_eq!(status, 404, "{body:#}");
        let (status, body) = api
            .call("GET", "/api/runs/no-such-run/escalations", None)
            .await;
        assert_eq!(status, 404, "{body:#}");
        let (status, body) = answer(&api, "no-such-run", eid, json!({"verdict": "skip"})).await;
        assert_eq!(status, 404, "{body:#}");

        assert_eq!(
            api.show(&id).await["records"],
            records,
            "nothing was written"
        );
        let still = api.pending_escalations(&id).await;
        assert_eq!(still[0]["id"], e["id"], "still waiting for a verdict");

        let (status, body) = answer(
            &api,
            &id,
            eid,
            json!({"verdict": "fail", "note": "the directory is gone"}),
        )
        .await;
        assert_eq!(status, 200, "{body:#}");
        let show = ended(&api, &id).await;
        assert_eq!(show["state"], "failed", "{show:#}");
        assert!(
            show["error"]
                .as_str()
                .unwrap()
                .contains("the directory is gone"),
            "the note is the run's error: {show:#}"
        );
    });
}

#[test]
fn a_decision_nobody_makes_fails_closed_at_the_timeout() {
    let env = StoreDir::new();
    let server = env.serve_with(
        &[
            "--supervise",
            "interactive",
            "--decision-timeout-ms",
            "1000",
        ],
        &[],
    );
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(READ).await;
        // The whole stream: it ends with the run.
        let stream = stream_text(&api, &id).await;
        let show = ended(&api, &id).await;
        assert_eq!(show["state"], "failed", "{show:#}");
        let error = show["error"].as_str().unwrap();
        assert!(error.contains("took longer than"), "{show:#}");
        let (_, list) = api
            .call("GET", &format!("/api/runs/{id}/escalations"), None)
            .await;
        assert_eq!(list["escalations"], json!([]));
        // A stream opened after the escalation had already timed out has no notice of
        // it; one that saw it pending saw it time out.
        let notices: Vec<Value> = stream
            .split("\n\n")
            .filter(|b| b.starts_with("event: escalation"))
            .map(|b| {
                serde_json::from_str(b.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                    .unwrap()
            })
            .collect();
        if let Some(p) = notices.iter().find(|n| n["state"] == "pending") {
            let closed = notices
                .iter()
                .find(|n| n["id"] == p["id"] && n["state"] != "pending");
            assert_eq!(closed.unwrap()["state"], "timed_out", "{notices:?}");
            let eid = p["id"].as_str().unwrap();
            let (status, body) = answer(&api, &id, eid, json!({"verdict": "retry"})).await;
            assert_eq!(status, 404, "{body:#}");
            assert_eq!(body["closed"], "timed_out", "{body:#}");
        }
    });
}

#[test]
fn cancelling_the_run_withdraws_its_pending_decision() {
    let env = StoreDir::new();
    let server = env.serve_with(INTERACTIVE, &[]);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(READ).await;
        let eid = api.pending_escalations(&id).await[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let (status, body) = api
            .call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await;
        assert_eq!(status, 202, "{body:#}");
        // Withdrawn before the cancel answered: no decision about a run going away.
        let (_, list) = api
            .call("GET", &format!("/api/runs/{id}/escalations"), None)
            .await;
        assert_eq!(list["escalations"], json!([]));
        let (status, body) = answer(&api, &id, &eid, json!({"verdict": "retry"})).await;
        assert_eq!(status, 404, "{body:#}");
        assert_eq!(body["closed"], "withdrawn", "{body:#}");
        let show = ended(&api, &id).await;
        assert_eq!(show["state"], "cancelled", "{show:#}");
    });
}

#[test]
fn a_known_secret_never_leaves_the_server() {
    const SECRET: &str = "hunter2-serve-TOKEN-0042";
    let env = StoreDir::new();
    let server = env.serve_with(INTERACTIVE, &[("HEDDLE_SECRET_UPSTREAM_TOKEN", SECRET)]);
    let api = Api::of(&server);
    // A failure quoting the secret (assembled at run time, so no value along an edge
    // holds it) escalates; everything the API sends masks it.
    let doc = QUOTE_AND_FAIL.replace("CODE", &serde_json::to_string(QUOTE).unwrap());
    // The secret reaches a node as an input value: a value holding a known secret is
    // never recorded, so its node fails (KNOWN_SECRET) and nothing downstream runs.
    let along_an_edge = PARSE_ONE.replace("SECRET", SECRET);
    rt().block_on(async {
        let id = api.create(&doc).await;
        let list = api.pending_escalations(&id).await;
        let text = serde_json::to_string(&list).unwrap();
        assert!(!text.contains(SECRET), "secret in the escalation:\n{text}");
        assert!(text.contains("«redacted»"), "{text}");
        let eid = list[0]["id"].as_str().unwrap();
        let (status, body) = answer(
            &api,
            &id,
            eid,
            json!({"verdict": "fail", "note": "checked"}),
        )
        .await;
        assert_eq!(status, 200, "{body:#}");

        let refused = api.create(&along_an_edge).await;
        let show = ended(&api, &refused).await;
        assert_eq!(show["state"], "failed", "{show:#}");
        assert!(show.to_string().contains("KNOWN_SECRET"), "{show:#}");

        for id in [&id, &refused] {
            let show = ended(&api, id).await;
            let stream = stream_text(&api, id).await;
            // The failure's text is kept, masked.
            assert!(id == &refused || stream.contains("«redacted»"), "{stream}");
            assert!(
                !stream.contains(SECRET),
                "secret in the event stream:\n{stream}"
            );
            let show_text = show.to_string();
            assert!(
                !show_text.contains(SECRET),
                "secret in the run:\n{show_text}"
            );
        }
        let (_, runs) = api.call("GET", "/api/runs", None).await;
        assert!(!runs.to_string().contains(SECRET));
    });
}

/// Says the secret on stderr and fails (a real bash process).
const QUOTE: &str = "a=hunter2-serve; b=-TOKEN-0042; echo \"login refused for $a$b\" >&2; exit 1";

const QUOTE_AND_FAIL: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "login", "type": "code.bash", "properties": {"mode": "subprocess", "code": CODE}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "login", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]}"#;

/// A value with the secret in it, parsed as JSON (which fails, quoting it).
const PARSE_ONE: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "v", "type": "heddle.constant", "properties": {"value": "token SECRET {"}},
    {"id": "parse", "type": "std.json.parse"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "v", "sourceHandle": "value", "target": "parse", "targetHandle": "text"},
    {"source": "parse", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn an_escalation_pending_when_the_server_dies_is_asked_again_after_adoption() {
    let env = StoreDir::new();
    let first = env.serve_with(
        &["--supervise", "interactive", "--lease-ttl-ms", "2000"],
        &[],
    );
    let api = Api::of(&first);
    let (id, before) = rt().block_on(async {
        let id = api.create(READ).await;
        let e = api.pending_escalations(&id).await.remove(0);
        (id, e)
    });
    first.kill9();

    let second = env.serve_with(INTERACTIVE, &[]);
    let api = Api::of(&second);
    rt().block_on(async {
        let again = api.pending_escalations(&id).await.remove(0);
        assert_ne!(
            again["id"], before["id"],
            "a new question, not the dead server's"
        );
        assert_eq!(again["node"], "read");
        std::fs::write(env.path().join("data/ready.txt"), "ready\n").unwrap();
        let eid = again["id"].as_str().unwrap();
        let (status, body) = answer(&api, &id, eid, json!({"verdict": "retry"})).await;
        assert_eq!(status, 200, "{body:#}");
        let show = ended(&api, &id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
    });
}

/// Runs for a minute unless stopped.
const SLOW: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "slow", "type": "code.bash", "properties": {"code": "exec sleep 60", "mode": "subprocess"}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [{"source": "slow", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn the_server_holds_a_run_to_its_time_limit() {
    let env = StoreDir::new();
    let server = env.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let body = json!({"graph": graph(SLOW), "time_limit_ms": 300});
        let (status, created) = api.call("POST", "/api/runs", Some(body)).await;
        assert_eq!(status, 201, "{created:#}");
        let id = created["run_id"].as_str().unwrap().to_string();
        let show = ended(&api, &id).await;
        assert_eq!(show["state"], "failed", "{show:#}");
        assert!(
            show["error"].as_str().unwrap().contains("time limit"),
            "{show:#}"
        );
        assert_eq!(show["budget"]["time_limit_ms"], 300, "{show:#}");

        let body = json!({"graph": graph(SLOW), "time_limit_ms": 0});
        let (status, refused) = api.call("POST", "/api/runs", Some(body)).await;
        assert_eq!(status, 422, "{refused:#}");
        let body = json!({"graph": graph(SLOW), "supervise": "llm"});
        let (status, refused) = api.call("POST", "/api/runs", Some(body)).await;
        assert_eq!(status, 422, "{refused:#}");
    });
}

/// The API has no live feed into a run: a streaming input gets the value its request
/// gave (if any) as its only item and ends, so the run completes instead of waiting for
/// a stream nobody feeds. (A streaming session's values are not in the run's log, so
/// the item itself is not visible through the API.)
#[test]
fn an_api_runs_streaming_input_ends_so_the_run_completes() {
    let env = StoreDir::new();
    let server = env.serve(None);
    let api = Api::of(&server);
    let doc = std::fs::read_to_string(support::root().join("examples/running-sum.json")).unwrap();
    rt().block_on(async {
        for inputs in [json!({"numbers": 7}), json!({})] {
            let body = json!({"graph": graph(&doc), "inputs": inputs});
            let (status, created) = api.call("POST", "/api/runs", Some(body)).await;
            assert_eq!(status, 201, "{created:#}");
            let id = created["run_id"].as_str().unwrap().to_string();
            let show = ended(&api, &id).await;
            assert_eq!(show["state"], "completed", "{inputs}: {show:#}");
        }
    });
}

/// `[serve]` in heddle.toml sets what the flags set (the flags win); a bad value is
/// refused before anything starts, naming the file and section.
#[test]
fn serve_settings_come_from_the_config_file_too() {
    let env = StoreDir::new();
    let config = env.path().join("heddle.toml");
    let base = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{base}\n[serve]\nlease_ttl_ms = 5\n")).unwrap();
    let o = env.heddle(&["serve", "--listen", "127.0.0.1:0"]);
    expect(&o, INVALID);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("[serve]") && err.contains("lease_ttl_ms"),
        "{err}"
    );

    std::fs::write(
        &config,
        format!("{base}\n[serve]\nsupervise = \"interactive\"\ndecision_timeout_ms = 123456\nlease_ttl_ms = 3000\n"),
    )
    .unwrap();
    let server = env.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(READ).await;
        let e = api.pending_escalations(&id).await.remove(0);
        let span = e["deadline_ms"].as_u64().unwrap() - e["created_at_ms"].as_u64().unwrap();
        assert_eq!(span, 123_456, "{e:#}");
    });
    drop(server);
    // The flag wins over the file.
    let server = env.serve_with(&["--decision-timeout-ms", "654321"], &[]);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(READ).await;
        let e = api.pending_escalations(&id).await.remove(0);
        let span = e["deadline_ms"].as_u64().unwrap() - e["created_at_ms"].as_u64().unwrap();
        assert_eq!(span, 654_321, "{e:#}");
    });
}

/// A run a person supervises through the server is not run on from the command line,
/// where nobody could decide its failures: `heddle runs resume` (plain or with the
/// watchdog) is refused with exit 2, pointing at the server, and changes nothing.
#[test]
fn an_interactive_run_is_not_resumed_from_the_command_line() {
    let env = StoreDir::new();
    let server = env.serve_with(INTERACTIVE, &[]);
    let api = Api::of(&server);
    let id = rt().block_on(async {
        let id = api.create(READ).await;
        api.pending_escalations(&id).await;
        id
    });
    // Stopping the server leaves the run interrupted, its decision still to be made.
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    let before = std::fs::read(env.db()).unwrap();
    let records = env.show(&id)["records"].clone();
    for args in [
        vec!["runs", "resume", id.as_str()],
        vec!["runs", "resume", "--watchdog", id.as_str()],
    ] {
        let o = env.heddle(&args);
        expect(&o, support::INVALID);
        let e = support::stderr(&o);
        assert!(e.contains("supervised interactively"), "{e}");
        assert!(e.contains(&format!("POST /api/runs/{id}/resume")), "{e}");
    }
    assert_eq!(env.show(&id)["records"], records);
    assert_eq!(
        std::fs::read(env.db()).unwrap(),
        before,
        "the store changed"
    );
}

/// A skip is recorded with the person's note too, and `heddle runs show` reads it back
/// from the log like any verdict's.
#[test]
fn a_skip_is_recorded_with_the_persons_note() {
    let env = StoreDir::new();
    let server = env.serve_with(INTERACTIVE, &[]);
    let api = Api::of(&server);
    let id = rt().block_on(async {
        let id = api.create(READ).await;
        let e = api.pending_escalations(&id).await.remove(0);
        let eid = e["id"].as_str().unwrap();
        let (status, body) = answer(
            &api,
            &id,
            eid,
            json!({"verdict": "skip", "note": "not needed this week"}),
        )
        .await;
        assert_eq!(status, 200, "{body:#}");
        ended(&api, &id).await;
        id
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    let show = env.show(&id);
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
