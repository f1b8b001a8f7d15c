//! Native built-in nodes: enough to write real graphs without WASM.
//!
//! `heddle.input` and `heddle.output` are dispatched by the runtime itself (external
//! values in, run outputs out); their executors exist so every node has one and so a
//! direct `invoke` behaves sensibly.

use std::sync::Arc;

use heddle_core::plan::CHECK_TYPE;
use heddle_core::{
    INPUT_TYPE, NodeDecl, NodeMode, OUTPUT_TYPE, OutputCorrelation, OutputDecl, PortDecl, PortType,
    Value,
};

use crate::executor::{
    BoxFuture, Call, Executor, InputStream, InputView, NodeCtx, NodeError, NodeProvider, NodeSpec,
    Outputs,
};

mod check;
mod control;

pub use control::{EVAL_TYPE, RUN_EACH_TYPE};

/// Provider of the built-in node types (`heddle.*`).
pub struct Builtins {
    /// The one executor of every input, constant and pass-through node: it holds nothing
    /// of its node, so a graph of 100,000 pass-through nodes shares it rather than making
    /// (and, at the run's end, freeing) two allocations per node.
    forward: Arc<dyn Executor>,
}

impl Builtins {
    /// The provider.
    pub fn new() -> Self {
        Builtins {
            forward: Arc::new(ForwardValue {
                handle: Arc::from("value"),
            }),
        }
    }
}

impl Default for Builtins {
    fn default() -> Self {
        Builtins::new()
    }
}

fn decl(type_name: &str, title: &str, description: &str) -> NodeDecl {
    let mut d = NodeDecl::new(type_name);
    d.title = title.into();
    d.description = description.into();
    d.origin = heddle_core::Origin::Builtin;
    d
}

/// Declarations of every built-in type.
pub fn declarations() -> Vec<Arc<NodeDecl>> {
    let mut input = decl(
        INPUT_TYPE,
        "Input",
        "A typed value given when the run starts, or a stream of values pushed while it runs.",
    );
    input.properties = vec![
        PortDecl::new("name", PortType::Str).describe("External name (default: the node id)"),
        PortDecl::new("type", PortType::Str).describe("Port type of the value (default any)"),
        PortDecl::new("value", PortType::Any).describe("Value used when the run gives none"),
        PortDecl::new("streaming", PortType::Bool)
            .with_default(false)
            .describe("Keep the edge open for values pushed while the run is live"),
    ];
    input.outputs = vec![OutputDecl::new("value", PortType::Any)];

    let mut output = decl(
        OUTPUT_TYPE,
        "Output",
        "Values reaching it become the run's outputs.",
    );
    output.inputs = vec![PortDecl::new("value", PortType::Any)];
    output.properties =
        vec![PortDecl::new("name", PortType::Str).describe("External name (default: the node id)")];

    let mut constant = decl(
        "heddle.constant",
        "Constant",
        "Emits its `value` property once.",
    );
    constant.properties = vec![PortDecl::new("value", PortType::Any)];
    constant.outputs = vec![OutputDecl::new("value", PortType::Any)];
    constant.retry_safe = true;

    let mut foreach = decl(
        "heddle.foreach",
        "For each",
        "Fans a list out: one item (and its index) per element, each in its own lineage scope.",
    );
    foreach.inputs = vec![PortDecl::new("list", PortType::list_of(PortType::Any)).required()];
    let group = OutputCorrelation::Iteration {
        group: Some("item".into()),
    };
    foreach.outputs = vec![
        OutputDecl::new("item", PortType::Any).correlated(group.clone()),
        OutputDecl::new("index", PortType::Int).correlated(group),
    ];
    foreach.retry_safe = true;

    let mut collect = decl(
        "heddle.collect",
        "Collect",
        "Fans in: one list per parent scope, emitted when the items' scope closes, in item order.",
    );
    collect.mode = NodeMode::StreamingInput;
    collect.inputs = vec![PortDecl::new("item", PortType::Any).required()];
    collect.outputs = vec![
        OutputDecl::new("list", PortType::list_of(PortType::Any))
            .correlated(OutputCorrelation::Aggregate),
    ];
    collect.retry_safe = true;

    let mut pass = decl(
        "heddle.passthrough",
        "Pass through",
        "Emits its input unchanged.",
    );
    pass.inputs = vec![PortDecl::new("value", PortType::Any)];
    pass.outputs = vec![OutputDecl::new("value", PortType::Any)];
    pass.retry_safe = true;

    let mut check = decl(
        CHECK_TYPE,
        "Check",
        "Asserts one JSONata condition over what its incoming edges delivered; false fails the run with its message.",
    );
    check.properties = vec![
        PortDecl::new("assert", PortType::Str).required().describe(
            "JSONata over `upstream.<node-id>.output` and `upstream.<node-id>.fields.<key>`",
        ),
        PortDecl::new("message", PortType::Str)
            .describe("Why the run fails when the assertion is false"),
    ];
    // Inputs are named after the node feeding them (the planner holds edges to that).
    check.dynamic_inputs = true;
    check.outputs = vec![OutputDecl::new("output", PortType::Object)];
    check.retry_safe = true;

    let mut graph = decl(
        heddle_core::compose::GRAPH_TYPE,
        "Graph",
        "Another graph used as a node: its `heddle.input` nodes are this node's inputs, its `heddle.output` nodes its outputs. Expanded inline when the graph is planned, its nodes named by path (`this-id/inner-id`); never retry-safe as a whole.",
    );
    graph.properties = vec![
        PortDecl::new("graph", PortType::Str)
            .required()
            .describe("Path of the graph document, relative to this one (or inside `package`)"),
        PortDecl::new("sha256", PortType::Str).describe(
            "The document's sha256: a changed document is refused (`heddle validate` prints it)",
        ),
        PortDecl::new("package", PortType::Str)
            .describe("An installed package whose graph `graph` names"),
    ];
    // Properties named after the inner graph's inputs set them.
    graph.dynamic_inputs = true;

    [
        input, output, constant, foreach, collect, pass, check, graph,
    ]
    .into_iter()
    .chain([crate::gate::declaration()])
    .chain(control::declarations())
    .map(Arc::new)
    .collect()
}

