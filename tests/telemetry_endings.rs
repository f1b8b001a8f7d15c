//! Every way a run ends sends its `heddle.run` span, through the real binary and a
//! receiver on a loopback port: a run nobody drives cancelled (`heddle runs cancel` of a
//! paused or an interrupted run, the server's cancel), a gate rejected (the command
//! line's and the server's), a gate approved (its event once), a run a server adopted
//! or a watchdog's replacement worker recovered (still in its first trace); the
//! server's metrics count those endings, and its gauges see runs held, runs waiting,
//! readers of an event stream and lease renewals. Also `[telemetry]` set in heddle.toml
//! and a broken `TRACEPARENT`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

// Each test file uses part of the receiver.
#[allow(dead_code)]
#[path = "support/otlp.rs"]
mod otlp;
mod support;

use otlp::{Receiver, Span};
use support::serve::{Api, rt};
use support::store::{CHAIN, FANOUT, PAUSED, StoreDir, expect, run_id, text};
use support::{OK, samples, stderr, sum};

/// A value reviewed at gate `ship`, then upper-cased by a WASM node (which gets spans,
/// where the native built-ins get none).
const GATED: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "release notes"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
    {"id": "up", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "up", "targetHandle": "text"},
    {"source": "up", "sourceHandle": "text", "target": "out", "targetHandle": "value"}
  ]
}"#;

const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

fn caller() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

/// Another caller's: a later process's own `TRACEPARENT`, which must not move a run
/// to another trace.
const OTHER_CALLER: &str = "00-11111111111111111111111111111111-2222222222222222-01";

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn of_node<'a>(spans: &'a [Span], node: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.name == "heddle.node" && s.str("heddle.node.id") == node)
        .collect()
}

fn event_names(s: &Span) -> Vec<&str> {
    s.events.iter().map(|(n, _)| n.as_str()).collect()
}

fn count(s: &Span, event: &str) -> usize {
    s.events.iter().filter(|(n, _)| n == event).count()
}

/// The run span of run `id`, which must be there exactly once.
#[track_caller]
fn run_span<'a>(spans: &'a [Span], id: &str) -> &'a Span {
    let runs: Vec<&Span> = named(spans, "heddle.run")
        .into_iter()
        .filter(|s| s.str("heddle.run.id") == id)
        .collect();
    assert_eq!(runs.len(), 1, "run {id}'s span, once: {spans:#?}");
    runs[0]
}

/// Every node span of `run` (by its run id; for a run kept in memory, every one in its
/// trace) is in its trace, under it.
#[track_caller]
fn all_under(spans: &[Span], run: &Span) {
    let id = run.str("heddle.run.id");
    for s in spans.iter().filter(|s| s.name == "heddle.node") {
        let of_run = if id.is_empty() {
            s.trace_id == run.trace_id
        } else {
            s.str("heddle.run.id") == id
        };
        if of_run {
            assert_eq!(s.trace_id, run.trace_id, "in the run's trace: {s:#?}");
            assert_eq!(s.parent, run.span_id, "under the run span: {s:#?}");
        }
    }
}

/// `heddle ARGS` in `dir`, exporting to `rx`, as a caller `traceparent` (when given).
fn traced(
    dir: &StoreDir,
    rx: &Receiver,
    args: &[&str],
    traceparent: Option<&str>,
) -> std::process::Command {
    let mut c = dir.cmd(args);
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url);
    match traceparent {
        Some(t) => c.env("TRACEPARENT", t),
        None => c.env_remove("TRACEPARENT"),
    };
    c
}

/// A durable `GATED` run started under the caller's trace, paused at its gate: its id.
fn paused_at_gate(dir: &StoreDir, rx: &Receiver) -> String {
    let o = traced(
        dir,
        rx,
        &["run", "--durable", "g.json"],
        Some(caller().as_str()),
    )
    .output()
    .unwrap();
    expect(&o, PAUSED);
    run_id(&o)
}

