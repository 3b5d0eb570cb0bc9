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
//!   SQLite under that same lock; it stays pinned until after the transaction that stores it, so
//!   at every instant it is in the cache, in SQLite, or both (`persist` writes without the
//!   allocator lock; `persisting` keeps persists and imports one at a time).
//! - New strings are pinned in their kind's cache (listed in `Allocator::pending`), never evicted,
//!   until `persist` writes all of them and the advanced counters in one transaction. Only then
//!   are they unpinned and may the bounded cache forget them (a miss falls back to SQLite).
//! - Caches are bounded: did and rkey by `OutlineOptions::cache_entries` each, collection and
//!   location (a few thousand strings on the real network) by `SMALL_KIND_CACHE_ENTRIES`, which
//!   in practice holds all of them; they are loaded at open. Pinned strings come on top (at most
//!   `MAX_PENDING`), and a persist evicts back to the bound.
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

use crate::model::ids::OUTLINED_BIT;
use cache::Cache;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use rusqlite_migration::{M, Migrations};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

mod cache;

/// Cache capacity of the collection and location kinds: large enough to hold every one of them.
pub const SMALL_KIND_CACHE_ENTRIES: usize = 1 << 20;
/// Rows `persist` handles per cache lock (copying values out, unpinning), so that a persist of
/// many strings never keeps `intern` waiting long.
const LOCKED_ROWS: usize = 4096;
/// Most new strings that may wait for `persist`; beyond it `intern` fails until persist runs.
pub const MAX_PENDING: usize = 1 << 22;

/// Schema versions of `outlines.db`, oldest first. Append only: never edit a released migration.
fn migrations() -> Migrations<'static> {
    Migrations::new(vec![M::up(include_str!("../migrations/outlines/0001_outlines.sql"))])
}

/// What an outlined string is. The codes and names are stored and published: never change them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutlineKind {
    Did,
    Collection,
    Rkey,
    Location,
}

impl OutlineKind {
    pub const ALL: [OutlineKind; 4] =
        [OutlineKind::Did, OutlineKind::Collection, OutlineKind::Rkey, OutlineKind::Location];

    pub const fn code(self) -> u8 {
        match self {
            OutlineKind::Did => 1,
            OutlineKind::Collection => 2,
            OutlineKind::Rkey => 3,
            OutlineKind::Location => 4,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.code() == code)
    }

    pub const fn name(self) -> &'static str {
        match self {
            OutlineKind::Did => "did",
            OutlineKind::Collection => "collection",
            OutlineKind::Rkey => "rkey",
            OutlineKind::Location => "location",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Longest string of this kind, in bytes: the atproto limits for DIDs (2 KiB), NSIDs (317)
    /// and record keys (512); locations are bounded by the extractor's depth limit.
    pub const fn max_len(self) -> usize {
        match self {
            OutlineKind::Did => 2048,
            OutlineKind::Collection => 317,
            OutlineKind::Rkey => 512,
            OutlineKind::Location => 2048,
        }
    }

    const fn index(self) -> usize {
        self.code() as usize - 1
    }

    const fn layout(self) -> IdLayout {
        match self {
            OutlineKind::Did => IdLayout { tag: OUTLINED_BIT, shard_shift: 46 },
            OutlineKind::Rkey => IdLayout { tag: OUTLINED_BIT, shard_shift: 47 },
            OutlineKind::Collection | OutlineKind::Location => IdLayout { tag: 0, shard_shift: 48 },
        }
    }
}

impl fmt::Display for OutlineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `tag | shard << shard_shift | counter`: the 16-bit shard sits right below the tag bits, the
/// counter fills the bits below the shard.
#[derive(Debug, Clone, Copy)]
struct IdLayout {
    tag: u64,
    shard_shift: u32,
}

impl IdLayout {
    fn max_counter(self) -> u64 {
        (1u64 << self.shard_shift) - 1
    }

    /// Bits above the shard field: they must equal the tag's (this keeps bit 62 of DIDs clear).
    fn high_bits(self, id: u64) -> u64 {
        id.checked_shr(self.shard_shift + 16).unwrap_or(0)
    }

    fn compose(self, shard: u16, counter: u64) -> Option<u64> {
        if counter == 0 || counter > self.max_counter() {
            return None;
        }
        let id = self.tag | (u64::from(shard) << self.shard_shift) | counter;
        assert_eq!(self.split(id), Some((shard, counter)), "id layout round trip");
        Some(id)
    }

