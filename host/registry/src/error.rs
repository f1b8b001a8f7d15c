//! Errors of fetching and publishing packages. Every variant names the reference as the
//! user typed it (or the registry), so a message can be acted on without reading code;
//! [`RegistryError::class`] sorts them into the three answers a script branches on.

use heddle_wasm::PackageError;

/// What kind of failure an error is, for the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request was wrong: a malformed reference, `:latest` without
    /// `--allow-latest`, an artifact that is not a Heddle package, a plain-HTTP registry
    /// not listed as insecure, a namespace no registry serves.
    BadRequest,
    /// The registry could not be used: unreachable, too slow, credentials refused, the
    /// package not there, or an answer that is not the distribution protocol.
    Registry,
    /// The bytes are not what they claim to be, or not from whom they must be: a digest
    /// that does not match, a signature missing, untrusted or over other bytes.
    Integrity,
    /// Something of this machine failed (the package store's disk, the engine).
    Local,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("`{text}` is not a package reference: {message}")]
    BadReference { text: String, message: String },
    #[error(
        "{reference}: refusing the tag `latest` (it names whatever was pushed last, so the lockfile could not say what was reviewed); give a version, or pass --allow-latest"
    )]
    Latest { reference: String },
    #[error(
        "{reference}: registry {registry} would be reached over plain HTTP, which heddle.toml does not allow; list it under [registry] insecure = [\"{registry}\"] if it is a test or private registry you trust"
    )]
    Insecure { reference: String, registry: String },
    #[error("{reference}: no registry is configured for the namespace `{namespace}` ({hint})")]
    UnknownNamespace {
        reference: String,
        namespace: String,
        hint: String,
    },
    #[error("{reference}: wkg configuration: {message}")]
    WkgConfig { reference: String, message: String },
    #[error("{reference}: registry {registry} cannot be reached: {message}")]
    Unreachable {
        reference: String,
        registry: String,
        message: String,
    },
    #[error(
        "{reference}: registry {registry} did not answer within {limit_ms} ms ([registry] timeout_ms); nothing was installed"
    )]
    Timeout {
        reference: String,
        registry: String,
        limit_ms: u64,
    },
    #[error("{reference}: registry {registry} refused the credentials ({message})")]
    CredentialsRefused {
        reference: String,
        registry: String,
        message: String,
    },
    #[error(
        "{reference}: registry {registry} requires credentials and none are configured (wkg's config.toml [registry.\"{registry}\".oci] auth, WKG_REGISTRY_<REGISTRY>_AUTH_BEARER, or `docker login {registry}`)"
    )]
    CredentialsRequired { reference: String, registry: String },
    #[error("{reference}: docker's credentials for registry {registry}: {message}")]
    DockerCredentials {
        reference: String,
        registry: String,
        message: String,
    },
    #[error("{reference}: not found in registry {registry} ({what})")]
    NotFound {
        reference: String,
        registry: String,
        what: String,
    },
    #[error(
        "{reference}: registry {registry} answered {what} with something that is not the OCI distribution protocol: {message}"
    )]
    Protocol {
        reference: String,
        registry: String,
        what: String,
        message: String,
    },
    #[error("{reference}: the {what} is larger than {limit} bytes{hint}")]
    TooLarge {
        reference: String,
        what: String,
        limit: u64,
        hint: &'static str,
    },
    #[error(
        "{reference}: the {what} does not match its digest (expected {expected}, got {actual}); it was changed after it was published or in transit, and nothing was installed"
    )]
    DigestMismatch {
        reference: String,
        what: String,
        expected: String,
        actual: String,
    },
    #[error(
        "{reference}: unsigned, and heddle.toml has [trust] require_signatures = true; nothing was installed"
    )]
    Unsigned { reference: String },
    #[error(
        "{reference}: {found} signature(s), but none by a key in [trust] (trusted: {trusted}); nothing was installed"
    )]
    UntrustedSigner {
        reference: String,
        found: usize,
        trusted: String,
    },
    #[error(
        "{reference}: the signature by `{signer}` covers manifest {signed}, not this one ({actual}): it belongs to other bytes; nothing was installed"
    )]
    SignedOther {
        reference: String,
        signer: String,
        signed: String,
        actual: String,
    },
    #[error("{reference}: {message}")]
    BadSignature { reference: String, message: String },
    #[error("{path}: {message}")]
    Key {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{reference}: not a Wasm component package: {message}")]
    NotWasm { reference: String, message: String },
    #[error("{reference}: {source}")]
    Package {
        reference: String,
        #[source]
        source: Box<PackageError>,
    },
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl RegistryError {
    /// The kind of failure, for the exit code.
    pub fn class(&self) -> ErrorClass {
        use RegistryError as R;
        match self {
            R::BadReference { .. }
            | R::Latest { .. }
            | R::Insecure { .. }
            | R::UnknownNamespace { .. }
            | R::WkgConfig { .. }
            | R::DockerCredentials { .. }
            | R::TooLarge { .. }
            | R::NotWasm { .. }
            | R::Key { .. } => ErrorClass::BadRequest,
            R::Unreachable { .. }
            | R::Timeout { .. }
            | R::CredentialsRefused { .. }
            | R::CredentialsRequired { .. }
            | R::NotFound { .. }
            | R::Protocol { .. } => ErrorClass::Registry,
            R::DigestMismatch { .. }
            | R::Unsigned { .. }
            | R::UntrustedSigner { .. }
            | R::SignedOther { .. }
            | R::BadSignature { .. } => ErrorClass::Integrity,
            R::Package { source, .. } => {
                if source.is_bad_request() {
                    ErrorClass::BadRequest
                } else {
                    ErrorClass::Local
                }
            }
            R::Io { .. } => ErrorClass::Local,
        }
    }

    pub(crate) fn io(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        RegistryError::Io {
            path: path.into(),
            source,
        }
    }
}
