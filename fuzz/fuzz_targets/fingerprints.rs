//! The fingerprint table (`outline::fingerprints`) over files it did not write, and over files it
//! wrote with one byte changed.
//!
//! Byte 0 picks the mode:
//! - bit 0 clear: `outlines.fpdir` and `outlines.fp` are the fuzzer's bytes (a u16 LE length, the
//!   directory, then the pages). Bit 1 seals them first (the directory's xxh3-64 appended, each
//!   page's slot-seeded checksum written), so that the checks behind the checksums are reached.
//!   The table opens, finds and adds rows without panicking, whatever the files hold.
//! - bit 0 set: a fresh table adds the fuzzer's rows, then one byte of one of its files is
//!   flipped (bit 1 picks which) and the table opened again.
//!
//! Invariants checked (the module's header states them):
//! - An add that succeeds leaves every row it added found with its id, also after reopening.
//! - A changed byte is never a wrong answer: a lookup finds the row's own id, or reports the
//!   damage; a table whose directory was damaged starts empty (covers nothing) and finds nothing.
#![no_main]

use backlinks::outline::fingerprints::{Fingerprints, PAGE_BYTES, Row};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Pages of a fuzzed pages file, and rows of one add.
const MAX_PAGES: usize = 16;
const MAX_ROWS: usize = 512;
const ROW_BYTES: usize = 24;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("outlines.db");
    match mode & 1 {
        0 => foreign_files(&db, mode & 2 != 0, rest),
        _ => one_byte_changed(&db, mode & 2 != 0, rest),
    }
});

fn foreign_files(db: &Path, seal: bool, data: &[u8]) {
    let Some((len, rest)) = data.split_first_chunk::<2>() else { return };
    let (directory, pages) = rest.split_at(usize::from(u16::from_le_bytes(*len)).min(rest.len()));
    let mut directory = directory.to_vec();
    let mut pages = pages[..pages.len().min(MAX_PAGES * PAGE_BYTES)].to_vec();
    if seal {
        directory.extend_from_slice(&xxh3_64(&directory).to_le_bytes());
        seal_pages(&mut pages);
    }
    std::fs::write(db.with_extension("fpdir"), &directory).expect("write the directory");
    std::fs::write(db.with_extension("fp"), &pages).expect("write the pages");
    let table = Fingerprints::open(db).expect("a table opens over any files");
    let rows = rows_of(data);
    for (fingerprint, _) in &rows {
        let _ = table.find(*fingerprint);
    }
    if table.add(rows.clone(), 1).is_ok() {
        assert_found(&table, &rows);
    }
}

fn one_byte_changed(db: &Path, in_directory: bool, data: &[u8]) {
    let Some((position, rest)) = data.split_first_chunk::<4>() else { return };
    let rows = rows_of(rest);
    {
        let table = Fingerprints::open(db).expect("a fresh table");
        if table.add(rows.clone(), 7).is_err() {
            return; // two ids for one fingerprint: refused
        }
        assert_found(&table, &rows);
        drop(table);
        assert_found(&Fingerprints::open(db).expect("the table opens again"), &rows);
    }
    let path = db.with_extension(if in_directory { "fpdir" } else { "fp" });
    let mut bytes = std::fs::read(&path).expect("read the file");
    let at = u32::from_le_bytes(*position) as usize % bytes.len();
    bytes[at] ^= 1 << (position[0] % 8);
    std::fs::write(&path, &bytes).expect("write it back");
    let table = Fingerprints::open(db).expect("a table opens over a changed file");
    let rebuilt = table.covered_seq() == 0;
    for (fingerprint, id) in &rows {
        match table.find(*fingerprint) {
            Ok(found) if rebuilt => assert_eq!(found, None, "a rebuilt table is empty"),
            Ok(found) => assert_eq!(found, Some(*id), "byte {at} of {} changed an answer", path.display()),
            Err(_) => {} // the damage was seen
        }
    }
}

/// Up to `MAX_ROWS` rows of 24 bytes: a fingerprint (u128 BE) and an id (u64 BE).
fn rows_of(data: &[u8]) -> Vec<Row> {
    let rows = data.chunks_exact(ROW_BYTES).take(MAX_ROWS);
    rows.map(|row| {
        let fingerprint = u128::from_be_bytes(row[..16].try_into().expect("16 bytes"));
        (fingerprint, u64::from_be_bytes(row[16..].try_into().expect("8 bytes")))
    })
    .collect()
}

fn assert_found(table: &Fingerprints, rows: &[Row]) {
    for (fingerprint, id) in rows {
        let found = table.find(*fingerprint).expect("a table that took the rows reads them");
        assert_eq!(found, Some(*id), "fingerprint {fingerprint:032x} lost");
    }
}

/// Writes each whole page's checksum: xxh3-64 seeded with its slot, in its last 8 bytes.
fn seal_pages(pages: &mut [u8]) {
    for (slot, page) in pages.chunks_exact_mut(PAGE_BYTES).enumerate() {
        let (body, checksum) = page.split_at_mut(PAGE_BYTES - 8);
        checksum.copy_from_slice(&xxh3_64_with_seed(body, slot as u64).to_le_bytes());
    }
}
