//! Garbage collection: retired tables (objects, local files, catalog rows) deleted once their
//! grace period is over, and objects under `tables/` that no catalog row knows (a crash's).
//!
//! Invariants:
//! - A table is deleted only when it retired at least the grace period ago and the newest known
//!   manifest does not name it (a reader may still hold an older manifest for that long).

use super::{Index, IndexError, io_err};
use crate::lsm::handle::table_key;
use crate::lsm::record::TableRecord;

impl Index {
    /// Deletes retired tables (objects, local files, catalog rows) that retired at least
    /// `grace_ms` before `now_ms` and that the current manifest no longer names, then objects
    /// under `tables/` that the catalog does not know at all (left by a crash). Returns how many
    /// tables and orphan objects it removed.
    pub async fn collect_garbage(&self, now_ms: u64, grace_ms: u64) -> Result<(usize, usize), IndexError> {
        let published = self.published().await?.table_ids;
        let mut retired = 0;
        for (record, _) in self.catalog.obsolete_tables(now_ms.saturating_sub(grace_ms))? {
            if published.contains(&record.id) {
                continue;
            }
            for ext in ["data", "meta"] {
                self.store.delete(&table_key(record.tree, &record.id, ext)).await?;
            }
            self.remove_local_table(&record)?;
            self.catalog.forget_table(&record.id)?;
            retired += 1;
        }
        let orphans = self.delete_orphan_objects().await?;
        Ok((retired, orphans))
    }

    pub(super) fn remove_local_table(&self, record: &TableRecord) -> Result<(), IndexError> {
        let files = self.tree_files(record.tree);
        files.remove_local(&record.id).map_err(io_err(files.dir()))
    }

    /// Objects under `tables/` whose table id the catalog does not know.
    async fn delete_orphan_objects(&self) -> Result<usize, IndexError> {
        let known = self.catalog.known_table_ids()?;
        let mut removed = 0;
        for object in self.store.list("tables/").await? {
            let id = object.key.rsplit('/').next().and_then(|name| name.split('.').next()).unwrap_or("");
            if !known.contains(id) {
                self.store.delete(&object.key).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}
