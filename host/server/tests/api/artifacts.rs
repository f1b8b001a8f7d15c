//! A value over the inline limit: the event stream carries the reference (that is what
//! a watcher gets, and what the web viewer detects), the run as the API shows it
//! carries the value read back, and a value whose artifact is damaged is named.

use serde_json::Value;

use crate::support::*;

const BIG: usize = 20_000;

/// A code node whose result is a line of `BIG` x's: over the 4 KiB inline limit set.
fn big_graph() -> String {
    let code =
        serde_json::to_string(&format!("head -c {BIG} /dev/zero | tr '\\0' x; echo")).unwrap();
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "big", "type": "code.bash", "properties": {{"code": {code}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}],
  "edges": [{{"source": "big", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]}}"#
    )
}

async fn server() -> TestServer {
    TestServer::with(Setup {
        config: "inline_output_bytes = 4096\n",
        ..Setup::default()
    })
    .await
}

/// The completed record of `big` on run `id`'s stream, and the artifact's digest.
async fn big_result(s: &TestServer, id: &str) -> (Vec<(u64, String, Value)>, String) {
    let events = s.events(id, None).await;
    let (_, _, data) = events
        .iter()
        .find(|(_, kind, data)| kind == "completed" && data["occurrence"]["node"] == "big")
        .expect("big's result is on the stream");
    let reference = &data["outputs"][0][1]["$artifact"];
    assert_eq!(reference["size"], BIG + 2, "{data:#}");
    let sha = reference["sha256"].as_str().unwrap().to_string();
    assert_eq!(sha.len(), 64);
    (events, sha)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_carries_the_reference_and_the_api_shows_the_value() {
    let s = server().await;
    let big = "x".repeat(BIG);
    let id = s.create(&big_graph()).await;
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "completed", "{:.300}", show.to_string());
    assert!(show.to_string().contains(&big), "the API shows the value");
    let (events, _) = big_result(&s, &id).await;
    assert!(
        !events.iter().any(|(_, _, d)| d.to_string().contains(&big)),
        "no event carries the value itself"
    );
}

/// A value whose artifact was corrupted or deleted on disk: `GET /api/runs/ID` still
/// shows the run (200) with a marker where the value was and the value listed under
/// `unreadable` (node, output, digest, what is wrong); reading the run whole (what
/// `heddle runs show` does) refuses with `TERMINAL_ARTIFACT`, naming the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_artifact_is_named_by_the_api_and_by_a_whole_read() {
    let s = server().await;
    let id = s.create(&big_graph()).await;
    assert_eq!(s.ended(&id).await["state"], "completed");
    let (_, sha) = big_result(&s, &id).await;
    let db = rusqlite::Connection::open(s.db()).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    for (change, problem) in [
        (
            "UPDATE artifacts SET bytes = x'00' WHERE sha256 = ?1",
            "corrupt",
        ),
        ("DELETE FROM artifacts WHERE sha256 = ?1", "missing"),
    ] {
        db.execute(change, [&sha]).unwrap();
        let (status, show) = s.call("GET", &format!("/api/runs/{id}"), None).await;
        assert_eq!(status, 200, "{show:#}");
        assert_eq!(show["state"], "completed", "{show:#}");
        // Every value that pointed at it: big's result and what `out` received.
        let u = show["unreadable"].as_array().unwrap();
        assert!(!u.is_empty(), "{show:#}");
        assert!(
            u.iter()
                .any(|u| u["occurrence"]["node"] == "big" && u["handle"] == "result"),
            "{u:#?}"
        );
        for u in u {
            assert_eq!(u["sha256"], sha.as_str(), "{u:#}");
            assert_eq!(u["problem"], problem, "{u:#}");
            let error = u["error"].as_str().unwrap();
            for part in [&id, &sha, problem, "TERMINAL_ARTIFACT"] {
                assert!(error.contains(part), "{part} not in {error}");
            }
        }
        assert!(
            show["occurrences"].to_string().contains("$unreadable"),
            "a marker where the value was"
        );
        // The artifact's own route: gone or damaged is not a 200.
        let (status, body) = s
            .call("GET", &format!("/api/runs/{id}/artifacts/{sha}"), None)
            .await;
        assert_ne!(status, 200, "{body:#}");
    }
    let store = heddle_store::SqliteStore::open(&s.db()).unwrap();
    let Err(e) = heddle_store::session::inspect(&store, &id) else {
        panic!("a whole read refuses");
    };
    let e = heddle_core::text::error_chain(&e);
    for part in ["node big, output `result`", "missing", "TERMINAL_ARTIFACT"] {
        assert!(e.contains(part), "{part} not in {e}");
    }
}
