//! The fingerprint table: the id of every stored string of the large kinds (did, rkey), found
//! from the string's fingerprint with one positioned read of one page. Interning a string the
//! outline cache has forgotten (with more accounts than the cache holds, most DIDs of most
//! events) then costs a page read instead of a search of SQLite's `(kind, value)` index.
//!
//! Assumptions:
//! - A fingerprint is the 128-bit SipHash-2-4 of the kind's code and the string's bytes, under a
//!   key drawn from the operating system when the table is created (kept in its directory file).
//!   SipHash is a pseudo-random function: nobody without the key can choose strings whose
//!   fingerprints collide, and by chance two among 2^32 strings do with probability about 2^-65.
//!   The table takes equal fingerprints for the same string.
//! - The table is derived data: `outlines.db` is the truth. `covered_seq` says through which of
//!   its insertion sequence numbers the table holds every row; the caller adds the rest. A table
//!   whose directory file is missing or damaged starts empty (and is rebuilt by that catching up);
//!   a damaged page makes the table refuse every later call (`Broken`) until its caller
//!   `clear`s it and adds every row again.
//!
//! Layout (extendible hashing): `outlines.fp` holds pages of `PAGE_BYTES` at `slot * PAGE_BYTES`;
//! `outlines.fpdir` maps the top `depth` bits of a fingerprint to the slot of its page. A page of
//! local depth `l` holds, sorted, every stored fingerprint whose top `l` bits are its prefix, at
//! most `PAGE_ENTRIES`; a page that would hold more splits in two by the next bit, doubling the
//! directory when `l` reaches `depth`.
//!
//! Invariants:
//! - Copy on write: no page the committed directory names is ever written. A commit (`add` makes
//!   one per `COMMIT_ROWS` rows) writes the pages it changes to slots no committed page uses (or
//!   past the end), fsyncs them, replaces the directory file (written whole, fsynced, renamed,
//!   the directory fsynced), then swaps the directory in memory and only then frees the slots of
//!   the pages it replaced. A crash at any point leaves the last directory file naming the intact
//!   pages it was written with; the file holds at most one commit's pages beyond those in use.
//! - A reader holds the directory's read lock through its page read, so a slot is not rewritten
//!   while anyone may still read it as a page of the directory that named it.
//! - Every page carries an xxh3-64 checksum seeded with its slot; a reader checks it, the count,
//!   the local depth, and that the entries are strictly increasing and share the prefix of the
//!   fingerprint that led to the page, before it uses any entry. `add` checks the same and that
//!   every fingerprint it adds has at most one id.
//! - Bounded: depth at most `MAX_DEPTH` (a directory of 2^24 slots, 64 MiB, for some two billion
//!   strings); memory is the directory (4 bytes a bucket) and, during `add`, its rows and a
//!   copy of the directory.

use crate::base::corruption::{ObjectKind, Place, report_corruption};
use crate::base::durable::{sync_dir, write_durably};
use siphasher::sip128::{Hasher128, SipHasher24};
use std::fs::{File, OpenOptions};
use std::hash::Hasher;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Bytes of a page: one read of the operating system's page size.
pub const PAGE_BYTES: usize = 4096;
/// Count (u16 LE), local depth (u8), five zero bytes.
const PAGE_HEADER: usize = 8;
/// A fingerprint (u128 BE) and its id (u64 BE).
const ENTRY_BYTES: usize = 24;
const CHECKSUM_AT: usize = PAGE_BYTES - 8;
/// Entries a page holds: 170.
pub const PAGE_ENTRIES: usize = (CHECKSUM_AT - PAGE_HEADER) / ENTRY_BYTES;
/// Deepest directory: 2^24 buckets of 4 bytes.
const MAX_DEPTH: u8 = 24;
/// Rows one commit of `add` writes: the pages it changes are copies until its directory is
/// durable, so the file holds at most this many pages (and their splits) beyond those in use.
const COMMIT_ROWS: usize = if cfg!(test) { 256 } else { 1 << 14 };

