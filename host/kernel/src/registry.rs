//! The registry of node types: every provider's declarations under one namespace.

use std::collections::HashMap;
use std::sync::Arc;

use heddle_core::{ConfigProblem, DeclLookup, NodeDecl};

use crate::executor::{Executor, NodeError, NodeProvider, NodeSpec};

/// Why a provider could not be added to a [`Registry`].
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "node type `{type_name}` from {new_origin} is already defined by {existing_origin}; a package may not redefine an existing node type"
    )]
    /// The provider declares a type another one already provides: refused, so which
    /// implementation runs never depends on the order packages were loaded in.
    Duplicate {
        /// The type name both declare.
        type_name: String,
        /// Where the type already there came from (`builtin`, `package:std@0.1.0`).
        existing_origin: String,
        /// Where the refused one came from.
        new_origin: String,
    },
}

/// All node types available to a run. Type names are unique across providers: adding a
/// provider that redefines one is refused, so a package cannot shadow a built-in.
#[derive(Default, Clone)]
pub struct Registry {
    providers: Vec<Arc<dyn NodeProvider>>,
    by_type: HashMap<String, (usize, Arc<NodeDecl>)>,
    /// Where the types came from, said with an unknown one (see [`Registry::searched`]).
    searched: Option<String>,
}

impl Registry {
    /// A registry with no node types at all (not even the built-ins).
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry holding the native built-in nodes.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        // Built-in names are fixed and distinct; a clash here is a programming error.
        r.add(Arc::new(crate::builtins::Builtins::new()))
            .expect("built-in node types are unique");
        r
    }

    /// Says where the node types were looked for (the package store, and how to point at
    /// another): planning adds it to the error about an unknown type.
    pub fn set_searched(&mut self, text: impl Into<String>) {
        self.searched = Some(text.into());
    }

    /// Adds a provider; refused whole if any of its types already exists.
    pub fn add(&mut self, provider: Arc<dyn NodeProvider>) -> Result<(), RegistryError> {
        let decls = provider.declarations();
        for d in &decls {
            if let Some((_, existing)) = self.by_type.get(&d.type_name) {
                return Err(RegistryError::Duplicate {
                    type_name: d.type_name.clone(),
                    existing_origin: origin_of(existing, None),
                    new_origin: origin_of(d, Some(provider.name())),
                });
            }
        }
        let idx = self.providers.len();
        self.providers.push(provider);
        for d in decls {
            self.by_type.insert(d.type_name.clone(), (idx, d));
        }
        Ok(())
    }

    /// Every declaration, sorted by type name.
    pub fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        let mut v: Vec<_> = self.by_type.values().map(|(_, d)| d.clone()).collect();
        v.sort_by(|a, b| a.type_name.cmp(&b.type_name));
        v
    }

    /// Creates the executor for one node through the provider of its type; a type no
    /// provider has is a host error (planning reports it first in practice).
    #[allow(clippy::result_large_err)] // NodeError is the seam's error; creation is cold.
    pub fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        match self.by_type.get(&spec.decl.type_name) {
            Some((idx, _)) => self.providers[*idx].create(spec),
            None => Err(NodeError::host(format!(
                "node {}: unknown node type `{}`",
                spec.id, spec.decl.type_name
            ))),
        }
    }
}

fn origin_of(d: &NodeDecl, provider: Option<&str>) -> String {
    match &d.origin {
        heddle_core::Origin::Unnamed => provider.unwrap_or("another provider").to_string(),
        origin => origin.to_string(),
    }
}

impl DeclLookup for Registry {
    fn decl(&self, type_name: &str) -> Option<Arc<NodeDecl>> {
        self.by_type.get(type_name).map(|(_, d)| d.clone())
    }

    fn type_names(&self) -> Vec<String> {
        self.by_type.keys().cloned().collect()
    }

    fn searched(&self) -> Option<String> {
        self.searched.clone()
    }

    fn check_node(&self, node: &NodeSpec<'_>) -> Vec<ConfigProblem> {
        match self.by_type.get(&node.decl.type_name) {
            Some((idx, _)) => self.providers[*idx].check(node),
            None => Vec::new(),
        }
    }
}
