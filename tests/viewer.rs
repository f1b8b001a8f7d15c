//! The web run viewer in a real headless Chromium, driven through WebDriver (the harness
//! is `support/browser.rs`) against the real `heddle serve`: the page follows a running
//! fan-out, a gate is approved and another rejected by clicking, an escalation is
//! answered, uncertain work is offered again, a run is cancelled, large values link to
//! all of them, a graph node is opened to its inner nodes, and a wrong token gets
//! nothing. Without Chromium these tests skip with a
//! loud message, unless `HEDDLE_REQUIRE_BROWSER=1` or `CI=true`, where they fail
//! (`scripts/test` installs Debian's `chromium` and `chromium-driver`).

#[path = "support/browser.rs"]
mod browser;
mod support;

use std::path::Path;

use browser::{Browser, driver};
use serde_json::{Value, json};
use support::serve::{Api, Server, rt};
use support::store::StoreDir;
use thirtyfour::By;

/// The page of run `id`, signed in through the URL fragment (never sent to the server).
fn run_page(server: &Server, id: &str) -> String {
    format!("{}/#/run/{id}&token={}", server.url, server.token)
}

/// A fan-out over six pages; `fetch` (a host bash process) waits for a file named after
/// its item in `release`, so the test decides when each invocation finishes.
fn fanout(release: &Path) -> String {
    json!({
        "format": "heddle.graph", "version": 1, "name": "fan-out",
        "nodes": [
            {"id": "pages", "type": "heddle.input", "properties": {"type": "list[str]",
                "value": ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]}},
            {"id": "each", "type": "heddle.foreach"},
            {"id": "fetch", "type": "code.bash", "properties": {
                "mode": "subprocess", "timeout_s": 600, "release": release,
                "code": "while [ ! -e \"$release/$item\" ]; do sleep 0.02; done; echo \"page $item\""}},
            {"id": "shout", "type": "std.text.case", "properties": {"mode": "upper"}},
            {"id": "all", "type": "heddle.collect"},
            {"id": "count", "type": "std.list.length"},
            {"id": "report", "type": "heddle.output"},
            {"id": "total", "type": "heddle.output"}
        ],
        "edges": [
            {"source": "pages", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
            {"source": "each", "sourceHandle": "item", "target": "fetch", "targetHandle": "item"},
            {"source": "fetch", "sourceHandle": "result", "target": "shout", "targetHandle": "text"},
            {"source": "shout", "sourceHandle": "text", "target": "all", "targetHandle": "item"},
            {"source": "all", "sourceHandle": "list", "target": "report", "targetHandle": "value"},
            {"source": "pages", "sourceHandle": "value", "target": "count", "targetHandle": "items"},
            {"source": "count", "sourceHandle": "length", "target": "total", "targetHandle": "value"}
        ]
    })
    .to_string()
}

/// Text tidied, then a gate before it is shouted; the nodes carry UI positions.
const GATE: &str = r#"{
  "format": "heddle.graph", "version": 1, "name": "release-notes",
  "nodes": [
    {"id": "notes", "type": "heddle.input", "properties": {"type": "str", "value": "  release 1.2:   faster graphs "},
     "ui_properties": {"position": {"x": 100, "y": 300}}},
    {"id": "tidy", "type": "std.text.regex_replace", "properties": {"pattern": "^\\s+|\\s+$", "replacement": ""},
     "ui_properties": {"position": {"x": 340, "y": 380}}},
    {"id": "approve_release", "type": "heddle.gate",
     "properties": {"title": "Publish the release announcement", "prompt": "Check the text before it is announced"},
     "ui_properties": {"position": {"x": 580, "y": 300}}},
    {"id": "shout", "type": "std.text.case", "properties": {"mode": "upper"},
     "ui_properties": {"position": {"x": 820, "y": 380}}},
    {"id": "announcement", "type": "heddle.output", "ui_properties": {"position": {"x": 1060, "y": 300}}}
  ],
  "edges": [
    {"source": "notes", "sourceHandle": "value", "target": "tidy", "targetHandle": "text"},
    {"source": "tidy", "sourceHandle": "text", "target": "approve_release", "targetHandle": "value"},
    {"source": "approve_release", "sourceHandle": "value", "target": "shout", "targetHandle": "text"},
    {"source": "shout", "sourceHandle": "text", "target": "announcement", "targetHandle": "value"}
  ]
}"#;

/// Where the test run keeps the run page's screenshot; `HEDDLE_UPDATE_SCREENSHOTS=1`
/// also writes the README's copy, `docs/viewer.png`.
fn save_screenshot(png: &[u8]) {
    let root = support::root();
    let dir = root.join("target/viewer-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.png"), png).unwrap();
    if std::env::var("HEDDLE_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(root.join("docs/viewer.png"), png).unwrap();
    }
}

