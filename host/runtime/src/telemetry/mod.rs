//! What an operator's monitoring sees of the runs: OpenTelemetry traces over OTLP/HTTP
//! (one `heddle.run` span per run, one `heddle.node` span per invocation attempt under
//! it), and the log format the command line's server and watchdog write.
//!
//! Spans are built from the run's typed event stream, one consumer among the others
//! (the progress view, the report, the log), never by timing code inside the kernel: a
//! run without an exporter configured mints no ids, builds no span and publishes no
//! extra event. With one, the kernel gives every attempt a span id when it starts (a
//! code node is handed it as `TRACEPARENT`) and reports the attempt when it ends; the
//! span is built from that report, with the attempt's own start and end times.
//!
//! A durable run records its trace with its first `opened` record, so every process
//! that drives it later (a resume, a watchdog's replacement worker, a server's
//! adoption) continues the same trace under the same run span. Results recorded by an
//! earlier process and fed downstream on recovery are not invocations: they get no
//! span. Attempts an owner started and never ended because it died are reported by the
//! process that recovers the run, as died (`heddle.node.outcome = died`). The run span
//! is sent once, by the process that records the run's ending (a paused run's spans
//! wait for it).
//!
//! Export never holds a run up: spans go to a bounded queue that one thread of this
//! process sends in batches (every 200 ms, or about 1,024 spans); when the queue is full
//! or the endpoint does not take them, they are dropped, counted
//! ([`Telemetry::dropped`]) and the first such loss is logged, once. Which runs are
//! traced is decided once per run ([`Sampler`], `OTEL_TRACES_SAMPLER`): by default
//! every run but one whose caller's span is not sampled; a run's spans are all sent or
//! none is.

mod export;
mod metrics;
mod proto;
mod spans;

use std::sync::Arc;
use std::time::Duration;

use heddle_core::trace::TraceParent;
use serde::Deserialize;

use crate::config::Config;
use crate::error::ConfigError;

pub use export::Telemetry;
pub use metrics::{MetricLabel, Metrics};
pub(crate) use spans::{RunInfo, RunSpan, RunSpanEnd, RunTracing, at_ms};

/// How the command line writes its log lines (`[telemetry] log_format`, `--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One line of text per event, as a person reads it (the default).
    #[default]
    Human,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`, and `run_id`
    /// and `node_id` where the event is about one.
    Json,
}

impl LogFormat {
    /// Its name, as `--log-format` and `[telemetry] log_format` take it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        }
    }
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("`{other}` is not a log format (human or json)")),
        }
    }
}

/// `[telemetry]` in `heddle.toml`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetrySection {
    /// Base URL of an OTLP/HTTP receiver (`/v1/traces` is added), as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` gives it.
    #[serde(default)]
    otlp_endpoint: Option<String>,
    /// The `service.name` spans are sent under (default `heddle`).
    #[serde(default)]
    service_name: Option<String>,
    #[serde(default)]
    log_format: Option<LogFormat>,
    /// Labels the invocation metrics carry besides the outcome (`node_type`, `node`,
    /// `graph`); none by default (each multiplies the series stored).
    #[serde(default)]
    metric_labels: Vec<MetricLabel>,
}

/// Where a process sends its spans.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceExport {
    /// The OTLP/HTTP traces URL (`…/v1/traces`).
    pub endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The longest wait for one export request (connecting, retries and the answer):
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds),
    /// else [`DEFAULT_EXPORT_TIMEOUT`].
    pub timeout: Duration,
    /// Headers every request carries (an API key): `OTEL_EXPORTER_OTLP_TRACES_HEADERS`
    /// or `OTEL_EXPORTER_OTLP_HEADERS`.
    pub headers: Headers,
    /// Whether request bodies are gzip-compressed (`Content-Encoding: gzip`):
    /// `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION` or `OTEL_EXPORTER_OTLP_COMPRESSION` =
    /// `gzip` (`none`, the default, sends them as they are).
    pub gzip: bool,
    /// Which runs are traced: `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
    pub sampler: Sampler,
}

