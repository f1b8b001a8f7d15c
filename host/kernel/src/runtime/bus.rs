//! The run's event bus: one ordered record of everything that happens, delivered to any
//! number of subscribers and retained (capped) for the run result.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use heddle_core::{Event, EventKind};
use tokio::sync::mpsc;

use crate::executor::EventSink;

struct BusState {
    next_seq: u64,
    retained: Vec<Arc<Event>>,
    dropped: u64,
    subscribers: Vec<mpsc::UnboundedSender<Arc<Event>>>,
    closed: bool,
}

/// Sequence numbers are assigned under the same lock that fans the event out, so every
/// subscriber sees the same gapless order. Events are per node state change, per output
/// value and per throttled edge update, never per routed message, so one lock is cheap.
pub struct EventBus {
    started: Instant,
    cap: usize,
    state: Mutex<BusState>,
}

impl EventBus {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(EventBus {
            started: Instant::now(),
            cap: cap.max(2),
            state: Mutex::new(BusState {
                next_seq: 0,
                retained: Vec::new(),
                dropped: 0,
                subscribers: Vec::new(),
                closed: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BusState> {
        // A panic while holding the lock leaves a consistent Vec; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn publish(&self, kind: EventKind) {
        let at_us = self.started.elapsed().as_micros() as u64;
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let ev = Arc::new(Event {
            seq: st.next_seq,
            at_us,
            kind,
        });
        st.next_seq += 1;
        if st.retained.len() >= self.cap {
            let half = st.retained.len() / 2;
            st.retained.drain(..half);
            st.dropped += half as u64;
        }
        st.retained.push(ev.clone());
        st.subscribers.retain(|s| s.send(ev.clone()).is_ok());
    }

    /// A new subscriber first receives every retained event, then every later one.
    pub fn subscribe(&self) -> EventStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        for e in &st.retained {
            let _ = tx.send(e.clone());
        }
        if !st.closed {
            st.subscribers.push(tx);
        }
        EventStream { rx }
    }

    /// Ends every subscription (after the final run event) and returns what was retained.
    pub fn close(&self) -> (Vec<Arc<Event>>, u64) {
        let mut st = self.lock();
        st.closed = true;
        st.subscribers.clear();
        (st.retained.clone(), st.dropped)
    }
}

impl EventSink for EventBus {
    fn emit(&self, event: EventKind) {
        self.publish(event);
    }
}

/// One subscription to a run's events. Ends (`None`) after the run's final event.
pub struct EventStream {
    rx: mpsc::UnboundedReceiver<Arc<Event>>,
}

impl EventStream {
    pub async fn next(&mut self) -> Option<Arc<Event>> {
        self.rx.recv().await
    }

    /// The next event if one is already waiting.
    pub fn try_next(&mut self) -> Option<Arc<Event>> {
        self.rx.try_recv().ok()
    }

    /// Blocks the calling (non-async) thread until the next event.
    pub fn blocking_next(&mut self) -> Option<Arc<Event>> {
        self.rx.blocking_recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::{LogLevel, RunStatus};

    fn log(i: usize) -> EventKind {
        EventKind::Log {
            node_id: "n".into(),
            level: LogLevel::Info,
            message: i.to_string(),
        }
    }

    #[test]
    fn every_subscriber_gets_every_event_in_order_and_cap_drops_oldest_half() {
        let bus = EventBus::new(10);
        let mut early = bus.subscribe();
        for i in 0..5 {
            bus.publish(log(i));
        }
        let mut late = bus.subscribe();
        for i in 5..25 {
            bus.publish(log(i));
        }
        bus.publish(EventKind::Run {
            status: RunStatus::Completed,
            error: None,
        });
        let (retained, dropped) = bus.close();
        let mut seqs = Vec::new();
        while let Some(e) = early.try_next() {
            seqs.push(e.seq);
        }
        assert_eq!(seqs, (0..26).collect::<Vec<_>>());
        let mut late_seqs = Vec::new();
        while let Some(e) = late.try_next() {
            late_seqs.push(e.seq);
        }
        assert_eq!(late_seqs, (0..26).collect::<Vec<_>>());
        assert!(retained.len() <= 10);
        assert_eq!(retained.len() as u64 + dropped, 26);
        assert_eq!(retained.last().unwrap().seq, 25);
        // Gapless within what is retained.
        for w in retained.windows(2) {
            assert_eq!(w[0].seq + 1, w[1].seq);
        }
    }
}
