//! The optional write quota of a grant (`[packages.X] files_write_quota`): the bytes one
//! invocation may add to files in its read-write directories, all of them together.
//!
//! Without it a guest with a read-write directory can fill the host's disk, or create a
//! 1 TiB sparse file in one `set-size`. Growth is what lies past the file's current
//! end, holes included, so a sparse file costs its apparent size. Rewriting existing
//! bytes costs nothing. A charge that does not fit fails and takes nothing. The
//! filesystem functions that charge it are in [`crate::fs_quota`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes one invocation may still add to files. Shared by the store state and the
/// streams it hands out.
#[derive(Debug)]
pub(crate) struct WriteQuota {
    limit: u64,
    used: AtomicU64,
}

impl WriteQuota {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(WriteQuota {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// A new invocation starts with the whole quota (a warm store is reused).
    pub fn reset(&self) {
        self.used.store(0, Ordering::Relaxed);
    }

    /// Takes `growth` bytes from the quota, or nothing when they do not fit.
    pub(crate) fn charge(&self, growth: u64) -> bool {
        if growth == 0 {
            return true;
        }
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(growth).filter(|&u| u <= self.limit)
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_that_does_not_fit_takes_nothing() {
        let q = WriteQuota::new(100);
        assert!(q.charge(60));
        assert!(!q.charge(41));
        assert!(q.charge(40));
        assert!(!q.charge(1));
        q.reset();
        assert!(q.charge(100));
        assert!(!q.charge(u64::MAX));
    }
}
