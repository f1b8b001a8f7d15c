//! A controller's side of control edges (seed 002, "Control events"): the controlled
//! nodes an invocation may drive, the `_control_context` that describes them, and
//! `run` events answered with the outputs of the invocation each one causes.
//!
//! A controller is any node with control edges leaving it. Its invocations get a
//! [`Controls`] in their [`crate::NodeCtx`]: events go into the target's inbox like any
//! message, each with its own reply channel, and the target's actor handles them one at
//! a time in arrival order, so replies come back FIFO per target however many events a
//! controller has in flight. Everything a controller sends is checked here, before it
//! reaches the target: a node it is not wired to, or a property the target does not
//! declare, is the controller's failure, naming both nodes and the handle.

use std::collections::BTreeMap;
use std::sync::Arc;

use heddle_core::graph::CONTROL_HANDLE;
use heddle_core::{NodeDecl, Value};
use tokio::sync::oneshot;

use super::actor::{ControlEvent, Msg};
use super::inbox::InboxTx;
use crate::executor::{NodeError, Outputs};

/// The input a controller's invocation gets its [`Controls::context`] on.
pub const CONTROL_CONTEXT_INPUT: &str = "_control_context";

/// The handle under which a durable run records, with a controller's result, each
/// `run` event the invocation sent (`{"target", "properties"}`); no port has it.
pub(crate) const CONTROL_SENT: &str = "__control_sent__";

/// The controlled nodes one controller drives (cheap to clone).
#[derive(Clone)]
pub struct Controls {
    inner: Arc<Inner>,
}

struct Inner {
    controller: Arc<str>,
    targets: Vec<Target>,
    context: Value,
    height: u32,
}

struct Target {
    id: Arc<str>,
    decl: Arc<NodeDecl>,
    tx: InboxTx,
}

/// A `run` event on its way: resolves with the target's outputs for it.
pub struct ControlReply {
    controller: Arc<str>,
    target: Arc<str>,
    rx: oneshot::Receiver<Result<Outputs, String>>,
}

impl ControlReply {
    /// The outputs of the invocation the event caused; the target's failure (or its end
    /// before it ran the event) is the controller's error, naming the target.
    pub async fn outputs(self) -> Result<Outputs, NodeError> {
        match self.rx.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(message)) => Err(NodeError::msg(format!(
                "node {}: control event to node {} failed: {message}",
                self.controller, self.target
            ))
            .with_signature("control:failed")),
            Err(_) => Err(NodeError::msg(format!(
                "node {}: node {} ended without answering the control event",
                self.controller, self.target
            ))
            .with_signature("control:closed")),
        }
    }
}

impl Controls {
    /// The controls of `controller` over `targets` (id, declaration, configured
    /// properties, inbox); `height` is the controller's
    /// [`heddle_core::plan::Plan::control_height`].
    pub(crate) fn new(
        controller: Arc<str>,
        targets: Vec<(Arc<str>, Arc<NodeDecl>, &crate::executor::Inputs, InboxTx)>,
        height: u32,
    ) -> Self {
        let mut context = heddle_core::Map::new();
        for (id, decl, props, _) in &targets {
            context.insert(id.to_string(), describe(decl, props));
        }
        Controls {
            inner: Arc::new(Inner {
                controller,
                height,
                context: Value::object(context),
                targets: targets
                    .into_iter()
                    .map(|(id, decl, _, tx)| Target { id, decl, tx })
                    .collect(),
            }),
        }
    }

