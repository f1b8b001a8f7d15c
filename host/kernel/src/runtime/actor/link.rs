//! Where a message goes: into its target's inbox channel, or into the local queue of a
//! node fused with its producer (see [`super::fused`]).
//!
//! All ends of a local queue belong to one fused group, whose driver polls its members one
//! at a time, so a hop takes no lock, no atomic and no waker (see `impl Sync for Shared`).
//! A local queue is bounded like a channel (the same capacity, so backpressure is the
//! same) and registers no waker: the driver polls every member again whenever a queue
//! moved.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc::error::{SendError, TrySendError};

use super::{InboxTx, Msg};

/// The sending end of an edge.
pub(crate) enum Link {
    Channel(InboxTx),
    Local(LocalTx),
    /// Into a node fused with its producer, before the group wires it to a local queue
    /// (`fused::wire`, before any member runs). Reads as a node gone, should one remain
    /// unwired (the edge's handle is not one the node has).
    Unwired,
}

impl From<InboxTx> for Link {
    fn from(tx: InboxTx) -> Self {
        Link::Channel(tx)
    }
}

impl Link {
    /// Delivers now, or says why not (full: try again later; closed: the node stopped).
    pub fn try_send(&self, msg: Msg) -> Result<(), TrySendError<Msg>> {
        match self {
            Link::Channel(tx) => tx.try_send(msg),
            Link::Local(q) => q.try_send(msg),
            Link::Unwired => Err(TrySendError::Closed(msg)),
        }
    }

    /// Delivers, waiting for room (backpressure); an error when the node stopped.
    pub async fn send(&self, msg: Msg) -> Result<(), SendError<Msg>> {
        match self {
            Link::Channel(tx) => tx.send(msg).await,
            Link::Local(q) => q.send(msg).await,
            Link::Unwired => Err(SendError(msg)),
        }
    }
}

struct Queue {
    /// In arrival order. A ring, so a receiver that takes part of it (a batch of a
    /// fuller queue) moves nothing behind it; one that takes all of it swaps its own
    /// emptied batch buffer in (see [`LocalRx::poll_recv_many`]), so two buffers
    /// alternate and stay warm in cache, and nothing is copied.
    msgs: VecDeque<Msg>,
    /// A `u32`: with the flags below, the queue and its reference counts fit 56 bytes
    /// (64 with the allocator's header, not 80), one per fused node.
    cap: u32,
    /// The sender is gone: the queue reads as closed once it is empty.
    sender_gone: bool,
    /// The receiver stopped: sends are dropped, as into a closed channel.
    closed: bool,
    /// Something was pushed, taken or closed since the driver last asked.
    moved: bool,
}

/// A queue shared by the three ends of one local link (sender, receiver, the driver's
/// probe), all owned by one fused group.
struct Shared {
    queue: UnsafeCell<Queue>,
    /// Debug builds check the invariant of `impl Sync for Shared` at every access: an
    /// access while another is under way (from another thread, or re-entered) panics.
    #[cfg(debug_assertions)]
    busy: std::sync::atomic::AtomicBool,
}

// SAFETY: `Sync` is what makes `Arc<Shared>` `Send`, so that a group's future can be a
// tokio task; nothing here is ever reached from two threads at once. Every invariant
// this rests on, and what enforces it:
//
// 1. The queue is reached only through its three ends: `Shared` and the ends' fields
//    are private to this module, and the ends are made only by [`local`], which is
//    `pub(super)` (the actor module; its one caller is `fused::wire`).
// 2. No end is duplicated: none is `Clone` or `Copy` (checked at compile time: the
//    `AmbiguousIfClone` check below), and `Shared` is never handed out, so exactly one sender,
//    one receiver and one probe share each queue.
// 3. The three ends live in one future: `fused::wire` moves the sender into the
//    producing member's edge (`Link::Local`), the receiver into the consuming member's
//    inbox (`Inbox::local`) and the probe into the `Group`, and boxes the members into
//    that `Group`, whose `run` is spawned as one task (`runner::run_all`). An actor
//    moves its edges and inbox nowhere else: the actor module spawns no task and
//    hands no edge out (a member's future is polled only inside its group's `run`).
// 4. One task is polled by one thread at a time, and tokio orders one poll before the
//    next (happens-before) when the task moves between threads; a group's `run` polls
//    its members one after another, never two at once. Dropping the group drops every
//    end in that same task (or on the thread that drops the task, again one at a time).
// 5. No access re-enters: each `Shared::with` call below runs a closure of this module
//    that neither awaits nor reaches a queue again; a message is never dropped inside
//    one (a message may hold anything), as `LocalRx::drop` takes them out first.
//
// So at most one `&mut Queue` exists at any time, and sharing the queue needs no lock.
// Debug builds (every test) also check this at run time (`busy`).
unsafe impl Sync for Shared {}

