//! Known secret values never reach the durable store, with the real binary and the
//! SQLite file read byte by byte (its write-ahead log included), or every row of the
//! PostgreSQL database's tables: a node value holding
//! one is refused however small (its node fails with `KNOWN_SECRET`), and an error
//! message quoting one is stored masked. (The code assembles the secret at run time, so
//! the stored graph does not hold it either.)

mod support;

use support::FAILED;
use support::store::{Backend, GATED, StoreDir, expect, report};

// On a store file (read byte by byte) and on PostgreSQL (every row of its tables).
crate::both!(
    a_small_output_holding_a_known_secret_is_refused_and_never_stored,
    an_error_quoting_a_known_secret_is_stored_masked,
    a_gate_note_quoting_a_known_secret_is_stored_masked,
    a_rejection_note_quoting_a_known_secret_is_stored_masked,
    a_rejection_note_typed_at_the_command_line_is_stored_masked,
    an_input_holding_a_known_secret_is_refused_and_nothing_is_recorded,
    an_injected_network_secret_reaches_the_server_and_nothing_else,
);

const SECRET: &str = "s3cr3t-value-42";

/// Prints the secret, assembled at run time so the graph does not hold it.
const ASSEMBLE: &str = "a=s3cr3t; b=-value-42";

/// A store directory with `graph` as `g.json` and a configuration knowing the secret.
fn with_secret(b: Backend, graph: &str) -> StoreDir {
    StoreDir::with_graph_on(b, graph).with_config(&format!(
        "\n[secrets]\nvalues = {{ TOKEN = \"{SECRET}\" }}\n"
    ))
}

/// `leak` (a real bash process running `code`) feeding an output.
fn store_dir(b: Backend, code: &str) -> StoreDir {
    let code = serde_json::to_string(code).unwrap();
    with_secret(
        b,
        &format!(
            r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "leak", "type": "code.bash", "properties": {{"code": {code}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [{{"source": "leak", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]
}}"#
        ),
    )
}

/// Whether any byte of the store (its file and write-ahead log, or its database's
/// rows) spells the secret.
fn store_holds_secret(d: &StoreDir) -> bool {
    d.store_holds(SECRET)
}

/// The bodies of `kind` records about node `leak`, as stored.
fn bodies(d: &StoreDir, kind: &str) -> Vec<String> {
    d.records(kind, "leak")
}

fn a_small_output_holding_a_known_secret_is_refused_and_never_stored(b: Backend) {
    let d = store_dir(b, &format!("{ASSEMBLE}; echo \"token=$a$b\""));
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, FAILED);
    // Before anything else opens the store (closing a connection may checkpoint it).
    assert!(!store_holds_secret(&d), "the secret reached the store");
    let failed = bodies(&d, "failed");
    assert_eq!(failed.len(), 1, "{:#}", report(&o));
    assert!(failed[0].contains("KNOWN_SECRET"), "{}", failed[0]);
    assert!(
        failed[0].contains("output `result` of node leak"),
        "{}",
        failed[0]
    );
    assert!(bodies(&d, "completed").is_empty());
}

fn an_error_quoting_a_known_secret_is_stored_masked(b: Backend) {
    let d = store_dir(
        b,
        &format!("{ASSEMBLE}; echo \"login refused for $a$b\" >&2; exit 3"),
    );
    let o = d.heddle(&["run", "--durable", "--json", "g.json"]);
    expect(&o, FAILED);
    // Before anything else opens the store (closing a connection may checkpoint it).
    assert!(!store_holds_secret(&d), "the secret reached the store");
    let failed = bodies(&d, "failed");
    assert_eq!(failed.len(), 1, "{:#}", report(&o));
    // The error is kept, with the secret masked where it stood.
    assert!(
        failed[0].contains("login refused for «redacted»"),
        "{}",
        failed[0]
    );
}

/// A person's note that quotes a secret (pasted by mistake) is recorded masked: the
/// log masks every record's text, whoever wrote it.
fn a_gate_note_quoting_a_known_secret_is_stored_masked(b: Backend) {
    let d = with_secret(b, GATED);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, support::SUSPENDED);
    let run = support::store::run_id(&o);
    let note = format!("checked with {SECRET}");
    let o = d.heddle(&["runs", "approve", &run, "ship", "--note", &note]);
    expect(&o, support::OK);
    assert!(!store_holds_secret(&d), "the secret reached the store");
    let verdicts = d.records("verdict", "ship");
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert!(
        verdicts[0].contains("checked with «redacted»"),
        "{}",
        verdicts[0]
    );
}

/// A rejection's note through the server is recorded masked too (the server ends the
/// run itself, without a run log).
fn a_rejection_note_quoting_a_known_secret_is_stored_masked(b: Backend) {
    use support::serve::{Api, rt};
    let d = with_secret(b, GATED);
    let graph = std::fs::read_to_string(d.path().join("g.json")).unwrap();
    let server = d.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(&graph).await;
        while api.show(&id).await["state"] != "paused" {
            let _ = api.events(&id, None).await;
        }
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{id}/gates/ship/reject"),
                Some(serde_json::json!({ "note": format!("leaks {SECRET}") })),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    assert!(!store_holds_secret(&d), "the secret reached the store");
    let verdicts = d.records("verdict", "ship");
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert!(verdicts[0].contains("leaks «redacted»"), "{}", verdicts[0]);
}

