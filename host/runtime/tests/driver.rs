//! The run driver on real durable runs (a SQLite store on disk, and a PostgreSQL
//! database): how each way of stopping a run ends it, as its log records it. The run is
//! held open by a streaming input nobody feeds, so only the stop under test can end it.

/// The store tests' support: a fresh database per test on the tests' PostgreSQL server
/// (`HEDDLE_TEST_PG_URL`, else one started for this binary by scripts/pg-up).
#[path = "../../store/tests/support/mod.rs"]
mod support;

use support::Backend;

/// One async test body per store (`mod sqlite`, `mod postgres`): the driver's endings do
/// not depend on the store.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name(super::Backend::Sqlite).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   if super::support::skip_pg() { return; }
                   super::$name(super::Backend::Postgres).await
               } )*
        }
    };
}

on_both_stores!(
    an_interrupt_pauses_a_durable_run_and_it_can_be_resumed,
    a_cancel_ends_a_durable_run_cancelled_and_records_the_request,
    a_stop_records_no_ending_so_the_next_owner_adopts_the_run,
    the_time_limit_ends_a_durable_run_and_says_so,
    a_run_cancelled_before_its_slot_ends_unrun_and_one_stopped_is_left_as_it_is,
    a_run_in_memory_has_no_ending_to_record,
    a_cancel_accepted_before_the_kernel_refuses_the_run_is_recorded,
);

use std::collections::BTreeMap;
use std::sync::Arc;

use heddle_core::{PauseReason, Record};
use heddle_runtime::durable::check_resume;
use heddle_runtime::{Drive, Ending, Exit, GraphDoc, Overrides, RunStatus, Runtime, Settings};
use heddle_store::{Budget, RunStore};

/// An input that streams until it is told the stream ended, into an output.
const OPEN: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "in", "type": "heddle.input", "properties": {"name": "x", "type": "int", "streaming": true}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;

struct Env {
    _dir: tempfile::TempDir,
    runtime: Runtime,
    store: Arc<dyn RunStore>,
}

async fn env(backend: Backend) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::load(&Overrides::default()).unwrap();
    settings.store.path = dir.path().join("runs.db");
    if backend == Backend::Postgres {
        // The helper runs a small runtime of its own: off this one's threads.
        let url = tokio::task::spawn_blocking(support::fresh_database)
            .await
            .unwrap();
        settings.store.url = Some(url);
    }
    let runtime = Runtime::load(settings, None).await.unwrap();
    let store = runtime.settings().store.open().unwrap();
    Env {
        _dir: dir,
        runtime,
        store,
    }
}

impl Env {
    /// A durable run of the open graph with `budget`, begun (its first record on disk).
    async fn begin(&self, budget: Budget) -> (String, Drive) {
        let doc = GraphDoc::parse(OPEN, "open.json").unwrap();
        let plan = self.runtime.plan(&doc, "open.json").unwrap();
        let opts = self.runtime.options(BTreeMap::new(), None);
        let run = self
            .runtime
            .new_run("open.json".into(), OPEN.into(), &plan, &opts, budget)
            .unwrap();
        let (header, drive) = self
            .runtime
            .begin(self.store.clone(), run, plan, opts)
            .await
            .unwrap();
        (header.run_id, drive)
    }

    fn records(&self, run: &str) -> Vec<Record> {
        let read = self.store.read(run, 0).unwrap();
        read.records.into_iter().map(|s| s.record).collect()
    }
}

async fn an_interrupt_pauses_a_durable_run_and_it_can_be_resumed(backend: Backend) {
    let env = env(backend).await;
    let (run, drive) = env.begin(Budget::default()).await;
    let running = drive.prepare(env.runtime.registry()).await.unwrap().start();
    running.control().interrupt();
    let finished = running.finish().await;
    assert_eq!(finished.exit(), Exit::Suspended);
    let ending = finished.record().await.unwrap();
    assert!(
        matches!(
            ending,
            Some(Ending::Paused {
                reason: PauseReason::Interrupted,
                ..
            })
        ),
        "{ending:?}"
    );
    assert!(!env.records(&run).contains(&Record::CancelRequested));
    check_resume(&*env.store, &run, None).expect("a paused run is resumable");
}

async fn a_cancel_ends_a_durable_run_cancelled_and_records_the_request(backend: Backend) {
    let env = env(backend).await;
    let (run, drive) = env.begin(Budget::default()).await;
    let running = drive.prepare(env.runtime.registry()).await.unwrap().start();
    running.control().cancel();
    let finished = running.finish().await;
    assert_eq!(finished.exit(), Exit::Cancelled);
    let ending = finished.record().await.unwrap();
    assert!(
        matches!(ending, Some(Ending::Finished(RunStatus::Cancelled))),
        "{ending:?}"
    );
    assert!(env.records(&run).contains(&Record::CancelRequested));
    assert!(
        check_resume(&*env.store, &run, None).is_err(),
        "never resumed"
    );
}

