//! Memtable: the most recent writes of one tree, sorted, bounded in bytes, read by queries.
//!
//! Writes go to a small B-tree (`recent`, at most `RECENT_ENTRIES`, so it stays in the CPU's
//! caches); when it is full it is merged into one sorted vector (`sorted`) in place, from the
//! back: the vector only grows by the merged entries. A B-tree of all the entries would use about
//! 1.5 bytes per entry byte (nodes two-thirds full) and miss the cache on every level of every
//! insert; the vector uses one byte per byte.
//!
//! Invariants:
//! - `sorted` is strictly increasing and `recent` is a set, so each part holds an entry once.
//!   An entry in both (a replay of a write) is one entry: readers see it once, and the next merge
//!   keeps one copy.
//! - `bytes()` counts encoded bytes of both parts (`len * E::WIDTH`, a replayed entry twice until
//!   the merge); the owner flushes before `limit_bytes`. The memory it takes (`memory_bytes`)
//!   stays within about an eighth of that beyond the B-tree's node slack: the vector grows by
//!   an eighth of its length at a time.
//! - A memtable is frozen (made immutable behind an `Arc`) before it is written out as a table, so
//!   that queries keep seeing its entries until the table that holds them is visible.

use crate::lsm::entry::Entry;
use crate::model::ids::RecordId;
use std::collections::BTreeSet;
use std::iter::Peekable;

/// Most entries in the B-tree part before it is merged into the sorted vector (4 MiB of 64-byte
/// entries: merging costs one pass over the vector, so this bounds that work to one pass per
/// 65,536 writes).
pub const RECENT_ENTRIES: usize = 1 << 16;

/// The sorted vector grows by at least `1 / GROWTH_DIVISOR` of its length when it must grow.
const GROWTH_DIVISOR: usize = 8;

#[derive(Debug)]
pub struct Memtable<E: Entry> {
    sorted: Vec<E>,
    recent: BTreeSet<E>,
}

impl<E: Entry> Default for Memtable<E> {
    fn default() -> Self {
        Self { sorted: Vec::new(), recent: BTreeSet::new() }
    }
}

impl<E: Entry> Memtable<E> {
    pub fn insert(&mut self, entry: E) {
        self.recent.insert(entry);
        if self.recent.len() >= RECENT_ENTRIES {
            self.merge_recent();
        }
    }

    /// Entries written, counting an entry replayed since the last merge twice.
    pub fn len(&self) -> usize {
        self.sorted.len() + self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty() && self.recent.is_empty()
    }

    /// Encoded size of the entries: what a flush writes before compression.
    pub fn bytes(&self) -> usize {
        self.len() * E::WIDTH
    }

    /// The memory it takes: the sorted vector's capacity, and the B-tree's entries with its
    /// nodes' slack (about half again, nodes two-thirds full).
    pub fn memory_bytes(&self) -> usize {
        self.sorted.capacity() * size_of::<E>() + self.recent.len() * size_of::<E>() * 3 / 2
    }

    /// Entries `e` with `lo <= e <= hi`, in order, each once.
    pub fn range(&self, lo: E, hi: E) -> impl Iterator<Item = &E> + '_ {
        assert!(lo <= hi, "memtable range bounds out of order");
        let from = self.sorted.partition_point(|e| *e < lo);
        let to = from + self.sorted[from..].partition_point(|e| *e <= hi);
        Union::new(self.sorted[from..to].iter(), self.recent.range(lo..=hi))
    }

    /// Entries whose key is `key`, in order.
    pub fn for_key(&self, key: RecordId) -> impl Iterator<Item = &E> + '_ {
        self.range(E::min_for_key(key), E::max_for_key(key))
    }

    /// Every entry, in order, each once.
    pub fn iter(&self) -> impl Iterator<Item = &E> + '_ {
        Union::new(self.sorted.iter(), self.recent.iter())
    }

    /// Moves `recent` into `sorted`: grows the vector by its length (the only new memory; the
    /// vector may move when it grows), then merges from the back, taking `recent` largest first,
    /// so each entry moves once. Equal entries end up next to each other, and are then removed
    /// (only a replay makes any).
    fn merge_recent(&mut self) {
        let old_len = self.sorted.len();
        let needed = old_len + self.recent.len();
        if needed > self.sorted.capacity() {
            // An eighth more at a time, not twice: a memtable is as big as its budget lets it
            // grow, and a doubled vector would hold up to twice what it counts.
            self.sorted.reserve_exact(needed.max(old_len + old_len / GROWTH_DIVISOR) - old_len);
        }
        self.sorted.extend(self.recent.iter().copied()); // room, overwritten below
        let mut recent = std::mem::take(&mut self.recent).into_iter().rev().peekable();
        let (mut i, mut k, mut duplicates) = (old_len, self.sorted.len(), 0usize);
        while let Some(&next) = recent.peek() {
            k -= 1;
            if i > 0 && self.sorted[i - 1] > next {
                self.sorted[k] = self.sorted[i - 1];
                i -= 1;
            } else {
                duplicates += usize::from(i > 0 && self.sorted[i - 1] == next);
                self.sorted[k] = next;
                recent.next();
            }
        }
        if duplicates > 0 {
            self.sorted.dedup();
        }
        debug_assert!(self.sorted.windows(2).all(|w| w[0] < w[1]), "sorted part strictly increasing");
    }
}