#[test]
fn the_page_follows_a_running_fan_out_as_its_events_arrive() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let release = dir.path().join("release");
    std::fs::create_dir(&release).unwrap();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(&fanout(&release)).await;
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;

        // Live: the first page is being fetched, nothing has reached the report.
        b.until_node("fetch", "running").await;
        b.until_node("count", "completed").await;
        assert_eq!(b.node_state("report").await.as_deref(), Some("pending"));
        b.until_attr("#run-state", "data-state", "running").await;
        // Laid out from the edges (the document has no positions): no two boxes overlap.
        assert_eq!(b.overlapping_nodes().await, Vec::<Value>::new());
        assert!(
            !b.current_url().await.contains("token="),
            "the token is taken out of the address"
        );

        // Half of the pages come back: the same page (never reloaded) counts them.
        for item in ["alpha", "beta", "gamma"] {
            std::fs::write(release.join(item), "").unwrap();
        }
        b.until("fetch at 3 of its invocations", async |b: &Browser| {
            b.attr("g.node[data-node='fetch']", "data-label")
                .await
                .is_some_and(|l| l.starts_with("running 3/"))
        })
        .await;
        // Its third item may still be being shouted.
        b.until_node("shout", "completed").await;
        assert_eq!(b.node_state("report").await.as_deref(), Some("pending"));
        b.click("g.node[data-node='fetch']").await;
        b.until("the invocations of fetch", async |b: &Browser| {
            b.text("#detail").await.is_some_and(|t| {
                t.contains("fetch[each:item=2]")
                    && t.contains("page gamma")
                    && t.contains("wall")
                    && t.contains("\"timeout_s\": 600")
            })
        })
        .await;
        save_screenshot(&b.client().screenshot_as_png().await.unwrap());

        for item in ["delta", "epsilon", "zeta"] {
            std::fs::write(release.join(item), "").unwrap();
        }
        b.until_attr("#run-state", "data-state", "completed").await;
        for node in [
            "pages", "each", "fetch", "shout", "all", "count", "report", "total",
        ] {
            b.until_node(node, "completed").await;
        }
        // The run's outputs, with the node deselected.
        b.click("g.node[data-node='fetch']").await;
        b.until("the run's outputs", async |b: &Browser| {
            b.text("#run-outputs")
                .await
                .is_some_and(|t| t.contains("PAGE ALPHA") && t.contains("PAGE ZETA"))
        })
        .await;
        let show = api.show(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        b.close().await;
    });
}

#[test]
fn a_run_is_cancelled_from_its_page_with_two_clicks() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let release = dir.path().join("release");
    std::fs::create_dir(&release).unwrap();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(&fanout(&release)).await;
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_node("fetch", "running").await;

        // One click only arms the button.
        b.click("#run-cancel").await;
        b.until("the button asking again", async |b: &Browser| {
            b.text("#run-cancel")
                .await
                .is_some_and(|t| t.contains("Click again"))
        })
        .await;
        assert_eq!(api.show(&id).await["state"], "running");
        b.click("#run-cancel").await;
        b.until_attr("#run-state", "data-state", "cancelled").await;
        b.until_node("shout", "skipped").await;
        b.click("g.node[data-node='shout']").await;
        b.until("why shout was skipped", async |b: &Browser| {
            b.text("#detail")
                .await
                .is_some_and(|t| t.contains("cancelled before it could run"))
        })
        .await;
        assert!(!b.has("#run-cancel").await, "an ended run offers no cancel");
        assert_eq!(api.show(&id).await["state"], "cancelled");
        b.close().await;
    });
}

#[test]
fn uncertain_work_is_offered_again_from_the_page() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    // The first server dies right after `w` (not retry-safe) recorded its start.
    let mut first = dir.serve(Some("after-start:w"));
    let graph: Value = serde_json::from_str(support::store::CHAIN).unwrap();
    let api = Api::of(&first);
    rt().block_on(async {
        // The process may die before it answers; the run is on disk either way.
        let _ = api
            .http
            .post(format!("{}/api/runs", api.url))
            .bearer_auth(&api.token)
            .json(&json!({ "graph": graph }))
            .send()
            .await;
    });
    let status = first.child.wait().unwrap();
    assert_eq!(status.code(), None, "not aborted:\n{}", first.log());

    // The next server adopts the run, which pauses: only a person may offer `w` again.
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.runs().await[0]["run_id"].as_str().unwrap().to_string();
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_attr("#run-state", "data-state", "paused").await;
        b.until("the resume offer", async |b: &Browser| {
            b.has("#run-resume").await
        })
        .await;
        let panel = b.text("#action").await.unwrap();
        assert!(
            panel.contains("Node w started and its result was never recorded"),
            "{panel}"
        );
        b.click("#run-resume").await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until_node("up", "completed").await;
        assert!(!b.has("#run-resume").await);
        b.close().await;
    });
    assert_eq!(
        dir.lines(),
        vec!["one".to_string()],
        "w wrote once, when offered again"
    );
}

