//! One granted request, from name to response: resolve, check each address, connect to
//! exactly the one checked (and check the peer again), TLS, HTTP/1.1, with the bodies
//! both ways counted, capped and tied to the invocation's token and deadline.

use std::future::{Future, poll_fn};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use heddle_core::net::{Host, Scheme};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::addr::{self, NamedAddress};
use super::{Caller, HttpMeter, NetShared, Target, header_bytes, refusal_line};
use crate::host_state::LogBuf;

/// The client TLS configuration: the system's roots (rustls-native-certs) and every
/// certificate in the operator's `ca_files`.
pub(crate) fn tls_config(ca_files: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::warn!("loading the system's TLS root certificates: {e}");
    }
    roots.add_parsable_certificates(native.certs);
    for cert in ca_certificates(ca_files)? {
        roots
            .add(cert)
            .map_err(|e| format!("a certificate of [wasm] http_ca_files: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The certificates of the operator's CA files (PEM), refused naming the file when one
/// is unreadable or holds none.
pub(crate) fn ca_certificates(files: &[PathBuf]) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut out = Vec::new();
    for f in files {
        let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(f)
            .map_err(|e| format!("[wasm] http_ca_files: {}: {e}", f.display()))?
            .collect();
        let certs = certs.map_err(|e| format!("[wasm] http_ca_files: {}: {e}", f.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "[wasm] http_ca_files: {} holds no PEM certificate",
                f.display()
            ));
        }
        out.extend(certs);
    }
    Ok(out)
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// What `send_request` decided, carried into the future that sends it.
pub(crate) struct Job {
    pub shared: Arc<NetShared>,
    pub log: Arc<Mutex<LogBuf>>,
    pub caller: Arc<Caller>,
    pub meter: Arc<HttpMeter>,
    pub cancel: CancellationToken,
    pub target: Target,
    pub shown: String,
    pub named: Option<NamedAddress>,
    pub deadline: Instant,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Option<Duration>,
    pub between_bytes_timeout: Option<Duration>,
    /// The request's slot of `http_max_concurrent`, given back when the job (kept by the
    /// response body) is dropped.
    pub _permit: OwnedSemaphorePermit,
}

type Response = (
    http::Response<WasiBody>,
    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
);

impl Job {
    /// Sends `request`; ends at once when the invocation's token is cancelled or the
    /// request's deadline passes.
    pub async fn run(self, request: http::Request<WasiBody>) -> Result<Response, HttpError> {
        let cancel = self.cancel.clone();
        let deadline = self.deadline;
        let meter = self.meter.clone();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                meter.abort();
                Err(HttpError::ConnectionTerminated)
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                meter.abort();
                Err(HttpError::HttpResponseTimeout)
            }
            r = self.exchange(request) => r,
        }
    }

    /// Logs a refusal made after `send_request` returned (an address, a body).
    fn refuse(&self, why: &str) {
        refusal_line(&self.log, &self.caller, &self.meter, &self.shown, why);
    }

    async fn exchange(self, mut request: http::Request<WasiBody>) -> Result<Response, HttpError> {
        let addrs = self.addresses().await?;
        let tcp = self.connect(&addrs).await?;
        let io: Box<dyn Stream> = match self.target.scheme {
            Scheme::Http => Box::new(tcp),
            Scheme::Https => {
                let config = self.shared.tls().map_err(|e| {
                    self.refuse(&e);
                    HttpError::ConfigurationError
                })?;
                let name = match &self.target.host {
                    Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
                    Host::Name(n) => ServerName::try_from(n.clone())
                        .map_err(|_| HttpError::HttpRequestUriInvalid)?,
                    Host::Wildcard(_) => return Err(HttpError::HttpRequestUriInvalid),
                };
                let tls = tokio::time::timeout(
                    self.connect_timeout,
                    tokio_rustls::TlsConnector::from(config).connect(name, tcp),
                )
                .await
                .map_err(|_| HttpError::ConnectionTimeout)?
                .map_err(HttpError::Tls)?;
                Box::new(tls)
            }
        };
        let (mut sender, conn) = tokio::time::timeout(
            self.connect_timeout,
            hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(io)),
        )
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;

        // The request line carries the path alone (an absolute URI there addresses a
        // proxy, which this is not).
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        *request.uri_mut() = http::Uri::builder()
            .path_and_query(path)
            .build()
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let max = self.shared.max_body;
        let request = request.map(|body| {
            Outbound {
                inner: body,
                meter: self.meter.clone(),
                sent: 0,
                max,
            }
            .boxed_unsync()
        });

        let send = sender.send_request(request);
        let mut send = pin!(send);
        let mut conn = Some(conn);
        // Drives the connection while the response is awaited (nothing else does).
        let response = poll_fn(|cx| match send.as_mut().poll(cx) {
            Poll::Ready(r) => Poll::Ready(r.map_err(body_error)),
            Poll::Pending => {
                let Some(c) = conn.as_mut() else {
                    return Poll::Pending;
                };
                let r = ready!(Pin::new(c).poll(cx));
                conn = None;
                match r {
                    Ok(()) => send.as_mut().poll(cx).map_err(body_error),
                    Err(e) => Poll::Ready(Err(body_error(e))),
                }
            }
        });
        let response = match self.first_byte_timeout {
            Some(t) => tokio::time::timeout(t, response)
                .await
                .map_err(|_| HttpError::ConnectionReadTimeout)?,
            None => response.await,
        };
        let response = match response {
            Err(HttpError::HttpRequestBodySize(n)) => {
                self.refuse(&format!(
                    "its body passed the {max}-byte limit (`max_http_body_bytes` in [wasm]); the rest was not sent"
                ));
                return Err(HttpError::HttpRequestBodySize(n));
            }
            r => r?,
        };
        self.meter.add_bytes(header_bytes(response.headers()) + 16);
        if let Some(len) = super::content_length(response.headers())
            && len > max
        {
            self.refuse(&format!(
                "its response body of {len} bytes is over the {max}-byte limit (`max_http_body_bytes` in [wasm])"
            ));
            return Err(HttpError::HttpResponseBodySize(Some(len)));
        }

        let cancel = self.cancel.clone();
        let deadline = self.deadline;
        let io = async move {
            let Some(conn) = conn else { return Ok(()) };
            tokio::select! {
                _ = cancel.cancelled() => Err(HttpError::ConnectionTerminated),
                _ = tokio::time::sleep_until(deadline.into()) => Err(HttpError::HttpResponseTimeout),
                r = conn => r.map_err(HttpError::from),
            }
        };
        let between = self.between_bytes_timeout;
        let body_cancel = self.cancel.clone().cancelled_owned();
        let response = response.map(move |incoming| {
            Inbound {
                inner: incoming,
                received: 0,
                max,
                cancel: Box::pin(body_cancel),
                deadline: Box::pin(tokio::time::sleep_until(deadline.into())),
                between: between.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
                done: false,
                job: self,
            }
            .boxed_unsync()
        });
        Ok((response, Box::new(io)))
    }

    /// The addresses the request may connect to: the granted address itself, or what a
    /// name resolves to minus every address `addr::allowed` refuses.
    async fn addresses(&self) -> Result<Vec<SocketAddr>, HttpError> {
        let port = self.target.port;
        let ips: Vec<IpAddr> = match &self.target.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => match self.shared.resolve.get().and_then(|f| f(name)) {
                Some(ips) => ips,
                None => tokio::time::timeout(
                    self.connect_timeout,
                    tokio::net::lookup_host((name.as_str(), port)),
                )
                .await
                .map_err(|_| HttpError::DnsTimeout)?
                .map_err(|e| HttpError::DnsError {
                    rcode: Some(e.to_string()),
                    info_code: None,
                })?
                .map(|a| a.ip())
                .collect(),
            },
            Host::Wildcard(_) => return Err(HttpError::HttpRequestUriInvalid),
        };
        let mut ok = Vec::new();
        let mut first_refusal = None;
        for ip in ips {
            match addr::allowed(ip, self.named.as_ref()) {
                Ok(()) => ok.push(SocketAddr::new(ip, port)),
                Err(why) => {
                    first_refusal.get_or_insert(why);
                }
            }
        }
        if ok.is_empty() {
            return Err(match first_refusal {
                Some(why) => {
                    self.refuse(&why);
                    HttpError::DestinationIpProhibited
                }
                None => HttpError::DestinationNotFound,
            });
        }
        Ok(ok)
    }

    /// Connects to the first address that answers, then checks the peer it reached.
    async fn connect(&self, addrs: &[SocketAddr]) -> Result<TcpStream, HttpError> {
        let attempt = async {
            let mut last = None;
            for a in addrs {
                match TcpStream::connect(a).await {
                    Ok(s) => return Ok(s),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("no address to connect to")))
        };
        let stream = tokio::time::timeout(self.connect_timeout, attempt)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)?
            .map_err(HttpError::Connect)?;
        let peer = stream.peer_addr().map_err(HttpError::Connect)?;
        if let Err(why) = addr::allowed(peer.ip(), self.named.as_ref()) {
            self.refuse(&format!("connected to {peer}: {why}"));
            return Err(HttpError::DestinationIpProhibited);
        }
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

