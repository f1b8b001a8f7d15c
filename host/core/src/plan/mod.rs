//! Planning: turns a [`GraphDoc`](crate::GraphDoc) into a validated [`Plan`] before any node runs,
//! reporting every problem at once.
//!
//! [`plan`] checks, in this order, and keeps going after a problem so that one
//! [`ValidationError`] lists them all: duplicate node and edge ids → dangling edges (on
//! the document as written, so the error names the edge the user wrote) → bypass rewrite
//! ([`bypass`]) → node types → properties → edge handles and types, control edges,
//! self-loops → several edges into a non-list input → data and control cycles → required
//! inputs → the correlation analysis ([`correlation`]).
//!
//! Choices worth knowing when reading a plan:
//! - a `null` property value means unset (NodeTool saves `null` for untouched fields);
//! - a `heddle.input`'s `type` property narrows its `any` output for edge checks, and its
//!   `value` must fit that type;
//! - several edges into a `list[T]` input each carry one item (type `T`); the handle
//!   accumulates them ([`HandleScope::accumulates`]);
//! - a controlled node is exempt from the required-input check: each control event may
//!   carry the missing values;
//! - non-fatal findings (edges dropped by a bypass, sticky inputs that repeat, controlled
//!   nodes nothing controls, output names used twice) go to [`Plan::warnings`], with the
//!   advisory review of what a graph declares (`review`: conditions over fields nobody
//!   declared, gates with no upstream, checks that can never be reached).
//!
//! Where things are: [`model`] is what a plan is, [`issues`] what planning reports,
//! `planner` the pass itself with its checks in `checks`, [`inputs`] the graph's
//! external inputs and the binding of values to them, `digraph` the cycle and order
//! algorithms, and [`bypass`] and [`correlation`] the two analyses the pass runs.

pub mod by_name;
pub mod bypass;
mod checks;
pub mod correlation;
pub mod declared;
mod declared_checks;
mod digraph;
pub mod inputs;
pub mod issues;
pub mod model;
mod planner;
mod review;

pub use by_name::ByName;
pub use declared::{Crossing, EdgeRule, NodeContract};
pub use inputs::{BoundInputs, InputError, InputErrors};
pub use issues::{Issue, IssueKind, ValidationError};
pub use model::{
    CHECK_TYPE, Correlation, EdgeIdx, EdgeScope, GraphInput, HandleClass, HandleScope, INPUT_TYPE,
    Indices, NodeIdx, NodeScope, OUTPUT_TYPE, OutputScope, Plan, PlanEdge, PlanNode, RootIdx,
    RootInfo, input_type,
};
pub use planner::{plan, plan_with};
