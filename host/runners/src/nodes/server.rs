//! `code.server`: a code node whose code is a server. An invocation starts it (a
//! container, or a subprocess where the operator allows them), waits until it answers
//! on its port, and returns its `endpoint` (`http://127.0.0.1:PORT`) for the nodes
//! downstream to call; the server keeps running for the rest of the run.
//!
//! It is a run-scoped resource ([`Executor::run_scoped`]): the executor keeps each
//! server it started and stops it in [`Executor::finalize`], which the kernel calls on
//! every ending of the run (completed, failed, cancelled, paused at a gate), after every
//! node stopped. Should the host be killed outright, a subprocess server dies with it
//! (its process group's guard) and a container stays behind labelled with the run
//! ([`crate::LABEL_RUN`]), for whoever takes the run over to remove; a durable run then
//! starts the server again, since the endpoint it recorded is gone.
//!
//! The container, its driver, its limits and its removal are the code nodes' own
//! ([`CodeExecutor`], [`crate::Runner`]); only its network differs
//! ([`crate::sandbox::Publish`]).

// `NodeError` is the kernel's error type at the executor seam.
#![allow(clippy::result_large_err)]

use std::sync::Mutex;
use std::time::Duration;

use heddle_core::{
    ConfigProblem, LogLevel, NodeDecl, NodeMode, NodeSpec, OutputDecl, PortDecl, PortType, Value,
};
use heddle_kernel::{BoxFuture, Call, ErrorKind, Executor, NodeCtx, NodeError, Outputs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::executor::{CodeExecutor, signature};
use super::language::Language;
use super::settings::{self, Settings};
use crate::config::RunnersConfig;
use crate::running::Running;
use crate::sandbox::{MIB, Publish, Sandbox, Workspace};
use crate::spec::{Exit, Line, Mode, Stream};

/// The node type.
pub const TYPE: &str = "code.server";

/// The properties a server has besides a code node's: configuration, never inputs.
const SERVER_PROPS: [&str; 7] = [
    "language",
    "code",
    "port",
    "host_port",
    "probe",
    "ready_path",
    "ready_timeout_s",
];

/// Default port the server listens on inside its container (`PORT`).
const PORT: u16 = 8080;
/// Default wait for the server to answer.
const READY_TIMEOUT_S: f64 = 30.0;
/// Longest wait a node may ask for: an hour. The wait is always bounded.
const READY_TIMEOUT_MAX_S: f64 = 3600.0;
/// Default longest life of a server: an hour. It is stopped when the run ends; this
/// only bounds a run that never does.
const LIFETIME_S: u64 = 3600;
/// Bound of one connection attempt and of waiting for the first bytes of an answer.
const PROBE_STEP: Duration = Duration::from_secs(2);
/// First pause between probes, doubled up to [`PROBE_PAUSE_MAX`].
const PROBE_PAUSE: Duration = Duration::from_millis(25);
const PROBE_PAUSE_MAX: Duration = Duration::from_millis(500);

/// A server's sandbox defaults: the code nodes', with a time limit that is the
/// server's longest life rather than one invocation's.
fn base_sandbox() -> Sandbox {
    Sandbox {
        timeout: Duration::from_secs(LIFETIME_S),
        ..Sandbox::default()
    }
}

/// How a server is judged ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// An HTTP GET of `ready_path` brings back a status line (any status: the server
    /// answers).
    Http,
    /// A TCP connection is accepted and stays open (Docker's proxy accepts every
    /// connection on a published port at once and closes those it cannot pass on, so
    /// an accepted connection alone proves nothing).
    Tcp,
}

/// What a server node's own properties say.
struct ServerSettings {
    lang: Language,
    port: u16,
    host_port: u16,
    probe: Probe,
    ready_path: String,
    ready_timeout: Duration,
}

/// The language of a server's code, by the names a user writes.
fn language(name: &str) -> Option<Language> {
    Some(match name {
        "python" => Language::Python,
        "javascript" | "js" | "node" => Language::JavaScript,
        "bash" => Language::Bash,
        "shell" | "sh" => Language::Shell,
        "ruby" => Language::Ruby,
        "lua" => Language::Lua,
        _ => return None,
    })
}

