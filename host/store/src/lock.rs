//! One watchdog per run: an OS file lock scoped to the run store and the run id.
//!
//! The lock file lives beside the store (`<store>.watchdog/<run>.lock`), so two
//! watchdogs started from different directories against the same store meet on the same
//! file. `flock(2)` decides who holds it, so a live holder can never be taken over; the
//! holder's pid is written into the file and only erased by an orderly release. A file
//! that still names a pid while nobody holds the `flock` was left by a watchdog that
//! died: it is *stale*, and it is not taken over silently (whatever that watchdog was
//! doing may not have been cleaned up). [`unlock`] releases it explicitly, after checking
//! that the process is gone.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

/// What can go wrong taking, inspecting or releasing a run's process lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "run {run} is supervised by another watchdog (pid {pid}, lock {}); PROCESS_LOCKED",
        path.display()
    )]
    Locked {
        run: String,
        pid: u32,
        path: PathBuf,
    },
    #[error(
        "run {run}: the watchdog that held it (pid {pid}) died without releasing its lock ({}); what it started may not have been cleaned up. Check, then release it with `heddle runs unlock {run}`; PROCESS_LOCKED",
        path.display()
    )]
    Stale {
        run: String,
        pid: u32,
        path: PathBuf,
    },
    #[error("run {run}: the lock names pid {pid}, which is still running; it is not released")]
    OwnerAlive { run: String, pid: u32 },
    #[error("run {run} is not locked")]
    NotLocked { run: String },
    #[error("{}: cannot {action} the run's process lock", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Who holds a run's lock, as another process sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "lock", rename_all = "snake_case")]
pub enum LockState {
    /// Nobody holds it.
    Free,
    /// A live process holds it.
    Held { pid: u32 },
    /// A process that died left it (see [`unlock`]).
    Stale { pid: u32 },
}

/// The directory beside the store holding its watchdogs' lock and state files.
pub fn watchdog_dir(store: &Path) -> PathBuf {
    // Canonical, so `./runs.db` and `/abs/dir/runs.db` meet on one file.
    let store = store.canonicalize().unwrap_or_else(|_| store.to_path_buf());
    let mut name = store.file_name().unwrap_or_default().to_os_string();
    name.push(".watchdog");
    store.with_file_name(name)
}

/// The lock file of `run` in `store`.
pub fn lock_path(store: &Path, run: &str) -> PathBuf {
    watchdog_dir(store).join(format!("{run}.lock"))
}

/// A held lock; released (the pid erased) by [`ProcessLock::release`], or when dropped
/// (an error return). Only a process that dies holding it, or one that keeps it on
/// purpose ([`ProcessLock::retain`]), leaves its pid behind: the lock then reads stale.
#[derive(Debug)]
pub struct ProcessLock {
    file: File,
    path: PathBuf,
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LockError {
    let path = path.to_path_buf();
    move |source| LockError::Io {
        action,
        path,
        source,
    }
}

/// The OS lock (`flock(2)` on Linux) without waiting; `Ok(false)` when another process
/// holds it.
fn try_flock(file: &File, exclusive: bool) -> std::io::Result<bool> {
    let taken = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    match taken {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn recorded_pid(file: &mut File) -> std::io::Result<Option<u32>> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut s)?;
    Ok(s.split_whitespace().next().and_then(|p| p.parse().ok()))
}

fn open(path: &Path, create: bool) -> Result<Option<File>, LockError> {
    if create && let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create the directory of", path))?;
    }
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("open", path)(e)),
    }
}

