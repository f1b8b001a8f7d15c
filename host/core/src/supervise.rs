//! Supervisor data: escalations, verdicts, interventions, redaction and failure
//! signatures (seed 000).
//!
//! Everything here is plain data and pure logic so the kernel, the LLM agent, the CLI and
//! a replay of a recorded run all agree on one shape. An [`Escalation`] is a public record
//! (it becomes an event, lands in the run result and is sent to a model), so it is only
//! ever built through [`Redactor`]: there is no unredacted escalation anywhere.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::decl::NodeMode;
use crate::types::PortType;
use crate::value::Value;

/// The five things a supervisor may ask the kernel to do with a failed invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictAction {
    Retry,
    Substitute,
    Skip,
    EndStream,
    Fail,
}

impl VerdictAction {
    pub const ALL: [VerdictAction; 5] = [
        VerdictAction::Retry,
        VerdictAction::Substitute,
        VerdictAction::Skip,
        VerdictAction::EndStream,
        VerdictAction::Fail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VerdictAction::Retry => "retry",
            VerdictAction::Substitute => "substitute",
            VerdictAction::Skip => "skip",
            VerdictAction::EndStream => "end_stream",
            VerdictAction::Fail => "fail",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for VerdictAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verdict `{0}` (expected retry, substitute, skip, end_stream or fail)")]
pub struct UnknownVerdict(pub String);

impl FromStr for VerdictAction {
    type Err = UnknownVerdict;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim() {
            "retry" => VerdictAction::Retry,
            "substitute" => VerdictAction::Substitute,
            "skip" => VerdictAction::Skip,
            "end_stream" | "end-stream" => VerdictAction::EndStream,
            "fail" => VerdictAction::Fail,
            other => return Err(UnknownVerdict(other.to_string())),
        })
    }
}

/// The kernel-computed set of verdicts an escalation may receive. The verdict schema the
/// agent sees and the kernel's enforcement both derive from this one value.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AllowedSet(u8);

impl AllowedSet {
    pub fn empty() -> Self {
        AllowedSet(0)
    }

    pub fn of(actions: &[VerdictAction]) -> Self {
        let mut s = AllowedSet(0);
        for a in actions {
            s.insert(*a);
        }
        s
    }

    pub fn insert(&mut self, a: VerdictAction) {
        self.0 |= a.bit();
    }

    pub fn contains(self, a: VerdictAction) -> bool {
        self.0 & a.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = VerdictAction> {
        VerdictAction::ALL
            .into_iter()
            .filter(move |a| self.contains(*a))
    }

    pub fn to_vec(self) -> Vec<VerdictAction> {
        self.iter().collect()
    }
}

impl fmt::Debug for AllowedSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for AllowedSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for AllowedSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<VerdictAction>::deserialize(d)?;
        Ok(AllowedSet::of(&v))
    }
}

/// Whether a skip/fail verdict should stick to later failures with the same signature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyTo {
    #[default]
    Invocation,
    Signature,
}

impl ApplyTo {
    fn is_invocation(&self) -> bool {
        *self == ApplyTo::Invocation
    }
}

/// A supervisor's answer. Retry deliberately carries no property overrides: a free-form
/// record would let the supervisor redirect a node (rewrite a URL, a prompt, a path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Verdict {
    Retry,
    Substitute {
        outputs: BTreeMap<String, Value>,
    },
    Skip {
        #[serde(default, skip_serializing_if = "ApplyTo::is_invocation")]
        apply_to: ApplyTo,
    },
    /// Streaming only: keep what was emitted, close the output slots.
    EndStream,
    Fail {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "ApplyTo::is_invocation")]
        apply_to: ApplyTo,
    },
}

impl Verdict {
    pub fn action(&self) -> VerdictAction {
        match self {
            Verdict::Retry => VerdictAction::Retry,
            Verdict::Substitute { .. } => VerdictAction::Substitute,
            Verdict::Skip { .. } => VerdictAction::Skip,
            Verdict::EndStream => VerdictAction::EndStream,
            Verdict::Fail { .. } => VerdictAction::Fail,
        }
    }

    pub fn fail(reason: impl Into<String>) -> Self {
        Verdict::Fail {
            reason: Some(reason.into()),
            apply_to: ApplyTo::Invocation,
        }
    }

    pub fn skip() -> Self {
        Verdict::Skip {
            apply_to: ApplyTo::Invocation,
        }
    }

