//! The index: the five trees, the outlines, the catalog and the store, and everything a writer or a
//! reader does with them as a whole.
//!
//! - `write`: operations in (create, update, delete, account changes, repository snapshots);
//! - `flush`: memtables out to tables, committed with the ingest position;
//! - `compact`: one merge of a full tier, with the revocations it may use;
//! - `tally`: exact counts of hot targets, kept by flushes;
//! - `reads`: where a flush waits for the reads the tallies make;
//! - `publish`: tables and outline ranges uploaded, then a manifest and CURRENT;
//! - `follow`: restore from the bucket, and a replica following the writer's manifests;
//! - `gc`: retired tables and orphan objects deleted after their grace period;
//! - `retired`: a merge's retired local files, removed once no publish may be uploading them;
//! - `cache`: the local data cache kept within its byte budget;
//! - `render`: ids back to `at://` URIs, and targets to ids.
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
//! - A flush freezes every memtable and takes the position under the writer lock, in one step;
//!   the rest (`FlushJob::finish`) runs without it, one flush at a time (`FlushGate`), so writes
//!   made meanwhile go to fresh memtables and the catalog's positions only move forward.
//! - Objects reach the bucket before any manifest names them; CURRENT is written last.
//! - `tables_clock` only names a clock whose operations are all in installed tables: it moves
//!   after a flush installs its tables, and a failed flush stops all later ones (its operations
//!   are in no table), so merges may lower stamps up to it (`KnownRevocations::settle`).

mod cache;
mod compact;
mod flush;
mod follow;
mod gc;
mod promote;
mod publish;
mod reads;
mod render;
mod retired;
mod tally;
mod write;

pub use flush::FlushJob;
pub use tally::DEFAULT_HOT_TARGET_ENTRIES;
pub use write::{Change, FoundLinks, NoLinks};

use crate::base::rng::splitmix64;
use crate::catalog::{Catalog, IngestPosition};
use crate::extract::ExtractLimits;
use crate::liveness::RevocationsRead;
use crate::lsm::compaction::CompactionOptions;
use crate::lsm::handle::ReadError;
use crate::lsm::table::TableOptions;
use crate::lsm::tree::{TableFiles, Tree, TreeCaches};
use crate::model::account::AccountState;
use crate::model::account_states::AccountStates;
use crate::model::ids::{AccountTally, Backlink, ForwardLink, HotLink, Revocation, Tally, TreeKind};
use crate::outline::{OutlineKind, OutlineOptions, Outlines};
use crate::store::object::Store;
use flush::FlushGate;
use publish::Published;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Default of `IndexOptions::frame_cache_bytes`.
pub const DEFAULT_FRAME_CACHE_BYTES: usize = 64 << 20;
/// Default of `IndexOptions::meta_cache_bytes`.
pub const DEFAULT_META_CACHE_BYTES: usize = 128 << 20;

#[derive(Debug, Clone)]
pub struct IndexOptions {
    /// Flush when the memtables of all trees and the new outline strings together hold this
    /// many bytes.
    pub memtable_bytes: usize,
    pub table: TableOptions,
    pub outline_cache_entries: usize,
    /// Bytes of `outlines.db` read through a memory map (`OutlineOptions::map_bytes`).
    pub outline_map_bytes: u64,
    pub extract: ExtractLimits,
    pub compaction: CompactionOptions,
    /// Local bytes of table data kept as a cache; uploaded tables past it are read by range.
    pub cache_bytes: u64,
    /// Memory for decoded frames, all trees together (warm queries skip the read and the
    /// decode; the trees queries use take what the others leave).
    pub frame_cache_bytes: usize,
    /// Memory for the pages of paged metas (filter pages, frame-index chunks, decoded column
    /// models), all trees together: the only part of the metas held beyond a small directory
    /// per table.
    pub meta_cache_bytes: usize,
    /// Open without taking the writer lock (for `backlinks query` next to a running server).
    /// Such an index must not be written to.
    pub read_only: bool,
    /// A target with at least this many entries gets its counts kept (`tally`): counts of it are
    /// exact without reading its links.
    pub hot_target_entries: u64,
    /// Most entries a promotion holds at once of each kind it reads or sorts (`promote`): the
    /// backlinks of a part of a target, its hot links, its account tallies.
    pub promotion_entries: usize,
    /// Account changes a published account log takes in ranges before a publish writes a new
    /// snapshot instead (when they also outnumber the snapshot's accounts).
    pub account_rebase_min_changes: u64,
}

