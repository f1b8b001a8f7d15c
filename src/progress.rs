//! The live view of a run, drawn from its event stream.
//!
//! On a terminal it is an indicatif status line (counts, running nodes, elapsed) with one
//! line per finished node printed above it; otherwise plain lines, one per node outcome,
//! log line and intervention, so a log file or CI output reads top to bottom. Everything
//! goes to stderr: stdout carries only the outputs (or the JSON report).
//!
//! Node endings are printed in causal order: a node's line waits until every node
//! feeding it has ended. The kernel records a node's ending before its end-of-stream
//! leaves, so what follows from an ending is already in order; but a node may settle on
//! the first value it gets (a gate suspends, a node fails) while the node that sent it
//! is still finishing, and read top to bottom that would look like an effect before its
//! cause. Its line is held, with its own time stamp, until its feeders' lines are out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::time::Duration;

use heddle_core::supervise::Escalation;
use heddle_core::text::{ECHO_MAX_CHARS, clip};
use heddle_core::{Event, EventKind, LogLevel, NodeStatus, RunStatus};
use heddle_runtime::run_report::skip_reason_text;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Above this many nodes, only failures get a line of their own.
const PER_NODE_LINES_MAX: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// indicatif status line on a terminal.
    Live,
    /// Plain lines (stdout is not a terminal).
    Plain,
    /// Nothing (`--json`).
    Quiet,
}

/// Prints whole lines without tearing the status line; cheap to clone, so the Ctrl-C
/// handler can print too.
#[derive(Clone)]
pub struct Printer {
    mode: Mode,
    bar: Option<ProgressBar>,
}

impl Printer {
    /// A line of its own, above the status line when there is one.
    pub fn line(&self, text: &str) {
        match (&self.bar, self.mode) {
            (_, Mode::Quiet) => {}
            (Some(bar), _) => bar.println(text),
            (None, _) => {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{text}");
            }
        }
    }
}

pub struct Progress {
    mode: Mode,
    bar: Option<ProgressBar>,
    printer: Printer,
    total: usize,
    per_node_lines: bool,
    state: BTreeMap<String, NodeStatus>,
    /// Node endings, let out in causal order.
    endings: Causal,
}

