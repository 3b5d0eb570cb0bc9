//! Byte-column layouts: how fixed-width entries are turned into columns of bytes that compress
//! (or code) well, and back. Used by the payload encodings, the frame index of the meta, and
//! (`transpose_into`, `untransposed`, in `lsm::bytes`) by the outline ranges and the column models.
//!
//! Invariants:
//! - Every layout has an exact inverse here, and the inverses are tested against byte-by-byte
//!   references.

use crate::lsm::bytes::transpose_into;

/// Replaces each record key (the big-endian `u64` at each of `offsets` in every entry) by `map`
/// of it: `tid::spread` before encoding 2's XOR, `tid::gather` after it.
pub(super) fn map_rkeys(raw: &mut [u8], width: usize, offsets: &[usize], map: fn(u64) -> u64) {
    for entry in raw.chunks_exact_mut(width) {
        for &at in offsets {
            let field: &mut [u8; 8] = (&mut entry[at..at + 8]).try_into().expect("a record key is 8 bytes");
            *field = map(u64::from_be_bytes(*field)).to_be_bytes();
        }
    }
}

/// XOR each entry with the previous one (the first with zeros), then transpose: all byte 0s,
/// then all byte 1s, and so on, appended to `out`. Sorted neighbours share long prefixes, so the
/// deltas are mostly zero bytes, and transposing puts the zeros (and the slowly changing bytes)
/// next to each other where zstd compresses them best.
pub(super) fn xor_delta_transpose(raw: &[u8], width: usize, out: &mut Vec<u8>) {
    let count = raw.len() / width;
    let start = out.len();
    out.resize(start + raw.len(), 0);
    for byte in 0..width {
        let column = &mut out[start + byte * count..start + (byte + 1) * count];
        let mut previous = 0u8;
        for (i, slot) in column.iter_mut().enumerate() {
            let value = raw[i * width + byte];
            *slot = value ^ previous;
            previous = value;
        }
    }
}

/// How many runs of equal keys (the first `key_width` bytes) the sorted entries form.
fn count_key_runs(raw: &[u8], width: usize, key_width: usize) -> usize {
    let keys = || raw.chunks_exact(width).map(|entry| &entry[..key_width]);
    1 + keys().zip(keys().skip(1)).filter(|(previous, key)| previous != key).count()
}

/// Splits sorted entries into their runs of equal keys (the first `key_width` bytes): each run's
/// key once into `keys`, its length into `runs`, and every entry's remaining bytes into `rests`.
pub(super) fn split_key_runs(
    raw: &[u8],
    width: usize,
    key_width: usize,
    keys: &mut Vec<u8>,
    runs: &mut Vec<u16>,
    rests: &mut Vec<u8>,
) {
    keys.clear();
    runs.clear();
    rests.clear();
    for entry in raw.chunks_exact(width) {
        let (key, rest) = entry.split_at(key_width);
        match runs.last_mut() {
            Some(run) if keys[keys.len() - key_width..] == *key => *run += 1,
            _ => {
                keys.extend_from_slice(key);
                runs.push(1);
            }
        }
        rests.extend_from_slice(rest);
    }
    assert_eq!(runs.iter().map(|&r| usize::from(r)).sum::<usize>(), raw.len() / width);
    assert_eq!(runs.len(), count_key_runs(raw, width, key_width));
}

/// Payload encoding 3's layout, appended to `out`: the runs' keys XOR-delta'd and transposed,
/// the run lengths as big-endian u16s transposed (every high byte, then every low byte), then the
/// entries' rests XOR-delta'd and transposed.
pub(super) fn key_runs_transpose(keys: &[u8], runs: &[u16], rests: &[u8], widths: (usize, usize), out: &mut Vec<u8>) {
    let (key_width, rest_width) = widths;
    xor_delta_transpose(keys, key_width, out);
    transpose_into(runs.len(), |i| runs[i].to_be_bytes(), out);
    xor_delta_transpose(rests, rest_width, out);
}