impl Default for IndexOptions {
    fn default() -> Self {
        Self {
            memtable_bytes: 64 << 20,
            table: TableOptions::default(),
            outline_cache_entries: 1 << 20,
            outline_map_bytes: 0,
            extract: ExtractLimits::default(),
            compaction: CompactionOptions::default(),
            cache_bytes: 4 << 30,
            frame_cache_bytes: DEFAULT_FRAME_CACHE_BYTES,
            meta_cache_bytes: DEFAULT_META_CACHE_BYTES,
            read_only: false,
            hot_target_entries: DEFAULT_HOT_TARGET_ENTRIES,
            promotion_entries: promote::DEFAULT_PROMOTION_ENTRIES,
            account_rebase_min_changes: crate::account_log::REBASE_MIN_CHANGES,
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
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error("writer lease: {0}")]
    Lease(String),
    #[error("{0}")]
    Background(String),
    #[error("an earlier flush failed and its operations are not in any table; restart to replay them")]
    FlushFailed,
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IndexError + '_ {
    move |source| IndexError::Io { path: path.to_path_buf(), source }
}

/// Bytes held in memory by each bounded part of the index (`Index::memory_use`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Active and frozen memtables of all trees (`memtable_bytes` bounds the active ones).
    pub memtables: usize,
    /// Decoded frames (`frame_cache_bytes`).
    pub frame_cache: usize,
    /// Meta pages and column models (`meta_cache_bytes`).
    pub meta_cache: usize,
    /// Outline strings of every kind, pinned ones included (`outline_cache_entries`).
    pub outline_cache: usize,
    /// The revocations a merge holds, or keeps for the next (`compaction_max_revocations`).
    pub merge_revocations: usize,
    /// The accounts not active (about 9 bytes each: the one part that grows with the network's
    /// accounts, not with the configuration).
    pub account_states: usize,
}

