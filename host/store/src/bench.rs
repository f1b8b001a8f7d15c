//! Bench shapes as durable runs, shared by `heddle bench --durable` and the criterion
//! bench so both measure the same thing: a fresh run in a store (a scratch file, or a
//! PostgreSQL database), every invocation written ahead, timed from start to the last
//! record being on disk.

use std::sync::Arc;
use std::time::Instant;

use heddle_kernel::bench::{BenchError, BenchRun, CpuTime, Shape, run_shape_journaled};
use heddle_kernel::{Journal, Registry};

use crate::session::{self, Session};
use crate::{LogCounters, NewRun, RunStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DurableBenchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bench(#[from] BenchError),
}

/// One durable bench run: its timing and what its log wrote over the same span.
#[derive(Clone, Debug)]
pub struct DurableRun {
    pub run: BenchRun,
    pub log: LogCounters,
}

/// A new run in `store`, taken by this process.
pub fn scratch_session(store: Arc<dyn RunStore>) -> Result<Session, StoreError> {
    let run = NewRun {
        graph_name: "bench".into(),
        graph_bytes: Vec::new(),
        plan: Default::default(),
        inputs: Default::default(),
        secrets: Vec::new(),
        packages: Default::default(),
        limits: Default::default(),
    };
    Ok(session::begin(store, &run)?.1)
}

/// Runs `run` (a bench shape given the journal to write through) as a new durable run
/// in `store`. Wall and CPU time cover the run and the final sync (a durable run is not
/// done before its log is), not creating the run, and so do the counters. Call it
/// outside any runtime: it waits for the disk.
pub fn timed(
    store: Arc<dyn RunStore>,
    run: impl FnOnce(Arc<dyn Journal>) -> Result<BenchRun, BenchError>,
) -> Result<DurableRun, DurableBenchError> {
    let session = scratch_session(store)?;
    let before = session.log.counters();
    let cpu0 = CpuTime::now();
    let t0 = Instant::now();
    let mut r = run(session.journal.clone())?;
    session.log.flush().wait()?;
    r.elapsed = t0.elapsed();
    r.cpu = CpuTime::used_since(cpu0);
    let log = session.log.counters().since(before);
    session.log.close()?;
    Ok(DurableRun { run: r, log })
}

/// Runs the kernel's `shape` durably on `rt` in a new run of `store` ([`timed`]).
pub fn run_shape(
    rt: &tokio::runtime::Runtime,
    registry: &Registry,
    shape: Shape,
    n: usize,
    messages: usize,
    store: Arc<dyn RunStore>,
) -> Result<DurableRun, DurableBenchError> {
    timed(store, |journal| {
        rt.block_on(run_shape_journaled(
            registry,
            shape,
            n,
            messages,
            Some(journal),
        ))
    })
}