/// Reads a server node's settings; `Err` lists every problem found (with the code
/// node settings' own).
fn read(
    spec: &NodeSpec<'_>,
    config: &RunnersConfig,
) -> Result<(Settings, ServerSettings), Vec<ConfigProblem>> {
    let props = spec.properties;
    let mut problems = Vec::new();
    let mut problem = |name: &str, message: String| {
        problems.push(ConfigProblem {
            property: Some(name.to_string()),
            message: format!("property `{name}` {message}"),
        })
    };
    let get = |name: &str| props.get(name).filter(|v| !v.is_null());
    let lang = match get("language") {
        None => Language::Bash,
        Some(v) => match v.as_str().and_then(language) {
            Some(l) => l,
            None => {
                problem(
                    "language",
                    format!(
                        "is `{}`; expected python, javascript, bash, shell, ruby or lua",
                        short(v)
                    ),
                );
                Language::Bash
            }
        },
    };
    let mut port_in = |name: &str, default: u16, min: i64| -> u16 {
        match get(name) {
            None => default,
            Some(v) => match v.as_i64() {
                Some(n) if (min..=65535).contains(&n) => n as u16,
                _ => {
                    problem(
                        name,
                        format!("must be an integer from {min} to 65535, got `{}`", short(v)),
                    );
                    default
                }
            },
        }
    };
    let port = port_in("port", PORT, 1);
    let host_port = port_in("host_port", 0, 0);
    let probe = match get("probe").map(|v| (v.as_str(), v)) {
        None | Some((Some("http"), _)) => Probe::Http,
        Some((Some("tcp"), _)) => Probe::Tcp,
        Some((_, v)) => {
            problem(
                "probe",
                format!("is `{}`; expected `http` or `tcp`", short(v)),
            );
            Probe::Http
        }
    };
    let ready_path = match get("ready_path") {
        None => "/".to_string(),
        Some(Value::Str(p))
            if p.starts_with('/') && !p.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            p.to_string()
        }
        Some(v) => {
            problem(
                "ready_path",
                format!(
                    "must be a path starting with `/` without spaces, got `{}`",
                    short(v)
                ),
            );
            "/".to_string()
        }
    };
    let ready_timeout = match get("ready_timeout_s") {
        None => READY_TIMEOUT_S,
        Some(v) => match v.as_f64() {
            Some(s) if (0.001..=READY_TIMEOUT_MAX_S).contains(&s) => s,
            _ => {
                problem(
                    "ready_timeout_s",
                    format!(
                        "must be a number from 0.001 to {READY_TIMEOUT_MAX_S}, got `{}`",
                        short(v)
                    ),
                );
                READY_TIMEOUT_S
            }
        },
    };
    // A server's one way in is its published port; a second network would be a way out.
    if get("network").is_some() {
        problem(
            "network",
            "cannot be set on a server: its only network is its port, published on \
             127.0.0.1 (see host/runners/README.md)"
                .into(),
        );
    }
    let subprocess = get("mode").and_then(Value::as_str) == Some("subprocess");
    if subprocess && get("port").is_some() {
        problem(
            "port",
            "is the port inside a container and cannot be used in mode `subprocess`; \
             the server listens on $PORT (set `host_port` to choose it)"
                .into(),
        );
    }
    let code = settings::read_as(lang, "code", &base_sandbox(), spec, config);
    match code {
        Ok(s) if problems.is_empty() => Ok((
            s,
            ServerSettings {
                lang,
                port,
                host_port,
                probe,
                ready_path,
                ready_timeout: Duration::from_secs_f64(ready_timeout),
            },
        )),
        Ok(_) => Err(problems),
        Err(mut more) => {
            more.extend(problems);
            Err(more)
        }
    }
}

