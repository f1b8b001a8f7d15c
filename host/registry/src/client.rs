//! A small OCI distribution client: exactly the calls a package needs (manifests,
//! blobs, uploads, tags), each answer read with a bound and the whole operation under
//! one deadline, so a registry that answers slowly, endlessly or with garbage is named
//! and refused instead of hanging `package add` or filling memory.
//!
//! Authentication follows the distribution spec's challenges: a `401` with
//! `WWW-Authenticate: Bearer realm=…,service=…,scope=…` is answered by fetching a token
//! from the realm (with the configured credentials, or anonymously), `Basic` by sending
//! the configured credentials; a second `401` means the credentials were refused.

use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, LOCATION, WWW_AUTHENTICATE};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use crate::error::RegistryError;

/// What an OCI manifest may be at most: the distribution spec asks registries to accept
/// manifests of at least 4 MiB, and a Wasm artifact's manifest is well under 2 KiB.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// A config blob, a token answer, an error body: small JSON documents.
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;
/// How much of an error body is shown.
const ERROR_BODY_SHOWN: usize = 300;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Credentials for a registry, as wkg's configuration gives them.
#[derive(Clone, Default)]
pub enum Credentials {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
    Bearer(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::Anonymous => "Anonymous",
            Credentials::Basic { .. } => "Basic(<hidden>)",
            Credentials::Bearer(_) => "Bearer(<hidden>)",
        })
    }
}

/// Where and how to reach one repository.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `host[:port]`.
    pub registry: String,
    pub repository: String,
    /// Plain HTTP (only for registries listed insecure in heddle.toml).
    pub insecure: bool,
    pub credentials: Credentials,
    /// The reference as the user typed it, named in every error.
    pub reference: String,
}

pub struct Client {
    http: reqwest::Client,
    ep: Endpoint,
    base: String,
    auth: Mutex<Option<String>>,
    push: bool,
    deadline: Instant,
    limit_ms: u64,
}

/// A blob fetched into a file: its digest was checked while it streamed.
pub struct FetchedBlob {
    pub size: u64,
}

