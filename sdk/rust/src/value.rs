//! The guest's view of a value: the same shape as the host's (ints stay ints, bytes stay
//! bytes). Lists and objects cross the boundary as JSON text; this module does that
//! conversion so node code never sees it.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::bindings::heddle::node::types::Value as Wire;

const BYTES_KEY: &str = "$bytes";

#[derive(Clone, Debug, Default, PartialEq)]
pub enum Value {
    #[default]
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Object(BTreeMap<String, Value>),
}

impl Value {
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

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Text form: strings bare, everything else as JSON.
    pub fn to_text(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            other => other.to_json().to_string(),
        }
    }

    pub fn from_json(v: serde_json::Value) -> Value {
        match v {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::Str(s),
            serde_json::Value::Array(a) => {
                Value::List(a.into_iter().map(Value::from_json).collect())
            }
            serde_json::Value::Object(o) => {
                if o.len() == 1
                    && let Some(serde_json::Value::String(b64)) = o.get(BYTES_KEY)
                    && let Ok(b) = base64::engine::general_purpose::STANDARD.decode(b64)
                {
                    return Value::Bytes(b);
                }
                Value::Object(
                    o.into_iter()
                        .map(|(k, v)| (k, Value::from_json(v)))
                        .collect(),
                )
            }
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => (*b).into(),
            Value::Int(i) => (*i).into(),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(s) => s.clone().into(),
            Value::Bytes(b) => {
                let mut m = serde_json::Map::new();
                m.insert(
                    BYTES_KEY.into(),
                    base64::engine::general_purpose::STANDARD.encode(b).into(),
                );
                serde_json::Value::Object(m)
            }
            Value::List(l) => serde_json::Value::Array(l.iter().map(Value::to_json).collect()),
            Value::Object(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }

    #[doc(hidden)]
    pub fn from_wire(w: Wire) -> Value {
        match w {
            Wire::Null => Value::Null,
            Wire::Boolean(b) => Value::Bool(b),
            Wire::S64(i) => Value::Int(i),
            Wire::F64(f) => Value::Float(f),
            Wire::String(s) => Value::Str(s),
            Wire::Bytes(b) => Value::Bytes(b),
            // The host only sends JSON it produced itself; fall back to the text if not.
            Wire::Json(text) => match serde_json::from_str(&text) {
                Ok(j) => Value::from_json(j),
                Err(_) => Value::Str(text),
            },
        }
    }

    #[doc(hidden)]
    pub fn to_wire(&self) -> Wire {
        match self {
            Value::Null => Wire::Null,
            Value::Bool(b) => Wire::Boolean(*b),
            Value::Int(i) => Wire::S64(*i),
            Value::Float(f) => Wire::F64(*f),
            Value::Str(s) => Wire::String(s.clone()),
            Value::Bytes(b) => Wire::Bytes(b.clone()),
            Value::List(_) | Value::Object(_) => Wire::Json(self.to_json().to_string()),
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
        Value::Str(s)
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