/// The other two answers to uncertain work, from the page: one run's `w` skipped, another's
/// recorded as completed with the outputs typed in (the form starts from what `w`
/// declares). Neither runs `w`; each answer is recorded with the name and note given.
#[test]
fn uncertain_work_is_answered_skipped_or_completed_from_the_page() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::with_graph(support::store::CHAIN);
    let paused = |dir: &StoreDir| {
        let id = dir.crash("after-start:w", &[]);
        let o = dir.heddle(&["runs", "resume", &id]);
        assert_eq!(
            o.status.code(),
            Some(support::SUSPENDED),
            "{}",
            support::stderr(&o)
        );
        id
    };
    let (skipped, completed) = (paused(&dir), paused(&dir));
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &skipped)).await;
        b.until("the answers", async |b: &Browser| {
            b.has("#reconcile-skip").await
        })
        .await;
        // Without a note nothing is sent.
        b.click("#reconcile-skip").await;
        b.until("the note asked for", async |b: &Browser| {
            b.text("#resume-message")
                .await
                .unwrap_or_default()
                .contains("note")
        })
        .await;
        b.type_into("#reconcile-by", "dana").await;
        b.type_into("#reconcile-note", "the file has no such line")
            .await;
        b.click("#reconcile-skip").await;
        b.until_node("w", "skipped").await;
        b.until("the run's ending", async |b: &Browser| {
            let s = b.attr("#run-state", "data-state").await.unwrap_or_default();
            s == "completed" || s == "failed"
        })
        .await;
        let show = api.show(&skipped).await;
        let w = &show["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["occurrence"]["node"] == "w")
            .unwrap()["reconciled"];
        assert_eq!(w["answer"], "skipped", "{show:#}");
        assert_eq!(w["by"], "dana", "{show:#}");
        assert_eq!(w["note"], "the file has no such line", "{show:#}");

        b.goto(&run_page(&server, &completed)).await;
        b.until("the outputs form", async |b: &Browser| {
            b.has("#reconcile-outputs").await
        })
        .await;
        let form = b
            .client()
            .find(By::Css("#reconcile-outputs"))
            .await
            .unwrap();
        let start: Value =
            serde_json::from_str(&form.prop("value").await.unwrap().unwrap()).unwrap();
        assert_eq!(
            start,
            json!({"path": null, "bytes": null}),
            "the form starts from the declaration"
        );
        form.clear().await.unwrap();
        form.send_keys(r#"{"path": "/data/log.txt", "bytes": 4}"#)
            .await
            .unwrap();
        b.type_into("#reconcile-note", "the line is there").await;
        b.click("#reconcile-completed").await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until_node("up", "completed").await;
        b.close().await;
        let show = api.show(&completed).await;
        let w = &show["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["occurrence"]["node"] == "w")
            .unwrap()["reconciled"];
        assert_eq!(w["answer"], "completed", "{show:#}");
        assert_eq!(w["by"], "dana", "the name is remembered: {show:#}");
    });
    assert_eq!(dir.lines(), Vec::<String>::new(), "an answered node ran");
}

/// The page's model against real summaries of one run: a summary made from fewer records
/// than the page applied (one read while the stream ran on, answered after it delivered
/// the ending) must not put the ended run back to an older state. Taken as is, the page
/// of a resumed run stayed "running" for good once its stream had ended.
#[test]
fn a_summary_older_than_the_records_read_does_not_undo_the_ending() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(GATE).await;
        let mut paused = api.show(&id).await;
        while paused["state"] != "paused" {
            let _ = api.events(&id, None).await;
            paused = api.show(&id).await;
        }
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{id}/gates/approve_release/approve"),
                None,
            )
            .await;
        assert_eq!(status, 202, "{body:#}");
        let (ended, _) = api.drive_to_end(&id).await;
        assert_eq!(ended["state"], "completed", "{ended:#}");
        let records = api.records(&id).await;
        assert_eq!(ended["records"], records.len(), "{ended:#}");

        let b = Browser::open(&driver).await;
        b.goto(&format!("{}/", server.url)).await;
        let script = r#"
            const [paused, ended, records, done] = arguments;
            import("/viewer/state.js").then((m) => {
                const model = new m.RunModel(paused);
                for (const r of records) model.apply(r);
                const stale = model.summary(paused);
                const afterStale = model.state;
                const fresh = model.summary(ended);
                done([stale, afterStale, fresh, model.state]);
            }, (e) => done(String(e)));"#;
        let got = b
            .client()
            .execute_async(
                script,
                vec![paused.clone(), ended.clone(), Value::Array(records)],
            )
            .await
            .unwrap();
        assert_eq!(
            got.json(),
            &json!([false, "completed", true, "completed"]),
            "paused summary:\n{paused:#}"
        );
        b.close().await;
    });
}

/// CHAIN with every node at `positions[i]` (editor coordinates).
fn chain_at(positions: &[(i64, i64)]) -> String {
    let mut g: Value = serde_json::from_str(support::store::CHAIN).unwrap();
    for (n, (x, y)) in g["nodes"].as_array_mut().unwrap().iter_mut().zip(positions) {
        n["ui_properties"] = json!({"position": {"x": x, "y": y}});
    }
    g.to_string()
}

#[test]
fn document_positions_are_spread_until_no_nodes_overlap() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let b = Browser::open(&driver).await;
        // Placed closer than the page's boxes are wide: spread out, in the same order.
        let tight = api
            .create(&chain_at(&[(0, 0), (60, 0), (120, 10), (180, 0)]))
            .await;
        // Two nodes on one spot: no spreading separates them; laid out from the edges.
        let stacked = api
            .create(&chain_at(&[(0, 0), (0, 0), (50, 0), (100, 0)]))
            .await;
        for id in [tight, stacked] {
            b.goto(&run_page(&server, &id)).await;
            b.until_node("out", "completed").await;
            assert_eq!(b.overlapping_nodes().await, Vec::<Value>::new(), "run {id}");
            let mut xs = Vec::new();
            for node in ["c", "w", "up", "out"] {
                let t = b
                    .attr(&format!("g.node[data-node='{node}']"), "transform")
                    .await
                    .unwrap();
                let x: f64 = t["translate(".len()..]
                    .split(',')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                xs.push(x);
            }
            assert!(xs.windows(2).all(|w| w[0] < w[1]), "left to right: {xs:?}");
        }
        b.close().await;
    });
}

