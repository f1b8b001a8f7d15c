//! Docker mode: one container per run, through bollard.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, ContainerSummary};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::lines::Interrupt;
use crate::owner::ProcessOwner;
use crate::running::{Drive, Running, launch};
use crate::spec::{Exit, RunSpec, Stream};

/// Label on every container a runner creates (value `1`): `docker ps -a --filter
/// label=heddle.runner` finds them all, [`remove_leftovers`] removes them.
pub const LABEL_RUNNER: &str = "heddle.runner";
/// Label holding the node id the container ran for.
pub const LABEL_NODE: &str = "heddle.node";
/// Label naming the heddle process that created the container (host, boot, pid and
/// start time), so the leftovers of one that died can be told from the containers of one
/// that runs, on this host or another sharing the engine.
pub const LABEL_OWNER: &str = "heddle.owner";
/// Label holding the durable run the container worked for, when the process runs one
/// ([`label_run`]): a watchdog removes a run's containers by it, whichever of its
/// workers created them.
pub const LABEL_RUN: &str = "heddle.run";

/// The network server containers (`code.server`) join, made once per engine by the
/// first server that needs it and kept (like an image): a bridge whose containers
/// cannot reach one another (`enable_icc=false`) and whose traffic is not translated to
/// the host's address (`enable_ip_masquerade=false`), so a server has no way out; it is
/// reached through its port published on 127.0.0.1 ([`crate::sandbox::Publish`]).
pub const SERVER_NETWORK: &str = "heddle-servers";
/// Label on the server network, by which it is found (a name filter matches parts of
/// names, and an engine of API 1.41 lets two concurrent creations make two networks of
/// one name).
const LABEL_NETWORK: &str = "heddle.network";

/// The id of the engine's [`SERVER_NETWORK`], made if it is missing.
///
/// An engine of API 1.41 makes a second network of the same name when asked (and then
/// refuses to start a container on either, the name being ambiguous), so creations in
/// this process take turns, and a creation that raced another process's removes every
/// network of the name but the one all callers agree on (the oldest, then the smallest
/// id) while nothing uses them yet.
pub async fn server_network(docker: &Docker) -> Result<String, RunnerError> {
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = CREATING.lock().await;
    let mut all = server_networks(docker).await?;
    if all.is_empty() {
        create_server_network(docker).await?;
        all = server_networks(docker).await?;
    }
    let Some(keep) = all.first().cloned() else {
        return Err(RunnerError::NoServerNetwork);
    };
    for extra in &all[1..] {
        // In use by another process's server already, or removed by that process
        // meanwhile: either way not ours to insist on.
        let _ = docker.remove_network(extra).await;
    }
    Ok(keep)
}

async fn create_server_network(docker: &Docker) -> Result<(), RunnerError> {
    let request = bollard::models::NetworkCreateRequest {
        name: SERVER_NETWORK.to_string(),
        driver: Some("bridge".into()),
        options: Some(HashMap::from([
            (
                "com.docker.network.bridge.enable_icc".to_string(),
                "false".to_string(),
            ),
            (
                "com.docker.network.bridge.enable_ip_masquerade".to_string(),
                "false".to_string(),
            ),
        ])),
        labels: Some(HashMap::from([(
            LABEL_NETWORK.to_string(),
            "servers".to_string(),
        )])),
        ..Default::default()
    };
    match docker.create_network(request).await {
        Ok(_) => Ok(()),
        // Made meanwhile by another process (an engine that refuses duplicate names).
        Err(DockerError::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(source) => Err(RunnerError::Docker {
            action: "creating the server network",
            source,
        }),
    }
}

/// The ids of every network named [`SERVER_NETWORK`] with its label, the one to use
/// first.
async fn server_networks(docker: &Docker) -> Result<Vec<String>, RunnerError> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("{LABEL_NETWORK}=servers")],
    )]);
    let mut found = docker
        .list_networks(Some(
            bollard::query_parameters::ListNetworksOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|source| RunnerError::Docker {
            action: "listing networks",
            source,
        })?
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(SERVER_NETWORK))
        .filter_map(|n| Some((n.created.map(|c| c.to_string()), n.id?)))
        .collect::<Vec<_>>();
    found.sort();
    Ok(found.into_iter().map(|(_, id)| id).collect())
}

/// The port on 127.0.0.1 that the engine published `container_port` of container `id`
/// on (it picks one when asked for port 0).
pub(crate) async fn published_port(
    docker: &Docker,
    id: &str,
    container_port: u16,
) -> Result<Option<u16>, RunnerError> {
    let info = docker
        .inspect_container(id, None)
        .await
        .map_err(|source| RunnerError::Docker {
            action: "reading the server's published port",
            source,
        })?;
    let key = format!("{container_port}/tcp");
    Ok(info
        .network_settings
        .and_then(|n| n.ports)
        .and_then(|mut ports| ports.remove(&key))
        .flatten()
        .into_iter()
        .flatten()
        .find_map(|b| b.host_port?.parse().ok()))
}

