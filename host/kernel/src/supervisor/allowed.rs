//! The allowed set: computed by the kernel from facts the supervisor cannot influence,
//! and enforced on every verdict whoever returned it. The verdict schema shown to an
//! agent is derived from the same set, but the schema is UX; this is the guarantee.

use std::collections::BTreeMap;

use heddle_core::plan::NodeContract;
use heddle_core::supervise::{
    AllowedSet, DecidedBy, Decision, DeclaredOutput, Overruled, VerdictAction, has_validator,
};
use heddle_core::{NodeDecl, NodeMode};

/// What the kernel knows about one failed invocation.
#[derive(Clone, Copy, Debug)]
pub struct InvocationFacts<'a> {
    /// The node's declaration (retry safety, outputs, mode).
    pub decl: &'a NodeDecl,
    /// How the actor drove this invocation (a controlled node is `Controlled`).
    pub mode: NodeMode,
    /// Provider cost the invocation reported before failing.
    pub cost_usd: f64,
    /// Assets the invocation created before failing: a retry could create them twice.
    pub created_assets: bool,
    /// The error carries a candidate output.
    pub has_candidate: bool,
    /// Streaming: something was already sent downstream.
    pub emitted: bool,
    /// The failure is decided by the inputs alone (a value that does not fit its declared
    /// type, checked before the node ran): a retry with the same inputs fails the same
    /// way, so none is offered.
    pub fails_again: bool,
}

/// The verdicts this failure may receive:
///
/// | case | allowed |
/// |---|---|
/// | streaming input | end_stream, fail |
/// | streaming output, emitted | end_stream, fail |
/// | streaming output, nothing emitted | retry?, skip, fail |
/// | otherwise | retry?, substitute?, skip, fail |
///
/// retry? = declared retry-safe ∧ no cost ∧ no assets ∧ not a failure the same inputs
/// repeat (an unset flag means unsafe: a node nobody classified loses a safe retry rather
/// than gaining an unsafe one).
/// substitute? = a candidate output ∧ a validator for every declared output type.
pub fn allowed_actions(f: &InvocationFacts<'_>) -> AllowedSet {
    use VerdictAction::*;
    let retry_ok = f.decl.retry_safe && f.cost_usd == 0.0 && !f.created_assets && !f.fails_again;
    let mut s = AllowedSet::of(&[Fail]);
    match f.mode {
        NodeMode::StreamingInput => s.insert(EndStream),
        NodeMode::StreamingOutput if f.emitted => s.insert(EndStream),
        NodeMode::StreamingOutput => {
            if retry_ok {
                s.insert(Retry);
            }
            s.insert(Skip);
        }
        NodeMode::Buffered | NodeMode::Controlled => {
            if retry_ok {
                s.insert(Retry);
            }
            if f.has_candidate
                && !f.decl.outputs.is_empty()
                && f.decl.outputs.iter().all(|o| has_validator(&o.ty))
            {
                s.insert(Substitute);
            }
            s.insert(Skip);
        }
    }
    s
}

