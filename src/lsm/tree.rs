//! A tree: one LSM of one entry type (backlinks or revocations) - memtables plus tables.
//!
//! Invariants:
//! - Queries see every entry that was written before they started: an entry lives in the active
//!   memtable, then in a frozen memtable, then in a table (or in none when its flush found it dead
//!   or superseded: no answer changes). A flush may stage its table before committing it: readers
//!   see a staged table as they saw the memtable it replaces, merges do not (it is in no run of
//!   `runs()` until `install_staged`). Each switch (frozen to staged or installed, staged to
//!   installed) happens under one write lock, so a reader (who takes memtable entries and the
//!   run list under one read lock) never falls between the two.
//! - A table file pair is complete on disk (written, fsynced, renamed) before it is installed.
//! - The run list is an immutable `Arc<Vec<_>>` swapped as a whole (a flush adds a delta run, a
//!   compaction swaps its input runs for its output run in one step); a reader's snapshot never
//!   changes under it. Runs are kept oldest first.

use crate::base::durable::sync_dir;
use crate::lsm::cache::{Budget, FrameCache};
use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::handle::{FilterProbe, ReadError, TableHandle, fetch_meta_start, fetch_whole_meta};
use crate::lsm::memtable::Memtable;
use crate::lsm::record::TableRecord;
use crate::lsm::run::{Run, group_by_shard, shard_hash};
use crate::lsm::table::{
    FormatError, MetaCache, PageUse, Spills, TableBuilder, TableOptions, TableSummary, learn_models,
};
use crate::model::ids::RecordId;
use crate::store::object::Store;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

#[derive(Debug)]
struct TreeState<E: Entry> {
    active: Memtable<E>,
    frozen: Vec<Arc<Memtable<E>>>,
    /// The committed runs, oldest first: what merges choose from.
    runs: Arc<Vec<Arc<Run<E>>>>,
    /// Flushed tables not yet committed, each a delta run newer than every committed one.
    staged: Vec<Arc<Run<E>>>,
    /// `runs` then `staged`: what readers see.
    visible: Arc<Vec<Arc<Run<E>>>>,
}

impl<E: Entry> TreeState<E> {
    fn empty() -> Self {
        let runs = Arc::new(Vec::new());
        TreeState { active: Memtable::default(), frozen: Vec::new(), visible: runs.clone(), runs, staged: Vec::new() }
    }

    /// Sets the committed runs (the staged ones stay), and what readers see.
    fn set_runs(&mut self, runs: Vec<Arc<Run<E>>>) {
        self.runs = Arc::new(runs);
        self.refresh_visible();
    }

    /// What readers see: the committed runs, then the staged ones.
    fn refresh_visible(&mut self) {
        self.visible = match self.staged.is_empty() {
            true => self.runs.clone(),
            false => Arc::new(self.runs.iter().chain(&self.staged).cloned().collect()),
        };
    }

    fn drop_frozen(&mut self, memtable: &Arc<Memtable<E>>) {
        self.frozen.retain(|m| !Arc::ptr_eq(m, memtable));
    }
}

/// What a reader sees at one instant: matching memtable entries and the runs (committed and
/// staged).
pub struct Snapshot<E: Entry> {
    pub memtable_entries: Vec<E>,
    pub runs: Arc<Vec<Arc<Run<E>>>>,
}

impl<E: Entry> Snapshot<E> {
    /// The tables that may hold entries whose key is `key`, oldest run first: in each run the
    /// table of the key's shard, when its filter admits the key.
    pub fn tables_for_key(&self, key: &RecordId) -> Vec<Arc<TableHandle<E>>> {
        let (probe, shard) = (FilterProbe::of_key(key), shard_hash::<E>(key));
        let tables = self.runs.iter().map(|run| run.table_for_hash(shard));
        tables.filter(|table| table.may_contain(probe)).cloned().collect()
    }

