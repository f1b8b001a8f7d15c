//! Failure signatures: stable categorical codes for failures (`http:429`,
//! `limit:fuel`), so a sticky verdict applies to later failures of the same kind.

use std::sync::LazyLock;

use regex::Regex;

use super::escalation::FailureKind;

/// What a recognizer looks at: the failure class, the message, and the signature the node
/// itself declared (guest errors may carry one).
pub struct ErrorShape<'a> {
    pub kind: &'a FailureKind,
    pub message: &'a str,
    pub declared: Option<&'a str>,
}

/// Recognizes one shape of error and names it with a stable categorical code. Codes
/// never carry values from the message (ids, URLs, counts), or every failure would get
/// its own code and stickiness would never match; and a plain error gets none, since
/// "some error" is not a category.
pub trait Recognizer: Send + Sync {
    fn name(&self) -> &str;
    fn recognize(&self, e: &ErrorShape<'_>) -> Option<String>;
}

/// An ordered list of recognizers; the first that answers wins.
pub struct SignatureRegistry {
    recognizers: Vec<Box<dyn Recognizer>>,
}

impl Default for SignatureRegistry {
    fn default() -> Self {
        SignatureRegistry {
            recognizers: vec![
                Box::new(HostLimit),
                Box::new(Declared),
                Box::new(HttpStatus),
                Box::new(ProviderCode),
                Box::new(ValidationPath),
            ],
        }
    }
}

impl SignatureRegistry {
    pub fn empty() -> Self {
        SignatureRegistry {
            recognizers: Vec::new(),
        }
    }

    pub fn push(&mut self, r: Box<dyn Recognizer>) {
        self.recognizers.push(r);
    }

    pub fn names(&self) -> Vec<&str> {
        self.recognizers.iter().map(|r| r.name()).collect()
    }

    pub fn signature(&self, e: &ErrorShape<'_>) -> Option<String> {
        self.recognizers.iter().find_map(|r| r.recognize(e))
    }
}

/// Host-made failures: the kind is authoritative (a guest cannot claim them).
struct HostLimit;
impl Recognizer for HostLimit {
    fn name(&self) -> &str {
        "host-limit"
    }
    fn recognize(&self, e: &ErrorShape<'_>) -> Option<String> {
        Some(match e.kind {
            FailureKind::FuelExhausted => "limit:fuel".into(),
            FailureKind::Deadline => "limit:deadline".into(),
            FailureKind::MemoryLimit => "limit:memory".into(),
            FailureKind::OutputTooLarge => "limit:output-size".into(),
            FailureKind::Trap { trap } => format!("trap:{}", slug(trap)?),
            FailureKind::Node | FailureKind::Host => return None,
        })
    }
}

/// A signature the node declared, accepted only when it is shaped like a category
/// (`family:code`, short, no spaces) and does not claim a host-only family.
struct Declared;
static DECLARED_RE: LazyLock<Regex> = LazyLock::new(|| {
    // A literal pattern; compiling it cannot fail.
    Regex::new(r"^[a-z][a-z0-9_-]{0,23}:[A-Za-z0-9_.\-/*\[\]$]{1,64}$").expect("static regex")
});
impl Recognizer for Declared {
    fn name(&self) -> &str {
        "declared"
    }
    fn recognize(&self, e: &ErrorShape<'_>) -> Option<String> {
        let d = e.declared?.trim();
        if !DECLARED_RE.is_match(d) || d.starts_with("limit:") || d.starts_with("trap:") {
            return None;
        }
        if let Some(path) = d.strip_prefix("validation:") {
            return Some(format!("validation:{}", normalize_path(path)));
        }
        Some(d.to_string())
    }
}

/// `HTTP 429`, `status code 503`, `HTTP/1.1 502 Bad Gateway`, `"status": 404`.
struct HttpStatus;
static HTTP_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)(?:\bHTTP(?:/\d(?:\.\d)?)?[ :]+|\bstatus(?:[ _]?code)?"?\s*[:=]?\s*)([1-5]\d\d)\b"#,
    )
    .expect("static regex")
});
impl Recognizer for HttpStatus {
    fn name(&self) -> &str {
        "http-status"
    }
    fn recognize(&self, e: &ErrorShape<'_>) -> Option<String> {
        let c = HTTP_RE.captures(e.message)?;
        Some(format!("http:{}", &c[1]))
    }
}

