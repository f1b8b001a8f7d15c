//! The policy handle: a TOML rules file mapping failures to verdicts, for deterministic
//! unattended runs.
//!
//! ```toml
//! default = "fail"                # when no rule matches: fail (default) or skip
//!
//! [[rule]]
//! name = "flaky upstream"         # optional, shown in the fail reason / logs
//! node_type = "std.http.*"        # optional, `*` matches any run of characters
//! node = "fetch"                  # optional node id (same glob syntax)
//! signature = "http:5*"           # optional failure signature (same glob syntax)
//! message = "(?i)timed? ?out"     # optional regular expression over the error detail
//! verdict = "retry"               # retry | substitute | skip | end_stream | fail
//! apply_to = "signature"          # skip/fail only: stick to later identical failures
//! reason = "upstream is down"     # fail only: becomes the run's error summary
//! outputs = { value = 0 }         # substitute only: the replacement outputs
//! ```
//!
//! Rules are tried in file order; the first whose conditions all hold *and* whose
//! verdict is in the escalation's allowed set wins, so a file can say "retry, and where
//! retry is not allowed, skip". Every problem (bad TOML, unknown key or verdict, bad
//! pattern) is reported before the run, naming the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use heddle_core::supervise::{ApplyTo, DecidedBy, Decision, Escalation, Verdict, VerdictAction};
use heddle_core::{NodeMode, Value};
use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use super::{DecideCtx, Supervisor, SupervisorError};
use crate::executor::BoxFuture;

/// A policy file's text is not a valid policy: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}:{line}:{column}: {message}")]
pub struct PolicyError {
    /// The file (or `<policy>` for text given directly).
    pub origin: String,
    /// Where the problem is: its line (from 1).
    pub line: usize,
    /// Its column (from 1).
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// Why [`Policy::load`] failed: the file could not be read (the I/O error kept as the
/// source, so "not found" and "permission denied" stay distinguishable), or its text is
/// not a valid policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyLoadError {
    /// The file could not be read.
    #[error("cannot read the policy file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Its text is not a valid policy.
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    default: Option<Spanned<String>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    node: Option<Spanned<String>>,
    #[serde(default)]
    node_type: Option<Spanned<String>>,
    #[serde(default)]
    signature: Option<Spanned<String>>,
    #[serde(default)]
    message: Option<Spanned<String>>,
    verdict: Spanned<String>,
    #[serde(default)]
    apply_to: Option<Spanned<String>>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    outputs: Option<Spanned<BTreeMap<String, Value>>>,
}

#[derive(Debug)]
struct Rule {
    label: String,
    node: Option<Regex>,
    node_type: Option<Regex>,
    signature: Option<Regex>,
    message: Option<Regex>,
    verdict: Verdict,
}

impl Rule {
    fn matches(&self, e: &Escalation) -> bool {
        let m = |re: &Option<Regex>, s: &str| re.as_ref().is_none_or(|r| r.is_match(s));
        m(&self.node, &e.node_id)
            && m(&self.node_type, &e.node_type)
            && match &self.signature {
                None => true,
                Some(r) => e
                    .failure_signature
                    .as_deref()
                    .is_some_and(|s| r.is_match(s)),
            }
            && m(&self.message, &e.detail)
    }
}

/// A loaded, checked policy.
#[derive(Debug)]
/// A supervisor handle that decides by rules (node type, failure signature, message
/// pattern → verdict) from a TOML file (`heddle run --policy`).
pub struct Policy {
    rules: Vec<Rule>,
    default: Verdict,
}

