//! Redaction: every string and value that leaves the actor in an escalation or a tool
//! result has known secrets masked, sensitive fields dropped and sizes capped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::escalation::{Escalation, FailureKind, LineageStep};
use super::verdicts::{AllowedSet, DeclaredOutput};
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

/// Shortest value masked in free text for having been found under a sensitive field name
/// (the field itself is dropped whatever its length): masking every occurrence of one or
/// two characters would leave the text unreadable without hiding anything.
pub const MIN_MASKED_CHARS: usize = 3;

/// Masks secret values and applies size caps. Built from the run's registry of every
/// secret value handed out, so it masks values it has never seen labelled as secrets
/// (inside a URL, a header dump, an error message).
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// Longest first, so a secret containing another is masked whole.
    secrets: Vec<String>,
    /// The caps [`Redactor::text`] and [`Redactor::value`] apply after masking.
    pub limits: RedactLimits,
}

impl Redactor {
    /// A redactor masking every value of `secrets` (empty ones ignored: they would
    /// match everywhere) and capping sizes at `limits`.
    pub fn new(secrets: impl IntoIterator<Item = String>, limits: RedactLimits) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor { secrets, limits }
    }

    /// This redactor, also masking in every text each value found under a sensitive field
    /// name in `fields` (a value inside an object or list under such a name included).
    /// Such a value is dropped where it is labelled, so it must not come back verbatim in
    /// free text beside it: an error quoting `pw=hunter2`, a stderr tail dumping the
    /// request's `Authorization: Bearer …` header. Of an `<scheme> <credential>` value the
    /// credential alone is masked too, as a log may print it without the scheme.
    pub fn with_sensitive_values<'a>(
        &self,
        fields: impl IntoIterator<Item = (&'a str, &'a Value)>,
    ) -> Redactor {
        let mut found = Vec::new();
        for (name, v) in fields {
            sensitive_texts(name, v, false, &mut found);
        }
        if found.is_empty() {
            return self.clone();
        }
        found.retain(|t| t.chars().count() >= MIN_MASKED_CHARS);
        Redactor::new(self.secrets.iter().cloned().chain(found), self.limits)
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

    /// `v` with secrets masked in every string, values under sensitive field names
    /// dropped, and lists, objects and nesting cut to the limits.
    pub fn value(&self, v: &Value) -> Value {
        self.value_at(v, 0)
    }

    /// [`Redactor::value`] for a map of values by name (an invocation's inputs or
    /// outputs).
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

    /// Builds the public escalation record. Raw values go in, only redacted ones come out:
    /// every text in it is masked by this redactor [`with_sensitive_values`] of the
    /// invocation's inputs and candidate output (the one rule for every text an
    /// escalation carries).
    ///
    /// [`with_sensitive_values`]: Redactor::with_sensitive_values
    pub fn escalation(&self, raw: RawEscalation<'_>) -> Escalation {
        let this = self.for_escalation(raw.inputs, raw.candidate);
        this.build(raw)
    }

    /// The redactor an escalation over `inputs` and `candidate` is masked with (what a
    /// caller masks the decider's texts about it with, too).
    pub fn for_escalation(
        &self,
        inputs: &BTreeMap<String, Value>,
        candidate: Option<&BTreeMap<String, Value>>,
    ) -> Redactor {
        self.with_sensitive_values(
            inputs
                .iter()
                .chain(candidate.into_iter().flatten())
                .map(|(k, v)| (k.as_str(), v)),
        )
    }

    fn build(&self, raw: RawEscalation<'_>) -> Escalation {
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
    /// The failing node's id.
    pub node_id: &'a str,
    /// Its type name.
    pub node_type: &'a str,
    /// The invocation's lineage, outermost root first.
    pub lineage: &'a [LineageStep],
    /// The invocation's canonical lineage key (masked: keys can carry values).
    pub invocation_key: &'a str,
    /// The node's mode.
    pub mode: NodeMode,
    /// The verdicts the kernel will accept for this failure.
    pub allowed: AllowedSet,
    /// The class of failure.
    pub failure: &'a FailureKind,
    /// The error's text, before masking and truncation.
    pub detail: &'a str,
    /// The failure signature, if the failure has one.
    pub signature: Option<&'a str>,
    /// A malformed output the node produced, if any.
    pub candidate: Option<&'a BTreeMap<String, Value>>,
    /// The invocation's inputs.
    pub inputs: &'a BTreeMap<String, Value>,
    /// What the node declared per output, what a substitute must match.
    pub declared_outputs: &'a BTreeMap<String, DeclaredOutput>,
    /// 1-based attempt number per (node, invocation key).
    pub attempt: u32,
    /// What the attempt already spent, in USD.
    pub spent_cost_usd: f64,
    /// Whether the attempt created assets before failing.
    pub created_assets: bool,
    /// Whether the node's declaration says a rerun is harmless.
    pub retry_safe: bool,
    /// Streaming: the invocation already sent something downstream.
    pub emitted: bool,
}

/// Every text `v` holds under a sensitive name (`under`: an enclosing field had one):
/// strings, numbers as written, and an `<scheme> <credential>` string's credential.
fn sensitive_texts(name: &str, v: &Value, under: bool, out: &mut Vec<String>) {
    let under = under || is_sensitive_name(name);
    match v {
        Value::Str(s) if under => {
            out.push(s.to_string());
            if let Some((scheme, cred)) = s.trim().split_once(' ')
                && scheme.chars().all(|c| c.is_ascii_alphabetic())
            {
                out.push(cred.trim().to_string());
            }
        }
        Value::Int(i) if under => out.push(i.to_string()),
        Value::Float(f) if under => out.push(f.to_string()),
        Value::List(items) => {
            for x in items.iter() {
                sensitive_texts(name, x, under, out);
            }
        }
        Value::Object(m) => {
            for (k, x) in m.iter() {
                sensitive_texts(k, x, under, out);
            }
        }
        _ => {}
    }
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

    #[test]
    fn values_under_sensitive_names_are_masked_in_every_text_of_the_escalation() {
        let mut headers = Map::new();
        headers.insert("Authorization".into(), Value::from("Bearer zzz-hdr-999"));
        headers.insert("accept".into(), Value::from("text/plain"));
        let mut inputs = BTreeMap::new();
        inputs.insert("password".to_string(), Value::from("hunter2-pw"));
        inputs.insert("api_token".to_string(), Value::from("tok-777-abc"));
        inputs.insert("pin".to_string(), Value::Int(4711));
        inputs.insert("req".to_string(), Value::object(headers));
        inputs.insert("note".to_string(), Value::from("ok"));
        let cand: BTreeMap<String, Value> =
            [("value".to_string(), Value::from("pw=hunter2-pw"))].into();
        let declared = BTreeMap::new();
        let detail = "stderr (last lines):\nlogin pw=hunter2-pw token tok-777-abc pin 4711\n> Authorization: Bearer zzz-hdr-999\n(token zzz-hdr-999 refused) accept text/plain";
        let e = Redactor::default().escalation(RawEscalation {
            node_id: "n",
            node_type: "t",
            lineage: &[],
            invocation_key: "",
            mode: NodeMode::Buffered,
            allowed: AllowedSet::empty(),
            failure: &FailureKind::Node,
            detail,
            signature: None,
            candidate: Some(&cand),
            inputs: &inputs,
            declared_outputs: &declared,
            attempt: 1,
            spent_cost_usd: 0.0,
            created_assets: false,
            retry_safe: false,
            emitted: false,
        });
        let all = serde_json::to_string(&e).unwrap();
        for leaked in ["hunter2-pw", "tok-777-abc", "zzz-hdr-999", "4711"] {
            assert!(!all.contains(leaked), "{leaked} in {all}");
        }
        // What is not sensitive stays readable.
        assert!(e.detail.contains("accept text/plain"), "{}", e.detail);
        assert_eq!(e.inputs["note"], Value::from("ok"));
        // A decider's text about it is masked the same way.
        let r = Redactor::default().for_escalation(&inputs, Some(&cand));
        assert_eq!(r.text("retry with hunter2-pw"), "retry with «redacted»");
    }
}
