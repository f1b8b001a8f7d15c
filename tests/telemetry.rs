//! What an operator's monitoring receives, through the real binary: the spans of runs
//! sent over OTLP/HTTP to a receiver on a loopback port (decoded with
//! `opentelemetry-proto`, as a collector decodes them), W3C trace context taken from
//! `TRACEPARENT` and the API's `traceparent` header and handed to code nodes, a crashed
//! and recovered run kept in one trace, and what bad settings and a bad endpoint do.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

#[path = "support/otlp.rs"]
mod otlp;
mod support;

use otlp::{Receiver, Span};
use support::serve::{Api, rt};
use support::store::{
    FANOUT, PAUSED, StoreDir, expect, pause_event, report, run_id, run_id_in, text,
};
use support::{INVALID, OK, samples, sum};

const SECRET: &str = "hunter2-tok3n";

/// Three items, `1`, `x` and `3`, each parsed as JSON by `parse` (a WASM node) and
/// handed to `flaky` (a Bash code node run as a subprocess), under a policy that
/// retries `parse` and skips the rest: `x` fails `parse` three times (two retries, then
/// the bounds fail it: the run fails, and what `parse` fed is skipped), and `flaky`
/// once (it says the secret on stderr), skipped. Every `flaky` attempt that succeeds
/// prints the `TRACEPARENT` it was handed.
const FAN: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "items", "type": "heddle.constant", "properties": {"value": ["1", "x", "3"]}},
    {"id": "secret", "type": "heddle.input", "properties": {"name": "secret", "type": "str"}},
    {"id": "each", "type": "heddle.foreach"},
    {"id": "parse", "type": "std.json.parse"},
    {"id": "flaky", "type": "code.bash", "properties": {"mode": "subprocess",
      "code": "if [ \"$item\" = x ]; then echo \"no luck with $secret\" >&2; exit 3; fi; echo \"$TRACEPARENT\""}},
    {"id": "numbers", "type": "heddle.collect"},
    {"id": "parents", "type": "heddle.collect"},
    {"id": "parsed", "type": "heddle.output"},
    {"id": "tp", "type": "heddle.output"}],
  "edges": [
    {"source": "items", "sourceHandle": "value", "target": "each", "targetHandle": "list"},
    {"source": "each", "sourceHandle": "item", "target": "parse", "targetHandle": "text"},
    {"source": "each", "sourceHandle": "item", "target": "flaky", "targetHandle": "item"},
    {"source": "secret", "sourceHandle": "value", "target": "flaky", "targetHandle": "secret"},
    {"source": "parse", "sourceHandle": "value", "target": "numbers", "targetHandle": "item"},
    {"source": "flaky", "sourceHandle": "result", "target": "parents", "targetHandle": "item"},
    {"source": "numbers", "sourceHandle": "list", "target": "parsed", "targetHandle": "value"},
    {"source": "parents", "sourceHandle": "list", "target": "tp", "targetHandle": "value"}]}"#;

const POLICY: &str = r#"
[[rule]]
node = "parse"
verdict = "retry"

[[rule]]
verdict = "skip"
"#;

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

