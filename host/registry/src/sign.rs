//! Signatures in cosign's keyed layout, verified offline against the publishers' public
//! keys listed in heddle.toml (`[trust]`).
//!
//! Why this format: it is the one registries, `cosign verify --key` and admission
//! controllers already understand, and it is stored where every registry can keep it,
//! including those without the OCI referrers API (Debian's docker-registry 2.8): a
//! manifest tagged `sha256-<manifest hex>.sig` in the package's repository, one layer
//! per signature, media type `application/vnd.dev.cosign.simplesigning.v1+json`,
//! holding the "simple signing" payload that names the signed manifest digest, with the
//! ECDSA P-256 / SHA-256 signature (ASN.1 DER, base64) in the layer's annotation
//! `dev.cosignproject.cosign/signature`. Keys are plain PEM: PKCS#8 `PRIVATE KEY` for
//! signing, SubjectPublicKeyInfo `PUBLIC KEY` for verifying (the form of a `cosign.pub`).
//! Verification needs no network beyond the registry and no transparency log: trust is
//! exactly the keys the operator listed. The crypto is `ring`'s, already linked for TLS.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _,
    UnparsedPublicKey,
};
use serde::{Deserialize, Serialize};

use crate::artifact::{Descriptor, ImageManifest};
use crate::client::{Client, OCI_MANIFEST, sha256_digest};
use crate::error::RegistryError;

pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const PAYLOAD_TYPE: &str = "cosign container image signature";
/// A simple-signing payload is a few hundred bytes.
const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
/// Signatures looked at per package: enough for any real rotation of keys.
const MAX_SIGNATURES: usize = 32;

/// SubjectPublicKeyInfo DER of a P-256 key, up to the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// `[trust]` in heddle.toml.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustSettings {
    /// Refuse a package unless a signature by one of `keys` covers its manifest.
    pub require_signatures: bool,
    /// Publisher name → public key: a PEM file (relative to heddle.toml) or the PEM text.
    pub keys: BTreeMap<String, String>,
}

/// A P-256 public key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    point: Vec<u8>,
}

impl PublicKey {
    /// Parses a PEM `PUBLIC KEY` (SubjectPublicKeyInfo) of a P-256 key.
    pub fn from_pem(text: &str) -> Result<PublicKey, String> {
        let der = pem_decode(text, "PUBLIC KEY")?;
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(PublicKey {
                point: point.to_vec(),
            }),
            _ => Err(
                "not an ECDSA P-256 public key (cosign's and `heddle package keygen`'s kind)"
                    .into(),
            ),
        }
    }

    pub fn to_pem(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        pem_encode(&der, "PUBLIC KEY")
    }

    /// `sha256:` of the key's DER, cut: how messages name a key.
    pub fn fingerprint(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        sha256_digest(&der)[..23].to_string()
    }

    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(message, signature)
            .is_ok()
    }
}

/// A private key to sign with.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    pub public: PublicKey,
}

impl SigningKey {
    /// Reads a PEM `PRIVATE KEY` (PKCS#8, P-256) file.
    pub fn read(path: &Path) -> Result<SigningKey, RegistryError> {
        let bad = |message: String| RegistryError::Key {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        if text.contains("ENCRYPTED") {
            return Err(bad(
                "an encrypted key; give an unencrypted PKCS#8 P-256 key (`heddle package keygen`, or `openssl pkcs8 -topk8 -nocrypt`)".into(),
            ));
        }
        let der = pem_decode(&text, "PRIVATE KEY").map_err(bad)?;
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der, &SystemRandom::new())
                .map_err(|e| bad(format!("not a PKCS#8 ECDSA P-256 private key ({e})")))?;
        let public = PublicKey {
            point: pair.public_key().as_ref().to_vec(),
        };
        Ok(SigningKey { pair, public })
    }

    /// A new key pair written to files: the private key to `path` (created with mode
    /// 0600; an existing file is never overwritten), the public key to `path.pub`, ready
    /// for `[trust.keys]`. Returns the public key's path and the key.
    pub fn generate_files(path: &Path) -> Result<(PathBuf, PublicKey), RegistryError> {
        use std::io::Write as _;
        let public_path = PathBuf::from(format!("{}.pub", path.display()));
        for p in [path, public_path.as_path()] {
            if p.exists() {
                return Err(RegistryError::Key {
                    path: p.to_path_buf(),
                    message: "exists; not overwriting a key".into(),
                });
            }
        }
        let (private, public) = SigningKey::generate().map_err(|message| RegistryError::Key {
            path: path.to_path_buf(),
            message,
        })?;
        let mut options = std::fs::File::options();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options
            .open(path)
            .and_then(|mut f| {
                f.write_all(private.as_bytes())?;
                f.sync_all()
            })
            .map_err(|e| RegistryError::io(path, e))?;
        std::fs::write(&public_path, public.to_pem())
            .map_err(|e| RegistryError::io(&public_path, e))?;
        Ok((public_path, public))
    }

