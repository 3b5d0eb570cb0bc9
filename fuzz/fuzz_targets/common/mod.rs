//! Helpers shared by the table targets.
//!
//! - `with_checksum` lets the fuzzer past the trailing xxh3-64 that frames and meta files end
//!   with: without it nearly every mutation dies at the checksum and the parsers behind it are
//!   never reached.
//! - `sorted_entries` and `build_table` turn fuzz bytes into a valid table, for round trips.

// Each target uses only some of these helpers.
#![allow(dead_code)]

use backlinks::lsm::coder::ColumnModels;
use backlinks::lsm::entry::Entry;
use backlinks::lsm::table::{TableMeta, TableOptions, write_table};
use xxhash_rust::xxh3::xxh3_64;

const CHECKSUM_LEN: usize = 8;

/// `bytes` with its last 8 bytes replaced by the little-endian xxh3-64 of everything before them.
pub fn with_checksum(bytes: &[u8]) -> Vec<u8> {
    let mut fixed = bytes.to_vec();
    if let Some(split) = fixed.len().checked_sub(CHECKSUM_LEN) {
        let checksum = xxh3_64(&fixed[..split]);
        fixed[split..].copy_from_slice(&checksum.to_le_bytes());
    }
    fixed
}

/// Every whole `E::WIDTH` chunk of `bytes` as an entry, sorted, duplicates removed.
pub fn sorted_entries<E: Entry>(bytes: &[u8]) -> Vec<E> {
    let mut entries: Vec<E> = bytes.chunks_exact(E::WIDTH).map(E::decode).collect();
    entries.sort_unstable();
    entries.dedup();
    entries
}

/// Writes `entries` (strictly increasing) as a table of frames of about `frame_bytes` raw bytes,
/// with column models (payload encoding 4) when `modelled`; returns the data file and the meta
/// file.
pub fn build_table<E: Entry>(entries: &[E], frame_bytes: usize, modelled: bool) -> (Vec<u8>, Vec<u8>) {
    let model_min_entries = if modelled { 0 } else { u64::MAX };
    let options = TableOptions { frame_bytes, model_min_entries, ..TableOptions::default() };
    let (data, meta, summary) =
        write_table(Vec::new(), entries, &options).expect("strictly increasing entries, written to memory");
    assert_eq!(summary.entries, entries.len() as u64);
    assert_eq!(summary.data_len, data.len() as u64);
    assert_eq!(summary.meta_len, meta.len() as u64);
    (data, meta)
}

/// Column models learnt from a fixed, seeded table of `E`: what encoding-4 frames are decoded
/// under when the fuzzer makes up the frames.
pub fn fixed_models<E: Entry>() -> ColumnModels {
    let mut state = 0x5eed_u64;
    let bytes: Vec<u8> = (0..E::WIDTH * 600)
        .map(|i| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Mostly small field values, as sorted real entries have.
            if i % 8 < 6 { 0 } else { (state >> 56) as u8 }
        })
        .collect();
    let (_, meta) = build_table(&sorted_entries::<E>(&bytes), 16 * 1024, true);
    TableMeta::<E>::decode(&meta).expect("a meta we wrote decodes").models.expect("built with models")
}
