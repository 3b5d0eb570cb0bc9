//! The key filter: a one-hash, cache-line-blocked bloom filter over a table's keys.
//!
//! A key is hashed once with xxh3-128 (`KeyHash`). The high 64 bits pick one 64-byte block by
//! multiply-shift; the low 64 bits, folded to 32 bits `h`, pick one bit in each of the block's k
//! parts (`offset_i + h % size_i`). A lookup therefore reads exactly one cache line.
//!
//! Invariants:
//! - No false negatives: every inserted key tests positive, whatever the shape.
//! - For every k in `1..=MAX_K` the part sizes (`PART_SIZES`) are pairwise coprime and sum to
//!   512, so the k bit positions drawn from one `h` behave like k independent ones (CRT).
//! - `1 <= k <= MAX_K` and `1 <= blocks <= MAX_BLOCKS`; `decode` rejects anything else, and
//!   never allocates more than the input it was given.
//! - Blocks are 64-byte aligned in memory (`Block` is `align(64)`).
//! - The encoding is frozen (little-endian, see docs/format.md "Filter"); a golden test pins it.
//!   Changing `PART_SIZES`, the block choice or the bit layout changes every stored filter.

use crate::lsm::bytes::{FormatError, check_range};
use crate::model::ids::RecordId;
use xxhash_rust::xxh3::xxh3_128;

/// Bits in one block: one 64-byte cache line.
pub const BLOCK_BITS: u32 = 512;
/// Bytes in one block.
pub const BLOCK_BYTES: usize = 64;
/// Most parts (bits set per key) a filter may use.
pub const MAX_K: usize = 16;
/// Most blocks in one filter: 2^22 blocks = 256 MiB. Beyond about 200 million keys at 1% the
/// filter stays this size and its false-positive rate rises (it never gives false negatives).
pub const MAX_BLOCKS: usize = 1 << 22;
/// `expected_keys` is clamped to this; it only bounds the sizing arithmetic.
pub const MAX_EXPECTED_KEYS: usize = u32::MAX as usize;
/// Target false-positive rates are clamped into `MIN_FPR..=MAX_FPR`. Below about 1e-5 a
/// 512-bit block cannot hold enough keys for the uneven spread of keys over blocks to average out.
pub const MIN_FPR: f64 = 1e-5;
pub const MAX_FPR: f64 = 0.5;
/// Bytes before the first block in the encoding.
pub const HEADER_LEN: usize = 12;
/// Largest valid encoding.
pub const MAX_ENCODED_LEN: usize = HEADER_LEN + MAX_BLOCKS * BLOCK_BYTES;

const MAGIC: [u8; 4] = *b"OHBF";
const VERSION: u8 = 1;
const WHAT: &str = "filter";

/// Part sizes for each k (index k - 1): pairwise coprime, summing to 512, as even as possible
/// (found by an exhaustive search that minimised the squared distance from 512 / k).
const PART_SIZES: [&[u32]; MAX_K] = [
    &[512],
    &[257, 255],
    &[172, 171, 169],
    &[131, 129, 127, 125],
    &[106, 105, 103, 101, 97],
    &[97, 89, 85, 83, 81, 77],
    &[79, 77, 76, 73, 71, 69, 67],
    &[73, 71, 67, 65, 63, 61, 59, 53],
    &[67, 64, 61, 59, 57, 55, 53, 49, 47],
    &[65, 61, 59, 57, 53, 49, 47, 43, 41, 37],
    &[59, 55, 53, 51, 49, 47, 46, 43, 41, 37, 31],
    &[61, 59, 53, 49, 47, 43, 41, 39, 37, 31, 29, 23],
    &[61, 53, 49, 47, 43, 41, 39, 37, 34, 31, 29, 25, 23],
    &[59, 53, 49, 47, 43, 41, 39, 37, 31, 29, 25, 23, 19, 17],
    &[59, 53, 47, 43, 41, 37, 35, 33, 32, 31, 29, 23, 19, 17, 13],
    &[61, 59, 53, 47, 43, 41, 37, 29, 27, 25, 23, 19, 17, 13, 11, 7],
];