/// Fails to compile if an end of a local queue becomes `Clone` (invariant 2 of
/// `impl Sync for Shared`): with a `Clone` end the two impls below both apply and the
/// item lookup is ambiguous.
const _: fn() = || {
    trait AmbiguousIfClone<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfClone<()> for T {}
    impl<T: Clone> AmbiguousIfClone<u8> for T {}
    let _ = <LocalTx as AmbiguousIfClone<_>>::check;
    let _ = <LocalRx as AmbiguousIfClone<_>>::check;
    let _ = <LocalProbe as AmbiguousIfClone<_>>::check;
    let _ = <Link as AmbiguousIfClone<_>>::check;
};

impl Shared {
    /// `f` on the queue.
    fn with<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        #[cfg(debug_assertions)]
        let _busy = Busy::enter(&self.busy);
        // SAFETY: see `impl Sync for Shared`: no other end is using the queue now, and
        // `f` (a few lines of this module) does not reach it again.
        f(unsafe { &mut *self.queue.get() })
    }
}

/// An access to a queue under way (debug builds).
#[cfg(debug_assertions)]
struct Busy<'a>(&'a std::sync::atomic::AtomicBool);

#[cfg(debug_assertions)]
impl<'a> Busy<'a> {
    fn enter(flag: &'a std::sync::atomic::AtomicBool) -> Busy<'a> {
        let overlapping = flag.swap(true, std::sync::atomic::Ordering::Acquire);
        assert!(
            !overlapping,
            "a fused group's local queue was reached by two accesses at once"
        );
        Busy(flag)
    }
}

#[cfg(debug_assertions)]
impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// A bounded local queue: its sender (for the producer's edge), its receiver (the fused
/// node's inbox) and the driver's probe. All three must stay in one fused group (see
/// `impl Sync for Shared`).
pub(super) fn local(cap: usize) -> (LocalTx, LocalRx, LocalProbe) {
    let q = Arc::new(Shared {
        queue: UnsafeCell::new(Queue {
            msgs: VecDeque::new(),
            cap: u32::try_from(cap).unwrap_or(u32::MAX).max(1),
            sender_gone: false,
            closed: false,
            moved: false,
        }),
        #[cfg(debug_assertions)]
        busy: std::sync::atomic::AtomicBool::new(false),
    });
    (LocalTx(q.clone()), LocalRx(q.clone()), LocalProbe(q))
}

pub(crate) struct LocalTx(Arc<Shared>);

impl LocalTx {
    fn try_send(&self, msg: Msg) -> Result<(), TrySendError<Msg>> {
        self.0.with(|q| {
            if q.closed {
                return Err(TrySendError::Closed(msg));
            }
            if q.msgs.len() >= q.cap as usize {
                return Err(TrySendError::Full(msg));
            }
            q.msgs.push_back(msg);
            q.moved = true;
            Ok(())
        })
    }

