//! `--input NAME=VALUE` arguments and the check that every external input has a value.

use std::collections::BTreeMap;
use std::path::Path;

use heddle_core::{GraphDoc, PortType, Value};

use crate::exit::UsageError;

/// Built-in type of the external input node.
pub const INPUT_TYPE: &str = "heddle.input";

/// One `--input` argument as written, before it is matched to an input node.
#[derive(Clone, Debug, PartialEq)]
pub struct RawInput {
    pub name: String,
    pub text: String,
    /// The file it came from, for `@file` values (error messages).
    pub file: Option<String>,
}

/// Splits `NAME=VALUE` and reads `NAME=@file`. `@@x` stands for the literal text `@x`.
pub fn parse_arg(arg: &str) -> Result<RawInput, UsageError> {
    let Some((name, value)) = arg.split_once('=') else {
        return Err(UsageError::new(format!(
            "invalid --input `{arg}`: expected NAME=VALUE (or NAME=@FILE to read a file)"
        )));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(UsageError::new(format!(
            "invalid --input `{arg}`: the input name before `=` is empty"
        )));
    }
    if let Some(rest) = value.strip_prefix("@@") {
        return Ok(RawInput {
            name: name.to_string(),
            text: format!("@{rest}"),
            file: None,
        });
    }
    if let Some(path) = value.strip_prefix('@') {
        let text = std::fs::read_to_string(Path::new(path)).map_err(|e| {
            UsageError::new(format!("--input {name}: cannot read file `{path}`: {e}"))
        })?;
        return Ok(RawInput {
            name: name.to_string(),
            text,
            file: Some(path.to_string()),
        });
    }
    Ok(RawInput {
        name: name.to_string(),
        text: value.to_string(),
        file: None,
    })
}

/// An external input of a graph: a `heddle.input` node.
#[derive(Clone, Debug)]
pub struct InputSlot {
    pub node_id: String,
    pub name: String,
    pub ty: PortType,
    pub has_default: bool,
    pub streaming: bool,
}

/// The graph's external inputs, named the way the kernel names them: the node's `name`
/// property, else its `name` field, else its id.
pub fn input_slots(doc: &GraphDoc) -> Vec<InputSlot> {
    doc.nodes
        .iter()
        .filter(|n| n.node_type == INPUT_TYPE && !n.is_bypassed())
        .map(|n| {
            let props = n.merged_properties();
            let name = props
                .get("name")
                .and_then(|v| v.as_str().map(str::to_string))
                .or_else(|| n.name.clone())
                .unwrap_or_else(|| n.id.clone());
            let ty = props
                .get("type")
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse().ok())
                .unwrap_or_default();
            InputSlot {
                node_id: n.id.clone(),
                name,
                ty,
                has_default: props.get("value").is_some_and(|v| !v.is_null()),
                streaming: props
                    .get("streaming")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            }
        })
        .collect()
}

/// Turns the text of one value into a [`Value`]: text for a `str` input (so `007` stays
/// `"007"`), else JSON when it parses, else the text itself.
pub fn interpret(text: &str, ty: &PortType, from_file: bool) -> Value {
    // A file's final newline ends its last line; it is not part of the value (as with
    // the shell's `$(cat file)`).
    let text = if from_file {
        text.strip_suffix('\n')
            .map(|t| t.strip_suffix('\r').unwrap_or(t))
            .unwrap_or(text)
    } else {
        text
    };
    if *ty == PortType::Str {
        // A JSON string literal on the command line (`name='"x"'`) still means `x`.
        if !from_file && let Ok(serde_json::Value::String(s)) = serde_json::from_str(text) {
            return Value::str(s);
        }
        return Value::str(text);
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(j) => Value::from_json(j),
        Err(_) => Value::str(text),
    }
}

/// Matches `--input` arguments to the graph's inputs and checks that every input without
/// a default got a value. Every problem is reported at once.
pub fn resolve(
    doc: &GraphDoc,
    graph_path: &str,
    args: &[RawInput],
) -> Result<BTreeMap<String, Value>, UsageError> {
    let slots = input_slots(doc);
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    for a in args {
        match slots.iter().find(|s| s.name == a.name) {
            Some(slot) => {
                let v = interpret(&a.text, &slot.ty, a.file.is_some());
                if let Err(e) = slot.ty.check(&v) {
                    problems.push(format!(
                        "--input {}: value does not fit the input's type: {e}",
                        a.name
                    ));
                    continue;
                }
                if out.insert(a.name.clone(), slot.ty.coerce(v)).is_some() {
                    problems.push(format!("--input {} is given more than once", a.name));
                }
            }
            None => {
                let known: Vec<&str> = slots.iter().map(|s| s.name.as_str()).collect();
                problems.push(if known.is_empty() {
                    format!("--input {}: {graph_path} has no inputs", a.name)
                } else {
                    format!(
                        "--input {}: {graph_path} has no input of that name (inputs: {})",
                        a.name,
                        known.join(", ")
                    )
                });
            }
        }
    }
    for s in &slots {
        if !s.has_default && !s.streaming && !out.contains_key(&s.name) {
            problems.push(format!(
                "missing value for input `{}` (node {}, type {}): pass --input {}=VALUE",
                s.name, s.node_id, s.ty, s.name
            ));
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(UsageError::new(problems.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_syntax() {
        assert!(parse_arg("novalue").is_err());
        assert!(parse_arg("=x").is_err());
        let a = parse_arg("text=a=b").unwrap();
        assert_eq!((a.name.as_str(), a.text.as_str()), ("text", "a=b"));
        assert_eq!(parse_arg("x=@@y").unwrap().text, "@y");
        let e = parse_arg("x=@/nonexistent/file").unwrap_err();
        assert!(e.message.contains("/nonexistent/file"), "{e}");
    }

    #[test]
    fn values_are_json_else_text() {
        let any = PortType::Any;
        assert_eq!(interpret("42", &any, false), Value::Int(42));
        assert_eq!(interpret("[1,2]", &any, false).kind(), "list");
        assert_eq!(
            interpret("hello world", &any, false),
            Value::str("hello world")
        );
        assert_eq!(interpret("007", &PortType::Str, false), Value::str("007"));
        assert_eq!(interpret("\"q\"", &PortType::Str, false), Value::str("q"));
        assert_eq!(interpret("text\n", &any, true), Value::str("text"));
        assert_eq!(
            interpret("a\nb\n\n", &PortType::Str, true),
            Value::str("a\nb\n")
        );
    }

    #[test]
    fn missing_and_unknown_inputs_are_named() {
        let doc = GraphDoc::parse(
            r#"{"nodes":[{"id":"in","type":"heddle.input","properties":{"name":"text","type":"str"}},
                          {"id":"n","type":"heddle.input","properties":{"value":3}}]}"#,
            "g.json",
        )
        .unwrap();
        let err = resolve(&doc, "g.json", &[]).unwrap_err().message;
        assert!(err.contains("missing value for input `text`"), "{err}");
        assert!(!err.contains("`n`"), "{err}");
        let err = resolve(&doc, "g.json", &[parse_arg("txt=1").unwrap()])
            .unwrap_err()
            .message;
        assert!(
            err.contains("no input of that name (inputs: text, n)"),
            "{err}"
        );
        let ok = resolve(&doc, "g.json", &[parse_arg("text=5").unwrap()]).unwrap();
        assert_eq!(ok["text"], Value::str("5"));
    }
}
