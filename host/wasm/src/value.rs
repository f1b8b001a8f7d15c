//! Values across the guest boundary: Heddle's [`Value`] and the WIT `value` variant.
//! Scalars, strings and bytes map one to one; lists and objects travel as JSON text.

use heddle_core::Value;

use crate::bindings::WitValue;

pub(crate) fn to_wit(v: &Value) -> WitValue {
    match v {
        Value::Null => WitValue::Null,
        Value::Bool(b) => WitValue::Boolean(*b),
        Value::Int(i) => WitValue::S64(*i),
        Value::Float(f) => WitValue::F64(*f),
        Value::Str(s) => WitValue::String(s.to_string()),
        Value::Bytes(b) => WitValue::Bytes(b.to_vec()),
        // Straight to text, without building a `serde_json::Value` tree first. Writing a
        // `Value` cannot fail (string keys, non-finite floats written as null).
        Value::List(_) | Value::Object(_) => {
            WitValue::Json(serde_json::to_string(v).unwrap_or_else(|_| "null".into()))
        }
    }
}

pub(crate) fn from_wit(v: WitValue) -> Result<Value, String> {
    Ok(match v {
        WitValue::Null => Value::Null,
        WitValue::Boolean(b) => Value::Bool(b),
        WitValue::S64(i) => Value::Int(i),
        // JSON (and so every report) has no NaN or infinity; refusing them here beats
        // turning them into null where nobody notices.
        WitValue::F64(f) if !f.is_finite() => {
            return Err(format!(
                "the float {f} has no representation in Heddle values (NaN and infinities are refused; send null or a string)"
            ));
        }
        WitValue::F64(f) => Value::Float(f),
        WitValue::String(s) => Value::Str(s.into()),
        WitValue::Bytes(b) => Value::Bytes(b.into()),
        // Parsed straight into a `Value` (same numbers and `$bytes` rule as
        // `Value::from_json`), without an intermediate `serde_json::Value` tree.
        WitValue::Json(text) => serde_json::from_str::<Value>(&text)
            .map_err(|e| format!("malformed json value: {e}"))?,
    })
}

/// The size the value cap is checked against (JSON text is counted as sent).
pub(crate) fn wit_size(v: &WitValue) -> usize {
    match v {
        WitValue::String(s) | WitValue::Json(s) => s.len(),
        WitValue::Bytes(b) => b.len(),
        _ => 8,
    }
}
