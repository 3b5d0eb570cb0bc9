//! Recent records' links: for each record changed within the change log's window, where its
//! newest entry is (that entry's `created` and `kept` are the record's links now), and for each
//! account, where its newest entry is (its older ones chain back through `account_before`). A
//! delete or an update looks its record up here to tell subscribers which links went away; an
//! account deletion walks its account's chain.
//!
//! The table is one file of a fixed size (`push_recent_bytes`), memory-mapped: a header page, then
//! buckets of four 16-byte slots `(key u64, position u64)`, one cache line each. A key is the xxh3
//! of a record's URI (of a DID under another seed), never 0 (an empty slot); it lives in one of
//! two buckets its hash names within one page of the file, and a lookup reads both (one page
//! touched a key: page faults and writeback are per page). A slot whose position lies in a
//! segment the log let go is stale, as good as empty. When both buckets hold eight live slots,
//! the oldest gives way: that record leaves the window early (counted by the feed).
//!
//! Invariants:
//! - A slot is only a hint: the entry it leads to is checked against the record's URI (or the
//!   account's DID) before it is believed: hashes collide, and a crash can leave a slot ahead of
//!   the log.
//! - The table follows from the log alone (`feed`'s `reflect`), and the header's `log_through`
//!   says how far it had when it was last set. A crash of the process loses nothing mapped (the
//!   pages are the kernel's): the feed reflects the entries past `log_through` again. A crash of
//!   the machine can lose any pages in any order: the header's boot id and clean flag tell, and
//!   the table is emptied and rebuilt from the whole log.
//! - Changes are staged in memory (`set`, `remove`, `set_account`; lookups see them) and written
//!   into the mapped file by `write_staged`, which the feed calls once the entries they lead to are
//!   written to the log: no slot in the file leads to an entry a crash of the process loses.
//! - Nothing is written out while running (an fsync would write every page the window's records
//!   touched since the last one); a clean close writes every page, then marks the header clean.

use super::PushError;
use super::log::Position;
use memmap2::MmapMut;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

const MAGIC: &[u8; 8] = b"BLRECENT";
const VERSION: u32 = 1;
/// The header's page; buckets start after it.
const HEADER_BYTES: u64 = 4096;
const HEADER_USED: usize = 64;
const SLOTS_PER_BUCKET: usize = 4;
const SLOT_BYTES: usize = 16;
const BUCKET_BYTES: u64 = (SLOTS_PER_BUCKET * SLOT_BYTES) as u64;
/// A key's two buckets are in one page of this many.
const BUCKETS_PER_PAGE: u64 = 64;
/// The smallest table: one page of buckets.
pub const MIN_TABLE_BYTES: u64 = BUCKETS_PER_PAGE * BUCKET_BYTES;
/// Seed of an account's key, so a DID and a record URI never share one by construction.
const ACCOUNT_SEED: u64 = 0x6163_636f_756e_7473;

/// How far the table reflects the log, kept in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The newest log cursor whose entry the table reflects.
    pub log_through: i64,
    /// The newest Jetstream time the feed had taken when `log_through` was set.
    pub observed_through: i64,
}

/// Why an opened table starts empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fresh {
    /// It was kept: its slots and facts stand.
    Kept,
    /// There was none, or of another size or version.
    New,
    /// The machine stopped since it was last open, and it was not closed cleanly.
    MachineCrash,
}

pub struct RecentLinks {
    path: PathBuf,
    /// Changes not yet in the file, by key (`None`: removed).
    staged: HashMap<u64, Option<Position>>,
    map: MmapMut,
    bucket_mask: u64,
    /// Slots into segments before this one are stale.
    oldest_segment: u32,
    boot: u64,
}

/// This boot of the machine, as a hash of Linux's boot id (0: unknown, which never matches).
pub fn current_boot() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|id| xxh3_64(id.trim().as_bytes())).unwrap_or(0)
}

fn nonzero(hash: u64) -> u64 {
    hash.max(1)
}

fn record_key(source: &str) -> u64 {
    nonzero(xxh3_64(source.as_bytes()))
}

fn account_key(did: &str) -> u64 {
    nonzero(xxh3_64_with_seed(did.as_bytes(), ACCOUNT_SEED))
}

