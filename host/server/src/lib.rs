//! `heddle serve` as a library: a long-lived owner of a run store with an HTTP API
//! (runs created, listed, shown, cancelled and resumed; each run's records as
//! Server-Sent Events; gates and escalations answered) and the web run viewer, its runs
//! driven by [`heddle_runtime`]'s driver.
//!
//! [`Server::activate`] follows a fixed order so a refused start changes nothing and no
//! two owners ever write: the configuration was checked by whoever loaded the
//! [`Runtime`]; then the token, the store's owner lease, a heartbeat watching for its
//! loss, and the adoption of the runs a previous owner left running. [`Server::wait`]
//! serves until the caller's stop signal or the lease's loss; [`Server::shutdown`]
//! stops accepting requests, stops every run's driver, waits for them up to a timeout
//! and releases the lease; runs stopped this way carry no ending and are adopted by the
//! next owner.
//!
//! On a store several hosts share (PostgreSQL, [`lease::Ownership::Shared`]) there is no
//! store-wide lease: the server registers as a host, claims queued runs and those whose
//! lease expired, leases each run it drives, and hands them back to the queue when it
//! shuts down ([`fleet`]). Any host answers for any run.
//!
//! [`api::router`] is the whole HTTP surface, testable in-process (`tower`'s
//! `ServiceExt::oneshot`) without a socket.

#![warn(missing_docs)]

pub mod api;
#[cfg(feature = "bench")]
pub mod bench;
pub mod coding;
pub mod feed;
pub mod fleet;
mod gzip;
pub mod host;
pub mod lease;
pub mod mask;
pub mod metrics;
pub mod sse;
pub mod token;
mod viewer;
mod zstd;

use std::future::{Future, IntoFuture as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use heddle_runtime::Runtime;
use heddle_store::StoreError;
use tokio_util::sync::CancellationToken;

pub use host::{Created, Host};
pub use lease::Lease;
pub use token::Token;

/// Why a server would not start, or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The run store refused (another owner holds its lease, it is unusable).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The API token file cannot be used.
    #[error(transparent)]
    Token(#[from] token::TokenError),
    /// The listening socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The lease was lost while serving: another owner may write now.
    #[error(
        "the run store's owner lease was lost; every write stopped, and the runs are left for the next owner"
    )]
    LeaseLost,
}

/// A server that owns its store (or its share of one): the lease is held and renewed,
/// the runs a previous owner left are adopted (or claimed, on a shared store), and the
/// API answers.
pub struct Server {
    host: Arc<Host>,
    hold: Hold,
    url: String,
    target: String,
    token: Token,
    token_path: PathBuf,
    new_token: bool,
    adopted: Vec<String>,
    lost: CancellationToken,
    heartbeat: tokio::task::JoinHandle<()>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    stop: CancellationToken,
}

/// How a running server holds its store.
enum Hold {
    /// A store file's owner lease, at this epoch.
    Alone { lease: Arc<dyn Lease>, epoch: u64 },
    /// Its registration among the hosts of a shared store.
    Shared {
        fleet: Arc<dyn heddle_store::Fleet>,
        ttl: Duration,
    },
}

