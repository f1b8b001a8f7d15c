//! What the libraries log, printed as the command line prints its own lines: the
//! runtime's and the server's `tracing` events at info and above go to stderr as one
//! line each, `warning: ` before a warning and `error: ` before an error, every line
//! clipped ([`crate::exit::bounded`]). Other crates' events stay silent, as they were
//! before the libraries logged through `tracing`.
//!
//! With the JSON log format (`--log-format json`, `[telemetry] log_format = "json"`)
//! the same events are one JSON object per line instead (tracing-subscriber's JSON
//! formatter, fields flattened): `timestamp` (RFC 3339, UTC), `level`, `target`,
//! `message`, and the event's fields (`run_id`, `node_id` where the event is about
//! one). The command line's own lines of a server and a watchdog ([`say`]) and its
//! final error take that form too (target `heddle::cli`), so a log shipper reads one
//! format. The format is chosen after the settings are read, so both layers are
//! installed and a switch picks one.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use heddle_runtime::telemetry::LogFormat;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{DynFilterFn, FilterExt as _, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

/// Whether lines are JSON (set once the settings are read).
static JSON: AtomicBool = AtomicBool::new(false);

/// The target of the command line's own lines in the JSON format.
const CLI: &str = "heddle::cli";

/// Installs the console as the process's `tracing` subscriber (once; later calls, and a
/// subscriber already installed, leave it as it is).
pub fn install() {
    let targets = Targets::new()
        .with_target("heddle_runtime", Level::INFO)
        .with_target("heddle_server", Level::INFO)
        .with_target(CLI, Level::INFO);
    // Asked at every event (a dynamic filter is not cached per call site): the format
    // is set after the first events may have been seen.
    let human = targets.clone().and(DynFilterFn::new(|_, _| !json()));
    let as_json = targets.and(DynFilterFn::new(|_, _| json()));
    let json_lines = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry()
        .with(Console.with_filter(human))
        .with(json_lines.with_filter(as_json))
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
/// start and stop): as it is in the human format, an info event of target
/// `heddle::cli` in the JSON one.
pub fn say(line: &str) {
    if json() {
        tracing::info!(target: CLI, "{line}");
    } else {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// [`say`] about run `run`: its JSON object names it (`run_id`).
pub fn say_run(line: &str, run: &str) {
    if json() {
        tracing::info!(target: CLI, run_id = run, "{line}");
    } else {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// The command's final error: `error: TEXT` in the human format, an error event of
/// target `heddle::cli` in the JSON one.
pub fn error(text: &str) {
    if json() {
        tracing::error!(target: CLI, "{text}");
    } else {
        let _ = writeln!(std::io::stderr().lock(), "error: {text}");
    }
}

/// Writes each event's message as a line of stderr.
struct Console;

impl<S: Subscriber> Layer<S> for Console {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
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
