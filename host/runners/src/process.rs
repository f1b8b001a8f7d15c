//! Signals to the processes Heddle starts: a code node's subprocess, a watchdog's
//! worker, what a dead owner left behind. Every signal goes through the types here, so a
//! target can never be a pid `kill(2)` reads as "my own process group" (0) or "every
//! process I may signal" (−1, a group of 1), and the one `pre_exec` hook that makes a
//! child die with its parent is written once.

use std::num::NonZeroU32;
use std::time::Duration;

use rustix::process::{Pid, Signal};

/// A process group Heddle created for a child (`process_group(0)`: the group's id is the
/// child's pid). Never 0 or 1: `kill(-0)` would signal the caller's own group and
/// `kill(-1)` every process it may signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessGroup(NonZeroU32);

impl ProcessGroup {
    /// The group `pgid`; `None` for 0, 1 and ids past the kernel's range.
    pub fn new(pgid: u32) -> Option<ProcessGroup> {
        (pgid > 1 && i32::try_from(pgid).is_ok())
            .then(|| NonZeroU32::new(pgid).map(ProcessGroup))
            .flatten()
    }

    /// The group of `child`, spawned with `process_group(0)`. An error once the child
    /// has been reaped (its pid may belong to another process by then).
    pub fn of_child(child: &tokio::process::Child) -> std::io::Result<ProcessGroup> {
        child
            .id()
            .and_then(ProcessGroup::new)
            .ok_or_else(|| std::io::Error::other("the child has no pid (already reaped)"))
    }

    /// The group id (its leader's pid).
    pub fn id(self) -> u32 {
        self.0.get()
    }

    fn pid(self) -> Pid {
        // In range (checked by `new`) and not zero.
        Pid::from_raw(self.0.get() as i32).expect("a process group id is a valid pid")
    }

    /// SIGKILL to every process of the group. A group already gone is fine.
    pub fn kill(self) {
        let _ = rustix::process::kill_process_group(self.pid(), Signal::KILL);
    }

    /// SIGTERM to every process of the group: asks it to stop within a grace period.
    pub fn terminate(self) {
        let _ = rustix::process::kill_process_group(self.pid(), Signal::TERM);
    }

    /// SIGINT to the leader only (not what it started): a worker that stops its run
    /// itself and exits.
    pub fn interrupt_leader(self) {
        let _ = rustix::process::kill_process(self.pid(), Signal::INT);
    }

    /// Whether the group still exists (zombies included).
    pub fn exists(self) -> bool {
        rustix::process::test_kill_process_group(self.pid()).is_ok()
    }

    /// Whether the group has a member that is not a zombie (zombies hold no resources and
    /// init reaps them). Read from `/proc`, so it works for a group whose leader is gone.
    pub fn has_live_members(self) -> bool {
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
            let pgrp = f.nth(1).and_then(|p| p.parse::<u32>().ok());
            pgrp == Some(self.id()) && state != Some("Z")
        })
    }

    /// Waits (bounded) until no live process is left in the group: kill(2) only queues
    /// the signal, and a killed process may linger for a moment while it exits.
    pub async fn wait_gone(self, limit: Duration) {
        let t0 = tokio::time::Instant::now();
        while self.exists() && self.has_live_members() {
            if t0.elapsed() >= limit {
                tracing::warn!(pgid = self.id(), "processes still exiting after SIGKILL");
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl std::fmt::Display for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process group {}", self.0)
    }
}

/// SIGKILL to process `pid` alone (found in `/proc`, such as what a dead owner left);
/// true when it was delivered. 0 and 1 are refused (false), as a group's are.
pub fn kill_process(pid: u32) -> bool {
    match i32::try_from(pid)
        .ok()
        .filter(|p| *p > 1)
        .and_then(Pid::from_raw)
    {
        Some(pid) => rustix::process::kill_process(pid, Signal::KILL).is_ok(),
        None => false,
    }
}

/// Makes the child `cmd` spawns die (SIGKILL) when the thread that spawned it exits,
/// which for a process that spawns from its main thread or from tokio's worker threads
/// is that process's end at the latest. A spawn from a parent that died between fork and
/// exec fails (`ESRCH`) instead of leaving a child nobody would stop.
pub fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec, so it may only make
    // async-signal-safe calls: rustix's prctl(2) and getppid(2) are system calls that
    // touch no memory of the parent's and allocate nothing (the error is built from a
    // raw errno only).
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
                .map_err(std::io::Error::from)?;
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from(rustix::io::Errno::SRCH));
            }
            Ok(())
        });
    }
}

/// Makes the child `cmd` spawns (with `process_group(0)`) take its whole process group
/// with it when the parent dies, not only itself: what the program starts in the
/// background dies too, at once, even when the parent is killed with SIGKILL.
///
/// The child stays behind as the group's guard and a fork of it runs the program. The
/// guard holds no file and blocks every signal but one, its parent-death signal, whose
/// handler SIGKILLs the group (the guard and the program included); the program itself
/// dies with the guard (SIGKILL). Otherwise the guard waits for the program and exits as
/// it did (the same code, or killed by the same signal), so the parent sees the
/// program's own ending. What leaves the group (`setsid`, `setpgid`) is not covered; the
/// owner sweeps ([`crate::remove_orphan_processes`]) find it by its environment.
///
/// The guard is a fork that never executes anything else: it shares the parent's
/// memory copy-on-write and keeps the pages the parent changes while the program runs.
pub fn group_dies_with_parent(cmd: &mut tokio::process::Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec, so it makes only
    // async-signal-safe calls (system calls through libc and rustix; nothing allocates,
    // no lock is taken): see `guard_then_run`.
    unsafe {
        cmd.pre_exec(move || guard_then_run(parent));
    }
}

