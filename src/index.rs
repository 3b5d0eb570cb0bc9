//! The index: both trees, the outlines, the catalog and the store, and the write path.
//!
//! Invariants:
//! - One writer per data directory, enforced by an exclusive lock on `<data-dir>/LOCK`.
//! - Every applied operation gets the next stamp of the ingest clock (a Lamport clock, not the repo
//!   `rev`); an update writes its revocation and its new backlinks at the same stamp.
//! - A flush persists the outlines first, then writes table files, then commits tables, clock,
//!   cursor and account states in one catalog transaction. So a durable table never names an id
//!   that a crash could forget, and after a crash the catalog's position says exactly what the
//!   tables hold: replaying from it re-derives the rest.
//! - A flush writes each identity's freshest backlink once, and none that a revocation frozen
//!   with it kills (that revocation commits in the same transaction); stamps as written.
//! - An operation that fails writes nothing at its stamp, except a repository snapshot cut
//!   short, which moves the clock past its stamp anyway (no two operations share a stamp).
//! - A flush freezes both memtables and takes the position under the writer lock, in one step;
//!   the rest (`FlushJob::finish`) runs without it, one flush at a time (`FlushGate`), so writes
//!   made meanwhile go to fresh memtables and the catalog's positions only move forward.
//! - Objects reach the bucket before any manifest names them; CURRENT is written last.
//! - `tables_clock` only names a clock whose operations are all in installed tables: it moves
//!   after a flush installs its tables, and a failed flush stops all later ones (its operations
//!   are in no table), so merges may lower stamps up to it (`Thresholds::settle`).

use crate::catalog::{AccountState, Catalog, FlushRecord, IngestPosition, ManifestSync, RunKind, TableRecord};
use crate::extract::{ExtractLimits, ExtractStats, Extraction, extract_links};
use crate::ingest::jetstream::{Operation, RecordRef};
use crate::lsm::compaction::{self, CompactionOptions, Thresholds};
use crate::lsm::entry::Entry;
use crate::lsm::memtable::Memtable;
use crate::lsm::run::Run;
use crate::lsm::table::{FormatError, TableMeta, TableOptions, verify_data_checksums};
use crate::lsm::tree::{ReadError, Tree, table_key};
use crate::manifest::{Manifest, ManifestTable, OutlineRange};
use crate::model::ids::{Backlink, RecordId, Revocation};
use crate::model::syntax::LinkTarget;
use crate::model::tid::parse_tid;
use crate::outline::{OutlineKind, OutlineOptions, Outlines};
use crate::store::object::Store;
use crate::verify::{ObjectKind, Place, report_corruption};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// The interning shard of the single ingest writer.
const WRITER_SHARD: u16 = 0;

#[derive(Debug, Clone)]
pub struct IndexOptions {
    /// Flush when a tree's memtable holds this many encoded bytes.
    pub memtable_bytes: usize,
    pub table: TableOptions,
    pub outline_cache_entries: usize,
    pub extract: ExtractLimits,
    pub compaction: CompactionOptions,
    /// Local bytes of table data kept as a cache; uploaded tables past it are read by range.
    pub cache_bytes: u64,
    /// Memory for decoded frames, per tree (warm queries skip the read and the decode).
    pub frame_cache_bytes: usize,
    /// Open without taking the writer lock (for `backlinks query` next to a running server).
    /// Such an index must not be written to.
    pub read_only: bool,
}

impl Default for IndexOptions {
    fn default() -> Self {
        Self {
            memtable_bytes: 64 << 20,
            table: TableOptions::default(),
            outline_cache_entries: 1 << 20,
            extract: ExtractLimits::default(),
            compaction: CompactionOptions::default(),
            cache_bytes: 4 << 30,
            frame_cache_bytes: 64 << 20,
            read_only: false,
        }
    }
}

/// One operation with its record's links already found, as the writer takes it: `apply` finds
/// them first; the importer finds them on its parsing thread (`ingest::prepare`).
pub enum Change<'r, L> {
    Create(&'r RecordRef<'r>, FoundLinks<L>),
    /// A revocation of the record, then its new links, at one stamp.
    Update(&'r RecordRef<'r>, FoundLinks<L>),
    Delete(&'r RecordRef<'r>),
    Account {
        did: &'r str,
        active: bool,
        status: Option<&'r str>,
    },
}

/// A record's links (target, location) and what extraction counted but did not return.
pub struct FoundLinks<L> {
    pub links: L,
    pub stats: ExtractStats,
}

/// An extraction's links, borrowed from it, as the writer takes them.
fn found_links<'l>(extraction: &'l Extraction<'l>) -> FoundLinks<impl Iterator<Item = (LinkTarget<'l>, &'l str)>> {
    let links = extraction.links.iter().map(|link| (link.target, link.location.as_str()));
    FoundLinks { links, stats: extraction.stats.clone() }
}

/// The link iterator of changes that carry none.
pub type NoLinks<'l> = std::iter::Empty<(LinkTarget<'l>, &'l str)>;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("data directory {0} is in use by another backlinks process")]
    Locked(PathBuf),
    #[error("i/o on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    #[error(transparent)]
    Outline(#[from] crate::outline::OutlineError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Store(#[from] crate::store::object::StoreError),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error("writer lease: {0}")]
    Lease(String),
    #[error("{0}")]
    Background(String),
    #[error("an earlier flush failed and its operations are not in any table; restart to replay them")]
    FlushFailed,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IndexError + '_ {
    move |source| IndexError::Io { path: path.to_path_buf(), source }
}

/// Counters of what the write path did (exported as metrics later).
#[derive(Debug, Default)]
pub struct WriteCounters {
    pub operations: AtomicU64,
    pub backlinks: AtomicU64,
    pub revocations: AtomicU64,
    pub links_collection_only: AtomicU64,
    pub links_handle_authority: AtomicU64,
    pub links_over_limit: AtomicU64,
    pub flushes: AtomicU64,
    pub compactions: AtomicU64,
    /// Time spent and bytes written (data + meta) by flushes.
    pub flush_micros: AtomicU64,
    pub flush_bytes: AtomicU64,
    /// Time spent by merges, compressed bytes they read and wrote.
    pub compaction_micros: AtomicU64,
    pub compaction_bytes_in: AtomicU64,
    pub compaction_bytes_out: AtomicU64,
    /// Time spent and bytes put by table uploads.
    pub upload_micros: AtomicU64,
    pub upload_bytes: AtomicU64,
    /// Bytes of local data copies evicted by the cache budget.
    pub cache_evicted_bytes: AtomicU64,
}

