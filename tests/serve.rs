//! `heddle serve` as a user runs it: the real binary on a real port, driven over HTTP.
//! Effects are counted on the provider side (lines a `files.write_text` node appended),
//! as the durable-run tests do.

use serde_json::{Value, json};

mod support;

use support::serve::{Api, rt};
use support::stderr;
use support::store::{CHAIN, FANOUT, INVALID, OK, StoreDir, kill_moments};

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

#[test]
fn a_second_owner_is_refused_naming_the_first_and_the_store_is_free_after_shutdown() {
    let dir = StoreDir::new();
    std::fs::write(dir.path().join("g.json"), CHAIN).unwrap();
    let a = dir.serve(None);

    let o = dir.heddle(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(INVALID), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("owned by heddle serve"), "{e}");
    assert!(e.contains(&format!("pid {}", a.pid())), "{e}");

    // A durable run from the command line is refused, pointing at the API.
    let o = dir.heddle(&["run", "--durable", "g.json"]);
    assert_eq!(o.status.code(), Some(INVALID), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("{}/api/runs", a.url)),
        "{}",
        stderr(&o)
    );
    assert_eq!(dir.lines(), Vec::<String>::new());
    assert_eq!(rt().block_on(Api::of(&a).runs()), Vec::<Value>::new());

    let (code, log) = a.stop();
    assert_eq!(code, OK, "{log}");
    assert!(log.contains("lease released"), "{log}");
    let b = dir.serve(None);
    assert!(b.log().contains("listening on"));
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    let dir = StoreDir::new();
    for (args, flag) in [
        (&["serve", "--workers", "0"][..], "--workers"),
        (&["serve", "--workers", "65"], "--workers"),
        (&["serve", "--listen", "localhost"], "--listen"),
        (
            &["serve", "--shutdown-timeout-ms", "0"],
            "--shutdown-timeout-ms",
        ),
    ] {
        let o = dir.heddle(args);
        assert_eq!(o.status.code(), Some(INVALID), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag), "{args:?}: {}", stderr(&o));
    }
    // Nothing was created: no store, no token.
    assert!(!dir.store().exists());
    assert!(!dir.path().join("serve.token").exists());
}

#[test]
fn a_created_run_finishes_and_its_events_resume_after_last_event_id() {
    let dir = StoreDir::new();
    let s = dir.serve(None);
    let api = Api::of(&s);
    rt().block_on(async {
        let id = api.create(CHAIN).await;
        let all = api.events(&id, None).await;
        let ids: Vec<u64> = all.iter().map(|e| e.0).collect();
        assert_eq!(ids, (0..all.len() as u64).collect::<Vec<_>>(), "gapless");
        assert_eq!(all[0].1, "opened");
        assert_eq!(all.last().unwrap().1, "finished");
        assert_eq!(all.last().unwrap().2["status"], "completed");
        // What the `id:` and `event:` lines carry is not repeated in `data:`.
        for (_, _, data) in &all {
            assert!(
                data.get("seq").is_none() && data.get("kind").is_none(),
                "{data}"
            );
            assert!(data["at_ms"].is_u64(), "{data}");
        }

        // A client that saw record 2 gets exactly what followed it.
        let rest = api.events(&id, Some(2)).await;
        assert_eq!(rest, all[3..].to_vec());
        let none = api.events(&id, Some(all.len() as u64 - 1)).await;
        assert!(none.is_empty(), "{none:?}");

        let show = api.show(&id).await;
        assert_eq!(show["state"], "completed");
        assert_eq!(show["records"], all.len());
        let list = api.runs().await;
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["run_id"], id.as_str());
        // A finished run cannot be cancelled or resumed; the refusals write nothing.
        let (status, body) = api
            .call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await;
        assert_eq!(status, 409, "{body:#}");
        let (status, body) = api
            .call("POST", &format!("/api/runs/{id}/resume"), None)
            .await;
        assert_eq!(status, 409, "{body:#}");
        assert_eq!(api.show(&id).await["records"], all.len());
        let (status, _) = api.call("GET", "/api/runs/nope", None).await;
        assert_eq!(status, 404);
    });
    assert_eq!(dir.lines(), ["one"]);
}

