//! Tests of the fingerprint table against a map fed the same rows: splits, reopening, crashes
//! between the pages and the directory, damaged pages and directories.

use super::*;
use crate::base::rng::splitmix64;
use std::collections::HashMap;

fn open(dir: &tempfile::TempDir) -> Fingerprints {
    Fingerprints::open(&dir.path().join("outlines.db")).unwrap()
}

fn random_rows(state: &mut u64, count: usize) -> Vec<Row> {
    let fingerprint = |state: &mut u64| (u128::from(splitmix64(state)) << 64) | u128::from(splitmix64(state));
    (0..count).map(|_| (fingerprint(state), splitmix64(state))).collect()
}

fn assert_holds_exactly(table: &Fingerprints, model: &HashMap<u128, u64>, state: &mut u64) {
    for (fingerprint, id) in model {
        assert_eq!(table.find(*fingerprint).unwrap(), Some(*id), "{fingerprint:032x}");
    }
    for (absent, _) in random_rows(state, 200) {
        assert_eq!(table.find(absent).unwrap(), None);
    }
}

fn assert_absent(table: &Fingerprints, rows: &[Row]) {
    assert!(rows.iter().all(|(fingerprint, _)| table.find(*fingerprint).unwrap().is_none()));
}

fn depth(table: &Fingerprints) -> u8 {
    table.committed.read().unwrap().depth
}

#[test]
fn the_table_finds_exactly_what_was_added_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let (table, mut model, mut state) = (open(&dir), HashMap::new(), 7);
    for (batch, size) in [0, 1, 169, 2, 5000, 30_000, 3, 1200].into_iter().enumerate() {
        let rows = random_rows(&mut state, size);
        model.extend(rows.iter().copied());
        table.add(rows, 10 * (batch as i64 + 1)).unwrap();
        assert_holds_exactly(&table, &model, &mut state);
        assert_eq!(table.covered_seq(), 10 * (batch as i64 + 1));
    }
    assert!(depth(&table) >= 8, "36,375 rows split the pages: depth {}", depth(&table));
    drop(table);
    let table = open(&dir);
    assert_eq!(table.covered_seq(), 80);
    assert_holds_exactly(&table, &model, &mut state);
    // The replaced pages' slots are reused: the file stays near the pages in use.
    let pages = std::fs::metadata(dir.path().join("outlines.fp")).unwrap().len() / PAGE_BYTES as u64;
    let named: std::collections::HashSet<u32> = table.committed.read().unwrap().slots.iter().copied().collect();
    assert!(pages <= 2 * named.len() as u64 + 1, "{pages} pages for {} in use", named.len());
}

#[test]
fn a_large_add_commits_in_parts_so_few_pages_are_copies_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (table, mut model, mut state) = (open(&dir), HashMap::new(), 11);
    for (seq, size) in [(1, 120_000), (2, 120_000)] {
        let rows = random_rows(&mut state, size);
        model.extend(rows.iter().copied());
        table.add(rows, seq).unwrap();
    }
    assert_eq!(table.covered_seq(), 2);
    assert_holds_exactly(&table, &model, &mut state);
    // One add of 120,000 rows into some 1,000 pages changes every page; in one commit the file
    // would hold the old and the new pages, some 3,000.
    let pages = std::fs::metadata(dir.path().join("outlines.fp")).unwrap().len() / PAGE_BYTES as u64;
    let named = table.committed.read().unwrap().slots.iter().copied().collect::<std::collections::HashSet<u32>>().len();
    assert!(pages <= (named + 2 * COMMIT_ROWS) as u64, "{pages} pages for {named} in use");
}

#[test]
fn a_failed_commit_hands_out_no_slot_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (table, mut model, mut state) = (open(&dir), HashMap::new(), 13);
    let first = random_rows(&mut state, 2000);
    model.extend(first.iter().copied());
    table.add(first, 1).unwrap();
    // A directory where the new directory file is written first: the commit fails after its
    // pages, some of them past the end of the file, were written.
    let blocker = dir.path().join("outlines.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let lost = random_rows(&mut state, COMMIT_ROWS);
    assert!(matches!(table.add(lost.clone(), 2), Err(FingerprintError::Io { .. })));
    std::fs::remove_dir(&blocker).unwrap();
    let second = random_rows(&mut state, 5000);
    model.extend(second.iter().copied());
    table.add(second, 3).unwrap();
    assert_holds_exactly(&table, &model, &mut state);
    assert_absent(&table, &lost);
    drop(table);
    assert_holds_exactly(&open(&dir), &model, &mut state);
}

#[test]
fn adding_again_changes_nothing_and_a_second_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (table, mut state) = (open(&dir), 3);
    let rows = random_rows(&mut state, 1000);
    table.add(rows.clone(), 5).unwrap();
    table.add(rows[..10].to_vec(), 6).unwrap();
    assert_eq!(table.covered_seq(), 6);
    let (fingerprint, id) = rows[400];
    let error = table.add(vec![(fingerprint, id ^ 1)], 7).unwrap_err();
    assert!(matches!(error, FingerprintError::Conflict(f) if f == fingerprint), "{error}");
    let twice = vec![(1, 1), (1, 2)];
    assert!(matches!(table.add(twice, 7), Err(FingerprintError::Conflict(1))));
    assert_eq!(table.covered_seq(), 6, "a refused add commits nothing");
    assert_holds_exactly(&table, &rows.into_iter().collect(), &mut state);
}

