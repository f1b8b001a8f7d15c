//! Node types as a person reads them (`heddle nodes`): each declaration as a header
//! line with its flags (retry-safe, its mode, join) and origin, then a line per input,
//! output, property and capability it asks for.

use std::fmt::Write as _;

use heddle_core::{NodeDecl, NodeMode, PortDecl};

/// Appends declaration `d` to `out`: a header line with flags, then one line per port.
pub fn describe(out: &mut String, d: &NodeDecl) {
    let mut flags = Vec::new();
    if d.retry_safe {
        flags.push("retry-safe".to_string());
    }
    match d.mode {
        NodeMode::Buffered => {}
        NodeMode::StreamingOutput => flags.push("streaming-output".into()),
        NodeMode::StreamingInput => flags.push("streaming-input".into()),
        NodeMode::Controlled => flags.push("controlled".into()),
    }
    if d.is_join {
        flags.push("join".into());
    }
    let _ = write!(out, "{}", d.type_name);
    if !d.title.is_empty() {
        let _ = write!(out, " — {}", d.title);
    }
    if !flags.is_empty() {
        let _ = write!(out, "  [{}]", flags.join(", "));
    }
    if d.origin != heddle_core::Origin::Unnamed {
        let _ = write!(out, "  ({})", d.origin);
    }
    out.push('\n');
    for line in d.description.lines() {
        let _ = writeln!(out, "    {}", line.trim());
    }
    for p in &d.inputs {
        let _ = writeln!(out, "    in   {}", port(p));
    }
    for o in &d.outputs {
        let corr = match &o.correlation {
            heddle_core::OutputCorrelation::Single => String::new(),
            heddle_core::OutputCorrelation::Iteration { .. } => " (per item)".into(),
            heddle_core::OutputCorrelation::Chunk => " (chunks)".into(),
            heddle_core::OutputCorrelation::Aggregate => " (collects)".into(),
            heddle_core::OutputCorrelation::Forward { source } => format!(" (lineage of {source})"),
        };
        let desc = if o.description.is_empty() {
            String::new()
        } else {
            format!(" — {}", o.description)
        };
        let _ = writeln!(out, "    out  {}: {}{corr}{desc}", o.name, o.ty);
    }
    for p in &d.properties {
        let _ = writeln!(out, "    prop {}", port(p));
    }
    for c in &d.capabilities {
        let kind = serde_json::to_value(c.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(out, "    needs {kind} `{}`: {}", c.target, c.reason);
    }
}

/// An input or a property: `name: type (required) = default — description`.
fn port(p: &PortDecl) -> String {
    let mut s = format!("{}: {}", p.name, p.ty);
    if p.required {
        s.push_str(" (required)");
    }
    if let Some(d) = &p.default {
        let _ = write!(s, " = {}", serde_json::to_string(d).unwrap_or_default());
    }
    if !p.description.is_empty() {
        let _ = write!(s, " — {}", p.description);
    }
    s
}
