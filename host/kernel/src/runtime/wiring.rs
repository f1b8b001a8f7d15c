//! Wiring one actor from the plan: its connected handles, output ports and edges (as
//! senders into the targets' inboxes), defaults, role and limits.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use heddle_core::graph::EdgeType;
use heddle_core::plan::{NodeIdx, PlanNode};

use super::actor::{ActorSpec, HandleSpec, Link, NodeRole, OutEdge, OutPort, SpecRare};
use super::inbox::{Inbox, InboxTx};
use super::{INPUT_TYPE, OUTPUT_TYPE, Run};
use crate::executor::Inputs;

impl Run {
    /// The spec of node `i`'s actor; `txs` are every node's inbox senders.
    pub(super) fn spec(&self, i: usize, txs: &[Option<InboxTx>], rx: Inbox) -> ActorSpec {
        let plan = &self.plan;
        let node = &plan.nodes[i];
        // Borrowed, not cloned: its maps would cost a wide graph allocations per node.
        let fallback;
        let scope = match plan.correlation.nodes.get(i) {
            Some(s) => s,
            None => {
                fallback = heddle_core::plan::NodeScope::default();
                &fallback
            }
        };
        let decl = node.decl.clone();

        let handles: Vec<HandleSpec> = scope
            .inputs
            .iter()
            .map(|(name, h)| HandleSpec {
                name: name.clone(),
                class: h.class,
                scope: h.scope.as_slice().into(),
                accumulates: h.accumulates,
                repeats: h.repeats_per_key,
                upstream: 0,
                required: false,
            })
            .collect();
        let mut handles = handles;
        let handle_idx = |node: usize, h: &str| -> Option<u16> {
            plan.correlation
                .nodes
                .get(node)
                .and_then(|s| s.inputs.position(h))
                .map(|p| p as u16)
        };
        let mut root_contrib: HashMap<u32, u32> = HashMap::new();
        let mut control_in: Vec<u32> = Vec::new();
        for &ei in &node.in_edges {
            let e = &plan.edges[ei as usize];
            match e.edge_type {
                EdgeType::Data => {
                    if let Some(h) = handle_idx(i, &e.target_handle) {
                        handles[h as usize].upstream += 1;
                        if let Some(es) = plan.correlation.edges.get(ei as usize) {
                            for r in &es.scope {
                                *root_contrib.entry(*r).or_insert(0) += 1;
                            }
                        }
                    }
                }
                EdgeType::Control => {
                    if !control_in.contains(&e.source) {
                        control_in.push(e.source);
                    }
                }
            }
        }

        // Output ports: declared outputs with their scopes, plus control ports.
        // Built as vectors, held as exact boxed slices (see below).
        let mut ports: Vec<(OutPort, Vec<OutEdge>)> = Vec::new();
        let mut control_targets: Vec<usize> = Vec::new();
        for &ei in &node.out_edges {
            let e = &plan.edges[ei as usize];
            let target = e.target as usize;
            let control = e.edge_type == EdgeType::Control;
            let handle = if control {
                0
            } else {
                match handle_idx(target, &e.target_handle) {
                    Some(h) => h,
                    None => continue,
                }
            };
            if control && !control_targets.contains(&target) {
                control_targets.push(target);
            }
            let pi = match ports
                .iter()
                .position(|(p, _)| p.name == e.source_handle && p.control == control)
            {
                Some(p) => p,
                None => {
                    let os = scope.outputs.get(&e.source_handle);
                    let (pscope, mints) = match os {
                        Some(o) => (o.scope.clone(), o.mints),
                        None => (scope.invocation_scope.clone(), None),
                    };
                    let keep = pscope.len() - usize::from(mints.is_some());
                    ports.push((
                        OutPort {
                            name: e.source_handle.clone(),
                            keep,
                            scope: pscope.as_slice().into(),
                            mints,
                            control,
                            edges: Box::default(),
                        },
                        Vec::new(),
                    ));
                    ports.len() - 1
                }
            };
            ports[pi].1.push(OutEdge {
                index: ei,
                tx: link_to(txs, target),
                handle,
                counter: 0,
                last_event: None,
                dirty: false,
                rule: e.rule.clone(),
            });
        }
        // Declared outputs without edges still get a port (values are dropped there
        // without a warning).
        for o in &decl.outputs {
            if !ports
                .iter()
                .any(|(p, _)| &*p.name == o.name.as_str() && !p.control)
            {
                let os = scope.outputs.get(o.name.as_str());
                let (pscope, mints) = match os {
                    Some(o) => (o.scope.clone(), o.mints),
                    None => (scope.invocation_scope.clone(), None),
                };
                let keep = pscope.len() - usize::from(mints.is_some());
                ports.push((
                    OutPort {
                        name: Arc::from(o.name.as_str()),
                        keep,
                        scope: pscope.as_slice().into(),
                        mints,
                        control: false,
                        edges: Box::default(),
                    },
                    Vec::new(),
                ));
            }
        }
        // Held for the node's whole life: exact boxed slices, no room kept for ports or
        // edges that never come (and a word less each than a vector).
        let mut ports: Box<[OutPort]> = ports
            .into_iter()
            .map(|(p, edges)| OutPort {
                edges: edges.into_boxed_slice(),
                ..p
            })
            .collect();
        if &*node.node_type == INPUT_TYPE {
            // The input node's single output must be port 0 (the kernel routes to it).
            if let Some(p) = ports.iter().position(|p| &*p.name == "value" && !p.control) {
                ports.swap(0, p);
            }
        }

        let base = base_inputs(node).into_owned();
        // Only when one is declared: most nodes would hold a list of `None`s.
        let declares_default = handles
            .iter()
            .any(|h| decl.input(&h.name).is_some_and(|p| p.default.is_some()));
        let defaults = if declares_default {
            handles
                .iter()
                .map(|h| decl.input(&h.name).and_then(|p| p.default.clone()))
                .collect()
        } else {
            Box::default()
        };
        // Without a value on a required input the node cannot run: no default and no
        // property stands in for it.
        for h in &mut handles {
            h.required =
                decl.input(&h.name).is_some_and(|p| p.required) && !base.contains_key(&*h.name);
        }

        // A built-in handles every value it is given; a node whose own code runs gets
        // only values of the types it declared.
        let typed_inputs = if decl.origin == heddle_core::Origin::Builtin {
            Box::default()
        } else {
            handles
                .iter()
                .filter_map(|h| {
                    let ty = &decl.input(&h.name)?.ty;
                    (*ty != heddle_core::PortType::Any).then(|| (h.name.clone(), ty.clone()))
                })
                .collect()
        };
        let role = if &*node.node_type == INPUT_TYPE {
            NodeRole::Input {
                streaming: plan
                    .inputs()
                    .iter()
                    .any(|input| input.node as usize == i && input.streaming),
                initial: self.inputs.get(i as NodeIdx).cloned(),
            }
        } else if &*node.node_type == OUTPUT_TYPE {
            NodeRole::Output {
                name: node.name.clone(),
            }
        } else {
            NodeRole::Executor
        };
        let timeout = node
            .limits
            .as_ref()
            .and_then(|l| l.timeout_ms)
            .map(Duration::from_millis)
            .or(self.opts.node_timeout);
        let retry = node.limits.as_ref().and_then(|l| l.retry.clone());
        let controllers = node.controllers.len().max(control_in.len());
        // Only controlled targets take events: a control edge into anything else was
        // refused at planning.
        let controls = (!control_targets.is_empty()).then(|| {
            super::Controls::new(
                node.id.clone(),
                control_targets
                    .iter()
                    .map(|&t| {
                        let tn = &plan.nodes[t];
                        (
                            tn.id.clone(),
                            tn.decl.clone(),
                            &tn.properties,
                            inbox_of(txs, t),
                        )
                    })
                    .collect(),
                plan.control_height(i as NodeIdx),
            )
        });
        let driver = scope
            .repeating_driver
            .as_ref()
            .and_then(|d| scope.inputs.position(d));
        ActorSpec {
            id: node.id.clone(),
            node_type: node.node_type.clone(),
            decl,
            exec: self.executors[i].clone(),
            base_inputs: base,
            defaults,
            handles: handles.into_boxed_slice(),
            scope: scope.invocation_scope.as_slice().into(),
            driver,
            ports,
            controllers,
            rare: SpecRare {
                control_targets: control_targets
                    .iter()
                    .map(|t| inbox_of(txs, *t).into())
                    .collect(),
                controls,
                root_contrib: root_contrib.into_iter().filter(|(_, n)| *n > 1).collect(),
                timeout,
                retry,
                // A graph node's output port carries the fields its inner producer
                // declares (so edges leaving the graph node are checked against them),
                // but that producer keeps the promise: the pass-through checks nothing
                // again.
                contract: node.contract.clone().filter(|_| {
                    &*node.node_type != heddle_core::compose::OUTPUT_PORT_TYPE
                        && &*node.node_type != heddle_core::compose::INPUT_PORT_TYPE
                }),
                typed_inputs,
            }
            .boxed(),
            role,
            rx,
        }
    }
}

