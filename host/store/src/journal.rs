//! The kernel's journal over a run log: records go to the [`RunLog`], and what an
//! earlier process recorded is reduced, per occurrence, to the crash table's decision.

use std::collections::HashMap;
use std::sync::Arc;

use heddle_core::{Occurrence, Record};
use heddle_kernel::executor::BoxFuture;
use heddle_kernel::{Journal, JournalError, Outputs, Prior};

use crate::fault::{self, Boundary};
use crate::{RunLog, Stored};

pub struct DurableJournal {
    log: Arc<RunLog>,
    prior: HashMap<Occurrence, Prior>,
}

impl DurableJournal {
    /// A journal writing to `log`, continuing after `records` (empty for a new run).
    /// `reoffer` says which uncertain occurrences an explicit resume offers again (the
    /// user decided); no other uncertain work is ever re-run.
    pub fn new(
        log: Arc<RunLog>,
        records: &[Stored],
        reoffer: &dyn Fn(&Occurrence) -> bool,
    ) -> Self {
        DurableJournal {
            log,
            prior: decide(records, reoffer),
        }
    }

    pub fn log(&self) -> &Arc<RunLog> {
        &self.log
    }
}

#[derive(Default)]
struct Seen {
    retry_safe: bool,
    dispatched: bool,
    started: bool,
    settled: Option<Prior>,
}

/// Seed 003's crash table, per occurrence, from the log alone.
fn decide(records: &[Stored], reoffer: &dyn Fn(&Occurrence) -> bool) -> HashMap<Occurrence, Prior> {
    let mut seen: HashMap<&Occurrence, Seen> = HashMap::new();
    for s in records {
        let Some(occ) = s.record.occurrence() else {
            continue;
        };
        let e = seen.entry(occ).or_default();
        match &s.record {
            Record::Dispatched { retry_safe, .. } => {
                e.dispatched = true;
                e.retry_safe = *retry_safe;
            }
            Record::Started { .. } => e.started = true,
            Record::Completed {
                outputs, emitted, ..
            } => {
                e.settled = Some(Prior::Completed {
                    outputs: outputs.iter().cloned().collect::<Outputs>(),
                    emitted: emitted
                        .iter()
                        .map(|(h, v)| (Arc::from(h.as_str()), v.clone()))
                        .collect(),
                })
            }
            Record::Failed { error, .. } => {
                e.settled = Some(Prior::Failed {
                    error: error.clone(),
                })
            }
            Record::Verdict { verdict, .. } => {
                let error = verdict
                    .get("error")
                    .and_then(|e| e.as_str())
                    .unwrap_or_default()
                    .to_string();
                match verdict.get("verdict").and_then(|v| v.as_str()) {
                    Some("skip") => e.settled = Some(Prior::Skipped { error }),
                    Some("end_stream") => e.settled = Some(Prior::EndedStream { error }),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    seen.into_iter()
        .map(|(occ, s)| {
            let prior = match s.settled {
                Some(p) => p,
                None if s.started && !s.retry_safe && !reoffer(occ) => Prior::Uncertain,
                None if s.dispatched || s.started => Prior::Redo,
                None => Prior::Fresh,
            };
            (occ.clone(), prior)
        })
        .collect()
}

fn node_of(r: &Record) -> &str {
    r.occurrence().map(|o| o.node.as_str()).unwrap_or("")
}

/// The boundary a record's write completes, for fault injection.
fn after(r: &Record) -> Option<Boundary> {
    match r {
        Record::Dispatched { .. } => Some(Boundary::AfterDispatch),
        Record::Started { .. } => Some(Boundary::AfterStart),
        Record::Completed { .. } | Record::Failed { .. } => Some(Boundary::AfterResult),
        _ => None,
    }
}

impl Journal for DurableJournal {
    fn prior(&self, occ: &Occurrence) -> Prior {
        self.prior.get(occ).cloned().unwrap_or(Prior::Fresh)
    }

    fn append(&self, record: Record) {
        if matches!(record, Record::Dispatched { .. }) {
            fault::check(Boundary::BeforeDispatch, node_of(&record));
        }
        let boundary = after(&record).map(|b| (b, node_of(&record).to_string()));
        self.log.append(record);
        if let Some((b, node)) = boundary {
            fault::check(b, &node);
        }
    }

    fn append_synced(&self, record: Record) -> BoxFuture<'static, Result<(), JournalError>> {
        let boundary = after(&record).map(|b| (b, node_of(&record).to_string()));
        let (_, wait) = self.log.append_synced(record);
        Box::pin(async move {
            wait.done().await.map_err(|e| JournalError {
                source: Arc::new(e),
            })?;
            if let Some((b, node)) = boundary {
                fault::check(b, &node);
            }
            Ok(())
        })
    }
}
