//! What the libraries log, printed as the command line prints its own lines: the
//! runtime's and the server's `tracing` events at info and above go to stderr as one
//! line each, `warning: ` before a warning and `error: ` before an error, every line
//! clipped ([`crate::exit::bounded`]). Other crates' events stay silent, as they were
//! before the libraries logged through `tracing`.

use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

/// Installs the console as the process's `tracing` subscriber (once; later calls, and a
/// subscriber already installed, leave it as it is).
pub fn install() {
    let targets = Targets::new()
        .with_target("heddle_runtime", Level::INFO)
        .with_target("heddle_server", Level::INFO);
    let _ = tracing_subscriber::registry()
        .with(Console.with_filter(targets))
        .try_init();
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
