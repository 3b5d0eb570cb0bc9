//! Outline range objects: `outline::range::decode` on arbitrary bytes, for every kind.
//!
//! Byte 0 picks the kind (its low two bits) and whether the rest is taken as the object itself
//! (bit 7 clear) or as the range's contents before its checksum and compression (bit 7 set: the
//! target appends the xxh3-64 and compresses, so that the parsing behind them is reached).
//!
//! Invariants checked (docs/format.md "Outline range" states the format):
//! - Every decoded value is UTF-8 of 1..=the kind's maximum length; no more rows than the
//!   contents have room for (10 bytes a row at least).
//! - decode(encode(rows)) == rows: the decoded rows, written again (version 2), decode to the
//!   same rows.
#![no_main]

use backlinks::outline::{OutlineKind, range};
use libfuzzer_sys::fuzz_target;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let kind = OutlineKind::ALL[usize::from(mode & 3)];
    let object = if mode & 0x80 == 0 { rest.to_vec() } else { sealed(rest) };
    let Ok(rows) = range::decode(kind, &object) else { return };
    let contents = zstd::bulk::decompress(&object, range::MAX_RANGE_BYTES).expect("a decoded range decompresses");
    assert!(rows.len() * range::ROW_OVERHEAD <= contents.len(), "{} rows in {} bytes", rows.len(), contents.len());
    for (_, value) in &rows {
        assert!((1..=kind.max_len()).contains(&value.len()), "a {kind:?} value of {} bytes", value.len());
    }
    let again = range::encode(kind, rows.iter().map(|(id, value)| (*id, value.as_str())));
    assert_eq!(range::decode(kind, &again).expect("a range we wrote decodes"), rows, "decode(encode(x)) != x");
});

/// The contents with their checksum appended, compressed as a writer would.
fn sealed(contents: &[u8]) -> Vec<u8> {
    let mut raw = contents.to_vec();
    raw.extend_from_slice(&xxh3_64(contents).to_le_bytes());
    zstd::bulk::compress(&raw, 3).expect("zstd compresses in memory")
}