/// The bucket count for buckets of at most `bytes` in all: a power of two.
fn buckets_for(bytes: u64) -> u64 {
    1 << (bytes.max(MIN_TABLE_BYTES) / BUCKET_BYTES).ilog2()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    buckets: u64,
    facts: Facts,
    boot: u64,
    clean: bool,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_USED] {
        let mut bytes = [0u8; HEADER_USED];
        bytes[0..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.buckets.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.facts.log_through.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.facts.observed_through.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.boot.to_le_bytes());
        bytes[48..56].copy_from_slice(&(self.clean as u64).to_le_bytes());
        let checksum = xxh3_64(&bytes[..56]);
        bytes[56..64].copy_from_slice(&checksum.to_le_bytes());
        debug_assert_eq!(Header::decode(&bytes), Some(*self));
        bytes
    }

    /// The header, if these bytes are one of this version.
    fn decode(bytes: &[u8]) -> Option<Header> {
        let bytes = bytes.get(..HEADER_USED)?;
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if &bytes[0..8] != MAGIC || version != VERSION || u64_at(56) != xxh3_64(&bytes[..56]) {
            return None;
        }
        let clean = match u64_at(48) {
            0 => false,
            1 => true,
            _ => return None,
        };
        let facts = Facts { log_through: u64_at(24) as i64, observed_through: u64_at(32) as i64 };
        Some(Header { buckets: u64_at(16), facts, boot: u64_at(40), clean })
    }
}

impl RecentLinks {
    /// Opens the table at `path` (buckets of at most `bytes`, and a header page) on the machine
    /// boot `boot`; says whether it kept what it held (else it is empty and the whole log must be
    /// reflected again).
    pub fn open(path: &Path, bytes: u64, boot: u64) -> Result<(Self, Fresh), PushError> {
        let io = |e| PushError::io(path, e);
        let buckets = buckets_for(bytes);
        let file_bytes = HEADER_BYTES + buckets * BUCKET_BYTES;
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
        let found = read_header(&file, file_bytes).map_err(io)?;
        let fresh = match found {
            Some(header) if header.buckets == buckets && (header.clean || (boot != 0 && header.boot == boot)) => {
                Fresh::Kept
            }
            Some(header) if header.buckets == buckets => Fresh::MachineCrash,
            _ => Fresh::New,
        };
        let facts = match (fresh, found) {
            (Fresh::Kept, Some(header)) => header.facts,
            _ => {
                // Emptied: a file cut to nothing and grown again reads as zeroes, and holds no disk
                // until written.
                file.set_len(0).map_err(io)?;
                Facts { log_through: 0, observed_through: i64::MIN }
            }
        };
        file.set_len(file_bytes).map_err(io)?;
        // SAFETY: the file is the push directory's own, opened by this process alone (the data
        // directory's lock keeps other processes out), and never truncated while mapped.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
        // Keys land all over the file: a fault reads its own page, not the pages around it.
        map.advise(memmap2::Advice::Random).map_err(io)?;
        let staged = HashMap::new();
        let mut table =
            RecentLinks { path: path.to_owned(), staged, map, bucket_mask: buckets - 1, oldest_segment: 0, boot };
        // Marked open before any slot changes: a machine crash from here on is seen.
        table.write_header(facts, false)?;
        Ok((table, fresh))
    }

    pub fn facts(&self) -> Facts {
        Header::decode(&self.map[..HEADER_USED]).expect("the header this table wrote").facts
    }

    /// Sets how far the table reflects the log (in memory: see the invariants).
    pub fn set_facts(&mut self, facts: Facts) {
        self.put_header(facts, false);
    }

    /// Sets the header and writes its page out.
    fn write_header(&mut self, facts: Facts, clean: bool) -> Result<(), PushError> {
        self.put_header(facts, clean);
        self.map.flush_range(0, HEADER_USED).map_err(|e| PushError::io(&self.path, e))
    }

    fn put_header(&mut self, facts: Facts, clean: bool) {
        let header = Header { buckets: self.bucket_mask + 1, facts, boot: self.boot, clean };
        self.map[..HEADER_USED].copy_from_slice(&header.encode());
    }

    /// The position of the newest entry of the record `source`, if the table holds one.
    pub fn position_of(&self, source: &str) -> Option<Position> {
        self.find(record_key(source))
    }

    /// The record `source`'s newest entry is at `position` (staged).
    pub fn set(&mut self, source: &str, position: Position) {
        self.staged.insert(record_key(source), Some(position));
    }

    /// The record `source` has no links now (staged).
    pub fn remove(&mut self, source: &str) {
        self.staged.insert(record_key(source), None);
    }

    /// The position of the newest entry of a record of the account `did`.
    pub fn account_position(&self, did: &str) -> Option<Position> {
        self.find(account_key(did))
    }

    /// The account `did`'s newest entry is at `position` (staged).
    pub fn set_account(&mut self, did: &str, position: Position) {
        self.staged.insert(account_key(did), Some(position));
    }

    /// Writes the staged changes into the file; returns how many older slots gave way.
    pub fn write_staged(&mut self) -> u64 {
        let mut displaced = 0;
        for (key, position) in std::mem::take(&mut self.staged) {
            match position {
                Some(position) => displaced += !self.put(key, position) as u64,
                None => {
                    if let Some((bucket, slot, _)) = self.slot_of(key) {
                        self.write_slot(bucket, slot, 0, 0);
                    }
                }
            }
        }
        displaced
    }