/// Adds the time since `started` to a microsecond counter.
fn add_elapsed(counter: &AtomicU64, started: std::time::Instant) {
    counter.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// What the newest known manifest says, as far as publishing and GC care.
#[derive(Debug, Clone, Default)]
struct Published {
    name: Option<String>,
    /// Its generation (0: none yet); the next manifest's must be larger.
    generation: u64,
    table_ids: HashSet<String>,
    outlines: Vec<OutlineRange>,
}

impl Published {
    fn of(name: &str, manifest: &Manifest) -> Self {
        Published {
            name: Some(name.to_string()),
            generation: manifest.generation,
            table_ids: manifest.tables.iter().map(|t| t.id.clone()).collect(),
            outlines: manifest.outlines.clone(),
        }
    }

    /// Outline rows up to this insertion sequence number are published.
    fn outline_through(&self) -> i64 {
        self.outlines.iter().map(|r| r.through).max().unwrap_or(0)
    }
}

#[derive(Debug)]
struct WriterState {
    position: IngestPosition,
    pending_accounts: Vec<(u64, AccountState)>,
    /// State of a splitmix64 generator for table ids; seeded by the caller.
    entropy: u64,
}

pub struct Index {
    pub data_dir: PathBuf,
    pub outlines: Outlines,
    pub catalog: Catalog,
    pub links: Tree<Backlink>,
    pub thresholds: Tree<Revocation>,
    pub store: Arc<dyn Store>,
    pub counters: WriteCounters,
    options: IndexOptions,
    hidden: RwLock<HashMap<u64, AccountState>>,
    writer: Mutex<WriterState>,
    /// Held by the one compaction running at a time.
    compacting: Mutex<()>,
    /// Every operation stamped at or below this clock is in the trees' installed tables, not only
    /// in memtables (so a merge knows every revocation up to it; see `Thresholds::settle`).
    tables_clock: AtomicU64,
    /// Entered by the one flush running at a time, from `begin_flush` to the end of its job.
    flushing: FlushGate,
    /// Set by a flush job that failed or was dropped unfinished; no flush runs after it.
    flush_failed: AtomicBool,
    /// The newest manifest this process published or followed (loaded from the bucket on first
    /// use): GC never deletes a table it names, and publishing extends its outline ranges.
    published: Mutex<Option<Published>>,
    _lock: Option<File>,
}

/// A flushed table of one tree, as the catalog records it.
fn table_record<E: Entry>(id: String, summary: crate::lsm::table::TableSummary) -> TableRecord {
    TableRecord {
        id: id.clone(),
        tree: E::TREE.to_string(),
        run_id: id,
        run_kind: RunKind::Delta,
        shard: 0,
        shard_count: 1,
        entries: summary.entries,
        data_len: summary.data_len,
        meta_len: summary.meta_len,
        uploaded: false,
        min_stamp: summary.stamps.0,
        max_stamp: summary.stamps.1,
    }
}

/// The rest of a flush begun by `Index::begin_flush`: outlines persisted, tables written,
/// catalog committed, tables installed in place of the frozen memtables. Holds the flush gate
/// until it is done (or dropped).
pub struct FlushJob<'a> {
    index: &'a Index,
    _ticket: FlushTicket<'a>,
    /// Marks the index's flushes failed unless the job finishes: a job that did not took
    /// operations (frozen memtables, account changes) that are now in no table.
    unfinished: SetOnDrop<'a>,
    started: std::time::Instant,
    links: Option<(Arc<Memtable<Backlink>>, String)>,
    thresholds: Option<(Arc<Memtable<Revocation>>, String)>,
    position: IngestPosition,
    accounts: Vec<(u64, AccountState)>,
}

/// Sets its flag when dropped, unless disarmed first: however a scope ends (an error, a panic),
/// the flag says it did not end well.
pub(crate) struct SetOnDrop<'a>(Option<&'a AtomicBool>);

impl<'a> SetOnDrop<'a> {
    pub(crate) fn new(flag: &'a AtomicBool) -> Self {
        SetOnDrop(Some(flag))
    }

    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(flag) = self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}

impl FlushJob<'_> {
    /// Returns how many tables it wrote. The outlines are persisted first: no committed table
    /// may refer to an id that a crash could forget.
    pub fn finish(mut self) -> Result<usize, IndexError> {
        let index = self.index;
        index.outlines.persist()?;
        let mut records = Vec::new();
        // Set when every backlink died within the flush: no table (an empty run would only be merged).
        let mut links_all_dead = None;
        if let Some((memtable, id)) = &self.links {
            let revocations = self.thresholds.as_ref().map_or(Vec::new(), |(m, _)| m.iter().copied().collect());
            let flushed = Thresholds::of_flush(revocations);
            let links = || compaction::freshest(memtable.iter().copied()).filter_map(|link| flushed.settle(link));
            if links().next().is_none() {
                links_all_dead = Some(memtable);
            } else {
                records.push(index.write_table(&index.links, id, memtable.len(), links)?);
            }
        }
        if let Some((memtable, id)) = &self.thresholds {
            records.push(index.write_table(&index.thresholds, id, memtable.len(), || memtable.iter().copied())?);
        }
        let flush = FlushRecord { tables: records.clone(), position: self.position, accounts: self.accounts };
        index.catalog.commit_flush(&flush)?;
        if let Some(memtable) = links_all_dead {
            index.links.retire_frozen(memtable);
        }
        for record in records {
            if record.tree == Backlink::TREE {
                index.links.install(index.links.open_table(record)?, self.links.as_ref().map(|(m, _)| m));
            } else {
                index
                    .thresholds
                    .install(index.thresholds.open_table(record)?, self.thresholds.as_ref().map(|(m, _)| m));
            }
        }
        index.tables_clock.fetch_max(flush.position.clock, Ordering::Release);
        index.counters.flushes.fetch_add(1, Ordering::Relaxed);
        let written: u64 = flush.tables.iter().map(|t| t.data_len + t.meta_len).sum();
        index.counters.flush_bytes.fetch_add(written, Ordering::Relaxed);
        add_elapsed(&index.counters.flush_micros, self.started);
        self.unfinished.disarm();
        Ok(flush.tables.len())
    }
}

/// Lets one flush run at a time: `enter` waits until no ticket is out.
#[derive(Debug, Default)]
struct FlushGate {
    busy: Mutex<bool>,
    idle: std::sync::Condvar,
}

impl FlushGate {
    fn enter(&self) -> FlushTicket<'_> {
        let mut busy = self.busy.lock().expect("flush gate poisoned");
        while *busy {
            busy = self.idle.wait(busy).expect("flush gate poisoned");
        }
        *busy = true;
        FlushTicket(self)
    }
}

struct FlushTicket<'a>(&'a FlushGate);

impl Drop for FlushTicket<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = false;
        self.0.idle.notify_one();
    }
}