const DIR_MAGIC: &[u8; 4] = b"BLFP";
const DIR_VERSION: u16 = 1;
/// Magic, version, depth, a zero byte, key (two u64 LE), covered_seq (i64 LE), file slots (u32 LE).
const DIR_HEADER: usize = 4 + 2 + 1 + 1 + 16 + 8 + 4;

/// A fingerprint and the id of its string.
pub type Row = (u128, u64);

#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("outlines.fp page {slot} is damaged: {reason}")]
    Corrupt { slot: u32, reason: &'static str },
    #[error("the fingerprint table would pass {MAX_DEPTH} bits of depth")]
    Full,
    #[error("fingerprint {0:032x} would have two ids")]
    Conflict(u128),
    #[error("the fingerprint table met a damaged page and must be rebuilt")]
    Broken,
}

/// The directory: which slot holds the page of each `depth`-bit prefix, and how far the table
/// follows `outlines.db`.
#[derive(Debug, Clone, PartialEq)]
struct Directory {
    depth: u8,
    slots: Vec<u32>,
    covered_seq: i64,
    /// Slots `outlines.fp` has room for: every slot named is below it.
    file_slots: u32,
}

impl Directory {
    fn empty() -> Self {
        Self { depth: 0, slots: vec![0], covered_seq: 0, file_slots: 1 }
    }

    fn slot_of(&self, fingerprint: u128) -> u32 {
        self.slots[prefix(fingerprint, self.depth) as usize]
    }

    fn double(&mut self) -> Result<(), FingerprintError> {
        if self.depth >= MAX_DEPTH {
            return Err(FingerprintError::Full);
        }
        self.slots = self.slots.iter().flat_map(|&slot| [slot, slot]).collect();
        self.depth += 1;
        Ok(())
    }

    /// Names `slot` for every bucket of the page with `prefix` at local depth `local`.
    fn point(&mut self, prefix: u128, local: u8, slot: u32) {
        let shift = self.depth - local;
        let start = (prefix << shift) as usize;
        self.slots[start..start + (1usize << shift)].fill(slot);
    }

    fn encode(&self, key: (u64, u64)) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(DIR_HEADER + 4 * self.slots.len() + 8);
        bytes.extend_from_slice(DIR_MAGIC);
        bytes.extend_from_slice(&DIR_VERSION.to_le_bytes());
        bytes.extend_from_slice(&[self.depth, 0]);
        bytes.extend_from_slice(&key.0.to_le_bytes());
        bytes.extend_from_slice(&key.1.to_le_bytes());
        bytes.extend_from_slice(&self.covered_seq.to_le_bytes());
        bytes.extend_from_slice(&self.file_slots.to_le_bytes());
        self.slots.iter().for_each(|slot| bytes.extend_from_slice(&slot.to_le_bytes()));
        bytes.extend_from_slice(&xxh3_64(&bytes).to_le_bytes());
        debug_assert_eq!(Self::decode(&bytes), Some((self.clone(), key)));
        bytes
    }

    /// The directory and key in `bytes`, or `None` if they are not a whole, consistent one.
    fn decode(bytes: &[u8]) -> Option<(Self, (u64, u64))> {
        let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
        if body.len() < DIR_HEADER || xxh3_64(body).to_le_bytes() != checksum || &body[..4] != DIR_MAGIC {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let (version, depth) = (u16::from_le_bytes([body[4], body[5]]), body[6]);
        if version != DIR_VERSION || depth > MAX_DEPTH || body[7] != 0 {
            return None;
        }
        let key = (u64_at(8), u64_at(16));
        let covered_seq = u64_at(24) as i64;
        let file_slots = u32::from_le_bytes(body[32..36].try_into().expect("4 bytes"));
        let slots: Vec<u32> = body[DIR_HEADER..]
            .chunks_exact(4)
            .map(|slot| u32::from_le_bytes(slot.try_into().expect("4 bytes")))
            .collect();
        let whole = body.len() == DIR_HEADER + 4 * (1usize << depth);
        if !whole || covered_seq < 0 || slots.iter().any(|&slot| slot >= file_slots) {
            return None;
        }
        Some((Self { depth, slots, covered_seq, file_slots }, key))
    }
}