    /// The log let go of the segments before `segment`: slots into them are stale.
    pub fn forget_before(&mut self, segment: u32) {
        self.oldest_segment = self.oldest_segment.max(segment);
    }

    /// The key's page from its high bits, its two buckets there from its low ones.
    fn buckets_of(&self, key: u64) -> [u64; 2] {
        let pages = (self.bucket_mask + 1) / BUCKETS_PER_PAGE;
        let first = ((key >> 32) & (pages - 1)) * BUCKETS_PER_PAGE;
        [first + (key & (BUCKETS_PER_PAGE - 1)), first + ((key >> 6) & (BUCKETS_PER_PAGE - 1))]
    }

    fn slot_offset(bucket: u64, slot: usize) -> usize {
        (HEADER_BYTES + bucket * BUCKET_BYTES) as usize + slot * SLOT_BYTES
    }

    fn read_slot(&self, bucket: u64, slot: usize) -> (u64, Position) {
        let at = Self::slot_offset(bucket, slot);
        let word = |at: usize| u64::from_le_bytes(self.map[at..at + 8].try_into().expect("8 bytes"));
        (word(at), Position::unpacked(word(at + 8) as i64))
    }

    fn write_slot(&mut self, bucket: u64, slot: usize, key: u64, position: i64) {
        let at = Self::slot_offset(bucket, slot);
        self.map[at..at + 8].copy_from_slice(&key.to_le_bytes());
        self.map[at + 8..at + 16].copy_from_slice(&position.to_le_bytes());
    }

    fn live(&self, key: u64, position: Position) -> bool {
        key != 0 && position.segment >= self.oldest_segment
    }

    /// Where `key` sits, live or stale, and the position it holds.
    fn slot_of(&self, key: u64) -> Option<(u64, usize, Position)> {
        self.buckets_of(key).into_iter().find_map(|bucket| {
            (0..SLOTS_PER_BUCKET).find_map(|slot| {
                let (held, position) = self.read_slot(bucket, slot);
                (held == key).then_some((bucket, slot, position))
            })
        })
    }

    fn find(&self, key: u64) -> Option<Position> {
        if let Some(staged) = self.staged.get(&key) {
            return *staged;
        }
        let (_, _, position) = self.slot_of(key)?;
        self.live(key, position).then_some(position)
    }

    fn put(&mut self, key: u64, position: Position) -> bool {
        let (bucket, slot, displaced) =
            self.slot_of(key).map(|(b, s, _)| (b, s, false)).unwrap_or_else(|| self.free_slot(key));
        self.write_slot(bucket, slot, key, position.packed());
        !displaced
    }

    /// A slot for a new key: a free one in the emptier of its two buckets, else the oldest live
    /// one (true: it is displaced).
    fn free_slot(&self, key: u64) -> (u64, usize, bool) {
        let mut emptiest: Option<(usize, u64, usize)> = None;
        let mut oldest: Option<(Position, u64, usize)> = None;
        for bucket in self.buckets_of(key) {
            let (mut free, mut first_free) = (0, 0);
            for slot in 0..SLOTS_PER_BUCKET {
                let (held, position) = self.read_slot(bucket, slot);
                if self.live(held, position) {
                    if oldest.is_none_or(|(at, ..)| position < at) {
                        oldest = Some((position, bucket, slot));
                    }
                } else {
                    if free == 0 {
                        first_free = slot;
                    }
                    free += 1;
                }
            }
            if free > 0 && emptiest.is_none_or(|(most, ..)| free > most) {
                emptiest = Some((free, bucket, first_free));
            }
        }
        match (emptiest, oldest) {
            (Some((_, bucket, slot)), _) => (bucket, slot, false),
            (None, Some((_, bucket, slot))) => (bucket, slot, true),
            (None, None) => unreachable!("eight slots are either free or live"),
        }
    }

    /// Writes every page out and marks the table clean.
    fn close(&mut self) -> Result<(), PushError> {
        self.map.flush().map_err(|e| PushError::io(&self.path, e))?;
        let facts = self.facts();
        self.write_header(facts, true)
    }
}

impl Drop for RecentLinks {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "the recent-links table was not closed cleanly: it will be rebuilt after a reboot");
        }
    }
}