impl Policy {
    /// The policy in the file `path`; every problem names the file, line and column.
    pub fn load(path: &Path) -> Result<Self, PolicyLoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyLoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Policy::parse(&text, &path.display().to_string())?)
    }

    /// The policy in `text` (named `origin` in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Self, PolicyError> {
        let at = |span: std::ops::Range<usize>, message: String| {
            let (line, column) = line_col(text, span.start);
            PolicyError {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            at(span, e.message().to_string())
        })?;
        let default = match &raw.default {
            None => Verdict::fail("no policy rule matched this failure"),
            Some(d) => match d.get_ref().parse::<VerdictAction>() {
                Ok(VerdictAction::Fail) => Verdict::fail("no policy rule matched this failure"),
                Ok(VerdictAction::Skip) => Verdict::skip(),
                Ok(other) => {
                    return Err(at(
                        d.span(),
                        format!("`default` must be fail or skip, not {other}"),
                    ));
                }
                Err(e) => return Err(at(d.span(), e.to_string())),
            },
        };
        let mut rules = Vec::new();
        for (i, r) in raw.rule.into_iter().enumerate() {
            let rule_span = r.span();
            let r = r.into_inner();
            let glob = |g: &Option<Spanned<String>>| -> Result<Option<Regex>, PolicyError> {
                g.as_ref()
                    .map(|g| {
                        glob_regex(g.get_ref())
                            .map_err(|e| at(g.span(), format!("bad pattern: {e}")))
                    })
                    .transpose()
            };
            let message = r
                .message
                .as_ref()
                .map(|m| {
                    Regex::new(m.get_ref())
                        .map_err(|e| at(m.span(), format!("bad `message` regular expression: {e}")))
                })
                .transpose()?;
            let action: VerdictAction = r.verdict.get_ref().parse().map_err(
                |e: heddle_core::supervise::UnknownVerdict| at(r.verdict.span(), e.to_string()),
            )?;
            let apply_to = match &r.apply_to {
                None => ApplyTo::Invocation,
                Some(a) => match a.get_ref().as_str() {
                    "invocation" => ApplyTo::Invocation,
                    "signature" => {
                        if !matches!(action, VerdictAction::Skip | VerdictAction::Fail) {
                            return Err(at(
                                a.span(),
                                format!(
                                    "`apply_to = \"signature\"` is only for skip and fail, not {action}"
                                ),
                            ));
                        }
                        ApplyTo::Signature
                    }
                    other => {
                        return Err(at(
                            a.span(),
                            format!(
                                "unknown apply_to `{other}` (expected invocation or signature)"
                            ),
                        ));
                    }
                },
            };
            if r.reason.is_some() && action != VerdictAction::Fail {
                return Err(at(
                    rule_span.clone(),
                    format!("`reason` is only for fail, not {action}"),
                ));
            }
            if action != VerdictAction::Substitute
                && let Some(o) = &r.outputs
            {
                return Err(at(
                    o.span(),
                    format!("`outputs` is only for substitute, not {action}"),
                ));
            }
            let verdict = match action {
                VerdictAction::Retry => Verdict::Retry,
                VerdictAction::EndStream => Verdict::EndStream,
                VerdictAction::Skip => Verdict::Skip { apply_to },
                VerdictAction::Fail => Verdict::Fail {
                    reason: r.reason.clone(),
                    apply_to,
                },
                VerdictAction::Substitute => match r.outputs {
                    Some(o) => Verdict::Substitute {
                        outputs: o.into_inner(),
                    },
                    None => {
                        return Err(at(
                            r.verdict.span(),
                            "verdict substitute needs `outputs = { handle = value, .. }`".into(),
                        ));
                    }
                },
            };
            let (line, _) = line_col(text, rule_span.start);
            rules.push(Rule {
                label: r
                    .name
                    .unwrap_or_else(|| format!("rule {} (line {line})", i + 1)),
                node: glob(&r.node)?,
                node_type: glob(&r.node_type)?,
                signature: glob(&r.signature)?,
                message,
                verdict,
            });
        }
        Ok(Policy { rules, default })
    }

    /// How many rules it has.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether it has none (every escalation takes the default).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The verdict for an escalation, with the rule that chose it.
    pub fn verdict_for(&self, e: &Escalation) -> (Verdict, Option<&str>) {
        let mut refused: Option<&Rule> = None;
        for r in &self.rules {
            if !r.matches(e) {
                continue;
            }
            if e.allowed_actions.contains(r.verdict.action()) {
                return (r.verdict.clone(), Some(&r.label));
            }
            refused.get_or_insert(r);
        }
        // A rule that matched but could not apply must be said as such: "no rule
        // matched" would send the user looking for a typo in a pattern that works.
        match (refused, &self.default) {
            (Some(r), Verdict::Fail { apply_to, .. }) => (
                Verdict::Fail {
                    reason: Some(format!(
                        "policy {} matched, but its verdict {} is not allowed for this failure ({}); no later rule applied",
                        r.label,
                        r.verdict.action(),
                        why_not_allowed(r.verdict.action(), e)
                    )),
                    apply_to: *apply_to,
                },
                None,
            ),
            _ => (self.default.clone(), None),
        }
    }
}

/// Why the kernel does not offer `action` for this escalation, in the user's terms.
fn why_not_allowed(action: VerdictAction, e: &Escalation) -> String {
    let allowed = e
        .allowed_actions
        .iter()
        .map(VerdictAction::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let streaming_emitted = e.mode == NodeMode::StreamingOutput && e.emitted;
    let because = match action {
        _ if streaming_emitted => {
            "the streaming node already sent values downstream, so it can only keep them (end_stream) or fail; "
        }
        VerdictAction::Substitute if e.candidate_output.is_none() => {
            "substitute needs a candidate output and the node produced none; "
        }
        VerdictAction::Substitute => {
            "substitute needs a buffered node whose declared output types can be checked; "
        }
        VerdictAction::Retry if !e.retry_safe => "the node type is not retry-safe; ",
        VerdictAction::Retry => "the invocation already spent money or created assets; ",
        VerdictAction::EndStream => {
            "end_stream is for a streaming-input node or a streaming node that already emitted; "
        }
        VerdictAction::Skip | VerdictAction::Fail => "",
    };
    format!("{because}allowed: {allowed}")
}

impl Supervisor for Policy {
    fn name(&self) -> &str {
        "policy"
    }

    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        _ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        Box::pin(async move {
            let (mut v, rule) = self.verdict_for(e);
            if let (Verdict::Fail { reason: None, .. }, Some(rule)) = (&v, rule) {
                v = Verdict::Fail {
                    reason: Some(format!("policy {rule}: fail")),
                    apply_to: match &v {
                        Verdict::Fail { apply_to, .. } => *apply_to,
                        _ => ApplyTo::Invocation,
                    },
                };
            }
            Ok(Decision::new(v, DecidedBy::Policy))
        })
    }
}

/// `*` matches any run of characters; everything else is literal.
fn glob_regex(g: &str) -> Result<Regex, regex::Error> {
    let body = g
        .split('*')
        .map(regex::escape)
        .collect::<Vec<_>>()
        .join(".*");
    Regex::new(&format!("^{body}$"))
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}