#[test]
fn a_gate_is_answered_by_clicking_approve_or_reject() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let b = Browser::open(&driver).await;

        // Approve, with a note: recorded as the user's verdict, and the run completes.
        let id = api.create(GATE).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_attr("#run-state", "data-state", "paused").await;
        b.until_node("approve_release", "waiting").await;
        assert_eq!(b.node_state("tidy").await.as_deref(), Some("completed"));
        assert_eq!(b.node_state("shout").await.as_deref(), Some("pending"));
        // Drawn where the document puts the nodes (shifted to the margin).
        assert_eq!(
            b.attr("g.node[data-node='tidy']", "transform")
                .await
                .as_deref(),
            Some("translate(264,104)")
        );
        let panel = b.text("#action").await.unwrap();
        assert!(
            panel.contains("Publish the release announcement"),
            "{panel}"
        );
        assert!(
            panel.contains("Check the text before it is announced"),
            "{panel}"
        );
        b.type_into("#gate-note", "wording checked").await;
        b.click("#gate-approve").await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until_node("shout", "completed").await;
        b.until("the announcement", async |b: &Browser| {
            b.text("#run-outputs")
                .await
                .is_some_and(|t| t.contains("RELEASE 1.2:   FASTER GRAPHS"))
        })
        .await;
        let verdicts: Vec<Value> = api
            .events(&id, None)
            .await
            .into_iter()
            .filter(|(_, kind, _)| kind == "verdict")
            .map(|(_, _, r)| r)
            .collect();
        assert_eq!(verdicts.len(), 1, "{verdicts:#?}");
        assert_eq!(verdicts[0]["decided_by"], "user");
        assert_eq!(verdicts[0]["verdict"]["verdict"], "approve");
        assert_eq!(verdicts[0]["verdict"]["note"], "wording checked");
        assert!(
            b.text("#interventions")
                .await
                .unwrap()
                .contains("wording checked")
        );

        // Reject: refused in the page without a note, then the run ends cancelled with it.
        let id = api.create(GATE).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_node("approve_release", "waiting").await;
        b.click("#gate-reject").await;
        b.until("the page asking for a note", async |b: &Browser| {
            b.text("#gate-message")
                .await
                .is_some_and(|t| t.contains("needs one"))
        })
        .await;
        assert_eq!(api.show(&id).await["state"], "paused");
        b.type_into("#gate-note", "not this release").await;
        b.click("#gate-reject").await;
        b.until_attr("#run-state", "data-state", "cancelled").await;
        b.until("the rejection as the run's error", async |b: &Browser| {
            b.text("#run-error")
                .await
                .is_some_and(|t| t.contains("not this release"))
        })
        .await;
        b.until_node("approve_release", "cancelled").await;
        b.until_node("shout", "skipped").await;
        b.click("g.node[data-node='shout']").await;
        b.until("why shout was skipped", async |b: &Browser| {
            b.text("#detail")
                .await
                .is_some_and(|t| t.contains("gate approve_release was rejected"))
        })
        .await;
        let show = api.show(&id).await;
        assert_eq!(show["state"], "cancelled", "{show:#}");
        b.close().await;
    });
}

#[test]
fn a_wrong_token_gets_nothing() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    let id = rt().block_on(api.create(GATE));
    rt().block_on(async {
        let b = Browser::open(&driver).await;

        // The run's page, asked for directly: nothing of the run is drawn.
        b.goto(&format!("{}/#/run/{id}&token=not-the-token", server.url))
            .await;
        b.until("the refusal", async |b: &Browser| {
            b.text("#auth-error")
                .await
                .is_some_and(|t| t.contains("401"))
        })
        .await;
        assert!(!b.has("g.node").await);
        assert!(!b.body().await.contains("release-notes"));
        // Nor is the list of runs.
        b.goto(&format!("{}/#token=not-the-token", server.url))
            .await;
        // Taken out of the address as the page reads it, before it asks the API.
        b.until("the token out of the address", async |b: &Browser| {
            !b.current_url().await.contains("token=")
        })
        .await;
        b.until("the refusal", async |b: &Browser| {
            b.text("#auth-error")
                .await
                .is_some_and(|t| t.contains("401"))
        })
        .await;
        let body = b.body().await;
        assert!(!body.contains(&id), "a refused page shows no run:\n{body}");
        assert!(!b.has("table.runs").await);

        // The right token, typed in: the runs list shows the run.
        b.type_into("#token-input", &server.token).await;
        b.click("#token-submit").await;
        b.until_attr(&format!("tr[data-run='{id}']"), "data-state", "paused")
            .await;
        b.close().await;
    });
    // The server says where the page is.
    let said = format!("run viewer at {}/", server.url);
    let started = std::time::Instant::now();
    while !server.log().contains(&said) {
        assert!(started.elapsed() < browser::PATIENCE, "{}", server.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The page's files need no token (they hold no data); the API needs the right one.
    rt().block_on(async {
        let http = reqwest::Client::new();
        let page = http.get(format!("{}/", server.url)).send().await.unwrap();
        assert_eq!(page.status().as_u16(), 200);
        let html = page.text().await.unwrap();
        assert!(html.contains("/viewer/app.js"), "{html}");
        for path in ["/api/runs".to_string(), format!("/api/runs/{id}")] {
            let r = http
                .get(format!("{}{path}", server.url))
                .bearer_auth("not-the-token")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 401, "{path}");
        }
    });
}