    /// Waits for room without a waker: the driver polls again once the receiver (a
    /// member of the same group) took something.
    async fn send(&self, msg: Msg) -> Result<(), SendError<Msg>> {
        let mut msg = Some(msg);
        std::future::poll_fn(|_| {
            // Some until delivered; the future is not polled after it is ready.
            let m = msg.take().expect("polled after completion");
            match self.try_send(m) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TrySendError::Closed(m)) => Poll::Ready(Err(SendError(m))),
                Err(TrySendError::Full(m)) => {
                    msg = Some(m);
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl Drop for LocalTx {
    fn drop(&mut self) {
        self.0.with(|q| {
            q.sender_gone = true;
            q.moved = true;
        });
    }
}

pub(crate) struct LocalRx(Arc<Shared>);

impl LocalRx {
    /// Up to `limit` messages into `buf`; `Ready(0)` once closed and empty; pending
    /// (without a waker, see [`LocalTx::send`]) while empty.
    pub fn poll_recv_many(&mut self, buf: &mut Vec<Msg>, limit: usize) -> Poll<usize> {
        self.0.with(|q| {
            if q.msgs.is_empty() {
                return match q.sender_gone {
                    true => Poll::Ready(0),
                    false => Poll::Pending,
                };
            }
            let n = q.msgs.len().min(limit);
            if n == q.msgs.len() && buf.is_empty() {
                // Both conversions keep the allocation (the ring's elements are moved
                // within it only if they wrap, which a queue emptied each pass rarely
                // does).
                let all = std::mem::replace(&mut q.msgs, VecDeque::from(std::mem::take(buf)));
                *buf = Vec::from(all);
            } else {
                buf.extend(q.msgs.drain(..n));
            }
            q.moved = true;
            Poll::Ready(n)
        })
    }

    pub fn close(&mut self) {
        self.0.with(|q| {
            q.closed = true;
            q.moved = true;
        });
    }
}

impl Drop for LocalRx {
    /// What is left would never be read: dropped with the receiver, as a channel's is.
    fn drop(&mut self) {
        let left = self.0.with(|q| {
            q.closed = true;
            q.moved = true;
            std::mem::take(&mut q.msgs)
        });
        // Dropped outside `with`: a message may hold anything.
        drop(left);
    }
}

/// The driver's view of a queue.
pub(crate) struct LocalProbe(Arc<Shared>);

impl LocalProbe {
    /// Whether the queue moved since the last call.
    pub fn moved(&self) -> bool {
        self.0.with(|q| std::mem::take(&mut q.moved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::Value;

    fn ints(buf: &mut Vec<Msg>) -> Vec<i64> {
        buf.drain(..)
            .map(|m| match m {
                Msg::External(Value::Int(i)) => i,
                _ => panic!("not a test message"),
            })
            .collect()
    }

    /// One queue per fused node, alive from the start: with its reference counts it
    /// stays within 56 bytes (64-bit targets; release builds, without the debug check).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_queue_stays_small() {
        assert_eq!(std::mem::size_of::<Queue>(), 40);
    }

    /// A queue taken in part (a batch of a fuller queue) or whole (its buffer swapped
    /// with the receiver's) hands messages over in arrival order, and is bounded.
    #[test]
    fn batches_keep_arrival_order_taken_whole_or_in_part() {
        let (tx, mut rx, probe) = local(4);
        let send = |i: i64| tx.try_send(Msg::External(Value::Int(i)));
        let mut buf = Vec::new();
        let mut next = 0;
        let mut got = Vec::new();
        for round in 0..50 {
            while send(next).is_ok() {
                next += 1;
            }
            assert!(matches!(send(-1), Err(TrySendError::Full(_))));
            assert!(probe.moved());
            // Alternately a part (1–3) and the whole queue.
            let limit = if round % 2 == 0 { 1 + round % 3 } else { 256 };
            let Poll::Ready(n) = rx.poll_recv_many(&mut buf, limit) else {
                panic!("a full queue is ready");
            };
            assert_eq!(n, limit.min(4));
            got.extend(ints(&mut buf));
        }
        while let Poll::Ready(n) = rx.poll_recv_many(&mut buf, 256) {
            assert!(n > 0);
            got.extend(ints(&mut buf));
        }
        assert_eq!(got, (0..next).collect::<Vec<_>>());
        drop(tx);
        assert_eq!(rx.poll_recv_many(&mut buf, 256), Poll::Ready(0));
    }
}

#[cfg(all(test, debug_assertions))]
mod overlap {
    use super::*;

    /// The run-time check of `impl Sync for Shared` (debug builds): an access to a queue
    /// while another is under way is caught, not a second `&mut` to it.
    #[test]
    #[should_panic(expected = "two accesses at once")]
    fn an_access_overlapping_another_panics() {
        let (_tx, _rx, probe) = local(1);
        probe.0.with(|_| probe.0.with(|_| ()));
    }
}