impl Server {
    /// Takes `store` over (a store file through its lease; on a shared store, registered
    /// as one of its hosts) and answers on `listener`, driving runs on `runtime` with at
    /// most `workers` executing at once on `runs` (a tokio runtime of their own: see
    /// [`api_runtime`]). Refused, with nothing written, when another owner holds the
    /// store file's lease or another live host the same host id.
    pub async fn activate(
        runtime: Arc<Runtime>,
        store: lease::Ownable,
        listener: tokio::net::TcpListener,
        workers: usize,
        runs: tokio::runtime::Handle,
    ) -> Result<Server, Error> {
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            tracing::warn!("listening on {addr}, reachable from other machines");
        }
        let url = format!("http://{addr}");
        let token_path = token::path_for(runtime.settings().store.path());
        let (token, new_token) = token::load_or_create(&token_path)?;
        let ttl = runtime.settings().serve.lease_ttl;
        let lost = CancellationToken::new();
        let (host, hold, heartbeat, adopted) = match store.ownership {
            lease::Ownership::Alone(lease) => {
                // The lease: a second owner is refused here, naming the first.
                let owner = lease.acquire(&url, ttl)?;

                let host = Arc::new(Host::new(store.runs, runtime, workers, runs));
                host.metrics.lease_held(true);
                // Watch for its loss: the heartbeat failing means another owner may
                // write now.
                let heartbeat = tokio::spawn(heartbeat(
                    lease.clone(),
                    ttl,
                    lost.clone(),
                    host.metrics.clone(),
                ));

                // Adopt what a previous owner left running.
                let adopted = match host.adopt_all().await {
                    Ok(a) => a,
                    Err(e) => {
                        heartbeat.abort();
                        lease.release()?;
                        return Err(e.into());
                    }
                };
                let hold = Hold::Alone {
                    lease,
                    epoch: owner.epoch,
                };
                (host, hold, heartbeat, adopted)
            }
            lease::Ownership::Shared(fleet) => {
                // Registered: another live host with the same id is refused here.
                let (f, u) = (fleet.clone(), url.clone());
                tokio::task::spawn_blocking(move || f.register(&u))
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))??;
                let host = Arc::new(Host::shared(
                    store.runs,
                    fleet.clone(),
                    runtime,
                    workers,
                    runs,
                ));
                // Claims (the runs dead hosts left, once their leases expire, among
                // them) and the heartbeat of its leases.
                let heartbeat = tokio::spawn(fleet::serve(host.clone(), url.clone(), ttl));
                host.metrics.lease_held(true);
                (host, Hold::Shared { fleet, ttl }, heartbeat, Vec::new())
            }
        };

        let app = api::router(host.clone(), token.clone());
        let stop = CancellationToken::new();
        let serving = tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.clone().cancelled_owned())
                .into_future(),
        );
        Ok(Server {
            host,
            hold,
            url,
            target: store.target,
            token,
            token_path,
            new_token,
            adopted,
            lost,
            heartbeat,
            serving,
            stop,
        })
    }

    /// Where the API answers (`http://ADDR:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the store is (a file, or server, database and schema; no password).
    pub fn store_target(&self) -> &str {
        &self.target
    }

    /// The bearer token every request must carry.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// Where the token is kept (owner-only), and whether this start made it (it is
    /// shown that one time).
    pub fn token_file(&self) -> (&std::path::Path, bool) {
        (&self.token_path, self.new_token)
    }

    /// The runs adopted at activation (a store file's; on a shared store runs are
    /// adopted as they are claimed).
    pub fn adopted(&self) -> &[String] {
        &self.adopted
    }

    /// The store file lease's epoch (raised by every activation); `None` on a shared
    /// store, where each run has its own.
    pub fn lease_epoch(&self) -> Option<u64> {
        match &self.hold {
            Hold::Alone { epoch, .. } => Some(*epoch),
            Hold::Shared { .. } => None,
        }
    }

    /// This server's host id and its leases' TTL, on a shared store.
    pub fn shared(&self) -> Option<(&str, Duration)> {
        match &self.hold {
            Hold::Alone { .. } => None,
            Hold::Shared { fleet, ttl } => Some((fleet.host_id(), *ttl)),
        }
    }

    /// The runs it owns.
    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Answers `GET /metrics` on `listener` too, without a token (see
    /// [`metrics`]), until the server stops serving.
    pub fn serve_metrics(&self, listener: tokio::net::TcpListener) {
        let app = metrics::router(self.host.clone());
        let stop = self.stop.clone();
        tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .into_future(),
        );
    }

    /// Serves until `stop` completes (with why: a signal's name) or the lease is lost
    /// (`lease lost`); returns why.
    pub async fn wait(&self, stop: impl Future<Output = &'static str>) -> &'static str {
        tokio::select! {
            why = stop => why,
            _ = self.lost.cancelled() => "lease lost",
        }
    }

    /// Stops accepting requests, stops every run's driver and waits up to `timeout`
    /// for them, then releases the lease (on a shared store: hands every run it held
    /// back to the queue, for the other hosts, and ends its registration). Returns how
    /// many runs were still stopping when the wait gave up (the next owner adopts them).
    pub async fn shutdown(self, timeout: Duration) -> Result<usize, Error> {
        self.stop.cancel();
        let left = self.host.shutdown(timeout).await;
        self.serving.abort();
        self.heartbeat.abort();
        match self.hold {
            Hold::Alone { lease, .. } => {
                if self.lost.is_cancelled() {
                    // Nothing to release: someone else holds it, or it expired.
                    return Err(Error::LeaseLost);
                }
                lease.release()?;
            }
            Hold::Shared { fleet, .. } => {
                tokio::task::spawn_blocking(move || fleet.deregister(true))
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))??;
            }
        }
        self.host.metrics.lease_held(false);
        Ok(left)
    }
}

/// The runtime the API's requests run on, apart from the runs': its threads yield to
/// the runs' when the cores are busy, so a thousand event streams cost the runs little
/// instead of queueing every node's turn behind their writes in one scheduler.
pub fn api_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("heddle-api")
        .on_thread_start(yield_to_runs)
        .build()
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
async fn heartbeat(
    lease: Arc<dyn Lease>,
    ttl: Duration,
    lost: CancellationToken,
    metrics: Arc<metrics::ServerMetrics>,
) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let l = lease.clone();
        let r = tokio::task::spawn_blocking(move || l.renew(ttl)).await;
        metrics.lease_renewed(matches!(r, Ok(Ok(_))));
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!("{e}");
                lost.cancel();
                return;
            }
            Err(e) => {
                tracing::error!("the lease heartbeat stopped: {e}");
                lost.cancel();
                return;
            }
        }
    }
}