/// Runs nobody drives, ended from the command line: a gate rejected and a paused run
/// cancelled (both waiting at their gate, their first process long gone), and an
/// interrupted run (its process aborted mid-write) cancelled. Each ending process
/// sends the run span, once, in the trace the run's log records (not under its own
/// `TRACEPARENT`), with the log's events (the pause, the rejection with its note, the
/// cancel), the nodes the ending skipped, and the attempt the dead process left as
/// died.
#[test]
fn runs_ended_from_the_command_line_without_a_driver_send_their_run_span() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(GATED);
    let rejected = paused_at_gate(&dir, &rx);
    let cancelled = paused_at_gate(&dir, &rx);
    let o = traced(
        &dir,
        &rx,
        &[
            "runs",
            "reject",
            &rejected,
            "ship",
            "--note",
            "not this week",
        ],
        Some(OTHER_CALLER),
    )
    .output()
    .unwrap();
    expect(&o, OK);
    let o = traced(
        &dir,
        &rx,
        &["runs", "cancel", &cancelled],
        Some(OTHER_CALLER),
    )
    .output()
    .unwrap();
    expect(&o, OK);
    // Sent before each process ended: nothing to wait for.
    let spans = rx.spans();
    for id in [&rejected, &cancelled] {
        let run = run_span(&spans, id);
        assert_eq!(run.trace_id, CALLER_TRACE, "the log's trace: {run:#?}");
        assert_eq!(run.parent, CALLER_SPAN, "under the first caller: {run:#?}");
        assert_eq!(run.str("heddle.run.outcome"), "cancelled");
        assert_eq!(run.status, 2, "{run:#?}");
        assert_eq!(run.str("heddle.graph.digest").len(), 64, "{run:#?}");
        assert_eq!(count(run, "heddle.run.paused"), 1, "{run:#?}");
        assert_eq!(count(run, "heddle.run.cancel_requested"), 1, "{run:#?}");
        all_under(&spans, run);
    }
    let run = run_span(&spans, &rejected);
    assert_eq!(count(run, "heddle.gate.rejected"), 1, "{run:#?}");
    let (_, gate) = run
        .events
        .iter()
        .find(|(n, _)| n == "heddle.gate.rejected")
        .unwrap();
    assert_eq!(gate["heddle.node.id"], "ship");
    assert_eq!(gate["heddle.gate.note"], "not this week");
    assert!(run.status_message.contains("rejected"), "{run:#?}");
    let run = run_span(&spans, &cancelled);
    assert_eq!(count(run, "heddle.gate.rejected"), 0, "{run:#?}");
    // What the gate held back never ran: skipped, said under each run.
    for id in [&rejected, &cancelled] {
        let run = run_span(&spans, id);
        for node in ["up", "out"] {
            let s: Vec<&Span> = of_node(&spans, node)
                .into_iter()
                .filter(|s| s.parent == run.span_id)
                .collect();
            assert_eq!(s.len(), 1, "{node} of {id}: {spans:#?}");
            assert_eq!(s[0].str("heddle.node.outcome"), "skipped");
            assert_eq!(s[0].str("heddle.node.skip_reason"), "cancelled");
        }
    }

    // Interrupted: aborted right after the start of its third write was recorded.
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(FANOUT).one_at_a_time();
    let o = traced(
        &dir,
        &rx,
        &["run", "--durable", "g.json"],
        Some(caller().as_str()),
    )
    .env("HEDDLE_FAULT", "after-start:w:3")
    .output()
    .unwrap();
    assert_eq!(o.status.code(), None, "aborted: {}", text(&o));
    let id = run_id(&o);
    let o = traced(&dir, &rx, &["runs", "cancel", &id], Some(OTHER_CALLER))
        .output()
        .unwrap();
    expect(&o, OK);
    assert_eq!(dir.show(&id)["state"], "cancelled");
    let in_flight = in_flight_writes(&dir, &id);
    assert_eq!(in_flight.len(), 1, "one write was in flight");
    let spans = rx.spans();
    let run = run_span(&spans, &id);
    assert_eq!(run.trace_id, CALLER_TRACE);
    assert_eq!(run.parent, CALLER_SPAN);
    assert_eq!(run.str("heddle.run.outcome"), "cancelled");
    assert_eq!(count(run, "heddle.run.cancel_requested"), 1, "{run:#?}");
    all_under(&spans, run);
    let died: BTreeSet<String> = of_node(&spans, "w")
        .iter()
        .filter(|s| s.str("heddle.node.outcome") == "died")
        .map(|s| s.str("heddle.node.key").to_string())
        .collect();
    assert_eq!(
        died, in_flight,
        "the write in flight, died, once: {spans:#?}"
    );
    assert_eq!(
        of_node(&spans, "w")
            .iter()
            .filter(|s| s.str("heddle.node.outcome") == "died")
            .count(),
        1
    );
}