impl MemoryUse {
    /// Every part, with its name.
    pub fn parts(&self) -> [(&'static str, usize); 6] {
        [
            ("memtables", self.memtables),
            ("frame_cache", self.frame_cache),
            ("meta_cache", self.meta_cache),
            ("outline_cache", self.outline_cache),
            ("merge_revocations", self.merge_revocations),
            ("account_states", self.account_states),
        ]
    }

    /// `memtables 61.2 MiB, frame_cache 0.0 MiB, ...`, for a log line.
    pub fn line(&self) -> String {
        let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
        self.parts().map(|(name, bytes)| format!("{name} {:.1} MiB", mib(bytes))).join(", ")
    }
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
    /// Of the flushes' time, what keeping the hot targets' tallies and hot links took.
    pub tally_micros: AtomicU64,
    /// Of that, what its reads of installed tables took, by what they read.
    pub tally_reads: TallyReadTimes,
    /// Time spent by merges, compressed bytes they read and wrote.
    pub compaction_micros: AtomicU64,
    pub compaction_bytes_in: AtomicU64,
    pub compaction_bytes_out: AtomicU64,
    /// Time spent and bytes put by table uploads.
    pub upload_micros: AtomicU64,
    pub upload_bytes: AtomicU64,
    /// Retired tables whose local files a merge left for a publish in flight to finish with.
    pub retired_files_kept_for_publish: AtomicU64,
    /// Bytes of local data copies evicted by the cache budget.
    pub cache_evicted_bytes: AtomicU64,
}

/// Of a flush's tallies, the time its reads of installed tables took, by what they read: the rest
/// of `WriteCounters::tally_micros` is computing the differences and the tallies written.
#[derive(Debug, Default)]
pub struct TallyReadTimes {
    /// The installed hot links of the flush's sources and of the records it revokes.
    pub hot_link_keys_micros: AtomicU64,
    /// The installed hot links of the accounts it reads whole (deleted, hidden or shown).
    pub hot_link_accounts_micros: AtomicU64,
    /// The revocations that may kill those installed hot links.
    pub revocations_micros: AtomicU64,
    /// The account tallies of the (account, target, collection, location)s the flush changes.
    pub account_tallies_micros: AtomicU64,
    /// Promotions: the candidates' entry bounds, the promoted targets' backlinks.
    pub promotions_micros: AtomicU64,
}

/// Adds the time since `started` to a microsecond counter.
pub(super) fn add_elapsed(counter: &AtomicU64, started: std::time::Instant) {
    counter.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
}

#[derive(Debug)]
pub(super) struct WriterState {
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
    /// The links of records that have more than one, by source (many-to-many queries).
    pub forward: Tree<ForwardLink>,
    /// The links to hot targets, by source account (what a deletion or a change of visibility
    /// changes in the tallies).
    pub hot: Tree<HotLink>,
    /// The hot targets' counts.
    pub tallies: Tree<Tally>,
    /// The hot targets' counts by account (what tells a flush whether a link it changes changes
    /// a target's distinct accounts).
    pub account_tallies: Tree<AccountTally>,
    pub store: Arc<dyn Store>,
    pub counters: WriteCounters,
    /// The frame and meta budgets the trees' caches share.
    caches: TreeCaches,
    options: IndexOptions,
    /// The accounts not active: hidden ones from the catalog, and those this process saw change.
    account_states: RwLock<AccountStates>,
    writer: Mutex<WriterState>,
    /// Held by the one compaction running at a time, with what merges have read of the
    /// revocation tree (so a merge reads only the revocation runs new since the last).
    compacting: Mutex<RevocationsRead>,
    /// What the merges' revocations hold in memory: the running merge's, or those kept for the
    /// next (`memory_use`).
    revocations_held_bytes: AtomicUsize,
    /// Every operation stamped at or below this clock is in the trees' installed tables, not only
    /// in memtables (so a merge knows every revocation up to it; see `KnownRevocations::settle`).
    tables_clock: AtomicU64,
    /// Entered by the one flush running at a time, from `begin_flush` to the end of its job.
    flushing: FlushGate,
    /// The targets with tallies, and those counts asked to promote.
    hot_targets: tally::HotTargets,
    /// Where a flush waits for the reads its tallies make.
    reads: reads::Reads,
    /// Set by a flush job that failed or was dropped unfinished; no flush runs after it.
    flush_failed: AtomicBool,
    /// The newest manifest this process published or followed (loaded from the bucket on first
    /// use): GC never deletes a table it names, and publishing extends its outline ranges.
    published: Mutex<Option<Published>>,
    /// Publishes in flight, and the local files of retired tables that wait for them.
    retired_files: retired::RetiredFiles,
    _lock: Option<File>,
}

impl Index {
    /// Opens (or creates) the index in `data_dir`; `seed` feeds table-id randomness.
    pub fn open(data_dir: &Path, store: Arc<dyn Store>, options: IndexOptions, seed: u64) -> Result<Self, IndexError> {
        std::fs::create_dir_all(data_dir).map_err(io_err(data_dir))?;
        let lock = if options.read_only { None } else { Some(lock_data_dir(data_dir)?) };
        let outlines = Outlines::open(
            &data_dir.join("outlines.db"),
            OutlineOptions { cache_entries: options.outline_cache_entries, map_bytes: options.outline_map_bytes },
        )?;
        let catalog = Catalog::open(&data_dir.join("state").join("state.db"))?;
        let tables_dir = data_dir.join("state").join("tables");
        let caches = TreeCaches::of_bytes(options.frame_cache_bytes, options.meta_cache_bytes);
        let links = Tree::new(tables_dir.join(TreeKind::Links.name()), options.table.clone(), caches.clone())
            .map_err(io_err(&tables_dir))?;
        let thresholds = Tree::new(tables_dir.join(TreeKind::Thresholds.name()), options.table.clone(), caches.clone())
            .map_err(io_err(&tables_dir))?;
        let forward = Tree::new(tables_dir.join(TreeKind::Forward.name()), options.table.clone(), caches.clone())
            .map_err(io_err(&tables_dir))?;
        let hot_table =
            TableOptions { filter_fpr: options.table.filter_fpr.min(tally::HOT_FILTER_FPR), ..options.table.clone() };
        let hot = Tree::new(tables_dir.join(TreeKind::Hot.name()), hot_table.clone(), caches.clone())
            .map_err(io_err(&tables_dir))?;
        let tallies = Tree::new(tables_dir.join(TreeKind::Tallies.name()), options.table.clone(), caches.clone())
            .map_err(io_err(&tables_dir))?;
        let account_tallies = Tree::new(tables_dir.join(TreeKind::AccountTallies.name()), hot_table, caches.clone())
            .map_err(io_err(&tables_dir))?;
        if lock.is_some() {
            // Files of tables a crash wrote but never committed; nothing else writes yet.
            let known = catalog.known_table_ids()?;
            links.remove_orphans(&known).map_err(io_err(links.dir()))?;
            thresholds.remove_orphans(&known).map_err(io_err(thresholds.dir()))?;
            forward.remove_orphans(&known).map_err(io_err(forward.dir()))?;
            hot.remove_orphans(&known).map_err(io_err(hot.dir()))?;
            tallies.remove_orphans(&known).map_err(io_err(tallies.dir()))?;
            account_tallies.remove_orphans(&known).map_err(io_err(account_tallies.dir()))?;
        }
        let mut account_states = AccountStates::default();
        catalog.visit_hidden_accounts(|did, state| account_states.push_sorted(did, state))?;
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
            forward,
            hot,
            tallies,
            account_tallies,
            store,
            counters: WriteCounters::default(),
            caches,
            options,
            account_states: RwLock::new(account_states),
            writer: Mutex::new(writer),
            compacting: Mutex::new(RevocationsRead::default()),
            revocations_held_bytes: AtomicUsize::new(0),
            tables_clock,
            flushing: FlushGate::default(),
            hot_targets: tally::HotTargets::default(),
            reads: reads::Reads::here(),
            flush_failed: AtomicBool::new(false),
            published: Mutex::new(None),
            retired_files: retired::RetiredFiles::default(),
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
        self.account_states().is_hidden(did)
    }

