//! What `heddle package add` and `push` accept besides a directory:
//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, and wkg's `namespace:name@version`
//! (resolved to an OCI location by [`crate::resolve`]).

use crate::error::RegistryError;

/// The scheme that marks a reference as an OCI location.
pub const OCI_SCHEME: &str = "oci://";

/// A package location in an OCI registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciRef {
    /// `host[:port]`.
    pub registry: String,
    /// `namespace/name` (any number of path components).
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`: the manifest digest; wins over the tag when both are given.
    pub digest: Option<String>,
}

impl OciRef {
    /// What the manifest is fetched by: the digest when there is one, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The same repository at `digest` (how a lockfile pin is fetched again).
    pub fn at_digest(&self, digest: &str) -> OciRef {
        OciRef {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// Whether this names the moving tag `latest` (explicitly, or by giving no tag and
    /// no digest).
    pub fn is_latest(&self) -> bool {
        self.digest.is_none() && self.tag.as_deref().is_none_or(|t| t == "latest")
    }
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{OCI_SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A reference as typed: an OCI location or a wkg package spec.
#[derive(Clone, Debug)]
pub enum PackageRef {
    Oci(OciRef),
    /// `namespace:name@version` (version optional: then the newest semver tag, only with
    /// `--allow-latest`).
    Wkg(wasm_pkg_common::package::PackageSpec),
}

impl PackageRef {
    /// Parses `text`. `None` when it is neither form (the caller treats it as a path).
    pub fn parse(text: &str) -> Option<Result<PackageRef, RegistryError>> {
        if let Some(rest) = text.strip_prefix(OCI_SCHEME) {
            return Some(parse_oci(rest).map(PackageRef::Oci).map_err(|message| {
                RegistryError::BadReference {
                    text: text.to_string(),
                    message,
                }
            }));
        }
        // `ns:name` with kebab-case labels, optionally `@version`; a path such as
        // `./dist` or `C:\x` never parses as one.
        if text.contains(':') && !text.contains('/') && !text.contains('\\') {
            return Some(
                text.parse::<wasm_pkg_common::package::PackageSpec>()
                    .map(PackageRef::Wkg)
                    .map_err(|e| RegistryError::BadReference {
                        text: text.to_string(),
                        message: format!(
                            "{e} (a wkg package is `namespace:name@version`, lowercase kebab-case names and a semver version)"
                        ),
                    }),
            );
        }
        None
    }
}

fn parse_oci(rest: &str) -> Result<OciRef, String> {
    let (registry, path) = rest
        .split_once('/')
        .ok_or("expected oci://REGISTRY/NAMESPACE/NAME:VERSION")?;
    if !valid_registry(registry) {
        return Err(format!(
            "`{registry}` is not a registry host (host or host:port)"
        ));
    }
    let (path, digest) = match path.split_once('@') {
        Some((p, d)) => (p, Some(d)),
        None => (path, None),
    };
    if let Some(d) = digest
        && !valid_digest(d)
    {
        return Err(format!(
            "`{d}` is not a manifest digest (sha256: and 64 lowercase hex digits)"
        ));
    }
    let (repository, tag) = match path.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (path, None),
    };
    if !valid_repository(repository) {
        return Err(format!(
            "`{repository}` is not a repository name (lowercase path components of letters, digits and . _ -)"
        ));
    }
    if let Some(t) = tag
        && !valid_tag(t)
    {
        return Err(format!(
            "`{t}` is not a tag (letters, digits, . _ -, at most 128)"
        ));
    }
    Ok(OciRef {
        registry: registry.to_string(),
        repository: repository.to_string(),
        tag: tag.map(str::to_string),
        digest: digest.map(str::to_string),
    })
}

fn valid_registry(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        && port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.parse::<u16>().is_ok())
}

/// OCI distribution-spec repository names: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
/// components joined by `/`.
pub(crate) fn valid_repository(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.split('/').all(|c| {
            let b = c.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && c.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
                && !c.contains("..")
                && !c.contains("___")
        })
}

/// `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub(crate) fn valid_tag(s: &str) -> bool {
    let mut it = s.chars();
    it.next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 128
        && it.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// `sha256:` and 64 lowercase hex digits (the only algorithm Heddle pins with).
pub fn valid_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oci(s: &str) -> OciRef {
        match PackageRef::parse(s).unwrap().unwrap() {
            PackageRef::Oci(o) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oci_references_parse_into_their_parts() {
        let r = oci("oci://127.0.0.1:5000/acme/textkit:0.1.0");
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "acme/textkit");
        assert_eq!(r.tag.as_deref(), Some("0.1.0"));
        assert!(!r.is_latest());
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/acme/textkit:0.1.0");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = oci(&format!("oci://ghcr.io/a/b/c@{d}"));
        assert_eq!(r.repository, "a/b/c");
        assert_eq!(r.manifest_reference(), d);
        assert!(oci("oci://ghcr.io/a/b").is_latest());
        assert!(oci("oci://ghcr.io/a/b:latest").is_latest());
    }

    #[test]
    fn malformed_references_are_refused_naming_the_part() {
        for (bad, part) in [
            ("oci://ghcr.io", "expected oci://"),
            ("oci://gh cr.io/a:1", "registry host"),
            ("oci://ghcr.io/A/b:1", "repository"),
            ("oci://ghcr.io/a/b:1@sha256:12", "manifest digest"),
            ("oci://ghcr.io/a/b:-x", "tag"),
            ("acme:Text@1.0.0", "namespace:name@version"),
            ("acme:text@one", "namespace:name@version"),
        ] {
            let e = PackageRef::parse(bad).unwrap().unwrap_err().to_string();
            assert!(e.contains(part) && e.contains(bad), "{bad}: {e}");
        }
        assert!(PackageRef::parse("./dist").is_none());
        assert!(PackageRef::parse("my-nodes/dist").is_none());
    }

    #[test]
    fn wkg_specs_parse() {
        match PackageRef::parse("acme:text-kit@1.2.0").unwrap().unwrap() {
            PackageRef::Wkg(s) => {
                assert_eq!(s.package.to_string(), "acme:text-kit");
                assert_eq!(s.version.unwrap().to_string(), "1.2.0");
            }
            other => panic!("{other:?}"),
        }
    }
}