/// The same note typed at the command line (`heddle runs reject --note`), which ends
/// the run without a run log of its own: the verdict and the ending's reason (which
/// quotes the note) are stored masked, as through the server.
fn a_rejection_note_typed_at_the_command_line_is_stored_masked(b: Backend) {
    let d = with_secret(b, GATED);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, support::SUSPENDED);
    let run = support::store::run_id(&o);
    let note = format!("leaks {SECRET}");
    let o = d.heddle(&["runs", "reject", &run, "ship", "--note", &note]);
    expect(&o, support::OK);
    // Before anything else opens the store (closing a connection may checkpoint it).
    assert!(!store_holds_secret(&d), "the secret reached the store");
    let verdicts = d.records("verdict", "ship");
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert!(verdicts[0].contains("leaks «redacted»"), "{}", verdicts[0]);
    let show = d.show(&run);
    assert_eq!(show["state"], "cancelled", "{show:#}");
    let error = show["error"].as_str().unwrap_or_default();
    assert!(error.contains("leaks «redacted»"), "{show:#}");
}

/// An input a person types is recorded with the run and fed to its nodes again on every
/// resume, so one holding a known secret is refused before anything is recorded, from
/// the command line and through the API alike (pass secrets by name, through grants).
fn an_input_holding_a_known_secret_is_refused_and_nothing_is_recorded(b: Backend) {
    use support::serve::{Api, rt};
    const ECHO: &str = r#"{"format": "heddle.graph", "version": 1, "nodes": [
      {"id": "in", "type": "heddle.input", "properties": {"name": "text", "type": "str"}},
      {"id": "out", "type": "heddle.output"}],
      "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
    let d = with_secret(b, ECHO);
    let input = format!("text=token {SECRET}");
    let o = d.heddle(&["run", "--durable", "g.json", "--input", &input]);
    expect(&o, support::INVALID);
    let err = support::stderr(&o);
    assert!(
        err.contains("input `text`") && err.contains("KNOWN_SECRET"),
        "{err}"
    );
    assert!(!store_holds_secret(&d), "the secret reached the store");

    let server = d.serve(None);
    let api = Api::of(&server);
    let (status, body) = rt().block_on(api.call(
        "POST",
        "/api/runs",
        Some(serde_json::json!({
            "graph": serde_json::from_str::<serde_json::Value>(ECHO).unwrap(),
            "inputs": {"text": format!("token {SECRET}")},
        })),
    ));
    assert_eq!(status, 422, "{body:#}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("KNOWN_SECRET"),
        "{body:#}"
    );
    assert!(rt().block_on(api.runs()).is_empty());
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    assert!(!store_holds_secret(&d), "the secret reached the store");
}

/// A secret the operator attaches to a destination (`network_auth`) reaches that server
/// as a header, and nothing of the run holds it: not the output, not the events and
/// report printed, not the store (file and write-ahead log), not `runs show`.
fn an_injected_network_secret_reaches_the_server_and_nothing_else(b: Backend) {
    let srv = support::http::HttpServer::start(200, r#"{"authorized": true}"#, false);
    let dest = format!("http://127.0.0.1:{}", srv.port);
    let d = StoreDir::with_graph_on(
        b,
        &format!(
            r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "me", "type": "http.get_json", "properties": {{"url": "{dest}/me"}}}},
    {{"id": "out", "type": "heddle.output"}}
  ],
  "edges": [{{"source": "me", "sourceHandle": "value", "target": "out", "targetHandle": "value"}}]
}}"#
        ),
    );
    let d = d.with_config(&format!(
        "\n[packages.http]\nnetwork = [\"{dest}\"]\n[packages.http.network_auth]\n\"{dest}\" = {{ header = \"Authorization\", secret = \"TOKEN\", format = \"Bearer {{}}\" }}\n[secrets]\nvalues = {{ TOKEN = \"{SECRET}\" }}\n"
    ));
    let o = d.heddle(&["--verbose", "run", "--durable", "--json", "g.json"]);
    expect(&o, support::OK);
    assert!(!store_holds_secret(&d), "the secret reached the store");
    assert_eq!(
        srv.requests()[0]
            .headers
            .iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v.as_str()),
        Some(format!("Bearer {SECRET}").as_str())
    );
    let r = report(&o);
    assert_eq!(
        r["outputs"]["out"],
        serde_json::json!([{"authorized": true}])
    );
    assert_eq!(r["nodes"]["me"]["http_requests"], 1);
    let id = support::store::run_id(&o);
    let show = d.heddle(&["runs", "show", &id, "--json"]);
    for (what, text) in [
        ("stdout", String::from_utf8_lossy(&o.stdout)),
        ("stderr", String::from_utf8_lossy(&o.stderr)),
        ("runs show", String::from_utf8_lossy(&show.stdout)),
    ] {
        assert!(!text.contains(SECRET), "{what} holds the secret:\n{text}");
    }
}
