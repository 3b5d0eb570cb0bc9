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
//! - Objects reach the bucket before any manifest names them; CURRENT is written last.

use crate::catalog::{AccountState, Catalog, FlushRecord, IngestPosition, RunKind, TableRecord};
use crate::extract::{ExtractLimits, extract_links};
use crate::ingest::jetstream::{Operation, RecordRef};
use crate::lsm::entry::Entry;
use crate::lsm::memtable::Memtable;
use crate::lsm::table::TableOptions;
use crate::lsm::tree::{ReadError, Tree, table_key};
use crate::model::ids::{Backlink, RecordId, Revocation};
use crate::model::syntax::LinkTarget;
use crate::model::tid::{format_tid, parse_tid};
use crate::outline::{OutlineKind, OutlineOptions, Outlines};
use crate::store::object::Store;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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
            read_only: false,
        }
    }
}

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
    _lock: Option<File>,
}

/// A flushed table of one tree, as the catalog records it.
fn table_record<E: Entry>(id: String, memtable: &Memtable<E>, summary: crate::lsm::table::TableSummary) -> TableRecord {
    let (min_stamp, max_stamp) = memtable.stamps().unwrap_or((0, 0));
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
        min_stamp,
        max_stamp,
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
        let links = Tree::new(tables_dir.join(Backlink::TREE), options.table.clone()).map_err(io_err(&tables_dir))?;
        let thresholds =
            Tree::new(tables_dir.join(Revocation::TREE), options.table.clone()).map_err(io_err(&tables_dir))?;
        for record in catalog.tables()? {
            match record.tree.as_str() {
                Backlink::TREE => links.install(links.open_table(record)?, None),
                _ => thresholds.install(thresholds.open_table(record)?, None),
            }
        }
        let hidden = catalog.hidden_accounts()?.into_iter().collect();
        let position = catalog.position()?;
        let writer = WriterState { position, pending_accounts: Vec::new(), entropy: seed };
        Ok(Self {
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
            _lock: lock,
        })
    }

    pub fn position(&self) -> IngestPosition {
        self.writer.lock().expect("writer lock poisoned").position.clone()
    }

    /// True when the account is deactivated, suspended or taken down (hidden, not deleted).
    pub fn is_hidden(&self, did: u64) -> bool {
        self.hidden.read().expect("hidden lock poisoned").get(&did).is_some_and(|s| s.is_hidden())
    }

    /// Applies one operation at the next stamp; `cursor` is the event's stream position.
    pub fn apply(&self, operation: &Operation<'_>, cursor: Option<i64>) -> Result<(), IndexError> {
        assert!(!self.options.read_only, "write to a read-only index");
        if *operation == Operation::Skip {
            return Ok(());
        }
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let stamp = writer.position.clock + 1;
        match operation {
            Operation::Create(op) => self.write_backlinks(&op.record_ref, &op.record, stamp)?,
            Operation::Update(op) => {
                self.write_revocation(self.source_id(&op.record_ref)?, stamp);
                self.write_backlinks(&op.record_ref, &op.record, stamp)?;
            }
            Operation::Delete(record_ref) => self.write_revocation(self.source_id(record_ref)?, stamp),
            Operation::Account { did, active, status } => {
                let did = self.outlines.intern(OutlineKind::Did, did, WRITER_SHARD)?;
                let state =
                    if *active { AccountState::Active } else { AccountState::parse(status.as_deref().unwrap_or("")) };
                if state == AccountState::Deleted {
                    self.write_revocation(RecordId::repo(did), stamp);
                }
                self.set_account_state(&mut writer, did, state);
            }
            Operation::Skip => unreachable!("skipped above"),
        }
        writer.position.clock = stamp;
        if cursor.is_some() {
            writer.position.cursor = cursor;
        }
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn set_account_state(&self, writer: &mut WriterState, did: u64, state: AccountState) {
        let mut hidden = self.hidden.write().expect("hidden lock poisoned");
        if state.is_hidden() {
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

    fn write_backlinks(
        &self,
        record_ref: &RecordRef<'_>,
        record: &serde_json::Value,
        stamp: u64,
    ) -> Result<(), IndexError> {
        let source = self.source_id(record_ref)?;
        let extraction = extract_links(record, &self.options.extract);
        let mut entries = Vec::with_capacity(extraction.links.len());
        for link in &extraction.links {
            let target = self.target_id(&link.target)?;
            let location = self.outlines.intern(OutlineKind::Location, &link.location, WRITER_SHARD)?;
            entries.push(Backlink { target, source, location, source_rev: stamp });
        }
        let stats = &extraction.stats;
        self.counters.links_collection_only.fetch_add(stats.collection_only as u64, Ordering::Relaxed);
        self.counters.links_handle_authority.fetch_add(stats.handle_authority as u64, Ordering::Relaxed);
        self.counters.links_over_limit.fetch_add(stats.over_link_limit as u64, Ordering::Relaxed);
        self.counters.backlinks.fetch_add(entries.len() as u64, Ordering::Relaxed);
        self.links.insert(entries);
        Ok(())
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

    /// Writes both memtables out as delta runs and commits them with the position. Returns the
    /// number of tables written.
    pub fn flush(&self) -> Result<usize, IndexError> {
        assert!(!self.options.read_only, "flush of a read-only index");
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let frozen_links = self.links.freeze();
        let frozen_thresholds = self.thresholds.freeze();
        self.outlines.persist()?;
        let mut records = Vec::new();
        if let Some(memtable) = &frozen_links {
            records.push(self.write_table(&self.links, memtable, &mut writer)?);
        }
        if let Some(memtable) = &frozen_thresholds {
            records.push(self.write_table(&self.thresholds, memtable, &mut writer)?);
        }
        let flush = FlushRecord {
            tables: records.clone(),
            position: writer.position.clone(),
            accounts: std::mem::take(&mut writer.pending_accounts),
        };
        self.catalog.commit_flush(&flush)?;
        for record in records {
            if record.tree == Backlink::TREE {
                self.links.install(self.links.open_table(record)?, frozen_links.as_ref());
            } else {
                self.thresholds.install(self.thresholds.open_table(record)?, frozen_thresholds.as_ref());
            }
        }
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(flush.tables.len())
    }

    fn write_table<E: Entry>(
        &self,
        tree: &Tree<E>,
        memtable: &Memtable<E>,
        writer: &mut WriterState,
    ) -> Result<TableRecord, IndexError> {
        let id = format!("{:016x}{:08x}", self.catalog.next_table_seq()?, splitmix64(&mut writer.entropy) as u32);
        let summary = tree.write_table(memtable, &id).map_err(io_err(tree.dir()))?;
        Ok(table_record(id, memtable, summary))
    }

    /// Uploads every table not yet in the bucket (data before meta), marking each uploaded.
    pub async fn upload_pending(&self) -> Result<usize, IndexError> {
        let pending = self.catalog.pending_uploads()?;
        for record in &pending {
            let dir = if record.tree == Backlink::TREE { self.links.dir() } else { self.thresholds.dir() };
            for ext in ["data", "meta"] {
                let path = dir.join(format!("{}.{ext}", record.id));
                let bytes = tokio::fs::read(&path).await.map_err(io_err(&path))?;
                self.store.put(&table_key(&record.tree, &record.id, ext), bytes.into()).await?;
            }
            self.catalog.mark_uploaded(&record.id)?;
        }
        Ok(pending.len())
    }

    /// Publishes a manifest naming every table (all uploaded), then points CURRENT at it.
    pub async fn publish_manifest(&self) -> Result<String, IndexError> {
        self.upload_pending().await?;
        let generation = self.catalog.last_manifest()?.map_or(1, |(generation, _)| generation + 1);
        let manifest = crate::manifest::Manifest::new(
            generation,
            self.catalog.position()?,
            self.catalog.tables()?,
            self.catalog.hidden_accounts()?,
        );
        let (name, body) = manifest.encode();
        self.store.put(&format!("manifests/{name}"), body.into()).await?;
        self.store.put("CURRENT", name.clone().into_bytes().into()).await?;
        self.catalog.record_manifest(generation, &name)?;
        Ok(name)
    }

    /// Renders a record id as an `at://` URI (or `at://DID` for the repo form).
    pub fn render_uri(&self, id: &RecordId) -> Result<Option<String>, IndexError> {
        let Some(did) = self.outlines.resolve(OutlineKind::Did, id.did)? else { return Ok(None) };
        if id.is_repo() {
            return Ok(Some(format!("at://{did}")));
        }
        let Some(collection) = self.outlines.resolve(OutlineKind::Collection, id.collection)? else { return Ok(None) };
        let rkey = match id.rkey & crate::model::ids::OUTLINED_BIT {
            0 => format_tid(id.rkey),
            _ => match self.outlines.resolve(OutlineKind::Rkey, id.rkey)? {
                Some(rkey) => rkey.to_string(),
                None => return Ok(None),
            },
        };
        Ok(Some(format!("at://{did}/{collection}/{rkey}")))
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

fn lock_data_dir(data_dir: &Path) -> Result<File, IndexError> {
    let path = data_dir.join("LOCK");
    let file = File::options().create(true).truncate(false).write(true).open(&path).map_err(io_err(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(IndexError::Locked(data_dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(source)) => Err(IndexError::Io { path, source }),
    }
}

/// splitmix64: a tiny deterministic generator; the seed is injected by the caller.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
