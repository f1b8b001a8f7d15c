//! The `std` package: pure text, math, json and list nodes. Every node here is a pure
//! function of its inputs, so all of them are retry-safe.

use std::collections::BTreeMap;

use heddle_sdk::{Correlation, Decl, Error, Inputs, Node, Outputs, Value, emit, node};

// ----- text -----------------------------------------------------------------------

node! {
    /// Concatenate strings.
    /// Joins `a` and `b` with the optional separator `sep`.
    #[node("std.text.concat", retry_safe, reuse_instance)]
    pub fn concat(a: String, b: String, sep: String = "") -> text: String {
        Ok(format!("{a}{sep}{b}"))
    }
}

node! {
    /// Fill a template.
    /// Replaces `{name}` placeholders in `template` with fields of `values` (any value;
    /// non-strings are written as JSON). `{{` and `}}` are literal braces. A placeholder
    /// with no value is an error naming it.
    #[node("std.text.format", retry_safe)]
    pub fn format(template: String, values: BTreeMap<String, Value> = BTreeMap::new()) -> text: String {
        render(&template, &values)
    }
}

fn render(template: &str, values: &BTreeMap<String, Value>) -> Result<String, Error> {
    let mut out = String::with_capacity(template.len());
    let mut chars = template.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' if matches!(chars.peek(), Some((_, '{'))) => {
                chars.next();
                out.push('{');
            }
            '}' if matches!(chars.peek(), Some((_, '}'))) => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let rest = &template[i + 1..];
                let Some(end) = rest.find('}') else {
                    return Err(
                        Error::new(format!("unclosed `{{` at byte {i} of the template"))
                            .signature("format:syntax"),
                    );
                };
                let key = rest[..end].trim();
                let v = values.get(key).ok_or_else(|| {
                    Error::new(format!("template placeholder `{key}` has no value"))
                        .signature("format:missing")
                })?;
                out.push_str(&v.to_text());
                for _ in 0..rest[..end].chars().count() + 1 {
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

node! {
    /// Split text.
    /// Splits `text` on `sep` (default: any whitespace); `limit` caps the number of parts.
    #[node("std.text.split", retry_safe)]
    pub fn split(text: String, sep: Option<String>, limit: Option<i64>) -> parts: Vec<String> {
        let limit = limit.filter(|l| *l > 0).map(|l| l as usize);
        Ok(match (sep.as_deref(), limit) {
            (None | Some(""), _) => {
                let it = text.split_whitespace().map(String::from);
                match limit { Some(n) => it.take(n).collect(), None => it.collect() }
            }
            (Some(s), Some(n)) => text.splitn(n, s).map(String::from).collect(),
            (Some(s), None) => text.split(s).map(String::from).collect(),
        })
    }
}

node! {
    /// Join strings.
    /// Joins `items` (any values; non-strings as JSON) with `sep`.
    #[node("std.text.join", retry_safe)]
    pub fn join(items: Vec<Value>, sep: String = "") -> text: String {
        Ok(items.iter().map(Value::to_text).collect::<Vec<_>>().join(&sep))
    }
}

fn regex(pattern: &str) -> Result<regex::Regex, Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| Error::new(format!("bad regex `{pattern}`: {e}")).signature("regex:syntax"))
}

node! {
    /// Match a regex.
    /// Whether `pattern` matches `text`, the first match, its capture groups (unmatched
    /// groups are empty strings) and every match.
    #[node("std.text.regex_match", retry_safe)]
    pub fn regex_match(text: String, pattern: String)
        -> (matched: bool, first: Option<String>, groups: Vec<String>, all: Vec<String>)
    {
        let re = regex(&pattern)?;
        let all: Vec<String> = re.find_iter(&text).map(|m| m.as_str().to_string()).collect();
        let groups = re
            .captures(&text)
            .map(|c| c.iter().skip(1).map(|g| g.map_or(String::new(), |m| m.as_str().to_string())).collect())
            .unwrap_or_default();
        Ok((!all.is_empty(), all.first().cloned(), groups, all))
    }
}

