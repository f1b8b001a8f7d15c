//! `heddle serve` with a value over the inline limit, against the real binary: the
//! event stream carries the reference (that is what a watcher gets, and what the web
//! viewer detects), and the run as the API shows it carries the value read back.

mod support;

use support::serve::*;
use support::store::*;

const BIG: usize = 20_000;

#[test]
fn the_event_stream_carries_the_reference_and_the_api_shows_the_value() {
    let code =
        serde_json::to_string(&format!("head -c {BIG} /dev/zero | tr '\\0' x; echo")).unwrap();
    let graph = format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "big", "type": "code.bash", "properties": {{"code": {code}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}],
  "edges": [{{"source": "big", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]}}"#
    );
    let dir = StoreDir::new();
    support::write(
        dir.path(),
        "heddle.toml",
        &format!("{CONFIG}inline_output_bytes = 4096\n"),
    );
    let server = dir.serve(None);
    let api = Api::of(&server);
    let big = "x".repeat(BIG);
    rt().block_on(async {
        let id = api.create(&graph).await;
        let (show, _) = api.drive_to_end(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        assert!(show.to_string().contains(&big), "the API shows the value");

        let events = api.events(&id, None).await;
        let (_, _, data) = events
            .iter()
            .find(|(_, kind, data)| kind == "completed" && data["occurrence"]["node"] == "big")
            .expect("big's result is on the stream");
        let reference = &data["outputs"][0][1]["$artifact"];
        assert_eq!(reference["size"], BIG + 2, "{data:#}");
        assert_eq!(reference["sha256"].as_str().map(str::len), Some(64));
        assert!(
            !events.iter().any(|(_, _, d)| d.to_string().contains(&big)),
            "no event carries the value itself"
        );
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
}

/// A value whose artifact was corrupted or deleted on disk: `GET /api/runs/ID` still
/// shows the run (200) with a marker where the value was and the value listed under
/// `unreadable` (node, output, digest, what is wrong); `heddle runs show` refuses
/// (exit 1, `TERMINAL_ARTIFACT`) naming the same.
#[test]
fn an_unreadable_artifact_is_named_by_the_api_and_runs_show() {
    let code =
        serde_json::to_string(&format!("head -c {BIG} /dev/zero | tr '\\0' x; echo")).unwrap();
    let graph = format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "big", "type": "code.bash", "properties": {{"code": {code}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}],
  "edges": [{{"source": "big", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]}}"#
    );
    let dir = StoreDir::new();
    support::write(
        dir.path(),
        "heddle.toml",
        &format!("{CONFIG}inline_output_bytes = 4096\n"),
    );
    let server = dir.serve(None);
    let api = Api::of(&server);
    let db = rusqlite::Connection::open(dir.db()).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let id = rt().block_on(async {
        let id = api.create(&graph).await;
        let (show, _) = api.drive_to_end(&id).await;
        assert_eq!(show["state"], "completed", "{:.300}", show.to_string());
        let events = api.events(&id, None).await;
        let (_, _, data) = events
            .iter()
            .find(|(_, kind, data)| kind == "completed" && data["occurrence"]["node"] == "big")
            .expect("big's result is on the stream");
        let sha = data["outputs"][0][1]["$artifact"]["sha256"]
            .as_str()
            .unwrap()
            .to_string();

        for (change, problem) in [
            (
                "UPDATE artifacts SET bytes = x'00' WHERE sha256 = ?1",
                "corrupt",
            ),
            ("DELETE FROM artifacts WHERE sha256 = ?1", "missing"),
        ] {
            db.execute(change, [&sha]).unwrap();
            let (status, show) = api.call("GET", &format!("/api/runs/{id}"), None).await;
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
        }
        id
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    let o = dir.heddle(&["runs", "show", &id]);
    expect(&o, support::FAILED);
    let e = support::stderr(&o);
    for part in ["node big, output `result`", "missing", "TERMINAL_ARTIFACT"] {
        assert!(e.contains(part), "{part} not in {e}");
    }
}
