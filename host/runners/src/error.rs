//! Why a runner could not run the code at all (the code's own failure is an
//! [`crate::Exit`]).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunnerError {
    #[error(
        "no Docker engine answers at {endpoint}: {source}. Start one (`scripts/docker-up`, \
         `sudo systemctl start docker`, or `sudo dockerd &`), or set the node property \
         `mode` to \"subprocess\" (needs `[runners] allow_subprocess = true`)"
    )]
    NoEngine {
        endpoint: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error(
        "image `{image}` is not in the local Docker engine; build the runner images with \
         `heddle images build` (or `scripts/build-images`), or `docker pull {image}` if \
         you use a registry"
    )]
    MissingImage { image: String },
    #[error("Docker engine error while {action}: {source}")]
    Docker {
        action: &'static str,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("I/O error while {action}: {source}")]
    Io {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the scratch root {path} is not a private directory of this user; remove it (or \
         set TMPDIR elsewhere) so heddle can create it with mode 0700"
    )]
    UnsafeScratchRoot { path: std::path::PathBuf },
    #[error("nothing to run: the command line is empty")]
    EmptyCommand,
    #[error("`{program}` exited before its process id could be read")]
    NoPid { program: String },
    #[error("the run's driver task ended without reporting (runtime shutting down?)")]
    DriverGone,
    #[error("the run's start task ended without reporting (runtime shutting down?)")]
    StartGone,
    #[error("the Docker engine made the server network `heddle-servers` but does not list it")]
    NoServerNetwork,
    #[error("the run was already waited for")]
    AlreadyWaited,
}
