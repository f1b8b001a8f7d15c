//! Host-side bindings of the `heddle:node` worlds, one module per contract version (as
//! Zed's extension host keeps one per `since_v*`): `wit/node.wit` (0.1) at the top, and
//! [`v0_2`] from `wit/v0.2/node.wit`. 0.2 shares 0.1's `types` interface unchanged (the
//! generated types are the same Rust types, so values and declarations convert once),
//! and adds `node.controlled` and `host.control-send` / `host.control-reply`. A package
//! is bound by the version it exports; [`Pre`] and [`Instance`] hide which.

wasmtime::component::bindgen!({
    world: "node-package",
    path: "../../wit",
    imports: { default: async },
    exports: { default: async },
});

/// The 0.2 world: controlled nodes and controllers.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        world: "node-package",
        path: "../../wit/v0.2",
        imports: { default: async },
        exports: { default: async },
        with: {
            "heddle:node/types": crate::bindings::heddle::node::types,
        },
    });
}

pub use heddle::node::types::{
    CapabilityKind as WitCapabilityKind, LogLevel as WitLogLevel, NodeDecl as WitNodeDecl,
    NodeError as WitNodeError, OutputCorrelation as WitCorrelation, PortDecl as WitPortDecl,
    Value as WitValue,
};

use crate::host_state::State;
use wasmtime::Store;

/// A package's prepared instance, of the contract version it was built against.
pub(crate) enum Pre {
    V0_1(NodePackagePre<State>),
    V0_2(v0_2::NodePackagePre<State>),
}

/// One instance of a package.
pub(crate) enum Instance {
    V0_1(NodePackage),
    V0_2(v0_2::NodePackage),
}

type Invoked = Result<Vec<(String, WitValue)>, WitNodeError>;

impl Pre {
    pub async fn instantiate_async(&self, store: &mut Store<State>) -> wasmtime::Result<Instance> {
        Ok(match self {
            Pre::V0_1(p) => Instance::V0_1(p.instantiate_async(store).await?),
            Pre::V0_2(p) => Instance::V0_2(p.instantiate_async(store).await?),
        })
    }

    pub fn instance_pre(&self) -> &wasmtime::component::InstancePre<State> {
        match self {
            Pre::V0_1(p) => p.instance_pre(),
            Pre::V0_2(p) => p.instance_pre(),
        }
    }
}

impl Instance {
    pub async fn call_describe(
        &self,
        store: &mut Store<State>,
    ) -> wasmtime::Result<Vec<WitNodeDecl>> {
        match self {
            Instance::V0_1(i) => i.heddle_node_node().call_describe(store).await,
            Instance::V0_2(i) => i.heddle_node_node().call_describe(store).await,
        }
    }

    /// The controlled node types (0.2); none for a 0.1 package.
    pub async fn call_controlled(&self, store: &mut Store<State>) -> wasmtime::Result<Vec<String>> {
        match self {
            Instance::V0_1(_) => Ok(Vec::new()),
            Instance::V0_2(i) => i.heddle_node_node().call_controlled(store).await,
        }
    }

    // `&Vec`: what the generated `call_invoke` of either version takes.
    #[allow(clippy::ptr_arg)]
    pub async fn call_invoke(
        &self,
        store: &mut Store<State>,
        type_name: &str,
        inputs: &Vec<(String, WitValue)>,
        properties: &Vec<(String, WitValue)>,
    ) -> wasmtime::Result<Invoked> {
        match self {
            Instance::V0_1(i) => {
                i.heddle_node_node()
                    .call_invoke(store, type_name, inputs, properties)
                    .await
            }
            Instance::V0_2(i) => {
                i.heddle_node_node()
                    .call_invoke(store, type_name, inputs, properties)
                    .await
            }
        }
    }
}
