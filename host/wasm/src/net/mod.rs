//! Outgoing HTTP for packages granted it: `wasi:http/outgoing-handler` (through
//! `wasmtime-wasi-http`), with every request judged by the host before any connection.
//!
//! Every store links `wasi:http`; what a request may reach is the node's grant
//! (`NodeGrant::network`, the package's `network` narrowed by the graph's
//! `limits.network`). [`Outgoing`] is the store's `WasiHttpHooks`: `send_request`
//! checks the scheme, host and port against the grant, adds the headers the operator
//! attached to the destination (`network_auth`, from secrets the guest never sees), and
//! only then resolves, checks every address it would connect to (a host name never
//! reaches loopback, private, link-local, unique-local or metadata addresses: `addr`),
//! connects to exactly the address it checked (and checks the connected peer again, so
//! a second DNS answer changes nothing), and speaks TLS verified against the system's
//! roots (plus `[wasm] http_ca_files`). The host never follows a redirect: a redirect is
//! the guest's next request, judged like the first.
//!
//! Bounded like every host call: connect and total timeouts (`[wasm]` settings, never
//! past the invocation's deadline), request and response bodies capped
//! (`max_http_body_bytes`), a few requests in flight per invocation
//! (`http_max_concurrent`), and each byte sent or received charged fuel
//! ([`HttpMeter`], collected with the other host calls). A cancel, the deadline, or the
//! end of the invocation aborts whatever is still in flight at once: every request and
//! body waits on the invocation's token.
//!
//! A refusal is an error the guest sees (`HTTP-request-denied`,
//! `destination-IP-prohibited`, …) and a line in the node's log naming package, node and
//! destination, with the grant that would allow it.

mod addr;
mod send;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use heddle_core::LogLevel;
use heddle_core::net::{Destination, Host, Scheme};
use heddle_kernel::SecretRegistry;
use http::{HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::config::{EngineSettings, SecretsConfig};
use crate::grants::NetGrant;
use crate::host_state::LogBuf;
use crate::text;

pub(crate) use addr::NamedAddress;

/// Refusals written to a node's log per invocation; later ones are counted in one line.
const MAX_REFUSALS_LOGGED: usize = 8;

/// Answers a host name before the system resolver does ([`crate::WasmHost::on_resolve`]):
/// `None` leaves the name to the system.
pub type ResolveOverride = dyn Fn(&str) -> Option<Vec<IpAddr>> + Send + Sync;

/// What every store's outgoing HTTP shares: the engine's settings, the TLS
/// configuration (built at the first HTTPS request: loading the system's roots costs
/// milliseconds a run without network should not pay) and the resolver override.
pub(crate) struct NetShared {
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub max_body: u64,
    pub max_concurrent: usize,
    ca_files: Vec<PathBuf>,
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    pub resolve: OnceLock<Box<ResolveOverride>>,
}

impl NetShared {
    pub fn new(settings: &EngineSettings) -> NetShared {
        NetShared {
            connect_timeout: Duration::from_millis(settings.http_connect_timeout_ms),
            timeout: Duration::from_millis(settings.http_timeout_ms),
            max_body: settings.max_http_body_bytes,
            max_concurrent: settings.http_max_concurrent,
            ca_files: settings.http_ca_files.clone(),
            tls: OnceLock::new(),
            resolve: OnceLock::new(),
        }
    }

    /// The client TLS configuration: the system's roots and the operator's CA files.
    pub fn tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.tls
            .get_or_init(|| send::tls_config(&self.ca_files))
            .clone()
    }
}

/// Refuses CA files that cannot be read or hold no certificate, naming the file.
pub(crate) fn check_ca_files(files: &[PathBuf]) -> Result<(), crate::PackageError> {
    send::ca_certificates(files)
        .map(drop)
        .map_err(|e| crate::PackageError::engine("[wasm] http_ca_files", std::io::Error::other(e)))
}

/// Requests and bytes one invocation sent and received: charged fuel with the other
/// host calls (`HostBudget::charged`) and reported with its metrics.
#[derive(Debug, Default)]
pub(crate) struct HttpMeter {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    refusals: AtomicUsize,
    /// A request or body was ended by the invocation's token or deadline: a guest that
    /// fails after it failed because it was stopped (the executor reports the cancel or
    /// the deadline, not the guest's error about a lost request).
    aborted: std::sync::atomic::AtomicBool,
}