/// A page's entries, decoded and checked.
#[derive(Debug, Default)]
struct Page {
    local: u8,
    rows: Vec<Row>,
}

/// The table: pages in `outlines.fp`, the committed directory in memory and in `outlines.fpdir`.
#[derive(Debug)]
pub struct Fingerprints {
    key: (u64, u64),
    pages_path: PathBuf,
    dir_path: PathBuf,
    pages: File,
    committed: RwLock<Directory>,
    /// Slots no committed page uses, lowest last (taken first). Only `add` takes or returns them.
    free: Mutex<Vec<u32>>,
    broken: AtomicBool,
}

impl Fingerprints {
    /// Opens the table beside `outlines_db` (`outlines.fp`, `outlines.fpdir`), or creates an empty
    /// one with a new key when there is none or its directory file is damaged or does not fit
    /// its pages file.
    pub fn open(outlines_db: &Path) -> Result<Self, FingerprintError> {
        let pages_path = outlines_db.with_extension("fp");
        let dir_path = outlines_db.with_extension("fpdir");
        let pages = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&pages_path)
            .map_err(io_error(&pages_path))?;
        let pages_len = pages.metadata().map_err(io_error(&pages_path))?.len();
        let stored = match std::fs::read(&dir_path) {
            Ok(bytes) => Directory::decode(&bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(FingerprintError::Io { path: dir_path, source }),
        };
        let fits = |dir: &Directory| u64::from(dir.file_slots) * PAGE_BYTES as u64 <= pages_len;
        let table = match stored.filter(|(dir, _)| fits(dir)) {
            Some((dir, key)) => Self::with(key, pages_path, dir_path, pages, dir),
            None => {
                if pages_len > 0 {
                    tracing::warn!(path = %dir_path.display(), "fingerprint directory missing or damaged: rebuilding the table");
                }
                let table = Self::with(new_key()?, pages_path, dir_path, pages, Directory::empty());
                table.create_empty()?;
                table
            }
        };
        Ok(table)
    }

    fn with(key: (u64, u64), pages_path: PathBuf, dir_path: PathBuf, pages: File, dir: Directory) -> Self {
        let mut named = vec![false; dir.file_slots as usize];
        dir.slots.iter().for_each(|&slot| named[slot as usize] = true);
        let free = (0..dir.file_slots).rev().filter(|&slot| !named[slot as usize]).collect();
        let (committed, free, broken) = (RwLock::new(dir), Mutex::new(free), AtomicBool::new(false));
        Self { key, pages_path, dir_path, pages, committed, free, broken }
    }

    /// Writes the empty table: one empty page in slot 0 and its directory.
    fn create_empty(&self) -> Result<(), FingerprintError> {
        self.write_empty(&Directory::empty())
    }

    fn write_empty(&self, empty: &Directory) -> Result<(), FingerprintError> {
        debug_assert_eq!(*empty, Directory::empty());
        self.pages.set_len(0).map_err(io_error(&self.pages_path))?;
        self.write_page(0, &Page::default())?;
        self.pages.sync_data().map_err(io_error(&self.pages_path))?;
        self.write_directory(empty)
    }

    /// Empties the table (after it met a damaged page), keeping its key: it covers nothing, and
    /// its caller adds every row again. Waits for lookups and adds in progress.
    pub fn clear(&self) -> Result<(), FingerprintError> {
        let mut free = self.free.lock().expect("not poisoned");
        let mut committed = self.committed.write().expect("not poisoned");
        *committed = Directory::empty();
        free.clear();
        self.write_empty(&committed)?;
        self.broken.store(false, Ordering::Release);
        Ok(())
    }

    /// The fingerprint of `value` of the kind with `kind_code`.
    pub fn fingerprint(&self, kind_code: u8, value: &str) -> u128 {
        let mut hasher = SipHasher24::new_with_keys(self.key.0, self.key.1);
        hasher.write_u8(kind_code);
        hasher.write(value.as_bytes());
        hasher.finish128().as_u128()
    }

