//! JSONata expressions: edge conditions (`when`) and check-node assertions.
//!
//! JSONata because a graph is data a user wrote: an expression is parsed and evaluated,
//! never executed as code, and it reads the same in every tool that speaks JSONata.
//! [`Expr::compile`] parses once, at planning, so a typo is refused before any node
//! starts; evaluation never panics and never runs longer than [`EVAL_LIMIT_MS`].
//!
//! The engine is one crate behind `engine` (chosen by measuring candidates against the
//! jsonata-js reference suite; `scripts/jsonata-suite` reruns that measurement). A few
//! of its gaps would only show at run time, so [`Expr::compile`] also refuses the
//! functions the engine does not implement. The commonest condition shape
//! (`path op literal`) has an exact fast path in `simple`.

mod engine;
mod simple;

use std::sync::Arc;

use crate::value::Value;

/// Wall-clock bound of one evaluation (a pathological expression must not stall a node).
pub const EVAL_LIMIT_MS: u64 = 1000;

/// Why an expression was refused or failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExprError {
    /// The text does not parse (found when the graph is planned).
    #[error("invalid JSONata expression `{expression}`: {message}")]
    Syntax {
        /// The expression as written.
        expression: String,
        /// The parser's account of what is wrong.
        message: String,
    },
    /// It parses but uses a part of JSONata this build leaves out (found when planned).
    #[error("JSONata expression `{expression}` uses {feature}, which this build does not support")]
    Unsupported {
        /// The expression as written.
        expression: String,
        /// The construct it uses.
        feature: String,
    },
    /// It calls a function JSONata does not have (found when planned).
    #[error("JSONata expression `{expression}` uses the unknown function ${name}()")]
    UnknownFunction {
        /// The expression as written.
        expression: String,
        /// The function's name, without the `$`.
        name: String,
    },
    /// Evaluating it failed on this value (at run time), or took longer than
    /// [`EVAL_LIMIT_MS`].
    #[error("JSONata expression `{expression}` failed: {message}")]
    Eval {
        /// The expression as written.
        expression: String,
        /// What went wrong.
        message: String,
    },
    /// A condition or assertion yielded something other than a boolean; it is not
    /// taken as truthy, so a typo cannot quietly route every value one way.
    #[error("JSONata expression `{expression}` must yield true or false, got {found}")]
    NotBoolean {
        /// The expression as written.
        expression: String,
        /// What it yielded instead ("a number", "a string"...).
        found: &'static str,
    },
}

/// What an expression reads: named top-level values (`value`, `fields`, `upstream`).
pub trait Scope {
    /// The value bound to a top-level name, if any.
    fn top(&self, name: &str) -> Option<&Value>;
    /// The whole scope as the JSON object the engine evaluates against.
    fn to_json(&self) -> serde_json::Value;
}

/// An object value is a scope of its keys.
impl Scope for Value {
    fn top(&self, name: &str) -> Option<&Value> {
        self.as_object().and_then(|m| m.get(name))
    }

    fn to_json(&self) -> serde_json::Value {
        Value::to_json(self)
    }
}

/// A parsed expression, cheap to share between actors.
#[derive(Clone)]
pub struct Expr {
    text: Arc<str>,
    simple: Option<simple::Simple>,
    program: Arc<engine::Program>,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Expr({:?})", self.text)
    }
}

impl Expr {
    /// Parses `text`; refuses a syntax error and any feature the engine lacks.
    pub fn compile(text: &str) -> Result<Expr, ExprError> {
        let (called, bound) = names(text);
        for name in called {
            if engine::REFUSED_FUNCTIONS.contains(&name) {
                return Err(ExprError::Unsupported {
                    expression: text.to_string(),
                    feature: format!("the function ${name}()"),
                });
            }
            // A name the expression binds (`$f := …`, a lambda's `$f`) is its own.
            if !BUILTINS.contains(&name) && !bound.contains(&name) {
                return Err(ExprError::UnknownFunction {
                    expression: text.to_string(),
                    name: name.to_string(),
                });
            }
        }
        let program = engine::Program::parse(text).map_err(|message| ExprError::Syntax {
            expression: text.to_string(),
            message,
        })?;
        Ok(Expr {
            text: Arc::from(text),
            simple: simple::Simple::parse(text),
            program: Arc::new(program),
        })
    }

