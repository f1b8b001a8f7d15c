//! Test servers on real loopback sockets, HTTP and HTTPS (a CA made in the test with
//! rcgen), that count every connection they accept and report what happens on each, in
//! order, so a test asserts on effects where they land: a refused request is one the
//! server never saw a connection for.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// What the server does with each request.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Answers `status` with `body` (and a content-length).
    Respond {
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
    },
    /// Answers 302 to `location`.
    Redirect(String),
    /// Reads the request and never answers.
    Silent,
    /// Answers 200 without a length and writes 8 KiB chunks until the client goes.
    Endless,
    /// Answers 200 with a content-length of `0` bytes it never sends.
    Claims(u64),
    /// Answers 200 with the request's headers as the body (a JSON object).
    EchoHeaders,
}

/// What the server saw, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen {
    Connected,
    /// A complete request head: method and path.
    Request(String, String),
    /// The client closed the connection (or a write to it failed).
    Closed,
}

/// A request the server received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

pub struct Server {
    pub port: u16,
    pub connections: Arc<AtomicUsize>,
    pub received: Arc<Mutex<Vec<Received>>>,
    pub seen: mpsc::UnboundedReceiver<Seen>,
}

/// A test CA and a server certificate it signed for `localhost` and 127.0.0.1.
pub struct TestCa {
    pub ca_pem: String,
    pub acceptor: tokio_rustls::TlsAcceptor,
}

impl TestCa {
    pub fn new() -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "heddle test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .unwrap();
        TestCa {
            ca_pem: ca.pem(),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        }
    }
}

impl Server {
    /// An HTTP server on 127.0.0.1.
    pub async fn http(behavior: Behavior) -> Server {
        Server::start(behavior, None).await
    }

    /// An HTTPS server on 127.0.0.1 with `ca`'s certificate.
    pub async fn https(behavior: Behavior, ca: &TestCa) -> Server {
        Server::start(behavior, Some(ca.acceptor.clone())).await
    }

    async fn start(behavior: Behavior, tls: Option<tokio_rustls::TlsAcceptor>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (tx, seen) = mpsc::unbounded_channel();
        {
            let connections = connections.clone();
            let received = received.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    connections.fetch_add(1, Ordering::SeqCst);
                    let _ = tx.send(Seen::Connected);
                    let (tx, received, behavior, tls) =
                        (tx.clone(), received.clone(), behavior.clone(), tls.clone());
                    tokio::spawn(async move {
                        match tls {
                            Some(acceptor) => match acceptor.accept(tcp).await {
                                Ok(s) => serve(s, behavior, received, tx).await,
                                Err(_) => {
                                    let _ = tx.send(Seen::Closed);
                                }
                            },
                            None => serve(tcp, behavior, received, tx).await,
                        }
                    });
                }
            });
        }
        Server {
            port,
            connections,
            received,
            seen,
        }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits for the next thing the server sees (bounded: a hang fails the test).
    pub async fn next(&mut self) -> Seen {
        tokio::time::timeout(std::time::Duration::from_secs(120), self.seen.recv())
            .await
            .expect("the server saw nothing more: the host hangs")
            .expect("server gone")
    }

    pub fn url(&self, scheme: &str, host: &str, path: &str) -> String {
        format!("{scheme}://{host}:{}{path}", self.port)
    }
}

async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    behavior: Behavior,
    received: Arc<Mutex<Vec<Received>>>,
    tx: mpsc::UnboundedSender<Seen>,
) {
    let Some((head, mut body)) = read_head(&mut s).await else {
        let _ = tx.send(Seen::Closed);
        return;
    };
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_string();
    let path = first.next().unwrap_or("").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut chunk = [0u8; 4096];
    loop {
        let done = if chunked {
            dechunk(&body).is_some()
        } else {
            body.len() >= len
        };
        if done {
            break;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    if chunked {
        body = dechunk(&body).unwrap_or_else(|| partial_dechunk(&body));
    }
    let _ = tx.send(Seen::Request(method.clone(), path.clone()));
    received.lock().unwrap().push(Received {
        method,
        path,
        headers: headers.clone(),
        body,
    });
    let respond = |status: u16, ctype: &str, body: &[u8], extra: &str| {
        let mut out = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    };
    match behavior {
        Behavior::Respond {
            status,
            content_type,
            body,
        } => {
            let _ = s.write_all(&respond(status, content_type, &body, "")).await;
        }
        Behavior::Redirect(location) => {
            let extra = format!("location: {location}\r\n");
            let _ = s.write_all(&respond(302, "text/plain", b"", &extra)).await;
        }
        Behavior::EchoHeaders => {
            let obj: serde_json::Map<String, serde_json::Value> = headers
                .into_iter()
                .map(|(n, v)| (n, serde_json::Value::String(v)))
                .collect();
            let body = serde_json::Value::Object(obj).to_string();
            let _ = s
                .write_all(&respond(200, "application/json", body.as_bytes(), ""))
                .await;
        }
        Behavior::Claims(n) => {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n");
            let _ = s.write_all(head.as_bytes()).await;
            // Holds the connection until the client goes.
            let _ = s.read(&mut chunk).await;
        }
        Behavior::Silent => {
            // Until the client goes: a read returns 0 (or fails) when it closes.
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
        Behavior::Endless => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\nconnection: close\r\n\r\n";
            if s.write_all(head.as_bytes()).await.is_ok() {
                let block = vec![b'x'; 8192];
                while s.write_all(&block).await.is_ok() && s.flush().await.is_ok() {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
        }
    }
    let _ = s.shutdown().await;
    let _ = tx.send(Seen::Closed);
}

/// A complete chunked body, decoded; `None` until its last chunk is in.
fn dechunk(raw: &[u8]) -> Option<Vec<u8>> {
    let (out, complete) = chunks(raw);
    complete.then_some(out)
}

/// What arrived of a chunked body that was cut off.
fn partial_dechunk(raw: &[u8]) -> Vec<u8> {
    chunks(raw).0
}

fn chunks(raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let Some(nl) = raw[at..].windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = std::str::from_utf8(&raw[at..at + nl])
            .ok()
            .and_then(|t| usize::from_str_radix(t.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size else {
            return (out, false);
        };
        let start = at + nl + 2;
        if size == 0 {
            return (out, raw.len() >= start + 2);
        }
        let end = (start + size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        if raw.len() < start + size + 2 {
            return (out, false);
        }
        at = start + size + 2;
    }
}
