//! Subprocess mode: a host child process in its own process group.
//!
//! Only the time limit, the output cap and the group kill are enforced here; memory,
//! network, user and capability settings need the container (see `CodeNodes`, which
//! refuses them in this mode rather than ignoring them).
//!
//! Should heddle itself die (`kill -9`, a crash), the child's whole process group goes
//! with it at once ([`crate::group_dies_with_parent`]: a guard process in the group
//! SIGKILLs it on heddle's death). What left the group (`setsid`) and the scratch
//! directories are found by the next heddle: every process carries its owner in
//! `HEDDLE_OWNER` and every scratch directory has the owner in its name, so
//! [`remove_orphan_processes`] kills and removes what a dead owner left.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::lines::Interrupt;
use crate::owner::ProcessOwner;
use crate::process::{ProcessGroup, group_dies_with_parent, kill_process};
use crate::running::{Drive, Running, launch};
use crate::spec::{Exit, RunSpec, Stream};

/// The child's process group, killed on drop so no path leaves it running.
struct Group(ProcessGroup);

impl Drop for Group {
    fn drop(&mut self) {
        self.0.kill();
    }
}

/// The environment variable holding the owner's token in every process a run starts
/// (inherited by what it starts in turn, unless the code clears its environment).
const OWNER_ENV: &str = "HEDDLE_OWNER";

/// The directory holding this user's scratch directories (`$TMPDIR/heddle-code-<uid>`),
/// created private; refused when someone else owns it or can write to it.
fn scratch_root() -> Result<std::path::PathBuf, RunnerError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = rustix::process::getuid().as_raw();
    let root = std::env::temp_dir().join(format!("heddle-code-{uid}"));
    let io = |source| RunnerError::Io {
        action: "creating the scratch root",
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let meta = std::fs::symlink_metadata(&root).map_err(io)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(RunnerError::UnsafeScratchRoot { path: root });
    }
    Ok(root)
}

/// What [`remove_orphan_processes`] cleaned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrphanSweep {
    /// Processes killed.
    pub processes: usize,
    /// Scratch directories removed.
    pub directories: usize,
}

/// Kills the subprocess-mode processes of heddles of this host that are gone, and
/// removes their scratch directories; those of live heddles are left alone. Run by the
/// code nodes before a run's first code node starts.
pub fn remove_orphan_processes() -> Result<OrphanSweep, RunnerError> {
    let root = scratch_root()?;
    let entries = std::fs::read_dir(&root).map_err(|source| RunnerError::Io {
        action: "listing the scratch root",
        source,
    })?;
    let mut dead_dirs = Vec::new();
    let mut dead_tokens = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((token, _)) = name.to_str().and_then(|n| n.rsplit_once('-')) else {
            continue;
        };
        if ProcessOwner::parse(token).is_some_and(|o| o.is_gone()) {
            if !dead_tokens.iter().any(|t| t == token) {
                dead_tokens.push(token.to_string());
            }
            dead_dirs.push(entry.path());
        }
    }
    let mut sweep = OrphanSweep::default();
    if dead_tokens.is_empty() {
        return Ok(sweep);
    }
    // Processes first, so nothing writes into a directory being removed.
    let marks: Vec<Vec<u8>> = dead_tokens
        .iter()
        .map(|t| format!("{OWNER_ENV}={t}").into_bytes())
        .collect();
    for pid in processes_with_env(&marks) {
        if kill_process(pid) {
            sweep.processes += 1;
        }
    }
    for dir in dead_dirs {
        if std::fs::remove_dir_all(&dir).is_ok() {
            sweep.directories += 1;
        }
    }
    Ok(sweep)
}

/// Pids of the live processes started for owner `token` (the [`ProcessOwner::token`] of a
/// heddle process): code nodes it ran in subprocess mode and what they started in turn.
pub fn owned_processes(token: &str) -> Vec<u32> {
    processes_with_env(&[format!("{OWNER_ENV}={token}").into_bytes()])
        .into_iter()
        .filter(|pid| crate::owner::start_time(*pid).is_some() && !is_zombie(*pid))
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with(['Z', 'X']))
    })
}

/// Kills what owner `token` started in subprocess mode and removes its scratch
/// directories, whether or not the owner is still alive: a watchdog calls it for a
/// worker it has already stopped. [`owned_processes`] verifies the result.
pub fn sweep_owner(token: &str) -> Result<OrphanSweep, RunnerError> {
    let mut sweep = OrphanSweep::default();
    for pid in owned_processes(token) {
        if kill_process(pid) {
            sweep.processes += 1;
        }
    }
    let root = scratch_root()?;
    let prefix = format!("{token}-");
    let entries = std::fs::read_dir(&root).map_err(|source| RunnerError::Io {
        action: "listing the scratch root",
        source,
    })?;
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
            && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            sweep.directories += 1;
        }
    }
    Ok(sweep)
}