/// Reads `/data/ready.txt` (retry-safe): fails until the file exists.
const READ: &str = r#"{"format": "heddle.graph", "version": 1, "name": "read-when-ready",
  "nodes": [
    {"id": "p", "type": "heddle.constant", "properties": {"value": "/data/ready.txt"}},
    {"id": "read", "type": "files.read_text"},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "p", "sourceHandle": "value", "target": "read", "targetHandle": "path"},
    {"source": "read", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn an_escalation_is_answered_by_clicking_a_verdict() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let graph: Value = serde_json::from_str(READ).unwrap();
        let (status, created) = api
            .call(
                "POST",
                "/api/runs",
                Some(json!({"graph": graph, "supervise": "interactive"})),
            )
            .await;
        assert_eq!(status, 201, "{created:#}");
        let id = created["run_id"].as_str().unwrap().to_string();
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;

        // The failure waits for a person, its verdicts offered as buttons.
        b.until("the escalation's buttons", async |b: &Browser| {
            b.has(".escalation button[data-verdict='retry']").await
        })
        .await;
        b.until_node("read", "waiting").await;
        let (_, listed) = api
            .call("GET", &format!("/api/runs/{id}/escalations"), None)
            .await;
        let mut allowed: Vec<String> = listed["escalations"][0]["allowed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let mut shown = Vec::new();
        for button in b
            .client()
            .find_all(By::Css(".escalation button[data-verdict]"))
            .await
            .unwrap()
        {
            shown.push(button.attr("data-verdict").await.unwrap().unwrap());
        }
        allowed.sort();
        shown.sort();
        assert_eq!(shown, allowed, "the buttons are the kernel's allowed set");
        let panel = b.text("#action").await.unwrap();
        assert!(panel.contains("Node read failed"), "{panel}");
        // The output is not known yet: nothing from upstream of the failed node stands in.
        let run = b.text("#detail").await.unwrap();
        assert!(!run.contains("/data/ready.txt"), "{run}");
        assert!(panel.contains("ready.txt"), "the error is shown: {panel}");

        // The file appears; a click retries the node, which now succeeds.
        std::fs::write(dir.path().join("data/ready.txt"), "ready now").unwrap();
        b.type_into(".escalation-note", "the file is there now")
            .await;
        b.click(".escalation button[data-verdict='retry']").await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until_node("read", "completed").await;
        b.until("the run's output", async |b: &Browser| {
            b.text("#run-outputs")
                .await
                .is_some_and(|t| t.contains("ready now"))
        })
        .await;
        assert!(!b.has(".escalation").await, "nothing is pending any more");
        let verdicts: Vec<Value> = api
            .events(&id, None)
            .await
            .into_iter()
            .filter(|(_, kind, _)| kind == "verdict")
            .map(|(_, _, r)| r)
            .collect();
        assert_eq!(verdicts.len(), 1, "{verdicts:#?}");
        assert_eq!(verdicts[0]["verdict"]["verdict"], "retry", "{verdicts:#?}");
        assert!(b.text("#interventions").await.unwrap().contains("retry"));
        b.close().await;
    });
}

#[test]
fn a_large_value_is_cut_short_with_links_to_all_of_it() {
    let Some(driver) = driver() else { return };
    let bash = |text: &str| json!({"mode": "subprocess", "code": format!("head -c {} /dev/zero | tr '\\0' {}; echo", text.len(), &text[..1])});
    let big = "x".repeat(20_000);
    let medium = "y".repeat(2_000);
    let graph = json!({
        "format": "heddle.graph", "version": 1, "name": "large-values",
        "nodes": [
            {"id": "big", "type": "code.bash", "properties": bash(&big)},
            {"id": "medium", "type": "code.bash", "properties": bash(&medium)},
            {"id": "out_big", "type": "heddle.output"},
            {"id": "out_medium", "type": "heddle.output"}
        ],
        "edges": [
            {"source": "big", "sourceHandle": "result", "target": "out_big", "targetHandle": "value"},
            {"source": "medium", "sourceHandle": "result", "target": "out_medium", "targetHandle": "value"}
        ]
    });
    let dir = StoreDir::new();
    // Values over 4 KiB are stored as artifacts; the log and the stream hold references.
    support::write(
        dir.path(),
        "heddle.toml",
        &format!("{}inline_output_bytes = 4096\n", support::store::CONFIG),
    );
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(&graph.to_string()).await;
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_attr("#run-state", "data-state", "completed").await;

        // Stored as an artifact: the page links to it and shows it on a click.
        b.click("g.node[data-node='big']").await;
        b.until("the artifact's link", async |b: &Browser| {
            b.has("#detail .artifact-link").await
        })
        .await;
        assert!(
            b.text("#detail")
                .await
                .unwrap()
                .contains("Stored as an artifact")
        );
        assert!(
            !b.body().await.contains(&big),
            "the page does not inline it"
        );
        b.click("#detail .artifact-link").await;
        b.until("the artifact's value", async |b: &Browser| {
            b.text("#full-body").await.is_some_and(|t| t.contains(&big))
        })
        .await;
        b.click("#full-close").await;

        // Inline but long: cut short in the page, all of it a click away.
        b.click("g.node[data-node='medium']").await;
        b.until("the link to the whole value", async |b: &Browser| {
            b.has("#detail .full-link").await
        })
        .await;
        let shown = b.text("#detail").await.unwrap();
        assert!(
            shown.contains(&medium[..600]) && !shown.contains(&medium),
            "{shown}"
        );
        b.click("#detail .full-link").await;
        b.until("the whole value", async |b: &Browser| {
            b.text("#full-body")
                .await
                .is_some_and(|t| t.contains(&medium))
        })
        .await;
        b.close().await;
    });
}

