//! Verdicts: what a supervisor may answer about a failed invocation, the set it is
//! allowed to choose from, who decided, and the check a substitute output must pass.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::contract::{FieldDecl, OutputContract};
use crate::types::PortType;
use crate::value::Value;

/// The five things a supervisor may ask the kernel to do with a failed invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictAction {
    /// Run the invocation again with the same inputs (only where that is safe).
    Retry,
    /// Use outputs the supervisor gives instead of the node's, checked against what the
    /// node declared.
    Substitute,
    /// Drop this invocation: its outputs never come, and downstream skips accordingly.
    Skip,
    /// For a streaming node: keep what it emitted and close its outputs.
    EndStream,
    /// Let the failure stand.
    Fail,
}

impl VerdictAction {
    /// Every action, in the order schemas and listings show them.
    pub const ALL: [VerdictAction; 5] = [
        VerdictAction::Retry,
        VerdictAction::Substitute,
        VerdictAction::Skip,
        VerdictAction::EndStream,
        VerdictAction::Fail,
    ];

    /// The action's wire name (`end_stream`), as in a verdict's `action` field.
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

/// A verdict name that is none of the five, carrying the text given.
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
    /// The set that allows nothing; [`AllowedSet::insert`] adds to it.
    pub fn empty() -> Self {
        AllowedSet(0)
    }

    /// The set of exactly `actions` (repeats are harmless).
    pub fn of(actions: &[VerdictAction]) -> Self {
        let mut s = AllowedSet(0);
        for a in actions {
            s.insert(*a);
        }
        s
    }

    /// Allows `a` too.
    pub fn insert(&mut self, a: VerdictAction) {
        self.0 |= a.bit();
    }

    /// Whether `a` may be chosen: the kernel overrules a verdict outside the set.
    pub fn contains(self, a: VerdictAction) -> bool {
        self.0 & a.bit() != 0
    }

    /// The allowed actions in [`VerdictAction::ALL`]'s order, so the schema an agent
    /// sees is the same whatever order they were inserted in.
    pub fn iter(self) -> impl Iterator<Item = VerdictAction> {
        VerdictAction::ALL
            .into_iter()
            .filter(move |a| self.contains(*a))
    }

    /// The allowed actions, in [`AllowedSet::iter`]'s order.
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
    /// Only the invocation escalated.
    #[default]
    Invocation,
    /// Every later failure of the node with the same failure signature gets the same
    /// verdict without asking again ([`DecidedBy::Sticky`]).
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
    /// Run the invocation again, unchanged.
    Retry,
    /// Use these outputs instead of the node's ([`check_substitute`] checks them).
    Substitute {
        /// A value for every declared output, by handle.
        outputs: BTreeMap<String, Value>,
    },
    /// Drop the invocation.
    Skip {
        /// Whether the skip sticks to later failures with the same signature.
        #[serde(default, skip_serializing_if = "ApplyTo::is_invocation")]
        apply_to: ApplyTo,
    },
    /// Streaming only: keep what was emitted, close the output slots.
    EndStream,
    /// Let the failure stand.
    Fail {
        /// Why, in the decider's words, added to the node's error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Whether the failure sticks to later failures with the same signature.
        #[serde(default, skip_serializing_if = "ApplyTo::is_invocation")]
        apply_to: ApplyTo,
    },
}

impl Verdict {
    /// The verdict's kind, what an [`AllowedSet`] is checked against.
    pub fn action(&self) -> VerdictAction {
        match self {
            Verdict::Retry => VerdictAction::Retry,
            Verdict::Substitute { .. } => VerdictAction::Substitute,
            Verdict::Skip { .. } => VerdictAction::Skip,
            Verdict::EndStream => VerdictAction::EndStream,
            Verdict::Fail { .. } => VerdictAction::Fail,
        }
    }

    /// A fail verdict for this invocation only, with a reason.
    pub fn fail(reason: impl Into<String>) -> Self {
        Verdict::Fail {
            reason: Some(reason.into()),
            apply_to: ApplyTo::Invocation,
        }
    }

    /// A skip verdict for this invocation only.
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

    /// A fail verdict's reason; other verdicts carry none.
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
    /// The decider's wire name, as in a decision event's `decided_by`.
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
    /// What is to be done with the failed invocation.
    pub verdict: Verdict,
    /// Who chose it, so a run's report can tell an agent's call from a bound's.
    pub decided_by: DecidedBy,
    /// What deciding cost (an LLM call), in USD, counted against the supervisor's budget.
    #[serde(default)]
    pub cost_usd: f64,
    /// Why, in the decider's words (a person's note): recorded with the verdict, whatever
    /// the verdict is. A `fail` verdict's reason is its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Decision {
    /// A decision that cost nothing and has no note.
    pub fn new(verdict: Verdict, decided_by: DecidedBy) -> Self {
        Decision {
            verdict,
            decided_by,
            cost_usd: 0.0,
            note: None,
        }
    }

    /// The decision with `note` (blank is none).
    pub fn with_note(mut self, note: Option<String>) -> Self {
        self.note = note.filter(|n| !n.trim().is_empty());
        self
    }