static RUN_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Labels every container this process creates from now on with [`LABEL_RUN`] = `run`.
/// A process works for one run; a second call is ignored.
pub fn label_run(run: &str) {
    let _ = RUN_ID.set(run.to_string());
}

/// Ids of every container, running or not, labelled with the durable run `run`.
pub async fn run_containers(docker: &Docker, run: &str) -> Result<Vec<String>, RunnerError> {
    let labels = vec![format!("{LABEL_RUNNER}=1"), format!("{LABEL_RUN}={run}")];
    Ok(list_labelled(docker, labels)
        .await?
        .into_iter()
        .filter_map(|c| c.id)
        .collect())
}

/// Force-removes every container labelled with the durable run `run`; returns how many.
pub async fn remove_run_containers(docker: &Docker, run: &str) -> Result<usize, RunnerError> {
    let ids = run_containers(docker, run).await?;
    for id in &ids {
        force_remove(docker, id).await?;
    }
    Ok(ids.len())
}

fn endpoint(host: Option<&str>) -> String {
    host.map(str::to_string)
        .or_else(|| std::env::var("DOCKER_HOST").ok())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
}

/// Connects to the engine and negotiates the API version (Debian's engine speaks an
/// older API than bollard's default). Fails with [`RunnerError::NoEngine`] when nothing
/// answers, which tells the user how to start one.
pub async fn connect_docker(host: Option<&str>) -> Result<Docker, RunnerError> {
    let no_engine = |source| RunnerError::NoEngine {
        endpoint: endpoint(host),
        source,
    };
    let docker = match host {
        Some(h) => Docker::connect_with_host(h),
        None => Docker::connect_with_local_defaults(),
    }
    .map_err(no_engine)?;
    docker.negotiate_version().await.map_err(no_engine)
}

/// Force-removes containers carrying [`LABEL_RUNNER`]; with `owner`, only those whose
/// [`LABEL_OWNER`] is that value. Returns how many were removed.
pub async fn remove_leftovers(docker: &Docker, owner: Option<&str>) -> Result<usize, RunnerError> {
    let mut label = vec![format!("{LABEL_RUNNER}=1")];
    if let Some(owner) = owner {
        label.push(format!("{LABEL_OWNER}={owner}"));
    }
    let mut n = 0;
    for c in list_labelled(docker, label).await? {
        if let Some(id) = c.id {
            force_remove(docker, &id).await?;
            n += 1;
        }
    }
    Ok(n)
}

/// Force-removes containers carrying [`LABEL_RUNNER`] whose owner is a heddle of this
/// host that is gone (killed, crashed, or from an earlier boot), leaving those of live
/// processes and of other hosts alone. Run once per process, when a runner first
/// connects. Returns how many were removed.
pub async fn remove_orphans(docker: &Docker) -> Result<usize, RunnerError> {
    let mut n = 0;
    for c in list_labelled(docker, vec![format!("{LABEL_RUNNER}=1")]).await? {
        let gone = c
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER))
            .and_then(|o| ProcessOwner::parse(o))
            .is_some_and(|o| o.is_gone());
        if let (true, Some(id)) = (gone, c.id) {
            force_remove(docker, &id).await?;
            n += 1;
        }
    }
    Ok(n)
}

/// Every container, running or not, carrying all of `labels` (`key=value`).
async fn list_labelled(
    docker: &Docker,
    labels: Vec<String>,
) -> Result<Vec<ContainerSummary>, RunnerError> {
    let filters = HashMap::from([("label".to_string(), labels)]);
    docker
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
        })
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
    let mut labels: HashMap<String, String> = spec.labels.iter().cloned().collect();
    labels.insert(LABEL_RUNNER.into(), "1".into());
    labels.insert(LABEL_OWNER.into(), ProcessOwner::current().token());
    // The run the node said it works for (a durable run's id), else the process's.
    if let Some(run) = RUN_ID.get() {
        labels
            .entry(LABEL_RUN.into())
            .or_insert_with(|| run.clone());
    }
    labels
        .entry(LABEL_NODE.into())
        .or_insert_with(|| spec.name_hint.clone());
    let mut env: Vec<String> = vec!["HOME=/tmp".into(), "LANG=C.UTF-8".into()];
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    let mut body = ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(spec.argv.clone()),
        env: Some(env),
        labels: Some(labels),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    spec.sandbox.apply(&mut body);
    body
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
                    source,
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

    let driver_id = id.clone();
    Ok(launch(
        &spec,
        started,
        id,
        created.warnings,
        tracker,
        |run| async move { drive(&docker, &driver_id, attach.output, run).await },
    ))
}

type OutputStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<LogOutput, DockerError>> + Send>>;

async fn drive(
    docker: &Docker,
    id: &str,
    mut output: OutputStream,
    run: Drive,
) -> Result<Exit, RunnerError> {
    let Drive {
        mut sink,
        stop,
        deadline,
    } = run;
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
    // Removal also kills a container still running (stop, timeout).
    let removed = force_remove(docker, id).await;
    sink.conclude(interrupt, &mut exit);
    removed.map(|()| exit)
}