/// The keys of the writes of `w` the log records started and never finished.
fn in_flight_writes(dir: &StoreDir, id: &str) -> BTreeSet<String> {
    use heddle_store::RunStore as _;
    let store = heddle_store::SqliteStore::open(&dir.db()).unwrap();
    let records = store.read(id, 0).unwrap().records;
    let keys = |kind: &str| -> BTreeSet<String> {
        records
            .iter()
            .filter(|s| s.record.kind() == kind)
            .filter_map(|s| s.record.occurrence())
            .filter(|o| o.node == "w")
            .map(|o| o.key.clone())
            .collect()
    };
    keys("started")
        .difference(&keys("completed"))
        .cloned()
        .collect()
}

/// `GET /metrics` with the token, parsed.
async fn metrics(api: &Api) -> BTreeMap<String, f64> {
    let (status, body) = api.call("GET", "/metrics", None).await;
    assert_eq!(status, 200, "{body}");
    samples(body.as_str().unwrap())
}

/// Waits (bounded, nothing asserted about the time) until run `id` is in `state`.
async fn until_state(api: &Api, id: &str, state: &str) {
    for _ in 0..3000 {
        if api.show(id).await["state"] == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("run {id} never got {state}: {:#}", api.show(id).await);
}

/// `heddle serve`: three runs pause at their gate (the server's driver stops each,
/// paused); a person approves one (it completes: the approval is an event of its run
/// span, once), rejects another and cancels the third (neither driven any more: the
/// server ends them from the store). Each run span is sent once, the two cancels with
/// their events, and the metrics count every ending.
#[test]
fn the_server_sends_and_counts_every_ending_of_runs_paused_at_a_gate() {
    let rx = Receiver::start();
    let dir = StoreDir::new();
    let server = dir.serve_with(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url.as_str())]);
    let api = Api::of(&server);
    let (ids, m) = rt().block_on(async {
        let mut ids = Vec::new();
        for _ in 0..3 {
            let id = api.create(GATED).await;
            until_state(&api, &id, "paused").await;
            ids.push(id);
        }
        let gate = |id: &str, verb: &str| format!("/api/runs/{id}/gates/ship/{verb}");
        let (status, body) = api
            .call(
                "POST",
                &gate(&ids[0], "approve"),
                Some(serde_json::json!({"note": "ship it"})),
            )
            .await;
        assert_eq!(status, 202, "{body:#}");
        let (status, body) = api
            .call(
                "POST",
                &gate(&ids[1], "reject"),
                Some(serde_json::json!({"note": "not this week"})),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        let (status, body) = api
            .call("POST", &format!("/api/runs/{}/cancel", ids[2]), None)
            .await;
        assert!(status < 300, "{status} {body:#}");
        let states: Vec<String> = {
            let mut v = Vec::new();
            for id in &ids {
                let (show, _) = api.drive_to_end(id).await;
                v.push(show["state"].as_str().unwrap().to_string());
            }
            v
        };
        assert_eq!(states, ["completed", "cancelled", "cancelled"]);
        (ids, metrics(&api).await)
    });
    let spans = rx.wait_for("three run spans", |s| named(s, "heddle.run").len() == 3);
    let (approved, rejected, cancelled) = (
        run_span(&spans, &ids[0]),
        run_span(&spans, &ids[1]),
        run_span(&spans, &ids[2]),
    );
    assert_eq!(approved.str("heddle.run.outcome"), "completed");
    assert_eq!(count(approved, "heddle.gate.approved"), 1, "{approved:#?}");
    assert_eq!(count(approved, "heddle.gate.rejected"), 0);
    let (_, a) = approved
        .events
        .iter()
        .find(|(n, _)| n == "heddle.gate.approved")
        .unwrap();
    assert_eq!(a["heddle.gate.note"], "ship it");
    for e in ["heddle.run.paused", "heddle.run.resumed"] {
        assert_eq!(count(approved, e), 1, "{e}: {approved:#?}");
    }
    assert_eq!(
        of_node(&spans, "up")
            .iter()
            .filter(|s| s.parent == approved.span_id && s.str("heddle.node.outcome") == "ok")
            .count(),
        1
    );
    assert_eq!(rejected.str("heddle.run.outcome"), "cancelled");
    assert_eq!(count(rejected, "heddle.gate.rejected"), 1, "{rejected:#?}");
    assert_eq!(count(rejected, "heddle.gate.approved"), 0);
    assert_eq!(cancelled.str("heddle.run.outcome"), "cancelled");
    assert_eq!(count(cancelled, "heddle.run.cancel_requested"), 1);
    assert_eq!(count(cancelled, "heddle.gate.rejected"), 0);
    for run in [approved, rejected, cancelled] {
        all_under(&spans, run);
        assert_eq!(count(run, "heddle.run.paused"), 1, "{run:#?}");
    }

    let text = format!("{m:#?}");
    assert_eq!(sum(&m, "heddle_runs_created_total", &[]), 3.0, "{text}");
    for (outcome, n) in [
        ("paused", 3.0),
        ("completed", 1.0),
        ("cancelled", 2.0),
        ("failed", 0.0),
    ] {
        let label = format!("outcome=\"{outcome}\"");
        assert_eq!(
            sum(&m, "heddle_runs_ended_total", &[&label]),
            n,
            "{outcome}: {text}"
        );
    }
    assert_eq!(
        sum(&m, "heddle_runs_taken_over_total", &["how=\"resume\""]),
        1.0,
        "the approval: {text}"
    );
    let (code, log) = server.stop();
    assert_eq!(code, OK, "{log}");
}

