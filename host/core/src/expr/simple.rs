//! The fast path for the commonest condition, `path op literal` (`value > 0`,
//! `fields.status = "ok"`): evaluated straight on a [`Value`] without converting it to
//! JSON, so a condition on a hot edge costs a few comparisons instead of an engine run.
//!
//! It must agree with the JSONata engine exactly: anything whose meaning depends on
//! JSONata's sequence rules (a list met along the path or at its end) is handed back to
//! the engine (`None`), and a comparison JSONata refuses is refused with the same code.

use std::cmp::Ordering;

use super::{ExprError, Scope};
use crate::value::Value;

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Simple {
    path: Vec<String>,
    op: Op,
    literal: Literal,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Debug, PartialEq)]
enum Literal {
    Num(f64),
    Str(String),
    Bool(bool),
    Null,
}

impl Simple {
    /// Recognises `ident(.ident)* op literal`; anything else is `None` (the engine runs it).
    pub(super) fn parse(text: &str) -> Option<Simple> {
        let t = text.trim();
        let path_end = t
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(t.len());
        let path: Vec<String> = t[..path_end].split('.').map(str::to_string).collect();
        let ident_ok = |s: &String| {
            s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && !matches!(
                    s.as_str(),
                    "and" | "or" | "in" | "true" | "false" | "null" | "function"
                )
        };
        if path.is_empty() || !path.iter().all(ident_ok) {
            return None;
        }
        let rest = t[path_end..].trim_start();
        let (op, rest) = [
            ("!=", Op::Ne),
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("=", Op::Eq),
            ("<", Op::Lt),
            (">", Op::Gt),
        ]
        .into_iter()
        .find_map(|(s, op)| rest.strip_prefix(s).map(|r| (op, r.trim())))?;
        let literal = match rest {
            "true" => Literal::Bool(true),
            "false" => Literal::Bool(false),
            "null" => Literal::Null,
            s if s.len() >= 2
                && ((s.starts_with('"') && s.ends_with('"'))
                    || (s.starts_with('\'') && s.ends_with('\''))) =>
            {
                let inner = &s[1..s.len() - 1];
                // Escapes and embedded quotes are the engine's business.
                if inner.contains(['\\', '"', '\'']) {
                    return None;
                }
                Literal::Str(inner.to_string())
            }
            s => {
                // JSONata number literals: no sign (a leading `-` is an operator), no hex.
                if !s.starts_with(|c: char| c.is_ascii_digit())
                    || !s
                        .chars()
                        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
                {
                    return None;
                }
                Literal::Num(s.parse().ok().filter(|f: &f64| f.is_finite())?)
            }
        };
        Some(Simple { path, op, literal })
    }

    /// `Some(result)`, or `None` when the engine must decide (a list on the path).
    pub(super) fn eval(&self, scope: &dyn Scope, text: &str) -> Option<Result<bool, ExprError>> {
        let mut cur = scope.top(&self.path[0]);
        for seg in &self.path[1..] {
            cur = match cur {
                None => None,
                Some(Value::Object(m)) => m.get(seg),
                Some(Value::List(_)) => return None,
                // A step into a scalar selects nothing.
                Some(_) => None,
            };
        }
        let Some(v) = cur else {
            // An undefined operand makes every comparison false.
            return Some(Ok(false));
        };
        if matches!(v, Value::List(_)) {
            return None;
        }
        Some(
            match self.op {
                Op::Eq => Ok(self.equal(v)),
                Op::Ne => Ok(!self.equal(v)),
                _ => self.order(v).map(|o| match (self.op, o) {
                    (Op::Lt, o) => o == Ordering::Less,
                    (Op::Le, o) => o != Ordering::Greater,
                    (Op::Gt, o) => o == Ordering::Greater,
                    (_, o) => o != Ordering::Less,
                }),
            }
            .map_err(|message| ExprError::Eval {
                expression: text.to_string(),
                message,
            }),
        )
    }

    fn equal(&self, v: &Value) -> bool {
        match (&self.literal, v) {
            (Literal::Num(n), Value::Int(i)) => *i as f64 == *n,
            (Literal::Num(n), Value::Float(f)) => f == n,
            (Literal::Str(s), Value::Str(x)) => **x == **s,
            (Literal::Bool(b), Value::Bool(x)) => b == x,
            (Literal::Null, Value::Null) => true,
            _ => false,
        }
    }

    /// JSONata orders two numbers or two strings; anything else is an error (T2010 for
    /// a value that is neither, T2009 for a number against a string).
    fn order(&self, v: &Value) -> Result<Ordering, String> {
        let bad = "T2010: the expressions either side of the operator must evaluate to numeric or string values";
        match (&self.literal, v) {
            (Literal::Num(n), Value::Int(_) | Value::Float(_)) => {
                // Finite on both sides: JSON has no NaN and the literal was checked.
                Ok(v.as_f64()
                    .unwrap_or(0.0)
                    .partial_cmp(n)
                    .unwrap_or(Ordering::Equal))
            }
            (Literal::Str(s), Value::Str(x)) => Ok((**x).cmp(s.as_str())),
            (Literal::Num(_), Value::Str(_))
            | (Literal::Str(_), Value::Int(_) | Value::Float(_)) => Err(
                "T2009: the values either side of the operator must be of the same data type"
                    .into(),
            ),
            _ => Err(bad.into()),
        }
    }
}
