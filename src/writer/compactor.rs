//! Background compaction for a writing index: merges run on their own thread, so ingest never
//! waits for one and queries never see a stall (a merge holds no lock of the tree and swaps its
//! result in at once; see `lsm::compaction`).
//!
//! Invariants:
//! - One compaction at a time (`Index::compact_once` serializes them anyway); a long merge runs
//!   the lower tiers' merges between its passes (`index::compact`).
//! - `nudge` never blocks: a nudge while a nudge is pending is merged into it (bounded channel of
//!   one), so a writer flushing faster than merges finish cannot queue unbounded work.
//! - `settle` asks, once the tiers are drained, for the runs of each tree's lowest tier to be
//!   merged into one (`Index::settle_once`); like a nudge it never blocks and repeated asks
//!   are one.
//! - `finish` drains and settles: it returns once no tier is full and no tree has two runs in
//!   tier 0, and reports the first error (a merge that failed leaves its inputs in place, so
//!   nothing is lost; the error says why).
//! - Wall time comes from the injected `Clock`, read only to stamp retired tables.

use crate::base::clock::Clock;
use crate::index::{Index, IndexError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

pub struct Compactor {
    nudges: SyncSender<()>,
    /// A settle asked for and not yet begun.
    settle_wanted: Arc<AtomicBool>,
    worker: JoinHandle<Result<usize, IndexError>>,
}

impl Compactor {
    /// Starts the worker thread; `runtime` is used for reads of tables that are not local.
    pub fn spawn(index: Arc<Index>, runtime: tokio::runtime::Handle, clock: Clock) -> Self {
        let (nudges, wake) = sync_channel(1);
        let settle_wanted = Arc::new(AtomicBool::new(false));
        let wanted = settle_wanted.clone();
        let worker = std::thread::Builder::new()
            .name("compactor".into())
            .spawn(move || work(&index, &runtime, &clock, (wake, &wanted)))
            .expect("spawning the compactor thread");
        Compactor { nudges, settle_wanted, worker }
    }

    /// Asks for each tree's lowest tier to be merged into one run once the tiers are drained
    /// (a quiet writer). Never blocks.
    pub fn settle(&self) {
        self.settle_wanted.store(true, Ordering::Release);
        self.nudge();
    }

    /// Asks for a check of the tiers (after a flush). Never blocks.
    pub fn nudge(&self) {
        match self.nudges.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) => {}
            Err(TrySendError::Disconnected(())) => tracing::warn!("the compactor has stopped; nudge ignored"),
        }
    }

    /// Runs the remaining merges and settles every tree, stops the worker and returns how many
    /// merges it made.
    pub fn finish(self) -> Result<usize, IndexError> {
        drop(self.nudges);
        self.worker.join().unwrap_or_else(|_| Err(IndexError::Background("the compactor thread panicked".into())))
    }
}

/// Merges until no tier is full after every nudge, and settles when asked; after the last
/// sender is gone, a final drain and settle.
fn work(
    index: &Index,
    runtime: &tokio::runtime::Handle,
    clock: &Clock,
    (wake, settle_wanted): (Receiver<()>, &AtomicBool),
) -> Result<usize, IndexError> {
    let merged_before = index.counters.compactions.load(Ordering::Relaxed);
    while wake.recv().is_ok() {
        drain(index, runtime, clock)?;
        if settle_wanted.swap(false, Ordering::AcqRel) {
            settle(index, runtime, clock)?;
        }
    }
    drain(index, runtime, clock)?;
    settle(index, runtime, clock)?;
    // Every merge, those made between the passes of another too (the only merges of the index).
    Ok((index.counters.compactions.load(Ordering::Relaxed) - merged_before) as usize)
}

/// Settles tree after tree, draining after each (a settled run may fill the tier above).
fn settle(index: &Index, runtime: &tokio::runtime::Handle, clock: &Clock) -> Result<(), IndexError> {
    while index.settle_once(runtime, &|| clock())? {
        drain(index, runtime, clock)?;
    }
    Ok(())
}

fn drain(index: &Index, runtime: &tokio::runtime::Handle, clock: &Clock) -> Result<(), IndexError> {
    while index.compact_once(runtime, &|| clock())? {}
    Ok(())
}