/// `heddle serve --workers 1`: while one run holds the only worker slot (its failure
/// waits for a person) and a second waits for it, with a client reading the first
/// one's event stream, the gauges say so (one running, one queued, a subscriber), and
/// the store lease's renewals are counted; once both ended, nothing runs or waits. Its
/// OTLP endpoint is down (a closed port): the spans it could not send are counted.
#[test]
fn the_gauges_see_a_held_run_a_waiting_run_a_reader_and_lease_renewals() {
    let dir = StoreDir::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!("http://127.0.0.1:{port}");
    let server = dir.serve_with(
        &[
            "--workers",
            "1",
            "--supervise",
            "interactive",
            "--lease-ttl-ms",
            "1000",
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", down.as_str())],
    );
    let api = Api::of(&server);
    let (held, after) = rt().block_on(async {
        let a = api.create(support::store::FAILING_PARSE).await;
        let eid = api.first_escalation(&a).await;
        let b = api.create(CHAIN).await;
        let stream = api
            .http
            .get(format!("{}/api/runs/{a}/events", api.url))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), 200);
        // Renewed every third of the lease's 1 s: waited for, bounded.
        let mut held = metrics(&api).await;
        for _ in 0..600 {
            if sum(&held, "heddle_lease_renewals_total", &["result=\"ok\""]) >= 1.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            held = metrics(&api).await;
        }
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{a}/escalations/{eid}"),
                Some(serde_json::json!({"verdict": "fail"})),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        drop(stream);
        assert_eq!(api.drive_to_end(&a).await.0["state"], "failed");
        assert_eq!(api.drive_to_end(&b).await.0["state"], "completed");
        // Sent in batches: the loss is counted once the batch was tried (bounded wait).
        let mut after = metrics(&api).await;
        for _ in 0..600 {
            if sum(&after, "heddle_otel_spans_dropped_total", &[]) > 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            after = metrics(&api).await;
        }
        (held, after)
    });
    let text = format!("{held:#?}");
    assert_eq!(sum(&held, "heddle_runs_running", &[]), 1.0, "{text}");
    assert_eq!(sum(&held, "heddle_runs_queued", &[]), 1.0, "{text}");
    assert!(sum(&held, "heddle_sse_subscribers", &[]) >= 1.0, "{text}");
    assert_eq!(sum(&held, "heddle_lease_held", &[]), 1.0, "{text}");
    assert!(
        sum(&held, "heddle_lease_renewals_total", &["result=\"ok\""]) >= 1.0,
        "{text}"
    );
    assert_eq!(
        sum(&held, "heddle_lease_renewals_total", &["result=\"failed\""]),
        0.0,
        "{text}"
    );
    let text = format!("{after:#?}");
    assert_eq!(sum(&after, "heddle_runs_running", &[]), 0.0, "{text}");
    assert_eq!(sum(&after, "heddle_runs_queued", &[]), 0.0, "{text}");
    assert!(
        sum(&after, "heddle_otel_spans_dropped_total", &[]) > 0.0,
        "{text}"
    );
    assert_eq!(
        sum(&after, "heddle_otel_spans_sent_total", &[]),
        0.0,
        "{text}"
    );
    let (code, log) = server.stop();
    assert_eq!(
        log.matches("are being dropped").count(),
        1,
        "the loss is said once: {log}"
    );
    assert_eq!(code, OK, "{log}");
}

