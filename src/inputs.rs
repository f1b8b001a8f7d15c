//! `--input NAME=VALUE` arguments: read from the command line (and `@file`s), turned into
//! values of their inputs' types, and bound through the plan.

use std::collections::BTreeMap;
use std::path::Path;

use heddle_core::Value;
use heddle_core::plan::{InputError, Plan};

use crate::exit::UsageError;

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

pub use heddle_runtime::streams::interpret;

/// Reads each `--input` as a value of its input's type and binds them all through the
/// plan, which checks names, types and missing values as the kernel does. Every problem
/// is reported at once, worded for the command line.
pub fn resolve(
    plan: &Plan,
    graph_path: &str,
    args: &[RawInput],
) -> Result<BTreeMap<String, Value>, UsageError> {
    let mut values = BTreeMap::new();
    let mut problems = Vec::new();
    for a in args {
        // An unknown name is reported by the binding below; until then it reads untyped.
        let ty = plan
            .input(&a.name)
            .map(|i| i.ty.clone())
            .unwrap_or_default();
        let v = interpret(&a.text, &ty, a.file.is_some());
        if values.insert(a.name.clone(), v).is_some() {
            problems.push(format!("--input {} is given more than once", a.name));
        }
    }
    match plan.bind_inputs(&values) {
        Ok(_) if problems.is_empty() => return Ok(values),
        Ok(_) => {}
        Err(errors) => problems.extend(errors.0.iter().map(|e| explain(e, graph_path))),
    }
    Err(UsageError::new(problems.join("\n")))
}

/// An input problem with the command-line hint that fixes it.
fn explain(e: &InputError, graph_path: &str) -> String {
    match e {
        InputError::Unknown { name, known } if known.is_empty() => {
            format!("--input {name}: {graph_path} has no inputs")
        }
        InputError::Unknown { name, known } => format!(
            "--input {name}: {graph_path} has no input of that name (inputs: {})",
            known.join(", ")
        ),
        InputError::Type { name, .. } => format!("--input {name}: {e}"),
        InputError::Missing { name, .. } => format!("{e}: pass --input {name}=VALUE"),
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
    fn missing_and_unknown_inputs_are_named() {
        let doc = heddle_core::GraphDoc::parse(
            r#"{"nodes":[{"id":"in","type":"heddle.input","properties":{"name":"text","type":"str"}},
                          {"id":"n","type":"heddle.input","properties":{"value":3}}]}"#,
            "g.json",
        )
        .unwrap();
        let plan =
            heddle_core::plan::plan(&doc, &heddle_kernel::Registry::with_builtins()).unwrap();
        let err = resolve(&plan, "g.json", &[]).unwrap_err().message;
        assert!(err.contains("missing value for input `text`"), "{err}");
        assert!(err.contains("pass --input text=VALUE"), "{err}");
        assert!(!err.contains("`n`"), "{err}");
        let args = [parse_arg("txt=1").unwrap(), parse_arg("n=x").unwrap()];
        let err = resolve(&plan, "g.json", &args).unwrap_err().message;
        assert!(
            err.contains("--input txt: g.json has no input of that name (inputs: text, n)"),
            "{err}"
        );
        let args = [parse_arg("text=a").unwrap(), parse_arg("text=b").unwrap()];
        let err = resolve(&plan, "g.json", &args).unwrap_err().message;
        assert!(
            err.contains("--input text is given more than once"),
            "{err}"
        );
        let ok = resolve(&plan, "g.json", &[parse_arg("text=5").unwrap()]).unwrap();
        assert_eq!(ok["text"], Value::str("5"));
    }

    /// The command line names an input exactly as the kernel does (the plan names both),
    /// also when a node has both a `name` field and a `name` property.
    #[test]
    fn inputs_are_named_as_the_plan_names_them() {
        let doc = heddle_core::GraphDoc::parse(
            r#"{"nodes":[{"id":"in","name":"field","type":"heddle.input","properties":{"name":"prop"}}]}"#,
            "g.json",
        )
        .unwrap();
        let plan =
            heddle_core::plan::plan(&doc, &heddle_kernel::Registry::with_builtins()).unwrap();
        let name = plan.inputs()[0].name.to_string();
        let ok = resolve(&plan, "g.json", &[parse_arg(&format!("{name}=1")).unwrap()]).unwrap();
        assert!(plan.bind_inputs(&ok).is_ok());
        let other = if name == "field" { "prop" } else { "field" };
        assert!(
            resolve(
                &plan,
                "g.json",
                &[parse_arg(&format!("{other}=1")).unwrap()]
            )
            .is_err()
        );
    }
}