    /// A new key pair: `(private PEM, public key)`.
    pub fn generate() -> Result<(String, PublicKey), String> {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|_| "the system random source failed".to_string())?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, doc.as_ref(), &rng)
            .map_err(|e| e.to_string())?;
        Ok((
            pem_encode(doc.as_ref(), "PRIVATE KEY"),
            PublicKey {
                point: pair.public_key().as_ref().to_vec(),
            },
        ))
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        self.pair
            .sign(&SystemRandom::new(), message)
            .map(|s| s.as_ref().to_vec())
            .map_err(|_| "signing failed".to_string())
    }
}

/// The keys of `[trust]`, read.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    pub require_signatures: bool,
    pub keys: Vec<(String, PublicKey)>,
}

impl Trust {
    /// Reads the keys of `settings`; relative paths are relative to `base`.
    pub fn load(settings: &TrustSettings, base: &Path) -> Result<Trust, RegistryError> {
        let mut keys = Vec::new();
        for (name, value) in &settings.keys {
            let (text, path) = if value.trim_start().starts_with("-----BEGIN") {
                (value.clone(), PathBuf::from(format!("[trust.keys] {name}")))
            } else {
                let p = base.join(value);
                let t = std::fs::read_to_string(&p).map_err(|e| RegistryError::Key {
                    path: p.clone(),
                    message: format!("[trust.keys] {name}: {e}"),
                })?;
                (t, p)
            };
            let key = PublicKey::from_pem(&text).map_err(|message| RegistryError::Key {
                path,
                message: format!("[trust.keys] {name}: {message}"),
            })?;
            keys.push((name.clone(), key));
        }
        Ok(Trust {
            require_signatures: settings.require_signatures,
            keys,
        })
    }
}

/// The tag cosign stores the signatures of `manifest_digest` under.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

#[derive(Serialize, Deserialize)]
struct Payload {
    critical: Critical,
    #[serde(default)]
    optional: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The simple-signing payload for `manifest_digest` in `registry/repository`.
pub fn payload(docker_reference: &str, manifest_digest: &str) -> Vec<u8> {
    let p = Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: docker_reference.to_string(),
            },
            image: Image {
                docker_manifest_digest: manifest_digest.to_string(),
            },
            kind: PAYLOAD_TYPE.to_string(),
        },
        optional: None,
    };
    // Invariant: plain strings serialize.
    serde_json::to_vec(&p).expect("payload serializes")
}

/// Signs `manifest_digest` in `client`'s repository with `key`, adding a layer to the
/// `.sig` manifest (made when there is none yet).
pub async fn push_signature(
    client: &Client,
    manifest_digest: &str,
    key: &SigningKey,
) -> Result<(), RegistryError> {
    let ep = client.endpoint();
    let tag = signature_tag(manifest_digest);
    let mut layers = match client.manifest(&tag).await {
        Ok((bytes, _)) => serde_json::from_slice::<ImageManifest>(&bytes)
            .map(|m| m.layers)
            .unwrap_or_default(),
        Err(RegistryError::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    let body = payload(
        &format!("{}/{}", ep.registry, ep.repository),
        manifest_digest,
    );
    let signature = key.sign(&body).map_err(|message| RegistryError::Key {
        path: PathBuf::from("(signing key)"),
        message,
    })?;
    let body_digest = sha256_digest(&body);
    client
        .push_blob("the signature payload", &body_digest, body.clone().into())
        .await?;
    layers.retain(|l| {
        l.digest != body_digest
            || l.annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                .is_none()
    });
    layers.push(Descriptor {
        media_type: PAYLOAD_MEDIA_TYPE.into(),
        digest: body_digest,
        size: body.len() as u64,
        annotations: Some(BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_string(),
            base64::engine::general_purpose::STANDARD.encode(signature),
        )])),
    });
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {}
    }))
    .expect("config serializes");
    let config_digest = sha256_digest(&config);
    client
        .push_blob(
            "the signature config",
            &config_digest,
            config.clone().into(),
        )
        .await?;
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        config: Descriptor {
            media_type: CONFIG_MEDIA_TYPE.into(),
            digest: config_digest,
            size: config.len() as u64,
            annotations: None,
        },
        layers,
        annotations: None,
    };
    let bytes = serde_json::to_vec(&manifest).expect("manifest serializes");
    client.push_manifest(&tag, OCI_MANIFEST, bytes).await?;
    Ok(())
}