    /// The ids of the controlled nodes this controller is wired to, in edge order.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.inner.targets.iter().map(|t| &*t.id)
    }

    /// How many levels of controllers this one stands on (1 when its targets control
    /// nothing): an executor whose invocations hold a scarce slot while they wait for
    /// replies reserves its slots by this level, so controllers never hold every slot
    /// their targets need (see `Plan::control_height`).
    pub fn height(&self) -> u32 {
        self.inner.height
    }

    /// `_control_context`: per controlled node, its type, its properties (type,
    /// default, configured value) and the schema of its `run` action.
    pub fn context(&self) -> &Value {
        &self.inner.context
    }

    /// Sends a `run` event with `properties` (overrides for this one invocation) to
    /// `target` and resolves once it is in the target's inbox; the returned reply
    /// resolves with the outputs. Sending several before awaiting any is how a
    /// controller keeps events in flight: they are answered in the order sent.
    pub async fn dispatch(
        &self,
        target: &str,
        properties: BTreeMap<String, Value>,
    ) -> Result<ControlReply, NodeError> {
        let me = &self.inner.controller;
        let Some(t) = self.inner.targets.iter().find(|t| &*t.id == target) else {
            let wired: Vec<&str> = self.targets().collect();
            return Err(NodeError::msg(format!(
                "node {me} sent a control event to node {target}, which no control edge from it reaches (wired to: {})",
                if wired.is_empty() {
                    "none".to_string()
                } else {
                    wired.join(", ")
                }
            ))
            .with_signature("control:target"));
        };
        for (name, v) in &properties {
            let port = t.decl.input(name).or_else(|| t.decl.property(name));
            let Some(port) = port else {
                return Err(NodeError::msg(format!(
                    "node {me}: control event to node {target} (`{CONTROL_HANDLE}`) overrides property `{name}`, which node type `{}` does not have (it has: {})",
                    t.decl.type_name,
                    names(&t.decl)
                ))
                .with_signature("control:property"));
            };
            if let Err(e) = port.ty.check(v) {
                return Err(NodeError::msg(format!(
                    "node {me}: control event to node {target} (`{CONTROL_HANDLE}`) sets property `{name}`: {e}"
                ))
                .with_signature("control:property"));
            }
        }
        let (tx, rx) = oneshot::channel();
        let ev = ControlEvent {
            event_type: "run".into(),
            properties,
            origin: Some(self.inner.controller.clone()),
            reply: Some(tx),
        };
        if t.tx.send(Msg::Control(Box::new(ev))).await.is_err() {
            return Err(NodeError::msg(format!(
                "node {me}: node {target} has already ended and takes no more control events"
            ))
            .with_signature("control:closed"));
        }
        Ok(ControlReply {
            controller: me.clone(),
            target: t.id.clone(),
            rx,
        })
    }

    /// Sends again, with no one awaiting the reply, an event a recorded invocation of
    /// this controller had sent (`value` as [`CONTROL_SENT`] recorded it): recovery
    /// carries the recorded result out instead of running the controller, and the
    /// target replays its recorded reply to the event, so what it sent downstream
    /// then is sent again. An event for a node this controller is no longer wired to
    /// (the graph is the run's own, so never) is dropped.
    pub(crate) async fn resend(&self, value: &Value) {
        let Some(obj) = value.as_object() else { return };
        let target = obj.get("target").and_then(|t| t.as_str()).unwrap_or("");
        let properties = obj
            .get("properties")
            .and_then(|p| p.as_object())
            .cloned()
            .unwrap_or_default();
        if let Some(t) = self.inner.targets.iter().find(|t| &*t.id == target) {
            let ev = ControlEvent {
                event_type: "run".into(),
                properties,
                origin: Some(self.inner.controller.clone()),
                reply: None,
            };
            let _ = t.tx.send(Msg::Control(Box::new(ev))).await;
        }
    }

    /// The outputs `target` declares, when this controller is wired to it.
    pub fn outputs(&self, target: &str) -> Option<Vec<String>> {
        self.inner
            .targets
            .iter()
            .find(|t| &*t.id == target)
            .map(|t| t.decl.outputs.iter().map(|o| o.name.clone()).collect())
    }

    /// Whether `target` may safely run again for the same event: a controller that sent
    /// a run event to a node that is not retry-safe must not be retried as if nothing
    /// had happened.
    pub(crate) fn retry_safe(&self, target: &str) -> bool {
        self.inner
            .targets
            .iter()
            .find(|t| &*t.id == target)
            .is_some_and(|t| t.decl.retry_safe)
    }
}

fn names(decl: &NodeDecl) -> String {
    let all: Vec<&str> = decl
        .inputs
        .iter()
        .chain(&decl.properties)
        .map(|p| p.name.as_str())
        .collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// One controlled node as its controller sees it in `_control_context`.
fn describe(decl: &NodeDecl, configured: &crate::executor::Inputs) -> Value {
    let port = |p: &heddle_core::PortDecl| {
        let mut m = serde_json::Map::new();
        m.insert("type".into(), p.ty.to_string().into());
        if !p.description.is_empty() {
            m.insert("description".into(), p.description.clone().into());
        }
        if let Some(d) = &p.default {
            m.insert("default".into(), d.to_json());
        }
        if let Some(v) = configured.get(&p.name) {
            m.insert("value".into(), v.to_json());
        }
        (p.name.clone(), serde_json::Value::Object(m))
    };
    let properties: serde_json::Map<String, serde_json::Value> = decl
        .inputs
        .iter()
        .chain(&decl.properties)
        .map(port)
        .collect();
    let outputs: serde_json::Map<String, serde_json::Value> = decl
        .outputs
        .iter()
        .map(|o| {
            (
                o.name.clone(),
                serde_json::json!({"type": o.ty.to_string()}),
            )
        })
        .collect();
    Value::from_json(serde_json::json!({
        "node_type": decl.type_name,
        "title": decl.title,
        "description": decl.description,
        "properties": properties,
        "actions": {
            "run": {
                "description": "Runs the node once with these property overrides (for this run only) over its latest inputs; answered with its outputs, in the order sent.",
                "properties": properties,
                "outputs": outputs,
            }
        }
    }))
}