/// A user's value in a problem, cut at 80 characters.
fn short(v: &Value) -> String {
    let text = match v {
        Value::Str(s) => s.to_string(),
        v => v.to_string(),
    };
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Every problem [`create`] would refuse the node for.
pub(super) fn check(spec: &NodeSpec<'_>, config: &RunnersConfig) -> Vec<ConfigProblem> {
    read(spec, config).err().unwrap_or_default()
}

/// The executor of one server node.
pub(super) fn create(
    spec: &NodeSpec<'_>,
    config: &RunnersConfig,
    runner: crate::Runner,
) -> Result<ServerExecutor, NodeError> {
    let (settings, server) = read(spec, config).map_err(|problems| {
        let all: Vec<String> = problems.into_iter().map(|p| p.message).collect();
        NodeError::msg(format!("node {}: {}", spec.id, all.join("; ")))
    })?;
    let code =
        CodeExecutor::new(spec.id, server.lang, settings, runner).also_properties(&SERVER_PROPS);
    Ok(ServerExecutor {
        code,
        server,
        servers: Mutex::new(Vec::new()),
    })
}

/// The declaration of `code.server`.
pub(super) fn decl() -> NodeDecl {
    let d = base_sandbox();
    let mut decl = NodeDecl::new(TYPE);
    decl.title = "Server".into();
    decl.description = "Starts a server for the rest of the run (Docker by default) and \
        outputs its `endpoint` once it answers. The code listens on $HOST:$PORT; inputs \
        become variables as in the other code nodes. Stopped and removed when the run \
        ends, is cancelled or pauses; started again when a durable run is recovered."
        .into();
    decl.mode = NodeMode::Buffered;
    decl.retry_safe = false;
    decl.dynamic_inputs = true;
    decl.origin = heddle_core::Origin::Code;
    decl.inputs = vec![
        PortDecl::new("input", PortType::Any)
            .describe("Available to the code as the variable `input`"),
    ];
    decl.outputs = vec![
        OutputDecl::new("endpoint", PortType::Str)
            .describe("The server's address, http://127.0.0.1:PORT, once it answers"),
        OutputDecl::new("port", PortType::Int).describe("The port of the endpoint"),
    ];
    decl.properties = vec![
        PortDecl::new("code", PortType::Str)
            .required()
            .describe("The server's source code (it listens on $HOST:$PORT)"),
        PortDecl::new("language", PortType::Str)
            .with_default("bash")
            .describe("python, javascript, bash, shell, ruby or lua"),
        PortDecl::new("mode", PortType::Str)
            .with_default("docker")
            .describe("`docker` (sandboxed) or `subprocess` (host process; operator must allow)"),
        PortDecl::new("image", PortType::Str)
            .describe("Container image (default: the language's code node image)"),
        PortDecl::new("port", PortType::Int)
            .with_default(i64::from(PORT))
            .describe("Docker mode: the port the server listens on in its container ($PORT)"),
        PortDecl::new("host_port", PortType::Int)
            .with_default(0i64)
            .describe("The port on 127.0.0.1 the endpoint uses; 0 picks a free one"),
        PortDecl::new("probe", PortType::Str)
            .with_default("http")
            .describe(
                "`http`: a GET of ready_path gets any answer; `tcp`: a connection stays open",
            ),
        PortDecl::new("ready_path", PortType::Str).with_default("/"),
        PortDecl::new("ready_timeout_s", PortType::Number)
            .with_default(READY_TIMEOUT_S)
            .describe("How long to wait for the server to answer before the node fails"),
        PortDecl::new("timeout_s", PortType::Number)
            .with_default(d.timeout.as_secs_f64())
            .describe("The server's longest life; it is stopped when the run ends anyway"),
        PortDecl::new("memory_mb", PortType::Int).with_default(d.memory_bytes / MIB),
        PortDecl::new("cpus", PortType::Number).with_default(d.nano_cpus as f64 / 1e9),
        PortDecl::new("pids_limit", PortType::Int).with_default(d.pids_limit),
        PortDecl::new("ipc_mode", PortType::Str).with_default(d.ipc_mode.as_str()),
        PortDecl::new("cap_drop", PortType::list_of(PortType::Str))
            .with_default(Value::list(vec![Value::str("ALL")])),
        PortDecl::new("no_new_privileges", PortType::Bool).with_default(d.no_new_privileges),
        PortDecl::new("user", PortType::Str).with_default(d.user.as_deref().unwrap_or("")),
        PortDecl::new("read_only_root", PortType::Bool).with_default(d.read_only_root),
        PortDecl::new("tmp_size_mb", PortType::Int).with_default(d.tmp_bytes / MIB),
        PortDecl::new("workspace", PortType::Str),
        PortDecl::new("workspace_read_only", PortType::Bool)
            .with_default(Workspace::READ_ONLY_BY_DEFAULT),
        PortDecl::new("output_limit_bytes", PortType::Int)
            .with_default(d.output_limit as i64)
            .describe("The server's output logged before the rest is dropped"),
        PortDecl::new("kill_grace_ms", PortType::Int).with_default(d.kill_grace.as_millis() as i64),
    ];
    decl
}

pub(super) struct ServerExecutor {
    /// The code node machinery: settings, spec, runner, driver tasks.
    code: CodeExecutor,
    server: ServerSettings,
    /// One token per server started and not yet stopped: [`Executor::finalize`]
    /// cancels them all, and each server's keeper then stops and removes it.
    servers: Mutex<Vec<CancellationToken>>,
}

/// How the wait for a server ended.
enum Wait {
    Ready,
    Cancelled,
    /// The wait's bound passed; `node_limit` when it was the node's own time limit.
    TimedOut {
        node_limit: bool,
    },
    Exited,
}

impl ServerExecutor {
    async fn start(&self, call: Call) -> Result<Outputs, NodeError> {
        let ctx = call.ctx;
        let code = &self.code;
        for n in &code.settings.notes {
            ctx.log(LogLevel::Warn, n.clone());
        }
        let mut spec = code.spec(&call.inputs)?;
        spec.label_run(&ctx);
        // What the code prints is its log; nothing is a result.
        spec.result_marker = None;
        let docker = code.settings.mode == Mode::Docker;
        let listen = if docker {
            let network = code
                .runner
                .server_network()
                .await
                .map_err(|e| code.start_error(e))?;
            spec.sandbox.publish = Some(Publish {
                network,
                container_port: self.server.port,
                host_port: self.server.host_port,
            });
            self.server.port
        } else {
            match self.server.host_port {
                0 => free_port().map_err(|e| {
                    code.fail(format!("no free port on 127.0.0.1 for the server: {e}"))
                })?,
                p => p,
            }
        };
        spec.env.push(("PORT".into(), listen.to_string()));
        // In a container the published port arrives on the container's own interface.
        let host = if docker { "0.0.0.0" } else { "127.0.0.1" };
        spec.env.push(("HOST".into(), host.into()));
        if ctx.is_cancelled() {
            return Err(code.cancelled(&ctx));
        }
        let mut running = code
            .runner
            .start_tracked(spec, &code.drivers)
            .await
            .map_err(|e| code.start_error(e))?;
        for w in &running.warnings {
            ctx.log(LogLevel::Warn, format!("Docker engine: {w}"));
        }
        let port = if docker {
            match self.published(&running).await {
                Ok(p) => p,
                Err(e) => {
                    running.stop();
                    let _ = running.wait().await;
                    return Err(e);
                }
            }
        } else {
            listen
        };
        let endpoint = format!("http://127.0.0.1:{port}");
        let waited = self.wait_ready(&ctx, &mut running, port, docker).await;
        match waited {
            Wait::Ready => {
                ctx.log(
                    LogLevel::Info,
                    format!("server answers at {endpoint}; it runs until the run ends"),
                );
                self.keep(running, ctx);
                let mut out = Outputs::one("endpoint", Value::str(endpoint));
                out.push("port", Value::Int(i64::from(port)));
                Ok(out)
            }
            Wait::Cancelled => {
                running.stop();
                let _ = running.wait().await;
                Err(code.cancelled(&ctx))
            }
            Wait::TimedOut { node_limit } => {
                running.stop();
                let exit = running.wait().await.map_err(|e| code.start_error(e))?;
                if node_limit {
                    return Err(NodeError::new(
                        ErrorKind::Deadline,
                        format!(
                            "node {}: the node's time limit passed while waiting for the \
                             server to answer at {endpoint}; it was stopped; {}",
                            code.node_id,
                            tail(&exit)
                        ),
                    )
                    .with_signature(signature::DEADLINE));
                }
                Err(code
                    .fail(format!(
                        "the server did not answer at {endpoint} within {:?} ({}); it was \
                         stopped and removed. {}; {}",
                        self.server.ready_timeout,
                        self.probe_text(),
                        self.unready_hint(docker),
                        tail(&exit)
                    ))
                    .with_signature(signature::SERVER_UNREADY))
            }
            Wait::Exited => {
                let exit = running.wait().await.map_err(|e| code.start_error(e))?;
                Err(code
                    .fail(format!(
                        "the server {} before it answered at {endpoint}; {}",
                        ended(&exit),
                        tail(&exit)
                    ))
                    .with_signature(signature::SERVER_EXITED))
            }
        }
    }

    /// The port on 127.0.0.1 the engine published the server's port on.
    async fn published(&self, running: &Running) -> Result<u16, NodeError> {
        let code = &self.code;
        let docker = code
            .runner
            .docker()
            .await
            .map_err(|e| code.start_error(e))?;
        match crate::docker::published_port(docker, &running.id, self.server.port).await {
            Ok(Some(p)) => Ok(p),
            Ok(None) => Err(NodeError::host(format!(
                "node {}: the Docker engine published no port for the server's port {}",
                code.node_id, self.server.port
            ))),
            Err(e) => Err(code.start_error(e)),
        }
    }

    /// What usually keeps a server from answering, for the failure.
    fn unready_hint(&self, docker: bool) -> String {
        let listen = if docker {
            format!(
                "It must listen on $HOST:$PORT (0.0.0.0:{}): in a container 127.0.0.1 is \
                 unreachable from outside",
                self.server.port
            )
        } else {
            "It must listen on $HOST:$PORT".to_string()
        };
        match self.server.probe {
            Probe::Http => format!(
                "{listen}; a server that does not speak HTTP needs `probe: \"tcp\"`; a slow \
                 one a longer `ready_timeout_s`"
            ),
            Probe::Tcp => format!("{listen}; a slow one needs a longer `ready_timeout_s`"),
        }
    }

    fn probe_text(&self) -> String {
        match self.server.probe {
            Probe::Http => format!("probe: HTTP GET {}", self.server.ready_path),
            Probe::Tcp => "probe: a TCP connection".to_string(),
        }
    }

    /// Waits until the server answers on `port`, its output logged meanwhile: bounded
    /// by `ready_timeout_s` and the node's own time limit, ended early by a cancel or
    /// by the server's exit.
    async fn wait_ready(
        &self,
        ctx: &NodeCtx,
        running: &mut Running,
        port: u16,
        behind_proxy: bool,
    ) -> Wait {
        let mut until = Instant::now() + self.server.ready_timeout;
        let mut node_limit = false;
        if let Some(d) = ctx.deadline().map(Instant::from_std)
            && d < until
        {
            until = d;
            node_limit = true;
        }
        let cancel = ctx.cancel_token().clone();
        let probing = probe_until_ready(
            self.server.probe,
            port,
            self.server.ready_path.clone(),
            behind_proxy,
        );
        tokio::pin!(probing);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    // The node's own time limit fires its token too.
                    if node_limit && Instant::now() >= until {
                        return Wait::TimedOut { node_limit };
                    }
                    return Wait::Cancelled;
                }
                _ = tokio::time::sleep_until(until) => return Wait::TimedOut { node_limit },
                line = running.next_line() => match line {
                    Some(line) => log_line(ctx, &line),
                    None => return Wait::Exited,
                },
                () = &mut probing => return Wait::Ready,
            }
        }
    }

    /// Keeps a server that answered: its output logged until [`Executor::finalize`]
    /// stops it (or it ends by itself, which is logged as a warning), its removal
    /// tracked with the node's other driver tasks so `finalize` waits for it.
    fn keep(&self, mut running: Running, ctx: NodeCtx) {
        let stop = CancellationToken::new();
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(stop.clone());
        self.code.drivers.spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => {
                        running.stop();
                        break;
                    }
                    line = running.next_line() => match line {
                        Some(line) => log_line(&ctx, &line),
                        None => break,
                    },
                }
            }
            let stopped = stop.is_cancelled();
            match running.wait().await {
                Ok(exit) if !stopped => ctx.log(
                    LogLevel::Warn,
                    format!(
                        "the server {} while the run went on; {}",
                        ended(&exit),
                        tail(&exit)
                    ),
                ),
                Ok(_) => {}
                Err(e) => ctx.log(LogLevel::Warn, format!("stopping the server: {e}")),
            }
        });
    }
}

