//! The operator's `[runners]` section of `heddle.toml`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Operator configuration of the code runners. Everything here is the operator's call,
/// not the workflow author's: a graph file can pick an image or tighten the sandbox, but
/// only this section can allow unsandboxed subprocess mode or host directories.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RunnersConfig {
    /// Default image per language (a node's `image` property overrides it).
    pub images: ImageNames,
    /// Subprocess mode runs user code on the host with the host user's rights; off unless
    /// the operator turns it on.
    pub allow_subprocess: bool,
    /// Host directories a node may bind-mount as its workspace (the node's `workspace`
    /// must be one of them or lie inside one). Empty: no workspace mounts.
    pub workspace_roots: Vec<PathBuf>,
    /// Docker endpoint (`unix:///var/run/docker.sock`, `tcp://…`); unset: `DOCKER_HOST`
    /// or the local socket.
    pub docker_host: Option<String>,
    /// How `heddle images build` builds the images.
    pub build: ImageBuildConfig,
}

/// Image names per language. Stock images work too (`python:3.12-slim`, `node:22-slim`,
/// `bash:5.2`, `ruby:3.3-slim`) for an operator with a registry; the defaults are the ones
/// `heddle images build` makes locally.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ImageNames {
    pub python: String,
    pub javascript: String,
    /// Used by `code.bash` and `code.shell`.
    pub bash: String,
    pub ruby: String,
    /// Needs `lua` and the `cjson` module (Debian: `lua5.4`, `lua-cjson`).
    pub lua: String,
}

impl Default for ImageNames {
    fn default() -> Self {
        ImageNames {
            python: "heddle/python:1".into(),
            javascript: "heddle/node:1".into(),
            bash: "heddle/bash:1".into(),
            ruby: "heddle/ruby:1".into(),
            lua: "heddle/lua:1".into(),
        }
    }
}

/// How images are built (the `[runners.build]` section).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ImageBuildConfig {
    /// Debian suite; unset: the host's (`VERSION_CODENAME` in /etc/os-release), else
    /// `bookworm`.
    pub suite: Option<String>,
    /// Debian mirror; unset: the first Debian URI of the host's apt sources, else
    /// debootstrap's own default.
    pub mirror: Option<String>,
    /// Downloaded packages, kept between builds so a rebuild needs no network.
    pub cache_dir: PathBuf,
    /// Scratch space for the root filesystems (each removed after its import).
    pub work_dir: PathBuf,
}

impl Default for ImageBuildConfig {
    fn default() -> Self {
        ImageBuildConfig {
            suite: None,
            mirror: None,
            cache_dir: "/var/cache/heddle/debs".into(),
            work_dir: "/var/cache/heddle/build".into(),
        }
    }
}
