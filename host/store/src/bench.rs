//! The kernel's bench shapes as durable runs, shared by `heddle bench --durable` and the
//! criterion bench so both measure the same thing: a fresh run in a scratch store, every
//! invocation written ahead, timed from start to the last record being on disk.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use heddle_kernel::Registry;
use heddle_kernel::bench::{BenchError, BenchRun, CpuTime, Shape, run_shape_journaled};

use crate::session::{self, Session};
use crate::{NewRun, SqliteStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DurableBenchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bench(#[from] BenchError),
}

/// A new run in the store at `path` (created if needed), taken by this process.
pub fn scratch_session(path: &Path) -> Result<Session, StoreError> {
    let store = Arc::new(SqliteStore::open(path)?);
    let run = NewRun {
        graph_name: "bench".into(),
        graph_bytes: Vec::new(),
        plan: serde_json::Value::Null,
        inputs: Default::default(),
        secrets: Vec::new(),
        packages: Default::default(),
        limits: serde_json::Value::Null,
    };
    Ok(session::begin(store, &run)?.1)
}

/// Runs `shape` durably on `rt` in a new run of the store at `path`. Wall and CPU time
/// cover the run and the final sync (a durable run is not done before its log is), not
/// creating the run. Call it outside the runtime: it waits for the disk.
pub fn run_shape(
    rt: &tokio::runtime::Runtime,
    registry: &Registry,
    shape: Shape,
    n: usize,
    messages: usize,
    path: &Path,
) -> Result<BenchRun, DurableBenchError> {
    let session = scratch_session(path)?;
    let cpu0 = CpuTime::now();
    let t0 = Instant::now();
    let mut r = rt.block_on(run_shape_journaled(
        registry,
        shape,
        n,
        messages,
        Some(session.journal.clone()),
    ))?;
    session.log.flush().wait()?;
    r.elapsed = t0.elapsed();
    r.cpu = CpuTime::used_since(cpu0);
    session.log.close()?;
    Ok(r)
}