/// One part of a block: bits `offset .. offset + size`, with the constant that turns
/// `h % size` into two multiplications.
#[derive(Clone, Copy, Debug)]
struct Part {
    offset: u32,
    size: u32,
    mod_magic: u64,
}

impl Part {
    /// The bit of this part that `h` selects, as a bit index within the block.
    #[inline]
    fn bit_for(&self, h: u32) -> u32 {
        self.offset + fast_mod(h, self.size, self.mod_magic)
    }
}

/// `h % size` without a division (Lemire, Kaser & Kurz, "Faster remainder by direct
/// computation"): exact for every 32-bit `h` and `size` when `magic = u64::MAX / size + 1`.
#[inline]
fn fast_mod(h: u32, size: u32, magic: u64) -> u32 {
    let fraction = magic.wrapping_mul(h as u64);
    ((fraction as u128 * size as u128) >> 64) as u32
}

const fn parts_for(k: usize) -> [Part; MAX_K] {
    let sizes = PART_SIZES[k - 1];
    let mut parts = [Part { offset: 0, size: 1, mod_magic: 0 }; MAX_K];
    let mut offset = 0;
    let mut i = 0;
    while i < sizes.len() {
        let size = sizes[i];
        parts[i] = Part { offset, size, mod_magic: u64::MAX / size as u64 + 1 };
        offset += size;
        i += 1;
    }
    assert!(offset == BLOCK_BITS, "part sizes must sum to 512");
    parts
}

const fn all_parts() -> [[Part; MAX_K]; MAX_K] {
    let mut all = [[Part { offset: 0, size: 1, mod_magic: 0 }; MAX_K]; MAX_K];
    let mut k = 1;
    while k <= MAX_K {
        all[k - 1] = parts_for(k);
        k += 1;
    }
    all
}

/// Parts for every k, computed at compile time (the const asserts check every sum).
static PARTS: [[Part; MAX_K]; MAX_K] = all_parts();

fn parts(k: usize) -> &'static [Part] {
    &PARTS[k - 1][..k]
}

/// The one hash of a key; compute it once per query and test it against many tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash(u128);

impl KeyHash {
    /// Hash of the encoded key bytes (for table keys: the 24-byte big-endian `RecordId`).
    pub fn of(key_bytes: &[u8]) -> Self {
        KeyHash(xxh3_128(key_bytes))
    }

    /// The hash as 16 bytes (a builder spills them to a file) and back.
    pub fn to_le_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    pub fn from_le_bytes(bytes: [u8; 16]) -> Self {
        KeyHash(u128::from_le_bytes(bytes))
    }

    /// Hash of a `RecordId` key, via its encoding.
    pub fn of_record(key: &RecordId) -> Self {
        Self::of(&key.to_bytes())
    }

    /// Multiply-shift: maps the high 64 bits uniformly onto `0..blocks` without a division.
    #[inline]
    pub fn block_index(self, blocks: usize) -> usize {
        let high = self.0 >> 64;
        ((high * blocks as u128) >> 64) as usize
    }

    /// The low 64 bits folded to 32, so that every part can use a 32-bit remainder.
    #[inline]
    fn folded_low(self) -> u32 {
        let low = self.0 as u64;
        (low ^ (low >> 32)) as u32
    }
}

/// 512 bits, bit `b` in word `b / 64` at position `b % 64`; one cache line.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, align(64))]
struct Block([u64; 8]);

impl Block {
    #[inline]
    fn set(&mut self, bit: u32) {
        self.0[(bit / 64) as usize] |= 1 << (bit % 64);
    }

    #[inline]
    fn get(&self, bit: u32) -> bool {
        self.0[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }
}

/// The shape of a filter: bits set per key and number of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterShape {
    pub k: usize,
    pub blocks: usize,
}

