//! Inputs given as text, `NAME=VALUE` (`heddle run --input`, an embedder's own flags or
//! form fields): each value read as its input's type, and all of them bound through the
//! plan, which checks names, types and missing values exactly as the kernel does, so a
//! program that takes inputs as text refuses what `heddle run` refuses, in its words.

use std::collections::BTreeMap;
use std::path::Path;

use heddle_core::Value;
use heddle_core::plan::{InputError, Plan};

pub use crate::streams::interpret;

/// One `NAME=VALUE` argument as written, before it is matched to an input node.
#[derive(Clone, Debug, PartialEq)]
pub struct RawInput {
    /// The input's name, before the first `=`.
    pub name: String,
    /// The value's text (a file's contents for `NAME=@file`).
    pub text: String,
    /// The file it came from, for `@file` values: such text is read as a whole
    /// document (see [`interpret`]).
    pub file: Option<String>,
}

/// Inputs that cannot be used as given: every problem found, one per line, each naming
/// the input (`--input NAME: ...`) and what fixes it. A mistake in the request, never a
/// failure of the run (the command line exits 2).
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.join("\n"))]
pub struct InputArgError {
    /// One line per problem, in the order the arguments were given.
    pub problems: Vec<String>,
}

impl InputArgError {
    fn one(problem: String) -> Self {
        InputArgError {
            problems: vec![problem],
        }
    }
}

/// Splits `NAME=VALUE` and reads `NAME=@file`. `@@x` stands for the literal text `@x`.
pub fn parse_arg(arg: &str) -> Result<RawInput, InputArgError> {
    let Some((name, value)) = arg.split_once('=') else {
        return Err(InputArgError::one(format!(
            "invalid --input `{arg}`: expected NAME=VALUE (or NAME=@FILE to read a file)"
        )));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(InputArgError::one(format!(
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
            InputArgError::one(format!("--input {name}: cannot read file `{path}`: {e}"))
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

/// Reads each argument as a value of its input's type and binds them all through the
/// plan of the graph at `graph_path` (named in the messages). Every problem is reported
/// at once.
pub fn resolve(
    plan: &Plan,
    graph_path: &str,
    args: &[RawInput],
) -> Result<BTreeMap<String, Value>, InputArgError> {
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
    Err(InputArgError { problems })
}

/// An input problem with the hint that fixes it.
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
        assert!(e.to_string().contains("/nonexistent/file"), "{e}");
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
        let err = resolve(&plan, "g.json", &[]).unwrap_err().to_string();
        assert!(err.contains("missing value for input `text`"), "{err}");
        assert!(err.contains("pass --input text=VALUE"), "{err}");
        assert!(!err.contains("`n`"), "{err}");
        let args = [parse_arg("txt=1").unwrap(), parse_arg("n=x").unwrap()];
        let err = resolve(&plan, "g.json", &args).unwrap_err().to_string();
        assert!(
            err.contains("--input txt: g.json has no input of that name (inputs: text, n)"),
            "{err}"
        );
        let args = [parse_arg("text=a").unwrap(), parse_arg("text=b").unwrap()];
        let err = resolve(&plan, "g.json", &args).unwrap_err().to_string();
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
