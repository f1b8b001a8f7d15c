//! `heddle serve`: a long-lived owner of the run store with an HTTP API.
//!
//! Activation follows a fixed order so a refused start changes nothing and no two
//! owners ever write: check the configuration (config, packages, store, port, token),
//! acquire the store's owner lease, watch for its loss, then adopt the runs a previous
//! owner left running. Shutdown (SIGINT/SIGTERM) stops accepting requests, cancels the
//! workers, waits for them up to a timeout and releases the lease; runs stopped this
//! way carry no ending and are adopted by the next owner.

mod api;
mod coding;
mod feed;
mod gzip;
mod host;
mod mask;
mod settings;
mod sse;
mod token;
mod viewer;
mod zstd;

use std::future::IntoFuture as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use heddle_store::SqliteStore;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;
use crate::durable::StoreSection;
use crate::exit::Exit;
use crate::providers::Env;

pub fn run(args: ServeArgs) -> anyhow::Result<Exit> {
    // The runs execute on threads of their own, and the requests' threads yield to them
    // when the cores are busy: a thousand event streams then cost the runs little,
    // instead of queueing every node's turn behind their writes in one scheduler.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("heddle-api")
        .on_thread_start(yield_to_runs)
        .build()?;
    let runs = crate::runtime::runtime()?;
    let exit = rt.block_on(serve(args, runs.handle().clone()));
    // SSE connections and blocked readers must not hold the process after shutdown.
    rt.shutdown_timeout(Duration::from_millis(100));
    runs.shutdown_timeout(Duration::from_millis(100));
    exit
}

async fn serve(args: ServeArgs, runs: tokio::runtime::Handle) -> anyhow::Result<Exit> {
    // 1. Configuration: everything that can be wrong is found before the lease is taken.
    let env = Env::load(&args.env, None).await?;
    let section = StoreSection::load(&env.config)?;
    let settings = settings::Settings::load(&env.config, &args)?;
    let store = Arc::new(section.open_sqlite()?);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        eprintln!("warning: listening on {addr}, reachable from other machines");
    }
    let api_url = format!("http://{addr}");
    let token_path = token::path_for(section.path());
    let (token, new_token) = token::load_or_create(&token_path)?;
    // Lets a user's signal during activation take the same orderly path.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;

    // 2. The lease: a second owner is refused here, naming the first.
    let ttl = settings.lease_ttl;
    let owner = store.acquire_lease(&api_url, ttl)?;

    // 3. Watch for its loss: the heartbeat failing means another owner may write now.
    let lost = CancellationToken::new();
    let watcher = tokio::spawn(heartbeat(store.clone(), ttl, lost.clone()));

    // 4. Adopt what a previous owner left running.
    let host = Arc::new(host::Host::new(
        store.clone(),
        section.clone(),
        env,
        args.workers as usize,
        host::Supervision {
            default: settings.supervise,
            decision_timeout: settings.decision_timeout,
        },
        runs,
    ));
    let adopted = match host.adopt_all().await {
        Ok(a) => a,
        Err(e) => {
            watcher.abort();
            store.release_lease()?;
            return Err(e.into());
        }
    };

    let app = api::router(host.clone(), token.clone());
    let stop = CancellationToken::new();
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future(),
    );
    if new_token {
        eprintln!(
            "API token (shown once; kept in {}): {}",
            token_path.display(),
            token.as_str()
        );
    } else {
        eprintln!("API token in {}", token_path.display());
    }
    eprintln!(
        "heddle serve: listening on {api_url} (store {}, {} workers, supervise {}, lease epoch {}, {} runs adopted)",
        section.path().display(),
        args.workers,
        settings.supervise.as_str(),
        owner.epoch,
        adopted.len()
    );
    eprintln!(
        "heddle serve: run viewer at {api_url}/ (it asks for the token; {api_url}/#token=TOKEN signs in without sending it to the server)"
    );

    let why = tokio::select! {
        _ = sigint.recv() => "interrupted",
        _ = sigterm.recv() => "terminated",
        _ = lost.cancelled() => "lease lost",
    };
    eprintln!("heddle serve: {why}; stopping");
    stop.cancel();
    let timeout = Duration::from_millis(args.shutdown_timeout_ms);
    let left = host.shutdown(timeout).await;
    server.abort();
    watcher.abort();
    if lost.is_cancelled() {
        // Nothing to release: someone else holds it, or it expired.
        return Err(anyhow::anyhow!(
            "the run store's owner lease was lost; every write stopped, and the runs are left for the next owner"
        ));
    }
    store.release_lease()?;
    if left > 0 {
        eprintln!(
            "error: shutdown timed out after {} ms with {left} run(s) still stopping; they are adopted by the next owner",
            args.shutdown_timeout_ms
        );
        return Ok(Exit::Failed);
    }
    eprintln!("heddle serve: stopped; lease released");
    Ok(Exit::Ok)
}

/// Lowers the calling thread's scheduling priority a little (Linux: the nice value is
/// per thread). Only under contention does it matter: then the runs come first.
fn yield_to_runs() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority touch no memory; a failure leaves the priority as is.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// Renews the lease every third of its length; on the first failure reports it and
/// cancels `lost` (the store already refuses this process's writes by then).
async fn heartbeat(store: Arc<SqliteStore>, ttl: Duration, lost: CancellationToken) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let s = store.clone();
        let r = tokio::task::spawn_blocking(move || s.renew_lease(ttl)).await;
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                eprintln!("error: {}", crate::exit::bounded(&format!("{e}")));
                lost.cancel();
                return;
            }
            Err(e) => {
                eprintln!("error: the lease heartbeat stopped: {e}");
                lost.cancel();
                return;
            }
        }
    }
}