impl FilterShape {
    /// The smallest shape whose expected false-positive rate for `expected_keys` keys meets
    /// `target_fpr`, with the best k for that size. Inputs are clamped to the documented limits;
    /// a filter that cannot meet the target within `MAX_BLOCKS` gets `MAX_BLOCKS`.
    pub fn for_target(expected_keys: usize, target_fpr: f64) -> Self {
        let keys = expected_keys.clamp(1, MAX_EXPECTED_KEYS) as f64;
        let target = if target_fpr.is_nan() { MIN_FPR } else { target_fpr.clamp(MIN_FPR, MAX_FPR) };
        let meets = |blocks: usize| best_k(keys / blocks as f64).1 <= target;
        // A blocked filter always needs at least the bits of a classic one, so start there.
        let classic_bits = keys * -target.ln() / (std::f64::consts::LN_2 * std::f64::consts::LN_2);
        let mut low = ((classic_bits / BLOCK_BITS as f64).floor() as usize).clamp(1, MAX_BLOCKS);
        let mut high = low;
        while !meets(high) && high < MAX_BLOCKS {
            low = high;
            high = (high * 2).min(MAX_BLOCKS);
        }
        // Invariant: meets(high) or high == MAX_BLOCKS; the answer lies in low..=high.
        while low < high {
            let middle = low + (high - low) / 2;
            if meets(middle) { high = middle } else { low = middle + 1 }
        }
        let shape = FilterShape { k: best_k(keys / high as f64).0, blocks: high };
        assert!((1..=MAX_K).contains(&shape.k) && (1..=MAX_BLOCKS).contains(&shape.blocks));
        shape
    }

    /// Expected false-positive rate with `keys` distinct keys inserted.
    pub fn expected_fpr(&self, keys: usize) -> f64 {
        expected_fpr(keys as f64 / self.blocks as f64, parts(self.k))
    }

    /// Size of the encoded filter in bytes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.blocks * BLOCK_BYTES
    }
}

/// The k with the lowest expected false-positive rate at `keys_per_block`, and that rate.
fn best_k(keys_per_block: f64) -> (usize, f64) {
    (1..=MAX_K)
        .map(|k| (k, expected_fpr(keys_per_block, parts(k))))
        .fold((1, f64::INFINITY), |best, candidate| if candidate.1 < best.1 { candidate } else { best })
}

/// Expected false-positive rate of a blocked filter: the keys landing in the probed block are
/// Poisson(`keys_per_block`); with j keys there, part i has the probed bit set with probability
/// `1 - (1 - 1/size_i)^j`, and a false positive needs all k bits.
fn expected_fpr(keys_per_block: f64, parts: &[Part]) -> f64 {
    let lambda = keys_per_block;
    if lambda <= 0.0 {
        return 0.0;
    }
    // Twelve standard deviations past the mean: the Poisson mass beyond is far below 1e-12.
    let last_j = (lambda + 12.0 * lambda.sqrt() + 16.0).ceil() as u64;
    let log_miss: Vec<f64> = parts.iter().map(|p| (1.0 - 1.0 / p.size as f64).ln()).collect();
    let mut log_poisson = -lambda; // ln P(j = 0)
    let mut total = 0.0;
    for j in 0..=last_j {
        if j > 0 {
            log_poisson += lambda.ln() - (j as f64).ln();
        }
        let all_bits_set: f64 = log_miss.iter().map(|lm| 1.0 - (j as f64 * lm).exp()).product();
        total += log_poisson.exp() * all_bits_set;
    }
    total
}

/// An immutable filter: query it with `may_contain`.
#[derive(Clone, PartialEq, Eq)]
pub struct Filter {
    k: usize,
    blocks: Vec<Block>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter").field("k", &self.k).field("blocks", &self.blocks.len()).finish()
    }
}

impl Filter {
    fn empty(shape: FilterShape) -> Self {
        Filter { k: shape.k, blocks: vec![Block::default(); shape.blocks] }
    }

