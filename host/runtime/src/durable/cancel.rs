//! Cancelling a stored run from wherever the request is made (`heddle runs cancel`, a
//! server's API for a run it does not drive): a run nobody drives is taken over and
//! recorded cancelled here; a run a live process or another host drives is asked through
//! the store ([`RunStore::request_cancel`]), and its owner cancels it itself (its writes
//! are never cut off), which this waits for. A run ended here has its span sent and
//! its ending counted by what watches this process ([`Watch::ended`]); one its owner
//! ended, by its owner.

use std::sync::Arc;
use std::time::{Duration, Instant};

use heddle_store::session;
use heddle_store::status::RunView;
use heddle_store::{RunState, RunStore, StoreError};

use crate::telemetry::Watch;

/// How often the state of a run whose owner was asked to cancel it is looked at.
const LOOK: Duration = Duration::from_millis(100);

/// What came of a cancel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The cancel and the run's ending are recorded (here, or by its owner as asked).
    Ended,
    /// Its owner (`owner`: "process PID" or "host ID") was asked and has not ended the
    /// run within the wait; the request is recorded, and it ends the run when it sees
    /// it.
    Asked {
        /// Who was asked.
        owner: String,
    },
}

/// Who drives a running run, for messages: its host on a store several hosts share,
/// else its process.
pub fn owner_of(view: &RunView) -> String {
    match &view.owner_host {
        Some(h) => format!("host {h}"),
        None => format!("process {}", view.owner_pid.unwrap_or(0)),
    }
}

/// Cancels `run` wherever it is: taken over and recorded cancelled here when nobody
/// drives it (paused, interrupted, queued), or its owner asked and waited for up to
/// `wait` (`asked` is told whom, once). A run that changes hands meanwhile is looked at
/// again. An ended run is refused ([`StoreError::AlreadyEnded`]), unless it is the
/// cancel asked for here. `secrets` are the known secret values, masked out of what is
/// written here (see [`session::end_cancelled`]); `watch` sends the span of a run
/// ended here and counts it. Blocks (the store, the wait).
pub fn cancel_run(
    store: &Arc<dyn RunStore>,
    run: &str,
    secrets: &[String],
    wait: Duration,
    asked: &mut dyn FnMut(&str),
    watch: &Watch,
) -> Result<Cancelled, StoreError> {
    let deadline = Instant::now() + wait;
    let mut owner: Option<String> = None;
    loop {
        let lifecycle = store.read_lifecycle(run)?;
        let view = RunView::fold_as(&lifecycle, &store.liveness(run)?);
        match view.state {
            RunState::Cancelled if owner.is_some() => return Ok(Cancelled::Ended),
            RunState::Running => {
                let who = owner_of(&view);
                if owner.is_none() {
                    store.request_cancel(run)?;
                    asked(&who);
                    owner = Some(who.clone());
                }
                if Instant::now() >= deadline {
                    return Ok(Cancelled::Asked { owner: who });
                }
                std::thread::sleep(LOOK);
            }
            RunState::Paused | RunState::Interrupted | RunState::Queued => {
                match cancel_unowned(store, run, secrets, watch) {
                    Ok(()) => return Ok(Cancelled::Ended),
                    // The owner asked here ended it cancelled between the two reads
                    // above (its log read before its ending, its lease after it let go):
                    // the cancel asked for.
                    Err(StoreError::AlreadyEnded {
                        state: "cancelled", ..
                    }) if owner.is_some() => return Ok(Cancelled::Ended),
                    // Taken by someone else meanwhile: see what it is now.
                    Err(
                        e @ (StoreError::TakenOver { .. }
                        | StoreError::Live { .. }
                        | StoreError::RunOwned { .. }),
                    ) => {
                        if Instant::now() >= deadline {
                            return Err(e);
                        }
                        std::thread::sleep(LOOK);
                    }
                    Err(e) => return Err(e),
                }
            }
            state => {
                return Err(StoreError::AlreadyEnded {
                    run: run.to_string(),
                    state: state.as_str(),
                });
            }
        }
    }
}

/// Cancels `run`, which nobody drives (paused, interrupted, queued), here
/// ([`session::cancel`]), then sends its span and counts its ending (`watch`): the one
/// way a run nobody drives is cancelled, so none ends without its span. A run someone
/// drives is refused ([`StoreError::Live`], [`StoreError::RunOwned`]). Blocks.
pub fn cancel_unowned(
    store: &Arc<dyn RunStore>,
    run: &str,
    secrets: &[String],
    watch: &Watch,
) -> Result<(), StoreError> {
    session::cancel(store.clone(), run, secrets)?;
    watch.ended(&**store, run, secrets);
    Ok(())
}
