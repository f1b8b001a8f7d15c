//! One worker launch: `heddle worker RUN` (this same binary) in a process group of its
//! own, with a cleared environment, its console counted against the output limit, and
//! stopped by the watchdog on a limit or a signal.

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::process::Command;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// What the worker is started with: `EXE worker RUN [--pause N] [--json] [--config
/// FILE] [--packages DIR]` (the `heddle` binary's worker command), in `env` only.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    /// The program (the `heddle` binary).
    pub exe: PathBuf,
    /// The run it runs or recovers.
    pub run: String,
    /// Whether its report is the JSON one.
    pub json: bool,
    /// The configuration file it reads (`--config`).
    pub config: Option<PathBuf>,
    /// The package store it loads from (`--packages`).
    pub packages: Option<PathBuf>,
    /// The watchdog's log format, passed on (`--log-format`) so the worker logs as it
    /// does; in the JSON one, the worker's other lines (its progress, a panic) are
    /// passed on as JSON objects too ([`WorkerLines`]).
    pub log_format: crate::telemetry::LogFormat,
    /// Its whole environment ([`super::limits::worker_env`]).
    pub env: Vec<(String, std::ffi::OsString)>,
}

/// A worker's stderr as the watchdog passes it on in the JSON log format: a line that is
/// a JSON object already (the worker's own log lines) as it is, any other (its
/// progress, a panic's message) as an info event of target
/// `heddle_runtime::watch::worker` naming the run, so every line of the log is one
/// object.
pub struct WorkerLines {
    run: String,
    pending: Vec<u8>,
}

impl WorkerLines {
    /// The lines of run `run`'s worker.
    pub fn new(run: &str) -> WorkerLines {
        WorkerLines {
            run: run.to_string(),
            pending: Vec::new(),
        }
    }

    fn line(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if bytes.starts_with(b"{") && bytes.ends_with(b"}") {
            let mut line = bytes.to_vec();
            line.push(b'\n');
            // One write per line, so lines of two threads never interleave.
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), &line);
            return;
        }
        let text = String::from_utf8_lossy(bytes);
        tracing::info!(target: "heddle_runtime::watch::worker", run_id = %self.run, "{text}");
    }
}

impl std::io::Write for WorkerLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let rest = self.pending.split_off(i + 1);
            let line = std::mem::replace(&mut self.pending, rest);
            self.line(line[..i].strip_suffix(b"\r").unwrap_or(&line[..i]));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for WorkerLines {
    /// A last line without its newline (the worker died mid-line) is passed on too.
    fn drop(&mut self) {
        let last = std::mem::take(&mut self.pending);
        self.line(&last);
    }
}

/// Why the watchdog stopped a worker itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Its console went over the output limit.
    OutputLimit,
    /// The run time limit was reached.
    Timeout,
    /// The user interrupted the watchdog twice (the first interrupt is passed on).
    Stopped,
    /// Someone else ended the run in the store (`heddle runs cancel`) while the worker
    /// was busy with something that would not write for a while.
    EndedElsewhere,
}

/// How a launch ended.
#[derive(Debug)]
pub struct Ended {
    /// The worker's exit status.
    pub status: ExitStatus,
    /// Why the watchdog stopped it, when it did.
    pub stopped_for: Option<StopReason>,
    /// The user interrupted the watchdog once: the worker was asked to pause the run.
    pub interrupted: bool,
    /// Bytes it wrote to its console (stdout and stderr).
    pub output_bytes: u64,
}

impl Ended {
    /// `exit N` or `signal N`.
    pub fn describe(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown".into(),
        }
    }

    /// Died rather than ended: killed by a signal, or a panic (101).
    pub fn crashed(&self) -> bool {
        self.status.signal().is_some() || self.status.code() == Some(101)
    }
}

/// The watchdog's interrupt signals, registered once so a signal between launches is
/// not lost to the default action.
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    /// Registers the handlers for SIGINT and SIGTERM.
    pub fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for either signal.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {},
            _ = self.term.recv() => {},
        }
    }
}

impl WorkerCommand {
    /// Starts the worker; `pause` is the pause event it reopens, if any.
    pub fn spawn(&self, pause: Option<u64>) -> std::io::Result<tokio::process::Child> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("worker").arg(&self.run);
        if let Some(p) = pause {
            cmd.arg("--pause").arg(p.to_string());
        }
        if self.json {
            cmd.arg("--json");
        }
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        if let Some(p) = &self.packages {
            cmd.arg("--packages").arg(p);
        }
        cmd.arg("--log-format").arg(self.log_format.as_str());
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // The worker dies with its watchdog: nobody would supervise it. The watchdog
        // forks from its only (main) thread, so the signal comes at the watchdog's exit.
        heddle_runners::die_with_parent(&mut cmd);
        cmd.spawn()
    }
}

