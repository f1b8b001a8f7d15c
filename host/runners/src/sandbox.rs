//! The container sandbox of one code invocation: its settings, their security-first
//! defaults, the list of ways a node loosened them, and the Docker flags that enforce
//! them ([`Sandbox::apply`], the only place container isolation is set).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};

/// Limits and isolation for one run. [`Sandbox::default`] is the security-first
/// baseline for untrusted code; a node may change any field, and every change that
/// loosens it is listed by [`Sandbox::weakenings`] so it is logged, never silent.
#[derive(Clone, Debug, PartialEq)]
pub struct Sandbox {
    /// Wall-clock limit of the whole run; reaching it kills the code.
    pub timeout: Duration,
    /// Memory cap (swap included: the container gets no swap beyond it).
    pub memory_bytes: i64,
    /// CPU quota in units of 1e-9 CPUs (1e9 = one CPU).
    pub nano_cpus: i64,
    /// Maximum number of processes/threads in the container (fork bombs).
    pub pids_limit: i64,
    pub network: bool,
    /// `private` unless a node asks otherwise (`shareable`, `none`, …).
    pub ipc_mode: String,
    /// Capabilities dropped; `["ALL"]` by default.
    pub cap_drop: Vec<String>,
    pub no_new_privileges: bool,
    /// `uid:gid` inside the container; `None` keeps the image's user (root for ours).
    pub user: Option<String>,
    /// Read-only root filesystem, with a writable tmpfs on /tmp.
    pub read_only_root: bool,
    /// Size of the /tmp tmpfs when the root is read-only.
    pub tmp_bytes: i64,
    pub workspace: Option<Workspace>,
    /// Bytes of stdout+stderr forwarded before the rest is dropped (with a marker).
    pub output_limit: usize,
    /// Longest line forwarded whole; longer lines are split.
    pub max_line: usize,
    /// Subprocess mode: time between SIGTERM and SIGKILL when stopping.
    pub kill_grace: Duration,
    /// A server's port, published on this host's loopback (`code.server`): the one
    /// network a container gets besides `network`. `None` for every other run.
    pub publish: Option<Publish>,
}

/// How a server container is reached: it joins the engine's server network (see
/// [`crate::SERVER_NETWORK`]: no traffic between its containers, no address
/// translation out of it) and its one port is published on 127.0.0.1 only.
///
/// Why a loopback port rather than a network shared with the nodes that call it: the
/// callers are on the host side (the readiness probe, `http` nodes, subprocess-mode code
/// nodes), which a published port reaches and a container name does not; a port bound
/// to 127.0.0.1 is reachable from nothing off this machine and from no other container,
/// and the container needs no route out, so none is given.
#[derive(Clone, Debug, PartialEq)]
pub struct Publish {
    /// The id of the network the container joins.
    pub network: String,
    /// The port the server listens on inside the container.
    pub container_port: u16,
    /// The port on 127.0.0.1; 0 lets the engine pick a free one.
    pub host_port: u16,
}

/// A host directory bind-mounted at [`Workspace::MOUNT_PATH`].
#[derive(Clone, Debug, PartialEq)]
pub struct Workspace {
    pub host_path: PathBuf,
    pub read_only: bool,
}

impl Workspace {
    pub const MOUNT_PATH: &'static str = "/workspace";
    /// A node's workspace is writable unless it or the author's limits say otherwise.
    pub const READ_ONLY_BY_DEFAULT: bool = false;
}

pub(crate) const MIB: i64 = 1024 * 1024;

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            timeout: Duration::from_secs(10),
            memory_bytes: 256 * MIB,
            nano_cpus: 1_000_000_000,
            pids_limit: 256,
            network: false,
            ipc_mode: "private".into(),
            cap_drop: vec!["ALL".into()],
            no_new_privileges: true,
            user: Some("1000:1000".into()),
            read_only_root: false,
            tmp_bytes: 64 * MIB,
            workspace: None,
            output_limit: 1024 * 1024,
            max_line: 64 * 1024,
            kill_grace: Duration::from_secs(1),
            publish: None,
        }
    }
}

impl Sandbox {
    /// Human-readable list of the ways this sandbox is looser than the default, for the
    /// warning logged at each run.
    pub fn weakenings(&self) -> Vec<String> {
        self.weakenings_from(&Sandbox::default())
    }

