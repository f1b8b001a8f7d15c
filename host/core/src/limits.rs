//! What a workflow author may declare on one node to bound it: a time limit, an access
//! level, a retry policy and narrowings of what the operator granted.
//!
//! A node document spells the common three at top level (`timeout_ms`, `access`,
//! `retry`, the issue's spelling) and everything under `limits` (`limits.timeout_ms`,
//! `limits.files`, …, the older spelling). Both are read into one [`NodeLimits`] by
//! [`resolve`]: the plan, the kernel and every executor see that value only, so there is
//! one mechanism with two spellings, never two mechanisms.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most attempts a retry policy may ask for (every attempt is charged to the run).
pub const MAX_ATTEMPTS: u32 = 100;
/// Longest backoff before one attempt, in milliseconds (an hour).
pub const MAX_BACKOFF_MS: u64 = 3_600_000;
/// Largest backoff multiplier.
pub const MAX_MULTIPLIER: f64 = 10.0;

/// Limits a workflow author may set on one node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeLimits {
    /// Wall-clock limit per invocation, in milliseconds (1 to 604800000, a week).
    /// Reaching it cancels the work.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::ranged::opt_int::<_, u64, 1, 604_800_000>"
    )]
    pub timeout_ms: Option<u64>,
    /// WASM fuel budget per invocation (only lowers the package's budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Narrowing of filesystem access: `none`, `read` or `write` (never wider than
    /// granted). The node's top-level `access` is the same setting.
    #[serde(default, alias = "access", skip_serializing_if = "Option::is_none")]
    pub files: Option<AccessLevel>,
    /// Narrowing of granted secrets to this subset of names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<String>>,
    /// Narrowing of granted environment variables to this subset of names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    /// Narrowing of the granted network destinations (`https://api.example.com`, see
    /// [`crate::net`]): a node reaches only those of them that lie inside a destination
    /// its package was granted; `[]` takes every destination away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Vec<crate::net::Destination>>,
    /// How often a failed invocation is tried again before the node fails (or a
    /// supervisor is asked). The node's top-level `retry` is the same setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

/// How far a node may touch the files it was granted. Absent means `write` within what
/// the operator granted.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum AccessLevel {
    /// No file access at all.
    None,
    /// Read-only, whatever the grant allows beyond.
    Read,
    /// Everything the grant allows.
    Write,
}

impl AccessLevel {
    /// Its name as a document writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessLevel::None => "none",
            AccessLevel::Read => "read",
            AccessLevel::Write => "write",
        }
    }
}

/// A node's own retry policy: `attempts` in all (1 = no retry), waiting
/// `backoff_ms × multiplier^(attempt-1)` after failed attempt `attempt`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 to [`MAX_ATTEMPTS`]).
    #[serde(deserialize_with = "crate::ranged::int::<_, u32, 1, 100>")]
    pub attempts: u32,
    /// Wait before the second attempt, in milliseconds (0 to [`MAX_BACKOFF_MS`]).
    #[serde(
        default,
        deserialize_with = "crate::ranged::int::<_, u64, 0, 3_600_000>"
    )]
    pub backoff_ms: u64,
    /// Growth of the wait per attempt (1 to [`MAX_MULTIPLIER`]; default 2).
    #[serde(default = "RetryPolicy::default_multiplier")]
    pub multiplier: f64,
}

impl RetryPolicy {
    fn default_multiplier() -> f64 {
        2.0
    }

    /// The wait after failed attempt `attempt` (1-based) before the next one, capped at
    /// [`MAX_BACKOFF_MS`] so a long policy cannot overflow into a wait of years.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(64) as i32;
        let ms = self.backoff_ms as f64 * self.multiplier.powi(exp);
        Duration::from_millis(ms.min(MAX_BACKOFF_MS as f64) as u64)
    }

    /// The multiplier's problem, when it has one (serde cannot range-check a float).
    fn check(&self) -> Option<String> {
        (!(1.0..=MAX_MULTIPLIER).contains(&self.multiplier)).then(|| {
            format!(
                "retry.multiplier is {}; it must be a number from 1 to {MAX_MULTIPLIER}",
                self.multiplier
            )
        })
    }
}

/// The node's declarations at top level, as read from its document.
#[derive(Clone, Copy, Debug, Default)]
pub struct TopLevel<'a> {
    /// `timeout_ms`: the node's wall-clock limit per invocation.
    pub timeout_ms: Option<u64>,
    /// `access`: how far the node may use its package's grants.
    pub access: Option<AccessLevel>,
    /// `retry`: the node's own retry policy.
    pub retry: Option<&'a RetryPolicy>,
}