/// Which runs' spans are sent (`OTEL_TRACES_SAMPLER`, as every OpenTelemetry SDK reads
/// it), decided once per run, when it is created, from its trace id and its caller's
/// `traceparent`: a run's spans are all sent or none is. A durable run records the
/// decision with its trace, so whoever continues it decides nothing again. A run
/// sampled out still hands its code nodes a `traceparent` (flagged not sampled, so
/// their own spans follow the decision), but builds and sends no span.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampler {
    /// Every run (`always_on`).
    AlwaysOn,
    /// No run (`always_off`).
    AlwaysOff,
    /// This share of the runs, by trace id (`traceidratio`, the share from
    /// `OTEL_TRACES_SAMPLER_ARG`, 0 to 1, default 1): every service sampling a trace at
    /// the same ratio keeps or drops it alike.
    TraceIdRatio(f64),
    /// A run under a caller's span follows the caller's decision (its `traceparent`'s
    /// sampled flag); one without a caller is decided by the root sampler
    /// (`parentbased_always_on`, the default; `parentbased_always_off`;
    /// `parentbased_traceidratio`).
    ParentBased(Root),
}

/// What a [`Sampler::ParentBased`] decides for a run without a caller.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Root {
    /// Traced.
    AlwaysOn,
    /// Not traced.
    AlwaysOff,
    /// This share, by trace id.
    TraceIdRatio(f64),
}

impl Default for Sampler {
    /// `parentbased_always_on`: every run, unless its caller's span is not sampled
    /// (OpenTelemetry's default, and Heddle's before the variable was read).
    fn default() -> Sampler {
        Sampler::ParentBased(Root::AlwaysOn)
    }
}

impl Sampler {
    /// Whether a run of trace `trace_id`, under `parent` (the caller's span, if any),
    /// is traced.
    pub fn sampled(
        self,
        trace_id: heddle_core::trace::TraceId,
        parent: Option<&TraceParent>,
    ) -> bool {
        match self {
            Sampler::AlwaysOn => true,
            Sampler::AlwaysOff => false,
            Sampler::TraceIdRatio(r) => ratio(trace_id, r),
            Sampler::ParentBased(root) => match (parent, root) {
                (Some(p), _) => p.sampled,
                (None, Root::AlwaysOn) => true,
                (None, Root::AlwaysOff) => false,
                (None, Root::TraceIdRatio(r)) => ratio(trace_id, r),
            },
        }
    }
}

/// Whether `trace_id` falls in share `r` of all trace ids: its last 8 bytes (the
/// random part every SDK fills), halved, below `r` × 2⁶³, as OpenTelemetry's Go and
/// Java SDKs decide, so a trace sampled at one ratio is sampled alike everywhere.
fn ratio(trace_id: heddle_core::trace::TraceId, r: f64) -> bool {
    if r >= 1.0 {
        return true;
    }
    let bound = (r * (1u64 << 63) as f64) as u64;
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id.0[8..]);
    u64::from_be_bytes(low) >> 1 < bound
}

/// `OTEL_TRACES_SAMPLER` (`name`) with `OTEL_TRACES_SAMPLER_ARG` (`arg`); an unknown
/// name, or a ratio that is not a number from 0 to 1, is refused naming its variable.
fn sampler(name: Option<&str>, arg: Option<&str>) -> Result<Sampler, ConfigError> {
    let ratio = || -> Result<f64, ConfigError> {
        let Some(a) = arg.map(str::trim).filter(|a| !a.is_empty()) else {
            return Ok(1.0);
        };
        a.parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "{SAMPLER_ARG} = {:?}: expected the share of runs to trace, a number from 0 to 1",
                    heddle_core::text::clip(a, heddle_core::text::ECHO_MAX_CHARS)
                ))
            })
    };
    Ok(match name.map(str::trim).unwrap_or("") {
        "" | "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatio(ratio()?),
        "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
        "parentbased_traceidratio" => Sampler::ParentBased(Root::TraceIdRatio(ratio()?)),
        other => {
            return Err(ConfigError::new(format!(
                "{SAMPLER} = {:?}: expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
                heddle_core::text::clip(other, heddle_core::text::ECHO_MAX_CHARS)
            )));
        }
    })
}

