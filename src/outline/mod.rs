//! Outline tables (`outlines.db`): strings (DIDs, collections, record keys, locations) <-> u64 ids.
//!
//! Invariants:
//! - Ids come from sharded sequences, never from a hash: a writer interns with its own `shard`
//!   and each (kind, shard) has its own counter, starting at 1. Id layouts:
//!   - did: `OUTLINED_BIT | shard << 46 | counter`, counter < 2^46, bit 62 always clear;
//!   - rkey: `OUTLINED_BIT | shard << 47 | counter`, counter < 2^47;
//!   - collection, location: `shard << 48 | counter`, counter < 2^48 (collection 0 is `<self>`,
//!     location 0 is unused; neither is ever allocated because counters start at 1).
//! - An exhausted counter is an error, never a wraparound.
//! - A string has at most one id per kind and an id at most one string: a string becomes pending
//!   (pinned in the cache) under the allocator lock, after `intern` looked in the cache and in
//!   the stored strings under that same lock; it stays pinned until its row is stored and, for
//!   a did or rkey, its fingerprint added, so at every instant it is findable in the cache, in
//!   the stored strings, or both (`persist` writes without the allocator lock; `persisting`
//!   keeps persists and imports one at a time). SQLite's unique indexes hold this for ids and for
//!   the strings of the small kinds; the fingerprint table holds it for dids and rkeys (an
//!   import of a string under a second id is refused there).
//! - New strings are pinned in their kind's cache (listed in `Allocator::pending`), never evicted,
//!   until `persist` writes all of them and the advanced counters in one transaction and the
//!   fingerprint table holds them. Only then are they unpinned and may the bounded cache forget
//!   them: a miss of a large kind (did, rkey) is answered by the fingerprint table
//!   (`fingerprints`: one page read), its only index by string, which must hold every stored
//!   row to answer (else it is caught up, or rebuilt, first, or the lookup fails).
//! - Caches are bounded: did and rkey by `OutlineOptions::cache_entries` each, collection and
//!   location (a few thousand strings on the real network) by `SMALL_KIND_CACHE_ENTRIES`, which
//!   in practice holds all of them; they are loaded at open. Pinned strings come on top (at most
//!   `MAX_PENDING`), and a persist evicts back to the bound. The memory pinned strings hold is
//!   kept (`pending_bytes`) for the writer, which counts it in its flush budget.
//! - Lock order: persisting, then allocator, then SQLite connection, then a cache. Cache locks are never held while
//!   taking another lock.
//! - A cache is *complete* while it holds every stored string of its kind: from an open that found
//!   none stored (or loaded them all) until its first eviction or `import_rows` of its kind. A
//!   complete cache answers a miss for `intern` without asking SQLite (a fresh import interns
//!   millions of new strings, each of which would otherwise cost a failed SQLite lookup).
//!
//! Crash semantics: ids allocated but not yet persisted are forgotten after a crash, and the
//! counters resume from their persisted values, so such an id may later be given to another
//! string. That is safe because the engine always calls `persist()` before it commits a flush
//! that refers to the ids: no durable table ever holds a forgotten id. Re-interning a string after
//! a crash may give it a different id than before the crash, which is fine for the same reason.

use cache::Cache;
use fingerprints::{FingerprintError, Fingerprints};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use rusqlite_migration::{M, Migrations};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

mod cache;
pub mod fingerprints;
mod kind;
mod plc;
pub mod range;
#[cfg(test)]
mod tests;

pub use kind::OutlineKind;

/// Cache capacity of the collection and location kinds: large enough to hold every one of them.
pub const SMALL_KIND_CACHE_ENTRIES: usize = 1 << 20;
/// Rows `persist` handles per cache lock (copying values out, unpinning), so that a persist of
/// many strings never keeps `intern` waiting long.
const LOCKED_ROWS: usize = 4096;
/// Most new strings that may wait for `persist`; beyond it `intern` fails until persist runs.
pub const MAX_PENDING: usize = 1 << 22;
/// Memory a new string holds until `persist`, beyond its bytes in the cache's arena: its cache
/// slot, its buckets in the cache's two indexes (at most 3/4 full) and its place in the pending
/// list.
const PENDING_OVERHEAD_BYTES: usize = 72;

/// What a new string of `value` holds until `persist` (see `PENDING_OVERHEAD_BYTES`).
fn pending_bytes_of(value: &str) -> usize {
    cache::kept_len(value) + PENDING_OVERHEAD_BYTES
}

/// Schema versions of `outlines.db`, oldest first. Append only: never edit a released migration.
fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(include_str!("../../migrations/outlines/0001_outlines.sql")),
        M::up(include_str!("../../migrations/outlines/0002_value_index_small_kinds.sql")),
    ])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlineOptions {
    /// Cached strings per large kind (did, rkey), on top of the not-yet-persisted ones.
    pub cache_entries: usize,
    /// Bytes of `outlines.db` SQLite may read through a memory map instead of `pread` (0: none).
    /// With more accounts than the cache holds, the copies `pread` makes are a sixth of an
    /// import's work (BENCHMARKS.md); mapped pages count as the process's (file-backed) RSS.
    pub map_bytes: u64,
}