    /// How many entries of `key` there may be: the memtables' ones, and in each table every
    /// entry of the frames that may hold it (from the frame index alone). At least the key's
    /// entries, copies and dead ones included. For a writer (a flush choosing targets to
    /// promote): the filter pages and index chunks it reads go to no cache.
    pub fn entries_bound(&self, key: &RecordId) -> Result<u64, ReadError> {
        let mut bound = self.memtable_entries.iter().filter(|entry| entry.key() == *key).count() as u64;
        for (table, _) in self.tables_for_keys(&[(*key, None)], PageUse::Scan) {
            let (_, infos) = table.frame_infos_for_key(*key, PageUse::Scan)?;
            bound += infos.iter().map(|frame| u64::from(frame.entries)).sum::<u64>();
        }
        Ok(bound)
    }

    /// Before `tables_for_key(s)`: fetches from the bucket what a lookup of `keys` reads in tables
    /// whose metas are partial copies (nothing for the others, nor for a key in tables its bound
    /// excludes, as `tables_for_keys` does).
    pub async fn fetch_metas_for_keys(
        &self,
        store: &dyn Store,
        keys: &[(RecordId, Option<u64>)],
    ) -> Result<(), ReadError> {
        let partial_runs: Vec<&Arc<Run<E>>> = self.runs.iter().filter(|run| run.partial_metas).collect();
        if partial_runs.is_empty() {
            return Ok(());
        }
        // Keys by table, so that each table fetches each of its pieces once.
        let mut by_table: Vec<(&Arc<TableHandle<E>>, Vec<RecordId>)> = Vec::new();
        for (key, bound) in keys {
            let hash = shard_hash::<E>(key);
            let tables = partial_runs.iter().map(|run| run.table_for_hash(hash));
            for table in tables.filter(|t| t.meta_is_partial() && t.record.has_stamps_above(*bound)) {
                match by_table.iter_mut().find(|(t, _)| Arc::ptr_eq(t, table)) {
                    Some((_, members)) => members.push(*key),
                    None => by_table.push((table, vec![*key])),
                }
            }
        }
        let fetches = by_table.iter().map(|(table, keys)| table.fetch_meta_for_keys(store, keys));
        futures::future::try_join_all(fetches).await.map(|_| ())
    }

    /// `tables_for_key` for many keys at once: every table that may hold any of them, with those
    /// keys (in `keys` order), oldest run first. A key with a bound (`Some(stamp)`) is not looked
    /// for in tables whose entries are all stamped at or below it (`TableRecord::max_stamp`).
    /// For a scan (a writer's many keys), each table's filter pages are read once for all of its
    /// keys and go to no cache, so a flush probing keys all over a tree neither fills the meta
    /// cache nor evicts what queries keep there.
    pub fn tables_for_keys(
        &self,
        keys: &[(RecordId, Option<u64>)],
        with: PageUse,
    ) -> Vec<(Arc<TableHandle<E>>, Vec<RecordId>)> {
        let looks: Vec<Look> = keys.iter().map(|&(key, bound)| Look::of_key(key, bound)).collect();
        let tables = self.tables_for_looks(&looks, with);
        tables.into_iter().map(|(table, members)| (table, members.into_iter().map(|i| keys[i].0).collect())).collect()
    }

    /// `tables_for_keys` for lookups that may ask the filters for more than a key: every table
    /// that may hold any of `looks`, with the indices of those (ascending), oldest run first.
    pub fn tables_for_looks(&self, looks: &[Look], with: PageUse) -> Vec<(Arc<TableHandle<E>>, Vec<usize>)> {
        let shards: Vec<u64> = looks.iter().map(|look| shard_hash::<E>(&look.key)).collect();
        self.runs.iter().flat_map(|run| looks_by_table(run, looks, &shards, with)).collect()
    }
}

/// One lookup as the tables see it: its key (which chooses a compacted run's table), the stamp
/// its entries must be above to be wanted (`None`: every one), and what the filters are asked.
#[derive(Debug, Clone, Copy)]
pub struct Look {
    pub key: RecordId,
    pub bound: Option<u64>,
    pub probe: FilterProbe,
}

impl Look {
    /// Every entry of `key` stamped above `bound`.
    pub fn of_key(key: RecordId, bound: Option<u64>) -> Self {
        Look { key, bound, probe: FilterProbe::of_key(&key) }
    }