    /// False means the key is certainly absent; true means it may be present.
    #[inline]
    pub fn may_contain(&self, h: KeyHash) -> bool {
        let block = &self.blocks[h.block_index(self.blocks.len())];
        let folded = h.folded_low();
        // Every part is tested, without an early exit: the bits share one cache line, and a
        // branch-free test lets the CPU overlap the cache misses of consecutive lookups instead
        // of stalling on a mispredicted exit (an absent key's first bits are coin flips).
        parts(self.k).iter().fold(true, |all, part| all & block.get(part.bit_for(folded)))
    }

    /// Asks the CPU to start loading the cache line `may_contain(h)` reads, without waiting.
    /// A caller with many keys prefetches them all first: their misses then overlap instead of
    /// coming one after another (filters are larger than the caches).
    #[inline]
    pub fn prefetch(&self, h: KeyHash) {
        let block: *const Block = &self.blocks[h.block_index(self.blocks.len())];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetching is only a hint; it reads nothing and cannot fault, and `block` is a
        // valid reference besides. SSE is part of every x86_64 target.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(block.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = block;
    }

    fn insert(&mut self, h: KeyHash) {
        let blocks = self.blocks.len();
        let block = &mut self.blocks[h.block_index(blocks)];
        let folded = h.folded_low();
        for part in parts(self.k) {
            block.set(part.bit_for(folded));
        }
    }

    pub fn shape(&self) -> FilterShape {
        FilterShape { k: self.k, blocks: self.blocks.len() }
    }

    pub fn encoded_len(&self) -> usize {
        self.shape().encoded_len()
    }

    /// Appends the encoding (docs/format.md "Filter") to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.k as u8);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        self.encode_blocks(0..self.blocks.len(), out);
        assert_eq!(out.len() - start, self.encoded_len());
    }

    /// Appends blocks `range` as `encode` writes them (a paged meta writes its filter a page of
    /// blocks at a time, never the whole encoding at once).
    pub fn encode_blocks(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        for block in &self.blocks[range] {
            for word in block.0 {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
    }

    /// Parses exactly one encoded filter; `bytes` must hold nothing else.
    pub fn decode(bytes: &[u8]) -> Result<Filter, FormatError> {
        let shape = decode_header(bytes)?;
        let body = &bytes[HEADER_LEN..];
        let blocks: Vec<Block> = body.chunks_exact(BLOCK_BYTES).map(decode_block).collect();
        assert_eq!(blocks.len(), shape.blocks);
        Ok(Filter { k: shape.k, blocks })
    }
}

/// `Filter::may_contain` on one block as encoded (64 bytes, `Filter::encode`'s order): a paged
/// meta reads only the block a key falls in (`KeyHash::block_index`), never the whole filter.
pub fn encoded_block_may_contain(k: usize, encoded_block: &[u8], h: KeyHash) -> bool {
    assert_eq!(encoded_block.len(), BLOCK_BYTES);
    let folded = h.folded_low();
    // Words are little-endian, so bit b of the block is bit b % 8 of byte b / 8.
    let bit = |b: u32| encoded_block[(b / 8) as usize] & (1 << (b % 8)) != 0;
    parts(k.clamp(1, MAX_K)).iter().fold(true, |all, part| all & bit(part.bit_for(folded)))
}

/// A filter from its shape and its encoded blocks (the body `Filter::encode` writes after its
/// header), checked as `decode` checks a whole encoding.
pub fn from_blocks(shape: FilterShape, blocks: &[u8]) -> Result<Filter, FormatError> {
    let mut encoded = Vec::with_capacity(HEADER_LEN + blocks.len());
    encoded.extend_from_slice(&MAGIC);
    encoded.push(VERSION);
    encoded.push(shape.k.min(u8::MAX as usize) as u8);
    encoded.extend_from_slice(&[0, 0]);
    encoded.extend_from_slice(&(shape.blocks.min(u32::MAX as usize) as u32).to_le_bytes());
    encoded.extend_from_slice(blocks);
    Filter::decode(&encoded)
}

/// Checks everything but the block contents, including the exact total length.
fn decode_header(bytes: &[u8]) -> Result<FilterShape, FormatError> {
    let found = bytes.len() as u64;
    if bytes.len() < HEADER_LEN {
        return Err(FormatError::Length { what: WHAT, expected: HEADER_LEN as u64, found });
    }
    let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(FormatError::Magic { what: WHAT, found: magic });
    }
    if bytes[4] != VERSION {
        return Err(FormatError::Version { what: WHAT, found: bytes[4] as u64 });
    }
    let k = bytes[5] as usize;
    check_range(WHAT, "k", k as u64, 1, MAX_K as u64)?;
    if bytes[6..8] != [0, 0] {
        return Err(FormatError::Invalid { what: WHAT, detail: "reserved bytes 6..8 are not zero".into() });
    }
    let blocks = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    check_range(WHAT, "block count", blocks as u64, 1, MAX_BLOCKS as u64)?;
    let shape = FilterShape { k, blocks };
    if bytes.len() != shape.encoded_len() {
        return Err(FormatError::Length { what: WHAT, expected: shape.encoded_len() as u64, found });
    }
    Ok(shape)
}