impl Default for OutlineOptions {
    fn default() -> Self {
        Self { cache_entries: 1 << 20, map_bytes: 0 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutlineError {
    #[error("outlines.db: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("outlines.db migration: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    #[error("creating {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("a {kind} string must be 1..={max} bytes, got {len}")]
    InvalidValue { kind: OutlineKind, len: usize, max: usize },
    #[error("the {kind} sequence of shard {shard} is exhausted")]
    Exhausted { kind: OutlineKind, shard: u16 },
    #[error("{limit} new strings are waiting for persist()")]
    TooManyPending { limit: usize },
    #[error("outlines.db is corrupt: {0}")]
    Corrupt(String),
    #[error("a thread panicked while holding an outlines lock")]
    Poisoned,
    #[error("outlines.fp: {0}")]
    Fingerprints(#[from] FingerprintError),
    #[error("outlines.fp is being caught up by a persist or an import; try again")]
    FingerprintsBehind,
}

/// Everything `intern` and `persist` change: which strings are new and the sequences' next
/// counters. The new strings themselves are pinned in their kind's cache.
#[derive(Debug, Default)]
struct Allocator {
    /// New strings in allocation order: their insertion order in `outlines.db`.
    pending: Vec<(OutlineKind, u64)>,
    /// Next counter of each (kind, shard) used since open (at most 4 * 2^16 entries).
    next_counter: HashMap<(OutlineKind, u16), u64>,
    /// Next counters of the sequences advanced since the last persist: what persist writes.
    advanced: BTreeMap<(OutlineKind, u16), u64>,
}

impl Allocator {
    /// Returns what a failed persist took: its strings go before any interned meanwhile (the
    /// insertion order stays the allocation order), and each sequence keeps its larger counter.
    fn put_back(&mut self, mut pending: Vec<(OutlineKind, u64)>, advanced: BTreeMap<(OutlineKind, u16), u64>) {
        pending.append(&mut self.pending);
        self.pending = pending;
        for (sequence, next) in advanced {
            let counter = self.advanced.entry(sequence).or_insert(next);
            *counter = (*counter).max(next);
        }
    }
}

/// The outline tables: a SQLite file, a bounded cache per kind, and the pending new strings.
#[derive(Debug)]
pub struct Outlines {
    db: Mutex<Connection>,
    /// `outlines.db`: the fingerprint table and a large catch-up's spill files go beside it.
    db_path: PathBuf,
    /// Held by the one `persist` or `import_rows` running at a time (taken before the others).
    persisting: Mutex<()>,
    allocator: Mutex<Allocator>,
    /// The memory the pending strings hold (`pending_bytes_of` each), changed under the
    /// allocator lock with the list and read without it (the writer asks after every event).
    pending_bytes: AtomicUsize,
    /// The part of them a flush has claimed (`claim_pending`): its persist will write them.
    claimed_bytes: AtomicUsize,
    caches: [RwLock<Cache>; 4],
    /// The ids of the stored did and rkey strings by fingerprint: the only index by string of
    /// those kinds, for the strings the caches forgot. It answers only while
    /// `fingerprints_current`; else it is caught up (or rebuilt) first.
    fingerprints: Fingerprints,
    /// Set when a catch-up left `fingerprints` holding every stored row of its kinds; cleared
    /// when one fails or a lookup finds a damaged page. Rows are stored only by `persist` and
    /// `import_rows`, which catch up before the strings can be missed (see `catch_up_fingerprints`).
    fingerprints_current: AtomicBool,
    /// Times `fingerprints` was emptied and rebuilt from `outlines.db` since open (a damaged page).
    fingerprint_rebuilds: AtomicU64,
    /// Strings `persist` stored whose fingerprints it could not add: still pinned (findable in
    /// the cache), unpinned by the next persist that catches the table up.
    stored_pinned: Mutex<Vec<(OutlineKind, u64)>>,
}

impl Outlines {
    /// Opens (creating if needed) `outlines.db`, applies migrations, loads collections and locations.
    pub fn open(path: &Path, opts: OutlineOptions) -> Result<Self, OutlineError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| OutlineError::Io { path: dir.to_owned(), source })?;
        }
        let mut conn = Connection::open(path)?;
        configure(&conn, opts.map_bytes)?;
        migrations().to_latest(&mut conn)?;
        let caches = OutlineKind::ALL.map(|kind| {
            RwLock::new(Cache::new(if kind.is_large() { opts.cache_entries } else { SMALL_KIND_CACHE_ENTRIES }))
        });
        let (db, persisting, allocator) = (Mutex::new(conn), Mutex::new(()), Mutex::default());
        let (pending_bytes, claimed_bytes) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let fingerprints = Fingerprints::open(path)?;
        let (fingerprints_current, fingerprint_rebuilds) = (AtomicBool::new(false), AtomicU64::new(0));
        let stored_pinned = Mutex::default();
        let outlines = Self {
            db,
            db_path: path.to_owned(),
            persisting,
            allocator,
            pending_bytes,
            claimed_bytes,
            caches,
            fingerprints,
            fingerprints_current,
            fingerprint_rebuilds,
            stored_pinned,
        };
        outlines.catch_up_fingerprints()?;
        outlines.preload(OutlineKind::Collection)?;
        outlines.preload(OutlineKind::Location)?;
        outlines.mark_complete_if_empty(OutlineKind::Did)?;
        outlines.mark_complete_if_empty(OutlineKind::Rkey)?;
        Ok(outlines)
    }

    /// The id of `value`, if it has one. Never allocates: for queries.
    pub fn lookup(&self, kind: OutlineKind, value: &str) -> Result<Option<u64>, OutlineError> {
        if check_value(kind, value).is_err() {
            return Ok(None); // a string that could never be interned has no id
        }
        if let Some(id) = self.cached_id(kind, value)? {
            return Ok(Some(id)); // stored and cached, or new and pinned
        }
        let stored = self.stored_id(kind, value)?;
        if let Some(id) = stored {
            self.remember(kind, id, value)?;
        }
        Ok(stored)
    }

    /// The id of `value`, allocating one from sequence (kind, `shard`) if it has none yet. A new id
    /// is pending (forgotten by a crash) until `persist`.
    pub fn intern(&self, kind: OutlineKind, value: &str, shard: u16) -> Result<u64, OutlineError> {
        check_value(kind, value)?;
        if let Some(id) = self.cached_id(kind, value)? {
            return Ok(id);
        }
        let mut allocator = self.lock_allocator()?;
        if let Some(id) = self.known_id(kind, value)? {
            return Ok(id);
        }
        if allocator.pending.len() >= MAX_PENDING {
            return Err(OutlineError::TooManyPending { limit: MAX_PENDING });
        }
        let id = self.allocate(&mut allocator, kind, shard)?;
        write(&self.caches[kind.index()])?.insert_pinned(id, value);
        allocator.pending.push((kind, id));
        self.pending_bytes.fetch_add(pending_bytes_of(value), Ordering::Relaxed);
        Ok(id)
    }

    /// The string of `id`, if it has one (an id outside the kind's layout has none).
    pub fn resolve(&self, kind: OutlineKind, id: u64) -> Result<Option<Arc<str>>, OutlineError> {
        if kind.layout().split(id).is_none() {
            return Ok(None);
        }
        if let Some(value) = read(&self.caches[kind.index()])?.value_of(id) {
            return Ok(Some(value)); // stored and cached, or new and pinned
        }
        let stored = self.stored_value(kind, id)?;
        if let Some(value) = &stored {
            self.remember(kind, id, value)?;
        }
        Ok(stored)
    }

    /// `resolve` of many ids of one kind, borrowing the strings: `found(i, value)` once for each
    /// `ids[i]`, the cached ones under one read lock, then the others (read from the database and
    /// cached), so a page takes one lock per kind instead of one per link.
    pub fn resolve_each(
        &self,
        kind: OutlineKind,
        ids: &[u64],
        mut found: impl FnMut(usize, Option<&str>),
    ) -> Result<(), OutlineError> {
        let mut missed = Vec::new();
        {
            let cache = read(&self.caches[kind.index()])?;
            for (i, &id) in ids.iter().enumerate() {
                match cache.get(id) {
                    Some(value) => found(i, Some(&value)),
                    None => missed.push(i),
                }
            }
        }
        for i in missed {
            found(i, self.resolve(kind, ids[i])?.as_deref());
        }
        Ok(())
    }

    /// Writes every pending string and the advanced counters in one transaction and adds their
    /// fingerprints; returns how many strings it wrote. If the write fails, nothing is written and
    /// everything stays pending; if adding the fingerprints fails, the strings are stored but stay
    /// pinned until a later persist adds them. The strings
    /// stay pinned in the cache while they are written, so `intern` goes on meanwhile (finding
    /// them there); only taking the list and unpinning need the allocator.
    pub fn persist(&self) -> Result<usize, OutlineError> {
        let _one_at_a_time = self.persisting.lock().map_err(|_| OutlineError::Poisoned)?;
        let (pending, pending_bytes, advanced) = {
            let mut allocator = self.lock_allocator()?;
            self.claimed_bytes.store(0, Ordering::Relaxed);
            let pending_bytes = self.pending_bytes.swap(0, Ordering::Relaxed);
            (std::mem::take(&mut allocator.pending), pending_bytes, std::mem::take(&mut allocator.advanced))
        };
        let stranded = !self.stored_pinned.lock().map_err(|_| OutlineError::Poisoned)?.is_empty();
        if pending.is_empty() && advanced.is_empty() && !stranded {
            return Ok(0);
        }
        if let Err(error) = self.write_pending(&pending, &advanced) {
            self.lock_allocator()?.put_back(pending, advanced);
            self.pending_bytes.fetch_add(pending_bytes, Ordering::Relaxed);
            return Err(error);
        }
        // Before unpinning: a stored string must stay findable, in the cache or by fingerprint.
        let mut stored = std::mem::take(&mut *self.stored_pinned.lock().map_err(|_| OutlineError::Poisoned)?);
        stored.extend_from_slice(&pending);
        if let Err(error) = self.catch_up_fingerprints() {
            *self.stored_pinned.lock().map_err(|_| OutlineError::Poisoned)? = stored;
            return Err(error);
        }
        for chunk in stored.chunks(LOCKED_ROWS) {
            for kind in OutlineKind::ALL {
                let mut cache = write(&self.caches[kind.index()])?;
                chunk.iter().filter(|(k, _)| *k == kind).for_each(|(_, id)| cache.unpin(*id));
            }
        }
        for cache in &self.caches {
            write(cache)?.shrink_to_capacity();
        }
        Ok(pending.len())
    }

    /// The values of pinned strings, copied out under one read lock per kind (not one per row,
    /// and not for the whole persist: `intern` write-locks the cache for every new string).
    fn copy_pinned(&self, rows: &[(OutlineKind, u64)]) -> Result<(String, Vec<Range<usize>>), OutlineError> {
        let (mut text, mut spans) = (String::new(), vec![0..0; rows.len()]);
        for kind in OutlineKind::ALL {
            let cache = read(&self.caches[kind.index()])?;
            for (span, (_, id)) in spans.iter_mut().zip(rows).filter(|(_, (k, _))| *k == kind) {
                let start = text.len();
                text.push_str(&cache.pinned_value(*id).expect("a pending string is pinned in its cache"));
                *span = start..text.len();
            }
        }
        Ok((text, spans))
    }

    /// The largest insertion sequence number stored (0 when empty).
    pub fn max_seq(&self) -> Result<i64, OutlineError> {
        let db = self.lock_db()?;
        Ok(db.query_row("SELECT coalesce(max(seq), 0) FROM outlines", [], |row| row.get(0))?)
    }

    /// Stored rows of `kind` with `after < seq <= through`, in insertion order, as
    /// `(seq, id, value)`: at most `max_rows`, and no more after the encoded size of the ones
    /// taken passes `max_bytes` (at least one row is taken). A published outline range is one
    /// such chunk, so publishing any number of new strings needs bounded memory.
    pub fn rows_between(
        &self,
        kind: OutlineKind,
        after: i64,
        through: i64,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<Vec<(i64, u64, String)>, OutlineError> {
        let db = self.lock_db()?;
        // NOT INDEXED: a range of the rowid (`seq`), read in order. SQLite's own choice, the
        // (kind, id) index, read and sorted every row of the kind ever stored on each call.
        let mut query = db.prepare_cached(
            "SELECT seq, id, value FROM outlines NOT INDEXED
             WHERE kind = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4",
        )?;
        let mut rows = query.query(params![kind.code(), after, through, max_rows as i64])?;
        let (mut chunk, mut bytes) = (Vec::new(), 0usize);
        while let Some(row) = rows.next()? {
            let value: String = row.get(2)?;
            bytes += range::ROW_OVERHEAD + value.len();
            chunk.push((row.get::<_, i64>(0)?, row.get::<_, i64>(1)? as u64, value));
            if bytes >= max_bytes {
                break;
            }
        }
        Ok(chunk)
    }

    /// Adds rows another machine published (a restore, a replica), keeping their ids and moving
    /// each sequence past them, in one transaction. Rows already present are skipped; a row that
    /// contradicts a stored one (same id or value, other partner) is an error.
    pub fn import_rows(&self, kind: OutlineKind, rows: &[(u64, String)]) -> Result<usize, OutlineError> {
        let layout = kind.layout();
        let mut next: BTreeMap<u16, u64> = BTreeMap::new();
        for (id, value) in rows {
            check_value(kind, value)?;
            let (shard, counter) =
                layout.split(*id).ok_or_else(|| OutlineError::Corrupt(format!("{kind} id {id:#x} fits no layout")))?;
            let entry = next.entry(shard).or_insert(1);
            *entry = (*entry).max(counter + 1);
        }
        let _one_at_a_time = self.persisting.lock().map_err(|_| OutlineError::Poisoned)?;
        let mut allocator = self.lock_allocator()?; // no interning while counters move
        write(&self.caches[kind.index()])?.complete = false; // the rows go to SQLite only
        allocator.next_counter.retain(|(k, _), _| *k != kind);
        if kind.is_large() {
            self.check_fingerprints_of(kind, rows)?;
        }
        let added = {
            let mut db = self.lock_db()?;
            // A range is up to 131,072 rows, each in one or two indexes: with SQLite's default 2 MiB of
            // pages most inserts spilled pages to the WAL and read them back.
            db.pragma_update(None, "cache_size", -IMPORT_CACHE_KIB)?;
            let added = import_rows_into(&mut db, kind, rows, &next);
            db.pragma_update(None, "cache_size", -DEFAULT_CACHE_KIB)?;
            added?
        };
        self.catch_up_fingerprints()?; // before interning may look for the rows
        Ok(added)
    }

    /// Refuses rows of a large kind whose string is stored, pending, or given twice, with another
    /// id: its only index by string is the fingerprint table (caught up, or rebuilt, first), and
    /// a pending string is in the cache. Runs under the persisting and allocator locks.
    fn check_fingerprints_of(&self, kind: OutlineKind, rows: &[(u64, String)]) -> Result<(), OutlineError> {
        let broken = self.fingerprints.refuse_if_broken().is_err();
        if broken || !self.fingerprints_current.load(Ordering::Acquire) {
            self.catch_up_fingerprints()?;
        }
        let mut given = HashMap::with_capacity(rows.len());
        for (id, value) in rows {
            let fingerprint = self.fingerprints.fingerprint(kind.code(), value);
            let cached = read(&self.caches[kind.index()])?.id_of(value); // released at once
            let other = match given.insert(fingerprint, *id).or(cached) {
                Some(known) => Some(known),
                None => self.fingerprints.find(fingerprint)?,
            };
            if other.is_some_and(|other| other != *id) {
                return Err(OutlineError::Corrupt(format!("{kind} {value:?} would have two ids")));
            }
        }
        Ok(())
    }

    /// Makes every row stored from now on get an insertion sequence number above `through`, the
    /// highest one a followed manifest published: a restored writer's new rows must fall after the
    /// published ranges, whatever numbers the imported rows got here.
    pub fn reserve_seq_through(&self, through: i64) -> Result<(), OutlineError> {
        let mut db = self.lock_db()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // SQLite keeps an AUTOINCREMENT table's high-water mark in `sqlite_sequence` (no row until
        // the first insert); its documentation allows ordinary updates of it.
        let raised = tx.execute("UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'outlines'", [through])?;
        if raised == 0 {
            tx.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('outlines', ?1)", [through])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Times the fingerprint table was emptied and rebuilt since open (it met a damaged page).
    pub fn fingerprint_rebuilds(&self) -> u64 {
        self.fingerprint_rebuilds.load(Ordering::Relaxed)
    }

    /// The memory the caches of every kind take (pinned strings included).
    pub fn cache_memory_bytes(&self) -> usize {
        self.caches.iter().map(|cache| read(cache).map_or(0, |cache| cache.memory_bytes())).sum()
    }

    /// Strings interned since the last successful `persist`.
    pub fn pending(&self) -> usize {
        self.allocator.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pending.len()
    }

    /// The memory the strings interned since the last successful `persist` hold until it (an
    /// estimate from their lengths), which a flush counts with the memtables it writes.
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes.load(Ordering::Relaxed)
    }

    /// Marks the strings pending now as a flush's, which persists them: the writer's budget for
    /// the next flush counts only those interned after (`unclaimed_pending_bytes`), as it counts
    /// only the memtables after the freeze.
    pub fn claim_pending(&self) {
        self.claimed_bytes.store(self.pending_bytes(), Ordering::Relaxed);
    }

    /// `pending_bytes` less what a flush claimed and has not persisted yet.
    pub fn unclaimed_pending_bytes(&self) -> usize {
        self.pending_bytes().saturating_sub(self.claimed_bytes.load(Ordering::Relaxed))
    }

    fn write_pending(
        &self,
        pending: &[(OutlineKind, u64)],
        advanced: &BTreeMap<(OutlineKind, u16), u64>,
    ) -> Result<(), OutlineError> {
        let mut db = self.lock_db()?;
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut insert = tx.prepare_cached("INSERT INTO outlines (kind, id, value) VALUES (?1, ?2, ?3)")?;
            for chunk in pending.chunks(LOCKED_ROWS) {
                let (text, spans) = self.copy_pinned(chunk)?;
                for ((kind, id), span) in chunk.iter().zip(spans) {
                    insert.execute(params![kind.code(), *id as i64, &text[span]])?;
                }
            }
            let mut advance = tx.prepare_cached(
                "INSERT INTO sequences (kind, shard, next) VALUES (?1, ?2, ?3)
                 ON CONFLICT (kind, shard) DO UPDATE SET next = excluded.next",
            )?;
            for ((kind, shard), next) in advanced {
                advance.execute(params![kind.code(), shard, *next as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Takes the next counter of (kind, shard), loading it from SQLite on first use.
    fn allocate(&self, allocator: &mut Allocator, kind: OutlineKind, shard: u16) -> Result<u64, OutlineError> {
        let counter = match allocator.next_counter.get(&(kind, shard)) {
            Some(next) => *next,
            None => self.stored_next_counter(kind, shard)?,
        };
        let id = kind.layout().compose(shard, counter).ok_or(OutlineError::Exhausted { kind, shard })?;
        allocator.next_counter.insert((kind, shard), counter + 1);
        allocator.advanced.insert((kind, shard), counter + 1);
        Ok(id)
    }

    fn stored_next_counter(&self, kind: OutlineKind, shard: u16) -> Result<u64, OutlineError> {
        let db = self.lock_db()?;
        let mut query = db.prepare_cached("SELECT next FROM sequences WHERE kind = ?1 AND shard = ?2")?;
        let next: Option<i64> = query.query_row(params![kind.code(), shard], |row| row.get(0)).optional()?;
        match next {
            None => Ok(1),
            Some(next) if next >= 1 => Ok(next as u64),
            Some(next) => Err(OutlineError::Corrupt(format!("{kind} shard {shard} has next counter {next}"))),
        }
    }

    /// Adds to `fingerprints` the did and rkey rows stored after what it covers and marks it
    /// current; a table met damaged is emptied and rebuilt from `outlines.db`. Runs at open and
    /// under the persisting lock: after each write of rows, before `persist` unpins the strings it
    /// wrote and before `import_rows` lets interning go on, so a stored string is always in the
    /// cache or in a current table. On error the table is not current and lookups of its kinds
    /// fail until a catch-up succeeds.
    fn catch_up_fingerprints(&self) -> Result<(), OutlineError> {
        let mut caught_up = self.add_uncovered_rows();
        if let Err(OutlineError::Fingerprints(FingerprintError::Corrupt { .. } | FingerprintError::Broken)) = caught_up
        {
            tracing::warn!("the fingerprint table is damaged: rebuilding it from outlines.db");
            // Before `clear`: a lookup must not take the emptied table for a current one.
            self.fingerprints_current.store(false, Ordering::Release);
            self.fingerprint_rebuilds.fetch_add(1, Ordering::Relaxed);
            caught_up = self.fingerprints.clear().map_err(OutlineError::from).and_then(|()| self.add_uncovered_rows());
        }
        if let Err(error) = &caught_up {
            tracing::error!(%error, "the fingerprint table is behind outlines.db: dids and rkeys cannot be looked up");
        }
        self.fingerprints_current.store(caught_up.is_ok(), Ordering::Release);
        caught_up
    }

    /// Adds the fingerprints of the did and rkey rows stored after the table's `covered_seq`:
    /// in one step when they are at most `CATCH_UP_ROWS`, else spread over spill files first.
    fn add_uncovered_rows(&self) -> Result<(), OutlineError> {
        self.fingerprints.refuse_if_broken()?;
        let after = self.fingerprints.covered_seq();
        let through = self.max_seq()?;
        if through <= after {
            return Ok(());
        }
        if through - after <= CATCH_UP_ROWS as i64 {
            let mut rows = Vec::new();
            self.for_each_large_row(after, through, |row| rows.push(row))?;
            return Ok(self.fingerprints.add(rows, through)?);
        }
        self.add_rows_by_part(after, through)
    }

    /// Adds many rows in bounded memory: one scan of `outlines.db` per round writes each row's
    /// fingerprint to the spill file of its part (the top bits of the fingerprint, so parts lead
    /// to disjoint pages), then each part, about `CATCH_UP_ROWS` rows, is one `add` that writes
    /// each of its pages once. Only the last add moves `covered_seq`: a crash before it leaves
    /// the table covering what it did, and a later catch-up adds the same rows again, which
    /// `add` skips.
    fn add_rows_by_part(&self, after: i64, through: i64) -> Result<(), OutlineError> {
        let parts = ((through - after) as usize).div_ceil(CATCH_UP_ROWS).next_power_of_two();
        let bits = parts.trailing_zeros();
        let spill_dir = self.db_path.parent().unwrap_or(Path::new("."));
        let spill_error = |source| OutlineError::Io { path: spill_dir.to_owned(), source };
        for round in (0..parts).step_by(SPILL_FILES) {
            let mut spills = (0..SPILL_FILES.min(parts))
                .map(|_| tempfile::tempfile_in(spill_dir).map(BufWriter::new))
                .collect::<Result<Vec<_>, _>>()
                .map_err(spill_error)?;
            let mut spilled = Ok(());
            self.for_each_large_row(after, through, |(fingerprint, id)| {
                let part = part_of(fingerprint, bits);
                if spilled.is_ok() && (round..round + spills.len()).contains(&part) {
                    let spill = &mut spills[part - round];
                    spilled =
                        spill.write_all(&fingerprint.to_be_bytes()).and_then(|()| spill.write_all(&id.to_be_bytes()));
                }
            })?;
            spilled.map_err(spill_error)?;
            for (index, spill) in spills.into_iter().enumerate() {
                let rows = read_spill(spill).map_err(spill_error)?;
                let last = round + index + 1 == parts;
                self.fingerprints.add(rows, if last { through } else { after })?;
            }
        }
        Ok(())
    }

    /// Calls `each` with the fingerprint and id of every did and rkey row with
    /// `after < seq <= through`, in insertion order.
    fn for_each_large_row(
        &self,
        after: i64,
        through: i64,
        mut each: impl FnMut(fingerprints::Row),
    ) -> Result<(), OutlineError> {
        let db = self.lock_db()?;
        // NOT INDEXED: a range of the rowid (`seq`), not a search of the (kind, ...) indexes.
        let mut query = db.prepare_cached(
            "SELECT kind, id, value FROM outlines NOT INDEXED WHERE seq > ?1 AND seq <= ?2 AND kind IN (?3, ?4) ORDER BY seq",
        )?;
        let large = [OutlineKind::Did.code(), OutlineKind::Rkey.code()];
        let mut found = query.query(params![after, through, large[0], large[1]])?;
        while let Some(row) = found.next()? {
            let value = row.get_ref(2)?.as_str().map_err(|error| OutlineError::Corrupt(error.to_string()))?;
            let kind = row.get::<_, u8>(0)?;
            each((self.fingerprints.fingerprint(kind, value), row.get::<_, i64>(1)? as u64));
        }
        Ok(())
    }

    /// The id stored for `value`: by fingerprint for a large kind, else from SQLite's index.
    fn stored_id(&self, kind: OutlineKind, value: &str) -> Result<Option<u64>, OutlineError> {
        if kind.is_large() {
            return self.id_by_fingerprint(kind, value);
        }
        let db = self.lock_db()?;
        let mut query =
            db.prepare_cached("SELECT id FROM outlines WHERE kind = ?1 AND kind IN (2, 4) AND value = ?2")?;
        let id: Option<i64> = query.query_row(params![kind.code(), value], |row| row.get(0)).optional()?;
        Ok(id.map(|id| id as u64))
    }

    /// The id of a did or rkey from the fingerprint table. A table that is not current (or
    /// meets a damaged page now) is caught up or rebuilt first, unless a persist or import is
    /// running, which does that itself: then the lookup fails rather than answer from a table
    /// that may miss the string.
    fn id_by_fingerprint(&self, kind: OutlineKind, value: &str) -> Result<Option<u64>, OutlineError> {
        let fingerprint = self.fingerprints.fingerprint(kind.code(), value);
        if self.fingerprints_current.load(Ordering::Acquire) {
            match self.fingerprints.find(fingerprint) {
                Ok(id) => return Ok(id),
                Err(error) => {
                    self.fingerprints_current.store(false, Ordering::Release);
                    tracing::warn!(%error, "the fingerprint table failed a lookup");
                }
            }
        }
        // try_lock: the caller may hold the allocator lock, which comes after this one.
        let Ok(_one_at_a_time) = self.persisting.try_lock() else {
            return Err(OutlineError::FingerprintsBehind);
        };
        self.catch_up_fingerprints()?;
        Ok(self.fingerprints.find(fingerprint)?)
    }

    fn stored_value(&self, kind: OutlineKind, id: u64) -> Result<Option<Arc<str>>, OutlineError> {
        let db = self.lock_db()?;
        let mut query = db.prepare_cached("SELECT value FROM outlines WHERE kind = ?1 AND id = ?2")?;
        let value: Option<String> = query.query_row(params![kind.code(), id as i64], |row| row.get(0)).optional()?;
        Ok(value.map(Arc::from))
    }

    /// Fills the cache of `kind` with its first strings, up to the cache's capacity.
    fn preload(&self, kind: OutlineKind) -> Result<(), OutlineError> {
        let mut cache = write(&self.caches[kind.index()])?;
        let db = self.lock_db()?;
        let mut query = db.prepare("SELECT id, value FROM outlines WHERE kind = ?1 ORDER BY seq LIMIT ?2")?;
        let rows = query.query_map(params![kind.code(), cache.capacity() as i64], |row| {
            Ok((row.get::<_, i64>(0)? as u64, row.get::<_, String>(1)?))
        })?;
        for row in rows {
            let (id, value) = row?;
            cache.insert(id, &value);
        }
        Ok(())
    }

    /// Marks the cache of `kind` complete when outlines.db stores no string of that kind.
    fn mark_complete_if_empty(&self, kind: OutlineKind) -> Result<(), OutlineError> {
        let any: bool = self.lock_db()?.query_row(
            "SELECT EXISTS (SELECT 1 FROM outlines WHERE kind = ?1)",
            [kind.code()],
            |row| row.get(0),
        )?;
        let mut cache = write(&self.caches[kind.index()])?;
        cache.complete = !any && cache.len() == 0;
        Ok(())
    }

    /// The id `value` already has, looked up under the allocator lock after a cache miss: the
    /// cache again (another writer may have just pinned it; a miss in a complete cache means
    /// none), else the stored strings (`stored_id`), remembering what it finds. Nobody can
    /// allocate `value` meanwhile, a string a persist is writing is still pinned until the
    /// fingerprint table holds it, and an import cannot run (it takes the allocator lock).
    fn known_id(&self, kind: OutlineKind, value: &str) -> Result<Option<u64>, OutlineError> {
        {
            let cache = read(&self.caches[kind.index()])?;
            if let Some(id) = cache.id_of(value) {
                return Ok(Some(id));
            }
            if cache.complete {
                return Ok(None);
            }
        }
        let stored = self.stored_id(kind, value)?;
        if let Some(id) = stored {
            self.remember(kind, id, value)?;
        }
        Ok(stored)
    }

    /// Brings what interning `values` of `kind` will read of the cache into the CPU's caches,
    /// all at once (`Cache::warm`): for a batch of events, whose strings are then interned one
    /// at a time. Changes nothing.
    pub fn warm<'v>(&self, kind: OutlineKind, values: impl Iterator<Item = &'v str>) -> Result<(), OutlineError> {
        let mut hashes = Vec::new();
        read(&self.caches[kind.index()])?.warm(values, &mut hashes);
        Ok(())
    }

    fn cached_id(&self, kind: OutlineKind, value: &str) -> Result<Option<u64>, OutlineError> {
        Ok(read(&self.caches[kind.index()])?.id_of(value))
    }

    fn remember(&self, kind: OutlineKind, id: u64, value: &str) -> Result<(), OutlineError> {
        write(&self.caches[kind.index()])?.insert(id, value);
        Ok(())
    }

    fn lock_db(&self) -> Result<MutexGuard<'_, Connection>, OutlineError> {
        self.db.lock().map_err(|_| OutlineError::Poisoned)
    }

    fn lock_allocator(&self) -> Result<MutexGuard<'_, Allocator>, OutlineError> {
        self.allocator.lock().map_err(|_| OutlineError::Poisoned)
    }
}

/// WAL in exclusive locking mode: one connection per data directory (the index's) ever opens
/// the file, so SQLite need not take and drop file locks around every statement (with more
/// accounts than the outline cache holds, the writer's lookups spent an eighth of their time in
/// `fcntl`; BENCHMARKS.md). Another process opening `outlines.db` meanwhile waits, then fails.
/// And `synchronous = FULL`: a commit is on disk when `persist` returns. NORMAL would not do
/// here even though `persist` always precedes the catalog's commit: with NORMAL a power loss can
/// drop the last outline commit while the later, fsynced commit of `state.db` (a different file,
/// whose fsync does not order writes to this one) survives and refers to the lost ids. Persist runs
/// once per flush, so the extra fsync costs nothing that matters. `map_bytes` of the file are read
/// through a memory map (`OutlineOptions::map_bytes`).
fn configure(conn: &Connection, map_bytes: u64) -> Result<(), OutlineError> {
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
        return Err(OutlineError::Corrupt(format!("cannot switch outlines.db to WAL (mode is {mode})")));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    conn.pragma_update(None, "mmap_size", map_bytes.min(i64::MAX as u64) as i64)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(())
}

fn check_value(kind: OutlineKind, value: &str) -> Result<(), OutlineError> {
    let max = kind.max_len();
    if value.is_empty() || value.len() > max {
        return Err(OutlineError::InvalidValue { kind, len: value.len(), max });
    }
    Ok(())
}

fn read<T>(lock: &RwLock<T>) -> Result<std::sync::RwLockReadGuard<'_, T>, OutlineError> {
    lock.read().map_err(|_| OutlineError::Poisoned)
}

fn write<T>(lock: &RwLock<T>) -> Result<std::sync::RwLockWriteGuard<'_, T>, OutlineError> {
    lock.write().map_err(|_| OutlineError::Poisoned)
}

/// Rows a catch-up of the fingerprint table adds at a time (24 bytes each in memory), and about
/// the rows of each part of a larger one.
const CATCH_UP_ROWS: usize = if cfg!(test) { 64 } else { 1 << 20 };
/// Spill files (open descriptors, with a 8 KiB buffer each) of one scan of a large catch-up:
/// a catch-up of more parts scans `outlines.db` once per this many.
const SPILL_FILES: usize = if cfg!(test) { 4 } else { 64 };

/// The part of `fingerprint` among `2^bits`: its top bits.
fn part_of(fingerprint: u128, bits: u32) -> usize {
    if bits == 0 { 0 } else { (fingerprint >> (128 - bits)) as usize }
}

/// The rows a spill file holds (a fingerprint u128 BE and an id u64 BE each), in any order.
fn read_spill(spill: BufWriter<File>) -> std::io::Result<Vec<fingerprints::Row>> {
    let mut file = spill.into_inner().map_err(std::io::IntoInnerError::into_error)?;
    let len = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::new(file);
    let mut rows = Vec::with_capacity((len / 24) as usize);
    let mut row = [0u8; 24];
    for _ in 0..len / 24 {
        reader.read_exact(&mut row)?;
        let fingerprint = u128::from_be_bytes(row[..16].try_into().expect("16 bytes"));
        rows.push((fingerprint, u64::from_be_bytes(row[16..].try_into().expect("8 bytes"))));
    }
    Ok(rows)
}

/// SQLite page cache of outlines.db while importing ranges (a restore, a replica), and otherwise.
const IMPORT_CACHE_KIB: i64 = 64 << 10;
const DEFAULT_CACHE_KIB: i64 = 2000;

/// `import_rows`' transaction.
fn import_rows_into(
    db: &mut Connection,
    kind: OutlineKind,
    rows: &[(u64, String)],
    next: &BTreeMap<u16, u64>,
) -> Result<usize, OutlineError> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut added = 0;
    {
        // Not `INSERT OR IGNORE`: with AUTOINCREMENT an ignored row still uses up a sequence
        // number, and the gaps would let a restored writer's own rows fall inside ranges that
        // were already published (and so never be published).
        let mut insert = tx.prepare_cached(
            "INSERT INTO outlines (kind, id, value) SELECT ?1, ?2, ?3
             WHERE NOT EXISTS (SELECT 1 FROM outlines WHERE kind = ?1 AND id = ?2)",
        )?;
        let mut stored = tx.prepare_cached("SELECT value FROM outlines WHERE kind = ?1 AND id = ?2")?;
        for (id, value) in rows {
            let inserted = insert.execute(params![kind.code(), *id as i64, value])?;
            added += inserted;
            if inserted == 1 {
                continue; // stored now, as given (a clash on the value fails the insert)
            }
            let present: Option<String> =
                stored.query_row(params![kind.code(), *id as i64], |r| r.get(0)).optional()?;
            if present.as_deref() != Some(value.as_str()) {
                return Err(OutlineError::Corrupt(format!("{kind} id {id:#x} is stored with another value")));
            }
        }
        let mut advance = tx.prepare_cached(
            "INSERT INTO sequences (kind, shard, next) VALUES (?1, ?2, ?3)
             ON CONFLICT (kind, shard) DO UPDATE SET next = max(next, excluded.next)",
        )?;
        for (shard, counter) in next {
            advance.execute(params![kind.code(), shard, *counter as i64])?;
        }
    }
    tx.commit()?;
    Ok(added)
}
