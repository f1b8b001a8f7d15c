//! Docker mode: one container per run, through bollard.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::lines::{Interrupt, LineSink};
use crate::runner::{Exit, LINE_BUFFER, RunSpec, Running, Stream, spawn_driver};
use crate::sandbox::Workspace;

/// Label on every container a runner creates (value `1`): `docker ps -a --filter
/// label=heddle.runner` finds them all, [`remove_leftovers`] removes them.
pub const LABEL_RUNNER: &str = "heddle.runner";
/// Label holding the node id the container ran for.
pub const LABEL_NODE: &str = "heddle.node";
/// Label naming the host process that created the container (`<pid>`), so leftovers of
/// a crashed process can be told from containers of a live one.
pub const LABEL_OWNER: &str = "heddle.owner";

fn endpoint(host: Option<&str>) -> String {
    host.map(str::to_string)
        .or_else(|| std::env::var("DOCKER_HOST").ok())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
}

/// Connects to the engine and negotiates the API version (Debian's engine speaks an
/// older API than bollard's default). Fails with [`RunnerError::NoEngine`] when nothing
/// answers, which tells the user how to start one.
pub async fn connect_docker(host: Option<&str>) -> Result<Docker, RunnerError> {
    let no_engine = |detail: String| RunnerError::NoEngine {
        endpoint: endpoint(host),
        detail,
    };
    let docker = match host {
        Some(h) => Docker::connect_with_host(h),
        None => Docker::connect_with_local_defaults(),
    }
    .map_err(|e| no_engine(e.to_string()))?;
    docker
        .negotiate_version()
        .await
        .map_err(|e| no_engine(e.to_string()))
}

/// Force-removes containers carrying [`LABEL_RUNNER`]; with `owner`, only those created
/// by that process id. Returns how many were removed.
pub async fn remove_leftovers(docker: &Docker, owner: Option<u32>) -> Result<usize, RunnerError> {
    let mut label = vec![format!("{LABEL_RUNNER}=1")];
    if let Some(pid) = owner {
        label.push(format!("{LABEL_OWNER}={pid}"));
    }
    let filters = HashMap::from([("label".to_string(), label)]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|source| RunnerError::Docker {
            action: "listing leftover containers",
            source,
        })?;
    let mut n = 0;
    for c in list {
        if let Some(id) = c.id {
            force_remove(docker, &id).await?;
            n += 1;
        }
    }
    Ok(n)
}

/// Force-removes containers carrying [`LABEL_RUNNER`] whose owner process no longer
/// runs on this host (leftovers of a crashed or killed heddle), leaving those of live
/// processes alone. Meant for start-up. Returns how many were removed.
pub async fn remove_orphans(docker: &Docker) -> Result<usize, RunnerError> {
    let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_RUNNER}=1")])]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|source| RunnerError::Docker {
            action: "listing leftover containers",
            source,
        })?;
    let mut n = 0;
    for c in list {
        let owner_alive = c
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER))
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if let (false, Some(id)) = (owner_alive, c.id) {
            force_remove(docker, &id).await?;
            n += 1;
        }
    }
    Ok(n)
}

async fn force_remove(docker: &Docker, id: &str) -> Result<(), RunnerError> {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        // Already gone (or being removed by a concurrent call): nothing left behind.
        Err(DockerError::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }) => Ok(()),
        Err(source) => Err(RunnerError::Docker {
            action: "removing the container",
            source,
        }),
    }
}

fn container_name(hint: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let clean: String = hint
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!(
        "heddle-{clean}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn create_body(spec: &RunSpec) -> ContainerCreateBody {
    let sb = &spec.sandbox;
    let mut labels: HashMap<String, String> = spec.labels.iter().cloned().collect();
    labels.insert(LABEL_RUNNER.into(), "1".into());
    labels.insert(LABEL_OWNER.into(), std::process::id().to_string());
    labels
        .entry(LABEL_NODE.into())
        .or_insert_with(|| spec.name_hint.clone());
    let mut env: Vec<String> = vec!["HOME=/tmp".into(), "LANG=C.UTF-8".into()];
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    let binds = sb.workspace.as_ref().map(|w| {
        vec![format!(
            "{}:{}:{}",
            w.host_path.display(),
            Workspace::MOUNT_PATH,
            if w.read_only { "ro" } else { "rw" }
        )]
    });
    let tmpfs = sb.read_only_root.then(|| {
        HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={},mode=1777", sb.tmp_bytes),
        )])
    });
    let host_config = HostConfig {
        memory: Some(sb.memory_bytes),
        // Same as memory: no swap on top of the cap.
        memory_swap: Some(sb.memory_bytes),
        nano_cpus: Some(sb.nano_cpus),
        pids_limit: Some(sb.pids_limit),
        network_mode: Some(if sb.network { "bridge" } else { "none" }.into()),
        ipc_mode: Some(sb.ipc_mode.clone()),
        cap_drop: Some(sb.cap_drop.clone()),
        security_opt: sb
            .no_new_privileges
            .then(|| vec!["no-new-privileges".to_string()]),
        readonly_rootfs: Some(sb.read_only_root),
        tmpfs,
        binds,
        auto_remove: Some(false),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(spec.argv.clone()),
        env: Some(env),
        user: sb.user.clone(),
        working_dir: Some(if sb.workspace.is_some() {
            Workspace::MOUNT_PATH.into()
        } else {
            "/tmp".into()
        }),
        labels: Some(labels),
        network_disabled: Some(!sb.network),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    }
}