fn decode_block(bytes: &[u8]) -> Block {
    assert_eq!(bytes.len(), BLOCK_BYTES);
    let mut block = Block::default();
    for (word, chunk) in block.0.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    block
}

/// Builds a filter sized for an expected key count and target false-positive rate.
pub struct FilterBuilder {
    filter: Filter,
}

impl FilterBuilder {
    /// Zero expected keys still gets one block, so inserting anyway stays correct.
    pub fn new(expected_keys: usize, target_fpr: f64) -> Self {
        Self::with_shape(FilterShape::for_target(expected_keys, target_fpr))
    }

    /// A builder with an explicit shape (k and blocks are clamped into their limits).
    pub fn with_shape(shape: FilterShape) -> Self {
        let shape = FilterShape { k: shape.k.clamp(1, MAX_K), blocks: shape.blocks.clamp(1, MAX_BLOCKS) };
        FilterBuilder { filter: Filter::empty(shape) }
    }

    /// Adds a key; inserting the same key twice is harmless.
    pub fn insert(&mut self, h: KeyHash) {
        self.filter.insert(h);
    }

    pub fn finish(self) -> Filter {
        self.filter
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::OUTLINED_BIT;

    /// SplitMix64: a tiny seeded generator, so that the test keys never change.
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            crate::base::rng::splitmix64(&mut self.0)
        }
    }

    /// Realistic keys: TID-like rkeys, small collections, outlined DIDs. `collection` parity
    /// separates the inserted set (odd) from the probes (even), so probes are never members.
    fn record_key(rng: &mut SplitMix, member: bool) -> RecordId {
        let collection = 2 * (rng.next() % 16) + u64::from(member);
        RecordId { rkey: rng.next() >> 1, collection, did: OUTLINED_BIT | (rng.next() % 10_000_000) }
    }

    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 { a } else { gcd(b, a % b) }
    }

    #[test]
    fn part_sizes_are_pairwise_coprime_and_fill_the_block() {
        for (index, sizes) in PART_SIZES.iter().enumerate() {
            assert_eq!(sizes.len(), index + 1, "table for k = {} has the wrong length", index + 1);
            assert_eq!(sizes.iter().sum::<u32>(), BLOCK_BITS, "k = {}", index + 1);
            for (i, &a) in sizes.iter().enumerate() {
                assert!(a >= 2);
                for &b in &sizes[i + 1..] {
                    assert_eq!(gcd(a, b), 1, "k = {}: {a} and {b} share a factor", index + 1);
                }
            }
            let last = parts(index + 1).last().unwrap();
            assert_eq!(last.offset + last.size, BLOCK_BITS);
        }
    }

    #[test]
    fn fast_mod_equals_the_remainder() {
        let mut rng = SplitMix(7);
        let edge_cases = [0, 1, 2, 6, 7, 510, 511, 512, u32::MAX - 1, u32::MAX];
        for k in 1..=MAX_K {
            for part in parts(k) {
                let randoms = (0..2_000).map(|_| rng.next() as u32).collect::<Vec<_>>();
                for h in edge_cases.iter().copied().chain(randoms) {
                    assert_eq!(fast_mod(h, part.size, part.mod_magic), h % part.size);
                }
            }
        }
    }

    #[test]
    fn blocks_are_cache_line_aligned() {
        assert_eq!(std::mem::align_of::<Block>(), 64);
        assert_eq!(std::mem::size_of::<Block>(), 64);
        let filter = FilterBuilder::new(10_000, 0.01).finish();
        assert_eq!(filter.blocks.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn multiply_shift_spans_every_block() {
        assert_eq!(KeyHash(0).block_index(1000), 0);
        assert_eq!(KeyHash(u128::MAX).block_index(1000), 999);
        assert_eq!(KeyHash(1u128 << 127).block_index(1000), 500);
        assert_eq!(KeyHash(0xFFFF_FFFF_0000_0001).folded_low(), 0xFFFF_FFFE);
    }

    #[test]
    fn sizing_meets_the_target_and_respects_limits() {
        let one_percent = FilterShape::for_target(1_000_000, 0.01);
        assert!(one_percent.expected_fpr(1_000_000) <= 0.01);
        // The next smaller filter would miss: the search found the smallest.
        let smaller = FilterShape { blocks: one_percent.blocks - 1, ..one_percent };
        assert!((1..=MAX_K).all(|k| FilterShape { k, ..smaller }.expected_fpr(1_000_000) > 0.01));
        // A blocked filter needs more than the classic 9.59 bits per key at 1%.
        let bits_per_key = (one_percent.blocks * 512) as f64 / 1e6;
        assert!((9.6..12.0).contains(&bits_per_key), "{bits_per_key} bits per key");

        assert_eq!(FilterShape::for_target(0, 0.01).blocks, 1);
        assert_eq!(FilterShape::for_target(usize::MAX, 1e-9).blocks, MAX_BLOCKS);
        assert_eq!(FilterShape::for_target(1000, f64::NAN), FilterShape::for_target(1000, MIN_FPR));
        assert_eq!(FilterShape::for_target(1000, 0.9), FilterShape::for_target(1000, MAX_FPR));
    }

    #[test]
    fn an_empty_filter_rejects_everything_and_still_accepts_inserts() {
        let mut rng = SplitMix(3);
        let empty = FilterBuilder::new(0, 0.01).finish();
        assert_eq!(empty.encoded_len(), HEADER_LEN + BLOCK_BYTES);
        assert!((0..1000).all(|_| !empty.may_contain(KeyHash::of_record(&record_key(&mut rng, true)))));

        let mut builder = FilterBuilder::new(0, 0.01);
        let key = KeyHash::of_record(&record_key(&mut rng, true));
        builder.insert(key);
        assert!(builder.finish().may_contain(key));
    }

    /// Builds a filter over `keys` members, probes as many non-members; returns the measured
    /// false-positive rate and checks that every member is found.
    fn measured_fpr(keys: usize, target: f64) -> f64 {
        let mut rng = SplitMix(0x5EED_0001);
        let mut builder = FilterBuilder::new(keys, target);
        let members: Vec<KeyHash> = (0..keys).map(|_| KeyHash::of_record(&record_key(&mut rng, true))).collect();
        members.iter().for_each(|&h| builder.insert(h));
        let filter = builder.finish();
        assert!(members.iter().all(|&h| filter.may_contain(h)), "false negative");
        let false_positives =
            (0..keys).filter(|_| filter.may_contain(KeyHash::of_record(&record_key(&mut rng, false)))).count();
        let fpr = false_positives as f64 / keys as f64;
        let shape = filter.shape();
        let bits = (shape.blocks * 512) as f64 / keys as f64;
        println!("target {target}: k {} bits/key {bits:.2} measured {fpr:.5}", shape.k);
        fpr
    }

    #[test]
    fn measured_false_positive_rate_is_within_20_percent_of_the_target() {
        for target in [0.05, 0.01, 0.001] {
            let fpr = measured_fpr(1_000_000, target);
            assert!((target * 0.8..=target * 1.2).contains(&fpr), "target {target}, measured {fpr}");
        }
    }

    /// 100 keys derived from their index only; the filter over them is the golden filter.
    fn golden_filter() -> Filter {
        let mut builder = FilterBuilder::new(100, 0.01);
        for i in 0..100u64 {
            let key =
                RecordId { rkey: 1_700_000_000_000_000 + i * 1_000_003, collection: i % 5 + 1, did: OUTLINED_BIT | i };
            builder.insert(KeyHash::of_record(&key));
        }
        builder.finish()
    }

    const GOLDEN_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/filter_golden.bin");

    #[test]
    fn encoding_matches_the_golden_bytes() {
        let mut encoded = Vec::new();
        golden_filter().encode(&mut encoded);
        let golden = std::fs::read(GOLDEN_PATH).expect("tests/data/filter_golden.bin");
        assert_eq!(encoded, golden, "the filter format drifted from tests/data/filter_golden.bin");
        // The file itself is pinned too, so that regenerating it cannot hide a drift.
        assert_eq!(&golden[..12], &[b'O', b'H', b'B', b'F', 1, 7, 0, 0, 2, 0, 0, 0]);
        assert_eq!(xxhash_rust::xxh3::xxh3_64(&golden), GOLDEN_XXH3);
    }

    const GOLDEN_XXH3: u64 = 0x21a5_63c7_8358_df1a;

    /// Run with `--ignored` only when the format changes on purpose (and bump `VERSION`).
    #[test]
    #[ignore]
    fn write_golden_bytes() {
        let mut encoded = Vec::new();
        golden_filter().encode(&mut encoded);
        std::fs::write(GOLDEN_PATH, &encoded).unwrap();
        println!("header {:?} xxh3 {:#018x}", &encoded[..12], xxhash_rust::xxh3::xxh3_64(&encoded));
    }

    #[test]
    fn encode_decode_round_trips() {
        let filter = golden_filter();
        let mut encoded = Vec::new();
        filter.encode(&mut encoded);
        let decoded = Filter::decode(&encoded).unwrap();
        assert_eq!(decoded, filter);
        let mut again = Vec::new();
        decoded.encode(&mut again);
        assert_eq!(again, encoded);
    }

    #[test]
    fn decode_rejects_truncated_and_garbage_input() {
        let mut encoded = Vec::new();
        golden_filter().encode(&mut encoded);
        for len in 0..encoded.len() {
            assert!(matches!(Filter::decode(&encoded[..len]), Err(FormatError::Length { .. })), "length {len}");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(matches!(Filter::decode(&longer), Err(FormatError::Length { .. })));

        let corrupt = |at: usize, value: u8| {
            let mut bytes = encoded.clone();
            bytes[at] = value;
            Filter::decode(&bytes)
        };
        assert!(matches!(corrupt(0, b'X'), Err(FormatError::Magic { .. })));
        assert!(matches!(corrupt(4, 2), Err(FormatError::Version { found: 2, .. })));
        assert!(matches!(corrupt(5, 0), Err(FormatError::OutOfRange { field: "k", .. })));
        assert!(matches!(corrupt(5, 17), Err(FormatError::OutOfRange { field: "k", .. })));
        assert!(matches!(corrupt(6, 1), Err(FormatError::Invalid { .. })));
        assert!(matches!(corrupt(8, 0), Err(FormatError::OutOfRange { field: "block count", .. })));
        assert!(matches!(corrupt(8, 3), Err(FormatError::Length { .. })));
        assert!(matches!(corrupt(11, 0xFF), Err(FormatError::OutOfRange { field: "block count", .. })));
        let mut rng = SplitMix(11);
        let garbage: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
        assert!(Filter::decode(&garbage).is_err());
    }
}