/// A `run --durable` under a caller's trace aborted right after its write started;
/// `heddle serve` adopts it (the write's effect is unknown: it pauses), a person
/// resumes it through the API and it completes. Every span is in the caller's trace,
/// under the one run span the server sends; the write the dead process left is
/// reported died by the server, and run again as its second attempt; the metrics count
/// the recovery and the resume.
#[test]
fn a_run_the_server_adopts_stays_in_its_first_trace() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(CHAIN);
    let o = traced(
        &dir,
        &rx,
        &["run", "--durable", "g.json"],
        Some(caller().as_str()),
    )
    .env("HEDDLE_FAULT", "after-start:w:1")
    .output()
    .unwrap();
    assert_eq!(o.status.code(), None, "aborted: {}", text(&o));
    let id = run_id(&o);
    let server = dir.serve_with(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url.as_str())]);
    assert!(server.log().contains("1 runs adopted"), "{}", server.log());
    let pid = Value::from(i64::from(server.pid()));
    let api = Api::of(&server);
    let (reoffers, m) = rt().block_on(async {
        let (show, reoffers) = api.drive_to_end(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        (reoffers, metrics(&api).await)
    });
    assert_eq!(reoffers, 1, "the uncertain write, re-offered once");
    let text = format!("{m:#?}");
    for how in ["recover", "resume"] {
        let label = format!("how=\"{how}\"");
        assert_eq!(
            sum(&m, "heddle_runs_taken_over_total", &[&label]),
            1.0,
            "{how}: {text}"
        );
    }
    let (code, log) = server.stop();
    assert_eq!(code, OK, "{log}");

    let spans = rx.spans();
    for s in &spans {
        assert_eq!(s.trace_id, CALLER_TRACE, "one trace: {s:#?}");
    }
    let run = run_span(&spans, &id);
    assert_eq!(run.parent, CALLER_SPAN, "under the caller's span");
    assert_eq!(run.str("heddle.run.outcome"), "completed");
    assert_eq!(run.resource["process.pid"], pid, "sent by the server");
    for e in [
        "heddle.run.recovered",
        "heddle.run.paused",
        "heddle.run.resumed",
    ] {
        assert_eq!(count(run, e), 1, "{e}: {:?}", event_names(run));
    }
    all_under(&spans, run);
    let w: Vec<(i64, &str)> = of_node(&spans, "w")
        .into_iter()
        .map(|s| {
            assert_eq!(s.resource["process.pid"], pid, "{s:#?}");
            (
                s.int("heddle.node.attempt").unwrap(),
                s.str("heddle.node.outcome"),
            )
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(w, [(1, "died"), (2, "ok")], "{spans:#?}");
}

/// `watchdog: worker N running run ID (pid P)` → P.
fn worker_pid_in(line: &str) -> Option<i64> {
    let rest = line.strip_prefix("watchdog: worker ")?;
    let pid = rest.split("(pid ").nth(1)?.trim_end_matches(')');
    pid.parse().ok()
}

/// `heddle run --watchdog` whose first worker aborts right after its write started (the
/// fault passed to every worker with `--env`: a replacement that recovers the run
/// pauses on that write before starting anything): the replacement reports the write
/// died, in the trace the first worker recorded, under the same run span the process
/// that finally ends the run sends.
#[test]
fn a_watchdogs_replacement_worker_stays_in_the_runs_trace() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(CHAIN);
    let o = traced(
        &dir,
        &rx,
        &[
            "run",
            "--watchdog",
            "--backoff-initial-ms",
            "1",
            "--env",
            "HEDDLE_FAULT",
            "g.json",
        ],
        None,
    )
    .env("HEDDLE_FAULT", "after-start:w:1")
    .output()
    .unwrap();
    expect(&o, PAUSED);
    let e = stderr(&o);
    let id = e
        .lines()
        .find_map(|l| l.split("running run ").nth(1)?.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id: {e}"))
        .to_string();
    let workers: Vec<i64> = e.lines().filter_map(worker_pid_in).collect();
    assert_eq!(workers.len(), 2, "a replacement was launched: {e}");
    let show = dir.show(&id);
    assert_eq!(show["pause"]["why"], "reconcile", "{show:#}");
    let pause = show["pause"]["event"].as_u64().unwrap();
    let o = traced(
        &dir,
        &rx,
        &["runs", "resume", &id, "--pause", &pause.to_string()],
        None,
    )
    .output()
    .unwrap();
    expect(&o, OK);

    let spans = rx.spans();
    let run = run_span(&spans, &id);
    assert_eq!(run.str("heddle.run.outcome"), "completed");
    for s in &spans {
        assert_eq!(s.trace_id, run.trace_id, "one trace: {s:#?}");
    }
    all_under(&spans, run);
    for e in [
        "heddle.run.recovered",
        "heddle.run.paused",
        "heddle.run.resumed",
    ] {
        assert_eq!(count(run, e), 1, "{e}: {:?}", event_names(run));
    }
    let died: Vec<&Span> = of_node(&spans, "w")
        .into_iter()
        .filter(|s| s.str("heddle.node.outcome") == "died")
        .collect();
    assert_eq!(died.len(), 1, "{spans:#?}");
    assert_eq!(
        died[0].resource["process.pid"],
        Value::from(workers[1]),
        "reported by the replacement worker: {died:#?}"
    );
    assert_eq!(died[0].int("heddle.node.attempt"), Some(1));
}

/// `[telemetry] otlp_endpoint` and `log_format = "json"` in heddle.toml, no variable
/// set: a watched run's spans reach the endpoint and every log line of the watchdog
/// and its worker is a JSON object.
#[test]
fn the_telemetry_section_of_heddle_toml_alone_exports_and_logs_json() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(CHAIN).with_config(&format!(
        "\n[telemetry]\notlp_endpoint = \"{}\"\nlog_format = \"json\"\nservice_name = \"from-the-file\"\n",
        rx.url
    ));
    let mut c = dir.cmd(&["run", "--watchdog", "g.json"]);
    for v in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "TRACEPARENT",
    ] {
        c.env_remove(v);
    }
    let o = c.output().unwrap();
    expect(&o, OK);
    let log = stderr(&o);
    let mut id = None;
    for l in log.lines() {
        let v: Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\n{log}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(v[key].is_string(), "no {key}: {l}");
        }
        if let Some(r) = v["run_id"].as_str() {
            id = Some(r.to_string());
        }
    }
    let id = id.unwrap_or_else(|| panic!("no line names the run: {log}"));
    let spans = rx.spans();
    let run = run_span(&spans, &id);
    assert_eq!(run.str("heddle.run.outcome"), "completed");
    assert_eq!(run.resource["service.name"], "from-the-file");
    all_under(&spans, run);
    assert_eq!(of_node(&spans, "w").len(), 1, "{spans:#?}");
}