/// Inverse of `xor_delta_transpose`: a running XOR down each column restores the entries.
///
/// Eight entries by eight columns at a time when the width allows: each column's eight bytes are
/// read as one word, un-XORed with a prefix XOR inside the word, and the 8x8 block is transposed
/// with word operations, so every output word is written whole. Byte by byte (the rest, and the
/// reference in the tests) it was the hottest loop of a warm query, by profile.
pub(super) fn untranspose_xor_undelta(shuffled: &[u8], width: usize, raw: &mut Vec<u8>) {
    let count = shuffled.len() / width;
    raw.clear();
    raw.resize(shuffled.len(), 0);
    let blocked = if width.is_multiple_of(8) { count / 8 * 8 } else { 0 };
    // Eight columns at a time, down all the entries: eight read streams. All the columns at once
    // would be `width` streams a power of two apart, more than the L1 cache's ways can hold.
    for group in (0..width).step_by(8) {
        let columns = group..(group + 8).min(width);
        let mut running = [0u8; 8];
        for first in (0..blocked).step_by(8) {
            let mut block = [0u64; 8];
            for (k, word) in block.iter_mut().enumerate() {
                let at = (group + k) * count + first;
                let deltas = u64::from_le_bytes(shuffled[at..at + 8].try_into().expect("eight bytes"));
                *word = prefix_xor(deltas) ^ (u64::from(running[k]) * 0x0101_0101_0101_0101);
                running[k] = (*word >> 56) as u8;
            }
            for (j, row) in transpose_8x8(block).iter().enumerate() {
                let at = (first + j) * width + group;
                raw[at..at + 8].copy_from_slice(&row.to_le_bytes());
            }
        }
        for (k, column) in columns.enumerate() {
            let mut value = running[k];
            for i in blocked..count {
                value ^= shuffled[column * count + i];
                raw[i * width + column] = value;
            }
        }
    }
}

/// Byte `j` of the result is the XOR of bytes `0..=j` of `x` (little-endian byte order).
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 8;
    x ^= x << 16;
    x ^ (x << 32)
}

/// Transposes an 8x8 byte matrix held as eight little-endian words (word = row, byte = column):
/// swaps 1-byte, then 2-byte, then 4-byte sub-blocks across the diagonal.
fn transpose_8x8(mut m: [u64; 8]) -> [u64; 8] {
    for (shift, mask, pairs) in [
        (8, 0x00FF_00FF_00FF_00FF_u64, [(0, 1), (2, 3), (4, 5), (6, 7)]),
        (16, 0x0000_FFFF_0000_FFFF_u64, [(0, 2), (1, 3), (4, 6), (5, 7)]),
        (32, 0x0000_0000_FFFF_FFFF_u64, [(0, 4), (1, 5), (2, 6), (3, 7)]),
    ] {
        for (a, b) in pairs {
            let swap = ((m[a] >> shift) ^ m[b]) & mask;
            m[b] ^= swap;
            m[a] ^= swap << shift;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-by-byte inverse `untranspose_xor_undelta` must equal.
    fn untranspose_reference(shuffled: &[u8], width: usize) -> Vec<u8> {
        let count = shuffled.len() / width;
        let mut raw = vec![0u8; shuffled.len()];
        for byte in 0..width {
            let mut value = 0u8;
            for i in 0..count {
                value ^= shuffled[byte * count + i];
                raw[i * width + byte] = value;
            }
        }
        raw
    }

    #[test]
    fn blocked_untranspose_equals_the_byte_by_byte_one_and_inverts_the_encoding() {
        let mut state = 7u64;
        for (width, count) in [(64, 0), (64, 1), (64, 7), (64, 8), (64, 1000), (32, 9), (32, 1024), (24, 17), (5, 33)] {
            let raw: Vec<u8> = (0..width * count).map(|_| crate::base::rng::splitmix64(&mut state) as u8).collect();
            let mut shuffled = Vec::new();
            xor_delta_transpose(&raw, width, &mut shuffled);
            let mut restored = Vec::new();
            untranspose_xor_undelta(&shuffled, width, &mut restored);
            assert_eq!(restored, raw, "width {width}, {count} entries");
            assert_eq!(restored, untranspose_reference(&shuffled, width), "width {width}, {count} entries");
        }
    }

    #[test]
    fn an_8x8_transpose_moves_every_byte_across_the_diagonal() {
        let matrix: [u64; 8] =
            std::array::from_fn(|row| u64::from_le_bytes(std::array::from_fn(|c| (row * 8 + c) as u8)));
        let transposed = transpose_8x8(matrix);
        for (column, word) in transposed.iter().enumerate() {
            assert_eq!(word.to_le_bytes(), std::array::from_fn::<u8, 8, _>(|row| (row * 8 + column) as u8));
        }
        assert_eq!(transpose_8x8(transposed), matrix);
        assert_eq!(
            prefix_xor(u64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128])).to_le_bytes(),
            [1, 3, 7, 15, 31, 63, 127, 255]
        );
    }
}
