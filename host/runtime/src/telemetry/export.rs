//! The process's span exporter: a bounded queue, and one thread of its own that sends
//! what the queue holds in batches over OTLP/HTTP (`opentelemetry-otlp`'s exporter, on
//! a current-thread tokio runtime, through the same `reqwest` client the supervisor
//! uses). A run only ever pushes to the queue; it never waits for the network.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator, SpanData, SpanExporter as _};
use tokio::sync::mpsc;

use super::{SHUTDOWN_WAIT, TraceExport};

/// Spans waiting to be sent, at most: past it a span is dropped (and counted) rather
/// than held in memory while the endpoint is down or slow.
const QUEUE: usize = 8192;
/// Spans sent in one request, at most.
const MAX_BATCH: usize = 512;
/// How long the first span of a batch waits for others.
const BATCH_DELAY: Duration = Duration::from_millis(200);
/// How often a batch being gathered takes what has been queued meanwhile. The thread
/// sleeps in between instead of waiting on the queue: waiting on it, every span queued
/// woke it (a futex wake-up and two context switches per span, most of what tracing
/// cost the runs' CPU). The queue holds `QUEUE` spans, so only a run emitting more
/// than `QUEUE` spans in one `GATHER_EVERY` could fill it while the thread sleeps.
const GATHER_EVERY: Duration = Duration::from_millis(5);
/// The largest answer an endpoint may send (it is read only for partial successes).
const MAX_ANSWER: usize = 4 << 20;

enum Msg {
    Span(Box<SpanData>),
    /// Send what came before, then stop ([`Telemetry::shutdown`]).
    Close,
}

/// What the exporter counts, shared with its thread.
struct Stats {
    endpoint: String,
    sent: AtomicU64,
    dropped: AtomicU64,
    warned: AtomicBool,
}

impl Stats {
    /// Counts `n` spans lost; the first loss is logged (once per process: a down
    /// endpoint would otherwise log every batch).
    fn lost(&self, n: u64, why: &dyn Display) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "spans for {} are being dropped: {why} (runs go on; every dropped span is counted in heddle_otel_spans_dropped_total; this is said once)",
                self.endpoint
            );
        }
    }
}

/// Sends the spans of every traced run of this process to one OTLP/HTTP endpoint.
/// Dropping it sends what is queued, waiting at most [`SHUTDOWN_WAIT`].
pub struct Telemetry {
    tx: Option<mpsc::Sender<Msg>>,
    stats: Arc<Stats>,
    ids: RandomIdGenerator,
    /// Told when the sending thread is done.
    done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("endpoint", &self.stats.endpoint)
            .finish()
    }
}

impl Telemetry {
    /// Starts the sending thread for `export`. A thread or exporter that cannot start
    /// is logged; every span is then dropped and counted.
    pub fn start(export: &TraceExport) -> Telemetry {
        let stats = Arc::new(Stats {
            endpoint: export.endpoint.clone(),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        let (done_tx, done) = std::sync::mpsc::channel();
        let export = export.clone();
        let thread_stats = stats.clone();
        let started = std::thread::Builder::new()
            .name("heddle-otel".into())
            .spawn(move || {
                send_all(rx, &export, &thread_stats);
                let _ = done_tx.send(());
            });
        if let Err(e) = started {
            // The receiver is gone with the closure: every send fails, and is counted.
            tracing::error!("cannot start the span exporter's thread: {e}");
        }
        Telemetry {
            tx: Some(tx),
            stats,
            ids: RandomIdGenerator::default(),
            done: Mutex::new(Some(done)),
        }
    }

    /// Queues `span` for sending; never waits. A full queue drops it (counted).
    pub(crate) fn send(&self, span: SpanData) {
        let Some(tx) = &self.tx else { return };
        if let Err(e) = tx.try_send(Msg::Span(Box::new(span))) {
            let why = match e {
                mpsc::error::TrySendError::Full(_) => {
                    "the queue of spans to send is full (the endpoint is slower than the runs)"
                }
                mpsc::error::TrySendError::Closed(_) => "the exporter is not running",
            };
            self.stats.lost(1, &why);
        }
    }

    /// Spans sent and acknowledged by the endpoint so far.
    pub fn sent(&self) -> u64 {
        self.stats.sent.load(Ordering::Relaxed)
    }

    /// Spans dropped so far (queue full, endpoint down, slow or refusing).
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Where the spans go.
    pub fn endpoint(&self) -> &str {
        &self.stats.endpoint
    }

    /// A new random trace id.
    pub(crate) fn trace_id(&self) -> heddle_core::trace::TraceId {
        heddle_core::trace::TraceId(self.ids.new_trace_id().to_bytes())
    }

    /// A new random span id.
    pub(crate) fn span_id(&self) -> heddle_core::trace::SpanId {
        heddle_core::trace::SpanId(self.ids.new_span_id().to_bytes())
    }

    /// A random salt for minting a run's attempt span ids in this process.
    pub(crate) fn salt(&self) -> u64 {
        self.span_id().to_u64()
    }
}

impl Telemetry {
    /// Sends what is queued and stops, waiting at most [`SHUTDOWN_WAIT`]: what dropping
    /// it does, for an exporter that is never dropped (`heddle bench` hands it to a
    /// process-wide observer). A span queued afterwards is dropped (counted).
    pub fn shutdown(&self) {
        let Some(tx) = &self.tx else { return };
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        let mut msg = Msg::Close;
        // A full queue is being emptied by the thread: the close goes in behind it.
        loop {
            match tx.try_send(msg) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Full(m)) if std::time::Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => break,
            }
        }
        self.wait_done(deadline.saturating_duration_since(std::time::Instant::now()));
    }

