//! An open-addressing index of positions (slot numbers into a vector the caller owns), keyed by
//! a 64-bit hash; the caller compares keys. Used by the outline cache (both directions) and by
//! the revocation thresholds a merge consults (`liveness::KnownRevocations`).
//!
//! Invariants:
//! - Linear probing over a power-of-two number of buckets, grown before it passes 3/4 full, with
//!   deletion by backward shift (no tombstones): a probe ends at the first empty bucket.
//! - A bucket is `tag << 32 | (position + 1)`, 0 when empty; the tag (high half of the hash) lets
//!   a probe skip other keys without touching their positions. Positions are below `u32::MAX`.

/// Buckets of a new, empty index.
const MIN_BUCKETS: usize = 16;

/// A linear-probing table of positions.
#[derive(Debug)]
pub(crate) struct PositionIndex {
    buckets: Vec<u64>,
    len: usize,
}

impl PositionIndex {
    pub(crate) fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty index with room for `positions` before it grows (one that will hold a known
    /// number never holds its smaller tables and the doubled one at once).
    pub(crate) fn with_capacity(positions: usize) -> Self {
        let buckets = (positions.saturating_mul(4) / 3 + 1).next_power_of_two().max(MIN_BUCKETS);
        Self { buckets: vec![0; buckets], len: 0 }
    }

    /// The memory its buckets take.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.buckets.capacity() * size_of::<u64>()
    }

    /// How many positions it holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    fn home(&self, hash: u64) -> usize {
        hash as usize & self.mask()
    }

    fn tag(hash: u64) -> u64 {
        hash >> 32
    }

    /// The slot whose key hashes to `hash` and satisfies `is_key`.
    pub(crate) fn find(&self, hash: u64, is_key: impl Fn(usize) -> bool) -> Option<usize> {
        let mut at = self.home(hash);
        loop {
            let bucket = self.buckets[at];
            if bucket == 0 {
                return None;
            }
            let slot = (bucket as u32 - 1) as usize;
            if bucket >> 32 == Self::tag(hash) && is_key(slot) {
                return Some(slot);
            }
            at = (at + 1) & self.mask();
        }
    }

    /// The position in `hash`'s home bucket when that bucket's tag is `hash`'s: what `find` most
    /// often returns, read without comparing keys (for `outline::cache`'s warming, which reads
    /// the home buckets of many hashes in a row so that the CPU fetches them together).
    pub(crate) fn home_candidate(&self, hash: u64) -> Option<usize> {
        let bucket = self.buckets[self.home(hash)];
        (bucket != 0 && bucket >> 32 == Self::tag(hash)).then(|| (bucket as u32 - 1) as usize)
    }

    pub(crate) fn insert(&mut self, hash: u64, slot: usize, hash_of: impl Fn(usize) -> u64) {
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.grow(&hash_of);
        }
        self.place(hash, slot);
        self.len += 1;
    }

    fn place(&mut self, hash: u64, slot: usize) {
        let mut at = self.home(hash);
        while self.buckets[at] != 0 {
            at = (at + 1) & self.mask();
        }
        self.buckets[at] = Self::tag(hash) << 32 | (slot as u64 + 1);
    }

    fn grow(&mut self, hash_of: &impl Fn(usize) -> u64) {
        let doubled = vec![0; self.buckets.len() * 2];
        let old = std::mem::replace(&mut self.buckets, doubled);
        for bucket in old.into_iter().filter(|&bucket| bucket != 0) {
            let slot = (bucket as u32 - 1) as usize;
            self.place(hash_of(slot), slot);
        }
    }

    /// Removes `slot` (which hashes to `hash`), then shifts later members of its run back so
    /// that every remaining key is still reachable from its home without crossing an empty bucket.
    pub(crate) fn remove(&mut self, hash: u64, slot: usize, hash_of: impl Fn(usize) -> u64) {
        let mut hole = self.home(hash);
        while self.buckets[hole] != Self::tag(hash) << 32 | (slot as u64 + 1) {
            assert_ne!(self.buckets[hole], 0, "an indexed slot is in its run");
            hole = (hole + 1) & self.mask();
        }
        let mut at = hole;
        loop {
            at = (at + 1) & self.mask();
            let bucket = self.buckets[at];
            if bucket == 0 {
                break;
            }
            let home = self.home(hash_of((bucket as u32 - 1) as usize));
            // The member at `at` may move into the hole unless its home lies cyclically in (hole, at].
            if (at.wrapping_sub(home) & self.mask()) >= (at.wrapping_sub(hole) & self.mask()) {
                self.buckets[hole] = bucket;
                hole = at;
            }
        }
        self.buckets[hole] = 0;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index made for `n` positions takes them all without growing, and finds each.
    #[test]
    fn an_index_made_for_n_positions_holds_them_without_growing() {
        for n in [0usize, 1, 11, 12, 13, 1000, 49_152, 49_153, 100_000] {
            let hash_of = |slot: usize| (slot as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut index = PositionIndex::with_capacity(n);
            let made = index.memory_bytes();
            (0..n).for_each(|slot| index.insert(hash_of(slot), slot, hash_of));
            assert_eq!(index.memory_bytes(), made, "{n} positions grew the index");
            assert!(made <= (n * 8 * 4 / 3 * 2).max(MIN_BUCKETS * 8), "{made} bytes for {n}");
            assert!((0..n).all(|slot| index.find(hash_of(slot), |found| found == slot) == Some(slot)));
        }
    }
}
