//! `heddle serve` with the interactive supervisor, for what needs the real binary: a
//! secret from the server's environment never leaves it, an escalation pending when the
//! server dies is asked again by the next one, `[serve]` in heddle.toml against the
//! flags, and a run a person supervises is not resumed from the command line. The
//! routes' semantics (verdicts, refusals, timeouts, cancels, budgets) are tested
//! in-process in `host/server/tests/api/supervise.rs`.

mod support;

use serde_json::{Value, json};
use support::serve::*;
use support::store::*;

// On a store file and on PostgreSQL (a host of a shared database). A server replaced
// on a shared database is tested in tests/durable_pg/hosts.rs.
crate::both!(
    a_known_secret_never_leaves_the_server,
    a_policy_chosen_through_the_api_supervises_the_run_from_the_command_line_too,
);

/// Reads `/data/ready.txt` (retry-safe): fails until the file exists.
const READ: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/ready.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

const INTERACTIVE: &[&str] = &["--supervise", "interactive"];

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

async fn ended(api: &Api, id: &str) -> Value {
    let (show, reoffers) = api.drive_to_end(id).await;
    assert_eq!(reoffers, 0, "{show:#}");
    show
}

fn a_known_secret_never_leaves_the_server(b: Backend) {
    const SECRET: &str = "hunter2-serve-TOKEN-0042";
    let env = StoreDir::on(b);
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
///
/// On a store file only: a host of a shared database that stops hands its runs back
/// to the queue for the other hosts (whose person decides), so the command line finds
/// the run queued, not interrupted, and refuses it as such.
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

/// A run created through the API with a policy as its supervisor keeps it when the
/// command line takes it on: approved from `heddle runs approve` after its server
/// stopped, the node behind the gate fails and the recorded policy skips it (unsupervised,
/// the run would fail).
fn a_policy_chosen_through_the_api_supervises_the_run_from_the_command_line_too(b: Backend) {
    const GATE_THEN_READ: &str = r#"{"format": "heddle.graph", "version": 1,
      "nodes": [
        {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/ready.txt"}},
        {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
        {"id": "read", "type": "files.read_text"},
        {"id": "out", "type": "heddle.output"}],
      "edges": [
        {"source": "p", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
        {"source": "ship", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
        {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;
    const POLICY: &str = "[[rule]]\nnode = \"read\"\nverdict = \"skip\"\n";
    let env = StoreDir::on(b);
    let server = env.serve_with(&[], &[]);
    let api = Api::of(&server);
    let id = rt().block_on(async {
        let graph: Value = serde_json::from_str(GATE_THEN_READ).unwrap();
        let body = json!({"graph": graph, "supervise": "policy", "policy": POLICY});
        let (status, created) = api.call("POST", "/api/runs", Some(body)).await;
        assert_eq!(status, 201, "{created:#}");
        let id = created["run_id"].as_str().unwrap().to_string();
        // Waits (bounded in count, nothing asserted about the time) for the gate.
        for _ in 0..3000 {
            if api.show(&id).await["state"] == "paused" {
                return id;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!(
            "run {id} never paused at its gate: {:#}",
            api.show(&id).await
        );
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    let o = env.heddle(&["runs", "approve", &id, "ship"]);
    expect(&o, support::OK);
    let show = env.show(&id);
    assert_eq!(show["state"], "completed", "{show:#}");
}