impl Index {
    /// Opens (or creates) the index in `data_dir`; `seed` feeds table-id randomness.
    pub fn open(data_dir: &Path, store: Arc<dyn Store>, options: IndexOptions, seed: u64) -> Result<Self, IndexError> {
        std::fs::create_dir_all(data_dir).map_err(io_err(data_dir))?;
        let lock = if options.read_only { None } else { Some(lock_data_dir(data_dir)?) };
        let outlines = Outlines::open(
            &data_dir.join("outlines.db"),
            OutlineOptions { cache_entries: options.outline_cache_entries },
        )?;
        let catalog = Catalog::open(&data_dir.join("state").join("state.db"))?;
        let tables_dir = data_dir.join("state").join("tables");
        let frame_cache = options.frame_cache_bytes;
        let links = Tree::new(tables_dir.join(Backlink::TREE), options.table.clone(), frame_cache)
            .map_err(io_err(&tables_dir))?;
        let thresholds = Tree::new(tables_dir.join(Revocation::TREE), options.table.clone(), frame_cache)
            .map_err(io_err(&tables_dir))?;
        if lock.is_some() {
            // Files of tables a crash wrote but never committed; nothing else writes yet.
            let known = catalog.known_table_ids()?;
            links.remove_orphans(&known).map_err(io_err(links.dir()))?;
            thresholds.remove_orphans(&known).map_err(io_err(thresholds.dir()))?;
        }
        let hidden = catalog.hidden_accounts()?.into_iter().collect();
        let position = catalog.position()?;
        // The catalog commits a flush's tables with its position, so they hold all up to it.
        let tables_clock = AtomicU64::new(position.clock);
        let writer = WriterState { position, pending_accounts: Vec::new(), entropy: seed };
        let index = Self {
            data_dir: data_dir.to_path_buf(),
            outlines,
            catalog,
            links,
            thresholds,
            store,
            counters: WriteCounters::default(),
            options,
            hidden: RwLock::new(hidden),
            writer: Mutex::new(writer),
            compacting: Mutex::new(()),
            tables_clock,
            flushing: FlushGate::default(),
            flush_failed: AtomicBool::new(false),
            published: Mutex::new(None),
            _lock: lock,
        };
        index.reload_trees()?;
        Ok(index)
    }

    pub fn position(&self) -> IngestPosition {
        self.writer.lock().expect("writer lock poisoned").position.clone()
    }

    /// True when the account is deactivated, suspended or taken down (hidden, not deleted).
    pub fn is_hidden(&self, did: u64) -> bool {
        hidden_in(&self.hidden.read().expect("hidden lock poisoned"), did)
    }

    /// Keeps the links whose source account is not hidden, under one read of the hidden set.
    pub fn retain_visible(&self, links: &mut Vec<Backlink>) {
        let hidden = self.hidden.read().expect("hidden lock poisoned");
        if !hidden.is_empty() {
            links.retain(|link| !hidden_in(&hidden, link.source.did));
        }
    }

    /// Applies one operation at the next stamp; `cursor` is the event's stream position.
    pub fn apply(&self, operation: &Operation<'_>, cursor: Option<i64>) -> Result<(), IndexError> {
        assert!(!self.options.read_only, "write to a read-only index");
        let no_links = |change: Change<'_, NoLinks<'_>>| self.apply_extracted(change, cursor);
        match operation {
            Operation::Create(op) | Operation::Update(op) => {
                let extraction = extract_links(&op.record, &self.options.extract);
                let found = found_links(&extraction);
                let change = match operation {
                    Operation::Create(_) => Change::Create(&op.record_ref, found),
                    _ => Change::Update(&op.record_ref, found),
                };
                self.apply_extracted(change, cursor)
            }
            Operation::Delete(record_ref) => no_links(Change::Delete(record_ref)),
            Operation::Account { did, active, status } => {
                no_links(Change::Account { did: did.as_ref(), active: *active, status: status.as_deref() })
            }
            Operation::Skip => Ok(()),
        }
    }

