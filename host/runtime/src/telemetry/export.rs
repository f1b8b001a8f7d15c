//! The process's span exporter: a bounded queue of encoded spans, and one thread of its
//! own that sends what the queue holds in batches over OTLP/HTTP (protobuf, through
//! the same `reqwest` client the supervisor uses, on a current-thread tokio runtime).
//! A run only ever pushes to the queue; it never waits for the network.
//!
//! The spans come already encoded ([`super::proto`]): a run's consumer writes each span
//! once, into a buffer it hands over with many spans in it, and this thread puts the
//! buffers behind the process's resource and scope (encoded once) and posts them.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
use tokio::sync::mpsc;

use super::proto::Preamble;
use super::{SHUTDOWN_WAIT, TraceExport};

/// Spans waiting to be sent, at most: past it spans are dropped (and counted) rather
/// than held in memory while the endpoint is down or slow.
const QUEUE: usize = 16_384;
/// Spans sent in one request, about (a batch is closed once it has at least this many:
/// it may be a handful of runs' buffers over).
const MAX_BATCH: usize = 1024;
/// How long the first span of a batch waits for others.
const BATCH_DELAY: Duration = Duration::from_millis(200);
/// How often a batch being gathered takes what has been queued meanwhile. The thread
/// sleeps in between instead of waiting on the queue: waiting on it, every span queued
/// woke it (a futex wake-up and two context switches per span, most of what tracing
/// cost the runs' CPU). The queue holds `QUEUE` spans, so only runs emitting more
/// than `QUEUE` spans in one `GATHER_EVERY` could fill it while the thread sleeps.
const GATHER_EVERY: Duration = Duration::from_millis(5);
/// The largest answer an endpoint may send (it is read only to say why it refused).
const MAX_ANSWER: usize = 4 << 20;
/// Tries of one request an endpoint may refuse for the moment (a 429, 502, 503 or 504,
/// or no connection), with a doubling pause between (as OpenTelemetry's exporters
/// retry), all within the export timeout.
const TRIES: u32 = 3;
const FIRST_PAUSE: Duration = Duration::from_millis(100);

enum Msg {
    /// Encoded spans ([`super::proto::SpanWriter::finish`]ed), and how many.
    Spans(Vec<u8>, usize),
    /// Send what came before, then stop ([`Telemetry::shutdown`]).
    Close,
}

