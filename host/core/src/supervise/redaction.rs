//! Redaction: every string and value that leaves the actor in an escalation or a tool
//! result has known secrets masked, sensitive fields dropped and sizes capped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::escalation::{Escalation, FailureKind, LineageStep};
use super::verdicts::AllowedSet;
use crate::decl::NodeMode;
use crate::value::Value;

/// Replacement for a masked secret or a dropped sensitive field.
pub const REDACTED: &str = "«redacted»";

/// Size caps applied to everything in an escalation and to tool results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedactLimits {
    /// Characters per string (detail, values).
    pub max_string_chars: usize,
    /// Items per list and entries per object.
    pub max_items: usize,
    /// Nesting depth of lists/objects; deeper values are summarized.
    pub max_depth: usize,
}

impl Default for RedactLimits {
    fn default() -> Self {
        RedactLimits {
            max_string_chars: 2_000,
            max_items: 100,
            max_depth: 6,
        }
    }
}

/// Field names whose values never leave the actor, whatever they contain. Compared
/// case-insensitively after dropping `-`, `_`, `.` and spaces: the strong words anywhere
/// in the name (`db_password_hash`), the weak ones as the whole name or its suffix
/// (`githubToken`, but not `tokenizer` or `max_tokens`).
const SENSITIVE_ANYWHERE: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "authorization",
    "apikey",
    "credential",
    "privatekey",
    "accesskey",
];
const SENSITIVE_SUFFIX: &[&str] = &["token", "cookie", "sessionid", "auth"];
const SENSITIVE_EXACT: &[&str] = &["pwd", "key", "bearer", "jwt", "otp", "pin"];

/// Whether a field of this name is dropped from escalations and tool results.
pub fn is_sensitive_name(name: &str) -> bool {
    let norm: String = name
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    SENSITIVE_EXACT.contains(&norm.as_str())
        || SENSITIVE_ANYWHERE.iter().any(|s| norm.contains(s))
        || SENSITIVE_SUFFIX.iter().any(|s| norm.ends_with(s))
}

/// Masks secret values and applies size caps. Built from the run's registry of every
/// secret value handed out, so it masks values it has never seen labelled as secrets
/// (inside a URL, a header dump, an error message).
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// Longest first, so a secret containing another is masked whole.
    secrets: Vec<String>,
    pub limits: RedactLimits,
}

impl Redactor {
    pub fn new(secrets: impl IntoIterator<Item = String>, limits: RedactLimits) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor { secrets, limits }
    }

    /// Masks secrets, then truncates. Masking first matters: truncating first could cut
    /// a secret in half and leave its prefix readable.
    pub fn text(&self, s: &str) -> String {
        let masked = self.mask(s);
        truncate_chars(&masked, self.limits.max_string_chars)
    }

    /// Masks secrets only (no truncation).
    pub fn mask(&self, s: &str) -> String {
        let mut out: Option<String> = None;
        for secret in &self.secrets {
            let cur = out.as_deref().unwrap_or(s);
            if cur.contains(secret.as_str()) {
                out = Some(cur.replace(secret.as_str(), REDACTED));
            }
        }
        out.unwrap_or_else(|| s.to_string())
    }

    pub fn value(&self, v: &Value) -> Value {
        self.value_at(v, 0)
    }

    pub fn map(&self, m: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
        self.object_entries(m.iter(), 0)
    }

    fn value_at(&self, v: &Value, depth: usize) -> Value {
        match v {
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => v.clone(),
            Value::Str(s) => Value::from(self.text(s)),
            Value::Bytes(b) => Value::from(format!("«{} bytes»", b.len())),
            Value::List(items) => {
                if depth >= self.limits.max_depth {
                    return Value::from(format!("«list of {} items, too deep»", items.len()));
                }
                let mut out: Vec<Value> = items
                    .iter()
                    .take(self.limits.max_items)
                    .map(|x| self.value_at(x, depth + 1))
                    .collect();
                if items.len() > self.limits.max_items {
                    out.push(Value::from(format!(
                        "«{} more items»",
                        items.len() - self.limits.max_items
                    )));
                }
                Value::list(out)
            }
            Value::Object(m) => {
                if depth >= self.limits.max_depth {
                    return Value::from(format!("«object of {} fields, too deep»", m.len()));
                }
                Value::object(self.object_entries(m.iter(), depth))
            }
        }
    }

    fn object_entries<'a>(
        &self,
        entries: impl ExactSizeIterator<Item = (&'a String, &'a Value)>,
        depth: usize,
    ) -> BTreeMap<String, Value> {
        let total = entries.len();
        let mut out = BTreeMap::new();
        for (k, v) in entries.take(self.limits.max_items) {
            let key = self.text(k);
            let val = if is_sensitive_name(k) {
                Value::from(REDACTED)
            } else {
                self.value_at(v, depth + 1)
            };
            out.insert(key, val);
        }
        if total > self.limits.max_items {
            out.insert(
                "«more»".to_string(),
                Value::from(format!("«{} more fields»", total - self.limits.max_items)),
            );
        }
        out
    }

    /// Redacts an arbitrary JSON document (tool results, provider error bodies).
    pub fn json(&self, v: &serde_json::Value) -> serde_json::Value {
        self.value(&Value::from_json(v.clone())).to_json()
    }

    /// Builds the public escalation record. Raw values go in, only redacted ones come out.
    pub fn escalation(&self, raw: RawEscalation<'_>) -> Escalation {
        Escalation {
            node_id: raw.node_id.to_string(),
            node_type: raw.node_type.to_string(),
            lineage: raw.lineage.to_vec(),
            invocation_key: self.mask(raw.invocation_key),
            mode: raw.mode,
            allowed_actions: raw.allowed,
            failure: match raw.failure {
                FailureKind::Trap { trap } => FailureKind::Trap {
                    trap: self.text(trap),
                },
                other => other.clone(),
            },
            detail: self.text(raw.detail),
            failure_signature: raw.signature.map(|s| self.text(s)),
            candidate_output: raw.candidate.map(|c| self.map(c)),
            inputs: self.map(raw.inputs),
            declared_outputs: raw.declared_outputs.clone(),
            attempt: raw.attempt,
            repair_round: 0,
            repair_error: None,
            spent_cost_usd: raw.spent_cost_usd,
            created_assets: raw.created_assets,
            retry_safe: raw.retry_safe,
            emitted: raw.emitted,
        }
    }

    /// The escalation for the next repair round after a rejected substitute.
    pub fn repair_round(&self, prev: &Escalation, error: &str) -> Escalation {
        let mut e = prev.clone();
        e.repair_round += 1;
        e.repair_error = Some(self.text(error));
        e
    }
}

