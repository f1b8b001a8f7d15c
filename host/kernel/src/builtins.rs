//! Native built-in nodes.

use std::sync::Arc;

use heddle_core::NodeDecl;

use crate::executor::{Executor, NodeError, NodeProvider, NodeSpec};

/// Provider of the built-in node types (`heddle.*`).
#[derive(Default)]
pub struct Builtins;

impl Builtins {
    pub fn new() -> Self {
        Builtins
    }
}

impl NodeProvider for Builtins {
    fn name(&self) -> &str {
        "builtin"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        Vec::new()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        Err(NodeError::host(format!("unknown built-in `{}`", spec.decl.type_name)))
    }
}