node! {
    /// Replace by regex.
    /// Replaces matches of `pattern` in `text` with `replacement` (`$1`, `${name}` refer
    /// to groups); `all = false` replaces only the first.
    #[node("std.text.regex_replace", retry_safe)]
    pub fn regex_replace(text: String, pattern: String, replacement: String, all: bool = true) -> text: String {
        let re = regex(&pattern)?;
        Ok(if all {
            re.replace_all(&text, replacement.as_str()).into_owned()
        } else {
            re.replace(&text, replacement.as_str()).into_owned()
        })
    }
}

node! {
    /// Change case.
    /// `mode`: upper, lower, title, snake or kebab.
    #[node("std.text.case", retry_safe, reuse_instance)]
    pub fn case(text: String, mode: String = "upper") -> text: String {
        let words = || {
            text.split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        };
        Ok(match mode.as_str() {
            "upper" => text.to_uppercase(),
            "lower" => text.to_lowercase(),
            "title" => text
                .split(' ')
                .map(|w| {
                    let mut c = w.chars();
                    match c.next() {
                        Some(f) => f.to_uppercase().chain(c.flat_map(char::to_lowercase)).collect(),
                        None => String::new(),
                    }
                })
                .collect::<Vec<String>>()
                .join(" "),
            "snake" => words().join("_"),
            "kebab" => words().join("-"),
            other => {
                return Err(Error::new(format!("unknown case mode `{other}` (upper, lower, title, snake, kebab)"))
                    .signature("case:mode"))
            }
        })
    }
}

/// Streams the lines of a text, one item each (a fan-out source).
pub struct Lines;

impl Node for Lines {
    const TYPE: &'static str = "std.text.lines";

    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Lines")
            .description("Emits each line of `text` as it goes, as one item of a new scope; returns the count.")
            .input::<String>("text", "Text to split into lines")
            .input_default::<bool>("skip_empty", true, "Skip empty lines")
            .output_with::<String>("line", Correlation::Iteration, "One line")
            .output::<i64>("count", "Number of lines emitted")
            .streaming_output()
            .retry_safe()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let text: String = inputs.get("text")?;
        let skip: bool = inputs.get_or("skip_empty", true)?;
        let mut n = 0i64;
        for line in text.lines() {
            if skip && line.trim().is_empty() {
                continue;
            }
            if heddle_sdk::cancelled() {
                return Err(Error::new("cancelled"));
            }
            emit("line", line.to_string())?;
            n += 1;
        }
        Ok(Outputs::one("count", n))
    }
}

// ----- math -----------------------------------------------------------------------

fn num(v: &Value, what: &str) -> Result<f64, Error> {
    v.as_f64().ok_or_else(|| {
        Error::new(format!("{what}: expected a number, got {}", v.kind())).signature("input:type")
    })
}

/// Integer result when both operands are ints and the operation stays exact.
fn arith_value(op: &str, a: &Value, b: &Value) -> Result<Value, Error> {
    if let (Value::Int(x), Value::Int(y)) = (a, b) {
        let r = match op {
            "add" => x.checked_add(*y),
            "sub" => x.checked_sub(*y),
            "mul" => x.checked_mul(*y),
            "mod" if *y != 0 => x.checked_rem(*y),
            "pow" if (0..=u32::MAX as i64).contains(y) => x.checked_pow(*y as u32),
            _ => None,
        };
        if let Some(r) = r {
            return Ok(Value::Int(r));
        }
    }
    let (x, y) = (num(a, "a")?, num(b, "b")?);
    let r = match op {
        "add" => x + y,
        "sub" => x - y,
        "mul" => x * y,
        "div" if y == 0.0 => return Err(Error::new("division by zero").signature("math:div0")),
        "div" => x / y,
        "mod" if y == 0.0 => return Err(Error::new("modulo by zero").signature("math:div0")),
        "mod" => x % y,
        "pow" => x.powf(y),
        "min" => x.min(y),
        "max" => x.max(y),
        other => {
            return Err(Error::new(format!(
                "unknown operation `{other}` (add, sub, mul, div, mod, pow, min, max)"
            ))
            .signature("math:op"));
        }
    };
    Ok(Value::Float(r))
}