/// HTTP headers as the OpenTelemetry variables give them (`name=value,…`, values
/// percent-decoded). Shown by name only: their values are often credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

impl Headers {
    /// `text` (`name=value,…`, from the variable `var`) as headers; a pair that is not
    /// a valid header is refused naming the variable and the header (never its value).
    fn parse(text: &str, var: &str) -> Result<Headers, ConfigError> {
        let mut out = Vec::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(ConfigError::new(format!(
                    "{var}: expected name=value pairs separated by commas"
                )));
            };
            let (name, value) = (name.trim(), percent_decode(value.trim()));
            let bad = http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || http::HeaderValue::from_str(&value).is_err();
            if bad {
                return Err(ConfigError::new(format!(
                    "{var}: {:?} is not a valid HTTP header (name or value)",
                    heddle_core::text::clip(name, heddle_core::text::ECHO_MAX_CHARS)
                )));
            }
            out.push((name.to_string(), value));
        }
        Ok(Headers(out))
    }
}

/// `%XX` escapes decoded (as the OpenTelemetry specification has header values
/// written); a `%` not followed by two hex digits stays as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// How long one export request may take unless a variable says otherwise (the
/// OpenTelemetry specification's default).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest export timeout taken: past it a request that never answers would keep
/// the exporter's one thread from sending anything else for longer than a scraper
/// waits to notice.
const MAX_EXPORT_TIMEOUT: Duration = Duration::from_secs(600);

/// Telemetry settings, checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TelemetrySettings {
    /// Where spans go; `None`: runs are not traced.
    pub traces: Option<TraceExport>,
    /// How the command line writes its log lines.
    pub log_format: LogFormat,
    /// The caller's span this process's runs go under (`TRACEPARENT` in its
    /// environment, as `heddle run` and a watchdog's workers get it); one that is not a
    /// valid `traceparent` is ignored (logged at debug level).
    pub parent: Option<TraceParent>,
    /// Labels the invocation metrics carry besides the outcome.
    pub metric_labels: Vec<MetricLabel>,
}

/// The variables read, standard ones first (OpenTelemetry's SDK specification).
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
/// The W3C name, as Windmill and OpenTelemetry's environment carriers spell it.
pub const TRACEPARENT: &str = "TRACEPARENT";
/// The export timeouts, in milliseconds, the traces' own first.
const TIMEOUTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
];
/// The request headers, the traces' own first.
const HEADERS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_HEADERS",
];
/// The request bodies' compression, the traces' own first.
const COMPRESSIONS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
];
const PROTOCOLS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];
/// Which runs are traced, and the sampler's argument (a ratio).
const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";

/// What a worker process of a watchdog needs to export as its watchdog does: the
/// standard OpenTelemetry variables (the watchdog passes each one that is set).
pub const PASSED_TO_WORKERS: &[&str] = &[
    TRACEPARENT,
    TRACES_ENDPOINT,
    ENDPOINT,
    SERVICE_NAME,
    SDK_DISABLED,
    TRACES_EXPORTER,
    PROTOCOLS[0],
    PROTOCOLS[1],
    HEADERS[1],
    HEADERS[0],
    COMPRESSIONS[1],
    COMPRESSIONS[0],
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_RESOURCE_ATTRIBUTES",
    SAMPLER,
    SAMPLER_ARG,
];

impl TelemetrySettings {
    /// `[telemetry]` of `config` under the process's environment, with `log_format`
    /// (a flag) over the file's.
    pub(crate) fn load(
        config: &Config,
        log_format: Option<LogFormat>,
    ) -> Result<TelemetrySettings, ConfigError> {
        let s: TelemetrySection = config.section("telemetry")?.unwrap_or_default();
        let mut t = resolve(&s, &config.display_path(), &|name| {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        })?;
        if let Some(f) = log_format {
            t.log_format = f;
        }
        Ok(t)
    }
}

