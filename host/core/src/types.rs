//! Declared port types and the edge compatibility rule.
//!
//! Types are written as short strings in declarations and documents: `any`, `bool`,
//! `int`, `float`, `number`, `str`, `bytes`, `object`, `json`, `list[T]`. The rule that
//! decides whether an edge may connect two ports lives in [`PortType::accepts`] and is
//! the only place it lives, so validation, bypass rewriting and supervisor substitute
//! checks all agree.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::value::Value;

/// The type of a port: what values an input takes or an output produces. Written
/// `any`, `bool`, `int`, `float`, `number`, `str`, `bytes`, `object`, `json` or
/// `list[T]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum PortType {
    /// Any value.
    #[default]
    Any,
    /// A boolean.
    Bool,
    /// A 64-bit signed integer.
    Int,
    /// A 64-bit float.
    Float,
    /// Int or float.
    Number,
    /// A UTF-8 string.
    Str,
    /// Raw bytes.
    Bytes,
    /// A JSON object.
    Object,
    /// Any JSON-representable value (everything except bytes at the top level).
    Json,
    /// A list of values of the inner type.
    List(Box<PortType>),
}

impl PortType {
    /// `list[t]`.
    pub fn list_of(t: PortType) -> Self {
        PortType::List(Box::new(t))
    }

    /// Whether it is a list type.
    pub fn is_list(&self) -> bool {
        matches!(self, PortType::List(_))
    }

    /// Whether a value produced on a port of type `from` may arrive on a port of type
    /// `self`: `any` on either side matches, int widens to float and number, list element
    /// types are checked recursively, and `json` accepts every JSON-shaped type.
    pub fn accepts(&self, from: &PortType) -> bool {
        use PortType::*;
        match (self, from) {
            (Any, _) | (_, Any) => true,
            (a, b) if a == b => true,
            (Float, Int) | (Number, Int) | (Number, Float) | (Float, Number) => true,
            (Json, Bytes) => false,
            (Json, _) => true,
            (Object, Json) | (List(_), Json) => true,
            (List(a), List(b)) => a.accepts(b),
            _ => false,
        }
    }

    /// Runtime check of a concrete value against this type (used to validate substituted
    /// outputs and external inputs). Null is accepted only by `any` and `json`.
    pub fn check(&self, v: &Value) -> Result<(), String> {
        use PortType::*;
        let ok = match (self, v) {
            (Any, _) => true,
            (Json, Value::Bytes(_)) => false,
            (Json, _) => true,
            (Bool, Value::Bool(_)) => true,
            (Int, Value::Int(_)) => true,
            (Float, Value::Float(_) | Value::Int(_)) => true,
            (Number, Value::Float(_) | Value::Int(_)) => true,
            (Str, Value::Str(_)) => true,
            (Bytes, Value::Bytes(_)) => true,
            (Object, Value::Object(_)) => true,
            (List(elem), Value::List(items)) => {
                for (i, item) in items.iter().enumerate() {
                    elem.check(item).map_err(|e| format!("item {i}: {e}"))?;
                }
                true
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("expected {self}, got {}", v.kind()))
        }
    }

    /// Converts a value to this type where the conversion is lossless and unsurprising
    /// (int → float). Other mismatches are left for [`PortType::check`] to reject.
    pub fn coerce(&self, v: Value) -> Value {
        match (self, v) {
            (PortType::Float, Value::Int(i)) => Value::Float(i as f64),
            (_, v) => v,
        }
    }
}

impl fmt::Display for PortType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PortType::*;
        match self {
            Any => f.write_str("any"),
            Bool => f.write_str("bool"),
            Int => f.write_str("int"),
            Float => f.write_str("float"),
            Number => f.write_str("number"),
            Str => f.write_str("str"),
            Bytes => f.write_str("bytes"),
            Object => f.write_str("object"),
            Json => f.write_str("json"),
            List(t) => write!(f, "list[{t}]"),
        }
    }
}

/// A port type's text that names no type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown port type `{0}` (expected any, bool, int, float, number, str, bytes, object, json or list[T])"
)]
pub struct ParseTypeError(
    /// The text that is not a type.
    pub String,
);

impl FromStr for PortType {
    type Err = ParseTypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        if let Some(inner) = lower
            .strip_prefix("list[")
            .and_then(|r| r.strip_suffix(']'))
            .or_else(|| {
                lower
                    .strip_prefix("list<")
                    .and_then(|r| r.strip_suffix('>'))
            })
        {
            return Ok(PortType::list_of(inner.parse()?));
        }
        Ok(match lower.as_str() {
            "any" | "" => PortType::Any,
            "bool" | "boolean" => PortType::Bool,
            "int" | "integer" | "s64" => PortType::Int,
            "float" | "f64" => PortType::Float,
            "number" => PortType::Number,
            "str" | "string" | "text" => PortType::Str,
            "bytes" => PortType::Bytes,
            "object" | "dict" => PortType::Object,
            "json" => PortType::Json,
            "list" => PortType::list_of(PortType::Any),
            _ => return Err(ParseTypeError(t.to_string())),
        })
    }
}

impl Serialize for PortType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PortType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatibility_rule() {
        let t = |s: &str| s.parse::<PortType>().unwrap();
        assert!(t("float").accepts(&t("int")));
        assert!(!t("int").accepts(&t("float")));
        assert!(t("list[float]").accepts(&t("list[int]")));
        assert!(!t("list[int]").accepts(&t("list[str]")));
        assert!(t("str").accepts(&t("any")));
        assert!(!t("str").accepts(&t("int")));
        assert_eq!(t("list[list[int]]").to_string(), "list[list[int]]");
        assert!("widget".parse::<PortType>().is_err());
    }
}