async fn a_stop_records_no_ending_so_the_next_owner_adopts_the_run(backend: Backend) {
    let env = env(backend).await;
    let (run, drive) = env.begin(Budget::default()).await;
    let running = drive.prepare(env.runtime.registry()).await.unwrap().start();
    running.control().stop();
    let finished = running.finish().await;
    assert!(finished.planned().is_none());
    assert!(finished.record().await.unwrap().is_none());
    let records = env.records(&run);
    assert!(
        !records
            .iter()
            .any(|r| matches!(r, Record::Finished { .. } | Record::Paused { .. })),
        "no ending: {records:?}"
    );
}

async fn the_time_limit_ends_a_durable_run_and_says_so(backend: Backend) {
    let env = env(backend).await;
    let budget = Budget {
        time_limit_ms: Some(50),
        ..Budget::default()
    };
    let (_, drive) = env.begin(budget).await;
    let control = drive.control();
    let running = drive.prepare(env.runtime.registry()).await.unwrap().start();
    control.time_limit_reached().await;
    let finished = running.finish().await;
    assert_eq!(finished.exit(), Exit::Limit);
    let ending = finished.record().await.unwrap();
    assert!(matches!(ending, Some(Ending::Exhausted(_))), "{ending:?}");
}

async fn a_run_cancelled_before_its_slot_ends_unrun_and_one_stopped_is_left_as_it_is(
    backend: Backend,
) {
    let env = env(backend).await;
    let (run, drive) = env.begin(Budget::default()).await;
    drive.control().cancel();
    let outcome = drive
        .run_when(env.runtime.registry(), std::future::pending::<()>())
        .await
        .unwrap();
    assert!(outcome.result.is_none(), "it never started");
    assert!(
        matches!(outcome.ending, Some(Ending::Finished(RunStatus::Cancelled))),
        "{:?}",
        outcome.ending
    );
    assert!(env.records(&run).contains(&Record::CancelRequested));

    let (run, drive) = env.begin(Budget::default()).await;
    drive.control().stop();
    let outcome = drive
        .run_when(env.runtime.registry(), std::future::pending::<()>())
        .await
        .unwrap();
    assert!(outcome.result.is_none() && outcome.ending.is_none());
    assert!(
        !env.records(&run)
            .iter()
            .any(|r| matches!(r, Record::Finished { .. })),
    );
}

async fn a_run_in_memory_has_no_ending_to_record(backend: Backend) {
    let env = env(backend).await;
    let doc = GraphDoc::parse(OPEN, "open.json").unwrap();
    let plan = env.runtime.plan(&doc, "open.json").unwrap();
    let drive = Drive::in_memory(plan, env.runtime.options(BTreeMap::new(), None));
    let running = drive.prepare(env.runtime.registry()).await.unwrap().start();
    running.control().interrupt();
    let finished = running.finish().await;
    assert_eq!(finished.result.status, RunStatus::Cancelled);
    assert_eq!(finished.exit(), Exit::Cancelled);
    assert!(finished.record().await.unwrap().is_none());
}

/// A cancel accepted before the kernel refused the run (a server's 202 to a client) is
/// recorded with the failed ending, and one after it is refused: an acknowledged cancel
/// is never lost.
async fn a_cancel_accepted_before_the_kernel_refuses_the_run_is_recorded(backend: Backend) {
    const NEEDS_X: &str = r#"{"format": "heddle.graph", "version": 1,
      "nodes": [
        {"id": "in", "type": "heddle.input", "properties": {"name": "x", "type": "int"}},
        {"id": "out", "type": "heddle.output"}],
      "edges": [{"source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;
    let env = env(backend).await;
    let doc = GraphDoc::parse(NEEDS_X, "needs-x.json").unwrap();
    let plan = env.runtime.plan(&doc, "needs-x.json").unwrap();
    // Recorded without the value `x` needs: the kernel refuses to build the run.
    let opts = env.runtime.options(BTreeMap::new(), None);
    let run = env
        .runtime
        .new_run(
            "needs-x.json".into(),
            NEEDS_X.into(),
            &plan,
            &opts,
            Budget::default(),
        )
        .unwrap();
    let (header, drive) = env
        .runtime
        .begin(env.store.clone(), run, plan, opts)
        .await
        .unwrap();
    let control = drive.control();
    assert!(control.request_cancel(), "a cancel before the start counts");
    assert!(drive.prepare(env.runtime.registry()).await.is_err());
    assert!(!control.request_cancel(), "the ending is decided");
    let records = env.records(&header.run_id);
    assert!(records.contains(&Record::CancelRequested), "{records:#?}");
    assert!(
        matches!(
            records.last(),
            Some(Record::Finished {
                status: RunStatus::Failed,
                ..
            })
        ),
        "{records:#?}"
    );
}
