//! Stopping everything a worker started, and checking that it is gone, before a
//! replacement starts and before the run's result is reported: the worker's process
//! group, the code nodes it ran as subprocesses (they carry its owner token, in groups
//! of their own), their scratch directories, and Docker containers labelled with the
//! run id. A dead worker or an empty process list proves nothing by itself: each kind is
//! looked for again after it was stopped.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long stopped processes get to disappear before they count as survivors.
const SETTLE: Duration = Duration::from_secs(5);

/// What a cleanup found and removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Teardown {
    /// Everything looked for is gone.
    pub verified: bool,
    /// Code-node processes killed (the worker's own group is not counted).
    pub processes_killed: usize,
    /// Code nodes' scratch directories removed.
    pub scratch_dirs_removed: usize,
    /// The run's Docker containers removed.
    pub containers_removed: usize,
    /// What could not be removed (`process 123`, `container abc…`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<String>,
    /// What could not be looked at (no Docker engine answered), said rather than assumed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unchecked: Vec<String>,
}

/// Where the run's containers may be: only a graph with code nodes starts any.
#[derive(Clone, Debug)]
pub struct Containers {
    /// The Docker engine to ask (`[runners] docker_host`; default: the local one).
    pub docker_host: Option<String>,
}

/// Stops what the worker of process group `group` (owner token `owner`, when it was
/// read) started for `run` and checks that it is gone.
pub async fn teardown(
    group: Option<heddle_runners::ProcessGroup>,
    owner: Option<&str>,
    run: &str,
    containers: Option<&Containers>,
) -> Teardown {
    let mut t = Teardown::default();
    // Each kind is killed again on every check until none is left: a process that
    // forked between a kill and the next look is not let go.
    if let Some(group) = group {
        let gone = settle(|| {
            group.kill();
            !group.has_live_members()
        })
        .await;
        if !gone {
            t.survivors.push(group.to_string());
        }
    }
    if let Some(owner) = owner {
        let mut sweep_error = None;
        let gone = settle(|| match heddle_runners::sweep_owner(owner) {
            Ok(s) => {
                t.processes_killed += s.processes;
                t.scratch_dirs_removed += s.directories;
                heddle_runners::owned_processes(owner).is_empty()
            }
            Err(e) => {
                sweep_error = Some(e.to_string());
                heddle_runners::owned_processes(owner).is_empty()
            }
        })
        .await;
        if let Some(e) = sweep_error {
            t.unchecked.push(format!("scratch directories: {e}"));
        }
        if !gone {
            for pid in heddle_runners::owned_processes(owner) {
                t.survivors.push(format!("process {pid} (code node)"));
            }
        }
    }
    if let Some(c) = containers {
        remove_containers(run, c, &mut t).await;
    }
    t.verified = t.survivors.is_empty();
    t
}

async fn remove_containers(run: &str, c: &Containers, t: &mut Teardown) {
    let docker = match tokio::time::timeout(
        Duration::from_secs(5),
        heddle_runners::connect_docker(c.docker_host.as_deref()),
    )
    .await
    {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => {
            t.unchecked.push(format!("containers: {e}"));
            return;
        }
        Err(_) => {
            t.unchecked
                .push("containers: the Docker engine did not answer within 5 s".into());
            return;
        }
    };
    match heddle_runners::remove_run_containers(&docker, run).await {
        Ok(n) => t.containers_removed += n,
        Err(e) => t.unchecked.push(format!("containers: {e}")),
    }
    match heddle_runners::run_containers(&docker, run).await {
        Ok(left) => t
            .survivors
            .extend(left.into_iter().map(|id| format!("container {id}"))),
        Err(e) => t.survivors.push(format!("containers (not listed: {e})")),
    }
}

/// Runs `kill_and_check` until it reports everything gone or [`SETTLE`] passes;
/// whether everything went.
async fn settle(mut kill_and_check: impl FnMut() -> bool) -> bool {
    let t0 = tokio::time::Instant::now();
    loop {
        if kill_and_check() {
            return true;
        }
        if t0.elapsed() >= SETTLE {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