    /// True for the sticky forms: only skip and fail may stick, because a sticky retry or
    /// substitute would replay a decision made against different inputs.
    pub fn is_sticky(&self) -> bool {
        matches!(
            self,
            Verdict::Skip {
                apply_to: ApplyTo::Signature
            } | Verdict::Fail {
                apply_to: ApplyTo::Signature,
                ..
            }
        )
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Fail { reason, .. } => reason.as_deref(),
            _ => None,
        }
    }
}

/// Who produced the verdict that was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// The LLM agent (or an interactive human).
    Agent,
    /// A cached skip/fail for the same (node, failure signature).
    Sticky,
    /// A bound was reached (decisions, retries, cost, timeout) or the handle errored.
    Bounds,
    /// A rule of a policy file.
    Policy,
    /// A recorded run's decision.
    Replay,
    /// The fail-closed default handle.
    Default,
    /// The kernel overruled a verdict outside the allowed set, or gave up on repairs.
    Kernel,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Agent => "agent",
            DecidedBy::Sticky => "sticky",
            DecidedBy::Bounds => "bounds",
            DecidedBy::Policy => "policy",
            DecidedBy::Replay => "replay",
            DecidedBy::Default => "default",
            DecidedBy::Kernel => "kernel",
        }
    }
}

impl fmt::Display for DecidedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verdict, who made it and what deciding cost: the intervention record minus its
/// escalation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub decided_by: DecidedBy,
    #[serde(default)]
    pub cost_usd: f64,
}

impl Decision {
    pub fn new(verdict: Verdict, decided_by: DecidedBy) -> Self {
        Decision {
            verdict,
            decided_by,
            cost_usd: 0.0,
        }
    }

    pub fn fail(reason: impl Into<String>, decided_by: DecidedBy) -> Self {
        Decision::new(Verdict::fail(reason), decided_by)
    }

    pub fn with_cost(mut self, usd: f64) -> Self {
        self.cost_usd = usd;
        self
    }
}

/// One step of an invocation's correlation lineage: the root a fan-out minted and the
/// item index within it (outermost first in [`Escalation::lineage`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LineageStep {
    pub root: String,
    pub index: u64,
}

/// Whether two lineages can belong to the same item: every root they share has the same
/// index. An ancestor (fewer roots) or a descendant of the failing item is related; a
/// sibling item is not.
pub fn lineage_related(a: &[LineageStep], b: &[LineageStep]) -> bool {
    a.iter()
        .all(|x| b.iter().all(|y| x.root != y.root || x.index == y.index))
}

/// The kernel's class of failure, mirrored here so the signature recognizers can stay in
/// this crate (the kernel's own error type lives above it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureKind {
    Node,
    FuelExhausted,
    Deadline,
    MemoryLimit,
    OutputTooLarge,
    Trap { trap: String },
    Host,
}

/// An escalation: what the supervisor sees of a failed invocation. Built only by
/// [`Redactor::escalation`], so every string in it has had secrets masked and caps applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Escalation {
    pub node_id: String,
    pub node_type: String,
    /// Full lineage of the failing invocation, outermost root first.
    #[serde(default)]
    pub lineage: Vec<LineageStep>,
    /// Canonical lineage key of the invocation (`""` for single-fire nodes).
    #[serde(default)]
    pub invocation_key: String,
    pub mode: NodeMode,
    pub allowed_actions: AllowedSet,
    pub failure: FailureKind,
    /// The error, stringified and redacted.
    pub detail: String,
    /// Stable categorical code; absent means stickiness is off for this failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_signature: Option<String>,
    /// The malformed output the node produced (redacted, truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_output: Option<BTreeMap<String, Value>>,
    /// The invocation's inputs (redacted, truncated).
    #[serde(default)]
    pub inputs: BTreeMap<String, Value>,
    /// Declared output type per output handle: what a substitute must match.
    #[serde(default)]
    pub declared_outputs: BTreeMap<String, String>,
    /// 1-based, per (node, invocation key).
    pub attempt: u32,
    /// 0 for the first decision on this failure; n when the n-th substitute was rejected.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub repair_round: u32,
    /// Why the previous substitute was rejected (set when `repair_round > 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_error: Option<String>,
    #[serde(default)]
    pub spent_cost_usd: f64,
    #[serde(default)]
    pub created_assets: bool,
    pub retry_safe: bool,
    /// Streaming: the invocation already sent something downstream.
    #[serde(default)]
    pub emitted: bool,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// One escalation and what became of it: the unit of audit, of replay and of the