impl NodeProvider for Builtins {
    fn name(&self) -> &str {
        "builtin"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        declarations()
    }

    fn check(&self, spec: &NodeSpec<'_>) -> Vec<heddle_core::ConfigProblem> {
        if spec.decl.type_name == CHECK_TYPE {
            return check::problems(spec);
        }
        if spec.decl.type_name == EVAL_TYPE {
            return control::check_eval(spec);
        }
        Vec::new()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        Ok(match spec.decl.type_name.as_str() {
            INPUT_TYPE | "heddle.constant" | "heddle.passthrough" => self.forward.clone(),
            OUTPUT_TYPE => Arc::new(Sink),
            "heddle.foreach" => Arc::new(ForEach),
            "heddle.collect" => Arc::new(Collect),
            heddle_core::gate::GATE_TYPE => crate::gate::Gate::executor(spec, None),
            CHECK_TYPE => Arc::new(check::Check::new(spec)?),
            RUN_EACH_TYPE => Arc::new(control::RunEach),
            EVAL_TYPE => Arc::new(control::Eval),
            heddle_core::compose::GRAPH_TYPE => {
                return Err(NodeError::host(format!(
                    "node {}: a graph node is expanded when its graph is planned (plan it with its documents: `heddle_core::plan::plan_with`)",
                    spec.id
                )));
            }
            other => return Err(NodeError::host(format!("unknown built-in `{other}`"))),
        })
    }
}

/// Emits input/property `value` on output `value` (input, constant, passthrough).
struct ForwardValue {
    /// The output handle name, allocated once (the provider's one `ForwardValue` serves
    /// every node) rather than per invocation.
    handle: Arc<str>,
}