/// A hyper error as the guest should see it: the request body's own error (its cap)
/// when that is what stopped the exchange.
fn body_error(e: hyper::Error) -> HttpError {
    use std::error::Error as _;
    match e.source().and_then(|s| s.downcast_ref::<HttpError>()) {
        Some(HttpError::HttpRequestBodySize(n)) => HttpError::HttpRequestBodySize(*n),
        _ => HttpError::from(e),
    }
}

/// The guest's request body, counted and capped.
struct Outbound {
    inner: WasiBody,
    meter: Arc<HttpMeter>,
    sent: u64,
    max: u64,
}

impl Body for Outbound {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame
            && let Some(data) = f.data_ref()
        {
            self.sent += data.len() as u64;
            self.meter.add_bytes(data.len());
            if self.sent > self.max {
                return Poll::Ready(Some(Err(HttpError::HttpRequestBodySize(Some(self.sent)))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The response body as the guest reads it: counted, capped, and ended by the
/// invocation's token, the request's deadline and the guest's between-bytes timeout.
/// Holds the request's slot of `http_max_concurrent` until it is dropped.
struct Inbound {
    inner: hyper::body::Incoming,
    received: u64,
    max: u64,
    cancel: Pin<Box<WaitForCancellationFutureOwned>>,
    deadline: Pin<Box<Sleep>>,
    between: Option<(Duration, Pin<Box<Sleep>>)>,
    done: bool,
    job: Job,
}

impl Body for Inbound {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.cancel.as_mut().poll(cx).is_ready() {
            this.done = true;
            this.job.meter.abort();
            return Poll::Ready(Some(Err(HttpError::ConnectionTerminated)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            this.job.meter.abort();
            return Poll::Ready(Some(Err(HttpError::HttpResponseTimeout)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    this.job.meter.add_bytes(data.len());
                    if this.received > this.max {
                        this.done = true;
                        this.job.refuse(&format!(
                            "its response body passed the {}-byte limit (`max_http_body_bytes` in [wasm]); the rest was not read",
                            this.max
                        ));
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(
                            this.received,
                        )))));
                    }
                }
                if let Some((d, sleep)) = &mut this.between {
                    sleep.as_mut().reset((Instant::now() + *d).into());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                Poll::Ready(Some(Err(HttpError::from(e))))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some((_, sleep)) = &mut this.between
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    this.done = true;
                    return Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