#[test]
fn refused_requests_get_their_status_and_change_nothing() {
    let dir = StoreDir::new();
    std::fs::write(dir.path().join("broken.json"), BROKEN).unwrap();
    let s = dir.serve(None);
    let api = Api::of(&s);
    let graph: Value = serde_json::from_str(CHAIN).unwrap();
    rt().block_on(async {
        // Wrong and missing tokens: 401, before anything is read or run.
        for token in [Some("wrong"), Some(""), None] {
            let mut r = api
                .http
                .post(format!("{}/api/runs", api.url))
                .json(&json!({ "graph": graph }));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            let resp = r.send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 401, "{token:?}");
            let resp = api
                .http
                .get(format!("{}/api/runs", api.url))
                .bearer_auth(format!("{}x", api.token))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 401);
        }

        // An oversized body: 413.
        let big = json!({ "graph": graph, "inputs": { "pad": "x".repeat(5 << 20) } });
        let (status, body) = api.call("POST", "/api/runs", Some(big)).await;
        assert_eq!(status, 413, "{body:#}");

        // A graph over the size bound: 413, naming the bound.
        let nodes: Vec<Value> = (0..20_001)
            .map(|i| json!({"id": format!("n{i}"), "type": "heddle.constant", "properties": {"value": 1}}))
            .collect();
        let huge = json!({ "graph": { "nodes": nodes, "edges": [] } });
        let (status, body) = api.call("POST", "/api/runs", Some(huge)).await;
        assert_eq!(status, 413, "{body:#}");
        assert!(body["error"].as_str().unwrap().contains("at most 20000"), "{body:#}");

        // A malformed graph: 422 with exactly the problems `heddle validate` lists.
        let broken: Value = serde_json::from_str(BROKEN).unwrap();
        let (status, body) = api
            .call("POST", "/api/runs", Some(json!({ "graph": broken })))
            .await;
        assert_eq!(status, 422, "{body:#}");
        let o = dir.heddle(&["validate", "--json", "broken.json"]);
        assert_eq!(o.status.code(), Some(INVALID));
        let validate: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(!validate["issues"].as_array().unwrap().is_empty());
        assert_eq!(body["issues"], validate["issues"]);
        assert_eq!(body["valid"], false);

        // A body that is not the request: 422 naming the problem.
        let (status, body) = api
            .call("POST", "/api/runs", Some(json!({ "graf": graph })))
            .await;
        assert_eq!(status, 422, "{body:#}");
        assert!(body["error"].as_str().unwrap().contains("graf"), "{body:#}");
        // A missing input value: 422 naming it.
        let input = json!({ "nodes": [
            {"id": "in", "type": "heddle.input", "properties": {"name": "text", "type": "str"}},
            {"id": "out", "type": "heddle.output"}],
            "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}] });
        let (status, body) = api
            .call("POST", "/api/runs", Some(json!({ "graph": input })))
            .await;
        assert_eq!(status, 422, "{body:#}");
        assert!(body["error"].as_str().unwrap().contains("`text`"), "{body:#}");

        assert_eq!(api.runs().await, Vec::<Value>::new());
    });
    drop(s);
    let o = dir.heddle(&["runs", "list", "--json"]);
    assert_eq!(o.status.code(), Some(OK), "{}", stderr(&o));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap(),
        json!([])
    );
    assert_eq!(dir.lines(), Vec::<String>::new());
}