    /// Through which `outlines.db` insertion sequence number the table holds every row.
    pub fn covered_seq(&self) -> i64 {
        self.committed.read().expect("not poisoned").covered_seq
    }

    /// The id stored for `fingerprint`, if any.
    pub fn find(&self, fingerprint: u128) -> Result<Option<u64>, FingerprintError> {
        self.refuse_if_broken()?;
        let page = {
            let dir = self.committed.read().expect("not poisoned");
            self.read_page(dir.slot_of(fingerprint), fingerprint, dir.depth)?
        };
        Ok(page.rows.binary_search_by_key(&fingerprint, |row| row.0).ok().map(|at| page.rows[at].1))
    }

    /// Adds `rows` and marks the table as holding every row through `through_seq`, durably.
    /// Rows already stored are skipped; a fingerprint stored or given with another id is an
    /// error. The rows are committed in order, `COMMIT_ROWS` at a time, and `covered_seq` moves
    /// with the last of them: on error the commits before stay (rows of `outlines.db` all the
    /// same) and nothing of the failing one is seen.
    pub fn add(&self, mut rows: Vec<Row>, through_seq: i64) -> Result<(), FingerprintError> {
        self.refuse_if_broken()?;
        rows.sort_unstable();
        rows.dedup();
        if let Some(pair) = rows.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(FingerprintError::Conflict(pair[0].0));
        }
        let mut free = self.free.lock().expect("not poisoned");
        if rows.is_empty() {
            return match through_seq > self.covered_seq() {
                true => self.commit(&[], through_seq, &mut free),
                false => Ok(()),
            };
        }
        let parts = rows.len().div_ceil(COMMIT_ROWS);
        for (index, part) in rows.chunks(COMMIT_ROWS).enumerate() {
            self.commit(part, if index + 1 == parts { through_seq } else { 0 }, &mut free)?;
        }
        Ok(())
    }

    /// Writes the pages `rows` (sorted) change to free slots, then the directory naming them
    /// and covering `through_seq`, and only then frees the slots of the pages they replaced.
    fn commit(&self, rows: &[Row], through_seq: i64, free: &mut Vec<u32>) -> Result<(), FingerprintError> {
        let mut dir = self.committed.read().expect("not poisoned").clone();
        let mut taken = Vec::new();
        let written = self.write_changed_pages(rows, &mut dir, free, &mut taken);
        let committed = written.and_then(|replaced| {
            self.pages.sync_data().map_err(io_error(&self.pages_path))?;
            dir.covered_seq = dir.covered_seq.max(through_seq);
            self.write_directory(&dir)?;
            Ok(replaced)
        });
        match committed {
            Ok(replaced) => {
                *self.committed.write().expect("not poisoned") = dir;
                free.extend(replaced);
                Ok(())
            }
            Err(error) => {
                // Slots past the committed end are not free: the next commit extends the file
                // from that end again, and would hand one out twice.
                let end = self.committed.read().expect("not poisoned").file_slots;
                free.extend(taken.into_iter().rev().filter(|&slot| slot < end));
                Err(error)
            }
        }
    }

    /// Merges `rows` (sorted) into the pages their prefixes lead to, writing each changed page
    /// (or the pages it split into) to free slots and pointing `dir` at them; returns the slots
    /// of the pages replaced. Rows are taken in order, so each page is read and written once.
    fn write_changed_pages(
        &self,
        rows: &[Row],
        dir: &mut Directory,
        free: &mut Vec<u32>,
        taken: &mut Vec<u32>,
    ) -> Result<Vec<u32>, FingerprintError> {
        let mut replaced = Vec::new();
        let mut next = 0;
        while next < rows.len() {
            let first = rows[next].0;
            let slot = dir.slot_of(first);
            let page = self.read_page(slot, first, dir.depth)?;
            let last_of_page = last_with_prefix(first, page.local);
            let end = next + rows[next..].partition_point(|row| row.0 <= last_of_page);
            let merged = merge(&page.rows, &rows[next..end])?;
            for piece in split(prefix(first, page.local), page.local, merged)? {
                while dir.depth < piece.local {
                    dir.double()?;
                }
                let piece_slot = free.pop().unwrap_or_else(|| {
                    dir.file_slots += 1;
                    dir.file_slots - 1
                });
                taken.push(piece_slot);
                self.write_page(piece_slot, &piece.page)?;
                dir.point(piece.prefix, piece.local, piece_slot);
            }
            replaced.push(slot);
            next = end;
        }
        Ok(replaced)
    }

    /// `Broken` once the table has met a damaged page (until `clear`).
    pub fn refuse_if_broken(&self) -> Result<(), FingerprintError> {
        match self.broken.load(Ordering::Acquire) {
            true => Err(FingerprintError::Broken),
            false => Ok(()),
        }
    }

    /// Reads and checks the page in `slot`, which `fingerprint` led to under a directory of
    /// `depth`. A damaged page is reported, breaks the table and removes its directory file.
    fn read_page(&self, slot: u32, fingerprint: u128, depth: u8) -> Result<Page, FingerprintError> {
        let mut bytes = [0u8; PAGE_BYTES];
        let offset = u64::from(slot) * PAGE_BYTES as u64;
        self.pages.read_exact_at(&mut bytes, offset).map_err(io_error(&self.pages_path))?;
        decode_page(&bytes, slot, fingerprint, depth).map_err(|reason| self.break_on(slot, reason))
    }

    fn break_on(&self, slot: u32, reason: &'static str) -> FingerprintError {
        report_corruption(ObjectKind::Outline, Place::Local, &format!("outlines.fp page {slot}"), &reason);
        self.broken.store(true, Ordering::Release);
        if let Err(error) = std::fs::remove_file(&self.dir_path) {
            tracing::warn!(%error, "could not remove the fingerprint directory of a damaged table");
        }
        FingerprintError::Corrupt { slot, reason }
    }

    fn write_page(&self, slot: u32, page: &Page) -> Result<(), FingerprintError> {
        let bytes = encode_page(page, slot);
        let offset = u64::from(slot) * PAGE_BYTES as u64;
        self.pages.write_all_at(&bytes, offset).map_err(io_error(&self.pages_path))
    }

    fn write_directory(&self, dir: &Directory) -> Result<(), FingerprintError> {
        write_durably(&self.dir_path, &dir.encode(self.key)).map_err(io_error(&self.dir_path))?;
        let parent = self.dir_path.parent().filter(|parent| !parent.as_os_str().is_empty());
        sync_dir(parent.unwrap_or(Path::new("."))).map_err(io_error(&self.dir_path))
    }
}