    /// The expression as written, for messages and for writing the graph back.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The paths the expression reads from its scope, each as its leading names:
    /// `fields.amount > 100 and value.ok` reads `[["fields", "amount"], ["value", "ok"]]`.
    /// What the planner's review warnings check against the declarations (a condition
    /// over fields the producer never declared); inside a predicate or a lambda the
    /// context is something else, and those paths are not listed.
    pub fn reads(&self) -> Vec<Vec<String>> {
        self.program.reads()
    }

    /// Evaluates against `scope`; `None` is JSONata's undefined (nothing selected).
    pub fn eval(&self, scope: &dyn Scope) -> Result<Option<Value>, ExprError> {
        self.program
            .eval(&scope.to_json())
            .map(|r| r.map(Value::from_json))
            .map_err(|message| self.failed(message))
    }

    /// Evaluates a condition: `true` or `false`; undefined (a path that selects nothing)
    /// is false, as in every JSONata comparison; any other result is an error, never a
    /// quiet false.
    pub fn test(&self, scope: &dyn Scope) -> Result<bool, ExprError> {
        if let Some(fast) = &self.simple
            && let Some(r) = fast.eval(scope, &self.text)
        {
            return r;
        }
        match self.eval(scope)? {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(b),
            Some(other) => Err(ExprError::NotBoolean {
                expression: self.text.to_string(),
                found: match other {
                    Value::Int(_) | Value::Float(_) => "a number",
                    Value::Str(_) => "a string",
                    Value::List(_) => "an array",
                    _ => "an object",
                },
            }),
        }
    }

    fn failed(&self, message: String) -> ExprError {
        ExprError::Eval {
            expression: self.text.to_string(),
            message,
        }
    }
}

/// JSONata's built-in functions (jsonata-js 2.x).
const BUILTINS: &[&str] = &[
    "sum",
    "count",
    "max",
    "min",
    "average",
    "string",
    "substring",
    "substringBefore",
    "substringAfter",
    "lowercase",
    "uppercase",
    "length",
    "trim",
    "pad",
    "match",
    "contains",
    "replace",
    "split",
    "join",
    "formatNumber",
    "formatBase",
    "formatInteger",
    "parseInteger",
    "number",
    "floor",
    "ceil",
    "round",
    "abs",
    "sqrt",
    "power",
    "random",
    "boolean",
    "not",
    "map",
    "zip",
    "filter",
    "single",
    "reduce",
    "sift",
    "keys",
    "lookup",
    "append",
    "exists",
    "spread",
    "merge",
    "reverse",
    "each",
    "error",
    "assert",
    "type",
    "sort",
    "shuffle",
    "distinct",
    "base64encode",
    "base64decode",
    "encodeUrlComponent",
    "encodeUrl",
    "decodeUrlComponent",
    "decodeUrl",
    "eval",
    "toMillis",
    "fromMillis",
    "clone",
    "now",
    "millis",
    "uuid",
];

/// The `$names` of `text` outside string literals and comments: those called
/// (`$name(`), and those also written without a call (bound or passed somewhere).
fn names(text: &str) -> (Vec<&str>, Vec<&str>) {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut bare = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'' | b'`') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..].find("*/").map_or(b.len(), |j| i + 2 + j + 2);
            }
            b'$' => {
                let start = i + 1;
                let mut j = start;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                let rest = text[j..].trim_start();
                if j > start {
                    if rest.starts_with('(') {
                        out.push(&text[start..j]);
                    } else {
                        bare.push(&text[start..j]);
                    }
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    (out, bare)
}

#[cfg(test)]
mod tests;
