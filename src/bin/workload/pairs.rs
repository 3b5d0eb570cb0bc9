//! The (author, subject) pairs already liked, reposted, followed or blocked: on the network an
//! account does each at most once per subject (its app shows the like it made, and a second
//! follow of the same account is refused), so the generator draws again rather than repeat one.
//!
//! A Bloom filter: no pair it was given is ever reported new (so no repeat slips through), and a
//! new pair is reported taken with a small chance, which only costs a draw. Its size follows the
//! workload's and is capped (`MAX_BITS`), so memory is bounded whatever the size: at the cap
//! a billion-event stream's 850 M pairs hold about five bits each and a new pair is refused
//! about one time in ten by the end.
//!
//! Invariants:
//! - `insert` returns false for every pair inserted before (the pair's bits are all set).
//! - The filter's bits are `bits_for(size)`: a power of two in `MIN_BITS..=MAX_BITS`.

use backlinks::base::rng::splitmix64;

/// Bits per expected pair below the cap: a new pair is refused well under one time in a hundred.
const BITS_PER_PAIR: u64 = 16;
const MIN_BITS: u64 = 1 << 16;
/// 512 MiB.
const MAX_BITS: u64 = 1 << 32;
/// Bits set per pair.
const PROBES: u64 = 3;

pub(crate) struct Pairs {
    words: Vec<u64>,
    /// `bits - 1`: bits is a power of two.
    mask: u64,
}

impl Pairs {
    /// A filter for a stream of about `size` events (or links).
    pub(crate) fn for_size(size: u64) -> Self {
        let bits = bits_for(size);
        Pairs { words: vec![0; (bits / 64) as usize], mask: bits - 1 }
    }

    /// Records that `author` did `what` (a collection) to `subject`; false when it had already.
    pub(crate) fn insert(&mut self, what: u64, author: u64, subject: (u64, u64)) -> bool {
        let mut state = what ^ author.rotate_left(21) ^ subject.0.rotate_left(42) ^ subject.1;
        let first = splitmix64(&mut state);
        let step = splitmix64(&mut state) | 1;
        let mut new = false;
        for probe in 0..PROBES {
            let bit = first.wrapping_add(probe.wrapping_mul(step)) & self.mask;
            let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
            new |= self.words[word] & mask == 0;
            self.words[word] |= mask;
        }
        new
    }
}

fn bits_for(size: u64) -> u64 {
    size.saturating_mul(BITS_PER_PAIR).clamp(MIN_BITS, MAX_BITS).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_new_once_and_other_pairs_stay_new() {
        let mut pairs = Pairs::for_size(10_000);
        let mut refused_new = 0;
        for n in 0..10_000u64 {
            let (what, author, subject) = (n % 3, n / 3, (n * 7, n % 11));
            refused_new += u64::from(!pairs.insert(what, author, subject));
            assert!(!pairs.insert(what, author, subject), "pair {n} repeated");
        }
        // This size rounds up to 2^18 bits, about 26 a pair: some 0.1 % of new pairs refused.
        assert!(refused_new < 100, "{refused_new} new pairs refused");
    }

    #[test]
    fn the_filter_is_sized_by_the_workload_within_bounds() {
        assert_eq!(bits_for(0), MIN_BITS);
        assert_eq!(bits_for(10_000_000), 1 << 28);
        assert_eq!(bits_for(1_000_000_000), MAX_BITS);
        assert_eq!(bits_for(u64::MAX), MAX_BITS);
    }
}
