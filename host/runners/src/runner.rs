//! The front end that starts a [`RunSpec`] in its mode's backend ([`crate::docker`] or
//! [`crate::subprocess`]) and holds the Docker connection.

use std::sync::Arc;

use tokio::sync::OnceCell;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::running::Running;
use crate::spec::{Mode, RunSpec};

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
    /// the [`crate::Exit`].
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
            return Err(RunnerError::EmptyCommand);
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

/// Starts `spec` with a one-off [`Runner`] (connects to Docker for this run only).
pub async fn start(spec: RunSpec) -> Result<Running, RunnerError> {
    Runner::default().start(spec).await
}