/// `heddle run` (in memory) with a `TRACEPARENT` that is not one: ignored, never a
/// refusal; the run starts a trace of its own, and its span names the graph file's
/// digest as a durable run's does.
#[test]
fn a_broken_traceparent_is_ignored_and_an_in_memory_run_names_its_graphs_digest() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(CHAIN);
    let o = traced(&dir, &rx, &["run", "g.json"], Some("00-zz-not-a-trace-01"))
        .output()
        .unwrap();
    expect(&o, OK);
    let spans = rx.spans();
    let runs = named(&spans, "heddle.run");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run = runs[0];
    assert_eq!(run.parent, "", "a trace of its own");
    assert_eq!(run.str("heddle.run.outcome"), "completed");
    assert_eq!(run.attrs["heddle.run.durable"], false);
    let bytes = std::fs::read(dir.path().join("g.json")).unwrap();
    assert_eq!(
        run.str("heddle.graph.digest"),
        heddle_store::sha256_hex(&bytes)
    );
    all_under(&spans, run);
    assert_eq!(of_node(&spans, "up").len(), 1, "{spans:#?}");
}

/// `heddle bench` with an exporter traces every run it times (what the cost figures in
/// the README measure): a run span per run, and under it one span per WASM invocation
/// (the shape's `std.math.arith` nodes; the native input and output get none); with
/// `--metrics` the runs are counted too, and the figures still count every invocation.
#[test]
fn a_traced_bench_sends_a_span_per_wasm_invocation() {
    let rx = Receiver::start();
    let dir = StoreDir::new();
    let args = [
        "bench",
        "--shape",
        "wasm-chain",
        "--size",
        "3",
        "--messages",
        "2",
        "--runs",
        "1",
        "--metrics",
        "--json",
    ];
    let o = traced(&dir, &rx, &args, None).output().unwrap();
    expect(&o, OK);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    assert_eq!(v[0]["invocations"], 6, "{v}");
    let spans = rx.spans();
    let runs = named(&spans, "heddle.run");
    assert!(!runs.is_empty(), "{spans:#?}");
    for run in &runs {
        assert_eq!(run.str("heddle.run.outcome"), "completed");
        let nodes: Vec<&Span> = spans.iter().filter(|s| s.parent == run.span_id).collect();
        assert_eq!(nodes.len(), 6, "3 nodes × 2 values: {nodes:#?}");
        for s in nodes {
            assert_eq!(s.str("heddle.node.type"), "std.math.arith", "{s:#?}");
            assert_eq!(s.str("heddle.node.outcome"), "ok", "{s:#?}");
        }
    }
    assert_eq!(
        named(&spans, "heddle.node").len(),
        6 * runs.len(),
        "{spans:#?}"
    );
}
