//! Fault injection for crash tests: `HEDDLE_FAULT=BOUNDARY:NODE` aborts the process
//! (as a crash would: no destructors, no flush) at a named boundary for a named node.
//!
//! Boundaries: `before-dispatch`, `after-dispatch`, `after-start`, `after-result`,
//! `after-verdict` (each just after the matching record was handed to the log, or just
//! before the dispatch record; a retry-safe node passes its dispatch and start without a
//! record), `mid-commit` (inside the store transaction that holds a record about
//! NODE, after the rows are written and before the commit), and `after-artifact` (a
//! result of NODE stored its large values as artifacts, committed, and its record was
//! not handed to the log yet). `NODE` may be `*`. An
//! optional third part `:N` fires at the N-th hit (from 1), so a test can crash a
//! fan-out on its third item. Unset, every check is one load of a cached `None`.
//!
//! Only with the crate's `fault` feature (the crash tests turn it on): without it no
//! check can fire, the variable is never read, and every call site folds away, so a
//! program linking the store (a release build, an embedder) has no way to be aborted
//! by its environment.

#[cfg(feature = "fault")]
use std::sync::OnceLock;
#[cfg(feature = "fault")]
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable read once per process.
pub const ENV: &str = "HEDDLE_FAULT";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    BeforeDispatch,
    AfterDispatch,
    AfterStart,
    AfterResult,
    AfterVerdict,
    MidCommit,
    AfterArtifact,
}

#[cfg(feature = "fault")]
impl Boundary {
    fn parse(s: &str) -> Option<Boundary> {
        Some(match s {
            "before-dispatch" => Boundary::BeforeDispatch,
            "after-dispatch" => Boundary::AfterDispatch,
            "after-start" => Boundary::AfterStart,
            "after-result" => Boundary::AfterResult,
            "after-verdict" => Boundary::AfterVerdict,
            "mid-commit" => Boundary::MidCommit,
            "after-artifact" => Boundary::AfterArtifact,
            _ => return None,
        })
    }
}

#[cfg(feature = "fault")]
struct Fault {
    boundary: Boundary,
    node: String,
    nth: u32,
    hits: AtomicU32,
}

#[cfg(feature = "fault")]
fn armed() -> Option<&'static Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    FAULT
        .get_or_init(|| {
            let spec = std::env::var(ENV).ok()?;
            let mut parts = spec.splitn(3, ':');
            let boundary = parts.next().and_then(Boundary::parse);
            let node = parts.next().map(str::to_string);
            let nth = parts.next().map(|n| n.parse::<u32>());
            match (boundary, node, nth.clone()) {
                (Some(boundary), Some(node), None | Some(Ok(_))) => Some(Fault {
                    boundary,
                    node,
                    nth: nth.and_then(Result::ok).unwrap_or(1).max(1),
                    hits: AtomicU32::new(0),
                }),
                _ => {
                    // A typo must not silently turn a crash test into a clean run.
                    eprintln!(
                        "{ENV}={spec}: expected BOUNDARY:NODE[:N] with BOUNDARY one of before-dispatch, after-dispatch, after-start, after-result, after-verdict, mid-commit, after-artifact"
                    );
                    std::process::abort();
                }
            }
        })
        .as_ref()
}

/// Whether a fault is armed in this process: callers skip preparing a check (copying a
/// node id past a record they hand over) when none is.
#[inline]
pub(crate) fn is_armed() -> bool {
    #[cfg(feature = "fault")]
    {
        armed().is_some()
    }
    #[cfg(not(feature = "fault"))]
    {
        false
    }
}

/// Aborts the process if the armed fault is `boundary` for `node` and this is its N-th hit.
#[inline]
pub fn check(boundary: Boundary, node: &str) {
    if hits(boundary, node) {
        abort(boundary, node);
    }
}

/// Counts a pass of `node` over `boundary`; true when it is the armed fault's N-th hit.
/// The `mid-commit` boundary counts a record as it is encoded for the log (in the log's
/// order) and fires inside the store transaction that holds it ([`abort`]).
#[inline]
pub(crate) fn hits(boundary: Boundary, node: &str) -> bool {
    #[cfg(feature = "fault")]
    {
        let Some(f) = armed() else { return false };
        f.boundary == boundary
            && (f.node == "*" || f.node == node)
            && f.hits.fetch_add(1, Ordering::SeqCst) + 1 == f.nth
    }
    #[cfg(not(feature = "fault"))]
    {
        let _ = (boundary, node);
        false
    }
}

/// Aborts the process as a crash at `boundary` of `node` would.
pub(crate) fn abort(boundary: Boundary, node: &str) -> ! {
    eprintln!("{ENV}: aborting at {boundary:?} of node {node}");
    std::process::abort();
}
