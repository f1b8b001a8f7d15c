//! The streaming runner interface shared by both execution modes.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
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
    /// Ended by [`Running::stop`] (or by dropping the [`Running`]).
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

/// A run in progress. Lines arrive through [`Running::next_line`] as the code prints
/// them; [`Running::wait`] gives the [`Exit`]. Dropping it stops the run; the cleanup
/// (container removal, group kill) happens in the driver task either way.
pub struct Running {
    lines: mpsc::Receiver<Line>,
    done: Option<oneshot::Receiver<Result<Exit, RunnerError>>>,
    stop: CancellationToken,
    /// Container id (docker) or process id (subprocess).
    pub id: String,
    /// Warnings from the engine at creation (e.g. a limit the kernel cannot apply).
    pub warnings: Vec<String>,
}

impl Running {
    pub(crate) fn new(
        lines: mpsc::Receiver<Line>,
        done: oneshot::Receiver<Result<Exit, RunnerError>>,
        stop: CancellationToken,
        id: String,
        warnings: Vec<String>,
    ) -> Self {
        Running {
            lines,
            done: Some(done),
            stop,
            id,
            warnings,
        }
    }

    /// The next output line; `None` once the output has ended (or the run was stopped).
    pub async fn next_line(&mut self) -> Option<Line> {
        self.lines.recv().await
    }

    /// Asks the run to stop: the container is force-removed, or the process group gets
    /// SIGTERM then SIGKILL after the grace period. [`Running::wait`] then returns once
    /// the cleanup is done.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Waits for the end of the run and its cleanup. Lines not yet read are dropped.
    pub async fn wait(mut self) -> Result<Exit, RunnerError> {
        self.lines.close();
        while self.lines.recv().await.is_some() {}
        match self.done.take() {
            Some(rx) => rx.await.unwrap_or_else(|_| {
                Err(RunnerError::Invalid(
                    "the runner task ended without reporting (runtime shutting down?)".into(),
                ))
            }),
            None => Err(RunnerError::Invalid("run already waited for".into())),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.stop.cancel();
        }
    }
}

/// Starts runs in either mode. Holds the Docker connection, made on first use so a
/// subprocess-only user never needs an engine.
#[derive(Clone, Default)]
pub struct Runner {
    docker_host: Option<String>,
    docker: Arc<OnceCell<bollard::Docker>>,
}

impl Runner {
    pub fn new(docker_host: Option<String>) -> Self {
        Runner {
            docker_host,
            docker: Arc::new(OnceCell::new()),
        }
    }

    /// The Docker client, connecting (and negotiating the API version) on first use.
    pub async fn docker(&self) -> Result<&bollard::Docker, RunnerError> {
        self.docker
            .get_or_try_init(|| crate::docker::connect_docker(self.docker_host.as_deref()))
            .await
    }

    /// Starts the code. Returns once it is running: problems with the setup (no engine,
    /// missing image, program not found) are errors here; the code's own failure is in
    /// the [`Exit`].
    pub async fn start(&self, spec: RunSpec) -> Result<Running, RunnerError> {
        self.start_in(spec, None).await
    }

    /// Like [`Runner::start`], with the run's driver task (which owns the cleanup)
    /// spawned on `tracker`, so the caller can wait until every container or process it
    /// started is gone, even runs whose [`Running`] was dropped mid-flight.
    pub async fn start_tracked(
        &self,
        spec: RunSpec,
        tracker: &TaskTracker,
    ) -> Result<Running, RunnerError> {
        self.start_in(spec, Some(tracker)).await
    }

    async fn start_in(
        &self,
        spec: RunSpec,
        tracker: Option<&TaskTracker>,
    ) -> Result<Running, RunnerError> {
        if spec.argv.is_empty() {
            return Err(RunnerError::Invalid("empty command".into()));
        }
        match spec.mode {
            Mode::Docker => {
                let docker = self.docker().await?.clone();
                crate::docker::start(docker, spec, tracker).await
            }
            Mode::Subprocess => crate::subprocess::start(spec, tracker).await,
        }
    }
}

/// Capacity of the line channel: enough to absorb bursts, small enough that a slow
/// consumer applies backpressure to the reader instead of growing memory.
pub(crate) const LINE_BUFFER: usize = 256;

/// Starts `spec` with a one-off [`Runner`] (connects to Docker for this run only).
pub async fn start(spec: RunSpec) -> Result<Running, RunnerError> {
    Runner::default().start(spec).await
}

/// Spawns a driver task on `tracker` when given, else on the runtime.
pub(crate) fn spawn_driver<F>(tracker: Option<&TaskTracker>, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match tracker {
        Some(t) => {
            t.spawn(fut);
        }
        None => {
            tokio::spawn(fut);
        }
    }
}
