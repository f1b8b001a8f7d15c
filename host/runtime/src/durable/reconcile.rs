//! A person answers a reconcile pause (`heddle runs resume RUN --pause N
//! --completed-with OUTPUTS.json | --skip`, the server's resume route, the viewer): the
//! invocation whose start was recorded without a result is settled without running it.
//! The seed's model allows three answers to uncertain work: offer it again (a plain
//! resume of the pause, which records nothing more), it completed with these outputs,
//! or skip it. The last two are a [`Record::Reconciled`] with who answered and why (and,
//! for a completion, the [`Record::Completed`] holding the outputs), written with the
//! take-over's first records in one transaction: on disk exactly when the pause is
//! closed, carried out by every later recovery, never asked again.
//!
//! Everything is checked before anything is written: that the run is paused for
//! reconciliation, that the outputs are the node's declared outputs with their declared
//! types (and fields), that no value holds a known secret and that the values fit the
//! store's limits.

use std::collections::BTreeMap;

use heddle_core::plan::Plan;
use heddle_core::{InvocationMetrics, Occurrence, PauseReason, ReconcileAnswer, Record, Value};
use heddle_kernel::SecretRegistry;
use heddle_store::RunStore;
use heddle_store::artifacts::ArtifactError;
use heddle_store::session::Resumption;

use crate::settings::StoreSettings;

/// What a person says became of the uncertain invocation.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Its effect happened, and these are its outputs (by output handle, as JSON).
    Completed(serde_json::Map<String, serde_json::Value>),
    /// Leave it undone: it is skipped (reason `reconciled`), and what it feeds is
    /// skipped as after any skip.
    Skip,
}

impl Answer {
    fn recorded(&self) -> ReconcileAnswer {
        match self {
            Answer::Completed(_) => ReconcileAnswer::Completed,
            Answer::Skip => ReconcileAnswer::Skipped,
        }
    }
}

/// A person's answer as given: what became of the work, who says so and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Given {
    /// What became of the uncertain invocation.
    pub answer: Answer,
    /// Who answers (a login name; what an API client says).
    pub by: String,
    /// Why: what they saw that tells them (required; recorded with the answer).
    pub note: String,
}

/// A person's answer to a run's reconcile pause, checked against the pause (nothing is
/// written): recorded by [`crate::Runtime::reopen`] once the outputs are checked
/// against the node's declaration.
#[derive(Clone, Debug)]
pub struct Reconciliation {
    run: String,
    occurrence: Occurrence,
    answer: Answer,
    by: String,
    note: String,
}

/// A person's answer that cannot be taken; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The file of outputs a person supplies (`--completed-with`) cannot be read, is not
    /// JSON, or is not an object of output handle to value.
    #[error("--completed-with {path}: {problem}")]
    OutputsFile {
        /// The file as given.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The run's open pause is not a reconcile pause (or it has none).
    #[error(
        "run {run} is not paused for reconciliation ({found}): only the pause of uncertain work (`heddle runs show {run}` says `reconcile`) is answered with a completion or a skip; nothing was written"
    )]
    NotReconcile {
        /// The run.
        run: String,
        /// What it is paused for, or its state.
        found: String,
    },
    /// The answer says nothing of who gave it or why.
    #[error(
        "run {run}: an answer to a reconcile pause needs {what} (it is recorded with the answer); nothing was written"
    )]
    Unexplained {
        /// The run.
        run: String,
        /// What is missing.
        what: &'static str,
    },
    /// The supplied outputs are not the node's declared outputs and types.
    #[error(
        "run {run}: the outputs supplied for node `{node}` (invocation {occurrence}) do not match what it declares: {problems}; nothing was written"
    )]
    Outputs {
        /// The run.
        run: String,
        /// The node.
        node: String,
        /// The uncertain invocation.
        occurrence: String,
        /// Every mismatch, naming the handle.
        problems: String,
    },
    /// A supplied value cannot be stored (it holds a known secret, or is over the
    /// store's limits).
    #[error(
        "run {run}: the outputs supplied for node `{node}` cannot be recorded; nothing was written"
    )]
    Unstorable {
        /// The run.
        run: String,
        /// The node.
        node: String,
        /// Why (KNOWN_SECRET, STORAGE_LIMIT_EXCEEDED).
        #[source]
        source: Box<ArtifactError>,
    },
}

impl ReconcileError {
    /// Whether the run's state, not the request, is what refuses it (an HTTP 409).
    pub fn is_conflict(&self) -> bool {
        matches!(self, ReconcileError::NotReconcile { .. })
    }
}

/// Checks that `r` (a resume of an explicit pause) is paused for reconciliation and
/// that `given` says who answered and why; nothing is written.
pub fn reconciliation(r: &Resumption, given: Given) -> Result<Reconciliation, ReconcileError> {
    let run = r.header.run_id.clone();
    let occurrence = match r.pause.as_ref().map(|p| &p.reason) {
        Some(PauseReason::Reconcile { occurrence }) => occurrence.clone(),
        Some(PauseReason::Suspend { node, reason }) => {
            return Err(ReconcileError::NotReconcile {
                run,
                found: format!("it waits at `{node}`: {reason}"),
            });
        }
        Some(PauseReason::Interrupted) => {
            return Err(ReconcileError::NotReconcile {
                run,
                found: "it was interrupted; nothing is uncertain".into(),
            });
        }
        Some(PauseReason::Budget { detail }) => {
            return Err(ReconcileError::NotReconcile {
                run,
                found: format!("its budget ran out: {detail}"),
            });
        }
        None => {
            return Err(ReconcileError::NotReconcile {
                run,
                found: format!("it is {}, with no open pause", r.view.state.as_str()),
            });
        }
    };
    let Given { answer, by, note } = given;
    let (by, note) = (by.trim(), note.trim());
    for (value, what) in [(by, "who answered"), (note, "a note saying why")] {
        if value.is_empty() {
            return Err(ReconcileError::Unexplained { run, what });
        }
    }
    Ok(Reconciliation {
        run,
        occurrence,
        answer,
        by: by.to_string(),
        note: note.to_string(),
    })
}

