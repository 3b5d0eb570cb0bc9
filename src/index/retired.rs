//! Local files of tables a merge retired: removed at once, or, while a publish is uploading,
//! when the last publish in flight ends.
//!
//! Invariants:
//! - A publish enters (`Index::enter_publish`) before it looks at the catalog, so every table it
//!   names was live after it entered: a merge that retires one later finds the publish in flight
//!   and leaves the files for it. A publish therefore never meets a missing file of a table it
//!   named, however many merges overtake it, and needs no second look.
//! - Files left behind are removed when the last publish in flight leaves (its guard's drop),
//!   so they outlive the merge by at most one publish's uploads. A removal that fails then is
//!   logged; the files are orphans that the next open removes.

use super::{Index, IndexError, io_err};
use crate::model::ids::TreeKind;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// Publishes in flight, and the retired tables whose local files wait for them.
#[derive(Debug, Default)]
pub(super) struct RetiredFiles {
    state: Mutex<RetiredState>,
}

#[derive(Debug, Default)]
struct RetiredState {
    publishes_in_flight: usize,
    waiting: Vec<(TreeKind, String)>,
}

/// A publish in flight; leaving it (dropping the guard) removes the files that waited for it.
pub(super) struct PublishInFlight<'a> {
    index: &'a Index,
}

impl Index {
    /// Marks a publish in flight until the guard is dropped.
    pub(super) fn enter_publish(&self) -> PublishInFlight<'_> {
        self.retired_files.lock().publishes_in_flight += 1;
        PublishInFlight { index: self }
    }

    /// Removes the local files of `ids` (tables of `tree` a merge just retired), or leaves them
    /// to the publishes in flight.
    pub(super) fn remove_retired_files(&self, tree: TreeKind, ids: &[String]) -> Result<(), IndexError> {
        {
            let mut state = self.retired_files.lock();
            if state.publishes_in_flight > 0 {
                state.waiting.extend(ids.iter().map(|id| (tree, id.clone())));
                self.counters.retired_files_kept_for_publish.fetch_add(ids.len() as u64, Ordering::Relaxed);
                return Ok(());
            }
        }
        let files = self.tree_files(tree);
        for id in ids {
            files.remove_local(id).map_err(io_err(files.dir()))?;
        }
        Ok(())
    }
}

impl RetiredFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, RetiredState> {
        self.state.lock().expect("retired files lock poisoned")
    }
}

impl Drop for PublishInFlight<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut state = self.index.retired_files.lock();
            state.publishes_in_flight -= 1;
            if state.publishes_in_flight > 0 {
                return;
            }
            std::mem::take(&mut state.waiting)
        };
        for (tree, id) in waiting {
            let files = self.index.tree_files(tree);
            if let Err(error) = files.remove_local(&id) {
                tracing::warn!(table = %id, %error, "could not remove a retired table's local files");
            }
        }
    }
}