    /// Every entry that agrees with `probe` in its first `Entry::FILTER_WIDTH` bytes.
    pub fn of_prefix<E: Entry>(probe: &E) -> Self {
        Look { key: probe.key(), bound: None, probe: FilterProbe::of_prefix(probe) }
    }
}

/// The looks each table of `run` may hold (its shard of them, newer than their bounds, admitted
/// by its filter), as indices into `looks`; `shards` are their shard hashes, computed once for
/// all runs.
fn looks_by_table<E: Entry>(
    run: &Run<E>,
    looks: &[Look],
    shards: &[u64],
    with: PageUse,
) -> Vec<(Arc<TableHandle<E>>, Vec<usize>)> {
    // A table whose entries are all at or below a look's bound has nothing of it that is wanted.
    let wanted = (0..looks.len())
        .map(|i| (run.shard_for_hash(shards[i]), i))
        .filter(|&(shard, i)| run.tables[shard].record.has_stamps_above(looks[i].bound));
    let groups = group_by_shard(wanted);
    // Every look's filter line is requested before any is tested, so the cache misses overlap
    // (this probe loop was 6 % of a warm server's CPU, by profile).
    for (shard, members) in &groups {
        members.iter().for_each(|&i| run.tables[*shard].prefetch(looks[i].probe));
    }
    let admitted_of = |(shard, members): (usize, Vec<usize>)| {
        let table = &run.tables[shard];
        let probes: Vec<FilterProbe> = members.iter().map(|&i| looks[i].probe).collect();
        let admitted = table.may_contain_many(&probes, with);
        let found: Vec<usize> =
            members.iter().zip(admitted).filter_map(|(&i, admitted)| admitted.then_some(i)).collect();
        (!found.is_empty()).then(|| (table.clone(), found))
    };
    groups.into_iter().filter_map(admitted_of).collect()
}

/// The memory a tree's readers may keep: decoded frames and meta pages, each within a budget
/// the tree may share with others.
#[derive(Debug, Clone)]
pub struct TreeCaches {
    pub frames: Arc<Budget>,
    pub metas: Arc<Budget>,
}

impl TreeCaches {
    /// Budgets of their own, of these many bytes.
    pub fn of_bytes(frame_bytes: usize, meta_bytes: usize) -> Self {
        TreeCaches { frames: Budget::new(frame_bytes), metas: Budget::new(meta_bytes) }
    }
}

#[derive(Debug)]
pub struct Tree<E: Entry> {
    dir: PathBuf,
    options: TableOptions,
    /// Decoded frames of this tree's tables, shared by all of them.
    pub frame_cache: Arc<FrameCache<E>>,
    /// Pages of this tree's paged metas (filter pages, frame-index chunks).
    pub meta_cache: Arc<MetaCache<E>>,
    state: RwLock<TreeState<E>>,
}