/// `heddle run` of a fan-out: one run span, one span per attempt under it (every
/// failed one and its retries), the escalations and verdicts on the attempts they are
/// about, the attributes a person filters on, the secret masked everywhere, and each
/// code attempt handed its own span as `TRACEPARENT`.
#[test]
fn a_fan_out_sends_one_span_per_attempt_under_its_run_span_with_secrets_masked() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(FAN);
    std::fs::write(dir.path().join("policy.toml"), POLICY).unwrap();
    let o = dir
        .cmd(&[
            "run",
            "g.json",
            "--json",
            "--policy",
            "policy.toml",
            "--input",
        ])
        .arg(format!("secret={SECRET}"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .env("OTEL_SERVICE_NAME", "fan-test")
        .env("HEDDLE_SECRET_TOKEN", SECRET)
        .output()
        .unwrap();
    expect(&o, support::FAILED);
    let outputs = report(&o)["outputs"].clone();
    // Sent before the process ended: nothing to wait for.
    let spans = rx.spans();

    let runs = named(&spans, "heddle.run");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run = runs[0];
    assert_eq!(run.parent, "", "a run started without a caller is a root");
    assert_eq!(run.str("heddle.run.outcome"), "failed");
    assert_eq!(run.status, 2);
    assert!(run.status_message.contains("retry limit"), "{run:#?}");
    assert_eq!(run.str("heddle.graph.name"), "g.json");
    assert_eq!(run.resource["service.name"], "fan-test");
    for s in &spans {
        assert_eq!(s.trace_id, run.trace_id, "one trace: {s:#?}");
        if s.name == "heddle.node" {
            assert_eq!(s.parent, run.span_id, "under the run span: {s:#?}");
            assert!(s.start_ns <= s.end_ns);
            assert!(
                run.start_ns <= s.start_ns && s.end_ns <= run.end_ns,
                "{s:#?}"
            );
        }
        assert!(!s.text().contains(SECRET), "the secret leaked: {s:#?}");
    }
    // Native built-ins get no span; every attempt of the others does, once.
    let nodes: BTreeSet<&str> = named(&spans, "heddle.node")
        .iter()
        .map(|s| s.str("heddle.node.id"))
        .collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["flaky", "numbers", "parse", "parsed"])
    );
    // Those that never ran are there once each, with why.
    for n in ["numbers", "parsed"] {
        let s = of_node(&spans, n);
        assert_eq!(s.len(), 1, "{s:#?}");
        assert_eq!(s[0].str("heddle.node.outcome"), "skipped");
        assert_eq!(s[0].str("heddle.node.skip_reason"), "upstream_failed");
    }
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique");

    let by_key = |node: &str| {
        let mut m: BTreeMap<String, Vec<Span>> = BTreeMap::new();
        for s in of_node(&spans, node) {
            m.entry(s.str("heddle.node.key").to_string())
                .or_default()
                .push(s.clone());
        }
        for v in m.values_mut() {
            v.sort_by_key(|s| s.int("heddle.node.attempt"));
        }
        m
    };
    let parse = by_key("parse");
    let x = &parse["each:item=1"];
    assert_eq!(x.len(), 3, "x tried three times: {parse:#?}");
    for (k, v) in &parse {
        if k != "each:item=1" {
            assert_eq!(v.len(), 1, "{v:#?}");
            assert_eq!(v[0].str("heddle.node.outcome"), "ok");
        }
    }
    for s in parse.values().flatten() {
        assert_eq!(s.str("heddle.node.type"), "std.json.parse");
        assert!(s.int("heddle.node.fuel").unwrap() > 0, "{s:#?}");
        assert!(s.int("heddle.node.memory_bytes").unwrap() > 0, "{s:#?}");
    }
    for (i, s) in x.iter().enumerate() {
        assert_eq!(s.int("heddle.node.attempt"), Some(i as i64 + 1));
        assert_eq!(s.str("heddle.node.outcome"), "error");
        assert_eq!(s.str("heddle.node.signature"), "json:parse");
        assert_eq!(s.status, 2, "an error status: {s:#?}");
        assert_eq!(
            event_names(s),
            ["heddle.escalation", "heddle.verdict"],
            "{s:#?}"
        );
        let verdict = &s.events[1].1;
        if i < 2 {
            assert_eq!(verdict["heddle.verdict"], "retry", "{s:#?}");
            assert_eq!(verdict["heddle.decided_by"], "policy", "{s:#?}");
        } else {
            assert_eq!(verdict["heddle.verdict"], "fail", "{s:#?}");
        }
    }

    let flaky = by_key("flaky");
    assert_eq!(flaky.len(), 3);
    let failed = flaky.values().flatten().find(|s| s.status == 2).unwrap();
    assert_eq!(failed.str("heddle.node.outcome"), "error");
    assert!(
        failed.str("heddle.node.signature").starts_with("code:"),
        "{failed:#?}"
    );
    assert!(
        failed.str("heddle.node.error").contains("«redacted»"),
        "the secret is masked where it was said: {failed:#?}"
    );
    assert!(failed.status_message.contains("«redacted»"), "{failed:#?}");
    assert_eq!(event_names(failed), ["heddle.escalation", "heddle.verdict"]);

    // Each successful attempt printed the traceparent of its own span.
    let printed: BTreeSet<String> = outputs["tp"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let ok: BTreeSet<String> = flaky
        .values()
        .flatten()
        .filter(|s| s.str("heddle.node.outcome") == "ok")
        .map(|s| format!("00-{}-{}-01", s.trace_id, s.span_id))
        .collect();
    assert_eq!(printed.len(), 2, "{}", text(&o));
    assert_eq!(printed, ok, "{}", text(&o));
}