/// `interventions` list in a run result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intervention {
    pub escalation: Escalation,
    /// The verdict the kernel applied.
    pub verdict: Verdict,
    pub decided_by: DecidedBy,
    #[serde(default)]
    pub cost_usd: f64,
    /// When the kernel overruled the handle: what the handle had asked for, and why it was
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overruled: Option<Overruled>,
    /// A substitute that failed runtime validation and went back to the decider (the
    /// verdict was not applied; the next intervention for this failure says what was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overruled {
    pub requested: Verdict,
    pub requested_by: DecidedBy,
    pub why: String,
}

impl Intervention {
    pub fn to_json(&self) -> serde_json::Value {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    pub fn from_json(v: &serde_json::Value) -> Result<Self, serde_json::Error> {
        Intervention::deserialize(v)
    }
}

/// Whether the kernel can check a substituted value of this type. Every current port type
/// has a runtime check; a future reference type (image, asset) gets one only when its
/// reference can be resolved, and until then a node declaring it cannot be repaired.
pub fn has_validator(ty: &PortType) -> bool {
    match ty {
        PortType::List(inner) => has_validator(inner),
        _ => true,
    }
}

/// Runtime validation of a substitute against the node's declared outputs: every declared
/// output present, nothing undeclared, every value of its declared type. A repair replaces
/// the whole invocation output, so a partial one would leave a downstream join waiting.
pub fn check_substitute(
    outputs: &BTreeMap<String, Value>,
    declared: &BTreeMap<String, PortType>,
) -> Result<BTreeMap<String, Value>, String> {
    let mut problems = Vec::new();
    for k in outputs.keys() {
        if !declared.contains_key(k) {
            problems.push(format!(
                "`{k}` is not an output of this node (outputs: {})",
                declared.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let mut out = BTreeMap::new();
    for (k, ty) in declared {
        match outputs.get(k) {
            None => problems.push(format!("output `{k}` ({ty}) is missing")),
            Some(v) => {
                let v = ty.coerce(v.clone());
                match ty.check(&v) {
                    Ok(()) => {
                        out.insert(k.clone(), v);
                    }
                    Err(e) => problems.push(format!("output `{k}`: {e}")),
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("; "))
    }
}

// ---------------------------------------------------------------------------------------
// Redaction

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

// ---------------------------------------------------------------------------------------
// Failure signatures

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

    use crate::value::Map;

    #[test]
    fn verdict_wire_shape_and_stickiness() {
        let v: Verdict =
            serde_json::from_str(r#"{"action":"skip","apply_to":"signature"}"#).unwrap();
        assert!(v.is_sticky());
        let v: Verdict = serde_json::from_str(r#"{"action":"fail","reason":"bad"}"#).unwrap();
        assert!(!v.is_sticky());
        assert_eq!(v.reason(), Some("bad"));
        assert!(serde_json::from_str::<Verdict>(r#"{"action":"explode"}"#).is_err());
        let s = AllowedSet::of(&[VerdictAction::Skip, VerdictAction::Fail]);
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"["skip","fail"]"#);
        assert!(!s.contains(VerdictAction::Retry));
    }

    #[test]
    fn substitute_checked_per_declared_output() {
        let mut decl = BTreeMap::new();
        decl.insert("n".to_string(), PortType::Float);
        decl.insert("tags".to_string(), PortType::list_of(PortType::Str));
        let mut ok = BTreeMap::new();
        ok.insert("n".to_string(), Value::Int(2));
        ok.insert("tags".to_string(), Value::list(vec![Value::from("a")]));
        let out = check_substitute(&ok, &decl).unwrap();
        assert_eq!(out["n"], Value::Float(2.0));
        let mut bad = ok.clone();
        bad.insert("tags".to_string(), Value::list(vec![Value::Int(1)]));
        bad.insert("extra".to_string(), Value::Null);
        let e = check_substitute(&bad, &decl).unwrap_err();
        assert!(
            e.contains("`extra` is not an output") && e.contains("item 0"),
            "{e}"
        );
        bad.remove("n");
        assert!(
            check_substitute(&bad, &decl)
                .unwrap_err()
                .contains("`n` (float) is missing")
        );
    }

    #[test]
    fn lineage_relation() {
        let st = |r: &str, i| LineageStep {
            root: r.into(),
            index: i,
        };
        assert!(lineage_related(&[st("a", 1)], &[]));
        assert!(lineage_related(&[st("a", 1)], &[st("a", 1), st("b", 4)]));
        assert!(!lineage_related(&[st("a", 1)], &[st("a", 2)]));
    }
}
