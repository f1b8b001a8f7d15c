//! The machine-readable report of a run (`heddle run --json`, and the final report a
//! watchdog's worker stores: [`crate::report`]) and the human summary printed after a
//! run.
//!
//! Built from the kernel's [`RunResult`] plus what the event stream adds (when each node
//! started and ended), so it says nothing the events did not say.

use std::collections::BTreeMap;

use heddle_core::compose::GraphNodeInfo;
use heddle_core::{
    Event, EventKind, NodeOutcome, NodeStatus, RunResult, SkipReason, UsageState, Value,
};
use serde::Serialize;

/// Version of the report's shape; bumped on incompatible changes.
pub const REPORT_VERSION: u32 = 1;

/// The report of a run that ran: what the kernel's [`RunResult`] says, with when each
/// node started and ended.
#[derive(Debug, Serialize)]
pub struct RunReport {
    /// [`REPORT_VERSION`].
    pub report_version: u32,
    /// The graph's path or name.
    pub graph: String,
    /// `completed`, `failed`, `cancelled` or `suspended`.
    pub outcome: String,
    /// True when the supervisor intervened and the run still completed.
    pub supervised: bool,
    /// The exit code the command ends with ([`crate::Exit`]).
    pub exit_code: u8,
    /// What went wrong, when the run did not complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every value that reached each output, in arrival order.
    pub outputs: BTreeMap<String, Vec<Value>>,
    /// Each node's outcome and figures, by node id.
    pub nodes: BTreeMap<String, NodeEntry>,
    /// Every node that did not run, with why: a run never reads as complete while part
    /// of the graph silently did not run.
    pub skipped: Vec<SkippedNode>,
    /// The supervisor's decisions, as the kernel reports them.
    pub interventions: Vec<serde_json::Value>,
    /// Why and where the run suspended, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspend: Option<heddle_core::SuspendInfo>,
    /// The run's wall time, in microseconds.
    pub wall_us: u64,
    /// Totals over every node.
    pub totals: Totals,
    /// Each graph node, by path: the document it includes and how its inner nodes (in
    /// `nodes` by path) ended, taken together.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub graph_nodes: BTreeMap<String, GraphEntry>,
    /// What planning noted without refusing the graph (a NodeTool type read as a Heddle
    /// one, a bypassed edge dropped, …).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<heddle_core::plan::Issue>,
}

/// A graph node in the report: its inner nodes' endings taken together.
#[derive(Debug, Serialize)]
pub struct GraphEntry {
    /// The document it includes (its key).
    pub graph: String,
    /// That document's sha256.
    pub sha256: String,
    /// `failed` when an inner node failed, `suspended` when one waits, `skipped` when
    /// none ran, else `done`.
    pub status: &'static str,
    /// Its inner nodes, by path, at any depth.
    pub nodes: Vec<String>,
    /// How many of them completed.
    pub done: usize,
    /// How many of them failed.
    pub failed: usize,
    /// How many of them never ran.
    pub skipped: usize,
    /// Never: a graph node's inner graph can hold anything (its nodes keep their own).
    pub retry_safe: bool,
}

/// The report of a run that never started because planning refused the graph: outcome
/// `invalid`, exit code 2, and every problem as `validate --json` lists it.
#[derive(Debug, Serialize)]
pub struct InvalidReport<'a> {
    /// [`REPORT_VERSION`].
    pub report_version: u32,
    /// The graph's path or name.
    pub graph: &'a str,
    /// Always `invalid`.
    pub outcome: &'static str,
    /// [`crate::Exit::Invalid`].
    pub exit_code: u8,
    /// The problems in one line.
    pub error: String,
    /// Every problem, as `heddle validate --json` lists them.
    pub issues: &'a [heddle_core::plan::Issue],
}

impl<'a> InvalidReport<'a> {
    /// The report of `graph`, refused for `issues` (summed up in `error`).
    pub fn new(graph: &'a str, error: String, issues: &'a [heddle_core::plan::Issue]) -> Self {
        InvalidReport {
            report_version: REPORT_VERSION,
            graph,
            outcome: "invalid",
            exit_code: crate::exit::Exit::Invalid as u8,
            error,
            issues,
        }
    }
}

