//! Memtable: the most recent writes of one tree, sorted, bounded in bytes, read by queries.
//!
//! Invariants:
//! - Entries are unique (a `BTreeSet`): writing the same entry twice (a replay) is a no-op.
//! - `bytes()` counts encoded bytes (`len * E::WIDTH`); the owner flushes before `limit_bytes`.
//! - A memtable is frozen (made immutable behind an `Arc`) before it is written out as a table, so
//!   that queries keep seeing its entries until the table that holds them is visible.

use crate::lsm::entry::Entry;
use crate::model::ids::RecordId;
use std::collections::BTreeSet;

#[derive(Debug)]
pub struct Memtable<E: Entry> {
    entries: BTreeSet<E>,
    min_stamp: u64,
    max_stamp: u64,
}

impl<E: Entry> Default for Memtable<E> {
    fn default() -> Self {
        Self { entries: BTreeSet::new(), min_stamp: u64::MAX, max_stamp: 0 }
    }
}

impl<E: Entry> Memtable<E> {
    pub fn insert(&mut self, entry: E) -> bool {
        self.min_stamp = self.min_stamp.min(entry.stamp());
        self.max_stamp = self.max_stamp.max(entry.stamp());
        self.entries.insert(entry)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Encoded size of the entries: what a flush writes before compression.
    pub fn bytes(&self) -> usize {
        self.entries.len() * E::WIDTH
    }

    /// Smallest and largest stamp written, or `None` when empty.
    pub fn stamps(&self) -> Option<(u64, u64)> {
        (!self.is_empty()).then_some((self.min_stamp, self.max_stamp))
    }

    /// Entries `e` with `lo <= e <= hi`, in order.
    pub fn range<'a>(&'a self, lo: &E, hi: &E) -> impl DoubleEndedIterator<Item = &'a E> + 'a {
        assert!(lo <= hi, "memtable range bounds out of order");
        self.entries.range(*lo..=*hi)
    }

    /// Entries whose key is `key`, in order.
    pub fn for_key(&self, key: RecordId) -> impl DoubleEndedIterator<Item = &E> + '_ {
        self.entries.range(E::min_for_key(key)..=E::max_for_key(key))
    }

    pub fn iter(&self) -> impl Iterator<Item = &E> + '_ {
        self.entries.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::Revocation;

    fn rev(did: u64, rev: u64) -> Revocation {
        Revocation { source: RecordId::repo(did), rev }
    }

    #[test]
    fn dedups_and_counts_bytes() {
        let mut m = Memtable::default();
        assert!(m.insert(rev(1, 5)));
        assert!(!m.insert(rev(1, 5)));
        assert!(m.insert(rev(1, 6)));
        assert_eq!(m.len(), 2);
        assert_eq!(m.bytes(), 64);
        assert_eq!(m.stamps(), Some((5, 6)));
    }

    #[test]
    fn for_key_returns_only_that_key_in_order() {
        let mut m = Memtable::default();
        for (did, r) in [(2, 9), (1, 3), (2, 1), (3, 4)] {
            m.insert(rev(did, r));
        }
        let got: Vec<_> = m.for_key(RecordId::repo(2)).copied().collect();
        assert_eq!(got, vec![rev(2, 1), rev(2, 9)]);
        assert_eq!(m.for_key(RecordId::repo(7)).count(), 0);
    }
}
