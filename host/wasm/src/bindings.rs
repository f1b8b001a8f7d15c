//! Host-side bindings of the `heddle:node` world (generated from `wit/node.wit`).

wasmtime::component::bindgen!({
    world: "node-package",
    path: "../../wit",
    imports: { default: async },
    exports: { default: async },
});

pub use heddle::node::types::{
    CapabilityKind as WitCapabilityKind, LogLevel as WitLogLevel, NodeDecl as WitNodeDecl,
    NodeError as WitNodeError, OutputCorrelation as WitCorrelation, PortDecl as WitPortDecl,
    Value as WitValue,
};
