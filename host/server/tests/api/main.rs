//! The server's HTTP API in this process: every route's semantics (statuses, bodies,
//! the event stream, gates, escalations, artifacts, the layers) through
//! `heddle_server::api::router`, with a real runtime, real WASM and code nodes and a
//! real SQLite store on disk, but no socket and no `heddle serve` process. What needs a
//! process (a crash, adoption by the next server, signals, the lease, the browser)
//! stays in the root package's tests, which drive the binary.

mod support;

mod artifacts;
mod errors;
mod hosts;
mod layers;
mod run_supervisors;
mod runs;
mod supervise;