impl TelemetrySettings {
    /// The settings the OpenTelemetry variables alone give (no configuration file):
    /// what a program that reads none (`heddle bench`) exports with.
    pub fn from_env() -> Result<TelemetrySettings, ConfigError> {
        resolve(&TelemetrySection::default(), "", &|name| {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        })
    }
}

/// What watches the runs of a process (its span exporter, its metrics), handed to the
/// code that ends a durable run without driving it: a cancel of a run nobody drives
/// (`heddle runs cancel`, the server's cancel), a rejected gate. The run's span is then
/// sent, and its ending counted, by [`Watch::ended`], read back from the run's log, as
/// a driver sends and counts the runs it ends: whoever writes an ending, the trace has
/// its root.
#[derive(Clone, Debug, Default)]
pub struct Watch {
    telemetry: Option<Arc<Telemetry>>,
    metrics: Option<Arc<Metrics>>,
}

impl Watch {
    /// Nothing watches: nothing is sent or counted.
    pub fn none() -> Watch {
        Watch::default()
    }

    /// A process that keeps no metrics (the command line): the exporter `settings`
    /// configure, started now when there is one. Dropping the last clone sends what is
    /// queued (waiting at most [`SHUTDOWN_WAIT`]).
    pub fn exporting(settings: &TelemetrySettings) -> Watch {
        Watch {
            telemetry: start(settings),
            metrics: None,
        }
    }

    /// With `telemetry` (the exporter) and `metrics`, either maybe absent.
    pub(crate) fn of(telemetry: Option<Arc<Telemetry>>, metrics: Option<Arc<Metrics>>) -> Watch {
        Watch { telemetry, metrics }
    }

    /// Sends the spans of durable run `run`, whose ending was just recorded in `store`
    /// by this process without a driver, and counts its ending: the run span (in the
    /// trace its log records, with every event of the log), the nodes its ending
    /// skipped, the attempts an owner that died left. `secrets` (the known secret
    /// values) are masked out of what is sent. Nothing is sent for a run recorded
    /// without a trace, nor counted without metrics. A log that cannot be read back is
    /// logged, never an error: the ending is recorded, only its span is lost.
    pub fn ended(&self, store: &dyn heddle_store::RunStore, run: &str, secrets: &[String]) {
        if self.telemetry.is_none() && self.metrics.is_none() {
            return;
        }
        let read = store
            .header(run)
            .and_then(|h| Ok((h, store.read(run, 0)?.records)));
        let (header, records) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    run_id = %run,
                    "run {run}: its ending is recorded, but its span was not sent (its log could not be read back: {e})"
                );
                return;
            }
        };
        let spans = match (
            self.telemetry.as_ref(),
            heddle_store::session::recorded_trace(&header, &records),
        ) {
            (Some(t), Some(trace)) => Some((
                t.clone(),
                Arc::new(heddle_core::trace::Traced::new(trace, t.salt())),
            )),
            _ => None,
        };
        let registry = heddle_kernel::SecretRegistry::default();
        for s in secrets {
            registry.register(s);
        }
        let types = header
            .run
            .plan
            .nodes
            .iter()
            .map(|n| (Arc::from(n.id.as_str()), Arc::from(n.node_type.as_str())))
            .collect();
        let info = crate::durable::run_info(&header);
        if let Some(t) = RunTracing::new(spans, self.metrics.clone(), info, &registry) {
            t.ended_in_log(&records, types);
        }
    }
}

/// Traces runs a program builds and starts with the kernel itself (`heddle bench`
/// times kernel runs), as the driver traces its own: one trace of its own per run, its
/// spans built from its events and sent to this process's exporter; and, when asked,
/// counts them in metrics as `heddle serve` counts every run (what always-on metrics
/// cost). Runs one after another: [`KernelTracer::prepare`] a run's options, then
/// [`KernelTracer::start`] it.
pub struct KernelTracer {
    telemetry: Option<Arc<Telemetry>>,
    sampler: Sampler,
    metrics: Option<Arc<Metrics>>,
    graph_name: String,
    next: std::sync::Mutex<Option<Arc<heddle_core::trace::Traced>>>,
}

