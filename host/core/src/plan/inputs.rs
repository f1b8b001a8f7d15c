//! A plan's external inputs (its `heddle.input` nodes) and the binding of caller values to
//! them. The CLI and the kernel both bind through [`Plan::bind_inputs`], so a value is
//! named, typed, defaulted and refused the same way wherever it comes from.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::model::{GraphInput, INPUT_TYPE, NodeIdx, Plan, PlanNode};
use crate::types::PortType;
use crate::value::Value;

impl GraphInput {
    /// Reads an input node of a valid plan: the planner has checked its `type` and
    /// `value` properties, so what is read here is known to be well formed.
    pub(super) fn of(idx: NodeIdx, node: &PlanNode, ty: Option<&PortType>) -> GraphInput {
        GraphInput {
            node: idx,
            node_id: node.id.clone(),
            name: node.name.clone(),
            ty: ty.cloned().unwrap_or_default(),
            default: node.properties.get("value").cloned(),
            streaming: node
                .properties
                .get("streaming")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }

    /// Checks a value for this input, coercing it losslessly (an int for a float input).
    pub fn check(&self, value: Value) -> Result<Value, InputError> {
        let value = self.ty.coerce(value);
        match self.ty.check(&value) {
            Ok(()) => Ok(value),
            Err(reason) => Err(InputError::Type {
                name: self.name.to_string(),
                node: self.node_id.to_string(),
                ty: self.ty.clone(),
                reason,
            }),
        }
    }
}

/// The value each input node sends when the run starts: the caller's, else its default.
/// Streaming inputs without either send nothing until the caller pushes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BoundInputs {
    /// The input nodes that have a value, in node order. Only these: a slot per node of
    /// the graph was 24 bytes a node, held for the whole run, for the few inputs.
    by_node: Vec<(NodeIdx, Value)>,
}

impl BoundInputs {
    /// The start value of input node `node`, if it has one.
    pub fn get(&self, node: NodeIdx) -> Option<&Value> {
        self.by_node
            .binary_search_by_key(&node, |(n, _)| *n)
            .ok()
            .map(|p| &self.by_node[p].1)
    }
}

/// Why a value could not be bound to an input.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InputError {
    /// No input has that name.
    #[error("no input named `{name}` in this graph ({})", known_inputs(.known))]
    Unknown {
        /// The name given.
        name: String,
        /// The graph's input names.
        known: Vec<String>,
    },
    /// The value is not of the input's type.
    #[error("input `{name}` (node {node}): value does not fit the input's type {ty}: {reason}")]
    Type {
        /// The input's name.
        name: String,
        /// Its node's id.
        node: String,
        /// Its type.
        ty: PortType,
        /// Why the value does not fit.
        reason: String,
    },
    /// A required input got no value.
    #[error("missing value for input `{name}` (node {node}, type {ty})")]
    Missing {
        /// The input's name.
        name: String,
        /// Its node's id.
        node: String,
        /// Its type.
        ty: PortType,
    },
}

fn known_inputs(names: &[String]) -> String {
    if names.is_empty() {
        "it has no inputs".to_string()
    } else {
        format!("inputs: {}", names.join(", "))
    }
}

/// Every problem with a set of input values, reported together.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct InputErrors(pub Vec<InputError>);

impl fmt::Display for InputErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl Plan {
    /// The graph's external inputs, in plan order (which keeps document order among them).
    pub fn inputs(&self) -> &[GraphInput] {
        &self.inputs
    }

    /// The input the caller calls `name`.
    pub fn input(&self, name: &str) -> Result<&GraphInput, InputError> {
        self.inputs
            .iter()
            .find(|i| &*i.name == name)
            .ok_or_else(|| InputError::Unknown {
                name: name.to_string(),
                known: self.inputs.iter().map(|i| i.name.to_string()).collect(),
            })
    }

    /// Binds caller values (by input name) to the inputs: every name must exist, every
    /// value must fit its input's type, and every input that is neither streaming nor
    /// defaulted needs a value. All problems are reported at once.
    pub fn bind_inputs(
        &self,
        values: &BTreeMap<String, Value>,
    ) -> Result<BoundInputs, InputErrors> {
        let mut problems = Vec::new();
        for name in values.keys() {
            if let Err(e) = self.input(name) {
                problems.push(e);
            }
        }
        let mut by_node = Vec::new();
        for input in &self.inputs {
            let value = match values.get(&*input.name) {
                Some(v) => match input.check(v.clone()) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        problems.push(e);
                        continue;
                    }
                },
                None => input.default.clone(),
            };
            if value.is_none() && !input.streaming {
                problems.push(InputError::Missing {
                    name: input.name.to_string(),
                    node: input.node_id.to_string(),
                    ty: input.ty.clone(),
                });
            }
            if let Some(v) = value {
                by_node.push((input.node, v));
            }
        }
        // `inputs` are in node order already; sorted all the same for `get`'s search.
        by_node.sort_by_key(|(n, _)| *n);
        if problems.is_empty() {
            Ok(BoundInputs { by_node })
        } else {
            Err(InputErrors(problems))
        }
    }
}

/// The inputs of freshly planned nodes; `input_types` holds each input's parsed `type`.
pub(super) fn collect(
    nodes: &[PlanNode],
    input_types: &HashMap<String, PortType>,
) -> Vec<GraphInput> {
    nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| &*n.node_type == INPUT_TYPE)
        .map(|(i, n)| GraphInput::of(i as NodeIdx, n, input_types.get(&*n.id)))
        .collect()
}