/// The guard's parent-death signal: one no program is likely to send its own group.
fn guard_signal() -> libc::c_int {
    libc::SIGRTMAX()
}

extern "C" fn kill_own_group(_: libc::c_int) {
    // SAFETY: kill(2) is async-signal-safe; pid 0 is the caller's own process group,
    // which is the guard's: exactly the group to end.
    unsafe { libc::kill(0, libc::SIGKILL) };
}

/// Returns (`Ok`) only in the process that goes on to exec the program; the guard never
/// returns.
///
/// # Safety
///
/// Only in a forked child before exec (a `pre_exec` hook).
unsafe fn guard_then_run(parent: Pid) -> std::io::Result<()> {
    let gone = || std::io::Error::from(rustix::io::Errno::SRCH);
    // SAFETY (the whole body): every call is an async-signal-safe system call on memory
    // of this stack frame.
    unsafe {
        let mut on_death: libc::sigaction = std::mem::zeroed();
        on_death.sa_sigaction = kill_own_group as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut on_death.sa_mask);
        if libc::sigaction(guard_signal(), &on_death, std::ptr::null_mut()) != 0
            || libc::prctl(libc::PR_SET_PDEATHSIG, guard_signal() as libc::c_ulong) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // The parent died before the death signal was armed: it would never come.
        if rustix::process::getppid() != Some(parent) {
            return Err(gone());
        }
        let guard = rustix::process::getpid();
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                // The program's process: the guard's handler is not its own, and it
                // dies with the guard.
                libc::signal(guard_signal(), libc::SIG_DFL);
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if rustix::process::getppid() != Some(guard) {
                    return Err(gone());
                }
                Ok(())
            }
            program => guard_wait(program),
        }
    }
}

/// The guard's life: no file open (the program's pipes, and the pipe that tells the
/// parent the exec succeeded, close when the program's copies do), every signal but its
/// own blocked, waiting for the program, then ending as it ended.
///
/// # Safety
///
/// Only in a forked child before exec.
unsafe fn guard_wait(program: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe system calls on this frame's memory only.
    unsafe {
        if libc::close_range(0, u32::MAX, 0) != 0 {
            let mut lim: libc::rlimit = std::mem::zeroed();
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                lim.rlim_cur.min(1 << 20) as libc::c_int
            } else {
                1024
            };
            for fd in 0..max {
                libc::close(fd);
            }
        }
        let mut blocked: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut blocked);
        libc::sigdelset(&mut blocked, guard_signal());
        libc::sigprocmask(libc::SIG_SETMASK, &blocked, std::ptr::null_mut());
        let mut status = 0;
        loop {
            if libc::waitpid(program, &mut status, 0) == program {
                break;
            }
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            // Ends the way the program did, without a core file of the parent's memory.
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut only: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut only);
            libc::sigaddset(&mut only, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_never_our_own_or_everyones() {
        assert_eq!(ProcessGroup::new(0), None);
        assert_eq!(ProcessGroup::new(1), None);
        assert_eq!(ProcessGroup::new(u32::MAX), None);
        assert_eq!(ProcessGroup::new(i32::MAX as u32 + 1), None);
        assert_eq!(ProcessGroup::new(2).map(ProcessGroup::id), Some(2));
        assert!(!kill_process(0));
        assert!(!kill_process(1));
    }

    /// A child in its own group: the group is seen while it lives and gone once killed.
    #[tokio::test]
    async fn a_killed_group_is_gone() {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "sleep 60 & sleep 60"]).process_group(0);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let group = ProcessGroup::of_child(&child).unwrap();
        assert!(group.exists());
        group.kill();
        child.wait().await.unwrap();
        group.wait_gone(Duration::from_secs(10)).await;
        assert!(!group.has_live_members());
        assert!(ProcessGroup::of_child(&child).is_err(), "reaped: no group");
    }

    fn guarded(script: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", script])
            .process_group(0)
            .stdout(std::process::Stdio::piped());
        group_dies_with_parent(&mut cmd);
        cmd
    }

    /// Under a guard the program runs in the guard's group and its ending is the
    /// parent's to see as it was: its exit code, or the signal that killed it.
    #[tokio::test]
    async fn a_guarded_program_ends_as_it_would_alone() {
        use std::os::unix::process::ExitStatusExt as _;
        // The program's group (field 5 of its stat) is the guard's, the child's pid.
        let out = guarded("cut -d' ' -f5 /proc/$$/stat; exit 3")
            .spawn()
            .unwrap();
        let guard = out.id().unwrap();
        let out = out.wait_with_output().await.unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            guard.to_string()
        );

        let mut child = guarded("kill -TERM $$; sleep 60").spawn().unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");

        // A group TERM reaches the program (the guard blocks it and mirrors the end).
        // The spawn returned, so the program is already executing: the pipe through
        // which a failed exec is reported closes only at its exec.
        let mut child = guarded("sleep 60").spawn().unwrap();
        let group = ProcessGroup::of_child(&child).unwrap();
        group.terminate();
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        group.wait_gone(Duration::from_secs(10)).await;
        assert!(!group.has_live_members());
    }
}
