use thiserror::Error;

/// Why a runner could not run the code at all (the code's own failure is an [`crate::Exit`]).
#[derive(Debug, Error)]
pub enum RunnerError {
    #[error(
        "no Docker engine answers at {endpoint}: {detail}. Start one (`scripts/docker-up`, \
         `sudo systemctl start docker`, or `sudo dockerd &`), or set the node property \
         `mode` to \"subprocess\" (needs `[runners] allow_subprocess = true`)"
    )]
    NoEngine { endpoint: String, detail: String },
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
    #[error("{0}")]
    Invalid(String),
    #[error("I/O error while {action}: {source}")]
    Io {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}
