//! Tests of the table format as a whole: round trips against plain models, the golden files of
//! every encoding and meta version, and hostile bytes.

use super::builder::{KEY_HASHES_IN_MEMORY, Spills, TableBuilder, learn_models, write_table};
use super::columns::{key_runs_transpose, split_key_runs};
use super::frame::{
    ENCODING_SPREAD_KEY_RUNS_MODELLED, FrameEncoder, FrameHeader, decode_frame, decode_frames, verify_data_file,
};
use super::meta::{FRAME_INFO_FIXED_LEN, META_HEADER_LEN, TableMeta, encode_entry, encode_frame_index};
use super::*;
use crate::lsm::bytes::CHECKSUM_LEN;
use crate::lsm::filter::{FilterBuilder, KeyHash};
use crate::model::ids::{Backlink, ForwardLink, OUTLINED_BIT, RecordId, Revocation};
use proptest::prelude::*;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

fn options(frame_bytes: usize) -> TableOptions {
    TableOptions { frame_bytes, ..TableOptions::default() }
}

/// Options whose tables carry column models however few their entries.
fn modelled_options(frame_bytes: usize) -> TableOptions {
    TableOptions { frame_bytes, model_min_entries: 0, ..TableOptions::default() }
}

/// Builds a table in memory under models learnt from `sample` (a merge writes its shards under
/// models learnt from its first entries): (data bytes, meta bytes, summary).
fn build_sampled<E: Entry>(entries: &[E], sample: &[E], opts: &TableOptions) -> (Vec<u8>, Vec<u8>, TableSummary) {
    let models = learn_models(sample.iter().copied(), opts);
    let mut builder = TableBuilder::new(Vec::new(), models, opts).unwrap();
    entries.iter().for_each(|entry| builder.push(entry).unwrap());
    let (data, meta, summary) = builder.finish().unwrap();
    assert_eq!(summary.data_len, data.len() as u64);
    assert_eq!(summary.meta_len, meta.len() as u64);
    assert_eq!(summary.entries, entries.len() as u64);
    (data, meta, summary)
}

/// Builds a table in memory under models learnt from all its entries (as a flush does).
fn build<E: Entry>(entries: &[E], opts: &TableOptions) -> (Vec<u8>, Vec<u8>, TableSummary) {
    let built = write_table(Vec::new(), entries, opts).unwrap();
    assert_eq!(built, build_sampled(entries, entries, opts), "write_table is learn_models, then a builder");
    built
}

/// Reads frames[r] the way a query does: one contiguous byte range.
fn read_frames<E: Entry>(meta: &TableMeta<E>, data: &[u8], r: Range<usize>) -> Vec<E> {
    let (start, end) = meta.byte_range(r.clone());
    let mut out = Vec::new();
    decode_frames(meta, r, &data[start as usize..end as usize], &mut out).unwrap();
    out
}

fn entries_between<E: Entry>(meta: &TableMeta<E>, data: &[u8], lo: &E, hi: &E) -> Vec<E> {
    let r = meta.frames_overlapping(lo, hi);
    let frames = read_frames(meta, data, r.clone());
    // Only the first frame of the range may miss the range entirely.
    for frame in &meta.frames[r.clone()][1.min(r.len())..] {
        assert!(*lo <= frame.first && frame.first <= *hi, "frame {frame:?} is outside {lo:?}..={hi:?}");
    }
    frames.into_iter().filter(|e| lo <= e && e <= hi).collect()
}

fn record(rkey: u64, collection: u64, did: u64) -> RecordId {
    RecordId { rkey, collection, did }
}

/// Backlinks from small domains, so that keys repeat and frames split keys.
fn backlink_strategy() -> impl Strategy<Value = Backlink> {
    (0..6u64, 0..40u64, 0..3u64, 1..3u64, 0..3u64).prop_map(|(target, rkey, did, location, rev)| Backlink {
        target: record(target * 1000, 1, OUTLINED_BIT | target),
        source: record(rkey << 20, 2, OUTLINED_BIT | did),
        location,
        source_rev: rev,
    })
}

fn revocation_strategy() -> impl Strategy<Value = Revocation> {
    (0..50u64, 0..3u64, 0..4u64)
        .prop_map(|(rkey, did, rev)| Revocation { source: record(rkey, u64::from(rkey % 7 == 0), did), rev })
}

fn sorted_set<E: Entry>(mut entries: Vec<E>) -> Vec<E> {
    entries.sort();
    entries.dedup();
    entries
}

/// Round trip plus `frames_overlapping` against a plain filter over the full list.
/// Builds `entries` as a table, with column models (payload encoding 4) when `modelled`,
/// learnt from its first `sampled` entries only (the later ones may hold values the models never
/// saw), and checks every way of reading it.
fn check_table<E: Entry>(entries: &[E], frame_bytes: usize, modelled: bool, sampled: usize, ranges: &[(E, E)]) {
    let model_min_entries = if modelled { 0 } else { u64::MAX };
    let options = TableOptions { model_min_entries, ..options(frame_bytes) };
    let sample = &entries[..sampled.min(entries.len())];
    let (data, meta_bytes, summary) = build_sampled(entries, sample, &options);
    let meta = TableMeta::<E>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.models.is_some(), modelled && !sample.is_empty());
    let mut reencoded = Vec::new();
    meta.encode(&mut reencoded);
    assert_eq!(reencoded, meta_bytes, "a meta re-encodes to its own bytes");
    assert_eq!(meta.frames.len(), summary.frames as usize);
    assert_eq!(meta.last, entries.last().copied());
    assert_eq!(read_frames(&meta, &data, 0..meta.frames.len()), entries);
    for entry in entries {
        assert!(meta.may_contain(KeyHash::of_record(&entry.key())));
    }
    for (a, b) in ranges {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        for bound in [lo, hi] {
            let plain = meta.frames.partition_point(|frame| frame.first <= *bound);
            assert_eq!(meta.frames_starting_at_or_before(bound), plain, "bound {bound:?}");
        }
        let expected: Vec<E> = entries.iter().filter(|e| lo <= *e && *e <= hi).copied().collect();
        assert_eq!(entries_between(&meta, &data, lo, hi), expected, "range {lo:?}..={hi:?}");
        let key_entries: Vec<E> = entries.iter().filter(|e| e.key() == lo.key()).copied().collect();
        let r = meta.frames_for_key(lo.key());
        let found: Vec<E> = read_frames(&meta, &data, r).into_iter().filter(|e| e.key() == lo.key()).collect();
        assert_eq!(found, key_entries);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn backlink_tables_round_trip(
        entries in prop::collection::vec(backlink_strategy(), 0..300),
        frame_bytes in prop_oneof![1..400usize, 400..70_000usize],
        modelled in any::<bool>(),
        sampled in 0..300usize,
        ranges in prop::collection::vec((backlink_strategy(), backlink_strategy()), 1..12),
    ) {
        check_table(&sorted_set(entries), frame_bytes, modelled, sampled, &ranges);
    }

    /// Forward links: the backlinks' fields in source order, both record keys spread.
    #[test]
    fn forward_link_tables_round_trip(
        entries in prop::collection::vec(backlink_strategy(), 0..300),
        frame_bytes in prop_oneof![1..400usize, 400..70_000usize],
        modelled in any::<bool>(),
        sampled in 0..300usize,
        ranges in prop::collection::vec((backlink_strategy(), backlink_strategy()), 1..12),
    ) {
        let forward = |links: Vec<Backlink>| links.into_iter().map(Backlink::forward).collect::<Vec<_>>();
        let ranges: Vec<(ForwardLink, ForwardLink)> = ranges.into_iter().map(|(a, b)| (a.forward(), b.forward())).collect();
        check_table(&sorted_set(forward(entries)), frame_bytes, modelled, sampled, &ranges);
    }

    #[test]
    fn revocation_tables_round_trip(
        entries in prop::collection::vec(revocation_strategy(), 0..300),
        frame_bytes in prop_oneof![1..200usize, 200..70_000usize],
        modelled in any::<bool>(),
        sampled in 0..300usize,
        ranges in prop::collection::vec((revocation_strategy(), revocation_strategy()), 1..12),
    ) {
        check_table(&sorted_set(entries), frame_bytes, modelled, sampled, &ranges);
    }
}