/// Checks the signatures of `manifest_digest` against `trust`: the name of the trusted
/// publisher whose signature covers it, `None` when unsigned (or signed by no trusted
/// key) and signatures are not required. A trusted signature over another digest is
/// always refused: it was copied onto these bytes.
pub async fn verify(
    client: &Client,
    manifest_digest: &str,
    trust: &Trust,
) -> Result<Option<String>, RegistryError> {
    let reference = client.endpoint().reference.clone();
    let tag = signature_tag(manifest_digest);
    let layers = match client.manifest(&tag).await {
        Ok((bytes, _)) => {
            serde_json::from_slice::<ImageManifest>(&bytes)
                .map_err(|e| RegistryError::BadSignature {
                    reference: reference.clone(),
                    message: format!("the signature manifest {tag} is malformed ({e})"),
                })?
                .layers
        }
        Err(RegistryError::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    let signed: Vec<&Descriptor> = layers
        .iter()
        .filter(|l| l.media_type == PAYLOAD_MEDIA_TYPE)
        .take(MAX_SIGNATURES)
        .collect();
    let mut other_digest = None;
    for layer in &signed {
        let Some(sig) = layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            .and_then(|s| {
                base64::engine::general_purpose::STANDARD
                    .decode(s.trim())
                    .ok()
            })
        else {
            continue;
        };
        if !crate::reference::valid_digest(&layer.digest) {
            continue;
        }
        let body = client
            .blob("signature payload", &layer.digest, MAX_PAYLOAD_BYTES)
            .await?;
        let Some((name, _)) = trust.keys.iter().find(|(_, k)| k.verifies(&body, &sig)) else {
            continue;
        };
        let p: Payload =
            serde_json::from_slice(&body).map_err(|e| RegistryError::BadSignature {
                reference: reference.clone(),
                message: format!(
                    "a payload signed by `{name}` is not a simple-signing payload ({e})"
                ),
            })?;
        if p.critical.kind != PAYLOAD_TYPE {
            continue;
        }
        if p.critical.image.docker_manifest_digest == manifest_digest {
            return Ok(Some(name.clone()));
        }
        other_digest = Some((name.clone(), p.critical.image.docker_manifest_digest));
    }
    if let Some((signer, signed_digest)) = other_digest {
        return Err(RegistryError::SignedOther {
            reference,
            signer,
            signed: signed_digest,
            actual: manifest_digest.to_string(),
        });
    }
    if !trust.require_signatures {
        if !signed.is_empty() {
            tracing::warn!("{reference}: signed, but by no key in [trust]; installed as unsigned");
        }
        return Ok(None);
    }
    Err(if signed.is_empty() {
        RegistryError::Unsigned { reference }
    } else {
        RegistryError::UntrustedSigner {
            reference,
            found: signed.len(),
            trusted: trust
                .keys
                .iter()
                .map(|(n, k)| format!("{n} ({})", k.fingerprint()))
                .collect::<Vec<_>>()
                .join(", "),
        }
    })
}

fn pem_encode(der: &[u8], label: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn pem_decode(text: &str, label: &str) -> Result<Vec<u8>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text
        .find(&begin)
        .ok_or_else(|| format!("no `{begin}` block"))?
        + begin.len();
    let stop = text[start..]
        .find(&end)
        .ok_or_else(|| format!("no `{end}` line"))?;
    let body: String = text[start..start + stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| format!("the PEM body is not base64 ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_signs_what_its_public_key_verifies_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = SigningKey::generate().unwrap();
        let path = dir.path().join("k.pem");
        std::fs::write(&path, private).unwrap();
        let key = SigningKey::read(&path).unwrap();
        assert_eq!(key.public, public);
        assert_eq!(PublicKey::from_pem(&public.to_pem()).unwrap(), public);
        let body = payload("r/x", &format!("sha256:{}", "a".repeat(64)));
        let sig = key.sign(&body).unwrap();
        assert!(public.verifies(&body, &sig));
        assert!(!public.verifies(b"other", &sig));
        let (_, stranger) = SigningKey::generate().unwrap();
        assert!(!stranger.verifies(&body, &sig));
        assert_eq!(
            signature_tag(&format!("sha256:{}", "b".repeat(64))),
            format!("sha256-{}.sig", "b".repeat(64))
        );
    }
}