    /// Applies one operation whose links were already found: `apply` after its extraction, or
    /// the importer's writing thread with links found on its parsing thread.
    pub fn apply_extracted<'l, L>(&self, change: Change<'_, L>, cursor: Option<i64>) -> Result<(), IndexError>
    where
        L: Iterator<Item = (LinkTarget<'l>, &'l str)>,
    {
        assert!(!self.options.read_only, "write to a read-only index");
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let stamp = writer.position.clock + 1;
        match change {
            Change::Create(record_ref, found) => {
                self.write_backlinks(self.backlinks(self.source_id(record_ref)?, found, stamp)?)
            }
            Change::Update(record_ref, found) => {
                // Everything that can fail first: a failed update writes nothing at its stamp.
                let source = self.source_id(record_ref)?;
                let backlinks = self.backlinks(source, found, stamp)?;
                self.write_revocation(source, stamp);
                self.write_backlinks(backlinks);
            }
            Change::Delete(record_ref) => self.write_revocation(self.source_id(record_ref)?, stamp),
            Change::Account { did, active, status } => {
                let did = self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?;
                let state = if active { AccountState::Active } else { AccountState::parse(status.unwrap_or("")) };
                if state == AccountState::Deleted {
                    self.write_revocation(RecordId::repo(did), stamp);
                }
                self.set_account_state(&mut writer, did, state);
            }
        }
        writer.position.clock = stamp;
        if cursor.is_some() {
            writer.position.cursor = cursor;
        }
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How records' links are found (the importer's parsing thread uses it too).
    pub fn extract_limits(&self) -> &ExtractLimits {
        &self.options.extract
    }

    /// The account's state when it is not active (hidden or deleted), by DID string.
    pub fn account_state(&self, did: &str) -> Result<Option<AccountState>, IndexError> {
        let Some(did) = self.outlines.lookup(OutlineKind::Did, did)? else { return Ok(None) };
        Ok(self.hidden.read().expect("hidden lock poisoned").get(&did).copied())
    }

    /// Writes a repository snapshot: a repo-level revocation and every record's backlinks, all at
    /// one new stamp, so the snapshot replaces whatever the index held for the repo before.
    /// Returns the stamp and the number of backlinks written. Holds the writer for the whole repo:
    /// no other operation can take a stamp in between.
    pub fn apply_snapshot<'r>(
        &self,
        did: &str,
        records: impl IntoIterator<Item = (RecordRef<'r>, &'r serde_json::Value)>,
    ) -> Result<(u64, u64), IndexError> {
        assert!(!self.options.read_only, "write to a read-only index");
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let stamp = writer.position.clock + 1;
        let repo = RecordId::repo(self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?);
        self.write_revocation(repo, stamp);
        let before = self.counters.backlinks.load(Ordering::Relaxed);
        let written = records.into_iter().try_for_each(|(record_ref, record)| {
            assert_eq!(record_ref.did, did, "a snapshot holds one repository");
            let extraction = extract_links(record, &self.options.extract);
            self.source_id(&record_ref)
                .and_then(|source| self.backlinks(source, found_links(&extraction), stamp))
                .map(|links| self.write_backlinks(links))
        });
        // Even a snapshot cut short wrote at `stamp` (a retry writes a new one over it): no later
        // operation may take the same stamp.
        writer.position.clock = stamp;
        written?;
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        Ok((stamp, self.counters.backlinks.load(Ordering::Relaxed) - before))
    }

    fn set_account_state(&self, writer: &mut WriterState, did: u64, state: AccountState) {
        let mut hidden = self.hidden.write().expect("hidden lock poisoned");
        // Deleted accounts stay in the map too: a backfilled snapshot must not bring them back.
        if state != AccountState::Active {
            hidden.insert(did, state);
        } else {
            hidden.remove(&did);
        }
        writer.pending_accounts.push((did, state));
    }

    fn write_revocation(&self, source: RecordId, stamp: u64) {
        self.thresholds.insert([Revocation { source, rev: stamp }]);
        self.counters.revocations.fetch_add(1, Ordering::Relaxed);
    }

    /// The backlinks of a record at `stamp`, their strings outlined (written by `write_backlinks`).
    fn backlinks<'l>(
        &self,
        source: RecordId,
        found: FoundLinks<impl Iterator<Item = (LinkTarget<'l>, &'l str)>>,
        stamp: u64,
    ) -> Result<Vec<Backlink>, IndexError> {
        let FoundLinks { links, stats } = found;
        let mut entries = Vec::with_capacity(links.size_hint().0);
        for (target, location) in links {
            let target = self.target_id(&target)?;
            let location = self.outlines.intern(OutlineKind::Location, location, WRITER_SHARD)?;
            entries.push(Backlink { target, source, location, source_rev: stamp });
        }
        self.counters.links_collection_only.fetch_add(stats.collection_only as u64, Ordering::Relaxed);
        self.counters.links_handle_authority.fetch_add(stats.handle_authority as u64, Ordering::Relaxed);
        self.counters.links_over_limit.fetch_add(stats.over_link_limit as u64, Ordering::Relaxed);
        Ok(entries)
    }

    fn write_backlinks(&self, backlinks: Vec<Backlink>) {
        self.counters.backlinks.fetch_add(backlinks.len() as u64, Ordering::Relaxed);
        self.links.insert(backlinks);
    }

    fn source_id(&self, record_ref: &RecordRef<'_>) -> Result<RecordId, IndexError> {
        self.record_id(&record_ref.did, &record_ref.collection, &record_ref.rkey)
    }

    fn target_id(&self, target: &LinkTarget<'_>) -> Result<RecordId, IndexError> {
        match target {
            LinkTarget::Record { did, collection, rkey } => self.record_id(did, collection, rkey),
            LinkTarget::Did(did) => Ok(RecordId::repo(self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?)),
        }
    }

    fn record_id(&self, did: &str, collection: &str, rkey: &str) -> Result<RecordId, IndexError> {
        let rkey = match parse_tid(rkey) {
            Some(tid) => tid,
            None => self.outlines.intern(OutlineKind::Rkey, rkey, WRITER_SHARD)?,
        };
        Ok(RecordId {
            rkey,
            collection: self.outlines.intern(OutlineKind::Collection, collection, WRITER_SHARD)?,
            did: self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?,
        })
    }

    /// True when a tree's memtable has reached its byte budget.
    pub fn wants_flush(&self) -> bool {
        self.links.memtable_bytes() >= self.options.memtable_bytes
            || self.thresholds.memtable_bytes() >= self.options.memtable_bytes
    }

    /// Writes both memtables out as tables, durably (see the module invariants); returns how many
    /// tables it wrote.
    pub fn flush(&self) -> Result<usize, IndexError> {
        self.begin_flush()?.finish()
    }

    /// The part of a flush that needs the writer: both memtables frozen at one position (they stay
    /// visible to readers), and that position and the account changes up to it taken. The job
    /// does the rest without the writer, so writes go on into fresh memtables meanwhile. Waits
    /// while an earlier job runs: one flush at a time keeps the catalog's positions in order and
    /// at most one frozen memtable per tree in memory.
    pub fn begin_flush(&self) -> Result<FlushJob<'_>, IndexError> {
        assert!(!self.options.read_only, "flush of a read-only index");
        let ticket = self.flushing.enter();
        // A job that failed (or was dropped) took operations that are in no table. A later flush
        // would commit a position past them (and tell merges they are in tables).
        if self.flush_failed.load(Ordering::Acquire) {
            return Err(IndexError::FlushFailed);
        }
        let started = std::time::Instant::now();
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        // Ids before the freezes: a failure after a freeze would leave a frozen memtable that no
        // flush writes. Memtables only change under the writer, so these ids find them as frozen.
        let links_id = if self.links.memtable_bytes() > 0 { Some(self.new_table_id(&mut writer)?) } else { None };
        let thresholds_id =
            if self.thresholds.memtable_bytes() > 0 { Some(self.new_table_id(&mut writer)?) } else { None };
        let links = links_id.map(|id| (self.links.freeze().expect("a non-empty memtable freezes"), id));
        let thresholds = thresholds_id.map(|id| (self.thresholds.freeze().expect("a non-empty memtable freezes"), id));
        Ok(FlushJob {
            index: self,
            _ticket: ticket,
            unfinished: SetOnDrop::new(&self.flush_failed),
            started,
            links,
            thresholds,
            position: writer.position.clone(),
            accounts: std::mem::take(&mut writer.pending_accounts),
        })
    }

    /// Writes a flush's sorted, unique entries (given twice by `entries`) as table `id` of `tree`.
    fn write_table<E: Entry, I: Iterator<Item = E>>(
        &self,
        tree: &Tree<E>,
        id: &str,
        count_hint: usize,
        entries: impl Fn() -> I,
    ) -> Result<TableRecord, IndexError> {
        let summary = tree.write_sorted(id, count_hint, entries).map_err(io_err(tree.dir()))?;
        Ok(table_record::<E>(id.to_string(), summary))
    }

    /// A fresh table (or run) id: the catalog's durable sequence and 32 injected random bits.
    fn new_table_id(&self, writer: &mut WriterState) -> Result<String, IndexError> {
        Ok(format!("{:016x}{:08x}", self.catalog.next_table_seq()?, splitmix64(&mut writer.entropy) as u32))
    }

    /// One compaction, if a tier of either tree is full: merges its oldest `fan_in` runs into one
    /// sharded run and retires them at `now_ms`. Blocking (it reads through `runtime` when a table
    /// is not local): call it from a blocking thread. Returns whether it merged anything.
    pub fn compact_once(&self, runtime: &tokio::runtime::Handle, now_ms: u64) -> Result<bool, IndexError> {
        self.compact_once_with(runtime, now_ms, &self.options.compaction)
    }

    /// `compact_once` with other options (a benchmark or an operator's one-off).
    pub fn compact_once_with(
        &self,
        runtime: &tokio::runtime::Handle,
        now_ms: u64,
        options: &CompactionOptions,
    ) -> Result<bool, IndexError> {
        let _one_at_a_time = self.compacting.lock().expect("compaction lock poisoned");
        // Read before the revocation tables: what it promises is installed already.
        let complete_through = self.tables_clock.load(Ordering::Acquire);
        if let Some(inputs) = compaction::pick(&self.links.runs(), options) {
            let runs = self.thresholds.runs();
            let thresholds =
                compaction::load_thresholds(&runs, complete_through, self.store.as_ref(), runtime, options)?;
            let mut keep = |link: Backlink| thresholds.as_ref().map_or(Some(link), |t| t.settle(link));
            self.compact_tree(&self.links, &inputs, runtime, now_ms, options, &mut keep)?;
            return Ok(true);
        }
        if let Some(inputs) = compaction::pick(&self.thresholds.runs(), options) {
            self.compact_tree(&self.thresholds, &inputs, runtime, now_ms, options, &mut Some)?;
            return Ok(true);
        }
        Ok(false)
    }

    fn compact_tree<E: Entry>(
        &self,
        tree: &Tree<E>,
        inputs: &[Arc<Run<E>>],
        runtime: &tokio::runtime::Handle,
        now_ms: u64,
        options: &CompactionOptions,
        keep: &mut dyn FnMut(E) -> Option<E>,
    ) -> Result<(), IndexError> {
        let started = std::time::Instant::now();
        let bytes_in: u64 = inputs.iter().map(|r| r.data_bytes()).sum();
        let shard_count = compaction::shard_count_for(bytes_in, options);
        let (run_id, ids) = {
            let mut writer = self.writer.lock().expect("writer lock poisoned");
            let run_id = self.new_table_id(&mut writer)?;
            let ids: Vec<String> =
                (0..shard_count).map(|_| self.new_table_id(&mut writer)).collect::<Result<_, _>>()?;
            (run_id, ids)
        };
        let output = compaction::merge(tree, inputs, &ids, self.store.as_ref(), runtime, options, keep)?;
        let records: Vec<TableRecord> = output
            .tables
            .iter()
            .zip(&ids)
            .map(|((shard, summary), id)| TableRecord {
                id: id.clone(),
                tree: E::TREE.to_string(),
                run_id: run_id.clone(),
                run_kind: RunKind::Compacted,
                shard: *shard,
                shard_count,
                entries: summary.entries,
                data_len: summary.data_len,
                meta_len: summary.meta_len,
                uploaded: false,
                min_stamp: summary.stamps.0,
                max_stamp: summary.stamps.1,
            })
            .collect();
        let removed: Vec<String> = inputs.iter().map(|r| r.id.clone()).collect();
        let removed_refs: Vec<&str> = removed.iter().map(String::as_str).collect();
        self.catalog.replace_runs(&removed_refs, &records, now_ms)?;
        let tables = records.into_iter().map(|r| tree.open_table(r).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
        let run = Run::from_tables(tables).expect("a compaction writes every shard of its run");
        tree.replace_runs(&removed, run);
        for table in inputs.iter().flat_map(|r| r.tables.iter()) {
            tree.remove_local(&table.record.id).map_err(io_err(tree.dir()))?;
        }
        self.counters.compactions.fetch_add(1, Ordering::Relaxed);
        let bytes_out: u64 = output.tables.iter().map(|(_, summary)| summary.data_len + summary.meta_len).sum();
        self.counters.compaction_bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.counters.compaction_bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        add_elapsed(&self.counters.compaction_micros, started);
        tracing::info!(
            tree = E::TREE,
            inputs = inputs.len(),
            shards = shard_count,
            entries_in = output.entries_in,
            duplicates = output.duplicates_dropped,
            killed = output.killed_dropped,
            "compacted"
        );
        Ok(())
    }

    /// Uploads each table (checked first; data before meta) and records it as uploaded.
    async fn upload_tables(&self, records: &[TableRecord]) -> Result<(), IndexError> {
        for record in records {
            let dir = if record.tree == Backlink::TREE { self.links.dir() } else { self.thresholds.dir() };
            let read = |ext: &str| {
                let path = dir.join(format!("{}.{ext}", record.id));
                async move { tokio::fs::read(&path).await.map_err(io_err(&path)) }
            };
            let (data, meta) = (read("data").await?, read("meta").await?);
            check_before_upload(record, &data, &meta)?;
            for (ext, bytes) in [("data", data), ("meta", meta)] {
                let (started, len) = (std::time::Instant::now(), bytes.len() as u64);
                self.store.put(&table_key(&record.tree, &record.id, ext), bytes.into()).await?;
                self.counters.upload_bytes.fetch_add(len, Ordering::Relaxed);
                add_elapsed(&self.counters.upload_micros, started);
            }
            self.catalog.mark_uploaded(&record.id)?;
            self.mark_handle_uploaded(record);
        }
        Ok(())
    }

    /// Tells the open table that the bucket has it (a corrupt local copy may then be dropped).
    fn mark_handle_uploaded(&self, record: &TableRecord) {
        let id = &record.id;
        match record.tree.as_str() {
            Backlink::TREE => self.links.tables().iter().filter(|t| t.record.id == *id).for_each(|t| t.mark_uploaded()),
            _ => self.thresholds.tables().iter().filter(|t| t.record.id == *id).for_each(|t| t.mark_uploaded()),
        }
    }

    /// Publishes a manifest naming every table (all uploaded) and every outline range (new rows
    /// uploaded first), then points CURRENT at it, then trims the local data cache.
    pub async fn publish_manifest(&self) -> Result<String, IndexError> {
        let name = self.publish_uploaded().await?;
        self.enforce_cache_budget()?;
        Ok(name)
    }

    /// Evicts local data copies of uploaded tables, least recently read first, until the cached
    /// bytes fit `cache_bytes`. Backlink tables go first: revocation tables are small and every
    /// query reads them. A table not yet uploaded is never evicted: it exists nowhere else.
    /// Metas always stay. Returns the bytes evicted.
    pub fn enforce_cache_budget(&self) -> Result<u64, IndexError> {
        let pending: HashSet<String> = self.catalog.pending_uploads()?.into_iter().map(|t| t.id).collect();
        let cached = self.links.tables().iter().map(|t| t.cached_bytes()).sum::<u64>()
            + self.thresholds.tables().iter().map(|t| t.cached_bytes()).sum::<u64>();
        let mut over = cached.saturating_sub(self.options.cache_bytes);
        let evicted = self.evict_from(&self.links, &pending, &mut over)?
            + self.evict_from(&self.thresholds, &pending, &mut over)?;
        self.counters.cache_evicted_bytes.fetch_add(evicted, Ordering::Relaxed);
        Ok(evicted)
    }

    fn evict_from<E: Entry>(
        &self,
        tree: &Tree<E>,
        pending: &HashSet<String>,
        over: &mut u64,
    ) -> Result<u64, IndexError> {
        let mut candidates: Vec<_> =
            tree.tables().into_iter().filter(|t| t.cached_bytes() > 0 && !pending.contains(&t.record.id)).collect();
        candidates.sort_by_key(|t| t.last_read());
        let mut evicted = 0;
        for table in candidates {
            if *over == 0 {
                break;
            }
            let freed = table.evict_local(tree.dir()).map_err(io_err(tree.dir()))?;
            *over = over.saturating_sub(freed);
            evicted += freed;
        }
        Ok(evicted)
    }

    async fn publish_uploaded(&self) -> Result<String, IndexError> {
        let result = self.publish_after(self.published().await?).await;
        if result.is_err() {
            // CURRENT may have moved even though the call failed (the answer to the PUT was lost,
            // or the catalog write after it failed): read it again before the next publish or GC
            // relies on what it names.
            *self.published.lock().expect("published lock poisoned") = None;
        }
        result
    }

    /// Writes the next manifest after `previous` and points CURRENT at it.
    async fn publish_after(&self, previous: Published) -> Result<String, IndexError> {
        // The catalog first (position before tables: tables may hold more than the position
        // says, never less), while flushes and merges may go on committing. Every id its tables
        // use was persisted before they were committed, so the outline rows read after it cover
        // them; its tables not uploaded yet are uploaded before the manifest names them.
        let (position, tables, hidden) =
            (self.catalog.position()?, self.catalog.tables()?, self.catalog.hidden_accounts()?);
        let not_uploaded: Vec<TableRecord> = tables.iter().filter(|t| !t.uploaded).cloned().collect();
        self.upload_tables(&not_uploaded).await?;
        let mut outlines = previous.outlines.clone();
        outlines.extend(self.upload_outline_ranges(previous.outline_through()).await?);
        // Past both the catalog's record and CURRENT's: a crash (or a lost answer) between
        // writing CURRENT and recording it leaves the catalog one generation behind.
        let recorded = self.catalog.last_manifest()?.map_or(0, |(generation, _)| generation);
        let generation = recorded.max(previous.generation) + 1;
        let manifest = Manifest::new(generation, position, tables, hidden, outlines);
        let (name, body) = manifest.encode();
        self.store.put(&format!("manifests/{name}"), body.into()).await?;
        self.store.put("CURRENT", name.clone().into_bytes().into()).await?;
        self.catalog.record_manifest(generation, &name)?;
        *self.published.lock().expect("published lock poisoned") = Some(Published::of(&name, &manifest));
        Ok(name)
    }

    /// Uploads the outline rows stored after `after`: per kind that has any, one object per chunk
    /// of at most `range::CHUNK_ROWS` rows or `range::CHUNK_BYTES` bytes, so that a publish after
    /// a long import holds one chunk in memory at a time. A range ends at its last row's sequence
    /// number; the kind that stored the newest row reaches `through`, which is what the next
    /// publish starts after.
    async fn upload_outline_ranges(&self, after: i64) -> Result<Vec<OutlineRange>, IndexError> {
        use crate::outline::range::{CHUNK_BYTES, CHUNK_ROWS, encode};
        let through = self.outlines.max_seq()?;
        let mut ranges = Vec::new();
        for kind in OutlineKind::ALL {
            let mut from = after;
            while from < through {
                let rows = self.outlines.rows_between(kind, from, through, CHUNK_ROWS, CHUNK_BYTES)?;
                let Some(&(last_seq, _, _)) = rows.last() else { break };
                let range = OutlineRange { kind: kind.name().to_string(), after: from, through: last_seq };
                let body = encode(kind, rows.iter().map(|(_, id, value)| (*id, value.as_str())));
                self.store.put(&range.key(), body.into()).await?;
                from = range.through;
                ranges.push(range);
            }
        }
        Ok(ranges)
    }

    /// The newest manifest known: the one this process published or followed, else CURRENT.
    async fn published(&self) -> Result<Published, IndexError> {
        if let Some(published) = self.published.lock().expect("published lock poisoned").clone() {
            return Ok(published);
        }
        let published = match self.current_manifest().await? {
            Some((name, manifest)) => Published::of(&name, &manifest),
            None => Published::default(),
        };
        *self.published.lock().expect("published lock poisoned") = Some(published.clone());
        Ok(published)
    }

    /// The bucket's CURRENT manifest, validated; `None` for an empty bucket.
    pub async fn current_manifest(&self) -> Result<Option<(String, Manifest)>, IndexError> {
        let name = match self.store.get("CURRENT").await {
            Ok(name) => String::from_utf8_lossy(&name).into_owned(),
            Err(crate::store::object::StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let key = format!("manifests/{name}");
        let body = self.store.get(&key).await?;
        let manifest = Manifest::decode(&name, &body).map_err(|e| {
            report_corruption(ObjectKind::Manifest, Place::Bucket, &key, &e);
            ReadError::Corrupt { object: key.clone(), source: crate::verify::format_error("manifest", e) }
        })?;
        Ok(Some((name, manifest)))
    }

    /// Restores a new, empty data directory from the bucket's CURRENT manifest (if there is
    /// one). Returns whether it restored anything.
    pub async fn restore_if_empty(&self, now_ms: u64) -> Result<bool, IndexError> {
        let empty = self.catalog.last_manifest()?.is_none() && self.catalog.tables()?.is_empty();
        if !empty {
            return Ok(false);
        }
        match self.current_manifest().await? {
            Some((name, manifest)) => {
                self.follow(&name, manifest, now_ms).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A replica's step: follows CURRENT if it moved. Returns whether it did.
    pub async fn follow_current(&self, now_ms: u64) -> Result<bool, IndexError> {
        let known = self.published.lock().expect("published lock poisoned").as_ref().and_then(|p| p.name.clone());
        match self.current_manifest().await? {
            Some((name, manifest)) if Some(&name) != known.as_ref() => {
                self.follow(&name, manifest, now_ms).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Makes this index exactly what `manifest` describes: imports its outline ranges, fetches
    /// the metas of tables it adds, retires the runs it no longer names, and takes its position
    /// and hidden accounts. Table data stays in the bucket (read by range).
    async fn follow(&self, name: &str, manifest: Manifest, now_ms: u64) -> Result<(), IndexError> {
        let already = self.published.lock().expect("published lock poisoned").clone().unwrap_or_default();
        for range in manifest.outlines.iter().filter(|r| !already.outlines.contains(r)) {
            let kind = OutlineKind::from_name(&range.kind).expect("validated by Manifest::decode");
            let key = range.key();
            let rows = crate::outline::range::decode(kind, &self.store.get(&key).await?).map_err(|e| {
                report_corruption(ObjectKind::Outline, Place::Bucket, &key, &e);
                ReadError::Corrupt { object: key.clone(), source: crate::verify::format_error("outline range", e) }
            })?;
            self.outlines.import_rows(kind, &rows)?;
        }
        // Rows this machine stores from now on must come after every published range.
        self.outlines.reserve_seq_through(manifest.outlines.iter().map(|r| r.through).max().unwrap_or(0))?;
        let live: HashMap<String, TableRecord> =
            self.catalog.tables()?.into_iter().map(|t| (t.id.clone(), t)).collect();
        let named: HashSet<&str> = manifest.tables.iter().map(|t| t.id.as_str()).collect();
        let mut added = Vec::new();
        for table in manifest.tables.iter().filter(|t| !live.contains_key(&t.id)) {
            added.push(self.fetch_meta(table).await?);
        }
        let mut retired_runs: Vec<String> =
            live.values().filter(|t| !named.contains(t.id.as_str())).map(|t| t.run_id.clone()).collect();
        retired_runs.sort();
        retired_runs.dedup();
        let hidden: Vec<(u64, AccountState)> =
            manifest.hidden_accounts.iter().map(|(did, status)| (*did, AccountState::parse(status))).collect();
        let position = IngestPosition { cursor: manifest.cursor, clock: manifest.clock };
        let sync = ManifestSync {
            generation: manifest.generation,
            name,
            retired_runs: &retired_runs,
            added: &added,
            position: position.clone(),
            hidden: &hidden,
            min_table_seq: next_table_seq_after(&manifest),
        };
        self.catalog.sync_to_manifest(&sync, now_ms)?;
        self.reload_trees()?;
        // The manifest's tables hold all up to its position (and maybe more).
        self.tables_clock.store(position.clock, Ordering::Release);
        for table in live.values().filter(|t| !named.contains(t.id.as_str())) {
            self.remove_local_table(table)?;
            self.catalog.forget_table(&table.id)?;
        }
        *self.hidden.write().expect("hidden lock poisoned") = hidden.into_iter().collect();
        self.writer.lock().expect("writer lock poisoned").position = position;
        *self.published.lock().expect("published lock poisoned") = Some(Published::of(name, &manifest));
        Ok(())
    }

    /// Downloads and checks a table's meta into the local tree directory.
    async fn fetch_meta(&self, table: &ManifestTable) -> Result<TableRecord, IndexError> {
        let key = table_key(&table.tree, &table.id, "meta");
        let bytes = self.store.get(&key).await?;
        // Checked before it is written: a corrupt meta must fail the restore, not the next start.
        let checked = match table.tree.as_str() {
            Backlink::TREE => check_fetched_meta::<Backlink>(table, &bytes),
            _ => check_fetched_meta::<Revocation>(table, &bytes),
        };
        checked.map_err(|source| {
            report_corruption(ObjectKind::Meta, Place::Bucket, &key, &source);
            ReadError::Corrupt { object: key.clone(), source }
        })?;
        let dir = if table.tree == Backlink::TREE { self.links.dir() } else { self.thresholds.dir() };
        let path = dir.join(format!("{}.meta", table.id));
        crate::lsm::tree::write_durably(&path, &bytes).map_err(io_err(&path))?;
        Ok(TableRecord {
            id: table.id.clone(),
            tree: table.tree.clone(),
            run_id: table.run_id.clone(),
            run_kind: if table.compacted { RunKind::Compacted } else { RunKind::Delta },
            shard: table.shard,
            shard_count: table.shard_count,
            entries: table.entries,
            data_len: table.data_len,
            meta_len: table.meta_len,
            uploaded: true,
            min_stamp: table.min_stamp,
            max_stamp: table.max_stamp,
        })
    }

    /// Rebuilds both trees' run lists from the catalog, reusing open tables.
    fn reload_trees(&self) -> Result<(), IndexError> {
        let (mut links, mut thresholds) = (Vec::new(), Vec::new());
        for record in self.catalog.tables()? {
            match record.tree.as_str() {
                Backlink::TREE => links.push(record),
                _ => thresholds.push(record),
            }
        }
        self.links.load(links)?;
        self.thresholds.load(thresholds)?;
        Ok(())
    }

    /// Deletes retired tables (objects, local files, catalog rows) that retired at least
    /// `grace_ms` before `now_ms` and that the current manifest no longer names, then objects
    /// under `tables/` that the catalog does not know at all (left by a crash). Returns how many
    /// tables and orphan objects it removed.
    pub async fn collect_garbage(&self, now_ms: u64, grace_ms: u64) -> Result<(usize, usize), IndexError> {
        let published = self.published().await?.table_ids;
        let mut retired = 0;
        for (record, _) in self.catalog.obsolete_tables(now_ms.saturating_sub(grace_ms))? {
            if published.contains(&record.id) {
                continue;
            }
            for ext in ["data", "meta"] {
                self.store.delete(&table_key(&record.tree, &record.id, ext)).await?;
            }
            self.remove_local_table(&record)?;
            self.catalog.forget_table(&record.id)?;
            retired += 1;
        }
        let orphans = self.delete_orphan_objects().await?;
        Ok((retired, orphans))
    }

    fn remove_local_table(&self, record: &TableRecord) -> Result<(), IndexError> {
        match record.tree.as_str() {
            Backlink::TREE => self.links.remove_local(&record.id).map_err(io_err(self.links.dir())),
            _ => self.thresholds.remove_local(&record.id).map_err(io_err(self.thresholds.dir())),
        }
    }

    /// Objects under `tables/` whose table id the catalog does not know.
    async fn delete_orphan_objects(&self) -> Result<usize, IndexError> {
        let known = self.catalog.known_table_ids()?;
        let mut removed = 0;
        for object in self.store.list("tables/").await? {
            let id = object.key.rsplit('/').next().and_then(|name| name.split('.').next()).unwrap_or("");
            if !known.contains(id) {
                self.store.delete(&object.key).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Renders record ids as `at://` URIs (`at://DID` for the repo form); `None` for an id some
    /// part of which has no outline string. One pass per outline kind, each under one lock of
    /// that kind's cache: a page renders up to a thousand of these.
    pub fn render_uris(&self, ids: &[RecordId]) -> Result<Vec<Option<String>>, IndexError> {
        // Each built in place (cloning a String would keep only its length's room).
        let mut uris: Vec<Option<String>> =
            ids.iter().map(|_| Some(String::with_capacity(URI_ROOM) + "at://")).collect();
        let all: Vec<usize> = (0..ids.len()).collect();
        self.append_outlined(OutlineKind::Did, ids, &all, |id| id.did, &mut uris, |uri, did| uri.push_str(did))?;
        let records: Vec<usize> = all.into_iter().filter(|&i| !ids[i].is_repo()).collect();
        let collection = |uri: &mut String, collection: &str| {
            for part in ["/", collection, "/"] {
                uri.push_str(part);
            }
        };
        self.append_outlined(OutlineKind::Collection, ids, &records, |id| id.collection, &mut uris, collection)?;
        let (tids, outlined): (Vec<usize>, Vec<usize>) =
            records.into_iter().partition(|&i| ids[i].rkey & crate::model::ids::OUTLINED_BIT == 0);
        for i in tids {
            if let Some(uri) = &mut uris[i] {
                push_tid(uri, ids[i].rkey);
            }
        }
        self.append_outlined(
            OutlineKind::Rkey,
            ids,
            &outlined,
            |id| id.rkey,
            &mut uris,
            |uri, rkey| uri.push_str(rkey),
        )?;
        Ok(uris)
    }

    /// Appends the `kind` string of `part(ids[i])` to `uris[i]` for each `i` of `members`; a
    /// missing string makes that URI `None`.
    fn append_outlined(
        &self,
        kind: OutlineKind,
        ids: &[RecordId],
        members: &[usize],
        part: impl Fn(&RecordId) -> u64,
        uris: &mut [Option<String>],
        append: impl Fn(&mut String, &str),
    ) -> Result<(), IndexError> {
        // URIs already missing a part need no more lookups.
        let members: Vec<usize> = members.iter().copied().filter(|&i| uris[i].is_some()).collect();
        let parts: Vec<u64> = members.iter().map(|&i| part(&ids[i])).collect();
        self.outlines.resolve_each(kind, &parts, |j, value| {
            let uri = &mut uris[members[j]];
            match (uri.as_mut(), value) {
                (Some(text), Some(value)) => append(text, value),
                _ => *uri = None,
            }
        })?;
        Ok(())
    }

    /// Looks up a target without allocating ids: `None` when some part was never seen.
    pub fn lookup_target(&self, target: &LinkTarget<'_>) -> Result<Option<RecordId>, IndexError> {
        let did_of = |did: &str| self.outlines.lookup(OutlineKind::Did, did);
        match target {
            LinkTarget::Did(did) => Ok(did_of(did)?.map(RecordId::repo)),
            LinkTarget::Record { did, collection, rkey } => {
                let rkey = match parse_tid(rkey) {
                    Some(tid) => Some(tid),
                    None => self.outlines.lookup(OutlineKind::Rkey, rkey)?,
                };
                let collection = self.outlines.lookup(OutlineKind::Collection, collection)?;
                Ok(match (rkey, collection, did_of(did)?) {
                    (Some(rkey), Some(collection), Some(did)) => Some(RecordId { rkey, collection, did }),
                    _ => None,
                })
            }
        }
    }
}

/// A fetched meta decodes, and its sizes are the ones the manifest gave.
fn check_fetched_meta<E: Entry>(table: &ManifestTable, bytes: &[u8]) -> Result<(), FormatError> {
    let meta = TableMeta::<E>::decode(bytes)?;
    if bytes.len() as u64 != table.meta_len || meta.data_len != table.data_len {
        let detail = format!(
            "meta of {} bytes for {} bytes of data; the manifest says {} and {}",
            bytes.len(),
            meta.data_len,
            table.meta_len,
            table.data_len
        );
        return Err(FormatError::Invalid { what: "meta", detail });
    }
    Ok(())
}

/// A table's local files decode and every frame's checksum holds: a copy that rotted on disk
/// must never reach the bucket, where it would pass for the good copy.
fn check_before_upload(record: &TableRecord, data: &[u8], meta: &[u8]) -> Result<(), IndexError> {
    let checked = match record.tree.as_str() {
        Backlink::TREE => check_table_files::<Backlink>(data, meta),
        _ => check_table_files::<Revocation>(data, meta),
    };
    checked.map_err(|(kind, ext, source)| {
        let object = format!("{} (local copy)", table_key(&record.tree, &record.id, ext));
        report_corruption(kind, Place::Local, &object, &source);
        IndexError::Read(ReadError::Corrupt { object, source })
    })
}

/// Which file of a table failed its check, and why.
type FileFailure = (ObjectKind, &'static str, FormatError);

fn check_table_files<E: Entry>(data: &[u8], meta: &[u8]) -> Result<(), FileFailure> {
    let meta = TableMeta::<E>::decode(meta).map_err(|e| (ObjectKind::Meta, "meta", e))?;
    verify_data_checksums(&meta, data).map_err(|e| (ObjectKind::Data, "data", e))
}

fn lock_data_dir(data_dir: &Path) -> Result<File, IndexError> {
    let path = data_dir.join("LOCK");
    let file = File::options().create(true).truncate(false).write(true).open(&path).map_err(io_err(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(IndexError::Locked(data_dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(source)) => Err(IndexError::Io { path, source }),
    }
}

/// Whether `did` is hidden (deactivated, suspended or taken down) in the hidden set.
fn hidden_in(hidden: &HashMap<u64, AccountState>, did: u64) -> bool {
    hidden.get(&did).is_some_and(|state| state.is_hidden())
}

/// Room for most URIs without regrowth: `at://`, a did:plc, an NSID and a TID.
const URI_ROOM: usize = 96;

/// Appends the TID spelling of `value` (top bit clear): the digits `format_tid` writes, without
/// the `String` it allocates and fills a `char` at a time (rendering a page spells up to 1,000).
fn push_tid(out: &mut String, value: u64) {
    let start = out.len();
    let alphabet = crate::model::tid::TID_ALPHABET;
    out.extend((0..crate::model::tid::TID_LEN).rev().map(|i| char::from(alphabet[((value >> (5 * i)) & 31) as usize])));
    debug_assert_eq!(parse_tid(&out[start..]), Some(value), "TID spelling round trip");
}

/// splitmix64: a tiny deterministic generator; the seed is injected by the caller.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The table sequence a writer restored from `manifest` must start at: past every id in it (the
/// first 16 hex digits of a table or run id are its sequence number).
fn next_table_seq_after(manifest: &Manifest) -> u64 {
    let seq_of = |id: &str| u64::from_str_radix(&id[..16], 16).unwrap_or(0);
    manifest.tables.iter().flat_map(|t| [seq_of(&t.id), seq_of(&t.run_id)]).max().unwrap_or(0) + 1
}

/// An index in `dir/data` over a `DirStore` bucket in `dir/bucket`, for unit tests.
#[cfg(test)]
pub(crate) fn open_in_dir(dir: &Path, options: IndexOptions) -> Index {
    let store = Arc::new(crate::store::dir::DirStore::new(dir.join("bucket")));
    Index::open(&dir.join("data"), store, options, 7).expect("a fresh test index opens")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_render_each_form_and_none_for_an_unknown_part() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions::default());
        let intern = |kind, value| index.outlines.intern(kind, value, 0).unwrap();
        let (did, other) = (intern(OutlineKind::Did, "did:plc:abc"), intern(OutlineKind::Did, "did:web:x.test"));
        let collection = intern(OutlineKind::Collection, "app.bsky.feed.like");
        let tid = parse_tid("3jzfcijpj2z2a").unwrap();
        let outlined = intern(OutlineKind::Rkey, "self");
        let unknown = (did + 1000, intern(OutlineKind::Collection, "app.bsky.feed.post") + 1000);
        let ids = [
            RecordId::repo(did),
            RecordId { did, collection, rkey: tid },
            RecordId { did: other, collection, rkey: outlined },
            RecordId { did: unknown.0, collection, rkey: tid },
            RecordId { did, collection: unknown.1, rkey: tid },
            RecordId { did: other, collection, rkey: outlined + 1000 },
        ];
        let uris = index.render_uris(&ids).unwrap();
        let expected = [
            Some("at://did:plc:abc"),
            Some("at://did:plc:abc/app.bsky.feed.like/3jzfcijpj2z2a"),
            Some("at://did:web:x.test/app.bsky.feed.like/self"),
            None,
            None,
            None,
        ];
        assert_eq!(uris, expected.map(|uri| uri.map(String::from)));
    }

    #[test]
    fn a_flush_whose_backlinks_all_died_writes_no_links_table() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions::default());
        let record_ref = RecordRef {
            did: "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb".into(),
            collection: "a.b.c".into(),
            rkey: "self".into(),
        };
        let record = serde_json::json!({"subject": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"});
        let create = Operation::Create(crate::ingest::jetstream::RecordOp { record_ref: record_ref.clone(), record });
        index.apply(&create, Some(1)).unwrap();
        index.apply(&Operation::Delete(record_ref), Some(2)).unwrap();
        assert_eq!(index.flush().unwrap(), 1, "only the revocation's table");
        let tables = |index: &Index| (index.links.tables().len(), index.thresholds.tables().len());
        assert_eq!(tables(&index), (0, 1));
        let everything = (Backlink::min_for_key(RecordId::MIN), Backlink::max_for_key(RecordId::MAX));
        assert_eq!(index.links.snapshot(&[everything]).memtable_entries, vec![], "no frozen memtable left");
        let files = std::fs::read_dir(index.links.dir()).unwrap().count();
        assert_eq!(files, 0, "the empty table's files are gone");
        drop(index);
        let reopened = open_in_dir(dir.path(), IndexOptions::default());
        assert_eq!(tables(&reopened), (0, 1));
        assert_eq!(reopened.position().clock, 2);
    }

    #[test]
    fn pushed_tids_are_spelled_as_format_tid_spells_them() {
        for value in [0, 1, 31, 32, 0x194a_947d_4aac_b00c, (1 << 63) - 1] {
            let mut uri = String::from("at://x/");
            push_tid(&mut uri, value);
            assert_eq!(uri, format!("at://x/{}", crate::model::tid::format_tid(value)));
        }
    }
}