/// The page links an artifact reference to its bytes, which the API serves by digest,
/// behind the token like every other read.
#[test]
fn an_artifact_is_served_by_its_digest() {
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let id = rt().block_on(Api::of(&server).create(GATE));
    // The run's artifact, stored while no server owns the store.
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let stored = heddle_store::SqliteStore::open(&dir.store())
        .unwrap()
        .put_artifact(&id, Some("report"), &bytes, &Default::default())
        .unwrap();
    let server = dir.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        let get = |path: String, token: &'static str| {
            let http = api.http.clone();
            let url = format!("{}{path}", server.url);
            let token = if token.is_empty() {
                api.token.clone()
            } else {
                token.into()
            };
            async move { http.get(url).bearer_auth(token).send().await.unwrap() }
        };
        let ok = get(format!("/api/runs/{id}/artifacts/{}", stored.sha256), "").await;
        assert_eq!(ok.status().as_u16(), 200);
        assert_eq!(
            ok.headers()["content-type"].to_str().unwrap(),
            "application/octet-stream"
        );
        assert_eq!(ok.bytes().await.unwrap().as_ref(), bytes.as_slice());

        let other = "0".repeat(64);
        let missing = get(format!("/api/runs/{id}/artifacts/{other}"), "").await;
        assert_eq!(missing.status().as_u16(), 404);
        let elsewhere = get(format!("/api/runs/nope/artifacts/{}", stored.sha256), "").await;
        assert_eq!(elsewhere.status().as_u16(), 404);
        let malformed = get(format!("/api/runs/{id}/artifacts/not-a-digest"), "").await;
        assert_eq!(malformed.status().as_u16(), 400);
        let refused = get(
            format!("/api/runs/{id}/artifacts/{}", stored.sha256),
            "not-the-token",
        )
        .await;
        assert_eq!(refused.status().as_u16(), 401);
    });
}

/// The innermost graph: its text shouted.
const SHOUT_GRAPH: &str = r#"{"nodes": [
  {"id": "text", "type": "heddle.input", "properties": {"type": "str"}},
  {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
  {"id": "out", "type": "heddle.output"}],
 "edges": [
  {"source": "text", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
  {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}]}"#;

/// A page fetched (a host bash process that waits for a file named after its item in
/// `release`, and fails for `beta`), then shouted by the graph node `h` of `SHOUT_GRAPH`.
fn fetch_graph(release: &Path) -> String {
    let shout = heddle_core::compose::sha256_hex(SHOUT_GRAPH.as_bytes());
    json!({"nodes": [
        {"id": "item", "type": "heddle.input", "properties": {"type": "str"}},
        {"id": "fetch", "type": "code.bash", "properties": {
            "mode": "subprocess", "timeout_s": 600, "release": release,
            "code": "while [ ! -e \"$release/$item\" ]; do sleep 0.02; done; if [ \"$item\" = beta ]; then echo \"no such page: $item\" >&2; exit 3; fi; echo \"page $item\""}},
        {"id": "h", "type": "heddle.graph", "properties": {"graph": "shout.json", "sha256": shout}},
        {"id": "out", "type": "heddle.output"}
    ], "edges": [
        {"source": "item", "sourceHandle": "value", "target": "fetch", "targetHandle": "item"},
        {"source": "fetch", "sourceHandle": "result", "target": "h", "targetHandle": "text"},
        {"source": "h", "sourceHandle": "out", "target": "out", "targetHandle": "value"}
    ]})
    .to_string()
}