/// A node that did not run, and why. Read back too: a supervised run's watchdog prints
/// the list from the stored report.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct SkippedNode {
    /// Its id.
    pub node: String,
    /// Why it did not run.
    pub reason: SkipReason,
    /// Where an `upstream_failed` or `upstream_skipped` skip began, by path: the failed
    /// nodes above it, or the nodes above it skipped for a reason of their own (a
    /// supervisor's skip, a condition). Empty for other reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub because: Vec<String>,
}

/// One node of a [`RunReport`]: its outcome and figures over all its invocations.
#[derive(Debug, Serialize)]
pub struct NodeEntry {
    /// Its type (`std.json.parse`, `code.python`…).
    #[serde(rename = "type")]
    pub node_type: String,
    /// `done`, `failed`, `skipped` or `suspended`.
    pub status: &'static str,
    /// Why it was skipped, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<SkipReason>,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure signature a failed node named (the one `error` ends with), for
    /// programs that match on it without parsing the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// An attempt reached the node's time limit and its work was cancelled.
    pub timed_out: bool,
    /// How many times it was invoked (every attempt counts).
    pub invocations: u64,
    /// Wall time summed over the invocations that reported metrics (WASM and code
    /// nodes); `null` for nodes that report none (native built-ins).
    pub wall_us: Option<u64>,
    /// WASM fuel consumed over all invocations; `null` for non-WASM nodes.
    pub fuel: Option<u64>,
    /// The largest memory an invocation used (WASM nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// What its invocations reported spending, in US dollars.
    #[serde(skip_serializing_if = "is_zero")]
    pub cost_usd: f64,
    /// Outgoing HTTP requests over all invocations (WASM nodes granted a network).
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub http_requests: u64,
    /// Bytes those requests moved: headers and bodies, sent and received.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub http_bytes: u64,
    /// Whether `cost_usd` is the node's whole provider usage: `reported` (every
    /// invocation reported its cost), `partial` (a lower bound) or `unknown` (none did;
    /// not zero). `null` for nodes that cannot spend (native built-ins and package
    /// nodes: `Origin::may_spend`) unless they reported a cost anyway.
    pub usage: Option<UsageState>,
    /// Microseconds since the run started when the node first ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at_us: Option<u64>,
    /// Microseconds since the run started when the node ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_us: Option<u64>,
}

fn is_zero(f: &f64) -> bool {
    *f == 0.0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The sums over every node of a [`RunReport`].
#[derive(Debug, Default, Serialize)]
pub struct Totals {
    /// Nodes in the graph.
    pub nodes: usize,
    /// Nodes that ended done.
    pub done: usize,
    /// Nodes that failed.
    pub failed: usize,
    /// Nodes that were skipped.
    pub skipped: usize,
    /// Invocations of every node.
    pub invocations: u64,
    /// WASM fuel of every invocation.
    pub fuel: u64,
    /// Outgoing HTTP requests of every node, and the bytes they moved.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub http_requests: u64,
    /// The bytes those requests moved.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub http_bytes: u64,
    /// Everything the run spent: `nodes_cost_usd + supervisor_cost_usd`.
    pub cost_usd: f64,
    /// What the nodes reported spending (model calls made by nodes, ...).
    pub nodes_cost_usd: f64,
    /// What supervisor decisions cost (the LLM supervisor's model calls).
    pub supervisor_cost_usd: f64,
}

/// Node start/end times gathered from the event stream.
#[derive(Debug, Default, Clone)]
pub struct NodeTimes {
    times: BTreeMap<String, (Option<u64>, Option<u64>)>,
}

impl NodeTimes {
    /// Notes when `ev` says a node started or ended (a run's events, in order).
    pub fn observe(&mut self, ev: &Event) {
        if let EventKind::Node {
            node_id, status, ..
        } = &ev.kind
        {
            let e = self.times.entry(node_id.clone()).or_default();
            match status {
                NodeStatus::Running => {
                    e.0.get_or_insert(ev.at_us);
                }
                NodeStatus::Completed
                | NodeStatus::Failed
                | NodeStatus::Skipped
                | NodeStatus::Suspended => e.1 = Some(ev.at_us),
                NodeStatus::Warning => {}
            }
        }
    }

    fn get(&self, id: &str) -> (Option<u64>, Option<u64>) {
        self.times.get(id).copied().unwrap_or_default()
    }
}

/// How a report names a node's outcome: `done`, `failed`, `skipped` or `suspended`.
pub fn outcome_name(o: &NodeOutcome) -> &'static str {
    match o {
        NodeOutcome::Done => "done",
        NodeOutcome::Failed { .. } => "failed",
        NodeOutcome::Skipped { .. } => "skipped",
        NodeOutcome::Suspended => "suspended",
    }
}

