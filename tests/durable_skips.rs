//! The log records why each node of a finished run never ran (`skipped` records
//! written with the ending), so `heddle runs show --json` and the viewer read skips
//! instead of guessing them from the neighbours. A paused run records none: its nodes
//! run on when it is resumed. With the real binary and store.

mod support;

use support::store::{Backend, FAILING_PARSE, GATED, StoreDir, expect};
use support::{FAILED, SUSPENDED};

// On a store file and on PostgreSQL.
crate::both!(
    a_finished_run_records_why_its_nodes_never_ran,
    a_paused_run_records_no_skips,
    a_run_rejected_through_the_server_records_why_its_nodes_never_ran,
    a_paused_run_rejected_or_cancelled_from_the_command_line_records_its_skips,
    a_run_cancelled_before_a_worker_took_it_skips_every_node,
);

/// The `skipped` records in the store, read through it: (node, reason).
fn skipped_records(d: &StoreDir) -> Vec<(String, String)> {
    d.records_of("skipped")
        .into_iter()
        .map(|r| {
            let v = serde_json::to_value(&r).unwrap();
            (
                v["node"].as_str().unwrap().to_string(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn a_finished_run_records_why_its_nodes_never_ran(b: Backend) {
    let d = StoreDir::with_graph_on(b, FAILING_PARSE);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, FAILED);
    let run = support::store::run_id(&o);
    let recorded = skipped_records(&d);
    assert!(
        recorded.contains(&("up".to_string(), "upstream_failed".to_string())),
        "{recorded:?}"
    );
    assert!(
        !recorded.iter().any(|(n, _)| n == "c" || n == "parse"),
        "{recorded:?}"
    );
    let show = d.show(&run);
    assert_eq!(show["skipped"]["up"], "upstream_failed", "{show:#}");
    assert!(show["skipped"].get("parse").is_none(), "{show:#}");
}

fn a_paused_run_records_no_skips(b: Backend) {
    let d = StoreDir::with_graph_on(b, GATED);
    let o = d.heddle(&["run", "--durable", "g.json"]);
    expect(&o, SUSPENDED);
    let run = support::store::run_id(&o);
    assert_eq!(skipped_records(&d), Vec::<(String, String)>::new());
    assert_eq!(d.show(&run)["skipped"], serde_json::json!({}));
}

/// Every way a run ends writes the same `skipped` records. A gate rejected through the
/// server (which ends the run without running it) skips the gate and what is below
/// it, as cancelled; the constant above it ran.
fn a_run_rejected_through_the_server_records_why_its_nodes_never_ran(b: Backend) {
    use support::serve::{Api, rt};
    let d = StoreDir::with_graph_on(b, GATED);
    let graph = std::fs::read_to_string(d.path().join("g.json")).unwrap();
    let server = d.serve(None);
    let api = Api::of(&server);
    let show = rt().block_on(async {
        let id = api.create(&graph).await;
        while api.show(&id).await["state"] != "paused" {
            let _ = api.events(&id, None).await;
        }
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{id}/gates/ship/reject"),
                Some(serde_json::json!({ "note": "not today" })),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        api.show(&id).await
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    assert_eq!(show["state"], "cancelled", "{show:#}");
    assert_eq!(
        show["skipped"],
        serde_json::json!({"ship": "cancelled", "out": "cancelled"}),
        "{show:#}"
    );
    let mut recorded = skipped_records(&d);
    recorded.sort();
    assert_eq!(
        recorded,
        [
            ("out".to_string(), "cancelled".to_string()),
            ("ship".to_string(), "cancelled".to_string())
        ]
    );
}

/// The command line's ways to end a paused run record the same skips: a rejection
/// and a cancel.
fn a_paused_run_rejected_or_cancelled_from_the_command_line_records_its_skips(b: Backend) {
    for end in [
        &["reject", "RUN", "ship", "--note", "not today"][..],
        &["cancel", "RUN"][..],
    ] {
        let d = StoreDir::with_graph_on(b, GATED);
        let o = d.heddle(&["run", "--durable", "g.json"]);
        expect(&o, SUSPENDED);
        let run = support::store::run_id(&o);
        let mut args = vec!["runs"];
        args.extend(
            end.iter()
                .map(|a| if *a == "RUN" { run.as_str() } else { a }),
        );
        expect(&d.heddle(&args), support::OK);
        let show = d.show(&run);
        assert_eq!(show["state"], "cancelled", "{end:?}: {show:#}");
        assert_eq!(
            show["skipped"],
            serde_json::json!({"ship": "cancelled", "out": "cancelled"}),
            "{end:?}: {show:#}"
        );
    }
}

/// A run cancelled while it waits for a worker never ran at all: every node is skipped
/// as cancelled (the server ends it without the kernel).
fn a_run_cancelled_before_a_worker_took_it_skips_every_node(b: Backend) {
    use support::serve::{Api, rt};
    const SLOW: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "wait", "type": "code.bash", "properties": {"code": "sleep 60", "mode": "subprocess"}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [{"source": "wait", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]}"#;
    let d = StoreDir::on(b);
    let server = d.serve_with(&["--workers", "1"], &[]);
    let api = Api::of(&server);
    let show = rt().block_on(async {
        // The one worker, held by a run whose node has started.
        let busy = api.create(SLOW).await;
        loop {
            let s = api.show(&busy).await;
            let started = s["occurrences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["started"].as_u64() > Some(0)));
            if started {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let queued = api.create(GATED).await;
        let (status, body) = api
            .call("POST", &format!("/api/runs/{queued}/cancel"), None)
            .await;
        assert_eq!(status, 202, "{body:#}");
        let show = loop {
            let s = api.show(&queued).await;
            // Waiting for a worker: `running` on a store file, `queued` on a database.
            if s["state"] != "running" && s["state"] != "queued" {
                break s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let _ = api
            .call("POST", &format!("/api/runs/{busy}/cancel"), None)
            .await;
        show
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    assert_eq!(show["state"], "cancelled", "{show:#}");
    assert_eq!(
        show["skipped"],
        serde_json::json!({"c": "cancelled", "ship": "cancelled", "out": "cancelled"}),
        "{show:#}"
    );
}