impl ProcessLock {
    /// Takes the lock of `run` in `store` for this process. Refused while another
    /// process holds it ([`LockError::Locked`]) and when a dead holder left it
    /// ([`LockError::Stale`]).
    pub fn acquire(store: &Path, run: &str) -> Result<ProcessLock, LockError> {
        let path = lock_path(store, run);
        // `open` with `create` always yields a file.
        let Some(mut file) = open(&path, true)? else {
            unreachable!("created")
        };
        let held = try_flock(&file, true).map_err(io("lock", &path))?;
        let pid = recorded_pid(&mut file).map_err(io("read", &path))?;
        if !held {
            return Err(LockError::Locked {
                run: run.to_string(),
                pid: pid.unwrap_or(0),
                path,
            });
        }
        if let Some(pid) = pid {
            // Dropping `file` releases the flock again.
            return Err(LockError::Stale {
                run: run.to_string(),
                pid,
                path,
            });
        }
        file.set_len(0).map_err(io("write", &path))?;
        file.seek(SeekFrom::Start(0)).map_err(io("write", &path))?;
        writeln!(file, "{}", std::process::id()).map_err(io("write", &path))?;
        file.sync_all().map_err(io("sync", &path))?;
        Ok(ProcessLock { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Erases the pid and lets go: the run is free for the next watchdog.
    pub fn release(self) -> Result<(), LockError> {
        self.file.set_len(0).map_err(io("release", &self.path))?;
        self.file.sync_all().map_err(io("sync", &self.path))
        // Dropping closes the file, which releases the flock.
    }

    /// Keeps the lock held until this process exits, and its pid in the file after:
    /// for a run whose cleanup could not be verified, which the next watchdog must not
    /// take over without someone checking (`heddle runs unlock`).
    pub fn retain(self) {
        // The descriptor (and with it the flock) stays open until the process exits.
        std::mem::forget(self);
    }
}

impl Drop for ProcessLock {
    fn drop(&mut self) {
        // Best effort: a lock dropped on an error return is free, not stale.
        let _ = self.file.set_len(0);
    }
}

/// Who holds the lock of `run`, without taking it (a shared probe, dropped at once).
pub fn inspect(store: &Path, run: &str) -> Result<LockState, LockError> {
    let path = lock_path(store, run);
    let Some(mut file) = open(&path, false)? else {
        return Ok(LockState::Free);
    };
    let free = try_flock(&file, false).map_err(io("probe", &path))?;
    let pid = recorded_pid(&mut file).map_err(io("read", &path))?;
    Ok(match (free, pid) {
        (false, pid) => LockState::Held {
            pid: pid.unwrap_or(0),
        },
        (true, Some(pid)) => LockState::Stale { pid },
        (true, None) => LockState::Free,
    })
}

/// Releases a stale lock after checking that its holder is gone; returns its pid. A
/// lock held by a live process is never released ([`LockError::Locked`]), nor one whose
/// recorded pid runs again ([`LockError::OwnerAlive`]: it may be the holder's child).
pub fn unlock(store: &Path, run: &str) -> Result<u32, LockError> {
    let path = lock_path(store, run);
    let Some(mut file) = open(&path, false)? else {
        return Err(LockError::NotLocked {
            run: run.to_string(),
        });
    };
    let held = try_flock(&file, true).map_err(io("lock", &path))?;
    let pid = recorded_pid(&mut file).map_err(io("read", &path))?;
    match (held, pid) {
        (false, pid) => Err(LockError::Locked {
            run: run.to_string(),
            pid: pid.unwrap_or(0),
            path,
        }),
        (true, None) => Err(LockError::NotLocked {
            run: run.to_string(),
        }),
        (true, Some(pid)) if crate::status::pid_alive(pid) => Err(LockError::OwnerAlive {
            run: run.to_string(),
            pid,
        }),
        (true, Some(pid)) => {
            file.set_len(0).map_err(io("release", &path))?;
            file.sync_all().map_err(io("sync", &path))?;
            Ok(pid)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_a_release_frees_and_a_dropped_lock_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("runs.db");
        std::fs::write(&store, b"").unwrap();
        let lock = ProcessLock::acquire(&store, "r1").unwrap();
        // flock is per open file description: a second open in this process conflicts
        // just as another process would.
        let again = ProcessLock::acquire(&store, "r1").unwrap_err();
        assert!(
            matches!(again, LockError::Locked { pid, .. } if pid == std::process::id()),
            "{again}"
        );
        assert_eq!(
            inspect(&store, "r1").unwrap(),
            LockState::Held {
                pid: std::process::id()
            }
        );
        // Another run of the same store is independent.
        ProcessLock::acquire(&store, "r2")
            .unwrap()
            .release()
            .unwrap();
        lock.release().unwrap();
        assert_eq!(inspect(&store, "r1").unwrap(), LockState::Free);

        // Dropped (an error return): free again.
        drop(ProcessLock::acquire(&store, "r1").unwrap());
        assert_eq!(inspect(&store, "r1").unwrap(), LockState::Free);
        // Retained: held by this process until it exits.
        ProcessLock::acquire(&store, "r3").unwrap().retain();
        assert_eq!(
            inspect(&store, "r3").unwrap(),
            LockState::Held {
                pid: std::process::id()
            }
        );

        // A holder that died (its pid in the file, nobody holding the flock) leaves a
        // stale lock, refused until it is unlocked; a pid that runs is not unlocked.
        std::fs::write(lock_path(&store, "r1"), format!("{}\n", std::process::id())).unwrap();
        assert!(matches!(
            inspect(&store, "r1").unwrap(),
            LockState::Stale { .. }
        ));
        assert!(matches!(
            ProcessLock::acquire(&store, "r1").unwrap_err(),
            LockError::Stale { .. }
        ));
        assert!(matches!(
            unlock(&store, "r1").unwrap_err(),
            LockError::OwnerAlive { .. }
        ));
        // A pid that cannot run: released.
        std::fs::write(lock_path(&store, "r1"), format!("{}\n", u32::MAX)).unwrap();
        assert_eq!(unlock(&store, "r1").unwrap(), u32::MAX);
        assert_eq!(inspect(&store, "r1").unwrap(), LockState::Free);
        assert!(matches!(
            unlock(&store, "r1").unwrap_err(),
            LockError::NotLocked { .. }
        ));
    }
}
