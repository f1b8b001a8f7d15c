//! The per-edge and per-node checks of the planning pass: edge handles and types, control
//! edges, properties against declarations, required inputs, and the non-fatal lints.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::bypass::WorkEdge;
use super::issues::{IssueKind, issue, list_names, suggest};
use super::model::{CONTROL_OUTPUT_HANDLE, OUTPUT_TYPE, PlanNode, input_type};
use super::planner::{DeclOf, Planner};
use crate::NodeSpec;
use crate::decl::{NodeDecl, NodeMode};
use crate::graph::{AccessLevel, CONTROL_HANDLE, EdgeType, NodeDoc, NodeLimits};
use crate::types::PortType;
use crate::value::Value;

impl Planner<'_> {
    /// Edge checks: handles, types, control edges, self-loops, and more than one data
    /// edge into a non-list input.
    pub(super) fn check_edges(&mut self, work: &[WorkEdge], decl_of: &DeclOf<'_>) {
        let mut into: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
        for e in work.iter().filter(|e| e.edge_type == EdgeType::Data) {
            into.entry((e.target, e.target_handle))
                .or_default()
                .push(&e.id);
        }
        for e in work {
            let fan_in = into.get(&(e.target, e.target_handle)).map_or(0, Vec::len);
            self.check_edge(e, decl_of, fan_in);
        }

        // Sorted: stable issue order.
        let mut multi: Vec<_> = into.iter().filter(|(_, ids)| ids.len() > 1).collect();
        multi.sort();
        let below = self.below_condition(work);
        for ((node, handle), ids) in multi {
            let Some(Some(d)) = decl_of.get(node) else {
                continue;
            };
            let Some(ty) = input_type(d, handle) else {
                continue;
            };
            if !ty.is_list() && !self.branch_join(ids, work, &below) {
                self.issues.push(issue(
                    IssueKind::MultipleEdgesIntoInput,
                    Some(node),
                    Some(ids[1]),
                    Some(handle),
                    format!(
                        "{} edges ({}) feed input `{handle}` of type {}; only a list input accepts more than one edge, or a join of condition branches (every edge coming from below a `when` and carrying none itself)",
                        ids.len(),
                        ids.join(", "),
                        ty
                    ),
                ));
            }
        }
    }

    /// `fan_in` is the number of data edges into the edge's target handle: several edges
    /// into a list input each carry one element (the handle accumulates them).
    fn check_edge(&mut self, e: &WorkEdge, decl_of: &DeclOf<'_>, fan_in: usize) {
        let src = decl_of.get(e.source).and_then(|d| d.as_ref());
        let tgt = decl_of.get(e.target).and_then(|d| d.as_ref());
        if e.source == e.target {
            self.issues.push(issue(
                IssueKind::SelfLoop,
                Some(e.source),
                Some(&e.id),
                Some(e.target_handle),
                format!(
                    "{} edge connects node {} to itself",
                    if e.edge_type == EdgeType::Control {
                        "control"
                    } else {
                        "data"
                    },
                    e.source
                ),
            ));
        }
        match e.edge_type {
            EdgeType::Control => {
                if e.target_handle != CONTROL_HANDLE {
                    self.issues.push(issue(
                        IssueKind::ControlHandle,
                        Some(e.target),
                        Some(&e.id),
                        Some(e.target_handle),
                        format!(
                            "control edge targets handle `{}`; control edges must target `{CONTROL_HANDLE}`",
                            e.target_handle
                        ),
                    ));
                }
                if let Some(t) = tgt
                    && t.mode != NodeMode::Controlled
                {
                    self.issues.push(issue(
                            IssueKind::ControlHandle,
                            Some(e.target),
                            Some(&e.id),
                            Some(CONTROL_HANDLE),
                            format!(
                                "control edge targets node {} of type `{}`, which is not a controlled node",
                                e.target, t.type_name
                            ),
                        ));
                }
                if let Some(s) = src
                    && e.source_handle != CONTROL_HANDLE
                    && e.source_handle != CONTROL_OUTPUT_HANDLE
                    && s.output(e.source_handle).is_none()
                {
                    self.unknown_output(e, s);
                }
            }
            EdgeType::Data => {
                let out = src.map(|s| (s, self.output_type(e.source, s, e.source_handle)));
                if let Some((s, None)) = out {
                    self.unknown_output(e, s);
                }
                if e.target_handle == CONTROL_HANDLE {
                    self.issues.push(issue(
                        IssueKind::ControlHandle,
                        Some(e.target),
                        Some(&e.id),
                        Some(CONTROL_HANDLE),
                        format!(
                            "data edge targets `{CONTROL_HANDLE}`; set \"edge_type\": \"control\" on it"
                        ),
                    ));
                    return;
                }
                let Some(t) = tgt else { return };
                let Some(input_ty) = input_type(t, e.target_handle) else {
                    self.unknown_handle(
                        IssueKind::UnknownInputHandle,
                        e,
                        e.target,
                        e.target_handle,
                        t,
                        "input",
                        t.inputs.iter().map(|p| p.name.as_str()),
                    );
                    return;
                };
                let (want, what) = match input_ty {
                    PortType::List(elem) if fan_in > 1 => (&**elem, "items of "),
                    ty => (ty, ""),
                };
                if let Some((_, Some(out_ty))) = out
                    && !want.accepts(&out_ty)
                {
                    self.issues.push(issue(
                        IssueKind::TypeMismatch,
                        Some(e.target),
                        Some(&e.id),
                        Some(e.target_handle),
                        format!(
                            "output `{}.{}` ({}) cannot feed {what}input `{}.{}` ({})",
                            e.source, e.source_handle, out_ty, e.target, e.target_handle, input_ty
                        ),
                    ));
                }
            }
        }
    }

    fn unknown_output(&mut self, e: &WorkEdge, s: &NodeDecl) {
        self.unknown_handle(
            IssueKind::UnknownOutputHandle,
            e,
            e.source,
            e.source_handle,
            s,
            "output",
            s.outputs.iter().map(|o| o.name.as_str()),
        );
    }

    /// An edge names a port its node type does not have: say so, suggest a close name
    /// and list the ports that exist.
    #[allow(clippy::too_many_arguments)]
    fn unknown_handle<'a>(
        &mut self,
        kind: IssueKind,
        e: &WorkEdge,
        node: &str,
        handle: &str,
        decl: &NodeDecl,
        side: &str,
        names: impl Iterator<Item = &'a str> + Clone,
    ) {
        self.issues.push(issue(
            kind,
            Some(node),
            Some(&e.id),
            Some(handle),
            format!(
                "node type `{}` has no {side} `{handle}`{} ({side}s: {})",
                decl.type_name,
                suggest(handle, names.clone()),
                list_names(names)
            ),
        ));
    }

    /// Reports what the node's type finds wrong with its configuration
    /// ([`crate::DeclLookup::check_node`]), as issues of that node. A required property
    /// that is missing altogether is left to [`Planner::required_inputs`], which says so
    /// already.
    pub(super) fn node_config(
        &mut self,
        n: &NodeDoc,
        decl: &Arc<NodeDecl>,
        properties: &BTreeMap<String, Value>,
        limits: Option<&NodeLimits>,
        fed: &HashSet<(&str, &str)>,
    ) {
        let spec = NodeSpec {
            id: &n.id,
            decl,
            properties,
            limits,
        };
        for problem in self.decls.check_node(&spec) {
            let handle = problem.property.as_deref();
            let reported_missing = handle.is_some_and(|h| {
                decl.property(h)
                    .is_some_and(|p| p.required && p.default.is_none())
                    && !properties.contains_key(h)
                    && !fed.contains(&(n.id.as_str(), h))
            });
            if !reported_missing {
                self.issues.push(issue(
                    IssueKind::InvalidProperty,
                    Some(&n.id),
                    None,
                    handle,
                    problem.message,
                ));
            }
        }
    }

    /// The node's one set of limits ([`NodeDoc::resolved_limits`]), reporting a setting
    /// written two ways that disagree, and a retry on a node that may edit: a failed
    /// attempt can die mid-edit and nothing reverts what it wrote, so only a retry-safe
    /// node or one whose access is `none` or `read` may try more than once.
    pub(super) fn node_limits(
        &mut self,
        n: &NodeDoc,
        decl: &NodeDecl,
        known: bool,
    ) -> Option<NodeLimits> {
        let (limits, problems) = n.resolved_limits();
        for message in problems {
            self.issues.push(issue(
                IssueKind::InvalidLimits,
                Some(&n.id),
                None,
                None,
                message,
            ));
        }
        let l = limits.as_ref()?;
        if let Some(r) = &l.retry
            && r.attempts > 1
            && known
            && !decl.retry_safe
            && !matches!(l.files, Some(AccessLevel::None | AccessLevel::Read))
        {
            self.issues.push(issue(
                IssueKind::InvalidLimits,
                Some(&n.id),
                None,
                None,
                format!(
                    "retry with {} attempts on a node that may edit: node type `{}` is not retry-safe and the node's access is `{}`, so a failed attempt may leave half-done changes a retry would run over; set `\"access\": \"read\"` or `\"none\"`, or remove the retry",
                    r.attempts,
                    decl.type_name,
                    l.files.unwrap_or(AccessLevel::Write).as_str()
                ),
            ));
        }
        limits
    }

    /// Checks a node's properties against its declaration and returns the map the node
    /// is invoked with: values for edge-fed handles removed (edge values win), nulls
    /// removed, ints widened where the port is a float.
    pub(super) fn node_properties(
        &mut self,
        n: &NodeDoc,
        decl: &NodeDecl,
        known: bool,
        fed: &HashSet<(&str, &str)>,
    ) -> BTreeMap<String, Value> {
        let merged = n.merged_properties();
        let mut out = BTreeMap::new();
        for (k, v) in merged {
            let port = decl.input(&k).or_else(|| decl.property(&k));
            // Undeclared properties of a dynamic-inputs node are values for its inputs.
            if known && port.is_none() && k != "name" && !decl.dynamic_inputs {
                self.issues.push(issue(
                    IssueKind::UnknownProperty,
                    Some(&n.id),
                    None,
                    Some(&k),
                    format!(
                        "node type `{}` has no input or property `{k}`{}",
                        decl.type_name,
                        suggest(
                            &k,
                            decl.inputs
                                .iter()
                                .chain(&decl.properties)
                                .map(|p| p.name.as_str())
                        )
                    ),
                ));
                continue;
            }
            if v.is_null() {
                continue;
            }
            if fed.contains(&(n.id.as_str(), k.as_str())) {
                continue;
            }
            let v = match port {
                Some(p) => match p.ty.check(&v) {
                    Ok(()) => p.ty.coerce(v),
                    Err(why) => {
                        self.issues.push(issue(
                            IssueKind::InvalidProperty,
                            Some(&n.id),
                            None,
                            Some(&k),
                            format!("value of `{k}` does not fit its declared type: {why}"),
                        ));
                        continue;
                    }
                },
                None => v,
            };
            out.insert(k, v);
        }
        // A typed input's default value must fit the type it declares.
        if let (Some(ty), Some(v)) = (self.input_types.get(&n.id), out.get("value")) {
            match ty.check(v) {
                Ok(()) => {
                    let v = ty.coerce(v.clone());
                    out.insert("value".to_string(), v);
                }
                Err(why) => self.issues.push(issue(
                    IssueKind::InvalidProperty,
                    Some(&n.id),
                    None,
                    Some("value"),
                    format!("default value does not fit the input's type `{ty}`: {why}"),
                )),
            }
        }
        out
    }

    /// Findings that do not stop a run but usually mean the graph is not what the author
    /// meant.
    pub(super) fn lint(&mut self, nodes: &[PlanNode]) {
        let mut outputs: HashMap<&str, &str> = HashMap::new();
        for n in nodes {
            if n.decl.mode == NodeMode::Controlled && n.controllers.is_empty() {
                self.warnings.push(issue(
                    IssueKind::ControlHandle,
                    Some(&n.id),
                    None,
                    Some(CONTROL_HANDLE),
                    format!(
                        "node type `{}` runs on control events and no control edge reaches this node: it runs as a buffered node, once per set of inputs",
                        n.node_type
                    ),
                ));
            }
            if &*n.node_type == OUTPUT_TYPE
                && let Some(first) = outputs.insert(&n.name, &n.id)
            {
                self.warnings.push(issue(
                    IssueKind::InvalidProperty,
                    Some(&n.id),
                    None,
                    Some("name"),
                    format!(
                        "output name `{}` is also used by output node {first}; their values are merged under one name",
                        n.name
                    ),
                ));
            }
        }
    }

    /// A required input (or property) needs an edge, a value or a default. A controlled
    /// node is exempt: each control event carries properties that may supply the value.
    pub(super) fn required_inputs(&mut self, nodes: &[PlanNode], fed: &HashSet<(&str, &str)>) {
        for n in nodes {
            if n.decl.mode == NodeMode::Controlled {
                continue;
            }
            for (what, p) in n
                .decl
                .inputs
                .iter()
                .map(|p| ("input", p))
                .chain(n.decl.properties.iter().map(|p| ("property", p)))
            {
                if !p.required || p.default.is_some() {
                    continue;
                }
                if n.properties.contains_key(&p.name) || fed.contains(&(&*n.id, p.name.as_str())) {
                    continue;
                }
                self.issues.push(issue(
                    IssueKind::MissingRequiredInput,
                    Some(&n.id),
                    None,
                    Some(&p.name),
                    format!(
                        "required {what} `{}` ({}) has no edge, no value and no default",
                        p.name, p.ty
                    ),
                ));
            }
        }
    }
}
