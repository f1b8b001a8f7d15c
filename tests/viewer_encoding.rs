//! A browser reads the compressed event stream: headless Chromium (over WebDriver, like
//! `viewer.rs`; skips without a browser unless `HEDDLE_REQUIRE_BROWSER=1` or `CI=true`)
//! asks for `gzip, deflate, br, zstd` as it does on any origin, gets zstd, and decodes
//! what the server sends live, from a `Last-Event-ID` in the middle of the history and
//! across the run's end, into exactly the stored log; the run page itself follows the
//! same run to its end over it. (Chromium 156 offers zstd whatever its flags say, so the
//! gzip stream is checked by strict decoders in `serve_sse.rs` and the benches.)

// Shared with `viewer.rs`, which uses the whole harness.
#[allow(dead_code)]
#[path = "support/browser.rs"]
mod browser;
mod support;

use browser::{Browser, driver};
use serde_json::{Value, json};
use support::serve::{Api, parse_sse, rt};
use support::store::{StoreDir, WAITING_FAN};

/// Opens two streams of run `id` from the page (one from the start, one after record
/// 1), each kept in `window.streams` with its `Content-Encoding` once it ends.
const OPEN_STREAMS: &str = r#"
    const [id, token] = arguments;
    window.streams = {};
    const read = async (name, last) => {
        const headers = { Authorization: `Bearer ${token}` };
        if (last !== null) headers["Last-Event-ID"] = String(last);
        const r = await fetch(`/api/runs/${id}/events`, { headers, cache: "no-store" });
        const text = await r.text();
        window.streams[name] = { encoding: r.headers.get("content-encoding"), text };
    };
    read("first", null).catch((e) => { window.streams.first = { error: String(e) }; });
    read("after1", 1).catch((e) => { window.streams.after1 = { error: String(e) }; });
    return true;"#;

/// The event stream's resource timing, once the page's own stream of the run ended:
/// bytes as sent and as decoded.
const PAGE_STREAM_SIZES: &str = r#"
    const e = performance.getEntriesByType("resource")
        .filter((e) => e.name.endsWith(`/api/runs/${arguments[0]}/events`))
        .filter((e) => e.decodedBodySize > 0);
    return e.length ? [e[0].encodedBodySize, e[0].decodedBodySize] : null;"#;

async fn script(b: &Browser, js: &str, args: Vec<Value>) -> Value {
    b.client().execute(js, args).await.unwrap().json().clone()
}

#[test]
fn chromium_decodes_the_zstd_stream_live_and_resumed_into_the_stored_log() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve_with(&["--supervise", "interactive"], &[]);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(WAITING_FAN).await;
        let eid = api.first_escalation(&id).await;
        let b = Browser::open(&driver).await;
        b.goto(&format!("{}/#/run/{id}&token={}", server.url, server.token))
            .await;
        b.until_attr("#run-state", "data-state", "running").await;
        script(&b, OPEN_STREAMS, vec![json!(id), json!(server.token)]).await;
        let lines: Vec<String> = (0..2000).map(|i| format!("item {i}")).collect();
        std::fs::write(dir.path().join("data/items.txt"), lines.join("\n")).unwrap();
        api.retry(&id, &eid).await;
        const ENDED: &str =
            "return window.streams.first && window.streams.after1 ? window.streams : null";
        b.until("both streams ended", async |b: &Browser| {
            !script(b, ENDED, vec![]).await.is_null()
        })
        .await;
        let streams = script(&b, ENDED, vec![]).await;
        let log = api.events(&id, None).await;
        assert_eq!(log.last().unwrap().1, "finished");
        for (name, want) in [("first", &log[..]), ("after1", &log[2..])] {
            let s = &streams[name];
            assert_eq!(s["encoding"], "zstd", "{name}: {s:#}");
            let got = parse_sse(s["text"].as_str().unwrap());
            assert!(got == want, "{name}: the browser decoded something else");
        }
        // The page followed the run to its end over the same compressed stream.
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until("the page's stream ended", async |b: &Browser| {
            !script(b, PAGE_STREAM_SIZES, vec![json!(id)])
                .await
                .is_null()
        })
        .await;
        let sizes = script(&b, PAGE_STREAM_SIZES, vec![json!(id)]).await;
        let (sent, decoded) = (sizes[0].as_u64().unwrap(), sizes[1].as_u64().unwrap());
        assert!(sent * 4 < decoded, "compressed {sent} of {decoded} bytes");
        b.close().await;
    });
}
