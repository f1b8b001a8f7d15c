//! The tokio runtime every command runs on: built by the command that needs one, so a
//! command that needs none (`validate` of a bad file, `--help`) starts no threads.

/// The tokio runtime the commands run on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    runtime_with_threads(None)
}

/// A runtime with `threads` workers (`None`: one per core); 1 is a current-thread
/// runtime, so `heddle bench --threads 1` measures the scheduler without any cross-thread
/// wake-ups.
pub fn runtime_with_threads(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    Ok(b.enable_all().thread_name("heddle").build()?)
}