/// Pids of the processes (readable by us) whose environment holds one of `marks`
/// (`NAME=value`) as a whole entry.
fn processes_with_env(marks: &[Vec<u8>]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|&b| b == 0)
                    .any(|entry| marks.iter().any(|m| entry == m.as_slice()))
            })
        })
        .collect()
}

pub(crate) async fn start(
    spec: RunSpec,
    tracker: Option<&TaskTracker>,
) -> Result<Running, RunnerError> {
    let started = Instant::now();
    // A fresh scratch directory per run: HOME and TMPDIR, and the working directory
    // unless a workspace is given. Its name says who owns it.
    let scratch = tempfile::Builder::new()
        .prefix(&format!("{}-", ProcessOwner::current().token()))
        .tempdir_in(scratch_root()?)
        .map_err(|source| RunnerError::Io {
            action: "creating the scratch directory",
            source,
        })?;
    let workdir = match &spec.sandbox.workspace {
        Some(w) => w.host_path.clone(),
        None => scratch.path().to_path_buf(),
    };
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env("HOME", scratch.path())
        .env("TMPDIR", scratch.path())
        .env("LANG", "C.UTF-8")
        .env(OWNER_ENV, ProcessOwner::current().token())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // The program and everything it starts in its group die with heddle (at the latest
    // when heddle exits: tokio's worker threads fork).
    group_dies_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| RunnerError::Spawn {
        program: spec.argv[0].clone(),
        source,
    })?;
    let group = ProcessGroup::of_child(&child).map_err(|_| RunnerError::NoPid {
        program: spec.argv[0].clone(),
    })?;
    let pid = group.id();
    let group = Group(group);
    // Both pipes were requested above, so both are present.
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let grace = spec.sandbox.kill_grace;
    Ok(launch(
        &spec,
        started,
        pid.to_string(),
        Vec::new(),
        tracker,
        |run| async move {
            let exit = drive(child, group, stdout, stderr, run, grace).await;
            drop(scratch);
            Ok(exit)
        },
    ))
}

async fn drive(
    mut child: tokio::process::Child,
    group: Group,
    mut stdout: tokio::process::ChildStdout,
    mut stderr: tokio::process::ChildStderr,
    run: Drive,
    grace: std::time::Duration,
) -> Exit {
    let Drive {
        mut sink,
        stop,
        deadline,
    } = run;
    let mut out_buf = vec![0u8; 16 * 1024];
    let mut err_buf = vec![0u8; 16 * 1024];
    let (mut out_open, mut err_open) = (true, true);
    let mut status: Option<ExitStatus> = None;
    let mut interrupt = None;
    while out_open || err_open || status.is_none() {
        let pushed = tokio::select! {
            biased;
            _ = stop.cancelled() => Err(Interrupt::Stopped),
            _ = tokio::time::sleep_until(deadline) => Err(Interrupt::Timeout),
            s = child.wait(), if status.is_none() => {
                status = s.ok();
                // The program is done; whatever it left in its group (background jobs
                // holding our pipes) goes now, so the pipes close and nothing lingers.
                group.0.kill();
                Ok(())
            }
            n = stdout.read(&mut out_buf), if out_open => match n {
                Ok(0) | Err(_) => { out_open = false; Ok(()) }
                Ok(n) => sink.push(Stream::Stdout, &out_buf[..n]).await,
            },
            n = stderr.read(&mut err_buf), if err_open => match n {
                Ok(0) | Err(_) => { err_open = false; Ok(()) }
                Ok(n) => sink.push(Stream::Stderr, &err_buf[..n]).await,
            },
        };
        if let Err(i) = pushed {
            interrupt = Some(i);
            break;
        }
    }
    if interrupt.is_none() {
        interrupt = sink.finish().await.err();
    }
    if interrupt.is_some() && status.is_none() {
        group.0.terminate();
        status = match tokio::time::timeout(grace, child.wait()).await {
            Ok(s) => s.ok(),
            Err(_) => {
                group.0.kill();
                child.wait().await.ok()
            }
        };
    }
    group.0.kill();
    group.0.wait_gone(std::time::Duration::from_secs(2)).await;
    drop(group);
    let mut exit = Exit::default();
    if let Some(s) = status {
        exit.code = s.code().map(i64::from);
        exit.signal = s.signal();
    }
    sink.conclude(interrupt, &mut exit);
    exit
}
