//! The local data cache: copies of table data files kept on local disk, within a byte budget.
//!
//! Invariants:
//! - A table not yet uploaded is never evicted: it exists nowhere else.
//! - Metas always stay local; only `.data` files are evicted, least recently read first.

use super::{Index, IndexError, io_err};
use crate::lsm::entry::Entry;
use crate::lsm::tree::Tree;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

impl Index {
    /// Evicts local data copies of uploaded tables, least recently read first, until the cached
    /// bytes fit `cache_bytes`. Backlink tables go first, then forward links, hot links and
    /// account tallies (as large as the hot links): revocation and tally tables are small and
    /// queries read them. A table not yet uploaded is never evicted: it exists nowhere else.
    /// Metas always stay. Returns the bytes evicted.
    pub fn enforce_cache_budget(&self) -> Result<u64, IndexError> {
        let pending: HashSet<String> = self.catalog.pending_uploads()?.into_iter().map(|t| t.id).collect();
        let mut over = self.cached_bytes().saturating_sub(self.options.cache_bytes);
        let evicted = self.evict_from(&self.links, &pending, &mut over)?
            + self.evict_from(&self.forward, &pending, &mut over)?
            + self.evict_from(&self.hot, &pending, &mut over)?
            + self.evict_from(&self.account_tallies, &pending, &mut over)?
            + self.evict_from(&self.thresholds, &pending, &mut over)?
            + self.evict_from(&self.tallies, &pending, &mut over)?;
        self.counters.cache_evicted_bytes.fetch_add(evicted, Ordering::Relaxed);
        Ok(evicted)
    }

    /// Bytes of table data held locally, over every tree.
    pub fn cached_bytes(&self) -> u64 {
        fn of<E: Entry>(tree: &Tree<E>) -> u64 {
            tree.tables().iter().map(|t| t.cached_bytes()).sum()
        }
        of(&self.links)
            + of(&self.forward)
            + of(&self.thresholds)
            + of(&self.hot)
            + of(&self.tallies)
            + of(&self.account_tallies)
    }

    fn evict_from<E: Entry>(
        &self,
        tree: &Tree<E>,
        pending: &HashSet<String>,
        over: &mut u64,
    ) -> Result<u64, IndexError> {
        let mut candidates: Vec<_> =
            tree.tables().into_iter().filter(|t| t.cached_bytes() > 0 && !pending.contains(&t.record.id)).collect();
        candidates.sort_by_key(|t| t.last_read());
        let mut evicted = 0;
        for table in candidates {
            if *over == 0 {
                break;
            }
            let freed = table.evict_local(tree.dir()).map_err(io_err(tree.dir()))?;
            *over = over.saturating_sub(freed);
            evicted += freed;
        }
        Ok(evicted)
    }
}
