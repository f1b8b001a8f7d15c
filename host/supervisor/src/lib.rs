//! The LLM supervisor: a [`heddle_kernel::supervisor::Supervisor`] that asks a model,
//! over the OpenAI-compatible chat-completions API with tool calls, what to do with a
//! failed invocation.
//!
//! The model gets the (already redacted) escalation, two read-only tools and one verdict
//! tool whose schema is narrowed to the kernel's allowed set. It is fenced in by a cost
//! ceiling enforced by reservation before every model turn, an explicit output-token
//! limit, a turn limit, and fail-closed handling of every provider error and malformed
//! reply. The kernel still enforces the allowed set on whatever comes back.
//!
//! [`interactive`] is the other handle outside the kernel: a person decides, through
//! whatever shows its desk (the server's API).

mod agent;
mod budget;
mod config;
pub mod interactive;
mod schema;

pub use agent::{LlmSupervisor, MAX_RESPONSE_BYTES, SYSTEM_PROMPT};
pub use budget::{BudgetError, CostBudget, Reservation};
pub use config::{ConfigError, LlmConfig, ModelPrice, PricingTable, SupervisorSection};
pub use schema::{parse_verdict, verdict_schema};