impl HttpMeter {
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
    }

    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }

    pub fn add_bytes(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Who is calling, for log lines.
#[derive(Debug)]
pub(crate) struct Caller {
    pub package: String,
    pub node_id: String,
    pub node_type: String,
}

/// The invocation in flight, as outgoing requests see it.
pub(crate) struct NetInvocation {
    pub caller: Arc<Caller>,
    /// Cancelled when the run is cancelled and when the invocation ends (a guest that
    /// returns with requests in flight leaves nothing running behind it).
    pub cancel: CancellationToken,
    pub deadline: Option<Instant>,
    pub meter: Arc<HttpMeter>,
    pub secrets: Arc<SecretsConfig>,
    pub registry: Arc<SecretRegistry>,
    permits: Arc<tokio::sync::Semaphore>,
}

/// A store's `WasiHttpHooks`: the grant of the node it runs and the invocation in
/// flight.
pub(crate) struct Outgoing {
    shared: Arc<NetShared>,
    grant: Arc<NetGrant>,
    log: Arc<Mutex<LogBuf>>,
    inv: Option<NetInvocation>,
}

impl Outgoing {
    pub fn new(shared: Arc<NetShared>, grant: Arc<NetGrant>, log: Arc<Mutex<LogBuf>>) -> Self {
        Outgoing {
            shared,
            grant,
            log,
            inv: None,
        }
    }

    /// Starts an invocation: requests made from now on are charged to `meter` and
    /// aborted by `cancel` (a child of the run's token).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &mut self,
        caller: Arc<Caller>,
        run_cancel: &CancellationToken,
        deadline: Option<Instant>,
        meter: Arc<HttpMeter>,
        secrets: Arc<SecretsConfig>,
        registry: Arc<SecretRegistry>,
    ) {
        self.finish();
        self.inv = Some(NetInvocation {
            caller,
            cancel: run_cancel.child_token(),
            deadline,
            meter,
            secrets,
            registry,
            permits: Arc::new(tokio::sync::Semaphore::new(self.shared.max_concurrent)),
        });
    }

    /// Ends the invocation: whatever it left in flight is aborted now.
    pub fn finish(&mut self) {
        if let Some(inv) = self.inv.take() {
            inv.cancel.cancel();
        }
    }

    /// Logs a refusal (bounded per invocation) and returns the error the guest sees.
    fn refuse(&self, dest: &str, why: &str, error: HttpError) -> HttpError {
        if let Some(inv) = &self.inv {
            refusal_line(&self.log, &inv.caller, &inv.meter, dest, why);
        }
        error
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Writes the log line (and the tracing event) of a refused request.
pub(crate) fn refusal_line(
    log: &Mutex<LogBuf>,
    c: &Caller,
    meter: &HttpMeter,
    dest: &str,
    why: &str,
) {
    tracing::warn!(package = %c.package, node = %c.node_id, destination = %dest, "outgoing HTTP request refused: {why}");
    let n = meter.refusals.fetch_add(1, Ordering::Relaxed) + 1;
    let line = if n <= MAX_REFUSALS_LOGGED {
        format!(
            "package `{}`, node `{}` ({}): request to {dest} refused: {why}",
            c.package, c.node_id, c.node_type
        )
    } else if n == MAX_REFUSALS_LOGGED + 1 {
        "further refused requests of this invocation are not logged".into()
    } else {
        return;
    };
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_host_line(LogLevel::Warn, line);
}

/// The future `send_request` returns.
type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

fn refused(e: HttpError) -> Sent {
    Box::new(std::future::ready(Err(e)))
}

/// A request's target as the grant judges it.
pub(crate) struct Target {
    pub scheme: Scheme,
    pub host: Host,
    pub port: u16,
}

impl Target {
    /// `scheme://host:port` for log lines (guest-chosen text: escaped and bounded).
    pub fn show(&self) -> String {
        text::line(
            &format!("{}://{}:{}", self.scheme.as_str(), self.host, self.port),
            256,
        )
    }

    /// The destination that would grant exactly this target.
    fn as_destination(&self) -> Destination {
        Destination {
            scheme: self.scheme,
            host: self.host.clone(),
            port: self.port,
        }
    }
}

/// Reads a request's scheme and authority; `Err` says what is malformed.
fn target(uri: &http::Uri) -> Result<Target, String> {
    let scheme = uri.scheme_str().and_then(Scheme::parse).ok_or_else(|| {
        format!(
            "the scheme `{}` is not http or https",
            uri.scheme_str().unwrap_or("")
        )
    })?;
    let authority = uri.authority().ok_or("the request names no host")?;
    if authority.as_str().contains('@') {
        return Err("the authority holds a user name".into());
    }
    let host = Host::parse(authority.host(), false)?;
    let port = match authority.port() {
        None => scheme.default_port(),
        Some(p) => match p.as_u16() {
            0 => return Err("port 0".into()),
            n => n,
        },
    };
    Ok(Target { scheme, host, port })
}

/// Header names a grant may not inject (they frame the message or route it).
pub(crate) const RESERVED_HEADERS: &[&str] = &[
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "http2-settings",
];

impl WasiHttpHooks for Outgoing {
    // Every scheme reaches `send_request`, where a refusal is logged like any other.
    fn is_supported_scheme(&mut self, _scheme: &http::uri::Scheme) -> bool {
        true
    }

    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Sent {
        let Some(inv) = &self.inv else {
            // `describe()` runs outside any invocation and reaches nothing.
            return refused(HttpError::HttpRequestDenied);
        };
        let package = inv.caller.package.clone();
        let t = match target(request.uri()) {
            Ok(t) => t,
            Err(why) => {
                let shown = text::line(&request.uri().to_string(), 256);
                return refused(self.refuse(
                    &shown,
                    &format!("malformed target: {why}"),
                    HttpError::HttpRequestUriInvalid,
                ));
            }
        };
        let shown = t.show();
        let Some(dest) = self
            .grant
            .allowed
            .iter()
            .find(|d| d.matches(t.scheme, &t.host, t.port))
            .cloned()
        else {
            let want = t.as_destination();
            let why = if self.grant.granted.iter().any(|d| d.covers(&want)) {
                format!(
                    "the graph narrowed this node's destinations (`limits.network`) to {}",
                    list(&self.grant.allowed)
                )
            } else if self.grant.granted.is_empty() {
                format!(
                    "package `{package}` is granted no network; to allow it add `network = [\"{want}\"]` to [packages.{package}] in heddle.toml"
                )
            } else {
                format!(
                    "not granted (granted: {}); to allow it add \"{want}\" to `network` in [packages.{package}] of heddle.toml",
                    list(&self.grant.granted)
                )
            };
            return refused(self.refuse(&shown, &why, HttpError::HttpRequestDenied));
        };

        // The operator's header for this destination, which the guest must not set.
        if let Some((_, auth)) = self
            .grant
            .auth
            .iter()
            .find(|(d, _)| d.matches(t.scheme, &t.host, t.port))
        {
            let name = match HeaderName::from_bytes(auth.header.as_bytes()) {
                Ok(n) => n,
                Err(_) => {
                    return refused(self.refuse(
                        &shown,
                        "the configured header name is malformed",
                        HttpError::ConfigurationError,
                    ));
                }
            };
            if request.headers().contains_key(&name) {
                let why = format!(
                    "the request sets the header `{name}`, which the host adds for this destination from the operator's secret; a package may not set it itself"
                );
                return refused(self.refuse(&shown, &why, HttpError::HttpRequestDenied));
            }
            let Some(secret) = inv.secrets.lookup(auth.secret.get_ref()) else {
                let why = format!(
                    "the secret `{}` of its `network_auth` is not set",
                    auth.secret.get_ref()
                );
                return refused(self.refuse(&shown, &why, HttpError::ConfigurationError));
            };
            let value = auth.value(&secret);
            inv.registry.register(&secret);
            inv.registry.register(&value);
            match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    request.headers_mut().insert(name, v);
                }
                Err(_) => {
                    let why = format!(
                        "the value of secret `{}` cannot be sent in a header",
                        auth.secret.get_ref()
                    );
                    return refused(self.refuse(&shown, &why, HttpError::ConfigurationError));
                }
            }
        }

        let max = self.shared.max_body;
        if let Some(len) = content_length(request.headers())
            && len > max
        {
            let why = format!(
                "its body of {len} bytes is over the {max}-byte limit (`max_http_body_bytes` in [wasm])"
            );
            return refused(self.refuse(&shown, &why, HttpError::HttpRequestBodySize(Some(len))));
        }
        let Ok(permit) = inv.permits.clone().try_acquire_owned() else {
            let why = format!(
                "{} requests of this invocation are in flight already (`http_max_concurrent` in [wasm])",
                self.shared.max_concurrent
            );
            return refused(self.refuse(&shown, &why, HttpError::ConnectionLimitReached));
        };
        inv.meter.requests.fetch_add(1, Ordering::Relaxed);
        inv.meter
            .add_bytes(header_bytes(request.headers()) + request.uri().to_string().len());

        let named = match &dest.host {
            Host::Ip(ip) => Some(NamedAddress::Exactly(*ip)),
            Host::Name(n) if n == "localhost" => Some(NamedAddress::Loopback),
            _ => None,
        };
        let now = Instant::now();
        let mut deadline = now + self.shared.timeout;
        if let Some(d) = inv.deadline {
            deadline = deadline.min(d);
        }
        let connect_timeout = options
            .and_then(|o| o.connect_timeout)
            .map_or(self.shared.connect_timeout, |c| {
                c.min(self.shared.connect_timeout)
            });
        let job = send::Job {
            shared: self.shared.clone(),
            log: self.log.clone(),
            caller: inv.caller.clone(),
            meter: inv.meter.clone(),
            cancel: inv.cancel.clone(),
            target: t,
            shown,
            named,
            deadline,
            connect_timeout,
            first_byte_timeout: options.and_then(|o| o.first_byte_timeout),
            between_bytes_timeout: options.and_then(|o| o.between_bytes_timeout),
            _permit: permit,
        };
        Box::new(job.run(request))
    }
}

fn list(dests: &[Destination]) -> String {
    if dests.is_empty() {
        return "nothing".into();
    }
    let set: BTreeSet<String> = dests.iter().map(ToString::to_string).collect();
    set.into_iter().collect::<Vec<_>>().join(", ")
}

fn content_length(h: &http::HeaderMap) -> Option<u64> {
    h.get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Bytes of a header section as sent (names, values and the `: ` and CRLF around them).
pub(crate) fn header_bytes(h: &http::HeaderMap) -> usize {
    h.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum()
}
