//! Where a message goes: into its target's inbox channel, or into the local queue of a
//! node fused with its producer (see [`super::fused`]).
//!
//! All ends of a local queue belong to one fused group, whose driver polls its members one
//! at a time, so a hop takes no lock, no atomic and no waker (see `impl Sync for Shared`).
//! A local queue is bounded like a channel (the same capacity, so backpressure is the
//! same) and registers no waker: the driver polls every member again whenever a queue
//! moved.

use std::cell::UnsafeCell;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc::error::{SendError, TrySendError};

use super::{InboxTx, Msg};

/// The sending end of an edge.
pub(crate) enum Link {
    Channel(InboxTx),
    Local(LocalTx),
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
        }
    }

    /// Delivers, waiting for room (backpressure); an error when the node stopped.
    pub async fn send(&self, msg: Msg) -> Result<(), SendError<Msg>> {
        match self {
            Link::Channel(tx) => tx.send(msg).await,
            Link::Local(q) => q.send(msg).await,
        }
    }
}

struct Queue {
    /// In arrival order. A plain vector, not a ring: a receiver that takes all of it
    /// swaps its own emptied batch buffer in (see [`LocalRx::poll_recv_many`]), so two
    /// buffers alternate and stay warm in cache, and nothing is copied.
    msgs: Vec<Msg>,
    cap: usize,
    /// The sender is gone: the queue reads as closed once it is empty.
    sender_gone: bool,
    /// The receiver stopped: sends are dropped, as into a closed channel.
    closed: bool,
    /// Something was pushed, taken or closed since the driver last asked.
    moved: bool,
}

/// A queue shared by the three ends of one local link (sender, receiver, the driver's
/// probe), all owned by one fused group.
struct Shared(UnsafeCell<Queue>);

// SAFETY: a queue is only reached through its ends, and all three belong to one fused
// group: the sender to the producing member's future, the receiver to the consuming
// member's, the probe to the group's driver (`fused::Group`), which polls those futures
// one after another from its own task. No end is `Clone`, none is handed out of its
// group, and none is used while another is (each access below is one call that does not
// call back into a queue). A task is polled by one thread at a time, and the runtime
// orders one poll before the next when the task moves between threads, so the queue is
// never reached from two threads at once: sharing it needs no lock.
unsafe impl Sync for Shared {}

impl Shared {
    /// `f` on the queue.
    fn with<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        // SAFETY: see `impl Sync for Shared`: no other end is using the queue now, and
        // `f` (a few lines of this module) does not reach it again.
        f(unsafe { &mut *self.0.get() })
    }
}

/// A bounded local queue: its sender (for the producer's edge), its receiver (the fused
/// node's inbox) and the driver's probe. All three must stay in one fused group (see
/// `impl Sync for Shared`).
pub(crate) fn local(cap: usize) -> (LocalTx, LocalRx, LocalProbe) {
    let q = Arc::new(Shared(UnsafeCell::new(Queue {
        msgs: Vec::new(),
        cap: cap.max(1),
        sender_gone: false,
        closed: false,
        moved: false,
    })));
    (LocalTx(q.clone()), LocalRx(q.clone()), LocalProbe(q))
}

pub(crate) struct LocalTx(Arc<Shared>);

impl LocalTx {
    fn try_send(&self, msg: Msg) -> Result<(), TrySendError<Msg>> {
        self.0.with(|q| {
            if q.closed {
                return Err(TrySendError::Closed(msg));
            }
            if q.msgs.len() >= q.cap {
                return Err(TrySendError::Full(msg));
            }
            q.msgs.push(msg);
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
                std::mem::swap(buf, &mut q.msgs);
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
