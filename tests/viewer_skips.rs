//! The viewer reads why a node never ran from the log's `skipped` records, in a real
//! headless Chromium against the real `heddle serve` (skips without a browser unless
//! `HEDDLE_REQUIRE_BROWSER=1` or `CI=true`, like `viewer.rs`).

// Shared with `viewer.rs`, which uses the whole harness.
#[allow(dead_code)]
#[path = "support/browser.rs"]
mod browser;
mod support;

use browser::{Browser, driver};
use serde_json::{Value, json};
use support::serve::{Api, rt};
use support::store::{FAILING_PARSE, StoreDir};

#[test]
fn the_page_shows_the_skip_reason_the_log_recorded() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(FAILING_PARSE).await;
        let (ended, _) = api.drive_to_end(&id).await;
        assert_eq!(ended["state"], "failed", "{ended:#}");
        assert_eq!(ended["skipped"]["up"], "upstream_failed", "{ended:#}");
        let mut records = api.records(&id).await;
        assert!(records.iter().any(|r| r["kind"] == "skipped"));

        let b = Browser::open(&driver).await;
        b.goto(&format!("{}/", server.url)).await;
        // The recorded reason wins over what the neighbours suggest: a log saying `up`
        // was skipped because the run was cancelled is read as that.
        for r in records.iter_mut().filter(|r| r["kind"] == "skipped") {
            if r["node"] == "up" {
                r["reason"] = json!("cancelled");
            }
        }
        let script = r#"
            const [run, records, done] = arguments;
            import("/viewer/state.js").then((m) => {
                const model = new m.RunModel(run);
                for (const r of records) model.apply(r);
                const s = model.nodeState("up");
                done([s.state, s.reason, model.skipped.get("up")]);
            }, (e) => done(String(e)));"#;
        let got = b
            .client()
            .execute_async(script, vec![ended.clone(), Value::Array(records)])
            .await
            .unwrap();
        assert_eq!(
            got.json(),
            &json!([
                "skipped",
                "the run was cancelled before it could run",
                "cancelled"
            ])
        );
        b.close().await;
    });
}
