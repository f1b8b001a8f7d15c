//! `heddle serve`: [`heddle_server::Server`] activated on this machine's settings, the
//! lines a person reads at its start and stop, and the signals that stop it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use heddle_runtime::{Overrides, Runtime, ServeOverrides, Settings};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::ServeArgs;
use crate::console::say;
use crate::exit::Exit;

pub fn run(args: ServeArgs) -> anyhow::Result<Exit> {
    // The runs execute on threads of their own (see `heddle_server::api_runtime`).
    let rt = heddle_server::api_runtime()?;
    let runs = heddle_runtime::tokio_runtime(None)?;
    let exit = rt.block_on(serve(args, runs.handle().clone()));
    // SSE connections and blocked readers must not hold the process after shutdown.
    rt.shutdown_timeout(Duration::from_millis(100));
    runs.shutdown_timeout(Duration::from_millis(100));
    exit
}

/// A server's error as the command line classifies it (by the store's or the token
/// file's own error).
fn server_error(e: heddle_server::Error) -> anyhow::Error {
    match e {
        heddle_server::Error::Store(s) => s.into(),
        heddle_server::Error::Token(t) => t.into(),
        e => e.into(),
    }
}

async fn serve(args: ServeArgs, runs: tokio::runtime::Handle) -> anyhow::Result<Exit> {
    // Everything that can be wrong is found before the lease is taken.
    let settings = Settings::load(&Overrides {
        serve: ServeOverrides {
            supervise: args.supervise.map(Into::into),
            decision_timeout_ms: args.decision_timeout_ms,
            lease_ttl_ms: args.lease_ttl_ms,
            host_id: args.host_id.clone(),
        },
        ..args.env.overrides()
    })?;
    crate::console::set_format(settings.telemetry.log_format);
    let runtime = Arc::new(Runtime::load(settings, None).await?);
    let store = heddle_server::lease::open(runtime.settings())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
    let metrics_listener = match args.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}: cannot listen there"))?,
        ),
        None => None,
    };
    // Lets a user's signal during activation take the same orderly path.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let server = heddle_server::Server::activate(
        runtime.clone(),
        store,
        listener,
        args.workers as usize,
        runs,
    )
    .await
    .map_err(server_error)?;
    let metrics_at = match metrics_listener {
        Some(l) => {
            let at = format!("http://{}/metrics, no token", l.local_addr()?);
            server.serve_metrics(l);
            at
        }
        None => format!("{}/metrics, with the token", server.url()),
    };

    let url = server.url().to_string();
    let (token_path, new_token) = server.token_file();
    if new_token {
        say(&format!(
            "API token (shown once; kept in {}): {}",
            token_path.display(),
            server.token().as_str()
        ));
    } else {
        say(&format!("API token in {}", token_path.display()));
    }
    let s = runtime.settings();
    match (server.lease_epoch(), server.shared()) {
        (Some(epoch), _) => say(&format!(
            "heddle serve: listening on {url} (store {}, {} workers, supervise {}, lease epoch {epoch}, {} runs adopted)",
            server.store_target(),
            args.workers,
            s.serve.supervise.as_str(),
            server.adopted().len()
        )),
        (None, Some((host_id, ttl))) => say(&format!(
            "heddle serve: listening on {url} (store {}, host {host_id}, {} workers, supervise {}, run leases of {} ms renewed every {} ms; claiming queued runs and those whose lease expired)",
            server.store_target(),
            args.workers,
            s.serve.supervise.as_str(),
            ttl.as_millis(),
            (ttl / 3).as_millis()
        )),
        (None, None) => {}
    }
    say(&format!(
        "heddle serve: run viewer at {url}/ (it asks for the token; {url}/#token=TOKEN signs in without sending it to the server)"
    ));
    say(&format!("heddle serve: metrics at {metrics_at}"));

    let why = server
        .wait(async {
            tokio::select! {
                _ = sigint.recv() => "interrupted",
                _ = sigterm.recv() => "terminated",
            }
        })
        .await;
    say(&format!("heddle serve: {why}; stopping"));
    let server_shared = server.shared().is_some();
    let left = server
        .shutdown(Duration::from_millis(args.shutdown_timeout_ms))
        .await
        .map_err(server_error)?;
    if left > 0 {
        crate::console::error(&format!(
            "shutdown timed out after {} ms with {left} run(s) still stopping; they are adopted by the next owner",
            args.shutdown_timeout_ms
        ));
        return Ok(Exit::Failed);
    }
    if server_shared {
        say("heddle serve: stopped; its runs handed back to the queue");
    } else {
        say("heddle serve: stopped; lease released");
    }
    Ok(Exit::Ok)
}