impl KernelTracer {
    /// A tracer sending to the exporter `settings` configure, naming runs
    /// `graph_name`, and counting them in metrics of its own when `metrics`; `None`
    /// when neither is on.
    pub fn new(
        settings: &TelemetrySettings,
        graph_name: &str,
        metrics: bool,
    ) -> Option<KernelTracer> {
        let telemetry = start(settings);
        let metrics = metrics.then(|| Arc::new(Metrics::new(&settings.metric_labels, None)));
        if telemetry.is_none() && metrics.is_none() {
            return None;
        }
        Some(KernelTracer {
            telemetry,
            sampler: settings
                .traces
                .as_ref()
                .map_or_else(Sampler::default, |t| t.sampler),
            metrics,
            graph_name: graph_name.to_string(),
            next: std::sync::Mutex::new(None),
        })
    }

    /// The exporter its spans go to, if any: the program keeps it to send the last
    /// spans before it exits ([`Telemetry::shutdown`]), as the tracer itself is handed
    /// to a process-wide observer and never dropped.
    pub fn exporter(&self) -> Option<Arc<Telemetry>> {
        self.telemetry.clone()
    }

    /// Gives the next run a trace of its own (with an exporter), and has every
    /// invocation reported (with metrics, as a server's runs are).
    pub fn prepare(&self, opts: &mut heddle_kernel::runtime::RunOptions) {
        opts.every_invocation |= self.metrics.is_some();
        let Some(t) = &self.telemetry else { return };
        let trace_id = t.trace_id();
        let run = heddle_core::trace::RunTrace {
            trace_id,
            parent: None,
            span: t.span_id(),
            sampled: self.sampler.sampled(trace_id, None),
        };
        let traced = Arc::new(heddle_core::trace::Traced::new(run, t.salt()));
        opts.trace = Some(traced.clone());
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(traced);
    }

    /// Starts building the spans of `run` (built with options [`KernelTracer::prepare`]
    /// made, not started) and counting it; the future ends once its last span is
    /// queued (after the run's result is in).
    pub fn start(
        &self,
        run: &heddle_kernel::runtime::Run,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let traced = self.next.lock().unwrap_or_else(|e| e.into_inner()).take();
        let spans = self.telemetry.clone().zip(traced);
        let info = RunInfo {
            run_id: None,
            graph_name: self.graph_name.clone(),
            graph_digest: None,
            created: std::time::SystemTime::now(),
        };
        let tracing = RunTracing::new(
            spans,
            self.metrics.clone(),
            info,
            &heddle_kernel::SecretRegistry::default(),
        )?;
        let span = tracing.start(run);
        Some(Box::pin(async move {
            let (t, end) = span.finish().await;
            t.ended(end, None);
        }))
    }
}

/// `heddle bench` adds it to every bench run (`heddle_kernel::bench::observe`).
#[cfg(feature = "bench")]
impl heddle_kernel::bench::Observer for KernelTracer {
    fn options(&self, opts: &mut heddle_kernel::runtime::RunOptions) {
        self.prepare(opts);
    }

    fn started(
        &self,
        run: &heddle_kernel::runtime::Run,
    ) -> Option<heddle_kernel::BoxFuture<'static, ()>> {
        self.start(run)
    }
}