#[test]
fn a_crash_before_the_new_directory_leaves_the_previous_table_whole() {
    let dir = tempfile::tempdir().unwrap();
    let dir_file = dir.path().join("outlines.fpdir");
    let (table, mut state) = (open(&dir), 11);
    let first = random_rows(&mut state, 20_000);
    table.add(first.clone(), 1).unwrap();
    let committed_then = std::fs::read(&dir_file).unwrap();
    // The second add, one commit, rewrites most pages (its rows fall everywhere); then the
    // directory file it wrote is "lost", as if the machine stopped before the rename.
    let second = random_rows(&mut state, COMMIT_ROWS);
    table.add(second.clone(), 2).unwrap();
    drop(table);
    std::fs::write(&dir_file, committed_then).unwrap();
    let table = open(&dir);
    assert_eq!(table.covered_seq(), 1);
    assert_holds_exactly(&table, &first.iter().copied().collect(), &mut state);
    assert_absent(&table, &second);
    table.add(second.clone(), 2).unwrap(); // the slots of the lost pages are free again
    assert_holds_exactly(&table, &first.into_iter().chain(second).collect(), &mut state);
}

#[test]
fn a_damaged_page_is_reported_never_used_and_rebuilt_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let (table, mut state) = (open(&dir), 5);
    let rows = random_rows(&mut state, 3000);
    table.add(rows.clone(), 9).unwrap();
    let (fingerprint, _) = rows[0];
    let slot = table.committed.read().unwrap().slot_of(fingerprint);
    let pages = OpenOptions::new().write(true).open(dir.path().join("outlines.fp")).unwrap();
    pages.write_all_at(&[0x5a], u64::from(slot) * PAGE_BYTES as u64 + 100).unwrap();
    let corrupt_before = crate::base::corruption::corrupt_objects(ObjectKind::Outline, Place::Local);
    assert!(matches!(table.find(fingerprint), Err(FingerprintError::Corrupt { slot: s, .. }) if s == slot));
    assert!(crate::base::corruption::corrupt_objects(ObjectKind::Outline, Place::Local) > corrupt_before);
    // Every later call is refused, even for pages that are whole.
    assert!(matches!(table.find(rows[1].0), Err(FingerprintError::Broken)));
    assert!(matches!(table.add(vec![], 10), Err(FingerprintError::Broken)));
    drop(table);
    let table = open(&dir);
    assert_eq!(table.covered_seq(), 0, "rebuilt from nothing");
    assert_eq!(table.find(fingerprint).unwrap(), None);
}

#[test]
fn a_page_checks_its_slot_prefix_and_order() {
    let rows = vec![(1u128 << 127, 1), ((1u128 << 127) | 5, 2)];
    let page = Page { local: 1, rows };
    let bytes = encode_page(&page, 4);
    assert!(decode_page(&bytes, 4, 1 << 127, 3).is_ok());
    assert_eq!(decode_page(&bytes, 5, 1 << 127, 3).unwrap_err(), "checksum mismatch");
    assert_eq!(decode_page(&bytes, 4, 1, 3).unwrap_err(), "an entry outside the page's prefix");
    assert_eq!(decode_page(&bytes, 4, 1 << 127, 0).unwrap_err(), "header out of range");
    // Swapped in the bytes and sealed again: `encode_page` itself asserts the order.
    let mut swapped = bytes;
    swapped[PAGE_HEADER..PAGE_HEADER + 2 * ENTRY_BYTES].rotate_left(ENTRY_BYTES);
    let checksum = xxh3_64_with_seed(&swapped[..CHECKSUM_AT], 4);
    swapped[CHECKSUM_AT..].copy_from_slice(&checksum.to_le_bytes());
    assert_eq!(decode_page(&swapped, 4, 1 << 127, 3).unwrap_err(), "entries out of order");
}

#[test]
fn a_damaged_or_foreign_directory_starts_an_empty_table() {
    let dir = tempfile::tempdir().unwrap();
    let dir_file = dir.path().join("outlines.fpdir");
    let (table, mut state) = (open(&dir), 1);
    table.add(random_rows(&mut state, 500), 3).unwrap();
    let key = table.key;
    drop(table);
    let mut bytes = std::fs::read(&dir_file).unwrap();
    let (dir_read, key_read) = Directory::decode(&bytes).unwrap();
    assert_eq!((dir_read.covered_seq, key_read), (3, key));
    for at in [0, 6, 30, bytes.len() - 1] {
        let mut damaged = bytes.clone();
        damaged[at] ^= 1;
        assert!(Directory::decode(&damaged).is_none(), "byte {at} flipped");
    }
    bytes[20] ^= 1;
    std::fs::write(&dir_file, &bytes).unwrap();
    let table = open(&dir);
    assert_eq!((table.covered_seq(), depth(&table)), (0, 0));
    assert_ne!(table.key, key, "a new table draws a new key");
}