/// A graph node is drawn as one box (a stack) with the state of what runs inside it;
/// clicked, it opens in place to its inner nodes by path, with their live states (a
/// graph node inside it opens the same way), each inner node's invocations and errors
/// one click away; clicked again it closes. A NodeTool workflow is drawn as Heddle
/// reads it.
#[test]
fn a_graph_node_opens_to_its_inner_nodes_and_their_live_states() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let release = dir.path().join("release");
    std::fs::create_dir(&release).unwrap();
    let server = dir.serve(None);
    let api = Api::of(&server);
    let fetch = fetch_graph(&release);
    let outer = json!({"format": "heddle.graph", "version": 1, "name": "pages", "nodes": [
        {"id": "pages", "type": "heddle.input", "properties": {"type": "list[str]", "value": ["alpha", "beta"]}},
        {"id": "each", "type": "heddle.foreach"},
        {"id": "g", "type": "heddle.graph", "properties": {"graph": "graphs/fetch.json",
            "sha256": heddle_core::compose::sha256_hex(fetch.as_bytes())}},
        {"id": "all", "type": "heddle.collect"},
        {"id": "report", "type": "heddle.output"}
    ], "edges": [
        {"source": "pages", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
        {"source": "each", "sourceHandle": "item", "target": "g", "targetHandle": "item"},
        {"source": "g", "sourceHandle": "out", "target": "all", "targetHandle": "item"},
        {"source": "all", "sourceHandle": "list", "target": "report", "targetHandle": "value"}
    ]});
    rt().block_on(async {
        let (status, body) = api
            .call(
                "POST",
                "/api/runs",
                Some(json!({"graph": outer, "graphs": {
                    "graphs/fetch.json": fetch, "graphs/shout.json": SHOUT_GRAPH}})),
            )
            .await;
        assert_eq!(status, 201, "{body:#}");
        let id = body["run_id"].as_str().unwrap().to_string();
        // What the page draws: the graph as planned, every node at its path.
        let show = api.show(&id).await;
        let expanded: Vec<&str> = show["expanded"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap())
            .collect();
        for want in ["g/fetch", "g/h/up", "g/item", "g/out"] {
            assert!(expanded.contains(&want), "{want} not in {expanded:?}");
        }
        assert_eq!(show["plan"]["graphs"].as_array().unwrap().len(), 2);

        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;
        // Closed: one box, running while its fetches wait; nothing inside drawn.
        b.until_node("g", "running").await;
        assert_eq!(
            b.attr("g.node[data-node='g']", "data-open")
                .await
                .as_deref(),
            Some("false")
        );
        assert!(!b.has("g.node[data-node='g/fetch']").await);
        assert_eq!(b.node_state("report").await.as_deref(), Some("pending"));

        // Opened in place: its inner nodes, live; the graph node inside it closed.
        b.click("g.node[data-node='g']").await;
        b.until_node("g/fetch", "running").await;
        assert_eq!(
            b.attr("g.node[data-node='g']", "data-open")
                .await
                .as_deref(),
            Some("true")
        );
        assert_eq!(
            b.attr("g.node[data-node='g/h']", "data-open")
                .await
                .as_deref(),
            Some("false")
        );
        assert!(!b.has("g.node[data-node='g/h/up']").await);
        assert_eq!(b.overlapping_nodes().await, Vec::<Value>::new());
        b.until("the graph node's panel", async |b: &Browser| {
            b.text("#detail").await.is_some_and(|t| {
                t.contains("graphs/fetch.json") && t.contains("g/fetch") && t.contains("g/h/up")
            })
        })
        .await;

        std::fs::write(release.join("alpha"), "").unwrap();
        b.until("g/fetch at 1 of its 2 invocations", async |b: &Browser| {
            b.attr("g.node[data-node='g/fetch']", "data-label")
                .await
                .is_some_and(|l| l.starts_with("running 1/2"))
        })
        .await;
        b.click("g.node[data-node='g/h']").await;
        b.until_node("g/h/up", "completed").await;
        assert_eq!(b.overlapping_nodes().await, Vec::<Value>::new());
        assert_eq!(b.node_state("g").await.as_deref(), Some("running"));

        // beta fails inside: the inner node, the graph node and the run say so, and the
        // error is one click away.
        std::fs::write(release.join("beta"), "").unwrap();
        b.until_attr("#run-state", "data-state", "failed").await;
        b.until_node("g/fetch", "failed").await;
        b.until_node("g", "failed").await;
        b.click("g.node[data-node='g/fetch']").await;
        b.until("g/fetch's invocations and error", async |b: &Browser| {
            b.text("#detail").await.is_some_and(|t| {
                t.contains("g/fetch[each:item=0]")
                    && t.contains("page alpha")
                    && t.contains("g/fetch[each:item=1]")
                    && t.contains("no such page: beta")
            })
        })
        .await;
        save_graph_screenshot(&b.client().screenshot_as_png().await.unwrap());

        // Clicked on its title, the opened graph node closes, the one inside it too.
        b.click("g.node[data-node='g'] > text.title").await;
        b.until("g closed", async |b: &Browser| {
            b.attr("g.node[data-node='g']", "data-open")
                .await
                .as_deref()
                == Some("false")
        })
        .await;
        assert!(!b.has("g.node[data-node='g/fetch']").await);
        assert!(!b.has("g.node[data-node='g/h/up']").await);
        // Its panel lists the inner nodes; one click reaches an inner node's invocations,
        // opening what is around it.
        b.until("the failed node in the panel", async |b: &Browser| {
            b.text("#group-nodes")
                .await
                .is_some_and(|t| t.contains("no such page: beta"))
        })
        .await;
        b.click("li[data-inner='g/h/up'] a.inner-link").await;
        b.until_node("g/h/up", "completed").await;
        b.until("g/h/up's invocation", async |b: &Browser| {
            b.text("#detail")
                .await
                .is_some_and(|t| t.contains("g/h/up[each:item=0]") && t.contains("PAGE ALPHA"))
        })
        .await;

        // A NodeTool workflow, drawn with Heddle's types.
        let nodetool =
            std::fs::read_to_string(support::root().join("tests/fixtures/nodetool/greeting.json"))
                .unwrap();
        let nt = api.create(&nodetool).await;
        b.goto(&run_page(&server, &nt)).await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until_node("card", "completed").await;
        let shown = b
            .text("g.node[data-node='name_in']")
            .await
            .unwrap_or_default();
        assert!(shown.contains("heddle.input"), "{shown}");
        b.close().await;
    });
}