/// One target with 10,000 backlinks between two neighbours, laid out so that with 64 entries
/// per frame the target starts inside frame 0 and the next neighbour starts frame 157.
fn popular_target_table() -> (Vec<Backlink>, [RecordId; 3]) {
    let keys =
        [record(4_000, 3, OUTLINED_BIT | 1), record(5_000, 3, OUTLINED_BIT | 9), record(6_000, 3, OUTLINED_BIT | 2)];
    let link = |target: RecordId, i: u64| Backlink {
        target,
        source: record(1_000_000 + i * 17, 1, OUTLINED_BIT | (i % 97)),
        location: 1,
        source_rev: i,
    };
    let counts = [48, 10_000, 30];
    let entries = keys.iter().zip(counts).flat_map(|(&key, count)| (0..count).map(move |i| link(key, i)));
    (sorted_set(entries.collect()), keys)
}

#[test]
fn a_popular_target_spans_many_frames_and_all_are_found() {
    let (entries, [before, popular, after]) = popular_target_table();
    let (data, meta_bytes, _) = build(&entries, &options(64 * Backlink::WIDTH));
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.frames.len(), 158);
    // Entries 48..10_048 are the popular target: frames 0..=156, all but the first continuing it.
    let r = meta.frames_for_key(popular);
    assert_eq!(r, 0..157);
    assert!(meta.frames[1..157].iter().all(|frame| frame.continues && frame.first.target == popular));
    let found: Vec<Backlink> = read_frames(&meta, &data, r).into_iter().filter(|e| e.target == popular).collect();
    assert_eq!(found.len(), 10_000);

    // Paging by source inside the target (entries 5_048..=5_147): frames 78..=80 only.
    let page = &found[5_000..5_100];
    let (lo, hi) = (page[0], page[99]);
    assert_eq!(meta.frames_overlapping(&lo, &hi), 78..81);
    assert_eq!(entries_between(&meta, &data, &lo, &hi), page);
    let lo_source = Backlink { source: page[0].source, ..Backlink::min_for_key(popular) };
    let hi_source = Backlink { source: page[99].source, ..Backlink::max_for_key(popular) };
    assert_eq!(entries_between(&meta, &data, &lo_source, &hi_source), page);

    // `after` starts frame 157 without continuing, so frame 156 is skipped.
    assert!(!meta.frames[157].continues && meta.frames[157].first.target == after);
    assert_eq!(meta.frames_for_key(after), 157..158);
    assert_eq!(meta.frames_for_key(before), 0..1);
    assert_eq!(meta.frames_for_key(record(4_500, 3, 1)), 0..1); // absent, between keys
    assert_eq!(meta.frames_for_key(record(7_000, 3, 1)), 0..0); // past the last entry
    assert_eq!(meta.frames_for_key(record(1, 1, 1)), 0..0); // before the first entry
}

#[test]
fn empty_tables_have_no_frames_and_reject_every_key() {
    let (data, meta_bytes, summary) = build::<Backlink>(&[], &TableOptions::default());
    assert!(data.is_empty());
    assert_eq!(
        summary,
        TableSummary { entries: 0, frames: 0, data_len: 0, meta_len: meta_bytes.len() as u64, stamps: (0, 0) }
    );
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.last, None);
    let key = record(1, 2, 3);
    assert!(!meta.may_contain(KeyHash::of_record(&key)));
    assert_eq!(meta.frames_for_key(key), 0..0);
    assert_eq!(meta.byte_range(0..0), (0, 0));
}

#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "strictly increasing"))]
fn pushing_out_of_order_is_refused() {
    let mut builder = TableBuilder::new(Vec::new(), None, &TableOptions::default()).unwrap();
    let later = Revocation { source: record(2, 0, 0), rev: 0 };
    builder.push(&later).unwrap();
    let result = builder.push(&Revocation { source: record(1, 0, 0), rev: 0 });
    assert_eq!(result.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    assert_eq!(builder.entries(), 1);
}

#[test]
fn options_outside_their_limits_are_refused() {
    let refused = |opts: TableOptions| TableBuilder::<Revocation, _>::new(Vec::new(), None, &opts).is_err();
    assert!(refused(options(0)));
    assert!(refused(options(MAX_FRAME_RAW_BYTES + 1)));
    assert!(refused(TableOptions { zstd_level: 0, ..TableOptions::default() }));
    assert!(refused(TableOptions { zstd_level: 20, ..TableOptions::default() }));
    assert!(refused(TableOptions { filter_fpr: f64::NAN, ..TableOptions::default() }));
    assert!(refused(TableOptions { filter_fpr: 0.9, ..TableOptions::default() }));
    assert!(!refused(options(1)));
    assert_eq!(options(1).entries_per_frame::<Backlink>(), 1);
    assert_eq!(options(MAX_FRAME_RAW_BYTES).entries_per_frame::<Backlink>(), MAX_FRAME_RAW_BYTES / 64);
}

fn small_backlink_table() -> (Vec<Backlink>, Vec<u8>, Vec<u8>) {
    let entries: Vec<Backlink> = (0..40u64)
        .map(|i| Backlink {
            target: record(100 + i / 8, 1, OUTLINED_BIT | 5),
            source: record(1_000 + i, 2, OUTLINED_BIT | (i % 3)),
            location: 1 + i % 2,
            source_rev: i,
        })
        .collect();
    let (data, meta, _) = build(&entries, &options(10 * Backlink::WIDTH));
    (entries, data, meta)
}

#[test]
fn flipping_any_byte_of_the_data_file_is_detected() {
    let (_, data, meta_bytes) = small_backlink_table();
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.frames.len(), 4);
    for at in 0..data.len() {
        for mask in [0x01, 0x80, 0xFF] {
            let mut corrupt = data.clone();
            corrupt[at] ^= mask;
            let mut out = Vec::new();
            let result = decode_frames(&meta, 0..4, &corrupt, &mut out);
            assert!(result.is_err(), "flip {mask:#x} at {at} went unnoticed");
            assert!(out.is_empty(), "entries leaked from a corrupt range");
        }
    }
}

#[test]
fn verifying_checksums_finds_every_flipped_bit_without_decoding() {
    let (_, data, meta_bytes) = small_backlink_table();
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    let verify = |data: &[u8]| verify_data_file(&meta, data.len() as u64, &mut &data[..]);
    assert!(verify(&data).is_ok());
    for at in 0..data.len() {
        let mut corrupt = data.clone();
        corrupt[at] ^= 1 << (at % 8);
        assert!(verify(&corrupt).is_err(), "flip at {at} went unnoticed");
    }
    let short = &data[..data.len() - 1];
    assert!(matches!(verify(short), Err(FormatError::Length { what: "data file", .. })));
}

#[test]
fn a_data_file_that_shrinks_while_checked_is_unreadable_not_corrupt() {
    let (_, data, meta_bytes) = small_backlink_table();
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    let shrunk = &data[..data.len() - 1];
    let outcome = verify_data_file(&meta, data.len() as u64, &mut &shrunk[..]);
    assert!(matches!(outcome, Err(FormatError::Unreadable { what: "data file", .. })), "{outcome:?}");
    assert!(verify_data_file(&meta, data.len() as u64, &mut &data[..]).is_ok());
}

#[test]
fn flipping_any_byte_of_the_meta_file_is_detected() {
    let (_, _, meta_bytes) = small_backlink_table();
    for at in 0..meta_bytes.len() {
        for mask in [0x01, 0x80, 0xFF] {
            let mut corrupt = meta_bytes.clone();
            corrupt[at] ^= mask;
            assert!(TableMeta::<Backlink>::decode(&corrupt).is_err(), "flip {mask:#x} at {at} went unnoticed");
        }
    }
    for len in 0..meta_bytes.len() {
        assert!(TableMeta::<Backlink>::decode(&meta_bytes[..len]).is_err());
    }
    assert!(TableMeta::<Revocation>::decode(&meta_bytes).is_err(), "entry width must be checked");
}

/// A golden table's files, `tests/data/<name>.data` and `.meta`.
fn golden_files(name: &str) -> (Vec<u8>, Vec<u8>) {
    let path = |ext: &str| format!("{}/tests/data/{name}.{ext}", env!("CARGO_MANIFEST_DIR"));
    let read = |ext: &str| std::fs::read(path(ext)).unwrap_or_else(|e| panic!("{}: {e}", path(ext)));
    (read("data"), read("meta"))
}

