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