fn is_missing_image(e: &DockerError) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code: 404, message }
        if message.contains("image"))
}

fn is_connection_error(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::HyperLegacyError { .. }
            | DockerError::SocketNotFoundError(_)
            | DockerError::IOError { .. }
    )
}

pub(crate) async fn start(
    docker: Docker,
    spec: RunSpec,
    tracker: Option<&TaskTracker>,
) -> Result<Running, RunnerError> {
    let started = Instant::now();
    let name = container_name(&spec.name_hint);
    let created = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::default().name(&name).build()),
            create_body(&spec),
        )
        .await
        .map_err(|source| {
            if is_missing_image(&source) {
                RunnerError::MissingImage {
                    image: spec.image.clone(),
                }
            } else if is_connection_error(&source) {
                RunnerError::NoEngine {
                    endpoint: endpoint(None),
                    detail: source.to_string(),
                }
            } else {
                RunnerError::Docker {
                    action: "creating the container",
                    source,
                }
            }
        })?;
    let id = created.id.clone();
    // From here on the container exists: every failure path removes it.
    let attach = docker
        .attach_container(
            &id,
            Some(
                AttachContainerOptionsBuilder::default()
                    .stream(true)
                    .stdout(true)
                    .stderr(true)
                    .build(),
            ),
        )
        .await;
    let attach = match attach {
        Ok(a) => a,
        Err(source) => {
            let _ = force_remove(&docker, &id).await;
            return Err(RunnerError::Docker {
                action: "attaching to the container",
                source,
            });
        }
    };
    if let Err(source) = docker.start_container(&id, None).await {
        let _ = force_remove(&docker, &id).await;
        return Err(RunnerError::Docker {
            action: "starting the container",
            source,
        });
    }

    let (tx, rx) = mpsc::channel(LINE_BUFFER);
    let (done_tx, done_rx) = oneshot::channel();
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
    let driver_stop = stop.clone();
    let driver_id = id.clone();
    spawn_driver(tracker, async move {
        let r = drive(
            &docker,
            &driver_id,
            attach.output,
            sink,
            driver_stop,
            deadline,
        )
        .await;
        let r = r.map(|mut exit| {
            exit.elapsed = started.elapsed();
            exit
        });
        let _ = done_tx.send(r);
    });
    Ok(Running::new(rx, done_rx, stop, id, created.warnings))
}

type OutputStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<LogOutput, DockerError>> + Send>>;

async fn drive(
    docker: &Docker,
    id: &str,
    mut output: OutputStream,
    mut sink: LineSink,
    stop: CancellationToken,
    deadline: Instant,
) -> Result<Exit, RunnerError> {
    let mut interrupt = loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break Some(Interrupt::Stopped),
            _ = tokio::time::sleep_until(deadline) => break Some(Interrupt::Timeout),
            item = output.next() => {
                let pushed = match item {
                    Some(Ok(LogOutput::StdOut { message })) => sink.push(Stream::Stdout, &message).await,
                    Some(Ok(LogOutput::StdErr { message })) => sink.push(Stream::Stderr, &message).await,
                    Some(Ok(LogOutput::Console { message })) => sink.push(Stream::Stdout, &message).await,
                    Some(Ok(LogOutput::StdIn { .. })) => Ok(()),
                    // The attach stream ends (or breaks) when the container exits; the
                    // exit status below says what happened.
                    Some(Err(_)) | None => break None,
                };
                if let Err(i) = pushed {
                    break Some(i);
                }
            }
        }
    };
    drop(output);
    if interrupt.is_none() {
        interrupt = sink.finish().await.err();
    }
    let mut exit = Exit::default();
    if interrupt.is_none() {
        let mut wait = docker.wait_container(id, None);
        let waited = tokio::select! {
            biased;
            _ = stop.cancelled() => Err(Interrupt::Stopped),
            _ = tokio::time::sleep_until(deadline) => Err(Interrupt::Timeout),
            w = wait.next() => Ok(w),
        };
        match waited {
            Err(i) => interrupt = Some(i),
            Ok(w) => {
                let code = match w {
                    Some(Ok(r)) => Some(r.status_code),
                    Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Some(code),
                    _ => None,
                };
                let state = docker
                    .inspect_container(id, None)
                    .await
                    .ok()
                    .and_then(|i| i.state);
                exit.code = state.as_ref().and_then(|s| s.exit_code).or(code);
                exit.oom_killed = state.and_then(|s| s.oom_killed).unwrap_or(false);
            }
        }
    }
    match interrupt {
        Some(Interrupt::Stopped) => exit.stopped = true,
        Some(Interrupt::Timeout) => exit.timed_out = true,
        None => {}
    }
    // Removal also kills a container still running (stop, timeout).
    let removed = force_remove(docker, id).await;
    exit.truncated = sink.truncated;
    exit.result = sink.result.take();
    exit.last_stdout = sink.last_stdout.take();
    exit.stderr_tail = sink.stderr_tail();
    removed.map(|()| exit)
}
