//! Declared output fields: what a node promises to put in the object it produces on one
//! output, so edges can test `fields.<key>` and the next node can rely on the keys.
//!
//! The descriptor is plain JSON (`{key, type, description?, required?}`) so it travels in
//! a graph file, renders as a form and reads the same to a person and a program. The
//! type vocabulary is open: a type this build does not know accepts any value, so a
//! graph written for a newer build still runs here instead of being refused.

use serde::{Deserialize, Serialize};

use crate::value::Value;

/// `"output": {"handle": …, "fields": [...]}` on a graph node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputContract {
    /// The output the fields are on; absent means the node's only output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// The fields promised on every value of that output.
    pub fields: Vec<FieldDecl>,
}

/// One promised field.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FieldDecl {
    /// The field's key in the object.
    pub key: String,
    /// `string`, `number`, `integer`, `boolean`, `array`, `object`, `null`; anything else
    /// (and absent) accepts every value.
    #[serde(
        default = "any_type",
        rename = "type",
        skip_serializing_if = "is_any_type"
    )]
    pub ty: String,
    /// What the field means, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Absent means required: a promise is kept unless the author says it may not be.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub required: bool,
}

fn any_type() -> String {
    "any".to_string()
}

fn is_any_type(t: &str) -> bool {
    t == "any"
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// How a value broke its node's promise.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ContractViolation {
    /// The value is not an object.
    #[error("the value is {found}, not an object carrying the declared fields")]
    NotObject {
        /// What it is.
        found: &'static str,
    },
    /// A required field is absent.
    #[error("required field `{key}` is missing")]
    Missing {
        /// The field.
        key: String,
    },
    /// A field is of another type than declared.
    #[error("field `{key}` must be {expected}, got {found}")]
    WrongType {
        /// The field.
        key: String,
        /// Its declared type.
        expected: String,
        /// What it is.
        found: &'static str,
    },
}

impl FieldDecl {
    /// Whether `v` is of this field's type (an unknown type accepts anything).
    pub fn accepts(&self, v: &Value) -> bool {
        match self.ty.as_str() {
            "string" => matches!(v, Value::Str(_)),
            "number" => matches!(v, Value::Int(_) | Value::Float(_)),
            "integer" => match v {
                Value::Int(_) => true,
                Value::Float(f) => f.fract() == 0.0,
                _ => false,
            },
            "boolean" => matches!(v, Value::Bool(_)),
            "array" => matches!(v, Value::List(_)),
            "object" => matches!(v, Value::Object(_)),
            "null" => v.is_null(),
            _ => true,
        }
    }
}

impl OutputContract {
    /// Checks one produced value; the first broken promise, in declaration order.
    pub fn check(&self, v: &Value) -> Result<(), ContractViolation> {
        let Some(obj) = v.as_object() else {
            return Err(ContractViolation::NotObject { found: v.kind() });
        };
        for f in &self.fields {
            match obj.get(&f.key) {
                None => {
                    if f.required {
                        return Err(ContractViolation::Missing { key: f.key.clone() });
                    }
                }
                // An optional field may be given as null.
                Some(Value::Null) if !f.required => {}
                Some(x) if !f.accepts(x) => {
                    return Err(ContractViolation::WrongType {
                        key: f.key.clone(),
                        expected: f.ty.clone(),
                        found: x.kind(),
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The contract as text for messages: `{score: number, note?: string}`.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .fields
            .iter()
            .map(|f| format!("{}{}: {}", f.key, if f.required { "" } else { "?" }, f.ty))
            .collect();
        format!("{{{}}}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(json: &str) -> OutputContract {
        serde_json::from_str(json).unwrap()
    }

    fn val(json: &str) -> Value {
        Value::from_json(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn required_by_default_and_unknown_types_accept_anything() {
        let c = contract(
            r#"{"fields":[{"key":"score","type":"number"},{"key":"tag","type":"colour"},
                {"key":"note","type":"string","required":false}]}"#,
        );
        assert!(c.fields[0].required && c.fields[1].required && !c.fields[2].required);
        assert_eq!(c.check(&val(r#"{"score":1.5,"tag":[1]}"#)), Ok(()));
        assert_eq!(
            c.check(&val(r#"{"score":1,"tag":null,"note":null}"#)),
            Ok(())
        );
        assert_eq!(
            c.check(&val(r#"{"tag":1}"#)),
            Err(ContractViolation::Missing {
                key: "score".into()
            })
        );
        assert_eq!(
            c.check(&val(r#"{"score":"high","tag":1}"#)),
            Err(ContractViolation::WrongType {
                key: "score".into(),
                expected: "number".into(),
                found: "str"
            })
        );
        assert_eq!(
            c.check(&val(r#"{"score":1,"tag":1,"note":3}"#))
                .unwrap_err()
                .to_string(),
            "field `note` must be string, got int"
        );
        assert!(matches!(
            c.check(&val("[1]")),
            Err(ContractViolation::NotObject { .. })
        ));
        assert_eq!(c.summary(), "{score: number, tag: colour, note?: string}");
    }

    #[test]
    fn unknown_descriptor_keys_are_refused() {
        assert!(
            serde_json::from_str::<OutputContract>(r#"{"fields":[{"key":"a","kind":"x"}]}"#)
                .is_err()
        );
    }
}