/// The union of two increasing sequences, increasing, an entry in both yielded once.
struct Union<'a, E: Entry, A: Iterator<Item = &'a E>, B: Iterator<Item = &'a E>> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<'a, E: Entry, A: Iterator<Item = &'a E>, B: Iterator<Item = &'a E>> Union<'a, E, A, B> {
    fn new(a: A, b: B) -> Self {
        Self { a: a.peekable(), b: b.peekable() }
    }
}

impl<'a, E: Entry, A: Iterator<Item = &'a E>, B: Iterator<Item = &'a E>> Iterator for Union<'a, E, A, B> {
    type Item = &'a E;

    fn next(&mut self) -> Option<&'a E> {
        match (self.a.peek(), self.b.peek()) {
            (Some(a), Some(b)) if a < b => self.a.next(),
            (Some(a), Some(b)) if a > b => self.b.next(),
            (Some(_), Some(_)) => {
                self.b.next();
                self.a.next()
            }
            (Some(_), None) => self.a.next(),
            (None, _) => self.b.next(),
        }
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
        m.insert(rev(1, 5));
        m.insert(rev(1, 5));
        m.insert(rev(1, 6));
        assert_eq!(m.len(), 2);
        assert_eq!(m.bytes(), 64);
    }

    /// Through many merges of the B-tree into the vector, the memory a memtable takes stays
    /// within an eighth of its bytes past the B-tree's part (a doubling vector takes up to
    /// twice them).
    #[test]
    fn memory_stays_within_an_eighth_of_the_bytes() {
        let mut m = Memtable::default();
        for i in 0..40 * RECENT_ENTRIES as u64 {
            m.insert(rev(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20, i));
            if m.recent.is_empty() {
                let sorted_bytes = m.sorted.len() * size_of::<Revocation>();
                assert!(m.memory_bytes() <= sorted_bytes + sorted_bytes / 8, "{} for {sorted_bytes}", m.memory_bytes());
            }
        }
        assert!(m.memory_bytes() >= m.bytes(), "{} for {}", m.memory_bytes(), m.bytes());
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Against a plain set fed the same writes (with replays, across several merges): every
        /// range, every key and the whole iteration agree, in order, each entry once.
        #[test]
        fn reads_agree_with_a_plain_set(
            writes in proptest::collection::vec((0u64..40, 0u64..3_000), 1..3 * RECENT_ENTRIES),
            probes in proptest::collection::vec((0u64..40, 0u64..40), 1..20),
        ) {
            let mut m = Memtable::default();
            let mut truth = BTreeSet::new();
            for (did, r) in writes {
                m.insert(rev(did, r));
                truth.insert(rev(did, r));
            }
            let all: Vec<_> = m.iter().copied().collect();
            proptest::prop_assert_eq!(&all, &truth.iter().copied().collect::<Vec<_>>());
            for (a, b) in probes {
                let (lo, hi) = (rev(a.min(b), 0), rev(a.max(b), 1_500));
                let got: Vec<_> = m.range(lo, hi).copied().collect();
                proptest::prop_assert_eq!(got, truth.range(lo..=hi).copied().collect::<Vec<_>>());
                let key: Vec<_> = m.for_key(RecordId::repo(a)).copied().collect();
                proptest::prop_assert_eq!(key.len(), truth.iter().filter(|e| e.source.did == a).count());
            }
            proptest::prop_assert!(m.len() >= truth.len());
            proptest::prop_assert!(m.sorted.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