/// What a node's invocations start from: its declared input and property defaults, then
/// its document properties over them. Borrowed when the node declares no defaults (the
/// properties are all of it): a node that runs once need not copy them.
pub(super) fn base_inputs(node: &PlanNode) -> Cow<'_, Inputs> {
    let decl = &node.decl;
    let mut defaults = decl
        .inputs
        .iter()
        .chain(decl.properties.iter())
        .filter_map(|p| Some((&p.name, p.default.as_ref()?)))
        .peekable();
    if defaults.peek().is_none() {
        return Cow::Borrowed(&node.properties);
    }
    let mut base = Inputs::new();
    // Inserted in turn: a later default, then a property, overrides an earlier one.
    for (k, v) in defaults {
        base.insert(k.clone(), v.clone());
    }
    for (k, v) in &node.properties {
        base.insert(k.clone(), v.clone());
    }
    Cow::Owned(base)
}

/// The sending end of an edge into `target`: its inbox, or, for a node fused with its
/// producer (which has no inbox of its own, see `Run::start`), a link the fused group
/// wires to a local queue before anything runs.
fn link_to(txs: &[Option<InboxTx>], target: usize) -> Link {
    match &txs[target] {
        Some(tx) => Link::Channel(tx.clone()),
        None => Link::Unwired,
    }
}

/// The sender into the inbox of `target`, a node an edge reaches: such a node always has
/// an inbox (`Run::start` gives one to every node with an incoming edge).
fn inbox_of(txs: &[Option<InboxTx>], target: usize) -> InboxTx {
    txs[target]
        .clone()
        .expect("a node an edge reaches has an inbox")
}