/// The node's one set of limits: the top-level spellings folded into `limits`. A
/// setting written both ways with different values is a problem (returned as messages
/// for the planner to report on the node); the top-level value is kept.
pub fn resolve(
    top: TopLevel<'_>,
    limits: Option<&NodeLimits>,
) -> (Option<NodeLimits>, Vec<String>) {
    let mut problems = Vec::new();
    if top.timeout_ms.is_none() && top.access.is_none() && top.retry.is_none() {
        if let Some(r) = limits.and_then(|l| l.retry.as_ref()) {
            problems.extend(r.check());
        }
        return (limits.cloned(), problems);
    }
    let mut out = limits.cloned().unwrap_or_default();
    fold(
        &mut out.timeout_ms,
        top.timeout_ms,
        "timeout_ms",
        "limits.timeout_ms",
        &mut problems,
    );
    fold(
        &mut out.files,
        top.access,
        "access",
        "limits.files",
        &mut problems,
    );
    fold(
        &mut out.retry,
        top.retry.cloned(),
        "retry",
        "limits.retry",
        &mut problems,
    );
    if let Some(r) = &out.retry {
        problems.extend(r.check());
    }
    (Some(out), problems)
}

fn fold<T: PartialEq + std::fmt::Debug>(
    slot: &mut Option<T>,
    top: Option<T>,
    name: &str,
    alias: &str,
    problems: &mut Vec<String>,
) {
    let Some(top) = top else { return };
    if let Some(old) = slot.as_ref()
        && *old != top
    {
        problems.push(format!(
            "`{name}` ({top:?}) and `{alias}` ({old:?}) disagree; they are the same setting, write it once"
        ));
    }
    *slot = Some(top);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Result<RetryPolicy, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn backoff_grows_by_the_multiplier_and_defaults_to_doubling() {
        let p = policy(r#"{"attempts": 4, "backoff_ms": 100}"#).unwrap();
        let waits: Vec<u128> = (1..=3).map(|a| p.backoff(a).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400]);
        let p = policy(r#"{"attempts": 3, "backoff_ms": 10, "multiplier": 1}"#).unwrap();
        assert_eq!(p.backoff(3).as_millis(), 10);
        // A huge exponent is capped, never an overflow.
        let p = policy(r#"{"attempts": 100, "backoff_ms": 3600000, "multiplier": 10}"#).unwrap();
        assert_eq!(p.backoff(99), Duration::from_millis(MAX_BACKOFF_MS));
    }

    #[test]
    fn out_of_range_policies_are_refused_naming_the_range() {
        let e = policy(r#"{"attempts": 0}"#).unwrap_err();
        assert!(e.contains("from 1 to 100"), "{e}");
        assert!(policy(r#"{"attempts": 2, "backoff": 5}"#).is_err());
        let p = policy(r#"{"attempts": 2, "multiplier": 0.5}"#).unwrap();
        let (_, problems) = resolve(
            TopLevel {
                retry: Some(&p),
                ..TopLevel::default()
            },
            None,
        );
        assert!(
            problems[0].contains("retry.multiplier is 0.5"),
            "{problems:?}"
        );
    }

    #[test]
    fn both_spellings_fold_into_one_and_a_disagreement_is_named() {
        let old = NodeLimits {
            timeout_ms: Some(50),
            fuel: Some(7),
            ..NodeLimits::default()
        };
        let (l, problems) = resolve(
            TopLevel {
                access: Some(AccessLevel::Read),
                timeout_ms: Some(50),
                ..TopLevel::default()
            },
            Some(&old),
        );
        let l = l.unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            (l.files, l.timeout_ms, l.fuel),
            (Some(AccessLevel::Read), Some(50), Some(7))
        );
        let (_, problems) = resolve(
            TopLevel {
                timeout_ms: Some(60),
                ..TopLevel::default()
            },
            Some(&old),
        );
        assert!(
            problems[0].contains("`timeout_ms` (60) and `limits.timeout_ms` (50)"),
            "{problems:?}"
        );
        // `limits.access` is read as `limits.files`.
        let l: NodeLimits = serde_json::from_str(r#"{"access": "none"}"#).unwrap();
        assert_eq!(l.files, Some(AccessLevel::None));
    }
}