/// Files written by format version 1 must keep decoding to the same entries.
#[test]
fn golden_table_files_still_decode() {
    let (entries, _, _) = small_backlink_table();
    let (data, meta_bytes) = golden_files("table_golden");
    assert_eq!(&data[..8], &[b'B', b'L', b'K', b'F', 1, 1, 64, 0]);
    assert_eq!(&meta_bytes[..16], &[b'B', b'L', b'K', b'M', 1, 0, 64, 0, 24, 0, 0, 0, 4, 0, 0, 0]);
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.frames.iter().map(|f| f.entries).collect::<Vec<_>>(), [10, 10, 10, 10]);
    assert_eq!(read_frames(&meta, &data, 0..4), entries);
    assert_eq!(entries_between(&meta, &data, &entries[12], &entries[25]), &entries[12..=25]);
}

/// A network-shaped TID: milliseconds, a microsecond rest and a clock id.
fn golden_tid(ms: u64, micros: u64, clock: u64) -> u64 {
    ((ms * 1000 + micros) << 10) | clock
}

/// The `i`th backlink of a golden table's target, from one of `dids` accounts.
fn golden_link(target: RecordId, i: u64, dids: u64) -> Backlink {
    let source = record(golden_tid(1_730_000_100_000 + i * 37, (i % 5) * 201, i % 32), 2, OUTLINED_BIT | (i % dids));
    Backlink { target, source, location: 1 + i % 2, source_rev: i }
}

/// Backlinks whose record keys take every path of `tid::spread`: network-shaped TIDs (whole
/// milliseconds, small clock ids), odd microseconds, a time past `1000 << 43` µs, outlined
/// keys and the repository form.
fn spread_golden_entries() -> Vec<Backlink> {
    let late = (((1000u64 << 43) + 5) << 10) | 3;
    let targets = [
        record(golden_tid(1_730_000_000_000, 0, 7), 1, OUTLINED_BIT | 5),
        RecordId::repo(OUTLINED_BIT | 6),
        record(OUTLINED_BIT | 42, 4, OUTLINED_BIT | 7),
        record(late, 1, OUTLINED_BIT | 8),
    ];
    sorted_set((0..40u64).map(|i| golden_link(targets[(i % 4) as usize], i, 3)).collect())
}

/// Files written in payload encoding 2 must keep decoding to the same entries: the record
/// key spread is part of the format, and a changed `spread` would still give sorted entries.
#[test]
fn golden_encoding_2_files_still_decode() {
    let (data, meta_bytes) = golden_files("table_golden_v2");
    assert_eq!(&data[..8], &[b'B', b'L', b'K', b'F', 1, 2, 64, 0]);
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.frames.len(), 4);
    assert_eq!(read_frames(&meta, &data, 0..4), spread_golden_entries());
}

/// Backlinks in runs of equal targets for the encoding-3 golden table: a repository target
/// with 2, a post with 300 (a run length above 255), posts with 1, 4, 2 and 3; record keys
/// shaped as in `spread_golden_entries`.
fn key_runs_golden_entries() -> Vec<Backlink> {
    let post = |n: u64| record(golden_tid(1_730_000_000_000 + n * 1000, 0, n), 1, OUTLINED_BIT | (5 + n));
    let targets = [(RecordId::repo(OUTLINED_BIT | 6), 2), (post(0), 300), (post(1), 1), (post(2), 4), (post(3), 2)];
    let targets = targets.into_iter().chain([(post(4), 3)]);
    sorted_set(targets.flat_map(|(target, count)| (0..count).map(move |i| golden_link(target, i, 7))).collect())
}

/// Files written in payload encoding 3 must keep decoding to the same entries. The golden
/// table's first frame holds four runs (one of 300 entries), its second three.
#[test]
fn golden_encoding_3_files_still_decode() {
    let (data, meta_bytes) = golden_files("table_golden_v3");
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.frames.iter().map(|f| f.entries).collect::<Vec<_>>(), [305, 7]);
    for frame in &meta.frames {
        assert_eq!(&data[frame.offset as usize..][..8], &[b'B', b'L', b'K', b'F', 1, 3, 64, 0]);
    }
    assert_eq!(read_frames(&meta, &data, 0..2), key_runs_golden_entries());
}

