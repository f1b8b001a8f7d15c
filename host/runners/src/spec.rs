//! What a run is asked to do ([`RunSpec`]) and what it reports back ([`Line`], [`Exit`]):
//! plain data shared by the runner front end and both backends, so neither backend
//! depends on the other or on the front end.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::Sandbox;

/// Where the code runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A fresh container per run, with the [`Sandbox`] applied by the engine.
    #[default]
    Docker,
    /// A host child process in its own process group: no isolation beyond the time
    /// limit, the output cap and the group kill.
    Subprocess,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "docker" => Some(Mode::Docker),
            "subprocess" => Some(Mode::Subprocess),
            _ => None,
        }
    }
}

/// Which output stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout = 0,
    Stderr = 1,
}

/// One line of output, without its line terminator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub stream: Stream,
    pub text: String,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub mode: Mode,
    /// Docker mode only.
    pub image: String,
    /// Program and arguments (no shell is involved unless `argv` names one).
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub sandbox: Sandbox,
    /// Extra container labels (the runner adds its own, see [`crate::LABEL_RUNNER`]).
    pub labels: Vec<(String, String)>,
    /// A stdout line starting with this text is captured as [`Exit::result`] instead of
    /// being forwarded.
    pub result_marker: Option<String>,
    /// Put in the container name, for whoever reads `docker ps` (usually the node id).
    pub name_hint: String,
}

impl RunSpec {
    /// Labels the container with the durable run `ctx` belongs to, when it does
    /// ([`crate::LABEL_RUN`]): whoever takes the run over after this process was killed
    /// finds and removes it by the run.
    pub fn label_run(&mut self, ctx: &heddle_kernel::NodeCtx) {
        if let Some(run) = ctx.run_id() {
            self.labels
                .push((crate::LABEL_RUN.to_string(), run.to_string()));
        }
    }

    pub fn new(mode: Mode, image: impl Into<String>, argv: Vec<String>) -> Self {
        RunSpec {
            mode,
            image: image.into(),
            argv,
            env: Vec::new(),
            sandbox: Sandbox::default(),
            labels: Vec::new(),
            result_marker: None,
            name_hint: "code".into(),
        }
    }
}

/// How a run ended. A non-zero `code`, `timed_out` or `oom_killed` is the code's
/// failure, not the runner's; the caller decides what it means.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exit {
    /// Exit code, when the program exited by itself.
    pub code: Option<i64>,
    /// Signal that ended the process (subprocess mode).
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Ended by [`crate::Running::stop`] (or by dropping the [`crate::Running`]).
    pub stopped: bool,
    pub oom_killed: bool,
    /// The output limit was reached and later output dropped.
    pub truncated: bool,
    /// Text after the result marker on the last marker line.
    pub result: Option<String>,
    /// Last non-blank stdout line (not a marker line).
    pub last_stdout: Option<String>,
    /// The last few KiB of stderr.
    pub stderr_tail: String,
    pub elapsed: Duration,
}

impl Exit {
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out && !self.stopped && !self.oom_killed
    }
}