/// Every line a..f written, and more than once only for work a person re-offered.
#[track_caller]
#[test]
fn a_server_that_dies_mid_run_is_replaced_and_its_run_finishes_without_repeating_work() {
    let dir = StoreDir::new();
    // The server dies (abort: no destructors, no flush) right after the third write.
    let mut a = dir.serve(Some("after-result:w:3"));
    let graph: Value = serde_json::from_str(FANOUT).unwrap();
    let api = Api::of(&a);
    // The answer may or may not leave before the process dies; the run is on disk
    // either way, since the answer is only sent once it is.
    let answered = rt().block_on(async {
        let r = api
            .http
            .post(format!("{}/api/runs", api.url))
            .bearer_auth(&api.token)
            .json(&json!({ "graph": graph }))
            .send()
            .await;
        match r {
            Ok(resp) => resp.json::<Value>().await.ok(),
            Err(_) => None,
        }
    });
    let status = a.child.wait().unwrap();
    assert_eq!(status.code(), None, "not aborted:\n{}", a.log());
    assert_eq!(dir.lines().len(), 3);

    // The next server takes the dead one's lease at once and adopts the run.
    let b = dir.serve(None);
    assert!(b.log().contains("1 runs adopted"), "{}", b.log());
    let api = Api::of(&b);
    let runs = rt().block_on(api.runs());
    assert_eq!(runs.len(), 1);
    let id = runs[0]["run_id"].as_str().unwrap().to_string();
    if let Some(a) = answered {
        assert_eq!(a["run_id"], id.as_str());
    }
    let (show, reoffers) = rt().block_on(api.drive_to_end(&id));
    assert_eq!(show["state"], "completed", "{show:#}");
    dir.assert_fanout_effects(reoffers, "abort after the third write");
    let w: Vec<&Value> = show["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["occurrence"]["node"] == "w")
        .collect();
    assert_eq!(w.len(), 6);
}

/// The server killed with SIGKILL at pseudo-random moments of a run, then replaced.
#[test]
fn a_server_killed_with_sigkill_is_replaced_and_nothing_is_lost_or_repeated() {
    let mut next = kill_moments();
    for round in 0..4 {
        let dir = StoreDir::new();
        let a = dir.serve(None);
        let id = rt().block_on(Api::of(&a).create(FANOUT));
        std::thread::sleep(std::time::Duration::from_millis(next() % 40));
        a.kill9();
        eprintln!(
            "round {round}: killed with {} lines written",
            dir.lines().len()
        );
        let b = dir.serve(None);
        let (show, reoffers) = rt().block_on(Api::of(&b).drive_to_end(&id));
        assert_eq!(show["state"], "completed", "round {round}: {show:#}");
        dir.assert_fanout_effects(reoffers, &format!("round {round}"));
    }
}

#[test]
fn the_token_is_owner_only_and_printed_once() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = StoreDir::new();
    let s = dir.serve(None);
    let token = s.token.clone();
    assert!(s.log().contains(&token), "printed on the first start");
    let (code, _) = s.stop();
    assert_eq!(code, OK);
    let file = dir.path().join("serve.token");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let s = dir.serve(None);
    assert_eq!(s.token, token, "kept across starts");
    let (_, log) = s.stop();
    assert!(!log.contains(&token), "printed only once:\n{log}");

    // A token others can read is refused before the store is taken.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = dir.heddle(&["serve", "--listen", "127.0.0.1:0"]);
    assert_ne!(o.status.code(), Some(OK));
    assert!(stderr(&o).contains("serve.token"), "{}", stderr(&o));
    assert!(stderr(&o).contains("chmod 600"), "{}", stderr(&o));
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

#[test]
fn a_gate_is_approved_or_rejected_through_the_api() {
    let dir = StoreDir::new();
    let s = dir.serve(None);
    let api = Api::of(&s);
    rt().block_on(async {
        let id = api.create(GATED).await;
        // The stream ends when the run stops here: paused at the gate.
        let _ = api.events(&id, None).await;
        let show = api.show(&id).await;
        assert_eq!(show["state"], "paused", "{show:#}");
        assert_eq!(dir.lines(), Vec::<String>::new());
        let records = show["records"].clone();

        // Refusals change nothing: no such gate, a plain resume, a rejection without a note.
        let (status, body) = api
            .call("POST", &format!("/api/runs/{id}/gates/nope/approve"), None)
            .await;
        assert_eq!(status, 409, "{body:#}");
        assert!(
            body["error"].as_str().unwrap().contains("its gates: ship"),
            "{body:#}"
        );
        let (status, body) = api
            .call("POST", &format!("/api/runs/{id}/resume"), None)
            .await;
        assert_eq!(status, 422, "{body:#}");
        let (status, _) = api
            .call("POST", &format!("/api/runs/{id}/gates/ship/reject"), None)
            .await;
        assert_eq!(status, 422);
        assert_eq!(api.show(&id).await["records"], records);

        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{id}/gates/ship/approve"),
                Some(json!({ "note": "looks good" })),
            )
            .await;
        assert_eq!(status, 202, "{body:#}");
        let (show, _) = api.drive_to_end(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        assert_eq!(dir.lines(), ["shipped"]);

        // Another run, rejected: cancelled with the gate's title and the note.
        let id = api.create(GATED).await;
        let _ = api.events(&id, None).await;
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{id}/gates/ship/reject"),
                Some(json!({ "note": "not yet" })),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        let show = api.show(&id).await;
        assert_eq!(show["state"], "cancelled", "{show:#}");
        assert!(
            show["error"].as_str().unwrap().contains("not yet"),
            "{show:#}"
        );
        assert!(
            show["error"].as_str().unwrap().contains("Ship it"),
            "{show:#}"
        );
    });
    assert_eq!(dir.lines(), ["shipped"]);
}

#[test]
fn a_server_whose_lease_is_taken_stops_writing_at_once_and_exits() {
    let dir = StoreDir::new();
    let mut s = dir.serve(None);
    // Another owner takes the store over (as one would after this lease expired).
    let db = rusqlite::Connection::open(dir.store()).unwrap();
    db.execute(
        "UPDATE owner SET epoch = epoch + 1, owner_id = 'thief', pid = 1, expires_ms = ?1",
        [i64::MAX / 2],
    )
    .unwrap();
    // Its very next write is refused, before its heartbeat notices.
    let (status, body) = rt().block_on(async {
        let graph: Value = serde_json::from_str(CHAIN).unwrap();
        Api::of(&s)
            .call("POST", "/api/runs", Some(json!({ "graph": graph })))
            .await
    });
    assert_eq!(status, 503, "{body:#}");
    assert!(
        body["error"].as_str().unwrap().contains("thief"),
        "{body:#}"
    );
    let runs: i64 = db
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(runs, 0);
    // The heartbeat finds the loss and the server stops with an error.
    let status = s.child.wait().unwrap();
    s.reader.take().unwrap().join().unwrap();
    assert_eq!(status.code(), Some(1), "{}", s.log());
    assert!(
        s.log().contains("lost the run store's owner lease"),
        "{}",
        s.log()
    );
    assert_eq!(dir.lines(), Vec::<String>::new());
}