/// The settings from the section and the variables `env` reads (a variable over the
/// file, the file over the default, as every other setting).
fn resolve(
    s: &TelemetrySection,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TelemetrySettings, ConfigError> {
    let log_format = s.log_format.unwrap_or_default();
    let parent = env(TRACEPARENT).and_then(|t| parse_parent(&t, TRACEPARENT));
    let off = env(SDK_DISABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env(TRACES_EXPORTER).is_some_and(|v| v.eq_ignore_ascii_case("none"));
    let endpoint = if let Some(url) = env(TRACES_ENDPOINT) {
        Some(check_url(&url, TRACES_ENDPOINT)?)
    } else if let Some(base) = env(ENDPOINT) {
        Some(traces_url(&check_url(&base, ENDPOINT)?))
    } else if let Some(base) = s.otlp_endpoint.as_deref().filter(|b| !b.is_empty()) {
        let what = format!("{file}: section [telemetry]: otlp_endpoint");
        Some(traces_url(&check_url(base, &what)?))
    } else {
        None
    };
    let Some(endpoint) = endpoint.filter(|_| !off) else {
        return Ok(TelemetrySettings {
            traces: None,
            log_format,
            parent,
            metric_labels: s.metric_labels.clone(),
        });
    };
    for var in PROTOCOLS {
        if let Some(p) = env(var).filter(|p| p != "http/protobuf") {
            return Err(ConfigError::new(format!(
                "{var} = {p:?}: heddle sends traces over OTLP/HTTP with protobuf (http/protobuf); point the endpoint at the collector's HTTP port (4318) and unset {var}"
            )));
        }
    }
    let service_name = env(SERVICE_NAME)
        .or_else(|| s.service_name.clone())
        .unwrap_or_else(|| "heddle".into());
    let mut timeout = DEFAULT_EXPORT_TIMEOUT;
    if let Some((var, ms)) = TIMEOUTS.iter().find_map(|v| Some((*v, env(v)?))) {
        timeout = ms
            .trim()
            .parse::<u64>()
            .ok()
            .map(Duration::from_millis)
            .filter(|t| !t.is_zero() && *t <= MAX_EXPORT_TIMEOUT)
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "{var} = {:?}: expected a whole number of milliseconds from 1 to {}",
                    heddle_core::text::clip(&ms, heddle_core::text::ECHO_MAX_CHARS),
                    MAX_EXPORT_TIMEOUT.as_millis()
                ))
            })?;
    }
    let headers = match HEADERS.iter().find_map(|v| Some((*v, env(v)?))) {
        Some((var, text)) => Headers::parse(&text, var)?,
        None => Headers::default(),
    };
    let gzip = match COMPRESSIONS.iter().find_map(|v| Some((*v, env(v)?))) {
        None => false,
        Some((var, text)) => match text.trim() {
            "gzip" => true,
            "none" | "" => false,
            other => {
                return Err(ConfigError::new(format!(
                    "{var} = {:?}: expected gzip or none",
                    heddle_core::text::clip(other, heddle_core::text::ECHO_MAX_CHARS)
                )));
            }
        },
    };
    let sampler = sampler(env(SAMPLER).as_deref(), env(SAMPLER_ARG).as_deref())?;
    Ok(TelemetrySettings {
        traces: Some(TraceExport {
            endpoint,
            service_name,
            timeout,
            headers,
            gzip,
            sampler,
        }),
        log_format,
        parent,
        metric_labels: s.metric_labels.clone(),
    })
}

/// `text` as a caller's `traceparent` (from `what`); one that is not valid is ignored,
/// with a debug log line, never refused: a caller's broken tracing must not stop a run.
pub fn parse_parent(text: &str, what: &str) -> Option<TraceParent> {
    match TraceParent::parse(text) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::debug!("{what} ignored: {e}");
            None
        }
    }
}

/// `url` when it is an absolute http(s) URL with a host; refused naming `what`.
fn check_url(url: &str, what: &str) -> Result<String, ConfigError> {
    let bad = |why: String| {
        ConfigError::new(format!(
            "{what} = {:?}: {why}",
            heddle_core::text::clip(url, heddle_core::text::ECHO_MAX_CHARS)
        ))
    };
    let uri: http::Uri = url.parse().map_err(|e| {
        bad(format!(
            "not a URL ({e}); expected e.g. http://collector:4318"
        ))
    })?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(bad(
                "expected an http:// or https:// URL, e.g. http://collector:4318".into(),
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("the URL names no host".into()));
    }
    Ok(url.to_string())
}