/// Files written in payload encoding 4 with a version-3 meta (column models) must keep
/// decoding to the same entries: the encoding-3 golden table's entries, with models.
#[test]
fn golden_encoding_4_files_still_decode() {
    let data = std::fs::read(format!("{}/tests/data/table_golden_v4.data", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let meta_bytes =
        std::fs::read(format!("{}/tests/data/table_golden_meta_v3.meta", env!("CARGO_MANIFEST_DIR"))).unwrap();
    assert_eq!(&meta_bytes[..6], b"BLKM\x03\x00");
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert!(meta.models.is_some());
    assert_eq!(meta.frames.iter().map(|f| f.entries).collect::<Vec<_>>(), [305, 7]);
    for frame in &meta.frames {
        assert_eq!(&data[frame.offset as usize..][..8], &[b'B', b'L', b'K', b'F', 1, 4, 64, 0]);
    }
    assert_eq!(read_frames(&meta, &data, 0..2), key_runs_golden_entries());
}

/// Meta files written in version 2 (a compressed frame index) must keep decoding to the same
/// index: the encoding-3 golden table's meta, written again in version 2.
#[test]
fn golden_meta_version_2_still_decodes() {
    let (_, v1) = golden_files("table_golden_v3");
    let v2 = std::fs::read(format!("{}/tests/data/table_golden_meta_v2.meta", env!("CARGO_MANIFEST_DIR"))).unwrap();
    assert_eq!(&v2[..6], b"BLKM\x02\x00");
    assert_eq!(TableMeta::<Backlink>::decode(&v2).unwrap(), TableMeta::<Backlink>::decode(&v1).unwrap());
}

/// A version-2 meta whose frame index (checksum fixed up) holds unknown flags, or decompresses
/// to another size than the frame count implies, is rejected.
#[test]
fn hostile_version_2_frame_indexes_are_rejected() {
    let (_, v1) = golden_files("table_golden_v3");
    let meta = TableMeta::<Backlink>::decode(&v1).unwrap();
    let with_index = |index: Vec<u8>| {
        let mut bytes = Vec::new();
        meta.encode_resident(&mut bytes);
        let index_len = u32::from_le_bytes(bytes[36..40].try_into().unwrap()) as usize;
        let index_at = bytes.len() - CHECKSUM_LEN - index_len;
        bytes.truncate(index_at);
        bytes[36..40].copy_from_slice(&(index.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&index);
        let checksum = xxh3_64(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        TableMeta::<Backlink>::decode(&bytes)
    };
    let columns = zstd::bulk::decompress(&encode_frame_index(&meta.frames), 1 << 20).unwrap();
    assert_eq!(with_index(zstd::bulk::compress(&columns, 3).unwrap()).unwrap(), meta);
    let flags_at = meta.frames.len() * Backlink::WIDTH;
    let mut bad_flags = columns.clone();
    bad_flags[flags_at] |= 2;
    let error = with_index(zstd::bulk::compress(&bad_flags, 3).unwrap()).unwrap_err().to_string();
    assert!(error.contains("unknown frame flags"), "{error}");
    let short = with_index(zstd::bulk::compress(&columns[1..], 3).unwrap()).unwrap_err();
    assert!(matches!(short, FormatError::Length { what: "frame index", .. }), "{short}");
    let mut long = columns.clone();
    long.push(0);
    let long = with_index(zstd::bulk::compress(&long, 3).unwrap()).unwrap_err().to_string();
    assert!(long.contains("over the limit"), "{long}");
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    encoder.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut encoder, &columns).unwrap();
    let error = with_index(encoder.finish().unwrap()).unwrap_err().to_string();
    assert!(error.contains("does not state its size"), "{error}");
    // A skippable frame (magic 0x184D2A50, 4 bytes of length, no content) after the index.
    let mut two_frames = zstd::bulk::compress(&columns, 3).unwrap();
    two_frames.extend_from_slice(&[0x50, 0x2A, 0x4D, 0x18, 0, 0, 0, 0]);
    for index in [two_frames, b"not zstd".to_vec()] {
        let error = with_index(index).unwrap_err().to_string();
        assert!(error.contains("not a zstd frame"), "{error}");
    }
}

/// Meta version 2's frame index columns, written out by hand (docs/format.md "Meta file"):
/// two revocation frames whose record keys are outlined (spread leaves them as they are).
#[test]
fn version_2_frame_index_columns_are_byte_exact() {
    let first = Revocation { source: record(OUTLINED_BIT | 5, 1, OUTLINED_BIT | 1), rev: 0x0102 };
    let second = Revocation { source: record(OUTLINED_BIT | 5, 1, OUTLINED_BIT | 1), rev: 0x0304 };
    let frames = vec![
        FrameInfo { first, continues: false, offset: 0, len: 300, entries: 7 },
        FrameInfo { first: second, continues: true, offset: 300, len: 0x0001_0304, entries: 1 },
    ];
    let meta = TableMeta::new(FilterBuilder::new(1, 0.01).finish(), frames, Some(second), 8, 300 + 0x0001_0304, None);
    let mut bytes = Vec::new();
    meta.encode_resident(&mut bytes);
    assert_eq!(&bytes[4..6], &[2, 0]);
    let index_len = u32::from_le_bytes(bytes[36..40].try_into().unwrap()) as usize;
    let index = &bytes[bytes.len() - CHECKSUM_LEN - index_len..bytes.len() - CHECKSUM_LEN];
    let columns = zstd::bulk::decompress(index, 1 << 10).unwrap();
    // First entries: byte j of the first, then byte j of (first XOR second), for j in 0..32.
    let (a, b) = (crate::lsm::entry::encode_to_vec(&first), crate::lsm::entry::encode_to_vec(&second));
    let mut expected: Vec<u8> = (0..32).flat_map(|j| [a[j], a[j] ^ b[j]]).collect();
    expected.extend_from_slice(&[0, 1]); // flags: the second continues
    expected.extend_from_slice(&[0x2c, 0x04, 0x01, 0x03, 0, 0x01, 0, 0]); // lengths 300, 0x00010304
    expected.extend_from_slice(&[7, 1, 0, 0, 0, 0, 0, 0]); // entry counts 7, 1
    assert_eq!(columns, expected);
    assert_eq!(TableMeta::<Revocation>::decode(&bytes).unwrap(), meta);
}

/// A version-2 header may not claim more frames than its index could expand to: a small
/// file never makes a reader allocate for 2^24 frames.
#[test]
fn a_frame_count_its_index_cannot_hold_is_rejected_before_decompressing() {
    let mut v2 = std::fs::read(format!("{}/tests/data/table_golden_meta_v2.meta", env!("CARGO_MANIFEST_DIR"))).unwrap();
    v2[12..16].copy_from_slice(&(1u32 << 24).to_le_bytes());
    let body = v2.len() - CHECKSUM_LEN;
    let checksum = xxh3_64(&v2[..body]);
    v2[body..].copy_from_slice(&checksum.to_le_bytes());
    let error = TableMeta::<Backlink>::decode(&v2).unwrap_err().to_string();
    assert!(error.contains("cannot hold 16777216 frames"), "{error}");
}

/// An index that compresses more than a reader accepts of version 2 (thousands of frames of
/// one entry with consecutive keys): the older encoding writes it as version 1 (and as version 3's
/// fixed records with models); version 4 bounds each chunk's expansion by its frame count, so it
/// needs no fallback. Every one reads back the same.
#[test]
fn a_too_compressible_frame_index_is_written_as_version_1() {
    let entries: Vec<Revocation> = (0..4000).map(|i| Revocation { source: record(i, 0, 0), rev: 0 }).collect();
    let (data, meta_bytes, _) = build(&entries, &options(Revocation::WIDTH));
    assert_eq!(&meta_bytes[4..6], &[4, 0], "tables are written as version 4");
    let meta = TableMeta::<Revocation>::decode(&meta_bytes).unwrap();
    assert_eq!(meta.frames.len(), 4000);
    assert_eq!(read_frames(&meta, &data, 0..4000), entries);
    let mut resident = Vec::new();
    meta.encode_resident(&mut resident);
    assert_eq!(&resident[4..6], &[1, 0], "the older encoding: version 1");
    assert_eq!(TableMeta::<Revocation>::decode(&resident).unwrap(), meta);
    let (_, realistic, _) = build(&realistic_backlinks(20_000, 500, 50_000, 7), &TableOptions::default());
    let mut realistic_resident = Vec::new();
    TableMeta::<Backlink>::decode(&realistic).unwrap().encode_resident(&mut realistic_resident);
    assert_eq!(&realistic_resident[4..6], &[2, 0], "realistic indexes: version 2");

    // With column models: version 3, an index length of 0 and the fixed records.
    let modelled = TableOptions { model_min_entries: 0, ..options(Revocation::WIDTH) };
    let (data, meta_bytes, _) = build(&entries, &modelled);
    let meta = TableMeta::<Revocation>::decode(&meta_bytes).unwrap();
    let mut meta_bytes = Vec::new();
    meta.encode_resident(&mut meta_bytes);
    assert_eq!(&meta_bytes[4..6], &[3, 0], "written as version 3");
    assert_eq!(&meta_bytes[36..40], &[0; 4], "with the index as fixed records");
    let meta = TableMeta::<Revocation>::decode(&meta_bytes).unwrap();
    assert!(meta.models.is_some());
    assert_eq!(read_frames(&meta, &data, 0..4000), entries);
}

/// Run with `--ignored` only when the format changes on purpose (and bump the versions):
/// writes the current encoding's files (payload encoding 4's data, meta version 3: give new
/// names to the next ones). It never overwrites a file: older golden files stay as written.
#[test]
#[ignore]
fn write_golden_table_files() {
    let options = TableOptions { model_min_entries: 0, ..options(305 * Backlink::WIDTH) };
    let (data, meta, _) = build(&key_runs_golden_entries(), &options);
    let write_new = |name: &str, bytes: &[u8]| {
        let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path);
        let mut file = file.unwrap_or_else(|e| panic!("{path}: {e} (golden files are never rewritten)"));
        file.write_all(bytes).unwrap();
    };
    write_new("table_golden_v4.data", &data);
    write_new("table_golden_meta_v3.meta", &meta);
}

fn revocation(key: u64, rev: u64) -> Revocation {
    Revocation { source: record(key, 1, OUTLINED_BIT | key), rev }
}

fn raw_of<E: Entry>(entries: &[E]) -> Vec<u8> {
    let mut raw = Vec::new();
    entries.iter().for_each(|e| encode_entry(e, &mut raw));
    raw
}

/// Encoding 3 stores a run's key once plus a 2-byte length: it is written exactly when
/// `runs * (key width + 2) <= entries * key width`, here 12 runs of 13 entries but not 13.
#[test]
fn frames_are_written_in_key_runs_exactly_when_that_is_shorter() {
    let distinct: Vec<Revocation> = (0..13).map(|key| revocation(key, 7)).collect();
    let mut one_repeat = distinct[..12].to_vec();
    one_repeat.insert(5, revocation(4, 9));
    let mut encoder = FrameEncoder::new(3).unwrap();
    for (entries, encoding) in [(&distinct, 2), (&one_repeat, 3)] {
        let frame = encoder.encode::<Revocation>(&raw_of(entries), None).unwrap().to_vec();
        assert_eq!(frame[5], encoding, "{} entries", entries.len());
        let mut out = Vec::new();
        decode_frame::<Revocation>(&frame, None, &mut out).unwrap();
        assert_eq!(&out, entries);
    }
}

/// A frame put together by hand: `payload` is the raw payload before zstd.
fn handmade_frame<E: Entry>(encoding: u8, entries: usize, payload: &[u8]) -> Vec<u8> {
    let compressed = zstd::bulk::compress(payload, 3).unwrap();
    let mut frame = Vec::new();
    let (raw_len, payload_len) = (payload.len(), compressed.len());
    // `runs` is derived from the raw length when parsing; writing ignores it.
    FrameHeader { encoding, entry_width: E::WIDTH, entries, runs: 0, raw_len, payload_len }.encode(&mut frame);
    frame.extend_from_slice(&compressed);
    let checksum = xxh3_64(&frame);
    frame.extend_from_slice(&checksum.to_le_bytes());
    frame
}

/// The encoding-3 payload of `entries` with its run lengths replaced by `runs`.
fn key_runs_payload(entries: &[Revocation], runs: Option<&[u16]>) -> Vec<u8> {
    let (mut keys, mut lengths, mut rests, mut payload) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    split_key_runs(&raw_of(entries), Revocation::WIDTH, Revocation::KEY_WIDTH, &mut keys, &mut lengths, &mut rests);
    let lengths = runs.map_or(lengths, <[u16]>::to_vec);
    key_runs_transpose(&keys, &lengths, &rests, (Revocation::KEY_WIDTH, 8), &mut payload);
    payload
}

#[test]
fn key_runs_that_disagree_with_the_entry_count_are_rejected() {
    let entries = [revocation(1, 0), revocation(1, 5), revocation(2, 0)];
    let frame = |runs: Option<&[u16]>| handmade_frame::<Revocation>(3, 3, &key_runs_payload(&entries, runs));
    let mut out = Vec::new();
    decode_frame::<Revocation>(&frame(None), None, &mut out).unwrap();
    assert_eq!(out, entries, "the handmade frame is right before it is spoiled");
    for (runs, error) in [
        ([0, 3], "a key run of length 0"),
        ([3, 1], "key runs hold more entries than the frame"),
        ([1, 1], "key runs hold fewer entries than the frame"),
    ] {
        let found = decode_frame::<Revocation>(&frame(Some(&runs)), None, &mut out).unwrap_err();
        assert!(found.to_string().contains(error), "{runs:?}: {found}");
    }
    // Raw lengths no encoding-3 payload of three entries has: a stray byte, and three runs
    // of one (longer than encoding 2's payload, so never written).
    let mut stray = key_runs_payload(&entries, None);
    stray.push(0);
    let all_runs = key_runs_payload(&[revocation(1, 0), revocation(2, 0), revocation(3, 0)], None);
    for payload in [stray, all_runs] {
        let found = decode_frame::<Revocation>(&handmade_frame::<Revocation>(3, 3, &payload), None, &mut out);
        assert!(found.unwrap_err().to_string().contains("no encoding-3 payload"));
    }
    assert_eq!(out.len(), 3, "failed decodes must not append");
}

/// Re-encodes a meta with a fresh checksum, so that only the cross-field checks can object.
fn reencoded(meta: &TableMeta<Backlink>) -> Result<TableMeta<Backlink>, FormatError> {
    let mut bytes = Vec::new();
    meta.encode(&mut bytes);
    TableMeta::decode(&bytes)
}

#[test]
fn inconsistent_meta_with_a_valid_checksum_is_rejected() {
    let (_, data, meta_bytes) = small_backlink_table();
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(reencoded(&meta).unwrap(), meta);
    let altered = |change: &dyn Fn(&mut TableMeta<Backlink>)| {
        let mut copy = meta.clone();
        change(&mut copy);
        copy
    };
    // Version 2 stores no offsets (each frame starts where the previous one ends), so a wrong
    // offset in memory is written right; version 1 stored them, and a wrong one is rejected.
    assert_eq!(reencoded(&altered(&|m| m.frames[1].offset += 1)).unwrap(), meta);
    let (_, mut v1) = golden_files("table_golden");
    let filter_len = u32::from_le_bytes(v1[32..36].try_into().unwrap()) as usize;
    let frame_1_offset = META_HEADER_LEN + filter_len + 64 + (64 + FRAME_INFO_FIXED_LEN) + 64 + 1;
    v1[frame_1_offset] ^= 1;
    let body = v1.len() - CHECKSUM_LEN;
    let checksum = xxh3_64(&v1[..body]);
    v1[body..].copy_from_slice(&checksum.to_le_bytes());
    let error = TableMeta::<Backlink>::decode(&v1).unwrap_err().to_string();
    assert!(error.contains("instead of"), "{error}");
    assert!(reencoded(&altered(&|m| m.frames[0].continues = true)).is_err());
    assert!(reencoded(&altered(&|m| m.frames.swap(1, 2))).is_err());
    assert!(reencoded(&altered(&|m| m.data_len += 1)).is_err());
    assert!(reencoded(&altered(&|m| m.entries += 1)).is_err());
    assert!(reencoded(&altered(&|m| m.frames[3].entries = 0)).is_err());
    assert!(reencoded(&altered(&|m| m.last = Some(m.frames[3].first))).is_err());

    // A meta that passes its own checks but disagrees with the data is caught on decode.
    let lying = altered(&|m| m.frames[2].continues = !m.frames[2].continues);
    let lying = reencoded(&lying).unwrap();
    let mut out = Vec::new();
    assert!(decode_frames(&lying, 0..4, &data, &mut out).is_err());
    let (start, end) = lying.byte_range(1..2);
    assert!(decode_frames(&lying, 1..2, &data[start as usize..end as usize], &mut out).is_err());
    assert!(out.is_empty());
    assert!(decode_frames(&meta, 0..4, &data[1..], &mut out).is_err());
    assert!(decode_frames(&meta, 3..5, &data, &mut out).is_err());
}

#[test]
fn frames_with_a_valid_checksum_but_bad_contents_are_rejected() {
    let entry = |i: u64| Revocation { source: record(i, 0, 0), rev: 0 };
    let mut encoder = FrameEncoder::new(3).unwrap();
    let mut out = Vec::new();
    let good = encoder.encode::<Revocation>(&raw_of(&[entry(1), entry(2)]), None).unwrap().to_vec();
    decode_frame::<Revocation>(&good, None, &mut out).unwrap();
    assert_eq!(out, [entry(1), entry(2)]);
    for entries in [[entry(2), entry(2)], [entry(3), entry(2)]] {
        let frame = encoder.encode::<Revocation>(&raw_of(&entries), None).unwrap().to_vec();
        let error = decode_frame::<Revocation>(&frame, None, &mut out).unwrap_err();
        assert!(error.to_string().contains("not strictly increasing"), "{error}");
    }
    assert_eq!(out.len(), 2, "failed decodes must not append");
    let mut wrong_width: Vec<Backlink> = Vec::new();
    assert!(matches!(decode_frame(&good, None, &mut wrong_width), Err(FormatError::OutOfRange { .. })));
}

/// SplitMix64, for realistic data that never changes between runs.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        crate::base::rng::splitmix64(&mut self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A TID: microseconds since the epoch above a 10-bit clock id.
fn tid(micros: u64, clock: u64) -> u64 {
    (micros << 10) | (clock & 0x3FF)
}

/// Firehose-like backlinks: `targets` posts and accounts with Zipf-ish popularity, liked,
/// reposted and replied to by `users` accounts over about an hour, one stamp per link.
fn realistic_backlinks(count: usize, targets: usize, users: u64, seed: u64) -> Vec<Backlink> {
    let mut rng = SplitMix(seed);
    let start = 1_730_000_000_000_000u64;
    let user = |rng: &mut SplitMix| OUTLINED_BIT | (1 + rng.below(users));
    let target_ids: Vec<RecordId> = (0..targets)
        .map(|i| match i % 5 {
            0 => RecordId::repo(user(&mut rng)),
            _ => record(tid(start - rng.below(86_400_000_000), rng.below(1024)), 3, user(&mut rng)),
        })
        .collect();
    let weights: Vec<f64> = (1..=targets).map(|rank| 1.0 / (rank as f64).powf(1.1)).collect();
    let cumulative: Vec<f64> = weights
        .iter()
        .scan(0.0, |sum, w| {
            *sum += w;
            Some(*sum)
        })
        .collect();
    let total = *cumulative.last().unwrap();
    let links = (0..count as u64).map(|i| {
        let pick = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let target = target_ids[cumulative.partition_point(|&c| c < pick).min(targets - 1)];
        let micros = start + i * 36_000 + rng.below(36_000);
        let (collection, location) = match (target.is_repo(), rng.below(10)) {
            (true, _) => (4, 3),      // follow: $.subject
            (false, 0..=5) => (1, 1), // like: $.subject
            (false, 6..=7) => (2, 1), // repost: $.subject
            (false, _) => (3, 2),     // reply: $.reply.parent
        };
        let source = record(tid(micros, rng.below(1024)), collection, user(&mut rng));
        Backlink { target, source, location, source_rev: 5_000_000 + i }
    });
    sorted_set(links.collect())
}

#[test]
fn realistic_backlinks_compress_below_20_bytes_each() {
    let entries = realistic_backlinks(100_000, 3_000, 200_000, 42);
    assert!(entries.len() > 99_900);
    let (data, meta_bytes, summary) = build(&entries, &TableOptions::default());
    let per_entry = data.len() as f64 / entries.len() as f64;
    let meta_per_entry = meta_bytes.len() as f64 / entries.len() as f64;
    println!(
        "{} backlinks in {} frames: {per_entry:.2} data bytes/entry, {meta_per_entry:.2} meta bytes/entry",
        summary.entries, summary.frames
    );
    assert!(per_entry < 20.0, "{per_entry:.2} bytes per entry");
    assert_eq!(&data[..6], b"BLKF\x01\x04", "a table this large is written in payload encoding 4");
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(read_frames(&meta, &data, 0..meta.frames.len()), entries);

    let without_models = TableOptions { model_min_entries: u64::MAX, ..TableOptions::default() };
    let (zstd_data, zstd_meta, _) = build(&entries, &without_models);
    assert_eq!(&zstd_data[..6], b"BLKF\x01\x03", "frames that repeat targets are written in payload encoding 3");
    let zstd_meta = TableMeta::<Backlink>::decode(&zstd_meta).unwrap();
    assert_eq!(read_frames(&zstd_meta, &zstd_data, 0..zstd_meta.frames.len()), entries);
    let modelled = (data.len() + meta_bytes.len()) as f64 / entries.len() as f64;
    let zstd_only = (zstd_data.len() + zstd_meta_len(&zstd_meta)) as f64 / entries.len() as f64;
    println!("with models {modelled:.2} bytes/entry (data and meta), zstd only {zstd_only:.2}");
    assert!(modelled < zstd_only, "column models cost more than they save: {modelled:.2} vs {zstd_only:.2}");
}

/// A spill in memory that remembers the most bytes it ever held.
struct MeasuredSpill {
    bytes: io::Cursor<Vec<u8>>,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Write for MeasuredSpill {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.bytes.write(buf)?;
        self.most.fetch_max(self.bytes.get_ref().len(), std::sync::atomic::Ordering::Relaxed);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for MeasuredSpill {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.bytes.read(buf)
    }
}

impl Seek for MeasuredSpill {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.bytes.seek(to)
    }
}

/// A table written under models learnt from its first ten frames only (as a merge's later
/// shards are) codes every frame under them, and reads back whole.
#[test]
fn a_table_codes_every_frame_under_models_learnt_from_its_first_frames() {
    let entries = realistic_backlinks(20_000, 500, 20_000, 5);
    let options = TableOptions { model_min_entries: 0, ..TableOptions::default() };
    let first_frames = 10 * options.entries_per_frame::<Backlink>();
    let (data, meta_bytes, _) = build_sampled(&entries, &entries[..first_frames], &options);
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert!(meta.models.is_some() && meta.frames.len() > 70);
    for frame in &meta.frames {
        assert_eq!(data[frame.offset as usize + 5], ENCODING_SPREAD_KEY_RUNS_MODELLED);
    }
    assert_eq!(read_frames(&meta, &data, 0..meta.frames.len()), entries);
}

/// A table of more distinct keys than a builder holds hashes for writes the older ones to its key
/// spill (16 bytes each) and reads them all back into the filter: every key is admitted.
#[test]
fn a_builder_spills_the_key_hashes_it_cannot_hold_and_the_filter_has_them_all() {
    let entries = realistic_backlinks(600_000, 5_000_000, 200_000, 3);
    let keys: Vec<RecordId> =
        entries.iter().map(|e| e.key()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert!(keys.len() > 10 * KEY_HASHES_IN_MEMORY + 1000, "{} distinct keys", keys.len());
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let key_spill = MeasuredSpill { bytes: io::Cursor::new(Vec::new()), most: most.clone() };
    let spills = Spills { keys: Box::new(key_spill), ..Spills::in_memory() };
    let options = TableOptions::default();
    let models = learn_models(entries.iter().copied(), &options);
    let mut builder = TableBuilder::with_spills(Vec::new(), spills, models, &options).unwrap();
    entries.iter().for_each(|entry| builder.push(entry).unwrap());
    let (_, meta_bytes, _) = builder.finish().unwrap();
    let spilled = most.load(std::sync::atomic::Ordering::Relaxed);
    let batches = (keys.len() - 1) / KEY_HASHES_IN_MEMORY;
    assert_eq!(spilled, batches * KEY_HASHES_IN_MEMORY * 16, "all but the last batch spilled");
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert!(keys.iter().all(|key| meta.may_contain(KeyHash::of_record(key))), "a spilled key is missing");
    assert_eq!(meta_bytes, build(&entries, &options).1, "the same meta as a builder in memory");
}

/// A builder writes each finished chunk of its frame index to its index spill as it goes (it
/// holds one open chunk, not a record per frame), and its meta is the one the whole encoder
/// writes for the same table.
#[test]
fn a_builder_spills_its_frame_index_chunk_by_chunk_and_writes_the_whole_encoders_meta() {
    let entries = realistic_backlinks(200_000, 3_000, 200_000, 9);
    let options = TableOptions::default();
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let index_spill = MeasuredSpill { bytes: io::Cursor::new(Vec::new()), most: most.clone() };
    let spills = Spills { index: Box::new(index_spill), ..Spills::in_memory() };
    let models = learn_models(entries.iter().copied(), &options);
    let mut builder = TableBuilder::with_spills(Vec::new(), spills, models, &options).unwrap();
    entries.iter().for_each(|entry| builder.push(entry).unwrap());
    let spilled_before_finish = most.load(std::sync::atomic::Ordering::Relaxed);
    let (_, meta_bytes, summary) = builder.finish().unwrap();
    let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert_eq!(summary.frames as usize, meta.frames.len());
    let full_chunks = meta.frames.len() / CHUNK_FRAMES;
    assert!(full_chunks >= 10, "{} frames", meta.frames.len());
    let chunk_bytes: usize = meta.frames[..full_chunks * CHUNK_FRAMES]
        .chunks(CHUNK_FRAMES)
        .map(|chunk| encode_frame_index(chunk).len() + CHECKSUM_LEN)
        .sum();
    assert_eq!(spilled_before_finish, chunk_bytes, "every full chunk, and only those, spilled while pushing");
    let mut whole = Vec::new();
    meta.encode(&mut whole);
    assert_eq!(meta_bytes, whole, "the builder's meta is the whole encoder's");
}

/// A table of fewer than `model_min_entries` entries (or none) learns no models.
#[test]
fn too_few_entries_learn_no_models() {
    let entries = realistic_backlinks(30_000, 800, 30_000, 11);
    let options = TableOptions { model_min_entries: 1000, ..TableOptions::default() };
    assert!(learn_models(entries[..1000].iter().copied(), &options).is_some());
    assert!(learn_models(entries[..999].iter().copied(), &options).is_none());
    assert!(learn_models(std::iter::empty::<Backlink>(), &TableOptions { model_min_entries: 0, ..options }).is_none());
}

fn zstd_meta_len(meta: &TableMeta<Backlink>) -> usize {
    let mut bytes = Vec::new();
    meta.encode(&mut bytes);
    bytes.len()
}

/// A paged meta (version 4, read a page at a time through a cache) answers every lookup exactly
/// as the whole decoded meta does, with a cache that holds everything and with one that holds
/// nothing (every lookup reads its pages again).
#[test]
fn paged_metas_answer_as_resident_ones_whatever_the_cache() {
    use super::paged::MetaCache;
    use super::paged::{PageSource, PagedMeta};
    use crate::lsm::filter::KeyHash;
    let entries = realistic_backlinks(60_000, 700, 40_000, 11);
    let (_, meta_bytes, _) = build(&entries, &modelled_options(4 << 10));
    let whole = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert!(whole.frames.len() > 3 * super::CHUNK_FRAMES, "several chunks: {}", whole.frames.len());
    assert!(whole.models.is_some());
    for budget in [64 << 20, 0] {
        let cache = MetaCache::<Backlink>::new(budget);
        let paged =
            PagedMeta::<Backlink>::open(PageSource::Memory(meta_bytes.clone().into()), cache.clone(), 1).unwrap();
        assert_eq!(
            (paged.entries(), paged.data_len(), paged.frame_count()),
            (whole.entries, whole.data_len, whole.frames.len())
        );
        for with in [PageUse::Scan, PageUse::Lookup] {
            assert_eq!(paged.frame_infos(0..whole.frames.len(), with).unwrap(), whole.frames);
        }
        let mut keys: Vec<RecordId> = entries.iter().step_by(97).map(|e| e.key()).collect();
        keys.extend((0..500).map(|i| record(i * 7919 + 3, 9, i)));
        let hashes: Vec<KeyHash> = keys.iter().map(KeyHash::of_record).collect();
        let expected: Vec<bool> = hashes.iter().map(|h| whole.may_contain(*h)).collect();
        assert!(expected.iter().any(|admitted| !admitted), "some keys are refused");
        let cached_before = cache.bytes();
        assert_eq!(paged.may_contain_many(&hashes, PageUse::Scan).unwrap(), expected);
        assert_eq!(cache.bytes(), cached_before, "a scan's filter pages are not cached");
        assert_eq!(paged.may_contain_many(&hashes, PageUse::Lookup).unwrap(), expected);
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        for order in [&keys, &sorted] {
            let bounds = order.iter().map(|key| (Backlink::min_for_key(*key), Backlink::max_for_key(*key)));
            let expected: Vec<_> = order.iter().map(|key| whole.frames_for_key(*key)).collect();
            for with in [PageUse::Scan, PageUse::Lookup] {
                assert_eq!(paged.frames_overlapping_each(bounds.clone(), with).unwrap(), expected);
            }
        }
        for key in keys {
            let h = KeyHash::of_record(&key);
            assert_eq!(paged.may_contain(h).unwrap(), whole.may_contain(h), "{key:?}");
            let range = paged.frames_for_key(key).unwrap();
            assert_eq!(range, whole.frames_for_key(key), "{key:?}");
            for with in [PageUse::Scan, PageUse::Lookup] {
                assert_eq!(paged.byte_range(range.clone(), with).unwrap(), whole.byte_range(range.clone()), "{key:?}");
                let infos = (range.clone(), whole.frames[range.clone()].to_vec());
                assert_eq!(paged.frame_infos_for_key(key, with).unwrap(), infos, "{key:?}");
            }
        }
        for r in [
            0..0,
            0..1,
            5..70,
            63..65,
            whole.frames.len() - 1..whole.frames.len(),
            whole.frames.len()..whole.frames.len(),
        ] {
            assert_eq!(paged.byte_range(r.clone(), PageUse::Lookup).unwrap(), whole.byte_range(r.clone()), "{r:?}");
        }
        for with in [PageUse::Scan, PageUse::Lookup, PageUse::Lookup] {
            assert_eq!(paged.models(with).unwrap().as_deref(), whole.models.as_ref(), "models, budget {budget}");
        }
        assert!(cache.bytes() <= budget);
    }
}

/// The decoded column models live in the meta cache once a lookup needed them (opening a table
/// and a scan cache nothing), or with the scan that holds them: they are read again from the meta
/// file when neither has them, and a models section changed on disk since the table opened is
/// refused by its checksum, never decoded into wrong entries.
#[test]
fn paged_meta_models_are_read_again_and_checked() {
    use super::paged::MetaCache;
    use super::paged::{PageSource, PagedMeta};
    let entries = realistic_backlinks(20_000, 300, 10_000, 5);
    let (_, meta_bytes, _) = build(&entries, &modelled_options(4 << 10));
    let whole = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    let models_len = u32::from_le_bytes(meta_bytes[48..52].try_into().unwrap()) as usize;
    let models_at = 68 + u32::from_le_bytes(meta_bytes[44..48].try_into().unwrap()) as usize;
    assert!(models_len > 0 && whole.models.is_some());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.meta");
    std::fs::write(&path, &meta_bytes).unwrap();
    let cache = MetaCache::<Backlink>::new(64 << 20);
    let open = |cache: Arc<MetaCache<Backlink>>, serial| {
        PagedMeta::<Backlink>::open(PageSource::File(std::fs::File::open(&path).unwrap()), cache, serial).unwrap()
    };
    let (cached, held, uncached) = (open(cache.clone(), 1), open(cache.clone(), 2), open(cache.clone(), 3));
    assert_eq!(cache.bytes(), 0, "opening checks the models and caches nothing");
    cached.models(PageUse::Lookup).unwrap();
    assert!(cache.bytes() >= whole.models.as_ref().unwrap().memory_bytes(), "a lookup caches the models");
    let holding = held.models(PageUse::Scan).unwrap().unwrap();
    assert_eq!(cache.bytes(), whole.models.as_ref().unwrap().memory_bytes(), "a scan caches nothing");
    let mut changed = meta_bytes.clone();
    changed[models_at + models_len / 2] ^= 0x10;
    std::fs::write(&path, &changed).unwrap();
    assert_eq!(cached.models(PageUse::Scan).unwrap().as_deref(), whole.models.as_ref(), "a cache hit reads nothing");
    let again = held.models(PageUse::Scan).unwrap().unwrap();
    assert!(Arc::ptr_eq(&again, &holding), "models a scan holds are found without a read");
    drop((again, holding));
    for (meta, with) in [(&held, PageUse::Scan), (&uncached, PageUse::Lookup)] {
        let refused = meta.models(with).unwrap_err();
        assert!(matches!(refused, FormatError::Checksum { what: "column models", .. }), "{refused}");
    }
}

/// A scan (a merge, a writer's lookup) reads the frame index, the filter and the models without
/// keeping them in the meta cache, and its looks there count as neither hits nor misses; a lookup
/// keeps what it reads, and counts: merges and flushes neither evict the pages queries use, nor
/// hold memory for their own, nor blur the cache's hit rate.
#[test]
fn scans_keep_nothing_in_the_meta_cache() {
    use super::paged::MetaCache;
    use super::paged::{PageSource, PagedMeta};
    let entries = realistic_backlinks(20_000, 300, 10_000, 5);
    let (_, meta_bytes, _) = build(&entries, &modelled_options(4 << 10));
    let frames = TableMeta::<Backlink>::decode(&meta_bytes).unwrap().frames.len();
    let cache = MetaCache::<Backlink>::new(64 << 20);
    let paged = PagedMeta::<Backlink>::open(PageSource::Memory(meta_bytes.into()), cache.clone(), 1).unwrap();
    paged.frame_infos(0..frames, PageUse::Scan).unwrap();
    paged.byte_range(0..frames, PageUse::Scan).unwrap();
    paged.models(PageUse::Scan).unwrap();
    let keys = entries.iter().step_by(50).map(|e| (Backlink::min_for_key(e.key()), Backlink::max_for_key(e.key())));
    paged.frames_overlapping_each(keys.clone(), PageUse::Scan).unwrap();
    let hashes: Vec<_> = entries.iter().step_by(50).map(|e| crate::lsm::filter::KeyHash::of_record(&e.key())).collect();
    paged.may_contain_many(&hashes, PageUse::Scan).unwrap();
    assert_eq!(cache.bytes(), 0, "a scan cached index chunks or models");
    assert_eq!(cache.hits_and_misses(), (0, 0), "a scan's looks in the cache were counted");
    paged.frame_infos(0..frames, PageUse::Lookup).unwrap();
    paged.models(PageUse::Lookup).unwrap();
    assert!(cache.bytes() > 0, "a lookup caches the chunks it read");
    let counted = cache.hits_and_misses();
    assert!(counted.1 > 0, "a lookup's misses are counted");
    paged.frames_overlapping_each(keys, PageUse::Scan).unwrap();
    paged.models(PageUse::Scan).unwrap();
    assert_eq!(cache.hits_and_misses(), counted, "a scan that found what lookups cached was counted");
}

/// A flipped bit in any page or chunk of a paged meta is caught by that page's checksum when
/// it is read, the resident part's when the table opens, and the whole-file checksum by a whole
/// check (uploads, `verify`).
#[test]
fn paged_meta_pages_carry_their_own_checksums() {
    use super::paged::MetaCache;
    use super::paged::{PageSource, PagedMeta};
    let entries = realistic_backlinks(20_000, 300, 10_000, 5);
    let (_, meta_bytes, _) = build(&entries, &options(4 << 10));
    let whole = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    let u32_at = |at: usize| u32::from_le_bytes(meta_bytes[at..at + 4].try_into().unwrap()) as usize;
    let filter_len = u64::from_le_bytes(meta_bytes[52..60].try_into().unwrap()) as usize;
    let filter_start = 68 + u32_at(44) + u32_at(48) + CHECKSUM_LEN;
    let filter = filter_start..filter_start + filter_len;
    let open = |bytes: Vec<u8>| PagedMeta::<Backlink>::open(PageSource::Memory(bytes.into()), MetaCache::new(0), 2);
    for at in (0..meta_bytes.len()).step_by(13) {
        let mut corrupt = meta_bytes.clone();
        corrupt[at] ^= 0x20;
        assert!(TableMeta::<Backlink>::decode(&corrupt).is_err(), "flip at {at} passed the whole check");
        if at >= meta_bytes.len() - CHECKSUM_LEN {
            continue; // only the whole-file checksum covers itself
        }
        let paged = open(corrupt.clone());
        if filter.contains(&at) {
            // The page holding the flipped byte fails whenever a key probes it.
            let paged = paged.unwrap();
            let page = (at - filter.start) / (super::PAGE_BLOCKS * crate::lsm::filter::BLOCK_BYTES + CHECKSUM_LEN);
            let probe = (0..100_000u64)
                .map(|i| KeyHash::of_record(&record(i, 1, 1)))
                .find(|h| h.block_index(whole.filter.shape().blocks) / super::PAGE_BLOCKS == page);
            assert!(probe.is_some_and(|h| paged.may_contain(h).is_err()), "flip at {at} in filter page {page}");
        } else {
            let read = paged.and_then(|paged| paged.frame_infos(0..whole.frames.len(), PageUse::Scan));
            assert!(read.is_err(), "flip at {at} outside the filter was read as good");
        }
    }
}

#[test]
fn meta_pages_count_their_bytes() {
    use super::paged::{MetaCache, MetaPage};
    use crate::lsm::cache::CacheValue;
    let cache = MetaCache::<Revocation>::new(100);
    cache.insert(1, 0, MetaPage::Filter(vec![0u8; 64].into()));
    assert_eq!(cache.bytes(), 64);
    cache.insert(1, 1, MetaPage::Filter(vec![0u8; 64].into()));
    assert_eq!(cache.bytes(), 64, "the first page made room");
    assert!(matches!(cache.get(1, 1), Some(MetaPage::Filter(page)) if page.len() == 64));
    assert_eq!(cache.with(1, 1, |page| page.bytes()), Some(64));
}

/// Rewrites the u16 at `at` of a paged meta and seals its resident part again, so that only the
/// field is wrong.
fn with_header_field(meta: &[u8], at: usize, value: u16) -> Vec<u8> {
    let mut meta = meta.to_vec();
    meta[at..at + 2].copy_from_slice(&value.to_le_bytes());
    let u32_at = |at: usize| u32::from_le_bytes(meta[at..at + 4].try_into().unwrap()) as usize;
    let sealed = 68 + u32_at(44) + u32_at(48);
    let checksum = xxh3_64(&meta[..sealed]).to_le_bytes();
    meta[sealed..sealed + CHECKSUM_LEN].copy_from_slice(&checksum);
    meta
}

/// A hot-link table's filter also holds its accounts (offset 42: the shard width, 8); other
/// tables' say 0, and any other width is refused.
#[test]
fn a_paged_meta_says_whether_its_filter_holds_shards() {
    use super::paged::{MetaCache, PageSource, PagedMeta};
    use crate::model::ids::HotLink;
    let links = realistic_backlinks(2_000, 30, 500, 3);
    let hot: Vec<HotLink> = {
        let mut hot: Vec<HotLink> = links.iter().map(|link| HotLink::of(*link)).collect();
        hot.sort_unstable();
        hot
    };
    let (_, hot_meta, _) = build(&hot, &options(4 << 10));
    let (_, link_meta, _) = build(&links, &options(4 << 10));
    let width = |meta: &[u8]| u16::from_le_bytes([meta[42], meta[43]]);
    assert_eq!((width(&hot_meta), width(&link_meta)), (8, 0));
    let open_hot = |bytes: Vec<u8>| PagedMeta::<HotLink>::open(PageSource::Memory(bytes.into()), MetaCache::new(0), 1);
    assert!(open_hot(hot_meta.clone()).unwrap().filter_holds_shards());
    assert!(!open_hot(with_header_field(&hot_meta, 42, 0)).unwrap().filter_holds_shards());
    let refused = open_hot(with_header_field(&hot_meta, 42, 4)).unwrap_err();
    assert!(refused.to_string().contains("shard filter width"), "{refused}");
    let open_links =
        |bytes: Vec<u8>| PagedMeta::<Backlink>::open(PageSource::Memory(bytes.into()), MetaCache::new(0), 2);
    assert!(open_links(with_header_field(&link_meta, 42, 24)).is_err(), "links hold no shard prefixes");
}

/// A paged meta says what its filter holds (offset 10): 0 for keys, as every table wrote before
/// filter widths; an account tally table's, its 48-byte identities; any other width is refused,
/// even under a good checksum.
#[test]
fn a_paged_meta_says_what_its_filter_holds() {
    use super::paged::{MetaCache, PageSource, PagedMeta};
    use crate::model::ids::AccountTally;
    let target = RecordId { rkey: 7, collection: 1, did: 9 };
    let tallies: Vec<AccountTally> =
        (1..=500u64).flat_map(|a| [1, 2].map(|location| AccountTally::of(a, target, (3, location), 1, 1))).collect();
    let (_, tally_meta, _) = build(&tallies, &options(4 << 10));
    let (_, link_meta, _) = build(&realistic_backlinks(2_000, 30, 500, 3), &options(4 << 10));
    let width = |meta: &[u8]| u16::from_le_bytes([meta[10], meta[11]]);
    assert_eq!((width(&tally_meta), width(&link_meta)), (48, 0));
    let open_tallies =
        |bytes: Vec<u8>| PagedMeta::<AccountTally>::open(PageSource::Memory(bytes.into()), MetaCache::new(0), 1);
    let links = PagedMeta::<Backlink>::open(PageSource::Memory(link_meta.into()), MetaCache::new(0), 2).unwrap();
    assert!(links.filter_holds_keys());
    assert!(!open_tallies(tally_meta.clone()).unwrap().filter_holds_keys());
    for (declared, holds_keys) in [(0u16, Some(true)), (40, None), (24, None), (64, None)] {
        let opened = open_tallies(with_header_field(&tally_meta, 10, declared));
        assert_eq!(opened.as_ref().ok().map(|m| m.filter_holds_keys()), holds_keys, "width {declared}");
        if holds_keys.is_none() {
            assert!(opened.unwrap_err().to_string().contains("filter width"), "width {declared}");
        }
    }
}

/// A reader that counts the bytes read through it and the largest single read.
struct CountingReader<'a> {
    inner: &'a [u8],
    read: usize,
}

impl Read for CountingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n;
        Ok(n)
    }
}

