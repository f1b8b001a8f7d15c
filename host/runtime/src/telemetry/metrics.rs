//! The process's Prometheus metrics: what the runs it drives did (from their event
//! streams, the same consumer as the spans), what its run store's commits cost, and
//! whatever its host adds (a server: its slots, lease and event-stream subscribers).
//! Rendered in Prometheus's text format (0.0.4), which every scraper and `promtool`
//! read. Labels that grow with the graphs (node, node type, graph name) are off unless
//! the operator asks for them (`[telemetry] metric_labels`).

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use serde::Deserialize;

use super::Telemetry;

/// A label a metric about node invocations may carry besides its outcome; each one
/// multiplies the series a scraper stores, so none is on by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricLabel {
    /// The node's type (`std.text.case`): bounded by the installed packages.
    NodeType,
    /// The node's id: one series per node of every graph.
    Node,
    /// The graph's name: one series per graph.
    Graph,
}

impl MetricLabel {
    fn name(self) -> &'static str {
        match self {
            MetricLabel::NodeType => "node_type",
            MetricLabel::Node => "node",
            MetricLabel::Graph => "graph",
        }
    }
}

/// Bounds of the invocation duration histogram, in seconds: a native call's
/// microseconds to a code node's minutes.
const INVOCATION_BUCKETS: &[f64] = &[
    0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0,
];

/// Bounds of the store commit histogram, in seconds (a synced SQLite commit is a few
/// milliseconds on a disk, a PostgreSQL one a round trip).
const COMMIT_BUCKETS: &[f64] = &[
    0.000_1, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Metrics of the runs of this process. Cheap to clone handles; the registry renders.
pub struct Metrics {
    registry: Registry,
    labels: Vec<MetricLabel>,
    /// Durable runs this process created.
    pub runs_created: IntCounter,
    /// Durable runs this process took over (`recover`, `resume`).
    pub runs_taken_over: IntCounterVec,
    /// Runs that ended here, by outcome (`completed`, `failed`, `cancelled`, and
    /// `paused` for a durable run that stopped resumable).
    pub runs_ended: IntCounterVec,
    invocations: IntCounterVec,
    invocation_seconds: HistogramVec,
    escalations: IntCounterVec,
    verdicts: IntCounterVec,
    http_requests: IntCounter,
    http_bytes: IntCounter,
    commit_seconds: HistogramVec,
    spans_sent: IntCounter,
    spans_dropped: IntCounter,
    telemetry: Option<Arc<Telemetry>>,
    /// Without extra labels, the invocation series resolved once (`ok`, `error`,
    /// `timed_out`, and the histogram): counting an invocation is then two atomic
    /// additions, where looking the series up by label hashed the labels under a lock
    /// at every invocation.
    unlabelled: Option<Unlabelled>,
}

struct Unlabelled {
    ok: IntCounter,
    error: IntCounter,
    timed_out: IntCounter,
    seconds: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Registration cannot fail for these names and labels, all fixed here and distinct.
fn must<T>(r: prometheus::Result<T>) -> T {
    r.expect("a metric's fixed name and labels are valid")
}

impl Metrics {
    /// The metrics, with `labels` on the invocation metrics; `telemetry` is the span
    /// exporter whose counts are reported too.
    pub(crate) fn new(labels: &[MetricLabel], telemetry: Option<Arc<Telemetry>>) -> Metrics {
        let registry = Registry::new();
        let mut labels = labels.to_vec();
        labels.sort();
        labels.dedup();
        let mut with_outcome = vec!["outcome"];
        with_outcome.extend(labels.iter().map(|l| l.name()));
        let extra: Vec<&str> = labels.iter().map(|l| l.name()).collect();
        let counter = |name: &str, help: &str| {
            let c = must(IntCounter::new(name, help));
            must(registry.register(Box::new(c.clone())));
            c
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = must(IntCounterVec::new(Opts::new(name, help), labels));
            must(registry.register(Box::new(c.clone())));
            c
        };
        let histograms = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            let h = must(HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            ));
            must(registry.register(Box::new(h.clone())));
            h
        };
        let mut m = Metrics {
            runs_created: counter(
                "heddle_runs_created_total",
                "Durable runs created by this process.",
            ),
            runs_taken_over: counters(
                "heddle_runs_taken_over_total",
                "Durable runs this process took over from their log, by how (recover: the owner died; resume: a person resumed or approved).",
                &["how"],
            ),
            runs_ended: counters(
                "heddle_runs_ended_total",
                "Runs that ended in this process, by outcome (completed, failed, cancelled; paused: a durable run that stopped resumable).",
                &["outcome"],
            ),
            invocations: counters(
                "heddle_invocations_total",
                "Node invocation attempts (native built-ins excepted), by outcome (ok, error, timed_out).",
                &with_outcome,
            ),
            invocation_seconds: histograms(
                "heddle_invocation_duration_seconds",
                "Wall time of node invocation attempts (native built-ins excepted).",
                INVOCATION_BUCKETS,
                &extra,
            ),
            escalations: counters(
                "heddle_escalations_total",
                "Failed invocations handed to a supervisor, by failure kind.",
                &["kind"],
            ),
            verdicts: counters(
                "heddle_verdicts_total",
                "Supervisor decisions, by verdict and who decided.",
                &["verdict", "decided_by"],
            ),
            http_requests: counter(
                "heddle_http_requests_total",
                "Outgoing HTTP requests of WASM nodes granted a network.",
            ),
            http_bytes: counter(
                "heddle_http_bytes_total",
                "Bytes those requests moved: headers and bodies, sent and received.",
            ),
            commit_seconds: histograms(
                "heddle_store_commit_seconds",
                "Run store commits of a run's log (one transaction each), by whether it waited for stable storage.",
                COMMIT_BUCKETS,
                &["synced"],
            ),
            spans_sent: counter(
                "heddle_otel_spans_sent_total",
                "Spans the OTLP endpoint took.",
            ),
            spans_dropped: counter(
                "heddle_otel_spans_dropped_total",
                "Spans dropped: the endpoint was down, slow or refused them, or the queue was full.",
            ),
            registry,
            labels,
            telemetry,
            unlabelled: None,
        };
        if m.labels.is_empty() {
            m.unlabelled = Some(Unlabelled {
                ok: m.invocations.with_label_values(&["ok"]),
                error: m.invocations.with_label_values(&["error"]),
                timed_out: m.invocations.with_label_values(&["timed_out"]),
                seconds: m.invocation_seconds.with_label_values(&[] as &[&str]),
            });
        }
        // Every run log of the process reports its commits here (the first metrics of the
        // process only: one store per process in practice).
        let commits = m.commit_seconds.clone();
        heddle_store::log::observe_commits(move |took, synced| {
            commits
                .with_label_values(&[if synced { "true" } else { "false" }])
                .observe(took.as_secs_f64());
        });
        m
    }

    /// Where a host registers metrics of its own, rendered with these.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A gauge of the host's, registered here.
    pub fn gauge(&self, name: &str, help: &str) -> IntGauge {
        let g = must(IntGauge::new(name, help));
        must(self.registry.register(Box::new(g.clone())));
        g
    }

    /// A counter of the host's with `labels`, registered here.
    pub fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let c = must(IntCounterVec::new(Opts::new(name, help), labels));
        must(self.registry.register(Box::new(c.clone())));
        c
    }

    /// Everything, in Prometheus's text format.
    pub fn render(&self) -> String {
        if let Some(t) = &self.telemetry {
            // Counted by the exporter; mirrored at each scrape.
            mirror(&self.spans_sent, t.sent());
            mirror(&self.spans_dropped, t.dropped());
        }
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# the metrics could not be rendered: {e}\n"))
    }

    /// The optional labels' values of an invocation of node `node` of type `node_type`
    /// in graph `graph`, in the order the metrics take them.
    pub(crate) fn label_values<'a>(
        &self,
        node: &'a str,
        node_type: &'a str,
        graph: &'a str,
    ) -> Vec<&'a str> {
        self.labels
            .iter()
            .map(|l| match l {
                MetricLabel::NodeType => node_type,
                MetricLabel::Node => node,
                MetricLabel::Graph => graph,
            })
            .collect()
    }

    /// Whether the invocation metrics carry labels beyond the outcome.
    pub(crate) fn labelled(&self) -> bool {
        !self.labels.is_empty()
    }

    /// One invocation attempt that ended with `outcome` after `wall`.
    pub(crate) fn invocation(&self, outcome: &str, wall: Duration, extra: &[&str]) {
        if let Some(u) = &self.unlabelled {
            match outcome {
                "ok" => u.ok.inc(),
                "error" => u.error.inc(),
                "timed_out" => u.timed_out.inc(),
                other => self.invocations.with_label_values(&[other]).inc(),
            }
            u.seconds.observe(wall.as_secs_f64());
        } else if extra.is_empty() {
            self.invocations.with_label_values(&[outcome]).inc();
            self.invocation_seconds
                .with_label_values(&[] as &[&str])
                .observe(wall.as_secs_f64());
        } else {
            let mut v = Vec::with_capacity(extra.len() + 1);
            v.push(outcome);
            v.extend_from_slice(extra);
            self.invocations.with_label_values(&v).inc();
            self.invocation_seconds
                .with_label_values(extra)
                .observe(wall.as_secs_f64());
        }
    }

    /// Outgoing HTTP requests an invocation made, and the bytes they moved.
    pub(crate) fn http(&self, requests: u64, bytes: u64) {
        self.http_requests.inc_by(requests);
        self.http_bytes.inc_by(bytes);
    }

    /// A failure of kind `kind` handed to a supervisor.
    pub(crate) fn escalation(&self, kind: &str) {
        self.escalations.with_label_values(&[kind]).inc();
    }

    /// A supervisor's `verdict`, decided by `by`.
    pub(crate) fn verdict(&self, verdict: &str, by: &str) {
        self.verdicts.with_label_values(&[verdict, by]).inc();
    }
}

