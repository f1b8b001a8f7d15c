//! How the synchronous store API sits on the async PostgreSQL driver.
//!
//! The store owns a small tokio runtime of its own and every store call runs there: the
//! caller's thread spawns the call's future onto it and waits on a channel for the
//! answer. Why not `Handle::block_on` on the caller's runtime: the callers are a plain
//! thread (each run log's writer, which has no runtime), `spawn_blocking` threads of the
//! server, and now and then an async task of the kernel (a large value spilled while a
//! node's result is sealed); `block_on` panics in the last, and the pool's connections
//! must outlive any one caller's runtime (the CLI's runtime ends before the store is
//! dropped). Waiting on a channel works from each of them, and blocks exactly as an
//! SQLite call on the same thread blocks today. The cost is a task spawn and a wake-up
//! per call, well under a round trip to the server.

use std::future::Future;

pub(crate) struct Bridge {
    rt: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    pub(crate) fn new() -> std::io::Result<Bridge> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("heddle-pg")
            .enable_all()
            .build()?;
        Ok(Bridge { rt: Some(rt) })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        // Taken only in `drop`.
        self.rt.as_ref().expect("the store's runtime")
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.rt().handle()
    }

    /// Runs `f` on the store's runtime and waits for it on this thread.
    pub(crate) fn run<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt().spawn(async move {
            let _ = tx.send(f.await);
        });
        match rx.recv() {
            Ok(v) => v,
            // The task can only end without answering by panicking: a bug in the store,
            // which must not pass for an answer.
            Err(_) => panic!("a PostgreSQL store task panicked"),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // A store may be dropped from async code (the last `Arc` of a server's handler);
        // dropping a runtime there would panic, shutting it down in the background
        // does not.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
