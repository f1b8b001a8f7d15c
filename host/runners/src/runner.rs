//! The front end that starts a [`RunSpec`] in its mode's backend ([`crate::docker`] or
//! [`crate::subprocess`]) and holds the Docker connection.

use std::sync::Arc;

use tokio::sync::OnceCell;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::running::Running;
use crate::spec::{Mode, RunSpec};
use crate::subprocess::OrphanSweep;

/// Starts runs in either mode. Holds the Docker connection, made on first use so a
/// subprocess-only user never needs an engine.
#[derive(Clone, Default)]
pub struct Runner {
    docker_host: Option<String>,
    docker: Arc<OnceCell<bollard::Docker>>,
    swept: Arc<OnceCell<()>>,
    /// The id of the engine's server network, once a server needed it.
    server_network: Arc<OnceCell<String>>,
}

impl Runner {
    pub fn new(docker_host: Option<String>) -> Self {
        Runner {
            docker_host,
            docker: Arc::new(OnceCell::new()),
            swept: Arc::new(OnceCell::new()),
            server_network: Arc::new(OnceCell::new()),
        }
    }

    /// The id of the network server containers join ([`crate::SERVER_NETWORK`]), made
    /// on the engine by the first server that needs it.
    pub async fn server_network(&self) -> Result<String, RunnerError> {
        let docker = self.docker().await?;
        self.server_network
            .get_or_try_init(|| crate::docker::server_network(docker))
            .await
            .cloned()
    }

    /// The Docker client, connecting (and negotiating the API version) on first use.
    /// The first connection also removes the containers dead heddles of this host left
    /// on the engine ([`crate::remove_orphans`]).
    pub async fn docker(&self) -> Result<&bollard::Docker, RunnerError> {
        self.docker
            .get_or_try_init(|| async {
                let docker = crate::docker::connect_docker(self.docker_host.as_deref()).await?;
                match crate::docker::remove_orphans(&docker).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        removed = n,
                        "removed containers left by heddle processes that are gone"
                    ),
                    // Not this run's problem: its own containers are unaffected.
                    Err(e) => tracing::warn!(error = %e, "could not remove leftover containers"),
                }
                Ok(docker)
            })
            .await
    }

    /// Kills and removes what subprocess-mode runs of dead heddles left on this host
    /// ([`crate::remove_orphan_processes`]), once per runner: before its first code node
    /// starts, so the next run cleans up after one that was killed.
    pub async fn sweep_orphan_processes(&self) {
        self.swept
            .get_or_init(|| async {
                match tokio::task::spawn_blocking(crate::subprocess::remove_orphan_processes).await
                {
                    Ok(Ok(s)) if s == OrphanSweep::default() => {}
                    Ok(Ok(s)) => tracing::info!(
                        processes = s.processes,
                        directories = s.directories,
                        "removed what subprocess runs of heddle processes that are gone left"
                    ),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "could not remove leftover code processes")
                    }
                    Err(e) => tracing::warn!(error = %e, "leftover sweep did not finish"),
                }
            })
            .await;
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

    /// The start runs as a task of its own (on `tracker` when given), not in the
    /// caller's future: between creating a container (or spawning a process) and
    /// handing over the [`Running`] whose driver removes it there are awaits (attach,
    /// start), and a caller dropped there (a node's time limit, a cancelled run) would
    /// otherwise leave what it created behind, with no driver to remove it. A start
    /// whose caller went away ends with its [`Running`] dropped, which stops the run;
    /// its driver then removes it, tracked like any other.
    async fn start_in(
        &self,
        spec: RunSpec,
        tracker: Option<&TaskTracker>,
    ) -> Result<Running, RunnerError> {
        if spec.argv.is_empty() {
            return Err(RunnerError::EmptyCommand);
        }
        let runner = self.clone();
        let drivers = tracker.cloned();
        let start = async move {
            let tracker = drivers.as_ref();
            match spec.mode {
                Mode::Docker => {
                    let docker = runner.docker().await?.clone();
                    crate::docker::start(docker, spec, tracker).await
                }
                Mode::Subprocess => crate::subprocess::start(spec, tracker).await,
            }
        };
        let task = match tracker {
            Some(t) => t.spawn(start),
            None => tokio::spawn(start),
        };
        match task.await {
            Ok(started) => started,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(RunnerError::StartGone),
        }
    }
}

/// Starts `spec` with a one-off [`Runner`] (connects to Docker for this run only).
pub async fn start(spec: RunSpec) -> Result<Running, RunnerError> {
    Runner::default().start(spec).await
}