node! {
    /// Arithmetic.
    /// `a <op> b` with `op` one of add, sub, mul, div, mod, pow, min, max. Two ints give an
    /// int when the result is exact; otherwise a float.
    #[node("std.math.arith", retry_safe, reuse_instance)]
    pub fn arith(a: Value, b: Value, op: String = "add") -> result: Value {
        arith_value(&op, &a, &b)
    }
}

node! {
    /// Compare.
    /// `a <op> b` with `op` one of eq, ne, lt, le, gt, ge. Numbers compare numerically,
    /// strings lexically; eq/ne compare any values.
    #[node("std.math.compare", retry_safe)]
    pub fn compare(a: Value, b: Value, op: String = "eq") -> result: bool {
        use std::cmp::Ordering;
        let ord = match (&a, &b) {
            (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
            _ => match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => x.partial_cmp(&y),
                _ => None,
            },
        };
        let eq = ord.map_or(a == b, |o| o == Ordering::Equal);
        Ok(match op.as_str() {
            "eq" => eq,
            "ne" => !eq,
            o @ ("lt" | "le" | "gt" | "ge") => {
                let ord = ord.ok_or_else(|| {
                    Error::new(format!("cannot order {} and {}", a.kind(), b.kind())).signature("compare:types")
                })?;
                match o {
                    "lt" => ord == Ordering::Less,
                    "le" => ord != Ordering::Greater,
                    "gt" => ord == Ordering::Greater,
                    _ => ord != Ordering::Less,
                }
            }
            other => {
                return Err(Error::new(format!("unknown comparison `{other}` (eq, ne, lt, le, gt, ge)"))
                    .signature("compare:op"))
            }
        })
    }
}

node! {
    /// Aggregate a list of numbers.
    /// `op`: sum, product, min, max, mean or count. Empty lists give 0 for sum and count,
    /// 1 for product, and an error for min, max and mean.
    #[node("std.math.aggregate", retry_safe)]
    pub fn aggregate(items: Vec<f64>, op: String = "sum") -> result: f64 {
        let empty = || Error::new(format!("cannot take the {op} of an empty list")).signature("math:empty");
        Ok(match op.as_str() {
            "sum" => items.iter().sum(),
            "product" => items.iter().product(),
            "count" => items.len() as f64,
            "min" => items.iter().copied().reduce(f64::min).ok_or_else(empty)?,
            "max" => items.iter().copied().reduce(f64::max).ok_or_else(empty)?,
            "mean" if items.is_empty() => return Err(empty()),
            "mean" => items.iter().sum::<f64>() / items.len() as f64,
            other => {
                return Err(Error::new(format!("unknown aggregate `{other}` (sum, product, min, max, mean, count)"))
                    .signature("math:op"))
            }
        })
    }
}

/// Running sum over a stream of numbers (a streaming-input node).
pub struct RunningSum;

impl Node for RunningSum {
    const TYPE: &'static str = "std.math.running_sum";

    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Running sum")
            .description("Reads numbers as they arrive on `value`, emits the running total on `total` after each, and returns the final total on `sum`.")
            .input::<f64>("value", "Numbers to add")
            .output_with::<f64>("total", Correlation::Chunk, "Running total after each value")
            .output_with::<f64>("sum", Correlation::Aggregate, "Final total")
            .streaming_input()
    }

    fn run(_inputs: &mut Inputs) -> Result<Outputs, Error> {
        let mut total = 0.0;
        while let Some((_, v)) = heddle_sdk::next_input() {
            total += num(&v, "value")?;
            emit("total", total)?;
        }
        Ok(Outputs::one("sum", total))
    }
}

// ----- json -----------------------------------------------------------------------

node! {
    /// Parse JSON.
    /// Parses `text`. Malformed JSON is a recoverable error (signature `json:parse`)
    /// carrying the raw text as the candidate output, so a supervisor can repair it.
    #[node("std.json.parse", retry_safe)]
    pub fn json_parse(text: String) -> value: Value {
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(j) => Ok(Value::from_json(j)),
            Err(e) => Err(Error::new(format!("invalid JSON: {e}"))
                .signature("json:parse")
                .candidate("value", text)),
        }
    }
}

