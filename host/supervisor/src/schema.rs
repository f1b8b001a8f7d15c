//! The verdict tool's schema, narrowed to the allowed set, and the parser that checks a
//! reply against it. Narrowing makes a disallowed verdict unrepresentable for a model
//! that follows the schema; the parser re-checks because not every model does (and the
//! kernel checks again after that).

use std::collections::BTreeMap;

use heddle_core::PortType;
use heddle_core::supervise::{ApplyTo, DeclaredOutput, Escalation, Verdict, VerdictAction};
use serde_json::{Value as Json, json};

/// JSON schema of a port type, for the `outputs` of a substitute.
fn type_schema(t: &PortType) -> Json {
    match t {
        PortType::Any | PortType::Json => json!({}),
        PortType::Bool => json!({"type": "boolean"}),
        PortType::Int => json!({"type": "integer"}),
        PortType::Float | PortType::Number => json!({"type": "number"}),
        PortType::Str => json!({"type": "string"}),
        PortType::Bytes => json!({
            "type": "object",
            "properties": {"$bytes": {"type": "string", "description": "base64"}},
            "required": ["$bytes"],
        }),
        PortType::Object => json!({"type": "object"}),
        PortType::List(inner) => json!({"type": "array", "items": type_schema(inner)}),
    }
}

/// JSON schema of what a node declared on one output: its type and, with declared
/// fields, an object with those properties (the required ones required).
fn declared_schema(d: &DeclaredOutput) -> Json {
    let Some(fields) = &d.fields else {
        return type_schema(&d.ty);
    };
    let props: serde_json::Map<String, Json> = fields
        .iter()
        .map(|f| {
            let mut p = match f.ty.as_str() {
                t @ ("string" | "number" | "integer" | "boolean" | "array" | "object" | "null") => {
                    json!({"type": t})
                }
                _ => json!({}),
            };
            if let Some(desc) = &f.description {
                p["description"] = json!(desc);
            }
            (f.key.clone(), p)
        })
        .collect();
    let required: Vec<&str> = fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.key.as_str())
        .collect();
    json!({"type": "object", "properties": props, "required": required})
}

/// The parameters schema of the `submit_verdict` tool for this escalation.
pub fn verdict_schema(e: &Escalation) -> Json {
    let allowed = e.allowed_actions;
    let actions: Vec<&str> = allowed.iter().map(VerdictAction::as_str).collect();
    let mut props = serde_json::Map::new();
    props.insert("action".into(), json!({"type": "string", "enum": actions}));
    props.insert(
        "reason".into(),
        json!({"type": "string", "description": "One sentence: why. For fail it becomes the run's error summary."}),
    );
    let sticky_possible = e.failure_signature.is_some()
        && (allowed.contains(VerdictAction::Skip) || allowed.contains(VerdictAction::Fail));
    if sticky_possible {
        props.insert(
            "apply_to".into(),
            json!({
                "type": "string",
                "enum": ["invocation", "signature"],
                "description": "skip/fail only. `signature` applies the same verdict to later failures of this node with the same failure signature, without asking again.",
            }),
        );
    }
    if allowed.contains(VerdictAction::Substitute) {
        let out_props: serde_json::Map<String, Json> = e
            .declared_outputs
            .iter()
            .map(|(k, d)| (k.clone(), declared_schema(d)))
            .collect();
        props.insert(
            "outputs".into(),
            json!({
                "type": "object",
                "description": "substitute only: the repaired value for every declared output",
                "properties": out_props,
                "required": e.declared_outputs.keys().collect::<Vec<_>>(),
                "additionalProperties": false,
            }),
        );
    }
    json!({
        "type": "object",
        "properties": props,
        "required": ["action", "reason"],
        "additionalProperties": false,
    })
}

/// Parses `submit_verdict` arguments. `Err` is a message to send back to the model as
/// the tool's result (the conversation continues, within the repair-round limit).
pub fn parse_verdict(args: &Json, e: &Escalation) -> Result<Verdict, String> {
    let obj = args
        .as_object()
        .ok_or_else(|| "arguments must be a JSON object".to_string())?;
    for k in obj.keys() {
        if !matches!(k.as_str(), "action" | "reason" | "apply_to" | "outputs") {
            return Err(format!("unknown field `{k}`"));
        }
    }
    let action_text = obj
        .get("action")
        .and_then(Json::as_str)
        .ok_or_else(|| "`action` (string) is required".to_string())?;
    let action: VerdictAction = action_text.parse().map_err(|e| format!("{e}"))?;
    if !e.allowed_actions.contains(action) {
        return Err(format!(
            "`{action}` is not allowed for this failure; allowed: {}",
            e.allowed_actions
                .iter()
                .map(VerdictAction::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let reason = obj.get("reason").and_then(Json::as_str).map(str::to_string);
    let apply_to = match obj.get("apply_to").and_then(Json::as_str) {
        None | Some("invocation") => ApplyTo::Invocation,
        Some("signature") if matches!(action, VerdictAction::Skip | VerdictAction::Fail) => {
            ApplyTo::Signature
        }
        Some(other) => {
            return Err(format!(
                "apply_to `{other}` is not valid with {action} (use invocation, or signature with skip/fail)"
            ));
        }
    };
    if obj.contains_key("outputs") && action != VerdictAction::Substitute {
        return Err(format!("`outputs` is only for substitute, not {action}"));
    }
    Ok(match action {
        VerdictAction::Retry => Verdict::Retry,
        VerdictAction::EndStream => Verdict::EndStream,
        VerdictAction::Skip => Verdict::Skip { apply_to },
        VerdictAction::Fail => Verdict::Fail { reason, apply_to },
        VerdictAction::Substitute => {
            let outputs = obj
                .get("outputs")
                .and_then(Json::as_object)
                .ok_or_else(|| "substitute needs `outputs` (object)".to_string())?;
            let outputs: BTreeMap<String, heddle_core::Value> = outputs
                .iter()
                .map(|(k, v)| (k.clone(), heddle_core::Value::from_json(v.clone())))
                .collect();
            // The same runtime validation the kernel applies (types and declared
            // fields), so a wrong shape is bounced while the conversation is still open.
            let valid = e.check_substitute(&outputs)?;
            Verdict::Substitute { outputs: valid }
        }
    })
}
