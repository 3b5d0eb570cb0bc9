//! Table meta files, decoded from arbitrary bytes and round-tripped through whole tables.
//!
//! The first byte picks the entry type (bits 0 and 5: backlinks, revocations, hot links or tallies;
//! account tallies when bit 6 is set)
//! and the mode (bit 2):
//! - decode: the rest is a meta file, its checksum fixed up first when bit 1 is set;
//! - build: the rest is entries (sorted and deduplicated) and, in its first byte, the frame size;
//!   they are written as a table (with column models when bit 3 is set) and read back.
//!
//! Invariants checked (src/lsm/table.rs states them):
//! - `TableMeta::check_encoded` (a meta checked without decoding it whole) accepts exactly the
//!   metas that decode, with their data length.
//! - A meta file that decodes re-encodes (as version 3 with models, else 2, or 1) to bytes that decode to the same meta and
//!   re-encode to themselves; its frame ranges and byte ranges stay in bounds, and reading frames
//!   from data of the wrong length is an error, not a panic; checking a data file against it
//!   (`verify_data_file`) fails for zeros or another length, without panicking.
//! - A built table decodes to exactly its entries (meta and frames), its filter admits every key (or prefix),
//!   and `frames_for_key` covers every entry of the key.
#![no_main]

mod common;

use backlinks::lsm::entry::{Entry, encode_to_vec, shard_prefix_hash};
use backlinks::lsm::filter::KeyHash;
use backlinks::lsm::table::{FormatError, TableMeta, decode_frames, verify_data_file};
use backlinks::model::ids::{AccountTally, Backlink, HotLink, Revocation, Tally};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match (mode & 1) | (mode >> 4 & 2) | (mode >> 4 & 4) {
        0 => check::<Backlink>(mode, rest),
        1 => check::<Revocation>(mode, rest),
        2 => check::<HotLink>(mode, rest),
        3 => check::<Tally>(mode, rest),
        _ => check::<AccountTally>(mode, rest),
    }
});

fn check<E: Entry>(mode: u8, rest: &[u8]) {
    if mode & 4 == 0 { check_decode::<E>(rest, mode & 2 != 0) } else { check_build::<E>(rest, mode & 8 != 0) }
}

fn check_decode<E: Entry>(bytes: &[u8], fix_checksum: bool) {
    let bytes = if fix_checksum { common::with_checksum(bytes) } else { bytes.to_vec() };
    // The check that never decodes a meta whole agrees with the decode on every input.
    let checked = TableMeta::<E>::check_encoded(&bytes);
    let Ok(meta) = TableMeta::<E>::decode(&bytes) else {
        assert!(checked.is_err(), "check_encoded passed a meta that decode refuses");
        return;
    };
    assert_eq!(checked.ok(), Some(meta.data_len), "check_encoded refused a meta that decodes");
    let mut encoded = Vec::new();
    meta.encode(&mut encoded);
    let again = TableMeta::<E>::decode(&encoded).expect("a meta we wrote decodes");
    assert_eq!(again, meta, "decode(encode(m)) != m");
    let mut encoded_again = Vec::new();
    again.encode(&mut encoded_again);
    assert_eq!(encoded_again, encoded, "encoding a meta is not deterministic");
    for frame in &meta.frames {
        let range = meta.frames_for_key(frame.first.key());
        assert!(range.start <= range.end && range.end <= meta.frames.len(), "{range:?}");
        let (start, end) = meta.byte_range(range.clone());
        assert!(start <= end && end <= meta.data_len, "bytes {start}..{end} of {}", meta.data_len);
        let too_short = vec![0u8; (end - start).saturating_sub(1) as usize];
        if !range.is_empty() {
            assert!(decode_frames(&meta, range, &too_short, &mut Vec::new()).is_err(), "short data accepted");
        }
    }
    // The upload's check of a data file against this meta: zeros of the right length fail their
    // frame checksums (an error, never a panic), and a file of another length fails before any read.
    let zeros = vec![0u8; meta.data_len.min(1 << 20) as usize];
    if !meta.frames.is_empty() {
        assert!(verify_data_file(&meta, zeros.len() as u64, &mut &zeros[..]).is_err(), "zeros passed the check");
    }
    let wrong = meta.data_len.wrapping_add(1);
    assert!(matches!(verify_data_file(&meta, wrong, &mut std::io::empty()), Err(FormatError::Length { .. })));
}

fn check_build<E: Entry>(bytes: &[u8], modelled: bool) {
    let Some((&frame_size, rest)) = bytes.split_first() else { return };
    let entries = common::sorted_entries::<E>(rest);
    // 1 to 16 entries per frame, so that small inputs still make many frames.
    let frame_bytes = E::WIDTH * (1 + usize::from(frame_size % 16));
    let (data, meta_bytes) = common::build_table(&entries, frame_bytes, modelled);
    let meta = TableMeta::<E>::decode(&meta_bytes).expect("a meta we wrote decodes");
    assert_eq!(meta.entries, entries.len() as u64);
    assert_eq!(meta.last, entries.last().copied());
    let mut decoded = Vec::new();
    decode_frames(&meta, 0..meta.frames.len(), &data, &mut decoded).expect("frames we wrote decode");
    assert_eq!(decoded, entries, "decode(encode(x)) != x");
    for entry in &entries {
        check_key_lookup(&meta, &data, entry);
    }
}

/// The filter admits what it holds of the entry (its first `FILTER_WIDTH` bytes, and its shard
/// prefix for a tree whose filters hold those), and the frames `frames_for_key` names hold it.
fn check_key_lookup<E: Entry>(meta: &TableMeta<E>, data: &[u8], entry: &E) {
    let prefix = KeyHash::of(&encode_to_vec(entry)[..E::FILTER_WIDTH]);
    assert!(meta.may_contain(prefix), "the filter rejects a prefix it holds");
    if E::FILTER_HOLDS_SHARDS {
        assert!(meta.may_contain(shard_prefix_hash::<E>(&entry.key())), "the filter rejects a shard it holds");
    }
    let range = meta.frames_for_key(entry.key());
    let (start, end) = meta.byte_range(range.clone());
    let mut found = Vec::new();
    decode_frames(meta, range, &data[start as usize..end as usize], &mut found).expect("a frame range decodes");
    assert!(found.contains(entry), "frames_for_key misses {entry:?}");
}
