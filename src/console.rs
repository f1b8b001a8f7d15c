//! What the libraries log, printed as the command line prints its own lines: the
//! runtime's and the server's `tracing` events at info and above go to stderr as one
//! line each, `warning: ` before a warning and `error: ` before an error, every line
//! clipped ([`crate::exit::bounded`]). Other crates' events stay silent, as they were
//! before the libraries logged through `tracing`.
//!
//! With the JSON log format (`--log-format json`, `[telemetry] log_format = "json"`)
//! each line is one JSON object instead: `timestamp` (RFC 3339, UTC), `level`,
//! `target`, `message`, the event's other fields, and `run_id` and `node_id` when the
//! event, or a span it happened in, names them. The command line's own lines of a
//! server and a watchdog ([`say`]) take the same form, so a log shipper reads one
//! format.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use heddle_runtime::telemetry::LogFormat;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime as _;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Whether lines are JSON (set once the settings are read).
static JSON: AtomicBool = AtomicBool::new(false);

/// Installs the console as the process's `tracing` subscriber (once; later calls, and a
/// subscriber already installed, leave it as it is).
pub fn install() {
    let targets = Targets::new()
        .with_target("heddle_runtime", Level::INFO)
        .with_target("heddle_server", Level::INFO)
        .with_target("heddle", Level::INFO);
    let _ = tracing_subscriber::registry()
        .with(Console.with_filter(targets))
        .try_init();
}

/// Writes every line from now on in `format`.
pub fn set_format(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
}

/// Whether lines are written as JSON.
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// One of the command line's own lines of a server or a watchdog (what it says at its
/// start and stop): as it is in the human format, a JSON object (level info, target
/// `heddle`, `run_id` when it is about one) in the JSON one.
pub fn say(line: &str, run_id: Option<&str>) {
    if !json() {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
        return;
    }
    let mut fields = Map::new();
    fields.insert("message".into(), line.into());
    if let Some(r) = run_id {
        fields.insert("run_id".into(), r.into());
    }
    write_json("INFO", "heddle", fields);
}

/// A writer that turns each line written to it into a JSON object (level info, target
/// `target`, `run_id`): a watchdog's worker's stderr, passed on in a JSON log.
pub struct JsonLines {
    target: &'static str,
    run_id: String,
    pending: Vec<u8>,
}

impl JsonLines {
    pub fn new(target: &'static str, run_id: &str) -> JsonLines {
        JsonLines {
            target,
            run_id: run_id.to_string(),
            pending: Vec::new(),
        }
    }

    fn line(&self, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let mut fields = Map::new();
        fields.insert("message".into(), text.trim_end_matches('\r').into());
        fields.insert("run_id".into(), self.run_id.clone().into());
        write_json("INFO", self.target, fields);
    }
}

impl std::io::Write for JsonLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let rest = self.pending.split_off(i + 1);
            let line = std::mem::replace(&mut self.pending, rest);
            self.line(&line[..line.len() - 1]);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for JsonLines {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let last = std::mem::take(&mut self.pending);
            self.line(&last);
        }
    }
}

fn write_json(level: &str, target: &str, fields: Map<String, Value>) {
    let mut timestamp = String::new();
    let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let mut line = Map::new();
    line.insert("timestamp".into(), timestamp.into());
    line.insert("level".into(), level.into());
    line.insert("target".into(), target.into());
    line.extend(fields);
    let mut text = Value::Object(line).to_string();
    text.push('\n');
    // One write per line, so lines of two threads never interleave.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Writes each event as a line of stderr.
struct Console;

/// The ids a span names (`run_id`, `node_id`), kept with it for the events inside.
#[derive(Default)]
struct Ids {
    run_id: Option<String>,
    node_id: Option<String>,
}

impl Visit for Ids {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "run_id" => self.run_id = Some(value.to_string()),
            "node_id" => self.node_id = Some(value.to_string()),
            _ => {}
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Console {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut ids = Ids::default();
        attrs.record(&mut ids);
        if (ids.run_id.is_some() || ids.node_id.is_some())
            && let Some(span) = ctx.span(id)
        {
            span.extensions_mut().insert(ids);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if json() {
            let mut fields = Fields(Map::new());
            event.record(&mut fields);
            let mut fields = fields.0;
            // The innermost span naming an id, where the event names none itself.
            if let Some(scope) = ctx.event_scope(event) {
                for span in scope {
                    if let Some(ids) = span.extensions().get::<Ids>() {
                        for (k, v) in [("run_id", &ids.run_id), ("node_id", &ids.node_id)] {
                            if let Some(v) = v
                                && !fields.contains_key(k)
                            {
                                fields.insert(k.into(), v.clone().into());
                            }
                        }
                    }
                }
            }
            let meta = event.metadata();
            write_json(meta.level().as_str(), meta.target(), fields);
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let prefix = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            _ => "",
        };
        let line = format!("{prefix}{}\n", crate::exit::bounded(&message.0));
        // One write per line, so lines of two threads never interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// An event's `message` field.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_string();
        }
    }
}

/// An event's fields as JSON (numbers and booleans as such, the rest as text).
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}