/// A page `split` produced: its prefix at its local depth, and its entries.
struct Piece {
    prefix: u128,
    local: u8,
    page: Page,
}

/// The pages `rows` (sorted, all with `prefix` at depth `local`) fill: one if they fit, else
/// the pieces of its two halves by the next bit.
fn split(prefix: u128, local: u8, rows: Vec<Row>) -> Result<Vec<Piece>, FingerprintError> {
    if rows.len() <= PAGE_ENTRIES {
        return Ok(vec![Piece { prefix, local, page: Page { local, rows } }]);
    }
    if local >= MAX_DEPTH {
        return Err(FingerprintError::Full);
    }
    let bit = 127 - u32::from(local);
    let middle = rows.partition_point(|row| (row.0 >> bit) & 1 == 0);
    let (low, high) = (rows[..middle].to_vec(), rows[middle..].to_vec());
    let mut pieces = split(prefix << 1, local + 1, low)?;
    pieces.extend(split((prefix << 1) | 1, local + 1, high)?);
    Ok(pieces)
}

/// The sorted union of two sorted runs; a fingerprint in both must have the same id.
fn merge(stored: &[Row], added: &[Row]) -> Result<Vec<Row>, FingerprintError> {
    let mut merged = Vec::with_capacity(stored.len() + added.len());
    let (mut a, mut b) = (stored.iter().peekable(), added.iter().peekable());
    loop {
        let row = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                if x.1 != y.1 {
                    return Err(FingerprintError::Conflict(x.0));
                }
                b.next();
                a.next()
            }
            (Some(x), Some(y)) if x.0 < y.0 => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => break,
        };
        merged.push(*row.expect("peeked"));
    }
    Ok(merged)
}

