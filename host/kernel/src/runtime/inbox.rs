//! Node inboxes, allocated when first used.
//!
//! A tokio channel allocates its first block of slots (32 messages) and its cache-padded
//! state when it is created, ~1.8 KB, whether or not anything is ever sent. A run wires
//! every node at start, yet in a long chain only the nodes the data has reached need
//! their inbox: so an inbox is a shared slot, and its channel is made by whichever end
//! uses it first (a producer's first send, or the node's first read). A node the data
//! never reaches before it ends costs the slot alone.
//!
//! Closing works as with a plain channel: the slot holds one sender, dropped when the
//! last producer's handle is; the node takes the receiver out of the slot on first use.

use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;

use super::actor::{LocalRx, Msg};

struct Slot {
    buffer: usize,
    chan: OnceLock<Chan>,
}

struct Chan {
    tx: mpsc::Sender<Msg>,
    /// Until the node takes it (once).
    rx: Mutex<Option<mpsc::Receiver<Msg>>>,
}

impl Slot {
    fn chan(&self) -> &Chan {
        self.chan.get_or_init(|| {
            let (tx, rx) = mpsc::channel(self.buffer);
            Chan {
                tx,
                rx: Mutex::new(Some(rx)),
            }
        })
    }

    /// The receiver, if the channel exists and the node has not taken it yet.
    fn take_rx(&self, create: bool) -> Option<mpsc::Receiver<Msg>> {
        let chan = if create {
            self.chan()
        } else {
            self.chan.get()?
        };
        // A panic elsewhere cannot leave the Option half-written.
        chan.rx.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A node's inbox: its two ends, of a channel made on first use.
pub(crate) fn inbox(buffer: usize) -> (InboxTx, Inbox) {
    let slot = Arc::new(Slot {
        buffer: buffer.max(1),
        chan: OnceLock::new(),
    });
    (InboxTx(slot.clone()), Inbox(Some(Rx::Lazy(slot))))
}

/// A producer's handle on a node's inbox: reads as the channel's sender, which the first
/// use makes.
#[derive(Clone)]
pub(crate) struct InboxTx(Arc<Slot>);

impl Deref for InboxTx {
    type Target = mpsc::Sender<Msg>;

    fn deref(&self) -> &mpsc::Sender<Msg> {
        &self.0.chan().tx
    }
}

enum Rx {
    Lazy(Arc<Slot>),
    Live(mpsc::Receiver<Msg>),
    /// A node fused with its producer reads a local queue (see `actor::fused`).
    Local(LocalRx),
}

/// The receiving end of a node's inbox. A node nothing can send to (no incoming edge,
/// not an input, not driven by control events) has none at all: a wide graph of sources
/// pays nothing for inboxes it never reads. Without one, the inbox reads as closed,
/// which is what it is.
pub(crate) struct Inbox(Option<Rx>);

impl Inbox {
    /// The inbox of a node nothing can send to.
    pub fn none() -> Self {
        Inbox(None)
    }

    /// The inbox of a node fused with its producer.
    pub fn local(rx: LocalRx) -> Self {
        Inbox(Some(Rx::Local(rx)))
    }

    /// The channel's receiver, taken out of the slot (and the channel made) on first use.
    fn live(&mut self) -> Option<&mut mpsc::Receiver<Msg>> {
        if let Some(Rx::Lazy(slot)) = &self.0 {
            // The node's own inbox: nothing else takes this receiver.
            let rx = slot.take_rx(true).expect("a node's receiver is taken once");
            self.0 = Some(Rx::Live(rx));
        }
        match &mut self.0 {
            Some(Rx::Live(rx)) => Some(rx),
            _ => None,
        }
    }

    /// Up to `limit` messages into `buf`, waiting for the first; 0 once the inbox is
    /// closed and empty (every sender gone).
    pub async fn recv_many(&mut self, buf: &mut Vec<Msg>, limit: usize) -> usize {
        if let Some(Rx::Local(rx)) = &mut self.0 {
            return std::future::poll_fn(|_| rx.poll_recv_many(buf, limit)).await;
        }
        match self.live() {
            Some(rx) => rx.recv_many(buf, limit).await,
            None => 0,
        }
    }

    /// Refuses further messages (senders see the node gone).
    pub fn close(&mut self) {
        if let Some(Rx::Local(rx)) = &mut self.0 {
            return rx.close();
        }
        if let Some(rx) = self.live() {
            rx.close();
        }
    }
}

impl Drop for Inbox {
    /// A node that ends without reading its inbox (it panicked, or the run never started
    /// it) drops a receiver a producer made: producers then see the node gone, as they
    /// would with a plain channel, instead of waiting on a full one nobody reads.
    fn drop(&mut self) {
        if let Some(Rx::Lazy(slot)) = &self.0 {
            drop(slot.take_rx(false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::Value;

    fn data(i: i64) -> Msg {
        Msg::External(Value::Int(i))
    }

    #[tokio::test]
    async fn no_channel_until_an_end_uses_it_then_both_ends_share_one() {
        let (tx, mut rx) = inbox(4);
        assert!(tx.0.chan.get().is_none());
        let tx2 = tx.clone();
        tx2.try_send(data(1)).expect("room");
        assert!(tx.0.chan.get().is_some());
        tx.try_send(data(2)).expect("room");
        drop((tx, tx2));
        let mut buf = Vec::new();
        assert_eq!(rx.recv_many(&mut buf, 10).await, 2);
        // Every producer gone: closed once drained.
        assert_eq!(rx.recv_many(&mut buf, 10).await, 0);
    }

    #[tokio::test]
    async fn a_reader_first_makes_the_channel_and_sees_the_end_of_producers_that_never_sent() {
        let (tx, mut rx) = inbox(4);
        let mut buf = Vec::new();
        let read = tokio::spawn(async move { rx.recv_many(&mut buf, 10).await });
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(read.await.expect("reader"), 0);
    }

    #[tokio::test]
    async fn producers_see_a_node_gone_whether_it_closed_or_dropped_an_unread_inbox() {
        let (tx, mut rx) = inbox(1);
        rx.close();
        assert!(matches!(
            tx.try_send(data(1)),
            Err(mpsc::error::TrySendError::Closed(_))
        ));

        let (tx, rx) = inbox(1);
        tx.try_send(data(1)).expect("room");
        drop(rx);
        // Full and unread: without the drop this send would wait forever.
        assert!(tx.send(data(2)).await.is_err());
    }
}