impl Progress {
    pub fn new(mode: Mode, plan: &heddle_core::plan::Plan) -> Progress {
        let total_nodes = plan.nodes.len();
        // Nothing is printed in quiet mode (`--json`): no graph to order lines by.
        let edges = plan.edges.iter().filter(|_| mode != Mode::Quiet);
        let endings = Causal::new(edges.map(|e| {
            (
                &*plan.nodes[e.source as usize].id,
                &*plan.nodes[e.target as usize].id,
            )
        }));
        let bar = (mode == Mode::Live).then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(total_nodes as u64),
                ProgressDrawTarget::stderr(),
            );
            // The template is a constant; it parses.
            let style = ProgressStyle::with_template(
                "{spinner:.cyan} {elapsed:>4} [{bar:24.cyan/blue}] {pos}/{len} nodes  {msg}",
            )
            .expect("valid progress template")
            .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Progress {
            mode,
            printer: Printer {
                mode,
                bar: bar.clone(),
            },
            bar,
            total: total_nodes,
            per_node_lines: total_nodes <= PER_NODE_LINES_MAX,
            state: BTreeMap::new(),
            endings,
        }
    }

    pub fn printer(&self) -> Printer {
        self.printer.clone()
    }

    pub fn line(&self, text: &str) {
        self.printer.line(text)
    }

    fn stamp(&self, at_us: u64) -> String {
        format!("[{:>8.3}s]", at_us as f64 / 1e6)
    }

    pub fn on_event(&mut self, ev: &Event) {
        if self.mode == Mode::Quiet {
            return;
        }
        match &ev.kind {
            EventKind::Node {
                node_id: id,
                node_type,
                status,
                error,
                skip_reason,
                ..
            } => {
                let previous = self.state.insert(id.clone(), *status);
                if previous == Some(*status) {
                    return;
                }
                let node_id = clip(id, ECHO_MAX_CHARS);
                let node_type = clip(node_type, ECHO_MAX_CHARS);
                let error = error.as_deref().map(crate::exit::bounded);
                let terminal = !matches!(status, NodeStatus::Running | NodeStatus::Warning);
                let line = match status {
                    NodeStatus::Completed if self.per_node_lines => Some(format!(
                        "{} done     {node_id} ({node_type})",
                        self.stamp(ev.at_us)
                    )),
                    NodeStatus::Failed => Some(format!(
                        "{} FAILED   {node_id} ({node_type}): {}",
                        self.stamp(ev.at_us),
                        error.as_deref().unwrap_or("no message")
                    )),
                    NodeStatus::Skipped if self.per_node_lines => Some(format!(
                        "{} skipped  {node_id} ({node_type}){}",
                        self.stamp(ev.at_us),
                        skip_reason
                            .map(|r| format!(": {}", skip_reason_text(r)))
                            .unwrap_or_default()
                    )),
                    NodeStatus::Suspended => Some(format!(
                        "{} suspended {node_id} ({node_type})",
                        self.stamp(ev.at_us)
                    )),
                    NodeStatus::Warning => error
                        .as_ref()
                        .map(|e| format!("{} warning  {node_id}: {e}", self.stamp(ev.at_us))),
                    _ => None,
                };
                if terminal {
                    for l in self.endings.ended(id, line) {
                        self.line(&l);
                    }
                } else if let Some(l) = line {
                    self.line(&l);
                }
                self.redraw();
            }
            EventKind::Log {
                node_id,
                level,
                message,
            } if *level >= LogLevel::Info => {
                let node_id = clip(node_id, ECHO_MAX_CHARS);
                let tag = match level {
                    LogLevel::Warn => "warn ",
                    LogLevel::Error => "error",
                    _ => "log  ",
                };
                for l in message.lines() {
                    self.line(&format!("{} {tag}    {node_id}: {l}", self.stamp(ev.at_us)));
                }
            }
            EventKind::Escalation {
                node_id,
                escalation,
            } => {
                let node_id = clip(node_id, ECHO_MAX_CHARS);
                self.line(&format!(
                    "{} ⛨ escalated {node_id}: {}",
                    self.stamp(ev.at_us),
                    escalation_summary(escalation)
                ));
            }
            EventKind::Decision {
                node_id,
                verdict,
                decided_by,
                cost_usd,
            } => {
                let node_id = clip(node_id, ECHO_MAX_CHARS);
                let action = verdict
                    .get("action")
                    .and_then(|a| a.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| verdict.to_string());
                let cost = if *cost_usd > 0.0 {
                    format!(", ${cost_usd:.4}")
                } else {
                    String::new()
                };
                self.line(&format!(
                    "{} ⛨ decision {node_id}: {action} (by {decided_by}{cost})",
                    self.stamp(ev.at_us)
                ));
            }
            _ => {}
        }
    }

    fn redraw(&self) {
        let Some(bar) = &self.bar else { return };
        let mut running = Vec::new();
        let (mut finished, mut failed, mut skipped) = (0u64, 0, 0);
        for (id, s) in &self.state {
            match s {
                NodeStatus::Running => running.push(id.as_str()),
                NodeStatus::Completed | NodeStatus::Suspended => finished += 1,
                NodeStatus::Failed => {
                    finished += 1;
                    failed += 1
                }
                NodeStatus::Skipped => {
                    finished += 1;
                    skipped += 1
                }
                NodeStatus::Warning => {}
            }
        }
        bar.set_position(finished.min(self.total as u64));
        let mut msg = String::new();
        if failed > 0 {
            msg.push_str(&format!("{failed} failed  "));
        }
        if skipped > 0 {
            msg.push_str(&format!("{skipped} skipped  "));
        }
        if !running.is_empty() {
            let shown: Vec<&str> = running.iter().take(4).copied().collect();
            msg.push_str(&format!("running: {}", shown.join(", ")));
            if running.len() > shown.len() {
                msg.push_str(&format!(" +{}", running.len() - shown.len()));
            }
        }
        bar.set_message(msg);
    }

    /// Clears the status line and prints the one-line verdict of the run.
    pub fn finish(&mut self, status: RunStatus, supervised: bool, wall_us: u64) {
        // Endings still held wait for a feeder that never ended (a run that stopped
        // early): out now, in the order they came.
        for l in self.endings.rest() {
            self.line(&l);
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.printer.bar = None;
        if self.mode == Mode::Quiet {
            return;
        }
        let label = match (status, supervised) {
            (RunStatus::Completed, true) => "completed — supervised".to_string(),
            (s, _) => s.as_str().to_string(),
        };
        self.line(&format!("run {label} in {:.3}s", wall_us as f64 / 1e6));
    }
}

