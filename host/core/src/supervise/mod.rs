//! Supervisor data: escalations, verdicts, interventions, redaction and failure
//! signatures, shared by everything that takes part in supervising a run.
//!
//! Everything here is plain data and pure logic so the kernel, the LLM agent, the CLI and
//! a replay of a recorded run all agree on one shape. An [`Escalation`] is a public record
//! (it becomes an event, lands in the run result and is sent to a model), so it is only
//! ever built through [`Redactor`]: there is no unredacted escalation anywhere.
//!
//! Where things are: [`verdicts`] (what a supervisor may answer and the check a substitute
//! must pass), [`escalation`] (what it is asked about, and the intervention record),
//! [`redaction`] (how an escalation is made safe to show) and [`signatures`] (how failures
//! are named so a sticky verdict can match later ones, and the grammar every name keeps).

pub mod escalation;
pub mod redaction;
pub mod signatures;
pub mod verdicts;

pub use escalation::{Escalation, FailureKind, Intervention, LineageStep, Overruled, on_lineage};
pub use redaction::{REDACTED, RawEscalation, RedactLimits, Redactor, is_sensitive_name};
pub use verdicts::{
    AllowedSet, ApplyTo, DecidedBy, Decision, DeclaredOutput, UnknownVerdict, Verdict,
    VerdictAction, check_substitute, has_validator,
};