impl Reconciliation {
    /// The uncertain invocation answered.
    pub fn occurrence(&self) -> &Occurrence {
        &self.occurrence
    }

    /// What was answered.
    pub fn answer(&self) -> &Answer {
        &self.answer
    }

    /// The records of the answer, ready for the take-over's transaction: the outputs
    /// checked against what the node declares in `plan` (every declared output, none
    /// other, each of its type and declared fields; an int given for a float widened),
    /// large values stored as artifacts of the run under `settings`' limits, none
    /// holding one of `secrets`, and the text masked. Nothing is written unless every
    /// check passed (then only the artifacts of large values, which the take-over's
    /// records refer to).
    pub(crate) fn records(
        &self,
        plan: &Plan,
        settings: &StoreSettings,
        store: &dyn RunStore,
        secrets: &SecretRegistry,
    ) -> Result<Vec<Record>, ReconcileError> {
        let mut records = vec![Record::Reconciled {
            occurrence: self.occurrence.clone(),
            answer: self.answer.recorded(),
            by: self.by.clone(),
            note: self.note.clone(),
        }];
        if let Answer::Completed(given) = &self.answer {
            let outputs = self.checked(plan, given)?;
            let spill = settings.spill(secrets);
            let result = Record::Completed {
                occurrence: self.occurrence.clone(),
                outputs,
                emitted: Vec::new(),
                // Nothing of the attempt was measured: its usage stays unknown.
                metrics: InvocationMetrics::default(),
            };
            let result =
                heddle_store::spill::spill(store, &self.run, &spill, result).map_err(|source| {
                    ReconcileError::Unstorable {
                        run: self.run.clone(),
                        node: self.occurrence.node.clone(),
                        source: Box::new(source),
                    }
                })?;
            records.push(result);
        }
        let known = secrets.snapshot();
        Ok(match heddle_store::secrets::redactor(&known) {
            Some(r) => records
                .into_iter()
                .map(|record| heddle_store::secrets::mask_record(&r, record))
                .collect(),
            None => records,
        })
    }

    /// `given` checked against the outputs the node declares, in their declared order.
    fn checked(
        &self,
        plan: &Plan,
        given: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Vec<(String, Value)>, ReconcileError> {
        let node = &self.occurrence.node;
        let mismatch = |problems: String| ReconcileError::Outputs {
            run: self.run.clone(),
            node: node.clone(),
            occurrence: self.occurrence.to_string(),
            problems,
        };
        let Some(planned) = plan.nodes.iter().find(|n| &*n.id == node.as_str()) else {
            return Err(mismatch("the run's graph has no such node".into()));
        };
        let declared =
            heddle_kernel::supervisor::declared_outputs(&planned.decl, planned.contract.as_deref());
        let values: BTreeMap<String, Value> = given
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_json(v.clone())))
            .collect();
        let mut checked =
            heddle_core::supervise::check_substitute(&values, &declared).map_err(mismatch)?;
        Ok(planned
            .decl
            .outputs
            .iter()
            .filter_map(|o| Some((o.name.clone(), checked.remove(&o.name)?)))
            .collect())
    }
}

/// What the node of `header`'s run at `node` declares for its outputs (type, and the
/// fields the graph promised, by handle): what an answer that its work completed must
/// supply, for a person to see before answering. `None` when the stored graph no longer
/// plans here (a package missing).
pub fn declared_outputs(
    runtime: &crate::Runtime,
    header: &heddle_store::RunHeader,
    node: &str,
) -> Option<BTreeMap<String, heddle_core::supervise::DeclaredOutput>> {
    let doc = super::stored_graph(header).ok()?;
    // A node inside a graph node too: planned from the documents the run recorded.
    let comp = super::recorded(header, &doc);
    let plan = runtime
        .plan_with(&doc, &header.run.graph_name, &comp)
        .ok()?;
    let planned = plan.nodes.iter().find(|n| &*n.id == node)?;
    Some(heddle_kernel::supervisor::declared_outputs(
        &planned.decl,
        planned.contract.as_deref(),
    ))
}

/// The outputs a person supplies in a file (`heddle runs resume --completed-with`): a
/// JSON object, output handle to value, checked against the node's declaration once the
/// run's graph is planned ([`reconciliation`] and the reopening).
pub fn read_outputs(
    path: &std::path::Path,
) -> Result<serde_json::Map<String, serde_json::Value>, ReconcileError> {
    let problem = |problem: String| ReconcileError::OutputsFile {
        path: path.display().to_string(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| problem(e.to_string()))?;
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(outputs)) => Ok(outputs),
        Ok(other) => Err(problem(format!(
            "expected a JSON object of the node's outputs (output handle to value), found {}",
            json_kind(&other)
        ))),
        Err(e) => Err(problem(format!("not JSON: {e}"))),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Who answers when nobody says ([`Given::by`] from a command line without `--by`): the
/// login name, else the user id this process runs as.
pub fn login_name() -> String {
    use std::os::unix::fs::MetadataExt as _;
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
        .or_else(|| {
            Some(format!(
                "uid {}",
                std::fs::metadata("/proc/self").ok()?.uid()
            ))
        })
        .unwrap_or_else(|| "unknown user".into())
}
