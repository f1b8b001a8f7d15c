//! Concurrent answers to one run inside one `heddle serve` are serialized through the
//! run's owner: of approvals sent at once one answers 202 and the others 409 naming
//! what won, nothing of a refused one is written, and the run never stays `running`
//! without a driver; an approval racing a cancel either runs on and is cancelled, or
//! finds the run cancelled, and a cancel answered 202 is never lost. Repeated trials on
//! the real binary over HTTP; effects counted in a file.

mod support;

use serde_json::Value;
use support::serve::{Api, rt};
use support::store::{Backend, StoreDir};

// On a store file and on PostgreSQL (a host of a shared database).
crate::both!(
    of_concurrent_approvals_one_wins_the_others_get_409_and_nothing_of_theirs_is_written,
    an_approval_racing_a_cancel_never_loses_an_acknowledged_cancel_or_orphans_the_run,
);

const TRIALS: usize = 8;

/// A gate, then an effect: the approved run writes one line.
const GATED_EFFECT: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "shipped\n"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "bytes", "target": "out", "targetHandle": "value"}
  ]
}"#;

/// Creates a gated run and waits (a bound on a hang, nothing asserted about the time)
/// until it is paused at its gate.
async fn paused_at_gate(api: &Api) -> String {
    let id = api.create(GATED_EFFECT).await;
    for _ in 0..3000 {
        if api.show(&id).await["state"] == "paused" {
            return id;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("run {id} never paused at its gate");
}

/// Waits until run `id` has ended, and returns it: a run left `running` with nobody
/// driving it never ends, which is what this would catch.
async fn ended(api: &Api, id: &str) -> Value {
    for _ in 0..3000 {
        let show = api.show(id).await;
        if matches!(
            show["state"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return show;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("run {id} never ended: {:#}", api.show(id).await);
}

fn count(records: &[Value], kind: &str) -> usize {
    records.iter().filter(|r| r["kind"] == kind).count()
}

fn of_concurrent_approvals_one_wins_the_others_get_409_and_nothing_of_theirs_is_written(
    b: Backend,
) {
    let d = StoreDir::on(b);
    let server = d.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        for trial in 0..TRIALS {
            let _ = std::fs::remove_file(d.path().join("data/log.txt"));
            let id = paused_at_gate(&api).await;
            let path = format!("/api/runs/{id}/gates/ship/approve");
            let (a, b, c) = tokio::join!(
                api.call("POST", &path, None),
                api.call("POST", &path, None),
                api.call("POST", &path, None),
            );
            let answers = [a, b, c];
            let won = answers.iter().filter(|(s, _)| *s == 202).count();
            assert_eq!(won, 1, "trial {trial}: {answers:#?}");
            for (status, body) in answers.iter().filter(|(s, _)| *s != 202) {
                assert_eq!(*status, 409, "trial {trial}: {answers:#?}");
                let e = body["error"].as_str().unwrap_or_default();
                // The run is this server's: never named as another process's.
                assert!(!e.contains("owner process"), "trial {trial}: {e}");
                assert!(
                    e.contains("this server drives it")
                        || e.contains("is not waiting at gate")
                        || e.contains("taken over")
                        // The winner's run already finished when its turn came.
                        || e.contains("is completed"),
                    "trial {trial}: a loser says what won: {e}"
                );
            }
            let show = ended(&api, &id).await;
            assert_eq!(show["state"], "completed", "trial {trial}: {show:#}");
            let records = api.records(&id).await;
            assert_eq!(count(&records, "opened"), 2, "trial {trial}: one take-over");
            assert_eq!(count(&records, "verdict"), 1, "trial {trial}");
            assert_eq!(
                d.lines(),
                ["shipped"],
                "trial {trial}: the effect landed once"
            );
        }
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
}

fn an_approval_racing_a_cancel_never_loses_an_acknowledged_cancel_or_orphans_the_run(b: Backend) {
    let d = StoreDir::on(b);
    let server = d.serve(None);
    let api = Api::of(&server);
    rt().block_on(async {
        for trial in 0..TRIALS {
            let id = paused_at_gate(&api).await;
            let approve = format!("/api/runs/{id}/gates/ship/approve");
            let cancel = format!("/api/runs/{id}/cancel");
            let ((a, ab), (c, cb)) = tokio::join!(
                api.call("POST", &approve, None),
                api.call("POST", &cancel, None),
            );
            let show = ended(&api, &id).await;
            let records = api.records(&id).await;
            let state = show["state"].as_str().unwrap();
            match (a, c) {
                // Both counted: the approved run was then cancelled, the cancel recorded.
                (202, 202) => {
                    assert_eq!(state, "cancelled", "trial {trial}: {show:#}");
                    assert_eq!(count(&records, "cancel_requested"), 1, "trial {trial}");
                }
                // The approval ran the run to its end first: the cancel came too late.
                (202, 409) => assert_eq!(state, "completed", "trial {trial}: {cb:#}"),
                // The cancel ended the run first: the approval found it cancelled.
                (409, 202) => {
                    assert_eq!(state, "cancelled", "trial {trial}: {ab:#}");
                    assert_eq!(count(&records, "opened"), 1, "trial {trial}: {ab:#}");
                }
                other => panic!("trial {trial}: {other:?}: {ab:#} {cb:#}"),
            }
        }
    });
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
}