/// Replaces a verdict outside the allowed set with `fail` decided by the kernel, keeping
/// what was asked for in the record.
pub fn enforce(allowed: AllowedSet, d: Decision) -> (Decision, Option<Overruled>) {
    let action = d.verdict.action();
    if allowed.contains(action) {
        return (d, None);
    }
    let why = format!(
        "`{action}` is not allowed for this failure (allowed: {})",
        allowed
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cost = d.cost_usd;
    let overruled = Overruled {
        requested: d.verdict,
        requested_by: d.decided_by,
        why: why.clone(),
    };
    (
        Decision::fail(
            format!("supervisor verdict refused: {why}"),
            DecidedBy::Kernel,
        )
        .with_cost(cost),
        Some(overruled),
    )
}

/// What the node declared per output handle, its type and the fields the graph promised
/// on it (`output.fields`): what a substitute is checked against, and what the decider is
/// shown so that it can write one.
pub fn declared_outputs(
    decl: &NodeDecl,
    contract: Option<&NodeContract>,
) -> BTreeMap<String, DeclaredOutput> {
    decl.outputs
        .iter()
        .map(|o| {
            let fields = contract
                .filter(|c| *c.handle == *o.name)
                .map(|c| c.contract.fields.clone());
            (
                o.name.clone(),
                DeclaredOutput {
                    ty: o.ty.clone(),
                    fields,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use VerdictAction::*;
    use heddle_core::supervise::Verdict;
    use heddle_core::{OutputDecl, PortType};

    fn decl(retry_safe: bool) -> NodeDecl {
        let mut d = NodeDecl::new("t.x");
        d.retry_safe = retry_safe;
        d.outputs.push(OutputDecl::new("value", PortType::Int));
        d
    }

    fn facts(d: &NodeDecl, mode: NodeMode) -> InvocationFacts<'_> {
        InvocationFacts {
            decl: d,
            mode,
            cost_usd: 0.0,
            created_assets: false,
            has_candidate: false,
            emitted: false,
            fails_again: false,
        }
    }

    #[test]
    fn retry_needs_retry_safe_no_cost_no_assets() {
        let safe = decl(true);
        let unsafe_ = decl(false);
        assert_eq!(
            allowed_actions(&facts(&safe, NodeMode::Buffered)).to_vec(),
            [Retry, Skip, Fail]
        );
        assert_eq!(
            allowed_actions(&facts(&unsafe_, NodeMode::Buffered)).to_vec(),
            [Skip, Fail]
        );
        let mut f = facts(&safe, NodeMode::Buffered);
        f.cost_usd = 0.01;
        assert!(!allowed_actions(&f).contains(Retry));
        let mut f = facts(&safe, NodeMode::Controlled);
        f.created_assets = true;
        assert!(!allowed_actions(&f).contains(Retry));
        let mut f = facts(&safe, NodeMode::Buffered);
        f.fails_again = true;
        assert_eq!(allowed_actions(&f).to_vec(), [Skip, Fail]);
    }

    #[test]
    fn substitute_needs_candidate_and_declared_outputs() {
        let d = decl(false);
        let mut f = facts(&d, NodeMode::Buffered);
        f.has_candidate = true;
        assert_eq!(allowed_actions(&f).to_vec(), [Substitute, Skip, Fail]);
        let none = NodeDecl::new("t.sink");
        let mut f = facts(&none, NodeMode::Buffered);
        f.has_candidate = true;
        assert!(!allowed_actions(&f).contains(Substitute));
    }

    #[test]
    fn streaming_sets() {
        let d = decl(true);
        let mut f = facts(&d, NodeMode::StreamingOutput);
        f.has_candidate = true;
        assert_eq!(allowed_actions(&f).to_vec(), [Retry, Skip, Fail]);
        f.emitted = true;
        assert_eq!(allowed_actions(&f).to_vec(), [EndStream, Fail]);
        let f = facts(&d, NodeMode::StreamingInput);
        assert_eq!(allowed_actions(&f).to_vec(), [EndStream, Fail]);
    }

    #[test]
    fn enforcement_turns_disallowed_into_kernel_fail() {
        let allowed = AllowedSet::of(&[Skip, Fail]);
        let (d, o) = enforce(
            allowed,
            Decision::new(Verdict::Retry, DecidedBy::Policy).with_cost(0.1),
        );
        assert_eq!(d.decided_by, DecidedBy::Kernel);
        assert_eq!(d.verdict.action(), Fail);
        assert_eq!(d.cost_usd, 0.1);
        let o = o.unwrap();
        assert_eq!(o.requested, Verdict::Retry);
        assert_eq!(o.requested_by, DecidedBy::Policy);
        let (d, o) = enforce(allowed, Decision::new(Verdict::skip(), DecidedBy::Agent));
        assert_eq!(d.verdict, Verdict::skip());
        assert!(o.is_none());
    }
}
