//! Who started a container or a host process, written on it (a container label, a
//! scratch directory name, an environment variable), so that a later heddle can tell
//! the leftovers of one that died (`kill -9`, a crash, a reboot) from the work of one
//! that still runs, even when several hosts share one Docker engine.
//!
//! A pid alone is not enough: pids are reused, and another host's pid means nothing
//! here. The owner is the host (machine id and hostname), the boot, the pid and the
//! process's start time. Only an owner of this host can be judged; another host's
//! containers are left to that host.

use std::sync::OnceLock;

/// The identity of one heddle process.
/// Written as a token (`host-boot-pid-start`) in the `heddle.owner` container label,
/// the `HEDDLE_OWNER` environment variable and scratch directory names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessOwner {
    /// Hash of the machine id and the hostname (hex).
    host: String,
    /// Start of the kernel's boot id (hex): a process of an earlier boot is gone.
    boot: String,
    pid: u32,
    /// Start time of the process in clock ticks since boot (`/proc/PID/stat` field 22).
    start: u64,
}

impl ProcessOwner {
    /// This process.
    pub fn current() -> &'static ProcessOwner {
        static CURRENT: OnceLock<ProcessOwner> = OnceLock::new();
        CURRENT.get_or_init(|| {
            let pid = std::process::id();
            ProcessOwner {
                host: host_id(),
                boot: boot_id(),
                pid,
                // This process exists, so its stat is readable; 0 only without /proc,
                // where no owner can be judged anyway.
                start: start_time(pid).unwrap_or(0),
            }
        })
    }

    /// The text written on what this owner starts: `host-boot-pid-start`, safe in a
    /// label value, a file name and an environment variable.
    pub fn token(&self) -> String {
        format!("{}-{}-{}-{}", self.host, self.boot, self.pid, self.start)
    }

    /// Process `pid` of this host, while it exists (a zombie still has its start time):
    /// a watchdog reads its worker's identity right after starting it.
    pub fn of_pid(pid: u32) -> Option<ProcessOwner> {
        let me = ProcessOwner::current();
        Some(ProcessOwner {
            host: me.host.clone(),
            boot: me.boot.clone(),
            pid,
            start: start_time(pid)?,
        })
    }

    pub fn parse(token: &str) -> Option<ProcessOwner> {
        let mut parts = token.split('-');
        let (host, boot, pid, start) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        if parts.next().is_some() || !hex(host) || !hex(boot) {
            return None;
        }
        Some(ProcessOwner {
            host: host.into(),
            boot: boot.into(),
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        })
    }

    /// Whether this owner is certainly gone: same host, and an earlier boot, or no
    /// process with its pid and start time. `false` for another host's owner (it cannot
    /// be judged from here) and for a live one.
    pub fn is_gone(&self) -> bool {
        let me = ProcessOwner::current();
        if self.host != me.host {
            return false;
        }
        self.boot != me.boot || start_time(self.pid) != Some(self.start)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// Start time of process `pid` in clock ticks since boot; `None` when it does not exist.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …": comm may hold spaces and parentheses, so fields are
    // counted after the last ')'. starttime is field 22, the 20th after comm.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// 16 hex digits naming this host: the machine id alone is not enough (containers of one
/// image share it), the hostname alone neither (hosts get the same name).
fn host_id() -> String {
    let machine = match read_trimmed("/etc/machine-id") {
        m if m.is_empty() => read_trimmed("/var/lib/dbus/machine-id"),
        m => m,
    };
    let hostname = read_trimmed("/proc/sys/kernel/hostname");
    format!(
        "{:016x}",
        fnv1a(format!("{machine}\n{hostname}").as_bytes())
    )
}

fn boot_id() -> String {
    let id: String = read_trimmed("/proc/sys/kernel/random/boot_id")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    if id.is_empty() { "0".into() } else { id }
}

/// FNV-1a: stable across builds and Rust versions (unlike std's hasher), so two heddle
/// versions on one host agree on its id.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_is_alive_and_its_token_round_trips() {
        let me = ProcessOwner::current();
        assert!(me.start > 0);
        let back = ProcessOwner::parse(&me.token()).unwrap();
        assert_eq!(&back, me);
        assert!(!back.is_gone());
    }

    #[test]
    fn a_reused_pid_an_earlier_boot_or_a_missing_process_is_gone() {
        let me = ProcessOwner::current();
        let reused = ProcessOwner {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(reused.is_gone());
        let earlier_boot = ProcessOwner {
            boot: "ffffffffffff".into(),
            ..me.clone()
        };
        assert!(earlier_boot.is_gone());
        let missing = ProcessOwner {
            pid: u32::MAX,
            ..me.clone()
        };
        assert!(missing.is_gone());
    }

    #[test]
    fn another_hosts_owner_is_never_judged_gone() {
        let other = ProcessOwner {
            host: "0123456789abcdef".into(),
            pid: u32::MAX,
            ..ProcessOwner::current().clone()
        };
        assert!(!other.is_gone());
    }

    #[test]
    fn malformed_tokens_are_not_owners() {
        for t in ["", "123", "a-b-c", "zz-00-1-2", "ab-cd-1-2-3", "ab-cd-x-2"] {
            assert_eq!(ProcessOwner::parse(t), None, "{t}");
        }
    }
}