#[test]
fn an_in_order_check_reads_a_meta_once_and_hands_it_over_a_page_and_a_chunk_at_a_time() {
    let entries = realistic_backlinks(60_000, 500, 20_000, 9);
    let (_, meta_bytes, _) = build(&entries, &options(1 << 10));
    let whole = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
    assert!(whole.frames.len() > 3 * CHUNK_FRAMES, "{} frames: too few chunks to test", whole.frames.len());
    let (mut pages, mut frames, mut largest_chunk) = (Vec::new(), Vec::new(), 0);
    let mut reader = CountingReader { inner: &meta_bytes, read: 0 };
    let checked = check_in_order::<Backlink, FormatError>(
        &mut reader,
        meta_bytes.len() as u64,
        |page| pages.extend_from_slice(page),
        |chunk| {
            largest_chunk = largest_chunk.max(chunk.len());
            frames.extend_from_slice(chunk);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(reader.read, meta_bytes.len(), "every byte read once");
    assert_eq!(largest_chunk, CHUNK_FRAMES);
    assert_eq!(frames, whole.frames);
    let mut filter = Vec::new();
    whole.filter.encode(&mut filter);
    assert_eq!(pages, filter[crate::lsm::filter::HEADER_LEN..]);
    assert_eq!((checked.last, checked.entries, checked.data_len), (whole.last, whole.entries, whole.data_len));
    // A chunk's error ends the check there, as the caller's own.
    let mut chunks_seen = 0;
    let stopped = check_in_order::<Backlink, FormatError>(
        &mut &meta_bytes[..],
        meta_bytes.len() as u64,
        |_| {},
        |_| {
            chunks_seen += 1;
            Err(crate::lsm::bytes::invalid("test", "stop"))
        },
    );
    assert!(matches!(stopped, Err(FormatError::Invalid { what: "test", .. })) && chunks_seen == 1);
    // A file shorter or longer than its header says is refused before anything else is read.
    let short =
        check_in_order::<Backlink, FormatError>(&mut &meta_bytes[..], meta_bytes.len() as u64 - 1, |_| {}, |_| Ok(()));
    assert!(matches!(short, Err(FormatError::Length { .. })), "{short:?}");
}