impl RunReport {
    /// The report of the run of `graph` that ended with `result`, with the node times
    /// its event stream gave.
    pub fn build(graph: &str, result: &RunResult, times: &NodeTimes) -> RunReport {
        let mut totals = Totals {
            nodes: result.nodes.len(),
            ..Totals::default()
        };
        let nodes = result
            .nodes
            .iter()
            .map(|(id, n)| {
                let (skip_reason, error) = match &n.outcome {
                    NodeOutcome::Done => {
                        totals.done += 1;
                        (None, None)
                    }
                    NodeOutcome::Failed { error } => {
                        totals.failed += 1;
                        (None, Some(error.clone()))
                    }
                    NodeOutcome::Skipped { reason } => {
                        totals.skipped += 1;
                        (Some(*reason), None)
                    }
                    NodeOutcome::Suspended => (None, None),
                };
                totals.invocations += n.invocations;
                totals.fuel += n.metrics.fuel.unwrap_or(0);
                totals.http_requests += n.metrics.http_requests;
                totals.http_bytes += n.metrics.http_bytes;
                totals.nodes_cost_usd += n.metrics.cost_usd;
                let (started, finished) = times.get(id);
                let measured = n.metrics.wall_us > 0 || n.metrics.fuel.is_some();
                // A node that cannot spend has no usage to speak of, unless it reported
                // a cost all the same.
                let usage = measured && (n.may_spend || n.metrics.cost_reports > 0);
                let entry = NodeEntry {
                    node_type: n.node_type.to_string(),
                    status: outcome_name(&n.outcome),
                    skip_reason,
                    error,
                    signature: n.signature.clone(),
                    timed_out: n.timed_out,
                    invocations: n.invocations,
                    wall_us: measured.then_some(n.metrics.wall_us),
                    usage: usage
                        .then(|| UsageState::of(n.invocations, u64::from(n.metrics.cost_reports))),
                    fuel: n.metrics.fuel,
                    peak_memory_bytes: n.metrics.peak_memory_bytes,
                    cost_usd: n.metrics.cost_usd,
                    http_requests: n.metrics.http_requests,
                    http_bytes: n.metrics.http_bytes,
                    started_at_us: started,
                    finished_at_us: finished,
                };
                (id.to_string(), entry)
            })
            .collect();
        // Folded from 0.0: a float sum of nothing is -0.0, which would print as such.
        totals.supervisor_cost_usd = result
            .interventions
            .iter()
            .filter_map(|i| i.get("cost_usd").and_then(serde_json::Value::as_f64))
            .fold(0.0, |a, b| a + b);
        totals.cost_usd = totals.nodes_cost_usd + totals.supervisor_cost_usd;
        let exit = crate::exit::Exit::for_status(result.status);
        RunReport {
            report_version: REPORT_VERSION,
            graph: graph.to_string(),
            outcome: result.status.as_str().to_string(),
            supervised: !result.interventions.is_empty(),
            exit_code: exit.code(),
            error: result.error.clone(),
            outputs: result.outputs.clone(),
            skipped: result
                .nodes
                .iter()
                .filter_map(|(id, n)| match n.outcome {
                    NodeOutcome::Skipped { reason } => Some(SkippedNode {
                        node: id.to_string(),
                        reason,
                        because: Vec::new(),
                    }),
                    _ => None,
                })
                .collect(),
            nodes,
            interventions: result.interventions.clone(),
            suspend: result.suspend.clone(),
            wall_us: result.wall_us,
            totals,
            graph_nodes: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    /// Adds what the plan knew and the kernel's result does not say: its graph nodes
    /// (their inner nodes' endings taken together), its warnings, and where each skip
    /// that came from upstream began (`feeds`: the plan's data edges as (source,
    /// target) node ids).
    pub fn with_plan(
        mut self,
        graphs: &[GraphNodeInfo],
        warnings: Vec<heddle_core::plan::Issue>,
        feeds: &[(String, String)],
    ) -> Self {
        self.warnings = warnings;
        let because: Vec<Vec<String>> = self
            .skipped
            .iter()
            .map(|k| self.skip_cause(&k.node, k.reason, feeds))
            .collect();
        for (k, b) in self.skipped.iter_mut().zip(because) {
            k.because = b;
        }
        self.graph_nodes = graphs
            .iter()
            .map(|g| {
                let count = |status: &str| {
                    g.nodes
                        .iter()
                        .filter(|n| self.nodes.get(*n).is_some_and(|e| e.status == status))
                        .count()
                };
                let (done, failed, skipped) = (count("done"), count("failed"), count("skipped"));
                let status = if failed > 0 {
                    "failed"
                } else if count("suspended") > 0 {
                    "suspended"
                } else if done == 0 && skipped > 0 {
                    "skipped"
                } else {
                    "done"
                };
                let entry = GraphEntry {
                    graph: g.key.to_string(),
                    sha256: g.sha256.clone(),
                    status,
                    nodes: g.nodes.clone(),
                    done,
                    failed,
                    skipped,
                    retry_safe: g.retry_safe,
                };
                (g.id.clone(), entry)
            })
            .collect();
        self
    }
}

/// What a run's report takes from its plan, kept before the driver takes the plan:
/// its graph nodes, its warnings, and its data edges (where a skip began is found along
/// them). See [`RunReport::finished`].
#[derive(Clone, Debug, Default)]
pub struct PlanFacts {
    graphs: Vec<GraphNodeInfo>,
    warnings: Vec<heddle_core::plan::Issue>,
    feeds: Vec<(String, String)>,
}

impl PlanFacts {
    /// Taken from `plan`.
    pub fn of(plan: &heddle_core::plan::Plan) -> PlanFacts {
        let feeds = plan
            .edges
            .iter()
            .filter(|e| e.edge_type == heddle_core::EdgeType::Data)
            .map(|e| {
                (
                    plan.nodes[e.source as usize].id.to_string(),
                    plan.nodes[e.target as usize].id.to_string(),
                )
            })
            .collect();
        PlanFacts {
            graphs: plan.graphs.clone(),
            warnings: plan.warnings.clone(),
            feeds,
        }
    }
}

impl RunReport {
    /// The report of a run the driver finished: the kernel's result with the node
    /// timings `times` and what the plan knew, the exit code the run ends with, and a
    /// budget that ran out named as the run's error (the kernel saw a cancel; the run
    /// ends failed, as its stored ending and `runs show` say).
    pub fn finished(
        graph: &str,
        finished: &crate::Finished,
        times: &NodeTimes,
        plan: &PlanFacts,
    ) -> RunReport {
        let mut report = RunReport::build(graph, &finished.result, times).with_plan(
            &plan.graphs,
            plan.warnings.clone(),
            &plan.feeds,
        );
        report.exit_code = finished.exit().code();
        if let Some(heddle_store::session::Planned::Exhausted { exhausted, .. }) =
            finished.planned()
        {
            report.outcome = "failed".to_string();
            report.error = Some(exhausted.to_string());
        }
        report
    }

    /// The gate the run waits at, when it suspended at one: a gate is answered
    /// (approved or rejected), not resumed.
    pub fn gate(&self) -> Option<&str> {
        self.suspend
            .as_ref()
            .filter(|s| heddle_core::gate::GateAsk::from_state(&s.state).is_some())
            .map(|s| s.node_id.as_str())
    }
}

impl RunReport {
    /// The nodes where the skip of `node` began: walking up its feeders through nodes
    /// skipped for the same upstream reason, the failed ones (`upstream_failed`) or the
    /// ones skipped for a reason of their own (`upstream_skipped`). A failure inside a
    /// graph node is so named by its path (`g/parse`) at every node it cut off.
    fn skip_cause(
        &self,
        node: &str,
        reason: SkipReason,
        feeds: &[(String, String)],
    ) -> Vec<String> {
        let is_cause = |id: &str| -> bool {
            match (reason, self.nodes.get(id)) {
                (SkipReason::UpstreamFailed, Some(e)) => e.status == "failed",
                (SkipReason::UpstreamSkipped, Some(e)) => {
                    e.status == "skipped" && e.skip_reason != Some(SkipReason::UpstreamSkipped)
                }
                _ => false,
            }
        };
        if !matches!(
            reason,
            SkipReason::UpstreamFailed | SkipReason::UpstreamSkipped
        ) {
            return Vec::new();
        }
        let mut seen = std::collections::BTreeSet::from([node.to_string()]);
        let mut todo = vec![node.to_string()];
        let mut found = std::collections::BTreeSet::new();
        while let Some(at) = todo.pop() {
            for (source, _) in feeds.iter().filter(|(_, t)| *t == at) {
                if !seen.insert(source.clone()) {
                    continue;
                }
                if is_cause(source) {
                    found.insert(source.clone());
                } else if self
                    .nodes
                    .get(source)
                    .is_some_and(|e| e.skip_reason == Some(reason))
                {
                    todo.push(source.clone());
                }
            }
        }
        found.into_iter().collect()
    }
}

/// Renders a value for a person: text as itself, everything else as compact JSON.
pub fn display_value(v: &Value) -> String {
    match v {
        Value::Str(s) => s.to_string(),
        other => serde_json::to_string(other).unwrap_or_else(|_| format!("{other:?}")),
    }
}

/// The human summary printed after a run: outputs, then what went wrong.
pub fn human_summary(report: &RunReport) -> String {
    outputs_summary(&report.outputs) + &skipped_summary(&report.skipped)
}

/// The outputs part of [`human_summary`], from the outputs alone (a supervised run's
/// watchdog prints it from the report it read back from the run store).
pub fn outputs_summary(outputs: &BTreeMap<String, Vec<Value>>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if outputs.is_empty() {
        let _ = writeln!(s, "(no outputs)");
    }
    for (name, values) in outputs {
        match values.as_slice() {
            [] => {
                let _ = writeln!(s, "{name}: (no value)");
            }
            [one] => {
                let text = display_value(one);
                if text.contains('\n') {
                    let _ = writeln!(s, "{name}:");
                    for line in text.lines() {
                        let _ = writeln!(s, "  {line}");
                    }
                } else {
                    let _ = writeln!(s, "{name}: {text}");
                }
            }
            many => {
                let _ = writeln!(s, "{name}: ({} values)", many.len());
                for v in many {
                    let _ = writeln!(s, "  - {}", display_value(v));
                }
            }
        }
    }
    s
}

/// The skipped part of [`human_summary`]: every node that did not run, with why.
pub fn skipped_summary(skipped: &[SkippedNode]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if skipped.is_empty() {
        return s;
    }
    let n = skipped.len();
    let _ = writeln!(s, "skipped {n} node{}:", if n == 1 { "" } else { "s" });
    for k in skipped {
        let because = if k.because.is_empty() {
            String::new()
        } else {
            format!(": {}", k.because.join(", "))
        };
        let _ = writeln!(
            s,
            "  - {} ({}{because})",
            k.node,
            skip_reason_text(k.reason)
        );
    }
    s
}

/// Why a node was skipped, in words for a person.
pub fn skip_reason_text(r: SkipReason) -> &'static str {
    use SkipReason::*;
    match r {
        NoInput => "no input arrived",
        Condition => "an edge's condition chose another branch",
        UpstreamSkipped => "upstream skipped",
        UpstreamFailed => "upstream failed",
        Cancelled => "run cancelled",
        Supervisor => "supervisor chose skip",
        Suspended => "run suspended",
        Reconciled => "skipped by a person reconciling it",
    }
}
