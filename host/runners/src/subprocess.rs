//! Subprocess mode: a host child process in its own process group.
//!
//! Only the time limit, the output cap and the group kill are enforced here; memory,
//! network, user and capability settings need the container (see `CodeNodes`, which
//! refuses them in this mode rather than ignoring them).

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::error::RunnerError;
use crate::lines::Interrupt;
use crate::running::{Drive, Running, launch};
use crate::spec::{Exit, RunSpec, Stream};

/// Signals a whole process group; kills on drop so no path leaves the group running.
struct Group {
    pgid: i32,
}

impl Group {
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with a negative pid signals the process group we created with
        // `process_group(0)`; it touches no memory of ours. ESRCH (already gone) is fine.
        unsafe {
            libc::kill(-self.pgid, sig);
        }
    }
}

impl Group {
    /// Waits (bounded) until no live process is left in the group: kill(2) only queues
    /// the signal, and a killed process may linger for a moment while it exits.
    /// Zombies count as gone: they hold no resources and init reaps them.
    async fn wait_gone(&self, limit: std::time::Duration) {
        let t0 = Instant::now();
        loop {
            // SAFETY: signal 0 only checks that the group exists; nothing is delivered.
            if unsafe { libc::kill(-self.pgid, 0) } != 0 || !self.has_live_members() {
                return;
            }
            if t0.elapsed() >= limit {
                tracing::warn!(pgid = self.pgid, "processes still exiting after SIGKILL");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    fn has_live_members(&self) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return false;
        };
        dir.flatten().any(|e| {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                return false;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // "pid (comm) state ppid pgrp …"; comm may contain ") ", so split at the last.
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let mut f = rest.split(' ');
            let state = f.next();
            let pgrp = f.nth(1).and_then(|p| p.parse::<i32>().ok());
            pgrp == Some(self.pgid) && state != Some("Z")
        })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

pub(crate) async fn start(
    spec: RunSpec,
    tracker: Option<&TaskTracker>,
) -> Result<Running, RunnerError> {
    let started = Instant::now();
    // A fresh scratch directory per run unless a workspace is given.
    let (workdir, scratch) = match &spec.sandbox.workspace {
        Some(w) => (w.host_path.clone(), None),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("heddle-code-")
                .tempdir()
                .map_err(|source| RunnerError::Io {
                    action: "creating the scratch directory",
                    source,
                })?;
            (dir.path().to_path_buf(), Some(dir))
        }
    };
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env("HOME", &workdir)
        .env("TMPDIR", &workdir)
        .env("LANG", "C.UTF-8")
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| RunnerError::Spawn {
        program: spec.argv[0].clone(),
        source,
    })?;
    let pid = child.id().ok_or_else(|| RunnerError::NoPid {
        program: spec.argv[0].clone(),
    })?;
    let group = Group { pgid: pid as i32 };
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
                group.signal(libc::SIGKILL);
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
        group.signal(libc::SIGTERM);
        status = match tokio::time::timeout(grace, child.wait()).await {
            Ok(s) => s.ok(),
            Err(_) => {
                group.signal(libc::SIGKILL);
                child.wait().await.ok()
            }
        };
    }
    group.signal(libc::SIGKILL);
    group.wait_gone(std::time::Duration::from_secs(2)).await;
    drop(group);
    let mut exit = Exit::default();
    if let Some(s) = status {
        exit.code = s.code().map(i64::from);
        exit.signal = s.signal();
    }
    sink.conclude(interrupt, &mut exit);
    exit
}