/// What the exporter counts, shared with its thread.
struct Stats {
    endpoint: String,
    sent: AtomicU64,
    dropped: AtomicU64,
    /// Spans in the queue (the channel is unbounded; this bounds it in spans).
    queued: AtomicUsize,
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
    tx: Option<mpsc::UnboundedSender<Msg>>,
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
    /// Starts the sending thread for `export`. A thread that cannot start is logged;
    /// every span is then dropped and counted.
    pub fn start(export: &TraceExport) -> Telemetry {
        let stats = Arc::new(Stats {
            endpoint: export.endpoint.clone(),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            warned: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::unbounded_channel();
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

    /// Queues `spans` encoded spans (`encoded`, as [`super::proto::SpanWriter::finish`]
    /// appends them) for sending; never waits. A full queue drops them (counted).
    pub(crate) fn send(&self, encoded: Vec<u8>, spans: usize) {
        let Some(tx) = &self.tx else { return };
        if spans == 0 {
            return;
        }
        let before = self.stats.queued.fetch_add(spans, Ordering::Relaxed);
        if before + spans > QUEUE {
            self.stats.queued.fetch_sub(spans, Ordering::Relaxed);
            self.stats.lost(
                spans as u64,
                &"the queue of spans to send is full (the endpoint is slower than the runs)",
            );
            return;
        }
        if tx.send(Msg::Spans(encoded, spans)).is_err() {
            self.stats.queued.fetch_sub(spans, Ordering::Relaxed);
            self.stats
                .lost(spans as u64, &"the exporter is not running");
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
        // Behind whatever is queued: the thread sends that first.
        let _ = tx.send(Msg::Close);
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
fn send_all(mut rx: mpsc::UnboundedReceiver<Msg>, export: &TraceExport, stats: &Stats) {
    let started = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| Ok((client(export)?, rt)));
    let (client, rt) = match started {
        Ok(x) => x,
        Err(e) => {
            stats.lost(0, &format!("the exporter cannot start: {e}"));
            while let Some(Msg::Spans(_, n)) = rx.blocking_recv() {
                stats.queued.fetch_sub(n, Ordering::Relaxed);
                stats.lost(n as u64, &"the exporter is not running");
            }
            // (A close ends the loop too: nothing more is taken.)
            return;
        }
    };
    let preamble = preamble(export);
    let take = |msg: Msg, batch: &mut Vec<Vec<u8>>, n: &mut usize| match msg {
        Msg::Spans(b, k) => {
            stats.queued.fetch_sub(k, Ordering::Relaxed);
            batch.push(b);
            *n += k;
            true
        }
        Msg::Close => false,
    };
    rt.block_on(async {
        let mut open = true;
        while open {
            let mut batch = Vec::new();
            let mut n = 0;
            match rx.recv().await {
                Some(msg) => {
                    if !take(msg, &mut batch, &mut n) {
                        break;
                    }
                }
                None => break,
            }
            let deadline = tokio::time::Instant::now() + BATCH_DELAY;
            'gather: loop {
                while n < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(msg) => {
                            if !take(msg, &mut batch, &mut n) {
                                open = false;
                                break 'gather;
                            }
                        }
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            open = false;
                            break 'gather;
                        }
                        Err(mpsc::error::TryRecvError::Empty) => break,
                    }
                }
                let now = tokio::time::Instant::now();
                if n >= MAX_BATCH || now >= deadline {
                    break;
                }
                tokio::time::sleep(GATHER_EVERY.min(deadline - now)).await;
            }
            let body = preamble.request(&batch);
            drop(batch);
            match tokio::time::timeout(export.timeout, post(&client, export, body)).await {
                Ok(Ok(())) => {
                    stats.sent.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(Err(e)) => stats.lost(n as u64, &e),
                Err(_) => stats.lost(
                    n as u64,
                    &format!(
                        "the endpoint did not answer within {} ms",
                        export.timeout.as_millis()
                    ),
                ),
            }
        }
    });
}

/// `body` gzip-compressed, as `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` asks.
fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(body)?;
    z.finish()
}

/// The HTTP client: the export timeout bounds each request too.
fn client(export: &TraceExport) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(export.timeout)
        .user_agent(concat!("heddle/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| e.to_string())
}

/// Posts one `ExportTraceServiceRequest`, trying again (at most [`TRIES`] in all) when
/// the endpoint is not there or says to come back.
async fn post(client: &reqwest::Client, export: &TraceExport, body: Vec<u8>) -> Result<(), String> {
    let body = if export.gzip {
        gzip(&body).map_err(|e| format!("cannot compress the spans: {e}"))?
    } else {
        body
    };
    let body = bytes::Bytes::from(body);
    let mut pause = FIRST_PAUSE;
    let mut tries = 0;
    loop {
        tries += 1;
        let mut request = client
            .post(&export.endpoint)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body.clone());
        if export.gzip {
            request = request.header(http::header::CONTENT_ENCODING, "gzip");
        }
        for (k, v) in &export.headers.0 {
            request = request.header(k.as_str(), v.as_str());
        }
        let again = match request.send().await {
            Ok(mut response) => {
                let status = response.status();
                // Read whole (within bounds), so the connection is kept for the next.
                let mut answer = Vec::new();
                while let Ok(Some(chunk)) = response.chunk().await {
                    if answer.len() + chunk.len() > MAX_ANSWER {
                        break;
                    }
                    answer.extend_from_slice(&chunk);
                }
                if status.is_success() {
                    return Ok(());
                }
                let said = String::from_utf8_lossy(&answer);
                let why = format!(
                    "the endpoint answered {status}{}{}",
                    if said.trim().is_empty() { "" } else { ": " },
                    heddle_core::text::clip(said.trim(), heddle_core::text::ECHO_MAX_CHARS)
                );
                let retry = matches!(status.as_u16(), 429 | 502 | 503 | 504);
                (retry, why)
            }
            Err(e) => {
                // reqwest's own text names the URL only; the causes say what failed.
                let mut why = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    why = format!("{why}: {c}");
                    cause = c.source();
                }
                (e.is_connect(), why)
            }
        };
        match again {
            (true, _) if tries < TRIES => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            (_, why) => return Err(why),
        }
    }
}

/// The resource and scope every request carries. Who sends: `service.name` (as
/// configured), `service.version`, `process.pid`, and whatever
/// `OTEL_RESOURCE_ATTRIBUTES` adds.
fn preamble(export: &TraceExport) -> Preamble {
    let resource = Resource::builder()
        .with_service_name(export.service_name.clone())
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ])
        .build();
    Preamble::new(
        resource.iter().map(|(k, v)| (k.as_str(), v)),
        "heddle",
        env!("CARGO_PKG_VERSION"),
    )
}