/// Node endings let out in causal order: a node's ending waits until every node feeding
/// it (by a data or a control edge) has ended.
struct Causal {
    feeders: HashMap<String, Vec<String>>,
    feeds: HashMap<String, Vec<String>>,
    /// Nodes whose ending is out (its line printed, or none to print).
    released: HashSet<String>,
    /// Endings waiting for a feeder's: node id → (arrival number, line).
    held: HashMap<String, (u64, Option<String>)>,
    arrivals: u64,
}

impl Causal {
    /// From the graph's edges, as (source id, target id).
    fn new<'a>(edges: impl Iterator<Item = (&'a str, &'a str)>) -> Causal {
        let mut feeders: HashMap<String, Vec<String>> = HashMap::new();
        let mut feeds: HashMap<String, Vec<String>> = HashMap::new();
        for (s, t) in edges {
            feeders
                .entry(t.to_string())
                .or_default()
                .push(s.to_string());
            feeds.entry(s.to_string()).or_default().push(t.to_string());
        }
        Causal {
            feeders,
            feeds,
            released: HashSet::new(),
            held: HashMap::new(),
            arrivals: 0,
        }
    }

    /// Node `id` ended (`line`, if it has one to print): the lines to print now, its own
    /// when every node feeding it has ended (else it is held until they have), then
    /// those held for it, in the order they came.
    fn ended(&mut self, id: &str, line: Option<String>) -> Vec<String> {
        self.arrivals += 1;
        self.held.insert(id.to_string(), (self.arrivals, line));
        let mut ready: BTreeMap<u64, String> = BTreeMap::new();
        if self.feeders_out(id) {
            ready.insert(self.arrivals, id.to_string());
        }
        let mut out = Vec::new();
        while let Some((_, id)) = ready.pop_first() {
            let Some((_, line)) = self.held.remove(&id) else {
                continue;
            };
            out.extend(line);
            self.released.insert(id.clone());
            for next in self.feeds.get(&id).into_iter().flatten() {
                if let Some(&(n, _)) = self.held.get(next)
                    && self.feeders_out(next)
                {
                    ready.insert(n, next.clone());
                }
            }
        }
        out
    }

    fn feeders_out(&self, id: &str) -> bool {
        self.feeders
            .get(id)
            .is_none_or(|f| f.iter().all(|s| self.released.contains(s)))
    }

    /// The lines still held (a feeder never ended: the run stopped early), in the order
    /// they came.
    fn rest(&mut self) -> Vec<String> {
        let mut held: Vec<(u64, Option<String>)> = self.held.drain().map(|(_, h)| h).collect();
        held.sort_by_key(|(n, _)| *n);
        held.into_iter().filter_map(|(_, l)| l).collect()
    }
}

/// Characters of an error detail shown on one progress line.
const DETAIL_MAX_CHARS: usize = 300;

/// What failed, for the escalation line: the failure signature when there is one (the
/// stable part a policy rule matches on), then the redacted error detail. Read through
/// the typed [`Escalation`] so a renamed field is a compile error here, not a blank line.
pub fn escalation_summary(escalation: &serde_json::Value) -> String {
    let Ok(e) = serde_json::from_value::<Escalation>(escalation.clone()) else {
        return "(unreadable escalation record)".into();
    };
    let first = e.detail.lines().next().unwrap_or_default();
    let detail = clip(first, DETAIL_MAX_CHARS);
    match e.failure_signature {
        Some(sig) => format!("[{sig}] {detail}"),
        None => detail.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::Causal;

    #[test]
    fn an_ending_waits_for_the_endings_of_what_fed_it() {
        // a -> b -> d, a -> c -> d, and e alone.
        let mut c = Causal::new([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")].into_iter());
        let line = |s: &str| Some(s.to_string());
        // `d` settles on the first value it got, before anything above it has ended.
        assert!(c.ended("d", line("d")).is_empty());
        assert!(c.ended("b", line("b")).is_empty());
        assert_eq!(c.ended("e", line("e")), ["e"]);
        // `a` ends: `b` is let out after it, `d` still waits for `c`.
        assert_eq!(c.ended("a", line("a")), ["a", "b"]);
        // A node with no line to print (a large graph's `done`) still lets out its own.
        assert_eq!(c.ended("c", None), ["d"]);
        assert!(c.rest().is_empty());
        // Held endings whose feeder never ends come out at the end, in arrival order.
        let mut c = Causal::new([("x", "y"), ("x", "z")].into_iter());
        assert!(c.ended("z", line("z")).is_empty());
        assert!(c.ended("y", line("y")).is_empty());
        assert_eq!(c.rest(), ["z", "y"]);
    }
}