impl Client {
    /// A client for `ep` whose every call must be done within `timeout` of now. `push`
    /// asks for push rights when a token is needed.
    pub fn new(ep: Endpoint, timeout: Duration, push: bool) -> Result<Client, RegistryError> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(30)))
            .user_agent(concat!("heddle/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| RegistryError::Unreachable {
                reference: ep.reference.clone(),
                registry: ep.registry.clone(),
                message: format!("cannot start an HTTP client: {e}"),
            })?;
        let scheme = if ep.insecure { "http" } else { "https" };
        Ok(Client {
            base: format!("{scheme}://{}", ep.registry),
            http,
            ep,
            auth: Mutex::new(None),
            push,
            deadline: Instant::now() + timeout,
            limit_ms: timeout.as_millis() as u64,
        })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/v2/{}/{tail}", self.base, self.ep.repository)
    }

    /// Awaits `f` within the operation's deadline.
    async fn timed<T>(&self, f: impl Future<Output = T>) -> Result<T, RegistryError> {
        tokio::time::timeout_at(self.deadline, f)
            .await
            .map_err(|_| self.timeout())
    }

    fn timeout(&self) -> RegistryError {
        RegistryError::Timeout {
            reference: self.ep.reference.clone(),
            registry: self.ep.registry.clone(),
            limit_ms: self.limit_ms,
        }
    }

    fn protocol(&self, what: &str, message: impl Into<String>) -> RegistryError {
        RegistryError::Protocol {
            reference: self.ep.reference.clone(),
            registry: self.ep.registry.clone(),
            what: what.to_string(),
            message: message.into(),
        }
    }

    fn transport(&self, e: reqwest::Error) -> RegistryError {
        if e.is_timeout() {
            return self.timeout();
        }
        if !e.is_connect() {
            // The connection was made: what came back was not HTTP a client can read.
            return self.protocol("a request", heddle_core::text::error_chain(&e));
        }
        RegistryError::Unreachable {
            reference: self.ep.reference.clone(),
            registry: self.ep.registry.clone(),
            message: heddle_core::text::error_chain(&e),
        }
    }

    /// Sends a request built by `build`, answering one authentication challenge.
    async fn send(
        &self,
        what: &str,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, RegistryError> {
        let mut answered = false;
        loop {
            let mut req = build(&self.http);
            if let Some(h) = self.auth.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                req = req.header(AUTHORIZATION, h);
            }
            let resp = self
                .timed(req.send())
                .await?
                .map_err(|e| self.transport(e))?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                return Ok(resp);
            }
            let challenge = resp
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if answered {
                return Err(self.refused(what, "the retried request was refused"));
            }
            answered = true;
            let header = self.answer(what, challenge.as_deref()).await?;
            *self.auth.lock().unwrap_or_else(|e| e.into_inner()) = Some(header);
        }
    }

    fn refused(&self, what: &str, message: &str) -> RegistryError {
        match self.ep.credentials {
            Credentials::Anonymous => RegistryError::CredentialsRequired {
                reference: self.ep.reference.clone(),
                registry: self.ep.registry.clone(),
            },
            _ => RegistryError::CredentialsRefused {
                reference: self.ep.reference.clone(),
                registry: self.ep.registry.clone(),
                message: format!("{what}: {message}"),
            },
        }
    }

    /// The `Authorization` header that answers `challenge`.
    async fn answer(&self, what: &str, challenge: Option<&str>) -> Result<String, RegistryError> {
        let Some((scheme, params)) = challenge.and_then(parse_challenge) else {
            return Err(self.refused(what, "401 without a usable WWW-Authenticate challenge"));
        };
        if scheme.eq_ignore_ascii_case("basic") {
            return match &self.ep.credentials {
                Credentials::Basic { username, password } => Ok(basic(username, password)),
                Credentials::Bearer(t) => Ok(format!("Bearer {t}")),
                Credentials::Anonymous => Err(self.refused(what, "basic authentication")),
            };
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(self.protocol(what, format!("unknown authentication scheme `{scheme}`")));
        }
        if let Credentials::Bearer(t) = &self.ep.credentials {
            return Ok(format!("Bearer {t}"));
        }
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| self.protocol(what, "a Bearer challenge without a realm"))?;
        if !(realm.starts_with("https://") || (self.ep.insecure && realm.starts_with("http://"))) {
            return Err(self.protocol(
                what,
                format!("token realm `{}` is not an https URL", clip(&realm)),
            ));
        }
        let actions = if self.push { "pull,push" } else { "pull" };
        let scope = params
            .iter()
            .find(|(k, _)| k == "scope")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| format!("repository:{}:{actions}", self.ep.repository));
        let mut query = vec![("scope", scope)];
        if let Some((_, s)) = params.iter().find(|(k, _)| k == "service") {
            query.push(("service", s.clone()));
        }
        let mut req = self.http.get(&realm).query(&query);
        if let Credentials::Basic { username, password } = &self.ep.credentials {
            req = req.header(AUTHORIZATION, basic(username, password));
        }
        let resp = self
            .timed(req.send())
            .await?
            .map_err(|e| self.transport(e))?;
        match resp.status() {
            s if s.is_success() => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(self.refused(
                    what,
                    &format!("the token service answered {}", resp.status()),
                ));
            }
            s => return Err(self.protocol(what, format!("the token service answered {s}"))),
        }
        let body = self.read(resp, "token answer", MAX_DOCUMENT_BYTES).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| self.protocol(what, format!("token answer is not JSON: {e}")))?;
        let token = t
            .token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| self.protocol(what, "token answer holds no token"))?;
        Ok(format!("Bearer {token}"))
    }

    /// Reads a whole body, refusing more than `limit` bytes (counted as they arrive, not
    /// trusted from a header).
    async fn read(
        &self,
        mut resp: Response,
        what: &str,
        limit: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        if resp.content_length().is_some_and(|n| n > limit) {
            return Err(self.too_large(what, limit));
        }
        let mut out = Vec::new();
        while let Some(chunk) = self
            .timed(resp.chunk())
            .await?
            .map_err(|e| self.transport(e))?
        {
            if out.len() as u64 + chunk.len() as u64 > limit {
                return Err(self.too_large(what, limit));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn too_large(&self, what: &str, limit: u64) -> RegistryError {
        RegistryError::TooLarge {
            reference: self.ep.reference.clone(),
            what: what.to_string(),
            limit,
            hint: "",
        }
    }

    /// The error for an unexpected status, with the registry's own words (escaped, cut).
    async fn status_error(&self, what: &str, resp: Response) -> RegistryError {
        let status = resp.status();
        let body = self
            .read(resp, "error answer", MAX_DOCUMENT_BYTES)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let shown = clip(&body);
        match status {
            StatusCode::NOT_FOUND => RegistryError::NotFound {
                reference: self.ep.reference.clone(),
                registry: self.ep.registry.clone(),
                what: format!("{what}: {status} {shown}"),
            },
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                self.refused(what, &format!("{status} {shown}"))
            }
            _ => self.protocol(what, format!("{status} {shown}")),
        }
    }

    /// Fetches the manifest `reference` (a tag or a digest): its bytes, bounded, and
    /// their digest. A digest the registry states must be the digest of the bytes.
    pub async fn manifest(&self, reference: &str) -> Result<(Vec<u8>, String), RegistryError> {
        let what = "the manifest";
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self
            .send(what, |c| {
                c.get(&url).header(
                    ACCEPT,
                    format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}, {OCI_INDEX}, {DOCKER_LIST}"),
                )
            })
            .await?;
        if !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        let stated = header_digest(resp.headers());
        let bytes = self.read(resp, "manifest", MAX_MANIFEST_BYTES).await?;
        let digest = sha256_digest(&bytes);
        if let Some(s) = stated
            && s.starts_with("sha256:")
            && s != digest
        {
            return Err(RegistryError::DigestMismatch {
                reference: self.ep.reference.clone(),
                what: "manifest".into(),
                expected: s,
                actual: digest,
            });
        }
        Ok((bytes, digest))
    }

    /// Fetches a small blob (a config) whole, checking its digest.
    pub async fn blob(
        &self,
        what: &str,
        digest: &str,
        limit: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self.send(what, |c| c.get(&url)).await?;
        if !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        let bytes = self.read(resp, what, limit).await?;
        let actual = sha256_digest(&bytes);
        if actual != digest {
            return Err(RegistryError::DigestMismatch {
                reference: self.ep.reference.clone(),
                what: what.to_string(),
                expected: digest.to_string(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Streams a blob into a new file at `path`, hashing as it goes: more than `size`
    /// bytes, fewer, or other bytes than `digest` names are refused (the file is left
    /// for the caller to remove with its staging directory).
    pub async fn blob_to_file(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        path: &Path,
    ) -> Result<FetchedBlob, RegistryError> {
        let url = self.url(&format!("blobs/{digest}"));
        let mut resp = self.send(what, |c| c.get(&url)).await?;
        if !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        let mut file = std::fs::File::create_new(path).map_err(|e| RegistryError::io(path, e))?;
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        while let Some(chunk) = self
            .timed(resp.chunk())
            .await?
            .map_err(|e| self.transport(e))?
        {
            got += chunk.len() as u64;
            if got > size {
                return Err(self.protocol(
                    what,
                    format!("more bytes than the {size} its descriptor states"),
                ));
            }
            hasher.update(&chunk);
            file.write_all(&chunk)
                .map_err(|e| RegistryError::io(path, e))?;
        }
        let actual = format!("sha256:{:x}", hasher.finalize());
        if actual != digest {
            return Err(RegistryError::DigestMismatch {
                reference: self.ep.reference.clone(),
                what: what.to_string(),
                expected: digest.to_string(),
                actual,
            });
        }
        if got != size {
            return Err(self.protocol(
                what,
                format!("{got} bytes, but its descriptor states {size}"),
            ));
        }
        file.sync_all().map_err(|e| RegistryError::io(path, e))?;
        Ok(FetchedBlob { size: got })
    }

    /// The repository's tags.
    pub async fn tags(&self) -> Result<Vec<String>, RegistryError> {
        let what = "the tag list";
        let url = self.url("tags/list");
        let resp = self.send(what, |c| c.get(&url)).await?;
        if !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        let body = self.read(resp, what, MAX_DOCUMENT_BYTES).await?;
        #[derive(serde::Deserialize)]
        struct Tags {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let t: Tags = serde_json::from_slice(&body)
            .map_err(|e| self.protocol(what, format!("not a tag list: {e}")))?;
        Ok(t.tags.unwrap_or_default())
    }

    /// Uploads `bytes` as the blob `digest` unless the registry has it already
    /// (monolithic upload: POST for a location, PUT with the digest).
    pub async fn push_blob(
        &self,
        what: &str,
        digest: &str,
        bytes: bytes::Bytes,
    ) -> Result<(), RegistryError> {
        let head = self.url(&format!("blobs/{digest}"));
        let resp = self.send(what, |c| c.head(&head)).await?;
        if resp.status().is_success() {
            return Ok(());
        }
        let start = self.url("blobs/uploads/");
        let resp = self.send(what, |c| c.post(&start)).await?;
        if resp.status() != StatusCode::ACCEPTED && !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| self.protocol(what, "upload answer without a Location"))?;
        let base = reqwest::Url::parse(&start).map_err(|e| self.protocol(what, e.to_string()))?;
        let mut url = base
            .join(location)
            .map_err(|e| self.protocol(what, format!("bad upload Location: {e}")))?;
        url.query_pairs_mut().append_pair("digest", digest);
        let resp = self
            .send(what, |c| {
                c.request(Method::PUT, url.clone())
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .body(bytes.clone())
            })
            .await?;
        if !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        Ok(())
    }

    /// Puts a manifest under `reference` (a tag); returns its digest.
    pub async fn push_manifest(
        &self,
        reference: &str,
        media_type: &str,
        bytes: Vec<u8>,
    ) -> Result<String, RegistryError> {
        let what = "the manifest";
        let digest = sha256_digest(&bytes);
        let url = self.url(&format!("manifests/{reference}"));
        let body = bytes::Bytes::from(bytes);
        let resp = self
            .send(what, |c| {
                c.put(&url)
                    .header(CONTENT_TYPE, media_type)
                    .body(body.clone())
            })
            .await?;
        if !resp.status().is_success() {
            return Err(self.status_error(what, resp).await);
        }
        if let Some(stated) = header_digest(resp.headers())
            && stated != digest
        {
            return Err(self.protocol(
                what,
                format!("it stored the manifest as {stated}, but its bytes are {digest}"),
            ));
        }
        Ok(digest)
    }
}

fn header_digest(h: &HeaderMap) -> Option<String> {
    h.get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

fn basic(user: &str, pass: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Registry text shown in a message: escaped and cut.
fn clip(s: &str) -> String {
    let escaped: String = s.trim().escape_debug().collect();
    if escaped.len() > ERROR_BODY_SHOWN {
        let mut end = ERROR_BODY_SHOWN;
        while !escaped.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &escaped[..end])
    } else {
        escaped
    }
}

/// `Scheme k="v", k2=v2` → the scheme and its parameters.
fn parse_challenge(h: &str) -> Option<(String, Vec<(String, String)>)> {
    let h = h.trim();
    let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = Vec::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (key, after) = s.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &q[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.push((key, value));
        s = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some((scheme.to_string(), params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(s, "Bearer");
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[2], ("scope".into(), "repository:a/b:pull".into()));
        let (s, p) = parse_challenge(r#"Basic realm="x, y""#).unwrap();
        assert_eq!((s.as_str(), p[0].1.as_str()), ("Basic", "x, y"));
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
    }
}