fn get_path(v: &Value, path: &str) -> Option<Value> {
    let mut cur = v;
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        cur = match cur {
            Value::Object(m) => m.get(seg)?,
            Value::List(l) => {
                let i: i64 = seg.parse().ok()?;
                let i = if i < 0 { l.len() as i64 + i } else { i };
                l.get(usize::try_from(i).ok()?)?
            }
            _ => return None,
        };
    }
    Some(cur.clone())
}

node! {
    /// Get by path.
    /// Reads `path` (dot-separated keys and list indexes, e.g. `items.0.name`; negative
    /// indexes count from the end) from `value`. A missing path gives `default` when set,
    /// else an error.
    #[node("std.json.get", retry_safe)]
    pub fn json_get(value: Value, path: String, default: Option<Value>) -> value: Value {
        match get_path(&value, &path) {
            Some(v) => Ok(v),
            None => default.ok_or_else(|| Error::new(format!("path `{path}` not found")).signature("json:path")),
        }
    }
}

node! {
    /// Stringify as JSON.
    /// Writes `value` as JSON text; `pretty` indents it.
    #[node("std.json.stringify", retry_safe)]
    pub fn json_stringify(value: Value, pretty: bool = false) -> text: String {
        let j = value.to_json();
        if pretty { serde_json::to_string_pretty(&j) } else { serde_json::to_string(&j) }
            .map_err(|e| Error::new(e.to_string()))
    }
}

// ----- list -----------------------------------------------------------------------

node! {
    /// List length.
    #[node("std.list.length", retry_safe)]
    pub fn length(items: Vec<Value>) -> length: i64 {
        Ok(items.len() as i64)
    }
}

node! {
    /// Slice a list.
    /// Items from `start` (inclusive) to `end` (exclusive); negative positions count from
    /// the end; positions are clamped to the list.
    #[node("std.list.slice", retry_safe)]
    pub fn slice(items: Vec<Value>, start: i64 = 0i64, end: Option<i64>) -> items: Vec<Value> {
        let n = items.len() as i64;
        let norm = |i: i64| (if i < 0 { n + i } else { i }).clamp(0, n) as usize;
        let (s, e) = (norm(start), norm(end.unwrap_or(n)));
        Ok(if s < e { items[s..e].to_vec() } else { Vec::new() })
    }
}

fn order(a: &Value, b: &Value) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x.cmp(y),
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            // Mixed kinds: group by kind name so the order is total and stable.
            _ => a
                .kind()
                .cmp(b.kind())
                .then_with(|| a.to_text().cmp(&b.to_text())),
        },
    }
}

node! {
    /// Sort a list.
    /// Numbers numerically, strings lexically; `key` sorts objects by that field;
    /// `descending` reverses. The sort is stable.
    #[node("std.list.sort", retry_safe)]
    pub fn sort(items: Vec<Value>, key: Option<String>, descending: bool = false) -> items: Vec<Value> {
        let mut items = items;
        let k = |v: &Value| match (&key, v) {
            (Some(k), Value::Object(m)) => m.get(k).cloned().unwrap_or(Value::Null),
            _ => v.clone(),
        };
        items.sort_by(|a, b| order(&k(a), &k(b)));
        if descending {
            items.reverse();
        }
        Ok(items)
    }
}

node! {
    /// Unique items.
    /// Drops repeated items, keeping the first occurrence and the order.
    #[node("std.list.unique", retry_safe)]
    pub fn unique(items: Vec<Value>) -> items: Vec<Value> {
        let mut seen = std::collections::HashSet::new();
        Ok(items.into_iter().filter(|v| seen.insert(v.to_json().to_string())).collect())
    }
}

node! {
    /// Zip lists.
    /// Pairs items of `a` and `b` position by position into two-item lists, stopping at
    /// the shorter list.
    #[node("std.list.zip", retry_safe)]
    pub fn zip(a: Vec<Value>, b: Vec<Value>) -> pairs: Vec<Vec<Value>> {
        Ok(a.into_iter().zip(b).map(|(x, y)| vec![x, y]).collect())
    }
}

heddle_sdk::export_nodes!(
    concat,
    format,
    split,
    join,
    regex_match,
    regex_replace,
    case,
    Lines,
    arith,
    compare,
    aggregate,
    RunningSum,
    json_parse,
    json_get,
    json_stringify,
    length,
    slice,
    sort,
    unique,
    zip,
);