impl Executor for ServerExecutor {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(self.start(call))
    }

    /// The code nodes' checks (engine, image), and the server network made, before any
    /// node of the run starts.
    fn initialize(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(async {
            self.code.check_ready().await?;
            if self.code.settings.mode == Mode::Docker {
                self.code
                    .runner
                    .server_network()
                    .await
                    .map_err(|e| self.code.start_error(e))?;
            }
            Ok(())
        })
    }

    /// Stops every server this node started and waits until each is removed (the
    /// container) or its process group is gone.
    fn finalize(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            let stops: Vec<_> = self
                .servers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
                .collect();
            for stop in stops {
                stop.cancel();
            }
            self.code.wait_drivers().await;
        })
    }

    fn run_scoped(&self) -> bool {
        true
    }
}

/// A port on 127.0.0.1 free right now, for a subprocess server (it binds it next; a
/// process taking it in between makes the server fail to start, which the node reports).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// Probes until the server answers, pausing a little longer after each miss.
async fn probe_until_ready(probe: Probe, port: u16, path: String, behind_proxy: bool) {
    let mut pause = PROBE_PAUSE;
    loop {
        if answers(probe, port, &path, behind_proxy).await {
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(PROBE_PAUSE_MAX);
    }
}

/// Whether the server on 127.0.0.1:`port` answers `probe` now.
async fn answers(probe: Probe, port: u16, path: &str, behind_proxy: bool) -> bool {
    let Ok(Ok(mut conn)) =
        tokio::time::timeout(PROBE_STEP, TcpStream::connect(("127.0.0.1", port))).await
    else {
        return false;
    };
    match probe {
        Probe::Http => {
            let request = format!(
                "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: heddle-probe\r\n\
                 Connection: close\r\n\r\n"
            );
            if conn.write_all(request.as_bytes()).await.is_err() {
                return false;
            }
            let mut head = [0u8; 5];
            matches!(
                tokio::time::timeout(PROBE_STEP, conn.read_exact(&mut head)).await,
                Ok(Ok(_))
            ) && &head == b"HTTP/"
        }
        // Docker's proxy closes at once a connection it cannot pass on: one that stays
        // open (or brings a greeting) reached the server.
        Probe::Tcp if behind_proxy => {
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(250), conn.read(&mut byte)).await {
                Err(_) => true,
                Ok(Ok(n)) => n > 0,
                Ok(Err(_)) => false,
            }
        }
        Probe::Tcp => true,
    }
}