/// The README's example ("Watching Heddle in production"): `examples/documents.json`
/// run with the receiver, the spans it got printed as a tree with
/// `cargo test --test telemetry spans_of_an_example -- --nocapture`.
#[test]
fn the_spans_of_an_example_print_as_a_tree() {
    let rx = Receiver::start();
    let o = support::command(&support::root())
        .args(["run", "examples/documents.json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .output()
        .unwrap();
    expect(&o, OK);
    let spans = rx.spans();
    let tree = otlp::tree(&spans);
    println!("{tree}");
    // One run; four documents through three WASM nodes, then the sum: 13 attempts.
    assert_eq!(named(&spans, "heddle.run").len(), 1, "{tree}");
    assert_eq!(named(&spans, "heddle.node").len(), 13, "{tree}");
    assert_eq!(
        tree.lines()
            .filter(|l| l.starts_with("    heddle.node"))
            .count(),
        13
    );
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` compresses every request (a collector reads
/// them whole); a compression Heddle does not speak is refused before anything runs,
/// naming the variable.
#[test]
fn spans_go_gzip_compressed_when_asked_and_an_unknown_compression_is_refused() {
    let rx = Receiver::start();
    let o = support::command(&support::root())
        .args(["run", "examples/documents.json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .env("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        .output()
        .unwrap();
    expect(&o, OK);
    let spans = rx.spans();
    assert_eq!(named(&spans, "heddle.node").len(), 13, "{spans:#?}");
    assert!(rx.requests() > 0);
    assert_eq!(rx.gzipped(), rx.requests(), "every request compressed");

    let dir = StoreDir::with_graph(support::store::CHAIN);
    let o = dir
        .cmd(&["run", "g.json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "brotli")
        .output()
        .unwrap();
    expect(&o, INVALID);
    let e = support::stderr(&o);
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION") && e.contains("gzip or none"),
        "{e}"
    );
    assert!(dir.lines().is_empty(), "nothing ran");
}

/// `OTEL_TRACES_SAMPLER` (and its `_ARG`) decides per run whether its spans are sent,
/// all of them or none: `always_off`, a ratio of 0 and a caller's unsampled
/// `traceparent` under the default (`parentbased_always_on`) send nothing at all;
/// `always_on` traces even under an unsampled caller, a `parentbased_*` one follows a
/// caller's sampled flag whatever its root says, a ratio of 1 sends every span. An
/// unknown sampler, or a ratio that is not one, is refused before anything runs,
/// naming its variable.
#[test]
fn the_sampler_sends_a_runs_spans_all_or_none_and_an_unknown_one_is_refused() {
    const SAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const UNSAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    /// The sampler, its argument, the caller's traceparent, whether the run is traced.
    type Case = (
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        bool,
    );
    let cases: &[Case] = &[
        (Some("always_off"), None, None, false),
        (Some("always_off"), None, Some(SAMPLED), false),
        (None, None, Some(UNSAMPLED), false),
        (Some("always_on"), None, Some(UNSAMPLED), true),
        (Some("parentbased_always_off"), None, None, false),
        (Some("parentbased_always_off"), None, Some(SAMPLED), true),
        (Some("traceidratio"), Some("0"), None, false),
        (Some("traceidratio"), Some("1"), None, true),
        (
            Some("parentbased_traceidratio"),
            Some("0"),
            Some(SAMPLED),
            true,
        ),
        (
            Some("parentbased_traceidratio"),
            Some("1"),
            Some(UNSAMPLED),
            false,
        ),
    ];
    for &(sampler, arg, parent, traced) in cases {
        let rx = Receiver::start();
        let mut c = support::command(&support::root());
        c.args(["run", "examples/documents.json"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url);
        for (var, value) in [
            ("OTEL_TRACES_SAMPLER", sampler),
            ("OTEL_TRACES_SAMPLER_ARG", arg),
            ("TRACEPARENT", parent),
        ] {
            if let Some(v) = value {
                c.env(var, v);
            }
        }
        let o = c.output().unwrap();
        expect(&o, OK);
        // The process waited for its spans before it ended: what came is all.
        let spans = rx.spans();
        let case = format!("{sampler:?} {arg:?} {parent:?}");
        if traced {
            assert_eq!(named(&spans, "heddle.run").len(), 1, "{case}");
            assert_eq!(named(&spans, "heddle.node").len(), 13, "{case}");
            if parent.is_some() {
                assert!(
                    spans
                        .iter()
                        .all(|s| s.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"),
                    "{case}: in the caller's trace"
                );
            }
        } else {
            assert_eq!(rx.requests(), 0, "{case}: nothing sent, {spans:#?}");
        }
    }

    let rx = Receiver::start();
    let dir = StoreDir::with_graph(support::store::CHAIN);
    for (vars, named) in [
        (
            &[("OTEL_TRACES_SAMPLER", "sometimes")][..],
            "OTEL_TRACES_SAMPLER",
        ),
        (
            &[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "half"),
            ][..],
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ] {
        let o = dir
            .cmd(&["run", "g.json"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        expect(&o, INVALID);
        let e = support::stderr(&o);
        assert!(e.contains(named), "{e}");
    }
    assert!(dir.lines().is_empty(), "nothing ran");
    assert_eq!(rx.requests(), 0);
}

/// A durable run under a caller's `TRACEPARENT`, aborted right after the start of its
/// third write was recorded, and recovered (the recovery pauses on that write, whose
/// effect is unknown; the user's resume re-offers it): every span is in the caller's trace, the run
/// span is sent once (by the process that ended the run) under the caller's span, the
/// writes recorded before the crash get no span from the processes that recovered the
/// run, and the one in flight is reported died, once. What was recorded is read from
/// the log, so the test holds whichever way the crash fell.
#[test]
fn a_crashed_and_recovered_run_stays_one_trace_and_repeats_no_recorded_work() {
    use heddle_store::RunStore as _;

    let rx = Receiver::start();
    let dir = StoreDir::with_graph(FANOUT).one_at_a_time();
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let parent = format!("00-{caller_trace}-{caller_span}-01");
    let env = |c: &mut std::process::Command| {
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
            .env("TRACEPARENT", &parent);
    };
    let mut first = dir.cmd(&["run", "--durable", "g.json"]);
    env(&mut first);
    let o = first
        .env("HEDDLE_FAULT", "after-start:w:3")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), None, "aborted: {}", text(&o));
    let id = run_id(&o);

    // Recovered until done: a later process's own TRACEPARENT does not move the run to
    // another trace.
    let mut pause: Option<String> = None;
    for _ in 0..10 {
        let mut c = dir.cmd(&["runs", "resume", &id]);
        if let Some(p) = &pause {
            c.args(["--pause", p]);
        }
        env(&mut c);
        c.env(
            "TRACEPARENT",
            "00-11111111111111111111111111111111-2222222222222222-01",
        );
        let o = c.output().unwrap();
        match o.status.code() {
            Some(OK) => break,
            Some(PAUSED) => pause = Some(pause_event(&o).to_string()),
            _ => panic!("{}", text(&o)),
        }
    }
    assert!(pause.is_some(), "the write in flight paused the recovery");
    dir.assert_fanout_effects(1, "recovered");

    // What the first process recorded of `w`, from the log.
    let store = heddle_store::SqliteStore::open(&dir.db()).unwrap();
    let records = store.read(&id, 0).unwrap().records;
    let second_open = records
        .iter()
        .skip(1)
        .position(|s| s.record.kind() == "opened")
        .unwrap()
        + 1;
    let (before, after) = records.split_at(second_open);
    let keys = |rs: &[heddle_store::Stored], kind: &str| -> BTreeSet<String> {
        rs.iter()
            .filter(|s| s.record.kind() == kind)
            .filter_map(|s| s.record.occurrence())
            .filter(|o| o.node == "w")
            .map(|o| o.key.clone())
            .collect()
    };
    let recorded = keys(before, "completed");
    let in_flight: BTreeSet<String> = keys(before, "started")
        .difference(&recorded)
        .cloned()
        .collect();
    let ran_later = keys(after, "completed");
    assert_eq!(in_flight.len(), 1, "one write was in flight: {records:#?}");
    let first_pid = match &records[0].record {
        heddle_core::Record::Opened { pid, .. } => Value::from(i64::from(*pid)),
        other => panic!("{other:?}"),
    };

    let spans = rx.spans();
    for s in &spans {
        assert_eq!(s.trace_id, caller_trace, "one trace: {s:#?}");
    }
    let runs = named(&spans, "heddle.run");
    assert_eq!(runs.len(), 1, "the run span is sent once: {spans:#?}");
    let run = runs[0];
    assert_eq!(run.parent, caller_span, "under the caller's span");
    assert_eq!(run.str("heddle.run.id"), id);
    assert_eq!(run.str("heddle.run.outcome"), "completed");
    assert_eq!(run.str("heddle.graph.digest").len(), 64);
    let events = event_names(run);
    for e in [
        "heddle.run.recovered",
        "heddle.run.paused",
        "heddle.run.resumed",
    ] {
        assert!(events.contains(&e), "{e} in {events:?}");
    }

    let w = of_node(&spans, "w");
    let mut seen = BTreeSet::new();
    for s in &w {
        assert_eq!(s.parent, run.span_id, "{s:#?}");
        let at = (
            s.str("heddle.node.key"),
            s.int("heddle.node.attempt"),
            s.str("heddle.node.outcome"),
        );
        assert!(seen.insert(at), "reported twice: {s:#?}");
    }
    let later: Vec<&&Span> = w
        .iter()
        .filter(|s| s.resource["process.pid"] != first_pid)
        .collect();
    let with = |outcome: &str| -> BTreeSet<String> {
        later
            .iter()
            .filter(|s| s.str("heddle.node.outcome") == outcome)
            .map(|s| s.str("heddle.node.key").to_string())
            .collect()
    };
    // The write in flight is reported died, once; what ran after the crash is
    // reported as it ran; the results recorded before it, fed on, are not reported.
    assert_eq!(with("died"), in_flight, "{w:#?}");
    assert_eq!(with("ok"), ran_later, "{w:#?}");
    assert!(with("ok").is_disjoint(&recorded), "{w:#?}");
    let died = later
        .iter()
        .find(|s| s.str("heddle.node.outcome") == "died")
        .unwrap();
    assert_eq!(died.status, 2);
    assert!(died.str("heddle.node.error").contains("died"), "{died:#?}");
    let reoffered = later
        .iter()
        .find(|s| {
            s.str("heddle.node.outcome") == "ok" && in_flight.contains(s.str("heddle.node.key"))
        })
        .unwrap();
    assert_eq!(
        reoffered.int("heddle.node.attempt"),
        Some(2),
        "the re-offered write is its second attempt"
    );
}

/// A person's answers to reconcile pauses are events of the run span, each once, also
/// one recorded by a process that died before the run ended: the process that ends it
/// reads that one back from the log.
#[test]
fn every_answer_to_a_reconcile_pause_is_a_run_span_event_whoever_ends_the_run() {
    let rx = Receiver::start();
    let dir = StoreDir::with_graph(FANOUT).one_at_a_time();
    let traced = |args: &[&str], fault: Option<&str>| {
        let mut c = dir.cmd(args);
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url);
        if let Some(f) = fault {
            c.env("HEDDLE_FAULT", f);
        }
        c.output().unwrap()
    };
    let aborted = |o: &std::process::Output| assert_eq!(o.status.code(), None, "{}", text(o));
    let paused = |o: &std::process::Output| {
        expect(o, PAUSED);
        pause_event(o).to_string()
    };
    // Killed on its second write, which the recovery pauses on.
    let o = traced(&["run", "--durable", "g.json"], Some("after-start:w:2"));
    aborted(&o);
    let id = run_id(&o);
    let p = paused(&traced(&["runs", "resume", &id], None));
    // Skipped by a process killed on its own second write: its answer is in the log.
    let skip = [
        "runs", "resume", &id, "--pause", &p, "--skip", "--note", "not sent",
    ];
    aborted(&traced(&skip, Some("after-start:w:2")));
    let p = paused(&traced(&["runs", "resume", &id], None));
    std::fs::write(
        dir.path().join("outputs.json"),
        r#"{"path": "/data/log.txt", "bytes": 2}"#,
    )
    .unwrap();
    let done = [
        "runs",
        "resume",
        &id,
        "--pause",
        &p,
        "--completed-with",
        "outputs.json",
        "--note",
        "it is in the file",
    ];
    expect(&traced(&done, None), OK);

    let spans = rx.spans();
    let runs = named(&spans, "heddle.run");
    assert_eq!(runs.len(), 1, "the run span is sent once: {spans:#?}");
    let answers: Vec<(&str, &str)> = runs[0]
        .events
        .iter()
        .filter(|(name, _)| name == "heddle.run.reconciled")
        .map(|(_, a)| {
            let get = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or_default();
            assert_eq!(get("heddle.node.id"), "w", "{a:?}");
            (get("heddle.node.key"), get("heddle.reconcile.answer"))
        })
        .collect();
    assert_eq!(
        answers.iter().map(|(_, a)| *a).collect::<Vec<_>>(),
        ["skipped", "completed"],
        "{:#?}",
        runs[0].events
    );
    assert_ne!(
        answers[0].0, answers[1].0,
        "two items answered: {answers:?}"
    );
}

/// `POST /api/runs` with a `traceparent` header: the run's span is the caller's
/// span's child, in its trace; one that is not valid is ignored, never refused.
#[test]
fn the_api_takes_a_callers_traceparent_and_ignores_a_bad_one() {
    let rx = Receiver::start();
    let dir = StoreDir::new();
    let server = dir.serve_with(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url.as_str())]);
    let api = Api::of(&server);
    let graph: Value = serde_json::from_str(support::store::CHAIN).unwrap();
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (linked, unlinked) = rt().block_on(async {
        let mut ids = Vec::new();
        for tp in [caller, "00-zz-not-a-trace-01"] {
            let r = api
                .http
                .post(format!("{}/api/runs", server.url))
                .bearer_auth(&api.token)
                .header("traceparent", tp)
                .json(&serde_json::json!({"graph": graph}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201, "{tp}");
            let body: Value = r.json().await.unwrap();
            ids.push(body["run_id"].as_str().unwrap().to_string());
        }
        (ids[0].clone(), ids[1].clone())
    });
    let spans = rx.wait_for("both run spans", |s| named(s, "heddle.run").len() == 2);
    let run = |id: &str| {
        *named(&spans, "heddle.run")
            .iter()
            .find(|s| s.str("heddle.run.id") == id)
            .unwrap()
    };
    let a = run(&linked);
    assert_eq!(a.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(a.parent, "00f067aa0ba902b7");
    let b = run(&unlinked);
    assert_eq!(b.parent, "", "a bad traceparent starts a trace of its own");
    assert_ne!(b.trace_id, a.trace_id);
    // The chain's nodes are in their run's trace, under its span.
    for s in named(&spans, "heddle.node") {
        let r = if s.trace_id == a.trace_id { a } else { b };
        assert_eq!(s.parent, r.span_id, "{s:#?}");
    }
    let (code, log) = server.stop();
    assert_eq!(code, OK, "{log}");
}

/// A run the API queues on a shared database (`--workers 1`, the slot held by a run
/// whose failure waits for a person) keeps its caller's `traceparent`: the host that
/// takes it from the queue, later, continues the caller's trace instead of starting one
/// (the trace is recorded with the queued run, before any process opened it).
#[test]
fn a_queued_run_keeps_its_callers_trace_until_a_host_takes_it() {
    let rx = Receiver::start();
    let dir = StoreDir::on(support::store::Backend::Postgres);
    let server = dir.serve_with(
        &["--workers", "1", "--supervise", "interactive"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url.as_str())],
    );
    let api = Api::of(&server);
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let queued = rt().block_on(async {
        let held = api.create(support::store::FAILING_PARSE).await;
        let eid = api.first_escalation(&held).await;
        let graph: Value = serde_json::from_str(support::store::CHAIN).unwrap();
        let r = api
            .http
            .post(format!("{}/api/runs", server.url))
            .bearer_auth(&api.token)
            .header("traceparent", caller)
            .json(&serde_json::json!({"graph": graph}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["state"], "queued", "{body:#}");
        let queued = body["run_id"].as_str().unwrap().to_string();
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{held}/escalations/{eid}"),
                Some(serde_json::json!({"verdict": "fail"})),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        assert_eq!(api.drive_to_end(&held).await.0["state"], "failed");
        assert_eq!(api.drive_to_end(&queued).await.0["state"], "completed");
        queued
    });
    let spans = rx.wait_for("the queued run's span", |s| {
        named(s, "heddle.run")
            .iter()
            .any(|r| r.str("heddle.run.id") == queued)
    });
    let run = *named(&spans, "heddle.run")
        .iter()
        .find(|s| s.str("heddle.run.id") == queued)
        .unwrap();
    assert_eq!(run.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", "{run:#?}");
    assert_eq!(run.parent, "00f067aa0ba902b7", "{run:#?}");
    let nodes: Vec<_> = named(&spans, "heddle.node")
        .into_iter()
        .filter(|s| s.trace_id == run.trace_id)
        .collect();
    assert!(!nodes.is_empty(), "{spans:#?}");
    for s in nodes {
        assert_eq!(s.parent, run.span_id, "{s:#?}");
    }
    let (code, log) = server.stop();
    assert_eq!(code, OK, "{log}");
}

/// A malformed endpoint is refused before anything runs, naming the variable; an
/// endpoint that is down, or too slow to answer, never holds a run up: the run ends
/// as it would, and the loss is said once.
#[test]
fn a_bad_endpoint_is_refused_and_one_down_or_slow_never_holds_a_run_up() {
    let dir = StoreDir::with_graph(support::store::CHAIN);
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "ftp://collector/v1/traces",
        ),
    ] {
        let o = dir
            .cmd(&["run", "g.json"])
            .env(var, value)
            .output()
            .unwrap();
        expect(&o, INVALID);
        assert!(support::stderr(&o).contains(var), "{}", text(&o));
    }
    assert!(dir.lines().is_empty(), "nothing ran");

    // Down: a port nobody listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = dir
        .cmd(&["run", "g.json"])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        .output()
        .unwrap();
    expect(&o, OK);
    let e = support::stderr(&o);
    assert_eq!(e.matches("are being dropped").count(), 1, "said once: {e}");
    assert_eq!(dir.lines(), ["one"]);

    // Slow: it takes the request and answers after a minute.
    let slow = Receiver::slow(Duration::from_secs(60));
    let o = dir
        .cmd(&["run", "g.json", "--json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &slow.url)
        .output()
        .unwrap();
    expect(&o, OK);
    assert_eq!(report(&o)["outcome"], "completed");
    assert!(slow.requests() >= 1, "the spans were offered");
    assert!(support::stderr(&o).contains("left unsent"), "{}", text(&o));
    assert_eq!(dir.lines(), ["one", "one"]);
}

/// `promtool check metrics` (Prometheus's own linter) on `text`: no problem found.
/// Without promtool the check is skipped, except under CI=true, where it fails
/// (`scripts/test` installs Debian's `prometheus` package, which has it).
fn promtool_accepts(text: &str) {
    use std::io::Write as _;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "promtool cannot start ({e}); scripts/test installs it (apt-get install prometheus)"
            )
        }
        Err(e) => {
            eprintln!("promtool cannot start ({e}): the metrics' text was not linted");
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}\n{text}"
    );
}

/// Every stderr line of a process run with `--log-format json` is one JSON object
/// with a timestamp, a level, a target and a message; returns them.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\n{log}"));
            for key in ["timestamp", "level", "target", "message"] {
                assert!(v[key].is_string(), "no {key}: {l}");
            }
            v
        })
        .collect()
}

/// `heddle serve --metrics-listen ADDR --log-format json` after three real runs (one
/// completed fan-out, one failed after a person's retry, one cancelled while it waited
/// for a person): `/metrics` counts exactly what their reports say, is refused
/// without the token on the API's address and served without one on the metrics
/// address, and promtool finds nothing wrong with it; every line the server wrote is a
/// JSON object, those about a run naming it.
#[test]
fn metrics_count_what_the_runs_did_and_the_log_is_json_lines() {
    let dir = StoreDir::new();
    let server = dir.serve_with(
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--supervise",
            "interactive",
            "--log-format",
            "json",
        ],
        &[],
    );
    // Said right after the line the server's start waits for (a bounded wait).
    let metrics_url = (0..1000)
        .find_map(|_| {
            let log = server.log();
            let url = log
                .split("metrics at ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .map(str::to_string);
            if url.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            url
        })
        .unwrap_or_else(|| panic!("no metrics address said:\n{}", server.log()));
    let api = Api::of(&server);
    let (shows, with_token, without_token, refused) = rt().block_on(async {
        let fan = api.create(support::store::FANOUT).await;
        api.drive_to_end(&fan).await;
        // Fails, is retried by a person, fails again, and the person lets it fail.
        let failing = api.create(support::store::FAILING_PARSE).await;
        let eid = api.first_escalation(&failing).await;
        api.retry(&failing, &eid).await;
        let eid = loop {
            let list = api.pending_escalations(&failing).await;
            let id = list[0]["id"].as_str().unwrap().to_string();
            if id != eid {
                break id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (status, body) = api
            .call(
                "POST",
                &format!("/api/runs/{failing}/escalations/{eid}"),
                Some(serde_json::json!({"verdict": "fail", "note": "not JSON, twice"})),
            )
            .await;
        assert_eq!(status, 200, "{body:#}");
        api.drive_to_end(&failing).await;
        // Cancelled while it waits for a person.
        let cancelled = api.create(support::store::FAILING_PARSE).await;
        api.first_escalation(&cancelled).await;
        let (status, body) = api
            .call("POST", &format!("/api/runs/{cancelled}/cancel"), None)
            .await;
        assert!(status < 300, "{status} {body:#}");
        api.drive_to_end(&cancelled).await;
        let mut shows = Vec::new();
        for id in [&fan, &failing, &cancelled] {
            shows.push(api.show(id).await);
        }
        let scrape = |auth: bool, url: String| {
            let mut r = api.http.get(url);
            if auth {
                r = r.bearer_auth(&api.token);
            }
            async move {
                let resp = r.send().await.unwrap();
                let status = resp.status().as_u16();
                let ty = resp
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string());
                (status, ty, resp.text().await.unwrap())
            }
        };
        let refused = scrape(false, format!("{}/metrics", api.url)).await;
        let with_token = scrape(true, format!("{}/metrics", api.url)).await;
        let without_token = scrape(false, metrics_url.clone()).await;
        (shows, with_token, without_token, refused)
    });
    assert_eq!(refused.0, 401, "the API's /metrics wants the token");
    assert_eq!(with_token.0, 200, "{}", with_token.2);
    assert_eq!(without_token.0, 200, "{}", without_token.2);
    assert_eq!(
        with_token.1.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = without_token.2;
    let m = samples(&text);

    // What the runs' reports say.
    let states: Vec<&str> = shows.iter().map(|s| s["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["completed", "failed", "cancelled"]);
    // Nodes that are not native built-ins (those get no invocation metrics).
    let invoked = |show: &Value, node: &str| {
        show["document"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == node && !n["type"].as_str().unwrap().starts_with("heddle."))
    };
    let (mut ok, mut errors) = (0.0, 0.0);
    for show in &shows {
        for o in show["occurrences"].as_array().unwrap() {
            if !invoked(show, o["occurrence"]["node"].as_str().unwrap()) {
                continue;
            }
            // Each verdict sent it back once more.
            let again = o["verdicts"].as_array().map_or(0, Vec::len) as f64;
            match o["result"]["outcome"].as_str() {
                Some("completed") => {
                    ok += 1.0;
                    errors += again;
                }
                Some("failed") => errors += 1.0 + again,
                other => panic!("{other:?}: {o:#}"),
            }
        }
    }
    assert_eq!(
        (ok, errors),
        (6.0, 2.0),
        "the fan-out's six writes; parse failed twice"
    );
    // The cancelled run's one attempt failed too; its run ended before anything was
    // recorded of it.
    errors += 1.0;

    assert_eq!(sum(&m, "heddle_runs_created_total", &[]), 3.0, "{text}");
    for (outcome, n) in [("completed", 1.0), ("failed", 1.0), ("cancelled", 1.0)] {
        let label = format!("outcome=\"{outcome}\"");
        assert_eq!(sum(&m, "heddle_runs_ended_total", &[&label]), n, "{text}");
    }
    assert_eq!(
        sum(&m, "heddle_invocations_total", &["outcome=\"ok\""]),
        ok,
        "{text}"
    );
    assert_eq!(
        sum(&m, "heddle_invocations_total", &["outcome=\"error\""]),
        errors,
        "{text}"
    );
    assert_eq!(
        sum(&m, "heddle_invocation_duration_seconds_count", &[]),
        ok + errors,
        "{text}"
    );
    // Every failed attempt went to the person (`--supervise interactive`).
    assert_eq!(
        sum(&m, "heddle_escalations_total", &["kind=\"node\""]),
        errors,
        "{text}"
    );
    assert_eq!(
        sum(
            &m,
            "heddle_verdicts_total",
            &["verdict=\"retry\"", "decided_by=\"agent\""]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sum(
            &m,
            "heddle_verdicts_total",
            &["verdict=\"fail\"", "decided_by=\"agent\""]
        ),
        1.0,
        "{text}"
    );
    // Every escalation was decided: the cancelled run's by the bounds, failing it.
    assert_eq!(sum(&m, "heddle_verdicts_total", &[]), errors, "{text}");
    assert_eq!(sum(&m, "heddle_runs_running", &[]), 0.0);
    assert_eq!(sum(&m, "heddle_runs_queued", &[]), 0.0);
    assert_eq!(sum(&m, "heddle_lease_held", &[]), 1.0);
    assert!(
        sum(&m, "heddle_store_commit_seconds_count", &[]) > 0.0,
        "{text}"
    );
    // High-cardinality labels are off unless asked for.
    assert!(
        !text.contains("node=") && !text.contains("graph="),
        "{text}"
    );
    promtool_accepts(&text);

    let (code, log) = server.stop();
    assert_eq!(code, OK, "{log}");
    let lines = json_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l["message"].as_str().unwrap().contains("listening on")
                && l["target"] == "heddle::cli"),
        "{log}"
    );
    assert!(
        lines.iter().any(|l| l["run_id"].is_string()
            && l["node_id"] == "parse"
            && l["message"].as_str().unwrap().contains("answered fail")),
        "the answer's line names its run and node: {log}"
    );
}

/// `heddle run --watchdog --log-format json`: the watchdog's lines and its worker's
/// are JSON objects, one per line, those about the run naming it.
#[test]
fn a_watchdogs_log_is_json_lines_naming_the_run() {
    let dir = StoreDir::with_graph(support::store::CHAIN);
    let out = dir.heddle(&["run", "--watchdog", "--log-format", "json", "g.json"]);
    expect(&out, OK);
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    let lines = json_lines(&log);
    let id = lines
        .iter()
        .find_map(|l| run_id_in(l["message"].as_str().unwrap()))
        .unwrap_or_else(|| panic!("no run id said: {log}"));
    let about_run = |target: &str| {
        lines.iter().any(|l| {
            l["target"].as_str().unwrap().starts_with(target) && l["run_id"] == id.as_str()
        })
    };
    assert!(about_run("heddle_runtime::watch"), "{log}");
    assert!(about_run("heddle::cli"), "{log}");
}
