//! Garbage collection: retired tables (objects, local files, catalog rows) deleted once their
//! grace period is over, objects under `tables/` that no catalog row knows (a crash's), and
//! account log objects that no manifest has named for the grace period.
//!
//! Invariants:
//! - A table is deleted only when it retired at least the grace period ago and the newest known
//!   manifest does not name it (a reader may still hold an older manifest for that long).
//! - An account log object is deleted only when collections have found the newest manifest not
//!   naming it for the grace period: a log that started over, or an upload whose manifest was
//!   never written. Only this process's collections run while it holds the lease, so nothing
//!   names such an object later.

use super::{Index, IndexError, io_err};
use crate::account_log::{AccountLog, parse_key};
use crate::lsm::handle::table_key;
use crate::lsm::record::TableRecord;
use std::collections::HashSet;

impl Index {
    /// Deletes retired tables (objects, local files, catalog rows) that retired at least
    /// `grace_ms` before `now_ms` and that the current manifest no longer names, then objects
    /// under `tables/` that the catalog does not know at all (left by a crash), then account log
    /// objects unnamed for the grace period. Returns how many tables and other objects it removed.
    pub async fn collect_garbage(&self, now_ms: u64, grace_ms: u64) -> Result<(usize, usize), IndexError> {
        let published = self.published().await?;
        let accounts = self.delete_unnamed_account_objects(published.accounts.as_ref(), now_ms, grace_ms).await?;
        let published = published.table_ids;
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
        Ok((retired, orphans + accounts))
    }

    pub(super) fn remove_local_table(&self, record: &TableRecord) -> Result<(), IndexError> {
        let files = self.tree_files(record.tree);
        files.remove_local(&record.id).map_err(io_err(files.dir()))
    }

    /// Account log objects that `named` (the newest manifest's log) does not name and that
    /// collections have found so for `grace_ms`. Returns how many it deleted.
    async fn delete_unnamed_account_objects(
        &self,
        named: Option<&AccountLog>,
        now_ms: u64,
        grace_ms: u64,
    ) -> Result<usize, IndexError> {
        let named: HashSet<String> = named.map(|log| log.keys().collect()).unwrap_or_default();
        let unnamed: Vec<String> = (self.store.list("accounts/").await?.into_iter())
            .map(|object| object.key)
            .filter(|key| parse_key(key).is_some() && !named.contains(key))
            .collect();
        let due = self.catalog.unnamed_objects_since(&unnamed, now_ms, now_ms.saturating_sub(grace_ms))?;
        for key in &due {
            self.store.delete(key).await?;
        }
        Ok(due.len())
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