    /// (shard, counter) of an id of this layout; `None` for any other u64.
    fn split(self, id: u64) -> Option<(u16, u64)> {
        let counter = id & self.max_counter();
        if self.high_bits(id) != self.high_bits(self.tag) || counter == 0 {
            return None;
        }
        let shard = ((id >> self.shard_shift) & 0xffff) as u16;
        Some((shard, counter))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlineOptions {
    /// Cached strings per large kind (did, rkey), on top of the not-yet-persisted ones.
    pub cache_entries: usize,
}

impl Default for OutlineOptions {
    fn default() -> Self {
        Self { cache_entries: 1 << 20 }
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
    /// Held by the one `persist` or `import_rows` running at a time (taken before the others).
    persisting: Mutex<()>,
    allocator: Mutex<Allocator>,
    caches: [RwLock<Cache>; 4],
}

impl Outlines {
    /// Opens (creating if needed) `outlines.db`, applies migrations, loads collections and locations.
    pub fn open(path: &Path, opts: OutlineOptions) -> Result<Self, OutlineError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| OutlineError::Io { path: dir.to_owned(), source })?;
        }
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrations().to_latest(&mut conn)?;
        let caches = OutlineKind::ALL.map(|kind| {
            let large = matches!(kind, OutlineKind::Did | OutlineKind::Rkey);
            RwLock::new(Cache::new(if large { opts.cache_entries } else { SMALL_KIND_CACHE_ENTRIES }))
        });
        let outlines = Self { db: Mutex::new(conn), persisting: Mutex::new(()), allocator: Mutex::default(), caches };
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
                    Some(value) => found(i, Some(value)),
                    None => missed.push(i),
                }
            }
        }
        for i in missed {
            found(i, self.resolve(kind, ids[i])?.as_deref());
        }
        Ok(())
    }

    /// Writes every pending string and the advanced counters in one transaction; returns how many
    /// strings it wrote. On error nothing is written and everything stays pending. The strings
    /// stay pinned in the cache while they are written, so `intern` goes on meanwhile (finding
    /// them there); only taking the list and unpinning need the allocator.
    pub fn persist(&self) -> Result<usize, OutlineError> {
        let _one_at_a_time = self.persisting.lock().map_err(|_| OutlineError::Poisoned)?;
        let (pending, advanced) = {
            let mut allocator = self.lock_allocator()?;
            (std::mem::take(&mut allocator.pending), std::mem::take(&mut allocator.advanced))
        };
        if pending.is_empty() && advanced.is_empty() {
            return Ok(0);
        }
        if let Err(error) = self.write_pending(&pending, &advanced) {
            self.lock_allocator()?.put_back(pending, advanced);
            return Err(error);
        }
        for chunk in pending.chunks(LOCKED_ROWS) {
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
                text.push_str(cache.pinned_value(*id).expect("a pending string is pinned in its cache"));
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
        let mut query = db.prepare_cached(
            "SELECT seq, id, value FROM outlines WHERE kind = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4",
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
        let mut db = self.lock_db()?;
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
                added += insert.execute(params![kind.code(), *id as i64, value])?;
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
            for (shard, counter) in &next {
                advance.execute(params![kind.code(), shard, *counter as i64])?;
            }
        }
        tx.commit()?;
        Ok(added)
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

    /// Strings interned since the last successful `persist`.
    pub fn pending(&self) -> usize {
        self.allocator.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pending.len()
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

    fn stored_id(&self, kind: OutlineKind, value: &str) -> Result<Option<u64>, OutlineError> {
        let db = self.lock_db()?;
        let mut query = db.prepare_cached("SELECT id FROM outlines WHERE kind = ?1 AND value = ?2")?;
        let id: Option<i64> = query.query_row(params![kind.code(), value], |row| row.get(0)).optional()?;
        Ok(id.map(|id| id as u64))
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
    /// none), else SQLite, remembering what it finds. Nobody can allocate `value` meanwhile, a
    /// string a persist is writing is still pinned, and an import cannot run (it takes the
    /// allocator lock). While a persist writes, the SQLite lookup waits for its transaction.
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

/// WAL, and `synchronous = FULL`: a commit is on disk when `persist` returns. NORMAL would not do
/// here even though `persist` always precedes the catalog's commit: with NORMAL a power loss can
/// drop the last outline commit while the later, fsynced commit of `state.db` (a different file,
/// whose fsync does not order writes to this one) survives and refers to the lost ids. Persist runs
/// once per flush, so the extra fsync costs nothing that matters.
fn configure(conn: &Connection) -> Result<(), OutlineError> {
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
        return Err(OutlineError::Corrupt(format!("cannot switch outlines.db to WAL (mode is {mode})")));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::DID_RESERVED_BIT;
    use std::collections::HashSet;

    const DID: OutlineKind = OutlineKind::Did;
    const COLLECTION: OutlineKind = OutlineKind::Collection;
    const RKEY: OutlineKind = OutlineKind::Rkey;
    const LOCATION: OutlineKind = OutlineKind::Location;

    fn open(dir: &tempfile::TempDir, cache_entries: usize) -> Outlines {
        Outlines::open(&dir.path().join("outlines.db"), OutlineOptions { cache_entries }).unwrap()
    }

    #[test]
    fn outlines_are_shareable_and_migrations_valid() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Outlines>();
        migrations().validate().unwrap();
    }

    #[test]
    fn kind_codes_and_names_are_stable() {
        let table: Vec<_> = OutlineKind::ALL.iter().map(|k| (k.code(), k.name())).collect();
        assert_eq!(table, [(1, "did"), (2, "collection"), (3, "rkey"), (4, "location")]);
        for kind in OutlineKind::ALL {
            assert_eq!(OutlineKind::from_code(kind.code()), Some(kind));
            assert_eq!(OutlineKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(OutlineKind::from_code(0), None);
        assert_eq!(OutlineKind::from_code(5), None);
        assert_eq!(OutlineKind::from_name("DID"), None);
    }

    #[test]
    fn layouts_compose_and_split() {
        assert_eq!(DID.layout().compose(0, 1), Some(OUTLINED_BIT | 1));
        assert_eq!(DID.layout().compose(3, 5), Some(OUTLINED_BIT | 3 << 46 | 5));
        assert_eq!(DID.layout().compose(u16::MAX, (1 << 46) - 1), Some(OUTLINED_BIT | ((1 << 62) - 1)));
        assert_eq!(DID.layout().compose(0, 1 << 46), None);
        assert_eq!(DID.layout().compose(0, 0), None);
        assert_eq!(RKEY.layout().compose(u16::MAX, (1 << 47) - 1), Some(u64::MAX));
        assert_eq!(COLLECTION.layout().compose(0, 7), Some(7));
        assert_eq!(LOCATION.layout().compose(2, 7), Some(2 << 48 | 7));
        assert_eq!(COLLECTION.layout().compose(0, 1 << 48), None);
        // Values outside a layout are not ids of that kind.
        assert_eq!(DID.layout().split(1), None); // no outlined bit
        assert_eq!(DID.layout().split(OUTLINED_BIT | DID_RESERVED_BIT | 1), None);
        assert_eq!(DID.layout().split(OUTLINED_BIT), None); // counter 0
        assert_eq!(RKEY.layout().split(0x0123_4567), None); // an inline TID
        assert_eq!(COLLECTION.layout().split(0), None); // <self>
        assert_eq!(LOCATION.layout().split(u64::MAX), Some((u16::MAX, (1 << 48) - 1)));
    }

    #[test]
    fn intern_lookup_resolve_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 16);
        let did = outlines.intern(DID, "did:plc:abc", 0).unwrap();
        assert_eq!(did, OUTLINED_BIT | 1);
        assert_eq!(outlines.intern(DID, "did:plc:abc", 7).unwrap(), did, "an existing string keeps its id");
        assert_eq!(outlines.intern(DID, "did:plc:def", 0).unwrap(), OUTLINED_BIT | 2);
        assert_eq!(outlines.intern(COLLECTION, "app.bsky.feed.like", 0).unwrap(), 1);
        assert_eq!(outlines.intern(COLLECTION, "app.bsky.feed.post", 0).unwrap(), 2);
        assert_eq!(outlines.intern(RKEY, "self", 0).unwrap(), OUTLINED_BIT | 1);
        assert_eq!(outlines.intern(LOCATION, "$.subject", 0).unwrap(), 1);
        // The same string in another kind is another entry.
        assert_eq!(outlines.intern(LOCATION, "self", 0).unwrap(), 2);

        assert_eq!(outlines.lookup(DID, "did:plc:abc").unwrap(), Some(did));
        assert_eq!(outlines.lookup(DID, "did:plc:zzz").unwrap(), None);
        assert_eq!(outlines.lookup(COLLECTION, "did:plc:abc").unwrap(), None);
        assert_eq!(outlines.lookup(DID, "").unwrap(), None);
        assert_eq!(outlines.resolve(DID, did).unwrap().as_deref(), Some("did:plc:abc"));
        assert_eq!(outlines.resolve(RKEY, OUTLINED_BIT | 1).unwrap().as_deref(), Some("self"));
        assert_eq!(outlines.resolve(DID, OUTLINED_BIT | 3).unwrap(), None);
        assert_eq!(outlines.resolve(COLLECTION, 0).unwrap(), None);
        assert_eq!(outlines.pending(), 7);
        assert_eq!(outlines.lookup(DID, "did:plc:nope").unwrap(), None);
        assert_eq!(outlines.pending(), 7, "lookup never allocates");
    }

    #[test]
    fn a_complete_cache_answers_misses_until_it_evicts_or_imports() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 2);
        let complete = |kind: OutlineKind| read(&outlines.caches[kind.index()]).unwrap().complete;
        assert!(complete(DID) && complete(RKEY), "a new outlines.db stores nothing");
        let a = outlines.intern(DID, "did:plc:a", 0).unwrap();
        outlines.intern(DID, "did:plc:b", 0).unwrap();
        outlines.persist().unwrap();
        assert!(complete(DID), "two strings fit a two-entry cache");
        let c = outlines.intern(DID, "did:plc:c", 0).unwrap();
        outlines.persist().unwrap(); // the third string evicts one
        assert!(!complete(DID));
        assert_eq!(outlines.intern(DID, "did:plc:a", 0).unwrap(), a, "an evicted string is found in SQLite");
        assert_eq!(outlines.intern(DID, "did:plc:c", 0).unwrap(), c);
        assert_eq!(outlines.pending(), 0);

        outlines.import_rows(RKEY, &[(OUTLINED_BIT | 9, "imported".to_string())]).unwrap();
        assert!(!complete(RKEY), "imported rows are in SQLite only");
        assert_eq!(outlines.intern(RKEY, "imported", 0).unwrap(), OUTLINED_BIT | 9);
        drop(outlines);
        let reopened = open(&dir, 2);
        assert!(!read(&reopened.caches[DID.index()]).unwrap().complete, "stored strings: not complete at open");
        assert_eq!(reopened.intern(DID, "did:plc:b", 0).unwrap(), OUTLINED_BIT | 2);
    }

    #[test]
    fn a_restored_writers_new_rows_come_after_every_published_range() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 16);
        let published = [(OUTLINED_BIT | 1, "did:plc:one".to_string()), (OUTLINED_BIT | 2, "did:plc:two".to_string())];
        // A retried import must not use up sequence numbers (AUTOINCREMENT would, with OR IGNORE).
        assert_eq!(outlines.import_rows(DID, &published).unwrap(), 2);
        assert_eq!(outlines.import_rows(DID, &published).unwrap(), 0);
        outlines.intern(DID, "did:plc:three", 0).unwrap();
        outlines.persist().unwrap();
        assert_eq!(outlines.max_seq().unwrap(), 3, "no gap after a repeated import");
        // The writer that published them numbered them up to 7 (it had gaps, or other kinds).
        outlines.reserve_seq_through(7).unwrap();
        outlines.reserve_seq_through(5).unwrap(); // never lowers it
        outlines.intern(DID, "did:plc:new", 0).unwrap();
        outlines.persist().unwrap();
        assert_eq!(outlines.max_seq().unwrap(), 8);
        assert_eq!(
            outlines.rows_between(DID, 7, 8, 10, 1 << 20).unwrap(),
            [(8, OUTLINED_BIT | 4, "did:plc:new".to_string())]
        );
        let fresh = tempfile::tempdir().unwrap();
        let empty = open(&fresh, 16);
        empty.reserve_seq_through(4).unwrap(); // before any row exists
        empty.intern(LOCATION, "$.subject", 0).unwrap();
        empty.persist().unwrap();
        assert_eq!(empty.max_seq().unwrap(), 5);
    }

    #[test]
    fn shards_carry_their_number() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 16);
        let id = outlines.intern(DID, "did:plc:three", 3).unwrap();
        assert_eq!(id, OUTLINED_BIT | 3 << 46 | 1);
        assert_eq!(DID.layout().split(id), Some((3, 1)));
        assert_eq!(outlines.intern(DID, "did:plc:three-b", 3).unwrap(), OUTLINED_BIT | 3 << 46 | 2);
        assert_eq!(outlines.intern(RKEY, "a", 3).unwrap(), OUTLINED_BIT | 3 << 47 | 1);
        assert_eq!(outlines.intern(COLLECTION, "a.b.c", 3).unwrap(), 3 << 48 | 1);
        assert_eq!(outlines.intern(DID, "did:plc:zero", 0).unwrap(), OUTLINED_BIT | 1);
    }

    #[test]
    fn bad_strings_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 16);
        assert!(matches!(outlines.intern(DID, "", 0), Err(OutlineError::InvalidValue { len: 0, max: 2048, .. })));
        let long = "a".repeat(318);
        assert!(matches!(outlines.intern(COLLECTION, &long, 0), Err(OutlineError::InvalidValue { len: 318, .. })));
        assert_eq!(outlines.lookup(COLLECTION, &long).unwrap(), None);
        assert_eq!(outlines.pending(), 0);
    }

    #[test]
    fn persist_and_reopen_keep_ids_and_continue_counters() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, col) = {
            let outlines = open(&dir, 16);
            let a = outlines.intern(DID, "did:plc:a", 0).unwrap();
            let b = outlines.intern(DID, "did:plc:b", 5).unwrap();
            let col = outlines.intern(COLLECTION, "app.bsky.graph.follow", 0).unwrap();
            assert_eq!(outlines.persist().unwrap(), 3);
            assert_eq!(outlines.pending(), 0);
            assert_eq!(outlines.persist().unwrap(), 0);
            (a, b, col)
        };
        let outlines = open(&dir, 16);
        assert_eq!(outlines.pending(), 0);
        assert_eq!(outlines.lookup(DID, "did:plc:a").unwrap(), Some(a));
        assert_eq!(outlines.intern(DID, "did:plc:b", 0).unwrap(), b);
        assert_eq!(outlines.resolve(COLLECTION, col).unwrap().as_deref(), Some("app.bsky.graph.follow"));
        assert_eq!(outlines.pending(), 0, "re-interning a stored string allocates nothing");
        assert_eq!(outlines.intern(DID, "did:plc:c", 0).unwrap(), OUTLINED_BIT | 2);
        assert_eq!(outlines.intern(DID, "did:plc:d", 5).unwrap(), OUTLINED_BIT | 5 << 46 | 2);
        assert_eq!(outlines.intern(COLLECTION, "app.bsky.feed.repost", 0).unwrap(), 2);
    }

    #[test]
    fn unpersisted_ids_are_forgotten_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let outlines = open(&dir, 16);
            outlines.intern(DID, "did:plc:kept", 0).unwrap();
            outlines.persist().unwrap();
            assert_eq!(outlines.intern(DID, "did:plc:lost", 0).unwrap(), OUTLINED_BIT | 2);
            assert_eq!(outlines.pending(), 1);
        }
        let outlines = open(&dir, 16);
        assert_eq!(outlines.lookup(DID, "did:plc:lost").unwrap(), None);
        assert_eq!(outlines.resolve(DID, OUTLINED_BIT | 2).unwrap(), None);
        // The counter resumed from its persisted value, so the forgotten id is handed out again.
        assert_eq!(outlines.intern(DID, "did:plc:other", 0).unwrap(), OUTLINED_BIT | 2);
    }

    #[test]
    fn exhausted_sequence_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(&dir, 16));
        let conn = Connection::open(dir.path().join("outlines.db")).unwrap();
        conn.execute("INSERT INTO sequences (kind, shard, next) VALUES (1, 9, ?1)", [(1i64 << 46) - 1]).unwrap();
        drop(conn);
        let outlines = open(&dir, 16);
        assert_eq!(outlines.intern(DID, "did:plc:last", 9).unwrap(), OUTLINED_BIT | 9 << 46 | ((1 << 46) - 1));
        assert!(matches!(outlines.intern(DID, "did:plc:more", 9), Err(OutlineError::Exhausted { shard: 9, .. })));
        // Other shards are unaffected.
        assert_eq!(outlines.intern(DID, "did:plc:more", 10).unwrap(), OUTLINED_BIT | 10 << 46 | 1);
    }

    #[test]
    fn failed_persist_writes_nothing_and_keeps_pending() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 16);
        outlines.intern(DID, "did:plc:one", 0).unwrap();
        outlines.intern(DID, "did:plc:two", 0).unwrap();
        // Another writer (which must never exist) took the second id: the batch cannot commit.
        let other = Connection::open(dir.path().join("outlines.db")).unwrap();
        other
            .execute("INSERT INTO outlines (kind, id, value) VALUES (1, ?1, 'x')", [(OUTLINED_BIT | 2) as i64])
            .unwrap();
        assert!(matches!(outlines.persist(), Err(OutlineError::Sqlite(_))));
        assert_eq!(outlines.pending(), 2);
        let rows: i64 = other.query_row("SELECT count(*) FROM outlines", [], |r| r.get(0)).unwrap();
        let sequences: i64 = other.query_row("SELECT count(*) FROM sequences", [], |r| r.get(0)).unwrap();
        assert_eq!((rows, sequences), (1, 0));
        other.execute("DELETE FROM outlines", []).unwrap();
        assert_eq!(outlines.persist().unwrap(), 2);
    }

    #[test]
    fn tiny_cache_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 3);
        let names: Vec<String> = (0..500).map(|i| format!("did:plc:{i:05}")).collect();
        let ids: Vec<u64> = names.iter().map(|n| outlines.intern(DID, n, 1).unwrap()).collect();
        let check = |outlines: &Outlines| {
            for (name, id) in names.iter().zip(&ids).rev() {
                assert_eq!(outlines.lookup(DID, name).unwrap(), Some(*id));
                assert_eq!(outlines.resolve(DID, *id).unwrap().as_deref(), Some(name.as_str()));
            }
        };
        check(&outlines); // all pending: never evicted
        assert_eq!(outlines.persist().unwrap(), 500);
        check(&outlines); // stored: the cache holds 3, the rest come from SQLite
        assert_eq!(read(&outlines.caches[DID.index()]).unwrap().len(), 3);
        assert_eq!(outlines.intern(DID, &names[0], 2).unwrap(), ids[0]);
        assert_eq!(outlines.pending(), 0);
    }

    #[test]
    fn concurrent_shards_never_share_an_id() {
        let dir = tempfile::tempdir().unwrap();
        let outlines = open(&dir, 64);
        let names: Vec<String> = (0..400).map(|i| format!("did:web:host{i}.example")).collect();
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4u16)
                .map(|shard| {
                    let (outlines, names) = (&outlines, &names);
                    scope.spawn(move || {
                        // Every worker interns every name, each in its own order; persists race too.
                        let mut order: Vec<usize> = (0..names.len()).collect();
                        order.rotate_left(shard as usize * 97);
                        let mut ids = vec![0; names.len()];
                        for (step, i) in order.into_iter().enumerate() {
                            ids[i] = outlines.intern(DID, &names[i], shard).unwrap();
                            if step % 50 == 49 {
                                outlines.persist().unwrap();
                            }
                        }
                        ids
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for ids in &per_thread[1..] {
            assert_eq!(ids, &per_thread[0], "all workers agree on every string's id");
        }
        let distinct: HashSet<u64> = per_thread[0].iter().copied().collect();
        assert_eq!(distinct.len(), names.len());
        outlines.persist().unwrap();
        let reopened = open(&dir, 64);
        for (name, id) in names.iter().zip(&per_thread[0]) {
            assert_eq!(reopened.lookup(DID, name).unwrap(), Some(*id));
        }
    }
}

/// A published outline range object (`outlines/<kind>/<after>-<through>`): zstd over `"BLOR"`,
/// version u16 LE, kind code u8, row count u32 LE, the rows, and an xxh3-64 LE of everything
/// before it (docs/format.md "Outline range").
///
/// Version 2 (written) stores the rows as columns: the ids' deltas, byte-transposed; the value
/// lengths, byte-transposed; then the values, each `did:plc` DID packed into 15 bytes (length 0
/// marks one). Version 1 (read) stored each row as id u64 LE, length u16 LE, value bytes.
pub mod range {
    use super::{OutlineError, OutlineKind, check_value};
    use crate::lsm::table::{transpose_into, untransposed};
    use xxhash_rust::xxh3::xxh3_64;

    const MAGIC: &[u8; 4] = b"BLOR";
    const ROWS_VERSION: u16 = 1;
    const COLUMNS_VERSION: u16 = 2;
    const HEADER_LEN: usize = 11;
    const CHECKSUM_LEN: usize = 8;
    /// Largest decompressed range accepted. Writers cut ranges at `CHUNK_BYTES`; older writers
    /// wrote a whole publish interval in one range, which this still reads.
    pub const MAX_RANGE_BYTES: usize = 256 << 20;
    /// Encoded bytes of a row besides its value: the id and the length.
    pub const ROW_OVERHEAD: usize = 10;
    /// Most rows a writer puts in one range.
    pub const CHUNK_ROWS: usize = 1 << 17;
    /// A writer ends a range once its rows' encoded size reaches this (the largest row is 2 KiB,
    /// so a range stays far below `MAX_RANGE_BYTES`).
    pub const CHUNK_BYTES: usize = 8 << 20;

    const PLC_PREFIX: &str = "did:plc:";
    const PLC_CHARS: usize = 24;
    const PLC_PACKED_LEN: usize = 15;
    const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

    /// A `did:plc` DID's 24 base32 characters as 15 bytes (5 bits each, first character in the
    /// top bits); `None` for any other value, which is stored as it is.
    fn pack_plc(value: &str) -> Option<[u8; PLC_PACKED_LEN]> {
        let chars = value.strip_prefix(PLC_PREFIX).filter(|rest| rest.len() == PLC_CHARS)?;
        let mut bits = 0u128;
        for c in chars.bytes() {
            let digit = BASE32.iter().position(|&b| b == c)?;
            bits = bits << 5 | digit as u128;
        }
        Some(bits.to_be_bytes()[16 - PLC_PACKED_LEN..].try_into().expect("15 bytes"))
    }

    /// Inverse of `pack_plc`; every 15 bytes are some DID's.
    fn unpack_plc(packed: &[u8]) -> String {
        let mut word = [0u8; 16];
        word[16 - PLC_PACKED_LEN..].copy_from_slice(packed);
        let bits = u128::from_be_bytes(word);
        let mut value = String::with_capacity(PLC_PREFIX.len() + PLC_CHARS);
        value.push_str(PLC_PREFIX);
        for i in (0..PLC_CHARS).rev() {
            value.push(BASE32[(bits >> (5 * i)) as usize & 31] as char);
        }
        value
    }

    /// Encodes `(id, value)` rows as one range object (compressed, checksummed), version 2.
    pub fn encode<'a>(kind: OutlineKind, rows: impl ExactSizeIterator<Item = (u64, &'a str)> + Clone) -> Vec<u8> {
        let count = u32::try_from(rows.len()).expect("a range holds fewer than 2^32 rows");
        let values: usize = rows.clone().map(|(_, v)| v.len()).sum();
        let mut raw = Vec::with_capacity(HEADER_LEN + rows.len() * ROW_OVERHEAD + values + CHECKSUM_LEN);
        raw.extend_from_slice(MAGIC);
        raw.extend_from_slice(&COLUMNS_VERSION.to_le_bytes());
        raw.push(kind.code());
        raw.extend_from_slice(&count.to_le_bytes());
        let mut previous = 0u64;
        let deltas: Vec<[u8; 8]> =
            rows.clone().map(|(id, _)| (id.wrapping_sub(std::mem::replace(&mut previous, id))).to_be_bytes()).collect();
        transpose_into(deltas.len(), |i| deltas[i], &mut raw);
        let packed: Vec<Option<[u8; PLC_PACKED_LEN]>> =
            rows.clone().map(|(_, v)| if kind == OutlineKind::Did { pack_plc(v) } else { None }).collect();
        let lengths: Vec<[u8; 2]> = rows
            .clone()
            .zip(&packed)
            .map(|((_, v), p)| {
                assert!((1..=usize::from(u16::MAX)).contains(&v.len()), "an outline value is 1 to 65,535 bytes long");
                if p.is_some() { [0, 0] } else { (v.len() as u16).to_le_bytes() }
            })
            .collect();
        transpose_into(lengths.len(), |i| lengths[i], &mut raw);
        for ((_, value), packed) in rows.zip(&packed) {
            match packed {
                Some(packed) => raw.extend_from_slice(packed),
                None => raw.extend_from_slice(value.as_bytes()),
            }
        }
        raw.extend_from_slice(&xxh3_64(&raw).to_le_bytes());
        assert!(raw.len() <= MAX_RANGE_BYTES, "outline range over the decode limit");
        zstd::bulk::compress(&raw, 3).expect("zstd compresses in memory")
    }

    pub fn decode(kind: OutlineKind, compressed: &[u8]) -> Result<Vec<(u64, String)>, OutlineError> {
        let raw = crate::store::inflate(compressed, MAX_RANGE_BYTES).map_err(|e| corrupt(&e))?;
        if raw.len() < HEADER_LEN + CHECKSUM_LEN || &raw[..4] != MAGIC {
            return Err(corrupt("bad magic or too short"));
        }
        let (body, sum) = raw.split_at(raw.len() - CHECKSUM_LEN);
        if xxh3_64(body).to_le_bytes() != sum {
            return Err(corrupt("checksum mismatch"));
        }
        if body[6] != kind.code() {
            return Err(corrupt("wrong kind"));
        }
        let count = u32::from_le_bytes(body[7..HEADER_LEN].try_into().expect("4 bytes")) as usize;
        let rows = &body[HEADER_LEN..];
        match u16::from_le_bytes([body[4], body[5]]) {
            ROWS_VERSION => decode_rows(kind, count, rows),
            COLUMNS_VERSION => decode_columns(kind, count, rows),
            _ => Err(corrupt("unknown version")),
        }
    }

    fn corrupt(why: &str) -> OutlineError {
        OutlineError::Corrupt(format!("outline range: {why}"))
    }

    /// Version 1: each row is id u64 LE, length u16 LE, value.
    fn decode_rows(kind: OutlineKind, count: usize, body: &[u8]) -> Result<Vec<(u64, String)>, OutlineError> {
        let mut rows = Vec::with_capacity(count.min(body.len() / ROW_OVERHEAD));
        let mut at = 0;
        for _ in 0..count {
            let header = body.get(at..at + ROW_OVERHEAD).ok_or_else(|| corrupt("truncated row"))?;
            let id = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
            let len = u16::from_le_bytes([header[8], header[9]]) as usize;
            let value =
                body.get(at + ROW_OVERHEAD..at + ROW_OVERHEAD + len).ok_or_else(|| corrupt("truncated value"))?;
            rows.push((id, checked_value(kind, value)?));
            at += ROW_OVERHEAD + len;
        }
        if at != body.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(rows)
    }

    /// Version 2: id deltas and lengths as transposed columns, then the values.
    fn decode_columns(kind: OutlineKind, count: usize, body: &[u8]) -> Result<Vec<(u64, String)>, OutlineError> {
        if count > body.len() / ROW_OVERHEAD {
            return Err(corrupt("more rows than bytes"));
        }
        let (ids, rest) = body.split_at(count * 8);
        let (lengths, values) = rest.split_at(count * 2);
        let mut rows = Vec::with_capacity(count);
        let (mut id, mut at) = (0u64, 0usize);
        for i in 0..count {
            id = id.wrapping_add(u64::from_be_bytes(untransposed(ids, count, i)));
            let value = match u16::from_le_bytes(untransposed(lengths, count, i)) as usize {
                0 if kind == OutlineKind::Did => {
                    let packed = values.get(at..at + PLC_PACKED_LEN).ok_or_else(|| corrupt("truncated value"))?;
                    at += PLC_PACKED_LEN;
                    unpack_plc(packed)
                }
                len => {
                    let value = values.get(at..at + len).ok_or_else(|| corrupt("truncated value"))?;
                    at += len;
                    checked_value(kind, value)?
                }
            };
            rows.push((id, value));
        }
        if at != values.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(rows)
    }

    fn checked_value(kind: OutlineKind, bytes: &[u8]) -> Result<String, OutlineError> {
        let value = std::str::from_utf8(bytes).map_err(|_| corrupt("value is not UTF-8"))?.to_string();
        check_value(kind, &value)?;
        Ok(value)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const REAL_PLC: &str = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

        fn rows_of(values: &[&str]) -> Vec<(u64, String)> {
            let ids = [1u64 << 63 | 5, 1 << 63 | 1, 3, u64::MAX, 0, 1 << 63 | 2, 7, 8, 9];
            values.iter().zip(ids).map(|(value, id)| (id, value.to_string())).collect()
        }

        fn encoded(kind: OutlineKind, rows: &[(u64, String)]) -> Vec<u8> {
            encode(kind, rows.iter().map(|(id, value)| (*id, value.as_str())))
        }

        /// The version-1 layout, as writers wrote it before version 2.
        fn encoded_v1(kind: OutlineKind, rows: &[(u64, String)]) -> Vec<u8> {
            let mut raw = MAGIC.to_vec();
            raw.extend_from_slice(&ROWS_VERSION.to_le_bytes());
            raw.push(kind.code());
            raw.extend_from_slice(&(rows.len() as u32).to_le_bytes());
            for (id, value) in rows {
                raw.extend_from_slice(&id.to_le_bytes());
                raw.extend_from_slice(&(value.len() as u16).to_le_bytes());
                raw.extend_from_slice(value.as_bytes());
            }
            with_checksum(raw)
        }

        fn with_checksum(mut raw: Vec<u8>) -> Vec<u8> {
            let sum = xxh3_64(&raw);
            raw.extend_from_slice(&sum.to_le_bytes());
            zstd::bulk::compress(&raw, 3).unwrap()
        }

        fn raw_of(bytes: &[u8]) -> Vec<u8> {
            zstd::bulk::decompress(bytes, MAX_RANGE_BYTES).unwrap()
        }

        #[test]
        fn round_trips_and_detects_corruption() {
            let values = [
                REAL_PLC,
                "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa",
                "did:plc:777777777777777777777777",
                "did:web:x.example",
                "did:plc:abc",
                "did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ",
                "did:plc:ewvi7nxzyoun6zhxrhs64oi1",
                "did:plc:ewvi7nxzyoun6zhxrhs64oiza",
            ];
            let rows = rows_of(&values);
            let bytes = encoded(OutlineKind::Did, &rows);
            assert_eq!(decode(OutlineKind::Did, &bytes).unwrap(), rows);
            // The first three are packed into 15 bytes each; the others are stored as they are.
            let stored: usize = values[3..].iter().map(|v| v.len()).sum::<usize>() + 3 * 15;
            let raw = raw_of(&bytes);
            assert_eq!(raw.len(), HEADER_LEN + values.len() * ROW_OVERHEAD + stored + CHECKSUM_LEN);
            assert!(decode(OutlineKind::Rkey, &bytes).is_err(), "kind is checked");
            for i in 0..raw.len() {
                let mut flipped = raw.clone();
                flipped[i] ^= 0x10;
                let recompressed = zstd::bulk::compress(&flipped, 3).unwrap();
                assert!(decode(OutlineKind::Did, &recompressed).is_err(), "flip at {i} not detected");
            }
            assert!(decode(OutlineKind::Did, b"garbage").is_err());
        }

        /// Version 2's bytes, written out by hand (docs/format.md "Outline range").
        #[test]
        fn version_2_layout_is_byte_exact() {
            let rows = vec![(1u64 << 63 | 1, REAL_PLC.to_string()), (1u64 << 63 | 2, "did:web:x.example".to_string())];
            let raw = raw_of(&encoded(OutlineKind::Did, &rows));
            let mut expected = b"BLOR\x02\x00\x01\x02\x00\x00\x00".to_vec();
            // Id deltas 0x8000000000000001 and 1, big-endian, byte-transposed.
            expected.extend_from_slice(&[0x80, 0]);
            expected.extend_from_slice(&[0; 12]);
            expected.extend_from_slice(&[1, 1]);
            // Lengths 0 (packed) and 17, little-endian, byte-transposed.
            expected.extend_from_slice(&[0, 17, 0, 0]);
            // "ewvi7nxzyoun6zhxrhs64oiz" as 24 five-bit digits, then the other value as it is.
            expected.extend_from_slice(&[
                0x25, 0xaa, 0x8f, 0xb6, 0xf9, 0xc3, 0xa8, 0xdf, 0x64, 0xf7, 0x89, 0xe5, 0xee, 0x39, 0x19,
            ]);
            expected.extend_from_slice(b"did:web:x.example");
            let (body, sum) = raw.split_at(raw.len() - CHECKSUM_LEN);
            assert_eq!(body, expected);
            assert_eq!(sum, xxh3_64(body).to_le_bytes());
        }

        #[test]
        fn other_kinds_store_dids_as_they_are() {
            let rows = rows_of(&[REAL_PLC, "app.bsky.feed.like"]);
            let bytes = encoded(OutlineKind::Collection, &rows);
            assert_eq!(raw_of(&bytes).len(), HEADER_LEN + 2 * ROW_OVERHEAD + 32 + 18 + CHECKSUM_LEN);
            assert_eq!(decode(OutlineKind::Collection, &bytes).unwrap(), rows);
        }

        #[test]
        fn version_1_ranges_still_decode() {
            let rows = rows_of(&[REAL_PLC, "did:web:x.example"]);
            assert_eq!(decode(OutlineKind::Did, &encoded_v1(OutlineKind::Did, &rows)).unwrap(), rows);
        }

        /// Lengths of 0 (a packed DID) in another kind, counts larger than the bytes, and values
        /// that do not add up are errors, not panics or huge allocations.
        #[test]
        fn hostile_columns_are_rejected() {
            // The first value is 15 bytes long, as long as a packed DID.
            let rows = rows_of(&["app.bsky.feed.x", "app.bsky.feed.post"]);
            let raw = raw_of(&encoded(OutlineKind::Collection, &rows));
            let body = &raw[..raw.len() - CHECKSUM_LEN];
            let lengths = HEADER_LEN + 2 * 8;
            let spoiled = |change: &dyn Fn(&mut Vec<u8>)| {
                let mut copy = body.to_vec();
                change(&mut copy);
                decode(OutlineKind::Collection, &with_checksum(copy))
            };
            assert!(spoiled(&|_| {}).is_ok(), "the unspoiled copy decodes");
            assert!(spoiled(&|b| b[lengths] = 0).is_err(), "a packed DID in the collection kind");
            assert!(spoiled(&|b| b[lengths] += 1).is_err(), "values longer than the bytes");
            assert!(spoiled(&|b| b[lengths] -= 1).is_err(), "bytes left after the values");
            let error = spoiled(&|b| b[7..11].copy_from_slice(&u32::MAX.to_le_bytes())).unwrap_err();
            assert!(error.to_string().contains("more rows than bytes"), "{error}");
        }

        #[test]
        fn plc_packing_is_exact_and_only_for_plc_dids() {
            for value in [REAL_PLC, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "did:plc:777777777777777777777777"] {
                assert_eq!(unpack_plc(&pack_plc(value).unwrap()), value);
            }
            assert_eq!(pack_plc("did:plc:aaaaaaaaaaaaaaaaaaaaaaab").unwrap(), {
                let mut one = [0u8; 15];
                one[14] = 1;
                one
            });
            for value in
                ["did:plc:", "did:plc:abc", "did:web:ewvi7nxzyoun6zhxrhs64oiz", "did:plc:ewvi7nxzyoun6zhxrhs64oi0"]
            {
                assert!(pack_plc(value).is_none(), "{value}");
            }
        }
    }
}