    /// A fail verdict with `reason`, by `decided_by`.
    pub fn fail(reason: impl Into<String>, decided_by: DecidedBy) -> Self {
        Decision::new(Verdict::fail(reason), decided_by)
    }

    /// The decision with what deciding cost, in USD.
    pub fn with_cost(mut self, usd: f64) -> Self {
        self.cost_usd = usd;
        self
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

/// What a node promised on one output: its declared port type and, when the graph
/// declares them (`output.fields`), the fields of the object it carries. A substitute
/// must keep all of it, so the decider is shown all of it.
///
/// On the wire (an escalation's `declared_outputs`) an output without fields is its type
/// alone (`"object"`), one with fields `{"type": "any", "fields": [{"key", "type", …}]}`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredOutput {
    /// The output port's declared type.
    pub ty: PortType,
    /// The object fields the graph declares for it (`output.fields`), if any.
    pub fields: Option<Vec<FieldDecl>>,
}

impl DeclaredOutput {
    /// A promise of a type alone, without declared fields.
    pub fn of_type(ty: PortType) -> Self {
        DeclaredOutput { ty, fields: None }
    }

    /// `v`, coerced to the type, or what breaks the promise.
    pub fn check(&self, v: Value) -> Result<Value, String> {
        let v = self.ty.coerce(v);
        self.ty.check(&v)?;
        if let Some(fields) = &self.fields {
            let contract = OutputContract {
                handle: None,
                fields: fields.clone(),
            };
            contract.check(&v).map_err(|e| {
                format!("the declared fields {} are broken: {e}", contract.summary())
            })?;
        }
        Ok(v)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum DeclaredWire {
    Type(PortType),
    Fields {
        #[serde(rename = "type")]
        ty: PortType,
        fields: Vec<FieldDecl>,
    },
}

impl Serialize for DeclaredOutput {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.fields {
            None => self.ty.serialize(s),
            Some(fields) => DeclaredWire::Fields {
                ty: self.ty.clone(),
                fields: fields.clone(),
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for DeclaredOutput {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match DeclaredWire::deserialize(d)? {
            DeclaredWire::Type(ty) => DeclaredOutput::of_type(ty),
            DeclaredWire::Fields { ty, fields } => DeclaredOutput {
                ty,
                fields: Some(fields),
            },
        })
    }
}

/// Runtime validation of a substitute against everything the node declared for its
/// outputs: every declared output present, nothing undeclared, every value of its
/// declared type and carrying its declared fields. A repair replaces the whole
/// invocation output, so a partial one would leave a downstream join waiting.
pub fn check_substitute(
    outputs: &BTreeMap<String, Value>,
    declared: &BTreeMap<String, DeclaredOutput>,
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
    for (k, d) in declared {
        match outputs.get(k) {
            None => problems.push(format!("output `{k}` ({}) is missing", d.ty)),
            Some(v) => match d.check(v.clone()) {
                Ok(v) => {
                    out.insert(k.clone(), v);
                }
                Err(e) => problems.push(format!("output `{k}`: {e}")),
            },
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        decl.insert("n".to_string(), DeclaredOutput::of_type(PortType::Float));
        decl.insert(
            "tags".to_string(),
            DeclaredOutput::of_type(PortType::list_of(PortType::Str)),
        );
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
    fn a_substitute_keeps_the_declared_fields_and_they_travel_with_the_type() {
        let fields: Vec<FieldDecl> = serde_json::from_value(serde_json::json!([
            {"key": "id", "type": "string"},
            {"key": "n", "type": "number", "required": false}
        ]))
        .unwrap();
        let d = DeclaredOutput {
            ty: PortType::Any,
            fields: Some(fields),
        };
        let decl: BTreeMap<String, DeclaredOutput> = [("value".to_string(), d.clone())].into();
        let sub = |v: serde_json::Value| {
            check_substitute(&[("value".to_string(), Value::from_json(v))].into(), &decl)
        };
        let e = sub(serde_json::json!({"id": 7})).unwrap_err();
        assert!(
            e.contains("output `value`") && e.contains("field `id` must be string, got int"),
            "{e}"
        );
        assert!(
            sub(serde_json::json!("text"))
                .unwrap_err()
                .contains("not an object")
        );
        assert!(sub(serde_json::json!({"id": "7"})).is_ok());
        // On the wire: the type alone without fields, type and fields with them.
        assert_eq!(
            serde_json::to_value(DeclaredOutput::of_type(PortType::Object)).unwrap(),
            serde_json::json!("object")
        );
        let wire = serde_json::to_value(&d).unwrap();
        assert_eq!(wire["type"], "any");
        assert_eq!(wire["fields"][0]["key"], "id");
        assert_eq!(serde_json::from_value::<DeclaredOutput>(wire).unwrap(), d);
        assert_eq!(
            serde_json::from_value::<DeclaredOutput>(serde_json::json!("int")).unwrap(),
            DeclaredOutput::of_type(PortType::Int)
        );
    }
}