    /// The accounts not active, read-locked.
    pub(super) fn account_states(&self) -> std::sync::RwLockReadGuard<'_, AccountStates> {
        self.account_states.read().expect("account states lock poisoned")
    }

    /// Keeps the links whose source account is not hidden, under one read of the hidden set.
    pub fn retain_visible(&self, links: &mut Vec<Backlink>) {
        let states = self.account_states();
        if !states.is_empty() {
            links.retain(|link| !states.is_hidden(link.source.did));
        }
    }

    /// The account's state when it is not active (hidden or deleted), by DID string.
    pub fn account_state(&self, did: &str) -> Result<Option<AccountState>, IndexError> {
        let Some(did) = self.outlines.lookup(OutlineKind::Did, did)? else { return Ok(None) };
        Ok(Some(self.account_states().get(did)).filter(|state| *state != AccountState::Active))
    }

    /// Rebuilds the trees' run lists from the catalog, reusing open tables.
    pub(super) fn reload_trees(&self) -> Result<(), IndexError> {
        let mut by_tree: HashMap<TreeKind, Vec<_>> = TreeKind::ALL.into_iter().map(|k| (k, Vec::new())).collect();
        for record in self.catalog.tables()? {
            by_tree.get_mut(&record.tree).expect("every tree").push(record);
        }
        let mut of = |kind| by_tree.remove(&kind).expect("every tree");
        self.links.load(of(TreeKind::Links))?;
        self.thresholds.load(of(TreeKind::Thresholds))?;
        self.forward.load(of(TreeKind::Forward))?;
        self.hot.load(of(TreeKind::Hot))?;
        self.tallies.load(of(TreeKind::Tallies))?;
        self.account_tallies.load(of(TreeKind::AccountTallies))?;
        Ok(())
    }

    /// What the index's bounded structures hold in memory now, by part (what an operator's
    /// RSS is made of, beside the allocator's slack and the program itself).
    pub fn memory_use(&self) -> MemoryUse {
        MemoryUse {
            memtables: self.links.memtables_memory_bytes()
                + self.thresholds.memtables_memory_bytes()
                + self.forward.memtables_memory_bytes(),
            frame_cache: self.caches.frames.bytes(),
            meta_cache: self.caches.metas.bytes(),
            outline_cache: self.outlines.cache_memory_bytes(),
            merge_revocations: self.revocations_held_bytes.load(Ordering::Relaxed),
            account_states: self.account_states().memory_bytes(),
        }
    }

    /// Runs over every tree (merges waiting show as many runs).
    pub fn run_count(&self) -> usize {
        self.links.runs().len()
            + self.thresholds.runs().len()
            + self.forward.runs().len()
            + self.hot.runs().len()
            + self.tallies.runs().len()
            + self.account_tallies.runs().len()
    }

    /// A fresh table (or run) id: the catalog's durable sequence and 32 injected random bits.
    pub(super) fn new_table_id(&self, writer: &mut WriterState) -> Result<String, IndexError> {
        Ok(format!("{:016x}{:08x}", self.catalog.next_table_seq()?, splitmix64(&mut writer.entropy) as u32))
    }
}

impl Index {
    /// The files of tree `kind`'s tables, by table id.
    fn tree_files(&self, kind: TreeKind) -> &dyn TableFiles {
        match kind {
            TreeKind::Links => &self.links,
            TreeKind::Thresholds => &self.thresholds,
            TreeKind::Forward => &self.forward,
            TreeKind::Hot => &self.hot,
            TreeKind::Tallies => &self.tallies,
            TreeKind::AccountTallies => &self.account_tallies,
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

/// An index in `dir/data` over a `DirStore` bucket in `dir/bucket`, for unit tests.
#[cfg(test)]
pub(crate) fn open_in_dir(dir: &Path, options: IndexOptions) -> Index {
    let store = Arc::new(crate::store::dir::DirStore::new(dir.join("bucket")));
    Index::open(&dir.join("data"), store, options, 7).expect("a fresh test index opens")
}