/// The top `depth` bits of `fingerprint`.
fn prefix(fingerprint: u128, depth: u8) -> u128 {
    fingerprint.checked_shr(128 - u32::from(depth)).unwrap_or(0)
}

/// The largest fingerprint with the same top `depth` bits as `fingerprint`.
fn last_with_prefix(fingerprint: u128, depth: u8) -> u128 {
    fingerprint | u128::MAX.checked_shr(u32::from(depth)).unwrap_or(0)
}

fn encode_page(page: &Page, slot: u32) -> [u8; PAGE_BYTES] {
    assert!(page.rows.len() <= PAGE_ENTRIES, "a page holds at most {PAGE_ENTRIES} entries");
    let mut bytes = [0u8; PAGE_BYTES];
    bytes[..2].copy_from_slice(&(page.rows.len() as u16).to_le_bytes());
    bytes[2] = page.local;
    for (i, (fingerprint, id)) in page.rows.iter().enumerate() {
        let at = PAGE_HEADER + i * ENTRY_BYTES;
        bytes[at..at + 16].copy_from_slice(&fingerprint.to_be_bytes());
        bytes[at + 16..at + 24].copy_from_slice(&id.to_be_bytes());
    }
    let checksum = xxh3_64_with_seed(&bytes[..CHECKSUM_AT], u64::from(slot));
    bytes[CHECKSUM_AT..].copy_from_slice(&checksum.to_le_bytes());
    debug_assert!(page.rows.first().is_none_or(|row| decode_page(&bytes, slot, row.0, MAX_DEPTH).is_ok()));
    bytes
}

/// The page in `bytes` read from `slot`, checked against the fingerprint that led to it under a
/// directory of `depth`.
fn decode_page(bytes: &[u8; PAGE_BYTES], slot: u32, fingerprint: u128, depth: u8) -> Result<Page, &'static str> {
    let checksum = u64::from_le_bytes(bytes[CHECKSUM_AT..].try_into().expect("8 bytes"));
    if xxh3_64_with_seed(&bytes[..CHECKSUM_AT], u64::from(slot)) != checksum {
        return Err("checksum mismatch");
    }
    let (count, local) = (usize::from(u16::from_le_bytes([bytes[0], bytes[1]])), bytes[2]);
    if count > PAGE_ENTRIES || local > depth || bytes[3..PAGE_HEADER] != [0; 5] {
        return Err("header out of range");
    }
    let rows: Vec<Row> = bytes[PAGE_HEADER..PAGE_HEADER + count * ENTRY_BYTES]
        .chunks_exact(ENTRY_BYTES)
        .map(|entry| {
            let fingerprint = u128::from_be_bytes(entry[..16].try_into().expect("16 bytes"));
            (fingerprint, u64::from_be_bytes(entry[16..].try_into().expect("8 bytes")))
        })
        .collect();
    if rows.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
        return Err("entries out of order");
    }
    if rows.iter().any(|row| prefix(row.0, local) != prefix(fingerprint, local)) {
        return Err("an entry outside the page's prefix");
    }
    Ok(Page { local, rows })
}

fn new_key() -> Result<(u64, u64), FingerprintError> {
    let mut key = [0u8; 16];
    getrandom::fill(&mut key).map_err(|error| FingerprintError::Io {
        path: PathBuf::from("the operating system's random source"),
        source: std::io::Error::other(error.to_string()),
    })?;
    let half = |at: usize| u64::from_le_bytes(key[at..at + 8].try_into().expect("8 bytes"));
    Ok((half(0), half(8)))
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> FingerprintError + '_ {
    move |source| FingerprintError::Io { path: path.to_owned(), source }
}

#[cfg(test)]
#[path = "fingerprint_tests.rs"]
mod tests;