/// The traces URL under a base endpoint, as the OTLP specification builds it.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// How long a process that ends waits for its last spans to be sent.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// Starts the exporter of `settings`, when there is one.
pub(crate) fn start(settings: &TelemetrySettings) -> Option<Arc<Telemetry>> {
    settings
        .traces
        .as_ref()
        .map(|t| Arc::new(Telemetry::start(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(section: &str, vars: &[(&str, &str)]) -> Result<TelemetrySettings, ConfigError> {
        let s: TelemetrySection = toml::from_str(section).unwrap();
        resolve(&s, "heddle.toml", &|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    fn endpoint(t: TelemetrySettings) -> Option<String> {
        t.traces.map(|t| t.endpoint)
    }

    #[test]
    fn the_variables_win_over_the_file_and_bad_endpoints_are_refused_naming_them() {
        assert_eq!(endpoint(with("", &[]).unwrap()), None);
        let file = "otlp_endpoint = \"http://file:4318/\"";
        assert_eq!(
            endpoint(with(file, &[]).unwrap()).as_deref(),
            Some("http://file:4318/v1/traces")
        );
        assert_eq!(
            endpoint(with(file, &[(ENDPOINT, "https://env:4318")]).unwrap()).as_deref(),
            Some("https://env:4318/v1/traces")
        );
        assert_eq!(
            endpoint(
                with(
                    file,
                    &[(ENDPOINT, "http://env"), (TRACES_ENDPOINT, "http://t/x")]
                )
                .unwrap()
            )
            .as_deref(),
            Some("http://t/x")
        );
        assert_eq!(
            endpoint(with(file, &[(SDK_DISABLED, "true")]).unwrap()),
            None
        );
        let t = with(file, &[(SERVICE_NAME, "billing")]).unwrap();
        assert_eq!(t.traces.unwrap().service_name, "billing");
        for (section, vars, named) in [
            (
                "otlp_endpoint = \"collector:4318\"",
                &[][..],
                "otlp_endpoint",
            ),
            ("", &[(ENDPOINT, "ftp://x")][..], ENDPOINT),
            ("", &[(TRACES_ENDPOINT, "http://")][..], TRACES_ENDPOINT),
            ("", &[(ENDPOINT, "http://a b")][..], ENDPOINT),
            (file, &[(PROTOCOLS[1], "grpc")][..], PROTOCOLS[1]),
        ] {
            let e = with(section, vars).unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        let e = with("otlp_endpoint = \"x\"", &[]).unwrap_err().to_string();
        assert!(e.starts_with("heddle.toml: section [telemetry]"), "{e}");
        let t = |vars: &[(&str, &str)]| with(file, vars).map(|t| t.traces.unwrap().timeout);
        assert_eq!(t(&[]).unwrap(), DEFAULT_EXPORT_TIMEOUT);
        assert_eq!(
            t(&[(TIMEOUTS[1], "2500")]).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            t(&[(TIMEOUTS[1], "2500"), (TIMEOUTS[0], "30000")]).unwrap(),
            Duration::from_secs(30)
        );
        for bad in ["0", "10s", "-1", "600001"] {
            let e = t(&[(TIMEOUTS[1], bad)]).unwrap_err().to_string();
            assert!(e.contains(TIMEOUTS[1]), "{e}");
        }
        let json = with("log_format = \"json\"", &[]).unwrap();
        assert_eq!(json.log_format, LogFormat::Json);
    }

    #[test]
    fn headers_are_read_decoded_and_a_bad_one_is_refused_without_its_value() {
        let file = "otlp_endpoint = \"http://file:4318/\"";
        let h = |vars: &[(&str, &str)]| with(file, vars).map(|t| t.traces.unwrap().headers);
        assert_eq!(h(&[]).unwrap(), Headers::default());
        assert_eq!(
            h(&[(HEADERS[1], "api-key=a%20b%3D, x-tenant = t1 ,")])
                .unwrap()
                .0,
            [
                ("api-key".to_string(), "a b=".to_string()),
                ("x-tenant".to_string(), "t1".to_string())
            ]
        );
        // The traces' own variable wins; a lone `%` stays.
        assert_eq!(
            h(&[(HEADERS[1], "a=1"), (HEADERS[0], "b=50%")]).unwrap().0,
            [("b".to_string(), "50%".to_string())]
        );
        let e = h(&[(HEADERS[1], "bad name=s3cret")])
            .unwrap_err()
            .to_string();
        assert!(e.contains(HEADERS[1]) && !e.contains("s3cret"), "{e}");
        let e = h(&[(HEADERS[0], "novalue")]).unwrap_err().to_string();
        assert!(e.contains(HEADERS[0]), "{e}");
        let shown = format!("{:?}", h(&[(HEADERS[1], "k=s3cret")]).unwrap());
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn the_sampler_is_read_and_decides_by_trace_id_and_caller() {
        use heddle_core::trace::{SpanId, TraceId};
        let file = "otlp_endpoint = \"http://file:4318/\"";
        let s = |vars: &[(&str, &str)]| with(file, vars).map(|t| t.traces.unwrap().sampler);
        assert_eq!(s(&[]).unwrap(), Sampler::ParentBased(Root::AlwaysOn));
        assert_eq!(s(&[(SAMPLER, "always_off")]).unwrap(), Sampler::AlwaysOff);
        assert_eq!(
            s(&[(SAMPLER, "traceidratio"), (SAMPLER_ARG, "0.25")]).unwrap(),
            Sampler::TraceIdRatio(0.25)
        );
        assert_eq!(
            s(&[(SAMPLER, "parentbased_traceidratio")]).unwrap(),
            Sampler::ParentBased(Root::TraceIdRatio(1.0))
        );
        // The argument only matters to a ratio.
        assert_eq!(
            s(&[(SAMPLER, "always_on"), (SAMPLER_ARG, "x")]).unwrap(),
            Sampler::AlwaysOn
        );
        for (vars, named) in [
            (&[(SAMPLER, "sometimes")][..], SAMPLER),
            (
                &[(SAMPLER, "traceidratio"), (SAMPLER_ARG, "1.5")][..],
                SAMPLER_ARG,
            ),
            (
                &[(SAMPLER, "traceidratio"), (SAMPLER_ARG, "half")][..],
                SAMPLER_ARG,
            ),
        ] {
            let e = s(vars).unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        // Without an endpoint nothing is traced, and nothing is read.
        assert!(
            with("", &[(SAMPLER, "sometimes")])
                .unwrap()
                .traces
                .is_none()
        );

        let id = |low: u64| {
            let mut b = [0x4b; 16];
            b[8..].copy_from_slice(&low.to_be_bytes());
            TraceId(b)
        };
        let parent = |sampled| TraceParent {
            trace_id: id(1),
            span_id: SpanId([1; 8]),
            sampled,
        };
        let (low, high) = (id(1 << 60), id(u64::MAX));
        let half = Sampler::TraceIdRatio(0.5);
        assert!(half.sampled(low, None) && !half.sampled(high, None));
        assert!(
            half.sampled(low, Some(&parent(false))),
            "a ratio ignores the caller"
        );
        assert!(!Sampler::TraceIdRatio(0.0).sampled(id(0), None));
        assert!(Sampler::TraceIdRatio(1.0).sampled(high, None));
        let pb = Sampler::ParentBased(Root::TraceIdRatio(0.5));
        assert!(pb.sampled(high, Some(&parent(true))));
        assert!(!pb.sampled(low, Some(&parent(false))));
        assert!(!pb.sampled(high, None) && pb.sampled(low, None));
        assert!(Sampler::AlwaysOn.sampled(high, Some(&parent(false))));
        assert!(!Sampler::AlwaysOff.sampled(low, Some(&parent(true))));
        let off = Sampler::ParentBased(Root::AlwaysOff);
        assert!(!off.sampled(low, None) && off.sampled(low, Some(&parent(true))));
        assert!(!Sampler::default().sampled(low, Some(&parent(false))));
        assert!(Sampler::default().sampled(low, None));
    }

    #[test]
    fn metric_labels_are_read_and_an_unknown_one_is_refused() {
        let s = with("metric_labels = [\"node_type\", \"graph\"]", &[]).unwrap();
        assert_eq!(s.metric_labels, [MetricLabel::NodeType, MetricLabel::Graph]);
        assert!(toml::from_str::<TelemetrySection>("metric_labels = [\"pod\"]").is_err());
    }
}