/// Sets a counter mirrored from elsewhere to `value` (it only ever grows there).
fn mirror(c: &IntCounter, value: u64) {
    let now = c.get();
    if value > now {
        c.inc_by(value - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without labels asked for, an invocation is counted by outcome alone; with
    /// `node_type`, `node` and `graph` it carries them, in the text a scraper reads.
    #[test]
    fn the_graph_labels_are_off_unless_asked_for() {
        let plain = Metrics::new(&[], None);
        plain.invocation("ok", Duration::from_millis(3), &[]);
        let text = plain.render();
        assert!(
            text.contains("heddle_invocations_total{outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(!text.contains("node="), "{text}");

        let labelled = Metrics::new(
            &[MetricLabel::Graph, MetricLabel::Node, MetricLabel::NodeType],
            None,
        );
        assert!(labelled.labelled());
        let values = labelled.label_values("parse", "std.json.parse", "g.json");
        labelled.invocation("error", Duration::from_millis(3), &values);
        let text = labelled.render();
        assert!(
            text.contains(
                "heddle_invocations_total{graph=\"g.json\",node=\"parse\",node_type=\"std.json.parse\",outcome=\"error\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "heddle_invocation_duration_seconds_count{graph=\"g.json\",node=\"parse\",node_type=\"std.json.parse\"} 1"
            ),
            "{text}"
        );
    }
}
