//! When a guest must stop, and the race that stops it wherever it is.
//!
//! The epoch callback stops a guest that is *computing*; a guest *waiting* in a host call
//! (a WASI clock sleep or poll, `emit` backpressure, `next-input`) runs no guest code, so
//! no epoch check ever happens. [`race`] therefore runs every call into a guest against
//! its deadline and cancellation: when either fires first the call's future is dropped,
//! which unwinds the guest's fiber wherever it waits.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Why a guest was stopped from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interrupt {
    Deadline,
    Cancelled,
}

/// Time spent waiting for the graph (input, downstream backpressure), which the default
/// deadline does not count: a streaming node waiting for its upstream holds nothing.
#[derive(Debug, Default)]
struct Waits {
    total: Duration,
    since: Option<Instant>,
}

/// The deadline of one call into a guest: an explicit one (package grant, graph limit,
/// run limit; absolute) and the engine's default for packages without their own (time
/// the guest spends, excluding waits for the graph).
#[derive(Clone, Debug, Default)]
pub(crate) struct Deadline {
    hard: Option<Instant>,
    default: Option<(Instant, Duration)>,
    waits: WaitClock,
}

/// The record of a guest's waits for the graph, shared by the copies of one deadline (the
/// race outside the store, the host calls inside it). A store keeps one and lends it to
/// each invocation in turn, so a warm call allocates nothing for it.
#[derive(Clone, Debug, Default)]
pub(crate) struct WaitClock(Arc<Mutex<Waits>>);

impl Deadline {
    /// `default` applies from now; `None` or zero means no default.
    pub fn new(hard: Option<Instant>, default: Option<Duration>) -> Self {
        Self::on(hard, default, &WaitClock::default())
    }

    /// Like [`Deadline::new`], counting waits on `clock`, which starts again from zero:
    /// a store runs one invocation at a time, so nothing of an earlier wait is counted.
    pub fn on(hard: Option<Instant>, default: Option<Duration>, clock: &WaitClock) -> Self {
        *clock.0.lock().unwrap_or_else(|e| e.into_inner()) = Waits::default();
        Deadline {
            hard,
            default: default
                .filter(|d| !d.is_zero())
                .map(|d| (Instant::now(), d)),
            waits: clock.clone(),
        }
    }

    fn waits(&self) -> std::sync::MutexGuard<'_, Waits> {
        self.waits.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn default_at(&self, now: Instant) -> Option<Instant> {
        let (start, limit) = self.default?;
        let w = self.waits();
        let waiting = w
            .since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        Some(start + limit + w.total + waiting)
    }

    /// The earliest moment the guest may be stopped, as things stand now.
    pub fn at(&self) -> Option<Instant> {
        match (self.hard, self.default_at(Instant::now())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn passed(&self) -> bool {
        self.at().is_some_and(|d| Instant::now() >= d)
    }

    /// The explicit deadline alone: what bounds a wait for the graph.
    pub fn hard(&self) -> Option<Instant> {
        self.hard
    }

    /// The default limit, when it is the one that passed (for the error message).
    pub fn default_passed(&self) -> Option<Duration> {
        let now = Instant::now();
        let at = self.default_at(now)?;
        let hard_first = self.hard.is_some_and(|h| h <= at);
        (now >= at && !hard_first).then(|| self.default.map(|(_, d)| d))?
    }

    /// Marks the start of a wait for the graph; the wait ends when the guard drops.
    pub fn waiting(&self) -> WaitGuard<'_> {
        self.waits().since = Some(Instant::now());
        WaitGuard(self)
    }
}

pub(crate) struct WaitGuard<'a>(&'a Deadline);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut w = self.0.waits();
        if let Some(s) = w.since.take() {
            w.total += s.elapsed();
        }
    }
}

/// Resolves at `at`, never without one.
pub(crate) async fn until(at: Option<Instant>) {
    match at {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Runs `call` (a call into a guest) until it finishes, the deadline passes or `cancel`
/// fires. On an interrupt the call's future is dropped, which unwinds the guest wherever
/// it is suspended; its store must then be discarded.
pub(crate) async fn race<F: Future>(
    call: F,
    deadline: &Deadline,
    cancel: Option<&CancellationToken>,
) -> Result<F::Output, Interrupt> {
    tokio::pin!(call);
    // Most calls finish in their first poll (a guest that neither waits nor runs past an
    // epoch tick): poll once before arming the timer and the cancel waiter, which cost
    // more than a short call itself. A deadline or cancel that came first is still seen:
    // the epoch callback checks both while the guest runs.
    let first = std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    if let Some(out) = first {
        return Ok(out);
    }
    loop {
        tokio::select! {
            biased;
            out = &mut call => return Ok(out),
            _ = cancelled(cancel) => return Err(Interrupt::Cancelled),
            // The default moves later while the guest waits for the graph: re-check.
            _ = until(deadline.at()) => if deadline.passed() {
                return Err(Interrupt::Deadline);
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_the_graph_do_not_count_against_the_default() {
        let d = Deadline::new(None, Some(Duration::from_secs(10)));
        let before = d.at().unwrap();
        {
            let _w = d.waiting();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(d.at().unwrap() >= before + Duration::from_millis(20));
        assert!(!d.passed());
        assert!(Deadline::new(None, Some(Duration::ZERO)).at().is_none());
    }

    #[test]
    fn the_explicit_deadline_is_named_when_it_is_first() {
        let past = Instant::now() - Duration::from_secs(1);
        let d = Deadline::new(Some(past), Some(Duration::from_millis(1)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(d.passed());
        assert_eq!(d.default_passed(), None);
        let d = Deadline::new(None, Some(Duration::from_millis(1)));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(d.default_passed(), Some(Duration::from_millis(1)));
    }
}
