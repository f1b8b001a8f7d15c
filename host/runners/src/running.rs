//! The handle of a run in progress ([`Running`]) and [`launch`], the one place where a
//! backend's driver task is wired to it: the line channel, the [`LineSink`] with the
//! run's limits, the stop token, the deadline and the completion report. Both backends
//! start their process or container, then hand their driver to [`launch`].

use std::future::Future;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::lines::LineSink;
use crate::spec::{Exit, Line, RunSpec};

/// Capacity of the line channel: enough to absorb bursts, small enough that a slow
/// consumer applies backpressure to the reader instead of growing memory.
const LINE_BUFFER: usize = 256;

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
            Some(rx) => rx.await.unwrap_or(Err(RunnerError::DriverGone)),
            None => Err(RunnerError::AlreadyWaited),
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

/// What a backend's driver task works with.
pub(crate) struct Drive {
    /// Where the output bytes go; it turns them into lines for the consumer.
    pub sink: LineSink,
    /// Cancelled by [`Running::stop`] or by dropping the [`Running`].
    pub stop: CancellationToken,
    /// When the run's time limit is reached.
    pub deadline: Instant,
}

/// Wires a started run to its [`Running`] handle and spawns its driver (on `tracker`
/// when given, so the caller can wait for every cleanup). `drive` gets the
/// [`Drive`] and returns the future that streams the output, waits for the end and
/// cleans up; its [`Exit`] gets `elapsed` since `started`.
pub(crate) fn launch<F, Fut>(
    spec: &RunSpec,
    started: Instant,
    id: String,
    warnings: Vec<String>,
    tracker: Option<&TaskTracker>,
    drive: F,
) -> Running
where
    F: FnOnce(Drive) -> Fut,
    Fut: Future<Output = Result<Exit, RunnerError>> + Send + 'static,
{
    let (tx, lines) = mpsc::channel(LINE_BUFFER);
    let (done_tx, done) = oneshot::channel();
    let stop = CancellationToken::new();
    let deadline = started + spec.sandbox.timeout;
    let sink = LineSink::new(
        tx,
        stop.clone(),
        deadline,
        spec.sandbox.output_limit,
        spec.sandbox.max_line,
        spec.result_marker.clone(),
    );
    let run = drive(Drive {
        sink,
        stop: stop.clone(),
        deadline,
    });
    let task = async move {
        let r = run.await.map(|mut exit| {
            exit.elapsed = started.elapsed();
            exit
        });
        // The receiver is gone only when nobody waits for the result.
        let _ = done_tx.send(r);
    };
    match tracker {
        Some(t) => {
            t.spawn(task);
        }
        None => {
            tokio::spawn(task);
        }
    }
    Running {
        lines,
        done: Some(done),
        stop,
        id,
        warnings,
    }
}