/// The header of a table of `file_bytes`, if the file is one.
fn read_header(file: &File, file_bytes: u64) -> std::io::Result<Option<Header>> {
    use std::os::unix::fs::FileExt;
    if file.metadata()?.len() != file_bytes {
        return Ok(None);
    }
    let mut bytes = [0u8; HEADER_USED];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(Header::decode(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: u64 = 7;

    fn at(segment: u32, offset: u32) -> Position {
        Position { segment, offset }
    }

    fn open(path: &Path, boot: u64) -> (RecentLinks, Fresh) {
        RecentLinks::open(path, MIN_TABLE_BYTES, boot).unwrap()
    }

    #[test]
    fn records_and_accounts_are_found_moved_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut table, fresh) = open(&dir.path().join("t"), BOOT);
        assert_eq!(fresh, Fresh::New);
        table.set("at://a/c/1", at(0, 0));
        table.set_account("a", at(0, 0));
        assert_eq!(table.write_staged(), 0);
        assert_eq!(table.position_of("at://a/c/1"), Some(at(0, 0)));
        assert_eq!(table.account_position("a"), Some(at(0, 0)));
        assert_eq!(table.position_of("a"), None, "accounts and records are keyed apart");
        table.set("at://a/c/1", at(3, 40));
        assert_eq!(table.position_of("at://a/c/1"), Some(at(3, 40)), "staged changes are seen");
        table.write_staged();
        assert_eq!(table.position_of("at://a/c/1"), Some(at(3, 40)));
        table.remove("at://a/c/1");
        table.write_staged();
        assert_eq!(table.position_of("at://a/c/1"), None);
        assert_eq!(table.account_position("a"), Some(at(0, 0)));
    }

    #[test]
    fn slots_into_forgotten_segments_are_stale_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut table, _) = open(&dir.path().join("t"), BOOT);
        // 64 buckets of four slots: 256 slots, filled with old positions.
        for i in 0..1024 {
            table.set(&format!("at://a/c/{i}"), at(1, i));
            table.write_staged();
        }
        table.forget_before(2);
        assert_eq!(table.position_of("at://a/c/1023"), None);
        // Half as many new records as slots: two choices of bucket place them all.
        for i in 0..128 {
            table.set(&format!("at://b/c/{i}"), at(2, i));
            assert_eq!(table.write_staged(), 0, "stale slots are free");
        }
        let held = (0..128).filter(|i| table.position_of(&format!("at://b/c/{i}")).is_some()).count();
        assert_eq!(held, 128);
    }

    #[test]
    fn a_full_table_lets_its_oldest_go() {
        let dir = tempfile::tempdir().unwrap();
        let (mut table, _) = open(&dir.path().join("t"), BOOT);
        let mut displaced = 0;
        for i in 0..800u32 {
            table.set(&format!("at://a/c/{i}"), at(0, i));
            displaced += table.write_staged() as usize;
        }
        assert!(displaced >= 800 - 256, "{displaced}");
        let held: Vec<u32> = (0..800).filter(|i| table.position_of(&format!("at://a/c/{i}")).is_some()).collect();
        assert!(held.len() <= 256 && held.len() >= 240, "{}", held.len());
        // What gave way is older than what stayed, bucket by bucket: the newest always stay.
        assert!(held.contains(&799) && held.contains(&798));
    }

    #[test]
    fn a_table_is_kept_across_restarts_and_emptied_after_an_unclean_reboot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let facts = Facts { log_through: 42, observed_through: 41 };
        {
            let (mut table, _) = open(&path, BOOT);
            table.set("at://a/c/1", at(0, 9));
            table.write_staged();
            table.set_facts(facts);
        }
        // A clean close is kept on any boot.
        let (table, fresh) = open(&path, BOOT + 1);
        assert_eq!((fresh, table.facts()), (Fresh::Kept, facts));
        assert_eq!(table.position_of("at://a/c/1"), Some(at(0, 9)));
        // A process that died (no close) on the same boot: its pages are the kernel's, kept.
        std::mem::forget(table);
        let (table, fresh) = open(&path, BOOT + 1);
        assert_eq!(fresh, Fresh::Kept);
        assert_eq!(table.position_of("at://a/c/1"), Some(at(0, 9)));
        // The same after a reboot: pages may be lost, so the table starts empty.
        std::mem::forget(table);
        let (table, fresh) = open(&path, BOOT + 2);
        assert_eq!(fresh, Fresh::MachineCrash);
        assert_eq!(table.position_of("at://a/c/1"), None);
        assert_eq!(table.facts().log_through, 0);
        drop(table);
        // Another size is another table.
        let (table, fresh) = RecentLinks::open(&path, MIN_TABLE_BYTES * 2, BOOT + 2).unwrap();
        assert_eq!(fresh, Fresh::New);
        drop(table);
        // A damaged header is no table.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(RecentLinks::open(&path, MIN_TABLE_BYTES * 2, BOOT + 2).unwrap().1, Fresh::New);
    }

    #[test]
    fn an_unknown_boot_never_counts_as_the_same_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::mem::forget(open(&path, 0).0);
        assert_eq!(open(&path, 0).1, Fresh::MachineCrash);
    }
}
