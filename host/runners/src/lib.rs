//! Code runners and code nodes: user snippets (Python, JavaScript, Bash, shell commands)
//! run as nodes, sandboxed one node at a time.
//!
//! Two execution modes share one streaming interface ([`Running`]):
//! - `docker` (default): a fresh container per invocation, started through bollard
//!   against the local engine, with the security defaults of [`Sandbox`];
//! - `subprocess`: a local child process in its own process group. It is *not* a
//!   sandbox (only the time limit, output cap and group kill apply), so the operator must
//!   allow it explicitly (`[runners] allow_subprocess = true`).
//!
//! The nodes (`code.python`, `code.javascript`, `code.bash`, `code.shell`, `code.ruby`,
//! `code.lua`, and `code.server`, which keeps a server running for the rest of the run
//! and hands on its endpoint) come from
//! [`CodeNodes`], a [`heddle_kernel::NodeProvider`]. Images are built without a registry
//! by [`build_images`]. User documentation: `host/runners/README.md`.

mod config;
mod docker;
mod error;
mod images;
mod lines;
mod nodes;
mod owner;
mod process;
mod runner;
mod running;
mod sandbox;
mod spec;
mod subprocess;

pub use config::{ImageBuildConfig, ImageNames, RunnersConfig};
pub use docker::{
    LABEL_NODE, LABEL_OWNER, LABEL_RUN, LABEL_RUNNER, SERVER_NETWORK, connect_docker, label_run,
    remove_leftovers, remove_orphans, remove_run_containers, run_containers, server_network,
};
pub use error::RunnerError;
pub use images::{BuildOptions, ImageOutcome, ImagesError, build_images};
pub use nodes::{CodeNodes, Language, RESULT_MARKER};
pub use owner::ProcessOwner;
pub use process::{ProcessGroup, die_with_parent, group_dies_with_parent, kill_process};
pub use runner::{Runner, start};
pub use running::Running;
pub use sandbox::{Publish, Sandbox, Workspace};
pub use spec::{Exit, Line, Mode, RunSpec, Stream};
pub use subprocess::{OrphanSweep, owned_processes, remove_orphan_processes, sweep_owner};