    /// [`Sandbox::weakenings`] against the baseline `d` (a server's has a longer time
    /// limit: it lives as long as the run).
    pub fn weakenings_from(&self, d: &Sandbox) -> Vec<String> {
        let mut w = Vec::new();
        if self.network {
            w.push("network enabled".to_string());
        }
        if self.ipc_mode != d.ipc_mode {
            w.push(format!("IPC mode `{}`", self.ipc_mode));
        }
        if !self.cap_drop.iter().any(|c| c.eq_ignore_ascii_case("ALL")) {
            w.push(format!("capabilities dropped only: {:?}", self.cap_drop));
        }
        if !self.no_new_privileges {
            w.push("no-new-privileges off".to_string());
        }
        match &self.user {
            None => w.push("runs as the image's user (root in heddle images)".to_string()),
            Some(u) if u.starts_with("0:") || u == "0" || u.starts_with("root") => {
                w.push(format!("runs as `{u}`"))
            }
            _ => {}
        }
        if self.memory_bytes > d.memory_bytes {
            w.push(format!("memory {} MiB", self.memory_bytes / MIB));
        }
        if self.nano_cpus > d.nano_cpus {
            w.push(format!("{} CPUs", self.nano_cpus as f64 / 1e9));
        }
        if self.timeout > d.timeout {
            w.push(format!("time limit {:?}", self.timeout));
        }
        if let Some(ws) = &self.workspace
            && !ws.read_only
        {
            w.push(format!("writable workspace {}", ws.host_path.display()));
        }
        w
    }

    /// Whether re-running is harmless as far as the sandbox can tell: nothing leaves the
    /// container (no network) and nothing it writes survives it (no writable mount).
    pub fn is_hermetic(&self) -> bool {
        !self.network
            && self.publish.is_none()
            && self.workspace.as_ref().is_none_or(|w| w.read_only)
    }
}

impl Sandbox {
    /// Sets every isolation flag of a container on `body`: limits, network, IPC,
    /// capabilities, privileges, user, root filesystem, mounts and working directory.
    /// The caller fills in only what to run (image, command, environment, labels).
    pub(crate) fn apply(&self, body: &mut ContainerCreateBody) {
        let binds = self.workspace.as_ref().map(|w| {
            vec![format!(
                "{}:{}:{}",
                w.host_path.display(),
                Workspace::MOUNT_PATH,
                if w.read_only { "ro" } else { "rw" }
            )]
        });
        // A server: its network and its one port on loopback (see `Publish`).
        let (network_mode, port_bindings) = match &self.publish {
            Some(p) => (
                p.network.clone(),
                Some(HashMap::from([(
                    format!("{}/tcp", p.container_port),
                    Some(vec![PortBinding {
                        host_ip: Some("127.0.0.1".into()),
                        host_port: Some(match p.host_port {
                            0 => String::new(),
                            n => n.to_string(),
                        }),
                    }]),
                )])),
            ),
            None if self.network => ("bridge".to_string(), None),
            None => ("none".to_string(), None),
        };
        let tmpfs = self.read_only_root.then(|| {
            HashMap::from([(
                "/tmp".to_string(),
                format!("rw,nosuid,nodev,size={},mode=1777", self.tmp_bytes),
            )])
        });
        body.host_config = Some(HostConfig {
            memory: Some(self.memory_bytes),
            // Same as memory: no swap on top of the cap.
            memory_swap: Some(self.memory_bytes),
            nano_cpus: Some(self.nano_cpus),
            pids_limit: Some(self.pids_limit),
            network_mode: Some(network_mode),
            port_bindings,
            ipc_mode: Some(self.ipc_mode.clone()),
            cap_drop: Some(self.cap_drop.clone()),
            security_opt: self
                .no_new_privileges
                .then(|| vec!["no-new-privileges".to_string()]),
            readonly_rootfs: Some(self.read_only_root),
            tmpfs,
            binds,
            // The driver removes the container itself, after reading its exit state.
            auto_remove: Some(false),
            ..Default::default()
        });
        body.user = self.user.clone();
        body.network_disabled = Some(!self.network && self.publish.is_none());
        body.exposed_ports = self
            .publish
            .as_ref()
            .map(|p| vec![format!("{}/tcp", p.container_port)]);
        body.working_dir = Some(if self.workspace.is_some() {
            Workspace::MOUNT_PATH.into()
        } else {
            "/tmp".into()
        });
    }
}