/// The raw material of an escalation, borrowed from the actor's stack frame.
pub struct RawEscalation<'a> {
    pub node_id: &'a str,
    pub node_type: &'a str,
    pub lineage: &'a [LineageStep],
    pub invocation_key: &'a str,
    pub mode: NodeMode,
    pub allowed: AllowedSet,
    pub failure: &'a FailureKind,
    pub detail: &'a str,
    pub signature: Option<&'a str>,
    pub candidate: Option<&'a BTreeMap<String, Value>>,
    pub inputs: &'a BTreeMap<String, Value>,
    pub declared_outputs: &'a BTreeMap<String, String>,
    pub attempt: u32,
    pub spent_cost_usd: f64,
    pub created_assets: bool,
    pub retry_safe: bool,
    pub emitted: bool,
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((cut, _)) => {
            let rest = s[cut..].chars().count();
            format!("{}«… {rest} more chars»", &s[..cut])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Map;

    #[test]
    fn redaction_masks_secrets_drops_sensitive_fields_and_caps_sizes() {
        let r = Redactor::new(
            vec!["sk-SECRET123".to_string(), "hunter2".to_string()],
            RedactLimits {
                max_string_chars: 20,
                max_items: 5,
                max_depth: 2,
            },
        );
        let mut inner = Map::new();
        inner.insert("url".into(), Value::from("https://h/?k=sk-SECRET123"));
        inner.insert("Authorization".into(), Value::from("Bearer abc"));
        inner.insert("x_api_key".into(), Value::from("plain"));
        let mut m = BTreeMap::new();
        m.insert("req".to_string(), Value::object(inner));
        m.insert("blob".to_string(), Value::Bytes(vec![0u8; 42].into()));
        m.insert(
            "list".to_string(),
            Value::list((0..10).map(Value::Int).collect()),
        );
        m.insert(
            "deep".to_string(),
            Value::list(vec![Value::list(vec![Value::list(vec![Value::Int(1)])])]),
        );
        m.insert("long".to_string(), Value::from("hunter2 ".repeat(10)));
        let out = serde_json::to_string(&r.map(&m)).unwrap();
        assert!(!out.contains("SECRET123"), "{out}");
        assert!(!out.contains("hunter2"), "{out}");
        assert!(!out.contains("Bearer"), "{out}");
        assert!(!out.contains("plain"), "{out}");
        assert!(out.contains("«42 bytes»"), "{out}");
        assert!(out.contains("«5 more items»"), "{out}");
        assert!(out.contains("too deep"), "{out}");
        assert!(out.contains("more chars"), "{out}");
        assert_eq!(r.text("a hunter2 b"), "a «redacted» b");
    }
}