/// Where the test run keeps the page of an opened graph node.
fn save_graph_screenshot(png: &[u8]) {
    let dir = support::root().join("target/viewer-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("graph-node.png"), png).unwrap();
}

/// On a database several hosts share, the page served by one host works unchanged for
/// runs another host drives: it follows one to its end (the events read from the
/// database as the driving host writes them) and cancels another with its button (the
/// driving host asked through the database, which records it).
#[test]
fn the_page_of_one_host_follows_and_cancels_runs_another_host_drives() {
    let Some(driver) = driver() else { return };
    if support::skip_pg() {
        return;
    }
    let dir = StoreDir::on(support::Backend::Postgres);
    let release = dir.path().join("release");
    let held = dir.path().join("held");
    std::fs::create_dir(&release).unwrap();
    std::fs::create_dir(&held).unwrap();
    let a = dir.serve_with(&["--host-id", "view-a"], &[]);
    let b = dir.serve_with(&["--host-id", "view-b"], &[]);
    let api_a = Api::of(&a);
    rt().block_on(async {
        let id = api_a.create(&fanout(&release)).await;
        let page = Browser::open(&driver).await;
        page.goto(&run_page(&b, &id)).await;
        page.until_node("fetch", "running").await;
        let show = api_a.show(&id).await;
        assert_eq!(show["owner_host"], "view-a", "{show:#}");
        for item in ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"] {
            std::fs::write(release.join(item), "").unwrap();
        }
        page.until_attr("#run-state", "data-state", "completed")
            .await;
        page.until_node("report", "completed").await;

        let other = api_a.create(&fanout(&held)).await;
        page.goto(&run_page(&b, &other)).await;
        page.until_node("fetch", "running").await;
        page.click("#run-cancel").await;
        page.until("the button asking again", async |p: &Browser| {
            p.text("#run-cancel")
                .await
                .is_some_and(|t| t.contains("Click again"))
        })
        .await;
        page.click("#run-cancel").await;
        page.until_attr("#run-state", "data-state", "cancelled")
            .await;
        assert_eq!(api_a.show(&other).await["state"], "cancelled");
        page.close().await;
    });
}

#[test]
fn a_controlled_node_shows_its_controller_and_one_invocation_per_run_event() {
    let Some(driver) = driver() else { return };
    let dir = StoreDir::new();
    let server = dir.serve(None);
    let api = Api::of(&server);
    let graph = json!({
        "format": "heddle.graph", "version": 1, "name": "run-each",
        "nodes": [
            {"id": "items", "type": "heddle.constant", "properties": {"value": [1, 2, 3]}},
            {"id": "each", "type": "heddle.run_each", "properties": {"property": "value"}},
            {"id": "e", "type": "heddle.eval", "properties": {"expression": "value * 10"}},
            {"id": "out", "type": "heddle.output"}
        ],
        "edges": [
            {"source": "items", "sourceHandle": "value", "target": "each", "targetHandle": "items"},
            {"source": "each", "sourceHandle": "__control__", "target": "e",
             "targetHandle": "__control__", "edge_type": "control"},
            {"source": "each", "sourceHandle": "results", "target": "out", "targetHandle": "value"}
        ]
    })
    .to_string();
    rt().block_on(async {
        let id = api.create(&graph).await;
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.until_node("e", "completed").await;
        // Each run event is one recorded invocation of the controlled node.
        b.click("g.node[data-node='e']").await;
        b.until("e's controller and its invocations", async |b: &Browser| {
            b.text("#detail").await.is_some_and(|t| {
                t.contains("control events from each")
                    && t.contains("e[control:each]#1")
                    && t.contains("e[control:each]#2")
                    && t.contains("30")
            })
        })
        .await;
        b.click("g.node[data-node='each']").await;
        b.until("what each controls", async |b: &Browser| {
            b.text("#detail")
                .await
                .is_some_and(|t| t.contains("controls") && t.contains("run_each"))
        })
        .await;
    });
}

#[test]
fn a_wasm_controllers_invocation_lists_the_run_events_it_sent() {
    let Some(driver) = driver() else { return };
    // `demo.each_word` (WASM, journaled) sends one run event per word to `demo.shout`.
    let dir = StoreDir::with_control_nodes();
    let server = dir.serve(None);
    let api = Api::of(&server);
    let graph = std::fs::read_to_string(dir.path().join("g.json")).unwrap();
    rt().block_on(async {
        let id = api.create(&graph).await;
        let b = Browser::open(&driver).await;
        b.goto(&run_page(&server, &id)).await;
        b.until_attr("#run-state", "data-state", "completed").await;
        b.click("g.node[data-node='each']").await;
        // Each event with its target and the property it overrode, as the controller's
        // recorded result holds them; no more events than words.
        b.until("the events each sent", async |b: &Browser| {
            b.text("#detail").await.is_some_and(|t| {
                t.contains("controls")
                    && t.contains("run event 1 → shout")
                    && t.contains("run event 3 → shout")
                    && t.contains("controlled")
                    && !t.contains("run event 4")
            })
        })
        .await;
    });
}
