//! Values that travel along edges.
//!
//! A [`Value`] is JSON-shaped with two additions that JSON loses: integers stay distinct
//! from floats (ports declare `int` vs `float`), and raw bytes stay bytes. Every composite
//! is behind an `Arc`, because a value routed to N downstream edges is cloned N times on
//! the hot path and must cost a reference-count bump, not a deep copy.
//!
//! At the WASM boundary the flat WIT variant (null, bool, s64, f64, string, bytes, json)
//! carries lists and objects as their JSON text; see [`Value::to_json`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// Object map. Ordered, so serialized values and error messages are deterministic.
pub type Map = BTreeMap<String, Value>;

/// The key under which bytes are written when a value is rendered as JSON.
pub const BYTES_KEY: &str = "$bytes";

/// One value on an edge, an input, an output or a property (see the module doc for why
/// it is not `serde_json::Value`). Cloning is cheap whatever the size.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Value {
    /// No value (JSON `null`).
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer, kept apart from floats so an `int` port can refuse `1.5`.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(Arc<str>),
    /// Raw bytes, written as `{"$bytes": "<base64>"}` in JSON ([`BYTES_KEY`]).
    Bytes(Arc<[u8]>),
    /// A list of values.
    List(Arc<Vec<Value>>),
    /// An object, with its keys in order.
    Object(Arc<Map>),
}

impl Value {
    /// A string value.
    pub fn str(s: impl Into<Arc<str>>) -> Self {
        Value::Str(s.into())
    }

    /// A list value.
    pub fn list(items: Vec<Value>) -> Self {
        Value::List(Arc::new(items))
    }

    /// An object value.
    pub fn object(map: Map) -> Self {
        Value::Object(Arc::new(map))
    }

    /// Whether it is [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The string, if it is one (no conversion from other kinds).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if it is one: a float is not narrowed, so `1.0` gives `None`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Numeric view with int → float widening, matching the port-type rule.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The boolean, if it is one (no truthiness).
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The items, if it is a list.
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(l) => Some(l),
            _ => None,
        }
    }

    /// The entries, if it is an object.
    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// Short name of the value's kind, for error messages ("expected int, got string").
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Object(_) => "object",
        }
    }

    /// Converts from JSON. Whole numbers that fit i64 become `Int`; an object of the
    /// single key `$bytes` holding base64 becomes `Bytes` (the inverse of [`Value::to_json`]).
    pub fn from_json(v: serde_json::Value) -> Self {
        match v {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::Str(s.into()),
            serde_json::Value::Array(a) => {
                Value::list(a.into_iter().map(Value::from_json).collect())
            }
            serde_json::Value::Object(o) => {
                let map: Map = o
                    .into_iter()
                    .map(|(k, v)| (k, Value::from_json(v)))
                    .collect();
                bytes_marker(&map).unwrap_or_else(|| Value::object(map))
            }
        }
    }

    /// Renders as JSON. Bytes become `{"$bytes": "<base64>"}`; non-finite floats become null
    /// (JSON has no representation for them).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(s) => serde_json::Value::String(s.to_string()),
            Value::Bytes(b) => {
                let mut m = serde_json::Map::new();
                m.insert(
                    BYTES_KEY.to_string(),
                    serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
                );
                serde_json::Value::Object(m)
            }
            Value::List(l) => serde_json::Value::Array(l.iter().map(Value::to_json).collect()),
            Value::Object(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }

    /// Whether one of `needles` (empty ones ignored) occurs anywhere in this value: in a
    /// string, in bytes, or in an object's key. Structural, not over the JSON text, where
    /// a needle holding a quote or a backslash would be escaped.
    pub fn holds_any<S: AsRef<str>>(&self, needles: &[S]) -> bool {
        let has = |hay: &[u8]| {
            needles.iter().any(|n| {
                let n = n.as_ref().as_bytes();
                !n.is_empty() && hay.windows(n.len()).any(|w| w == n)
            })
        };
        match self {
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => false,
            Value::Str(s) => has(s.as_bytes()),
            Value::Bytes(b) => has(b),
            Value::List(items) => items.iter().any(|x| x.holds_any(needles)),
            Value::Object(m) => m
                .iter()
                .any(|(k, x)| has(k.as_bytes()) || x.holds_any(needles)),
        }
    }

    /// Approximate in-memory payload size in bytes, used for the inline value cap.
    pub fn approx_size(&self) -> usize {
        match self {
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => 8,
            Value::Str(s) => s.len(),
            Value::Bytes(b) => b.len(),
            Value::List(l) => l.iter().map(Value::approx_size).sum::<usize>() + 8,
            Value::Object(m) => {
                m.iter()
                    .map(|(k, v)| k.len() + v.approx_size())
                    .sum::<usize>()
                    + 8
            }
        }
    }
}

/// Recognises the `{"$bytes": "<base64>"}` form that [`Value::to_json`] writes for bytes.
fn bytes_marker(m: &Map) -> Option<Value> {
    if m.len() != 1 {
        return None;
    }
    let Some(Value::Str(b64)) = m.get(BYTES_KEY) else {
        return None;
    };
    base64::engine::general_purpose::STANDARD
        .decode(&**b64)
        .ok()
        .map(|b| Value::Bytes(b.into()))
}

impl fmt::Display for Value {
    /// Strings print bare (as a user expects to see text output); everything else as JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => f.write_str(s),
            other => write!(f, "{}", other.to_json()),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.into())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s.into())
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Self {
        Value::list(v)
    }
}
impl From<serde_json::Value> for Value {
    fn from(v: serde_json::Value) -> Self {
        Value::from_json(v)
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(f) if f.is_finite() => s.serialize_f64(*f),
            Value::Float(_) => s.serialize_unit(),
            Value::Str(v) => s.serialize_str(v),
            Value::Bytes(b) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(
                    BYTES_KEY,
                    &base64::engine::general_purpose::STANDARD.encode(b),
                )?;
                m.end()
            }
            Value::List(l) => {
                let mut seq = s.serialize_seq(Some(l.len()))?;
                for v in l.iter() {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Value::Object(o) => {
                let mut m = s.serialize_map(Some(o.len()))?;
                for (k, v) in o.iter() {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_none<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Value, D2::Error> {
                Value::deserialize(d)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
                Ok(Value::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
                Ok(Value::Int(i))
            }
            fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
                Ok(i64::try_from(u)
                    .map(Value::Int)
                    .unwrap_or(Value::Float(u as f64)))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
                Ok(Value::Float(f))
            }
            fn visit_str<E>(self, s: &str) -> Result<Value, E> {
                Ok(Value::Str(s.into()))
            }
            fn visit_string<E>(self, s: String) -> Result<Value, E> {
                Ok(Value::Str(s.into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0));
                while let Some(v) = a.next_element()? {
                    out.push(v);
                }
                Ok(Value::list(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
                let mut m = Map::new();
                while let Some((k, v)) = a.next_entry::<String, Value>()? {
                    m.insert(k, v);
                }
                Ok(bytes_marker(&m).unwrap_or_else(|| Value::object(m)))
            }
        }
        d.deserialize_any(V).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_keeps_int_float_and_bytes() {
        let v = Value::list(vec![
            Value::Int(3),
            Value::Float(2.5),
            Value::Bytes(vec![0, 1, 255].into()),
            Value::str("x"),
        ]);
        let text = serde_json::to_string(&v).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v, back);
        assert_eq!(Value::from_json(v.to_json()), v);
    }
}