/// Provider error codes as OpenAI-style bodies carry them: `"code": "rate_limit_exceeded"`
/// or `"type": "insufficient_quota"` (identifiers only, never free text).
struct ProviderCode;
static PROVIDER_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#""(?:code|error_code|type)"\s*:\s*"([a-z][a-z0-9_.\-]{2,63})""#)
        .expect("static regex")
});
impl Recognizer for ProviderCode {
    fn name(&self) -> &str {
        "provider-code"
    }
    fn recognize(&self, e: &ErrorShape<'_>) -> Option<String> {
        let c = PROVIDER_RE.captures(e.message)?;
        Some(format!("provider:{}", &c[1]))
    }
}

/// Validation failures that name where they failed: `at /items/3/name`, `at $.a.b`,
/// `path: items[2].id`. Item indices become `*` so every item failing the same way
/// shares one signature.
struct ValidationPath;
static VALIDATION_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)\bvalidation\b[^\n]*?\b(?:at|path)\b[:=]?\s*[`'"]?((?:/|\$|[A-Za-z_])[A-Za-z0-9_./\[\]$*-]*)"#)
        .expect("static regex")
});
impl Recognizer for ValidationPath {
    fn name(&self) -> &str {
        "validation-path"
    }
    fn recognize(&self, e: &ErrorShape<'_>) -> Option<String> {
        let c = VALIDATION_RE.captures(e.message)?;
        let p = normalize_path(c[1].trim_end_matches(['.', '`', '\'', '"']));
        (!p.is_empty() && p.len() <= 64).then(|| format!("validation:{p}"))
    }
}

fn normalize_path(p: &str) -> String {
    static IDX: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(^|/|\[|\.)\d+").expect("static regex"));
    IDX.replace_all(p, "${1}*").into_owned()
}

fn slug(s: &str) -> Option<String> {
    let out: String = s
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let out = out.trim_matches('-').to_string();
    (!out.is_empty() && out.len() <= 48).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(kind: FailureKind, msg: &str, declared: Option<&str>) -> Option<String> {
        SignatureRegistry::default().signature(&ErrorShape {
            kind: &kind,
            message: msg,
            declared,
        })
    }

    #[test]
    fn signatures_from_each_recognizer() {
        assert_eq!(
            sig(FailureKind::FuelExhausted, "x", None).as_deref(),
            Some("limit:fuel")
        );
        assert_eq!(
            sig(FailureKind::Deadline, "x", None).as_deref(),
            Some("limit:deadline")
        );
        assert_eq!(
            sig(FailureKind::MemoryLimit, "x", None).as_deref(),
            Some("limit:memory")
        );
        assert_eq!(
            sig(
                FailureKind::Trap {
                    trap: "unreachable".into()
                },
                "x",
                None
            )
            .as_deref(),
            Some("trap:unreachable")
        );
        assert_eq!(
            sig(
                FailureKind::Node,
                "GET https://x/y failed: HTTP 429 Too Many Requests",
                None
            )
            .as_deref(),
            Some("http:429")
        );
        assert_eq!(
            sig(
                FailureKind::Node,
                "request failed with status code 503",
                None
            )
            .as_deref(),
            Some("http:503")
        );
        assert_eq!(
            sig(FailureKind::Node, r#"provider said {"error":{"code":"rate_limit_exceeded","message":"slow down 12 rpm"}}"#, None).as_deref(),
            Some("provider:rate_limit_exceeded")
        );
        assert_eq!(
            sig(
                FailureKind::Node,
                "schema validation failed at /items/3/name: expected str",
                None
            )
            .as_deref(),
            Some("validation:/items/*/name")
        );
        assert_eq!(
            sig(FailureKind::Node, "x", Some("validation:$.rows[7].id")).as_deref(),
            Some("validation:$.rows[*].id")
        );
        assert_eq!(
            sig(FailureKind::Node, "x", Some("http:404")).as_deref(),
            Some("http:404")
        );
    }

    #[test]
    fn plain_errors_and_forged_codes_get_no_signature() {
        assert_eq!(sig(FailureKind::Node, "something broke", None), None);
        assert_eq!(sig(FailureKind::Host, "container engine down", None), None);
        assert_eq!(sig(FailureKind::Node, "count was 429 items", None), None);
        // A guest cannot claim a host-only family, and free text is not a category.
        assert_eq!(sig(FailureKind::Node, "x", Some("limit:fuel")), None);
        assert_eq!(sig(FailureKind::Node, "x", Some("user 12 not found")), None);
    }
}
