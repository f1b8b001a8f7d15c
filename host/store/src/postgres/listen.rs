//! `LISTEN/NOTIFY`: one connection of its own per store handle, outside the pool, whose
//! notifications become [`crate::fleet::Wake`]s. When it drops, subscribers are told
//! [`Wake::Missed`] (they poll) and it reconnects with backoff. Notifications are
//! sent in the transaction that makes the change (delivered only if it commits); their
//! payloads are a run id and a command id, far under PostgreSQL's 8,000 bytes.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio_postgres::{AsyncMessage, NoTls};

use super::Inner;
use crate::fleet::Wake;

/// Starts listening; `ready` is told once the first `LISTEN` took effect.
pub(super) fn start(
    rt: &tokio::runtime::Handle,
    inner: Weak<Inner>,
    ready: std::sync::mpsc::SyncSender<()>,
) {
    rt.spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            let Some(i) = inner.upgrade() else {
                return;
            };
            let config = i.config.clone();
            let channels = ["work", "command", "command_done"].map(|c| i.channel(c));
            drop(i);
            if let Ok((client, mut conn)) = config.connect(NoTls).await {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(Ok(m)) = messages.next().await {
                        if let AsyncMessage::Notification(n) = m
                            && tx.send(n).is_err()
                        {
                            return;
                        }
                    }
                });
                let listen: String = channels
                    .iter()
                    .map(|c| format!("LISTEN \"{c}\";"))
                    .collect();
                if client.batch_execute(&listen).await.is_ok() {
                    backoff = Duration::from_millis(50);
                    let _ = ready.try_send(());
                    // Anything sent before LISTEN took effect was missed.
                    if let Some(i) = inner.upgrade() {
                        i.hub.send(Wake::Missed);
                    }
                    while let Some(n) = rx.recv().await {
                        let Some(i) = inner.upgrade() else {
                            return;
                        };
                        if let Some(w) = super::fleet::wake_of(&i, n.channel(), n.payload()) {
                            i.hub.send(w);
                        }
                    }
                }
                driver.abort();
                if let Some(i) = inner.upgrade() {
                    i.hub.send(Wake::Missed);
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
}