/// A line the server printed, as a log line of its node (servers write their access
/// log on standard error, so neither stream is a warning by itself).
fn log_line(ctx: &NodeCtx, line: &Line) {
    let stream = match line.stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    ctx.log(LogLevel::Info, format!("server {stream}: {}", line.text));
}

/// How a server's run ended, in words.
fn ended(exit: &Exit) -> String {
    if exit.oom_killed {
        return "went over its memory limit and was killed".into();
    }
    if exit.timed_out {
        return "reached its time limit (`timeout_s`) and was stopped".into();
    }
    match (exit.code, exit.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".into(),
    }
}

/// The last lines of a server's standard error, for a failure.
fn tail(exit: &Exit) -> String {
    if exit.stderr_tail.trim().is_empty() {
        "(no stderr)".into()
    } else {
        format!("stderr (last lines):\n{}", exit.stderr_tail.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_by_the_names_users_write() {
        assert_eq!(language("python"), Some(Language::Python));
        assert_eq!(language("sh"), Some(Language::Shell));
        assert_eq!(language("node"), Some(Language::JavaScript));
        assert_eq!(language("cobol"), None);
    }

    #[tokio::test]
    async fn nothing_listening_does_not_answer_and_an_http_server_does() {
        let port = free_port().unwrap();
        assert!(!answers(Probe::Http, port, "/", false).await);
        assert!(!answers(Probe::Tcp, port, "/", false).await);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let serve = tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf).await;
            c.write_all(b"HTTP/1.0 404 Not Found\r\n\r\n")
                .await
                .unwrap();
        });
        assert!(
            answers(Probe::Http, port, "/", false).await,
            "any status answers"
        );
        serve.await.unwrap();
    }
}