/// Waits for the worker, passing its stderr on to `console` (its progress and errors) and counting
/// its stdout without passing it on (a run's report and outputs come from the run store,
/// verified), up to `limit` bytes of both; stops it at the deadline, over the output
/// limit, or on a second interrupt.
///
/// `ended_elsewhere` is asked every [`POLL`] whether the run was ended in the store by
/// someone else; then the worker is stopped at once rather than at its next write.
pub async fn watch(
    mut child: tokio::process::Child,
    limit: u64,
    deadline: Option<tokio::time::Instant>,
    signals: &mut Signals,
    mut ended_elsewhere: impl FnMut() -> bool,
    console: &mut (dyn std::io::Write + Send),
) -> std::io::Result<Ended> {
    // Both pipes were requested at spawn.
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let group = heddle_runners::ProcessGroup::of_child(&child)?;
    let (mut out_open, mut err_open) = (true, true);
    let mut status: Option<ExitStatus> = None;
    let mut stopped_for = None;
    let mut interrupted = false;
    let mut total = 0u64;
    let (mut ob, mut eb) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    // After the worker exits, what is still in its pipes is read for a moment only: a
    // process it left behind holding them must not hold the watchdog.
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut poll = tokio::time::interval(POLL);
    loop {
        if status.is_some() && (!out_open && !err_open) {
            break;
        }
        let sleep_to = match (drain_until, deadline, stopped_for) {
            (Some(d), _, _) => Some(d),
            (None, Some(d), None) => Some(d),
            _ => None,
        };
        tokio::select! {
            s = child.wait(), if status.is_none() => {
                status = Some(s?);
                drain_until = Some(tokio::time::Instant::now() + Duration::from_millis(500));
            }
            n = read(&mut out, &mut ob), if out_open => match n {
                0 => out_open = false,
                n => {
                    admit(&ob[..n], &mut total, limit);
                }
            },
            n = read(&mut err, &mut eb), if err_open => match n {
                0 => err_open = false,
                n => {
                    let chunk = admit(&eb[..n], &mut total, limit);
                    let _ = console.write_all(chunk);
                }
            },
            _ = sleep_or_never(sleep_to) => {
                if status.is_some() {
                    break;
                }
                stopped_for = Some(StopReason::Timeout);
                group.kill();
            }
            _ = poll.tick(), if status.is_none() && stopped_for.is_none() => {
                if ended_elsewhere() {
                    stopped_for = Some(StopReason::EndedElsewhere);
                    group.kill();
                }
            }
            _ = signals.recv(), if status.is_none() => {
                if interrupted {
                    stopped_for.get_or_insert(StopReason::Stopped);
                    group.kill();
                } else {
                    // The worker pauses the run (resumable) and exits; only the worker
                    // itself, not its code nodes, which it stops as it cancels.
                    interrupted = true;
                    group.interrupt_leader();
                }
            }
        }
        if total > limit && stopped_for.is_none() && status.is_none() {
            stopped_for = Some(StopReason::OutputLimit);
            group.kill();
        }
    }
    let status = match status {
        Some(s) => s,
        None => child.wait().await?,
    };
    Ok(Ended {
        status,
        stopped_for,
        interrupted,
        output_bytes: total,
    })
}

/// How often a running worker's run is checked for an ending written by someone else.
pub const POLL: Duration = Duration::from_millis(250);

/// Counts `chunk` and returns the part within the limit (nothing past it is passed on).
fn admit<'a>(chunk: &'a [u8], total: &mut u64, limit: u64) -> &'a [u8] {
    let room = limit.saturating_sub(*total) as usize;
    *total += chunk.len() as u64;
    &chunk[..chunk.len().min(room)]
}

async fn read(r: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> usize {
    // A read error ends the stream like end of file: the worker's exit is what counts.
    r.read(buf).await.unwrap_or(0)
}

async fn sleep_or_never(until: Option<tokio::time::Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real process writing 2 MB to stderr is stopped at the limit (a small one here:
    /// what is within it reaches this test's stderr).
    #[tokio::test(flavor = "current_thread")]
    async fn a_process_flooding_its_console_is_stopped_at_the_output_limit() {
        let child = Command::new("sh")
            .args(["-c", "yes flood | head -c 2000000 >&2; sleep 60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut signals = Signals::new().unwrap();
        let ended = watch(
            child,
            1_000,
            None,
            &mut signals,
            || false,
            &mut std::io::stderr(),
        )
        .await
        .unwrap();
        assert_eq!(ended.stopped_for, Some(StopReason::OutputLimit));
        assert!(ended.output_bytes > 1_000);
        assert!(ended.crashed(), "killed, {}", ended.describe());
    }

    /// Without a flood or a deadline, the exit is the process's own.
    #[tokio::test(flavor = "current_thread")]
    async fn a_quiet_process_ends_on_its_own() {
        let child = Command::new("sh")
            .args(["-c", "echo hi; exit 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut signals = Signals::new().unwrap();
        let ended = watch(
            child,
            100_000,
            None,
            &mut signals,
            || false,
            &mut std::io::stderr(),
        )
        .await
        .unwrap();
        assert_eq!(ended.stopped_for, None);
        assert_eq!(ended.describe(), "exit 3");
        assert_eq!(ended.output_bytes, 3);
        assert!(!ended.crashed());
    }
}