impl Executor for ForwardValue {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        let mut inputs = call.inputs;
        let out = match inputs.remove("value") {
            Some(v) => Outputs::one(self.handle.clone(), v),
            None => Outputs::new(),
        };
        Box::pin(std::future::ready(Ok(out)))
    }

    fn invoke_now(&self, inputs: &mut InputView<'_>) -> Option<Outputs> {
        let mut out = Outputs::new();
        self.invoke_now_into(inputs, &mut out);
        Some(out)
    }

    fn invoke_now_into(&self, inputs: &mut InputView<'_>, out: &mut Outputs) -> bool {
        match inputs.take("value") {
            Some(v) => out.set_one(&self.handle, v),
            None => out.0.clear(),
        }
        true
    }
}

struct Sink;

impl Executor for Sink {
    fn invoke(&self, _call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(std::future::ready(Ok(Outputs::new())))
    }
}

struct ForEach;

impl Executor for ForEach {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        let r = match call.inputs.get("list") {
            Some(Value::List(items)) => Ok(ForEach::items(items)),
            Some(other) => Err(NodeError::msg(format!(
                "input `list` must be a list, got {}",
                other.kind()
            ))),
            None => Err(NodeError::msg("input `list` is missing")),
        };
        Box::pin(std::future::ready(r))
    }

    fn invoke_now(&self, inputs: &mut InputView<'_>) -> Option<Outputs> {
        match inputs.get("list") {
            Some(Value::List(items)) => Some(ForEach::items(items)),
            _ => None,
        }
    }
}

impl ForEach {
    fn items(items: &[Value]) -> Outputs {
        let mut out = Outputs::new();
        // Sized once: a list of thousands would otherwise be copied as it grows.
        out.0.reserve_exact(2 * items.len());
        let item: Arc<str> = Arc::from("item");
        let index: Arc<str> = Arc::from("index");
        // Pairs of one item share a minted token (same group).
        for (i, v) in items.iter().enumerate() {
            out.0.push((item.clone(), v.clone()));
            out.0.push((index.clone(), Value::Int(i as i64)));
        }
        out
    }
}

struct Collect;

impl Collect {
    fn one(item: Option<Value>) -> Outputs {
        Outputs::one("list", Value::list(item.into_iter().collect()))
    }
}

impl Executor for Collect {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        // Called directly (not as a stream): a single item becomes a one-element list.
        let v = call.inputs.get("item").cloned();
        Box::pin(std::future::ready(Ok(Collect::one(v))))
    }

    fn invoke_now(&self, inputs: &mut InputView<'_>) -> Option<Outputs> {
        Some(Collect::one(inputs.take("item")))
    }

    fn run_stream(
        &self,
        mut input: InputStream,
        ctx: NodeCtx,
    ) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let mut items = Vec::new();
            while let Some(it) = input.next().await {
                if ctx.is_cancelled() {
                    return Err(NodeError::cancelled());
                }
                items.push(it.value);
            }
            Ok(Outputs::one("list", Value::list(items)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::NodeProvider;

    fn create(b: &Builtins, type_name: &str, value: i64) -> Arc<dyn Executor> {
        let decl = declarations()
            .into_iter()
            .find(|d| d.type_name == type_name)
            .expect("a built-in");
        let properties = [("value".to_string(), Value::Int(value))].into();
        let spec = NodeSpec {
            id: "n",
            decl: &decl,
            properties: &properties,
            limits: None,
        };
        b.create(&spec).expect("created")
    }

    #[test]
    fn forwarding_nodes_share_one_executor_that_forwards_each_nodes_own_value() {
        let b = Builtins::new();
        let one = create(&b, "heddle.passthrough", 1);
        let two = create(&b, "heddle.passthrough", 2);
        let constant = create(&b, "heddle.constant", 3);
        assert!(Arc::ptr_eq(&one, &two) && Arc::ptr_eq(&one, &constant));
        // Shared, it still forwards what each call is given (a node's property or input).
        for v in [1, 2] {
            let base: crate::executor::Inputs = [("value".to_string(), Value::Int(v))].into();
            let mut inputs = InputView::new(smallvec::SmallVec::new(), &base);
            let out = one.invoke_now(&mut inputs).expect("runs now");
            assert_eq!(out.to_map(), [("value".to_string(), Value::Int(v))].into());
        }
        // Another provider has its own.
        assert!(!Arc::ptr_eq(
            &one,
            &create(&Builtins::new(), "heddle.passthrough", 1)
        ));
    }
}
