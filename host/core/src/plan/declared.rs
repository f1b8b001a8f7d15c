//! What a graph declares beyond wiring: a node's promised output fields
//! ([`crate::contract`]) and what an edge does to each value crossing it (a `when`
//! condition, a `fields` narrowing), as the plan carries them and the kernel applies
//! them. The planner checks and compiles them once (`declared_checks`), so a bad
//! expression or an impossible field list is refused before anything runs.

use std::sync::Arc;

use crate::contract::OutputContract;
use crate::expr::{Expr, Scope};
use crate::value::Value;

/// A node's declared fields, on the output they are promised for.
#[derive(Clone, Debug)]
pub struct NodeContract {
    /// The output handle the fields are promised for.
    pub handle: Arc<str>,
    /// The fields.
    pub contract: OutputContract,
}

/// What an edge does to every value crossing it.
#[derive(Clone, Debug)]
pub struct EdgeRule {
    /// Only values for which it holds cross; the others rule the target out for their
    /// item.
    pub when: Option<Expr>,
    /// Keys kept of an object value (selection only).
    pub fields: Option<Vec<Arc<str>>>,
    /// The source declares fields on this output, so the condition may read `fields.<key>`.
    pub source_fields: bool,
}

/// The fate of one value on an edge with a rule.
#[derive(Debug)]
pub enum Crossing {
    /// It crosses, possibly narrowed.
    Pass(Value),
    /// The condition chose another branch.
    RuledOut,
    /// The rule could not be applied; the target fails with this.
    Failed(String),
}

/// The scope of an edge condition: `value`, and `fields` when the source declares them.
struct EdgeScope<'a> {
    value: &'a Value,
    fields: bool,
}

impl Scope for EdgeScope<'_> {
    fn top(&self, name: &str) -> Option<&Value> {
        match name {
            "value" => Some(self.value),
            "fields" if self.fields => Some(self.value),
            _ => None,
        }
    }

    fn to_json(&self) -> serde_json::Value {
        let v = self.value.to_json();
        let mut m = serde_json::Map::new();
        if self.fields {
            m.insert("fields".into(), v.clone());
        }
        m.insert("value".into(), v);
        serde_json::Value::Object(m)
    }
}

impl EdgeRule {
    /// What becomes of `v` on this edge: it crosses (narrowed to the selected fields),
    /// or the condition rules it out.
    pub fn apply(&self, v: &Value) -> Crossing {
        if let Some(expr) = &self.when {
            let scope = EdgeScope {
                value: v,
                fields: self.source_fields,
            };
            match expr.test(&scope) {
                Ok(true) => {}
                Ok(false) => return Crossing::RuledOut,
                Err(e) => return Crossing::Failed(e.to_string()),
            }
        }
        let Some(keys) = &self.fields else {
            return Crossing::Pass(v.clone());
        };
        let Some(obj) = v.as_object() else {
            return Crossing::Failed(format!(
                "the edge carries fields {} of an object, but the value is {}",
                keys.join(", "),
                v.kind()
            ));
        };
        let narrowed = obj
            .iter()
            .filter(|(k, _)| keys.iter().any(|f| **f == ***k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Crossing::Pass(Value::object(narrowed))
    }
}