impl<E: Entry> Tree<E> {
    /// `dir` holds this tree's local table files; `caches` bound its decoded frames and its
    /// meta pages.
    pub fn new(dir: PathBuf, options: TableOptions, caches: TreeCaches) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let state = TreeState::empty();
        let frame_cache = FrameCache::within(&caches.frames);
        let meta_cache = MetaCache::within(&caches.metas);
        Ok(Self { dir, options, frame_cache, meta_cache, state: RwLock::new(state) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn insert(&self, entries: impl IntoIterator<Item = E>) {
        let mut state = self.state.write().expect("tree lock poisoned");
        for entry in entries {
            state.active.insert(entry);
        }
    }

    /// Bytes in the active memtable.
    pub fn memtable_bytes(&self) -> usize {
        self.state.read().expect("tree lock poisoned").active.bytes()
    }

    /// The memory its memtables take: the active one and those frozen for a flush.
    pub fn memtables_memory_bytes(&self) -> usize {
        let state = self.state.read().expect("tree lock poisoned");
        state.active.memory_bytes() + state.frozen.iter().map(|m| m.memory_bytes()).sum::<usize>()
    }

    /// Entries `e` with `lo <= e <= hi` of each of `ranges` from every memtable, plus the run
    /// list, taken atomically. The ranges are an iterator (walked once a memtable) so that a
    /// lookup of many keys need not hold them all as entries.
    pub fn snapshot<I>(&self, ranges: I) -> Snapshot<E>
    where
        I: IntoIterator<Item = (E, E)>,
        I::IntoIter: Clone,
    {
        let ranges = ranges.into_iter();
        let state = self.state.read().expect("tree lock poisoned");
        let mut memtable_entries = Vec::new();
        for memtable in std::iter::once(&state.active).chain(state.frozen.iter().map(|m| m.as_ref())) {
            for (lo, hi) in ranges.clone() {
                memtable_entries.extend(memtable.range(lo, hi).copied());
            }
        }
        Snapshot { memtable_entries, runs: state.visible.clone() }
    }

    /// Every table of every committed run, oldest run first.
    pub fn tables(&self) -> Vec<Arc<TableHandle<E>>> {
        self.runs().iter().flat_map(|run| run.tables.iter().cloned()).collect()
    }

    /// The committed runs (no staged one), oldest first.
    pub fn runs(&self) -> Arc<Vec<Arc<Run<E>>>> {
        self.state.read().expect("tree lock poisoned").runs.clone()
    }

    /// Sets the run list to the tables `records` name (catalog order, grouped by run), reusing
    /// tables already open and opening the others from their local metas.
    pub fn load(&self, records: Vec<TableRecord>) -> Result<(), ReadError> {
        let open: std::collections::HashMap<String, Arc<TableHandle<E>>> =
            self.tables().into_iter().map(|t| (t.record.id.clone(), t)).collect();
        let mut grouped: Vec<(String, Vec<Arc<TableHandle<E>>>)> = Vec::new();
        for record in records {
            let table = match open.get(&record.id) {
                Some(table) => table.clone(),
                None => Arc::new(self.open_table(record)?),
            };
            match grouped.iter_mut().find(|(run_id, _)| *run_id == table.record.run_id) {
                Some((_, members)) => members.push(table),
                None => grouped.push((table.record.run_id.clone(), vec![table])),
            }
        }
        let mut runs = Vec::with_capacity(grouped.len());
        for (run_id, members) in grouped {
            let run = Run::from_tables(members).ok_or_else(|| ReadError::Corrupt {
                object: format!("run {run_id}"),
                source: FormatError::Invalid { what: "catalog", detail: "run with missing or repeated shards".into() },
            })?;
            runs.push(Arc::new(run));
        }
        self.state.write().expect("tree lock poisoned").set_runs(runs);
        Ok(())
    }

    /// Moves the active memtable aside (still visible to readers) so it can be written out.
    pub fn freeze(&self) -> Option<Arc<Memtable<E>>> {
        let mut state = self.state.write().expect("tree lock poisoned");
        if state.active.is_empty() {
            return None;
        }
        let frozen = Arc::new(std::mem::take(&mut state.active));
        state.frozen.push(frozen.clone());
        Some(frozen)
    }

    /// Writes sorted, unique entries as table `id`.
    /// `entries` gives them twice: once to learn the column models from, once to write (entries
    /// in memory, such as a frozen memtable's, need no spill that way).
    pub fn write_sorted<I: Iterator<Item = E>>(
        &self,
        id: &str,
        entries: impl Fn() -> I,
    ) -> std::io::Result<TableSummary> {
        let mut writer = self.table_writer(id, learn_models(entries(), &self.options))?;
        for entry in entries() {
            writer.push(&entry)?;
        }
        writer.finish()
    }

    /// A writer of table `id` under column models already decided (a flush's, or a merge's,
    /// shared by all its tables), whose files become visible (durably) only at `finish`; it
    /// spills its key hashes and finished frame-index chunks to unlinked files.
    pub fn table_writer(&self, id: &str, models: Option<Arc<ColumnModels>>) -> std::io::Result<TableWriter<E>> {
        let (data_path, meta_path) = (self.local_path(id, "data"), self.local_path(id, "meta"));
        let tmp_data = data_path.with_extension("data.tmp");
        let file = BufWriter::new(File::create(&tmp_data)?);
        let spills = Spills {
            keys: Box::new(anonymous_spill(&tmp_data, "keys")?),
            index: Box::new(anonymous_spill(&tmp_data, "index")?),
        };
        let builder = TableBuilder::with_spills(file, spills, models, &self.options)?;
        Ok(TableWriter { builder, tmp_data, data_path, meta_path, dir: self.dir.clone() })
    }

    /// An empty file in this tree's directory, already unlinked (it disappears with its last
    /// handle, crash or not), for a merge's spill of raw entries while it learns its models.
    pub fn anonymous_spill(&self, name: &str) -> std::io::Result<File> {
        anonymous_spill(&self.dir.join(name), "spill")
    }

    /// How this tree writes its tables.
    pub fn table_options(&self) -> &TableOptions {
        &self.options
    }

    /// Deletes the local files of table `id` (a retired table; missing files are fine).
    pub fn remove_local(&self, id: &str) -> std::io::Result<()> {
        for ext in ["data", "meta", "part"] {
            match std::fs::remove_file(self.local_path(id, ext)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Deletes local table files the catalog does not name: leftovers of a crash between
    /// writing a table and committing it. Only safe before anything starts writing tables.
    pub fn remove_orphans(&self, live_ids: &std::collections::HashSet<String>) -> std::io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let id = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.split('.').next()).unwrap_or("");
            if !live_ids.contains(id) {
                std::fs::remove_file(&path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Fetches table `record`'s meta from the bucket into this tree's directory, checked: whole
    /// (`whole`), or its resident part only, as a partial copy that queries fill as they need.
    pub async fn fetch_meta(&self, store: &dyn Store, record: &TableRecord, whole: bool) -> Result<(), ReadError> {
        let (meta, part) = (self.local_path(&record.id, "meta"), self.local_path(&record.id, "part"));
        match whole {
            true => fetch_whole_meta::<E>(store, record, &meta).await,
            false => fetch_meta_start::<E>(store, record, (&meta, &part)).await,
        }
    }

    /// Fetches whole every meta still partial, one at a time (see `TableHandle::complete_meta`).
    /// Returns how many it completed.
    pub async fn complete_partial_metas(&self, store: &dyn Store) -> Result<usize, ReadError> {
        let partial: Vec<_> = self.tables().into_iter().filter(|t| t.meta_is_partial()).collect();
        for table in &partial {
            let id = &table.record.id;
            table.complete_meta(store, &self.local_path(id, "part"), &self.local_path(id, "meta")).await?;
        }
        Ok(partial.len())
    }

    /// Opens a table whose files are on local disk (its meta, or its partial copy, required; its
    /// data optional = not cached).
    pub fn open_table(&self, record: TableRecord) -> Result<TableHandle<E>, ReadError> {
        let (meta, part) = (self.local_path(&record.id, "meta"), self.local_path(&record.id, "part"));
        let data = self.local_path(&record.id, "data");
        TableHandle::open(record, (&meta, &part, data), (self.frame_cache.clone(), self.meta_cache.clone()))
    }

    /// Makes `table` visible as a delta run and drops the frozen memtable it replaces, in one step.
    pub fn install(&self, table: TableHandle<E>, replaces: Option<&Arc<Memtable<E>>>) {
        let run = delta_run(table);
        let mut state = self.state.write().expect("tree lock poisoned");
        let runs = state.runs.iter().cloned().chain([run]).collect();
        state.set_runs(runs);
        if let Some(frozen) = replaces {
            state.drop_frozen(frozen);
        }
    }

    /// Makes `table`, written but not committed, visible to readers in place of the frozen
    /// memtable it replaces, in one step, so that the memtable's memory goes before the commit.
    /// Merges do not see it until `install_staged`.
    pub fn stage(&self, table: TableHandle<E>, replaces: &Arc<Memtable<E>>) -> Arc<Run<E>> {
        let run = delta_run(table);
        let mut state = self.state.write().expect("tree lock poisoned");
        state.staged.push(run.clone());
        state.refresh_visible();
        state.drop_frozen(replaces);
        run
    }

    /// After its commit: the staged `run` joins the committed runs (readers see no change).
    pub fn install_staged(&self, run: &Arc<Run<E>>) {
        let mut state = self.state.write().expect("tree lock poisoned");
        assert!(state.staged.iter().any(|r| Arc::ptr_eq(r, run)), "installing a run that is not staged");
        state.staged.retain(|r| !Arc::ptr_eq(r, run));
        let runs = state.runs.iter().cloned().chain([run.clone()]).collect();
        state.set_runs(runs);
    }

    /// Drops a frozen memtable whose flush wrote no table (every entry in it was dead).
    pub fn retire_frozen(&self, memtable: &Arc<Memtable<E>>) {
        self.state.write().expect("tree lock poisoned").drop_frozen(memtable);
    }

    /// Swaps the runs `removed` for `added` in one step (a compaction's result). The new run takes
    /// the place of the oldest removed one, so the list stays oldest first.
    pub fn replace_runs(&self, removed: &[String], added: Run<E>) {
        let mut state = self.state.write().expect("tree lock poisoned");
        let position = state.runs.iter().position(|r| removed.contains(&r.id)).unwrap_or(state.runs.len());
        let mut runs: Vec<_> = state.runs.iter().filter(|r| !removed.contains(&r.id)).cloned().collect();
        runs.insert(position.min(runs.len()), Arc::new(added));
        state.set_runs(runs);
    }

    pub fn local_path(&self, id: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{id}.{ext}"))
    }

    /// Tells the open table `id`, if there is one, that the bucket has it (a corrupt local copy
    /// may then be dropped and read from there).
    pub fn mark_uploaded(&self, id: &str) {
        self.tables().iter().filter(|t| t.record.id == id).for_each(|t| t.mark_uploaded());
    }
}

/// A flushed table as the one-table delta run it makes.
fn delta_run<E: Entry>(table: TableHandle<E>) -> Arc<Run<E>> {
    Arc::new(Run::from_tables(vec![Arc::new(table)]).expect("a flushed table is a whole delta run"))
}

/// A tree's table files by id, whatever its entry type: what the owner of several trees needs
/// to upload, drop or mark a table that a catalog row names.
pub trait TableFiles {
    /// The directory of the tree's local table files.
    fn dir(&self) -> &Path;
    /// Deletes the local files of table `id` (missing files are fine).
    fn remove_local(&self, id: &str) -> std::io::Result<()>;
    /// See `Tree::mark_uploaded`.
    fn mark_uploaded(&self, id: &str);
}

impl<E: Entry> TableFiles for Tree<E> {
    fn dir(&self) -> &Path {
        Tree::dir(self)
    }

    fn remove_local(&self, id: &str) -> std::io::Result<()> {
        Tree::remove_local(self, id)
    }

    fn mark_uploaded(&self, id: &str) {
        Tree::mark_uploaded(self, id)
    }
}

/// Streams sorted entries into a table's files; `finish` makes them durable and visible.
pub struct TableWriter<E: Entry> {
    builder: TableBuilder<E, BufWriter<File>>,
    tmp_data: PathBuf,
    data_path: PathBuf,
    meta_path: PathBuf,
    dir: PathBuf,
}

impl<E: Entry> TableWriter<E> {
    pub fn push(&mut self, entry: &E) -> std::io::Result<()> {
        self.builder.push(entry)
    }

    /// Data file fsynced and renamed into place, then the meta file, then the directory.
    pub fn finish(self) -> std::io::Result<TableSummary> {
        let tmp_meta = self.meta_path.with_extension("tmp");
        let mut meta = BufWriter::new(File::create(&tmp_meta)?);
        let (file, summary) = self.builder.finish_to(&mut meta)?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&self.tmp_data, &self.data_path)?;
        meta.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp_meta, &self.meta_path)?;
        sync_dir(&self.dir)?;
        Ok(summary)
    }
}

/// A spill file named after `beside` with `extension`, unlinked at once: it disappears with its
/// last handle, crash or not. Unbuffered: its writers write and read large pieces.
pub(super) fn anonymous_spill(beside: &Path, extension: &str) -> std::io::Result<File> {
    let path = beside.with_extension(extension);
    let file = File::options().read(true).write(true).create(true).truncate(true).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}
