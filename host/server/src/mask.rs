//! Secrets out of everything the server sends. A run's records hold what its nodes
//! produced (an input node's value, an error quoting its input), so a secret that
//! reached a node can be in a record; every JSON body and every event the API sends is
//! masked against the operator's secret values before it leaves, whatever route made it.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use heddle_core::supervise::{RedactLimits, Redactor};
use std::sync::Arc;

/// The secret values of every run this server drives (`[secrets]`, the secrets granted
/// to packages, `HEDDLE_SECRET_*`), as the runs themselves register them.
pub struct Mask {
    redactor: Redactor,
    /// Each secret as it reads inside a JSON string (escaped as serde_json escapes it).
    in_json: Vec<String>,
}

impl Mask {
    /// Masks every one of `secrets` (empty ones are ignored).
    pub fn new(secrets: Vec<String>) -> Mask {
        let in_json = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let quoted = serde_json::Value::from(s.as_str()).to_string();
                quoted[1..quoted.len() - 1].to_string()
            })
            .collect();
        Mask {
            redactor: Redactor::new(secrets, RedactLimits::default()),
            in_json,
        }
    }

    /// Masks every string (and object key) in `v`, in place. Structural rather than on
    /// the serialized text: a secret with a quote or a backslash in it is escaped there.
    /// The same masking the store applies to the text of every record it writes.
    pub fn json(&self, v: &mut serde_json::Value) {
        heddle_store::secrets::mask_json(&self.redactor, v);
    }

    /// `s` with every secret replaced by `«redacted»`.
    pub fn text(&self, s: &str) -> String {
        self.redactor.mask(s)
    }

    /// `value` serialized with its secrets masked: serialized directly when its text
    /// holds no secret (the common case, and what a busy run's event feed renders for
    /// every record: no JSON tree built, no string copied to be checked), else masked
    /// structurally. The text tells: JSON escapes each character on its own, so a
    /// string holding a secret reads in the text as holding the escaped secret.
    pub fn to_string<T: serde::Serialize>(&self, value: &T) -> String {
        match serde_json::to_string(value) {
            Ok(text) if !self.in_json.iter().any(|s| text.contains(s.as_str())) => text,
            _ => self.to_value(value).to_string(),
        }
    }

    /// `value` as JSON with its secrets masked.
    pub fn to_value<T: serde::Serialize>(&self, value: &T) -> serde_json::Value {
        let mut v = serde_json::to_value(value).unwrap_or_default();
        self.json(&mut v);
        v
    }
}

/// Largest JSON body [`responses`] reads whole to mask, unless the router is built with
/// another ([`crate::api::router_bounded`]). Far above any answer of the API: a run's
/// shown object holds references to its large values, not the values.
pub const MAX_MASKED_BODY: usize = 64 << 20;

/// What [`responses`] masks with, and the largest body it reads whole to do it.
#[derive(Clone)]
pub struct Masking {
    /// The secrets.
    pub mask: Arc<Mask>,
    /// Bodies longer are not sent (500, a JSON error saying so).
    pub max_body: usize,
}

/// Masks every JSON response body of the API (answers and refusals alike). A body it
/// cannot read whole (longer than its bound, or failing) is not sent, not even in
/// part: the answer becomes a 500 with a JSON error, never a 200 with nothing in it.
pub async fn responses(State(m): State<Masking>, req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = next.run(req).await;
    if !crate::api::is_json(&resp) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, m.max_body).await else {
        tracing::error!(
            "{method} {path}: the answer could not be read whole (over {} bytes, or its body failed); it was not sent",
            m.max_body
        );
        return crate::api::state::ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "{method} {path}: the answer is over the {} bytes the server reads whole to mask secrets out of it (or could not be read); nothing of it was sent",
                m.max_body
            ),
        )
        .into_response();
    };
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    m.mask.json(&mut v);
    let out = v.to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_in_strings_and_keys_even_when_json_would_escape_them() {
        let m = Mask::new(vec!["s3cr\"et".into(), "plain-key".into()]);
        let mut v = serde_json::json!({
            "error": "upstream said s3cr\"et",
            "plain-key": [1, "a plain-key b", {"x": "s3cr\"et"}],
        });
        m.json(&mut v);
        let text = v.to_string();
        assert!(!text.contains("s3cr"), "{text}");
        assert!(!text.contains("plain-key"), "{text}");
        assert_eq!(v["error"], "upstream said «redacted»");
        assert_eq!(v["«redacted»"][1], "a «redacted» b");
    }
}
