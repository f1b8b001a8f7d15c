//! `heddle serve` as a user runs it: the real binary on a real port, driven over HTTP,
//! for what needs the process: a second owner, the flags, a server that dies mid-run
//! (and one killed with SIGKILL), the token file, a lease taken away. The routes' own
//! semantics are tested in-process in `host/server/tests/api`. Effects are counted on
//! the provider side (lines a `files.write_text` node appended), as the durable-run
//! tests do.

use serde_json::{Value, json};

mod support;

use support::serve::{Api, rt};
use support::stderr;
use support::store::{Backend, CHAIN, FANOUT, INVALID, OK, StoreDir, kill_moments};

// On a store file and on PostgreSQL (a host of a shared database). The process-level
// tests of a server replaced on a shared database are in tests/durable_pg/hosts.rs.
crate::both!(a_reconcile_pause_is_answered_through_the_api_and_a_wrong_answer_writes_nothing,);

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

/// Every line a..f written, and more than once only for work a person re-offered.
#[track_caller]
#[test]
fn a_server_that_dies_mid_run_is_replaced_and_its_run_finishes_without_repeating_work() {
    let dir = StoreDir::new();
    // The server dies (abort: no destructors, no flush) right after the third result.
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
    // `files.write_text` declares that its invocations may run together, so a fan-out's
    // writes run side by side: by the third recorded result, any of the others may have
    // written too (each started on disk first; recovery re-offers those it cannot tell).
    let written = dir.lines().len();
    assert!((3..=6).contains(&written), "{written} lines at the abort");

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

/// Runs created together share their creation's commit (group commit): every one the
/// API answered 201 for is on disk when the answer leaves, so a SIGKILL right after the
/// last answer loses none of them, and the next server finishes each.
#[test]
fn runs_created_together_and_answered_survive_a_sigkill_right_after() {
    const UPPER: &str = r#"{"format": "heddle.graph", "version": 1,
      "nodes": [
        {"id": "t", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
        {"id": "out", "type": "heddle.output"}],
      "edges": [
        {"source": "t", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
        {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;
    let dir = StoreDir::new();
    let a = dir.serve(None);
    let api = std::sync::Arc::new(Api::of(&a));
    let graph: Value = serde_json::from_str(UPPER).unwrap();
    let ids: Vec<(String, String)> = rt().block_on(async {
        let creates: Vec<_> = (0..16)
            .map(|i| {
                let (api, graph) = (api.clone(), graph.clone());
                tokio::spawn(async move {
                    let text = format!("run {i}");
                    let body = json!({"graph": graph, "inputs": {"t": text}});
                    let (status, created) = api.call("POST", "/api/runs", Some(body)).await;
                    assert_eq!(status, 201, "{created:#}");
                    (created["run_id"].as_str().unwrap().to_string(), text)
                })
            })
            .collect();
        let mut ids = Vec::new();
        for c in creates {
            ids.push(c.await.unwrap());
        }
        ids
    });
    a.kill9();
    let b = dir.serve(None);
    let api = Api::of(&b);
    for (id, text) in ids {
        let (show, _) = rt().block_on(api.drive_to_end(&id));
        assert_eq!(show["state"], "completed", "{id}: {show:#}");
        let shown = show.to_string();
        assert!(shown.contains(&text.to_uppercase()), "{id}: {show:#}");
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
    assert_eq!(o.status.code(), Some(INVALID), "{}", stderr(&o));
    assert!(stderr(&o).contains("serve.token"), "{}", stderr(&o));
    assert!(stderr(&o).contains("chmod 600"), "{}", stderr(&o));

    // So is one shorter than a generated token (a guessable secret), at start.
    std::fs::write(&file, "1234\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = dir.heddle(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(INVALID), "{}", stderr(&o));
    assert!(stderr(&o).contains("serve.token"), "{}", stderr(&o));
    assert!(stderr(&o).contains("4 hex digits"), "{}", stderr(&o));
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

/// A reconcile pause answered through the API: what the node declares is shown with
/// the pause, a wrong answer is refused (422; 409 for a pause that is not a reconcile
/// pause) and writes nothing, and an answer that it completed runs the rest of the
/// graph on the outputs given, the node never run.
fn a_reconcile_pause_is_answered_through_the_api_and_a_wrong_answer_writes_nothing(b: Backend) {
    let dir = StoreDir::with_graph_on(b, CHAIN);
    let id = dir.crash("after-start:w", &[]);
    let o = dir.heddle(&["runs", "resume", &id]);
    assert_eq!(o.status.code(), Some(support::SUSPENDED), "{}", stderr(&o));
    let gated = {
        std::fs::write(dir.path().join("gate.json"), support::store::GATED).unwrap();
        let o = dir.heddle(&["run", "--durable", "gate.json"]);
        assert_eq!(o.status.code(), Some(support::SUSPENDED), "{}", stderr(&o));
        support::store::run_id(&o)
    };
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let show = api.show(&id).await;
        assert_eq!(show["pause"]["why"], "reconcile", "{show:#}");
        assert_eq!(
            show["pause"]["declared_outputs"],
            json!({"path": "str", "bytes": "int"}),
            "{show:#}"
        );
        let pause = show["pause"]["event"].clone();
        let records = show["records"].clone();
        let resume = |body: Value| {
            let api = &api;
            let id = id.clone();
            async move {
                api.call("POST", &format!("/api/runs/{id}/resume"), Some(body))
                    .await
            }
        };
        for (body, status, says) in [
            (
                json!({"pause": pause, "completed_with": {"path": "/data/log.txt"}, "note": "n"}),
                422,
                "output `bytes` (int) is missing",
            ),
            (
                json!({"pause": pause, "completed_with": {"path": "/data/log.txt", "bytes": 4}, "skip": true, "note": "n"}),
                422,
                "give one",
            ),
            (json!({"skip": true, "note": "n"}), 422, "names the pause"),
            (json!({"pause": pause, "skip": true}), 422, "a note saying why"),
            (json!({"pause": pause, "note": "n"}), 422, "go with an answer"),
        ] {
            let (s, b) = resume(body.clone()).await;
            assert_eq!(s, status, "{body}: {b:#}");
            assert!(b["error"].as_str().unwrap().contains(says), "{body}: {b:#}");
            assert_eq!(api.show(&id).await["records"], records, "{body} wrote");
        }
        // Not a reconcile pause: the run's state refuses it.
        let gate_pause = api.show(&gated).await["pause"]["event"].clone();
        let (s, b) = api
            .call(
                "POST",
                &format!("/api/runs/{gated}/resume"),
                Some(json!({"pause": gate_pause, "skip": true, "note": "n"})),
            )
            .await;
        assert_eq!(s, 409, "{b:#}");
        assert!(
            b["error"].as_str().unwrap().contains("not paused for reconciliation"),
            "{b:#}"
        );

        let (s, b) = resume(json!({
            "pause": pause,
            "completed_with": {"path": "/data/log.txt", "bytes": 4},
            "by": "carol",
            "note": "the line is in the file",
        }))
        .await;
        assert_eq!(s, 202, "{b:#}");
        assert_eq!(b["reconciled"], "completed");
        let (show, reoffers) = api.drive_to_end(&id).await;
        assert_eq!(reoffers, 0, "asked again: {show:#}");
        assert_eq!(show["state"], "completed", "{show:#}");
        let w = show["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["occurrence"]["node"] == "w")
            .unwrap()
            .clone();
        assert_eq!(w["reconciled"]["by"], "carol", "{show:#}");
        assert_eq!(w["reconciled"]["answer"], "completed", "{show:#}");
    });
    assert_eq!(dir.lines(), Vec::<String>::new(), "w ran after all");
}
