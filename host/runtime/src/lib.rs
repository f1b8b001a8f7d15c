//! Heddle as a library: what a program embedding Heddle uses to run graphs, in memory or
//! durably, the way the `heddle` command line and `heddle serve` do.
//!
//! - [`Settings`]: flags and `heddle.toml` resolved once into typed settings.
//! - [`Runtime`]: created once; the node registry (built-ins, WASM packages, code
//!   nodes) every run is planned against, and the run options (the secret set built
//!   before the first event).
//! - [`Drive`]: THE run driver, one per run, in memory or durable: begin, resume, adopt,
//!   cancel, interrupt, stop, the run time limit and the ending.
//! - [`durable`]: what a durable run records, and taking a recorded run over again.
//! - [`watch`]: the watchdog, which runs a durable run in a worker process it restarts.
//!
//! It logs through `tracing` (targets `heddle_runtime::*`) and returns typed errors
//! ([`Error`]).

pub mod config;
pub mod driver;
pub mod durable;
pub mod error;
pub mod exit;
pub mod providers;
pub mod report;
pub mod secrets;
pub mod settings;
pub mod watch;

pub use config::Config;
pub use driver::{Control, Drive, Finished, Prepared, Running};
pub use error::{ConfigError, Error, Refused, SecretInput};
pub use exit::Exit;
pub use providers::{Runtime, graph_types};
pub use settings::{Overrides, ServeOverrides, Settings, StoreSettings, Supervise};

/// The tokio runtime runs are driven on: `threads` workers (`None`: one per core); 1 is
/// a current-thread runtime, so a measurement with one thread sees the scheduler
/// without any cross-thread wake-ups.
pub fn tokio_runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all().thread_name("heddle").build()
}