    /// Waits at most `wait` for the sending thread to end (once); says what was left.
    fn wait_done(&self, wait: Duration) {
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(done) = done
            && let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(wait)
        {
            tracing::warn!(
                "spans still being sent to {} after {} ms were left unsent",
                self.stats.endpoint,
                SHUTDOWN_WAIT.as_millis()
            );
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Closing the queue tells the thread to send what is left and stop.
        drop(self.tx.take());
        self.wait_done(SHUTDOWN_WAIT);
    }
}

/// The sending thread: batches of spans from `rx` until it is closed and empty.
fn send_all(mut rx: mpsc::Receiver<Msg>, export: &TraceExport, stats: &Stats) {
    let exporter = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| Ok((exporter(export)?, rt)));
    let (mut exporter, rt) = match exporter {
        Ok(x) => x,
        Err(e) => {
            stats.lost(0, &format!("the exporter cannot start: {e}"));
            while let Some(Msg::Span(_)) = rx.blocking_recv() {
                stats.lost(1, &"the exporter is not running");
            }
            // (A close ends the loop too: nothing more is taken.)
            return;
        }
    };
    exporter.set_resource(&resource(export));
    rt.block_on(async {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut open = true;
        while open {
            match rx.recv().await {
                Some(Msg::Span(s)) => batch.push(*s),
                Some(Msg::Close) | None => break,
            }
            let deadline = tokio::time::Instant::now() + BATCH_DELAY;
            'gather: loop {
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(Msg::Span(s)) => batch.push(*s),
                        Ok(Msg::Close) | Err(mpsc::error::TryRecvError::Disconnected) => {
                            open = false;
                            break 'gather;
                        }
                        Err(mpsc::error::TryRecvError::Empty) => break,
                    }
                }
                let now = tokio::time::Instant::now();
                if batch.len() >= MAX_BATCH || now >= deadline {
                    break;
                }
                tokio::time::sleep(GATHER_EVERY.min(deadline - now)).await;
            }
            let n = batch.len() as u64;
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
            match tokio::time::timeout(export.timeout, exporter.export(spans)).await {
                Ok(Ok(())) => {
                    stats.sent.fetch_add(n, Ordering::Relaxed);
                }
                Ok(Err(e)) => stats.lost(n, &e),
                Err(_) => stats.lost(
                    n,
                    &format!(
                        "the endpoint did not answer within {} ms",
                        export.timeout.as_millis()
                    ),
                ),
            }
        }
    });
    let _ = exporter.shutdown();
}

fn exporter(export: &TraceExport) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let client = reqwest::Client::builder()
        .timeout(export.timeout)
        .build()
        .map_err(|e| e.to_string())?;
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(export.endpoint.clone())
        .with_timeout(export.timeout)
        .with_http_client(Client(client))
        .build()
        .map_err(|e| e.to_string())
}

/// Who sends: `service.name` (as configured), `service.version`, `process.pid`, and
/// whatever `OTEL_RESOURCE_ATTRIBUTES` adds.
fn resource(export: &TraceExport) -> Resource {
    Resource::builder()
        .with_service_name(export.service_name.clone())
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ])
        .build()
}

/// `opentelemetry-otlp`'s HTTP client over the `reqwest` the workspace already builds
/// (with rustls: an `https://` endpoint works).
#[derive(Debug)]
struct Client(reqwest::Client);

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let mut response = self.0.execute(request).await?;
        let mut answer = http::Response::builder().status(response.status());
        if let Some(h) = answer.headers_mut() {
            *h = std::mem::take(response.headers_mut());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(format!("the endpoint's answer is over {MAX_ANSWER} bytes").into());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(answer.body(Bytes::from(body))?)
    }
}
