//! `GET /metrics`: the server's Prometheus metrics in the text format scrapers and
//! `promtool` read. The runtime counts what the runs did ([`heddle_runtime::telemetry::Metrics`]:
//! runs created, ended, invocations, their durations, escalations, verdicts, store
//! commits, spans); this adds what only the server knows: runs holding a worker slot and
//! runs waiting for one, its store lease and its renewals, the event streams' subscribers.
//!
//! Two ways to scrape, the operator's choice: on the API's address behind the token
//! (a scraper sends `Authorization: Bearer TOKEN`, as Prometheus's `authorization`
//! setting does), or on an address of its own without one (`heddle serve
//! --metrics-listen ADDR`, for a scraper on a private network: the metrics say how busy
//! the server is and how its runs end, never what they hold).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use heddle_runtime::telemetry::Metrics;
use prometheus::{IntCounterVec, IntGauge};

use crate::host::Host;

/// The content type of Prometheus's text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the server measures besides the runtime's metrics.
pub struct ServerMetrics {
    metrics: Arc<Metrics>,
    running: IntGauge,
    queued: IntGauge,
    subscribers: IntGauge,
    lease_held: IntGauge,
    renewals: IntCounterVec,
}

impl ServerMetrics {
    /// The server's metrics, beside `metrics` (the runtime's).
    pub fn new(metrics: Arc<Metrics>) -> ServerMetrics {
        ServerMetrics {
            running: metrics.gauge(
                "heddle_runs_running",
                "Runs holding a worker slot (executing).",
            ),
            queued: metrics.gauge(
                "heddle_runs_queued",
                "Runs this server drives that wait for a worker slot.",
            ),
            subscribers: metrics.gauge(
                "heddle_sse_subscribers",
                "Clients reading a run's event stream.",
            ),
            lease_held: metrics.gauge(
                "heddle_lease_held",
                "1 while this server holds its run store's owner lease (on a database several hosts share: while its registration and its runs' leases are renewed).",
            ),
            renewals: metrics.counters(
                "heddle_lease_renewals_total",
                "Renewals of the store's owner lease, by result (ok, failed: the lease was lost).",
                &["result"],
            ),
            metrics,
        }
    }

    /// The runtime's metrics.
    pub fn runtime(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The lease was taken (`true`) or given up or lost (`false`).
    pub fn lease_held(&self, held: bool) {
        self.lease_held.set(i64::from(held));
    }

    /// A renewal of the lease, and whether it held.
    pub fn lease_renewed(&self, ok: bool) {
        self.renewals
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
        if !ok {
            self.lease_held(false);
        }
    }

    /// Every metric, the gauges read from `host` now.
    pub fn render(&self, host: &Host) -> String {
        let load = host.load();
        self.running.set(load.running as i64);
        self.queued.set(load.queued as i64);
        self.subscribers.set(load.subscribers as i64);
        self.metrics.render()
    }
}

/// `GET /metrics` (behind the API's token, in [`crate::api::router`]).
pub(crate) async fn scrape(State(host): State<Arc<Host>>) -> Response {
    (
        [(header::CONTENT_TYPE, TEXT_FORMAT)],
        host.metrics.render(&host),
    )
        .into_response()
}

/// The router of `--metrics-listen`: `GET /metrics` and nothing else, without a token.
pub fn router(host: Arc<Host>) -> Router {
    crate::api::guard(
        Router::new()
            .route("/metrics", get(scrape))
            .with_state(host),
    )
}
