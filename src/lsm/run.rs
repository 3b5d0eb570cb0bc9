//! Runs: the unit of the LSM's shape. A delta run is one table (a flushed memtable, any key); a
//! compacted run is `shard_count` tables, one per shard of the key hash.
//!
//! Invariants:
//! - Every table of a run has the run's id and shard count, and table `i` is shard `i`.
//! - A compacted run holds each key in exactly one table: `shard_of(key, shard_count)`, so a
//!   reader of one key opens one table per compacted run; keys that agree in their first
//!   `Entry::SHARD_WIDTH` bytes share it, so a reader of such a key range does too.
//! - A delta run has `shard_count == 1`, so `shard_of` sends every key to its only table.

use crate::lsm::entry::Entry;
use crate::lsm::handle::TableHandle;
use crate::lsm::record::RunKind;
use crate::model::ids::RecordId;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// Most shards one compacted run may have.
pub const MAX_SHARDS: u32 = 4096;

/// The shard of `key` in a run of `shard_count` shards: multiply-shift of the key's xxh3-64, so a
/// power-of-two count takes the hash's top bits (a radix split).
pub fn shard_of<E: Entry>(key: &RecordId, shard_count: u32) -> u32 {
    shard_of_hash(shard_hash::<E>(key), shard_count)
}

/// The hash `shard_of` splits by, of the key's first `E::SHARD_WIDTH` bytes: compute it once for
/// a key asked of many runs.
pub fn shard_hash<E: Entry>(key: &RecordId) -> u64 {
    xxh3_64(&key.to_bytes()[..E::SHARD_WIDTH])
}

/// `shard_of` for a key whose `shard_hash` is `hash`.
pub fn shard_of_hash(hash: u64, shard_count: u32) -> u32 {
    assert!((1..=MAX_SHARDS).contains(&shard_count), "shard count {shard_count} out of range");
    ((hash as u128 * shard_count as u128) >> 64) as u32
}

#[derive(Debug)]
pub struct Run<E: Entry> {
    pub id: String,
    pub kind: RunKind,
    /// Tables in shard order.
    pub tables: Vec<Arc<TableHandle<E>>>,
    /// Some table's meta was a partial copy when the run was formed (a replica's): lookups
    /// fetch pieces first. It may stay true after they are completed, which costs only a check.
    pub partial_metas: bool,
}

impl<E: Entry> Run<E> {
    /// Builds a run from its tables (any order); `None` if they do not form a whole run.
    pub fn from_tables(mut tables: Vec<Arc<TableHandle<E>>>) -> Option<Self> {
        tables.sort_by_key(|t| t.record.shard);
        let first = tables.first()?.record.clone();
        let whole = tables.len() == first.shard_count as usize
            && tables.iter().enumerate().all(|(i, t)| {
                t.record.run_id == first.run_id
                    && t.record.shard == i as u32
                    && t.record.shard_count == first.shard_count
            });
        let partial_metas = tables.iter().any(|t| t.meta_is_partial());
        whole.then(|| Run { id: first.run_id, kind: first.run_kind, tables, partial_metas })
    }

    pub fn shard_count(&self) -> u32 {
        self.tables.len() as u32
    }

    /// The one table that may hold `key`.
    pub fn table_for(&self, key: &RecordId) -> &Arc<TableHandle<E>> {
        self.table_for_hash(shard_hash::<E>(key))
    }

    /// The one table that may hold the key whose `shard_hash` is `hash`.
    pub fn table_for_hash(&self, hash: u64) -> &Arc<TableHandle<E>> {
        &self.tables[self.shard_for_hash(hash)]
    }

    /// The shard (index in `tables`) that may hold the key whose `shard_hash` is `hash`.
    pub fn shard_for_hash(&self, hash: u64) -> usize {
        shard_of_hash(hash, self.shard_count()) as usize
    }

    /// Compressed bytes of the run's data files (what size-tiering compares).
    pub fn data_bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.record.data_len).sum()
    }

    pub fn entries(&self) -> u64 {
        self.tables.iter().map(|t| t.record.entries).sum()
    }
}

/// `items`, each with the shard it belongs to, grouped by shard: shards in order, each group's
/// items in their order (what one table of a run is asked for at once).
pub fn group_by_shard<T>(items: impl IntoIterator<Item = (usize, T)>) -> Vec<(usize, Vec<T>)> {
    let mut items: Vec<(usize, T)> = items.into_iter().collect();
    items.sort_by_key(|(shard, _)| *shard);
    let mut groups: Vec<(usize, Vec<T>)> = Vec::new();
    for (shard, item) in items {
        match groups.last_mut() {
            Some((last, group)) if *last == shard => group.push(item),
            _ => groups.push((shard, vec![item])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{Backlink, HotLink};

    #[test]
    fn groups_by_shard_keep_shards_in_order_and_items_in_theirs() {
        let groups = group_by_shard([(3, 'a'), (1, 'b'), (3, 'c'), (0, 'd'), (1, 'e')]);
        assert_eq!(groups, vec![(0, vec!['d']), (1, vec!['b', 'e']), (3, vec!['a', 'c'])]);
        assert_eq!(group_by_shard(Vec::<(usize, u8)>::new()), vec![]);
    }

    #[test]
    fn shards_are_in_range_and_spread() {
        let mut counts = [0u32; 8];
        for did in 0..8000u64 {
            let shard = shard_of::<Backlink>(&RecordId::repo(did), 8);
            counts[shard as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "uneven shards: {counts:?}");
        assert_eq!(shard_of::<Backlink>(&RecordId::repo(5), 1), 0);
    }

    #[test]
    fn keys_share_a_shard_by_their_first_shard_width_bytes() {
        let of_account = |did: u64, record: u64| HotLink::key_of(RecordId { rkey: record, collection: 3, did });
        for did in 0..64u64 {
            let shard = shard_of::<HotLink>(&of_account(did, 1), 64);
            assert!((2..200).all(|record| shard_of::<HotLink>(&of_account(did, record), 64) == shard));
        }
        let spread: std::collections::HashSet<u32> =
            (0..200).map(|record| shard_of::<Backlink>(&of_account(5, record), 64)).collect();
        assert!(spread.len() > 30, "a whole key picks a backlink's shard");
    }

    #[test]
    fn power_of_two_counts_take_the_top_bits() {
        let key = RecordId { rkey: 1, collection: 2, did: 3 };
        let hash = xxh3_64(&key.to_bytes());
        assert_eq!(shard_of::<Backlink>(&key, 16) as u64, hash >> 60);
        assert_eq!(shard_of::<Backlink>(&key, 2) as u64, hash >> 63);
    }
}
