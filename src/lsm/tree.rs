//! A tree: one LSM of one entry type (backlinks or revocations) - memtables plus tables.
//!
//! Invariants:
//! - Queries see every entry that was written before they started: an entry lives in the active
//!   memtable, then in a frozen memtable, then in a table (or in none when its flush found it dead
//!   or superseded: no answer changes), and the switch from frozen
//!   memtable to table happens under one write lock, so a reader (who takes memtable entries and
//!   the table list under one read lock) never falls between the two.
//! - A table file pair is complete on disk (written, fsynced, renamed) before it is installed.
//! - The run list is an immutable `Arc<Vec<_>>` swapped as a whole (a flush adds a delta run, a
//!   compaction swaps its input runs for its output run in one step); a reader's snapshot never
//!   changes under it. Runs are kept oldest first.
//! - Entries reach a reader only from frames that passed their checksums. A corrupt frame is
//!   reported (`verify::report_corruption`) and fails the read with an error naming the object;
//!   a corrupt local copy of an uploaded table is deleted and the read served from the bucket
//!   (a table not yet uploaded exists nowhere else, so its local copy is never deleted).

use crate::catalog::TableRecord;
use crate::lsm::cache::{FrameCache, next_serial};
use crate::lsm::entry::Entry;
use crate::lsm::memtable::Memtable;
use crate::lsm::run::Run;
use crate::lsm::table::{
    FormatError, TableBuilder, TableMeta, TableOptions, TableSummary, decode_frames, learn_models,
};
use crate::store::object::{Store, StoreError};
use crate::verify::{ObjectKind, Place, report_corruption};
use bytes::Bytes;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Decoded entries of a range of frames: all in one vector, or one shared slice per frame.
enum Decoded<E> {
    Whole(Vec<E>),
    Framed(Vec<Arc<[E]>>),
}

/// The entries of consecutive frames in one vector.
fn concat<E: Copy>(frames: &[Arc<[E]>]) -> Vec<E> {
    let mut out = Vec::with_capacity(frames.iter().map(|f| f.len()).sum());
    frames.iter().for_each(|frame| out.extend_from_slice(frame));
    out
}

/// Largest local read done on the calling thread rather than the blocking pool.
const INLINE_READ_BYTES: u64 = 256 * 1024;

/// Why a read of a table failed. Corruption always names the object.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("corrupt object {object}: {source}")]
    Corrupt { object: String, source: FormatError },
    #[error("reading {object}: {source}")]
    Io { object: String, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One table: its catalog record, its decoded meta, and (when cached locally) its data file.
#[derive(Debug)]
pub struct TableHandle<E: Entry> {
    pub record: TableRecord,
    pub meta: TableMeta<E>,
    /// The local copy of the data file, while cached (`None`: read by range from the bucket).
    local_data: RwLock<Option<Arc<File>>>,
    /// Where the local copy of the data file lives (while cached).
    data_path: PathBuf,
    /// The bucket holds the data file: a corrupt local copy can be dropped and read from there.
    uploaded: AtomicBool,
    /// `READ_TICKS` at the last read: the cache evicts the least recently read tables first.
    last_read: AtomicU64,
    /// Decoded frames of this tree's tables, and this table's key in it.
    frame_cache: Arc<FrameCache<E>>,
    serial: u64,
}

/// A logical clock of table reads (not wall time): orders tables by recency for eviction.
static READ_TICKS: AtomicU64 = AtomicU64::new(0);
/// Table data reads served from the local cache, and from the bucket (process-wide, for metrics).
pub static LOCAL_READS: AtomicU64 = AtomicU64::new(0);
pub static BUCKET_READS: AtomicU64 = AtomicU64::new(0);

impl<E: Entry> TableHandle<E> {
    /// Object key of the data file in the bucket.
    pub fn data_key(&self) -> String {
        table_key(E::TREE, &self.record.id, "data")
    }

    /// Reads and decodes frames `frames`: from the frame cache when all of them are there, else
    /// with one ranged read (local file or the bucket), caching each frame it decodes.
    pub async fn read_frames(&self, store: &dyn Store, frames: Range<usize>) -> Result<Vec<E>, ReadError> {
        self.read_frames_with(store, frames, true).await
    }

    /// The entries of `frames` as sorted slices (together in order), without copying: the
    /// decoded frames themselves, from the cache or read now (and cached). A query searches them
    /// for its keys instead of copying whole frames.
    pub async fn read_frame_slices(&self, store: &dyn Store, frames: Range<usize>) -> Result<Vec<Arc<[E]>>, ReadError> {
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(cached) = self.cached_frames(frames.clone()) {
            return Ok(cached);
        }
        Ok(match self.read_decoded(store, frames, true).await? {
            Decoded::Whole(entries) => vec![entries.into()],
            Decoded::Framed(frames) => frames,
        })
    }

    /// `read_frames`; a scan that reads every frame once (a compaction) passes `use_cache: false`
    /// so it neither pollutes the cache nor is slowed by it.
    pub async fn read_frames_with(
        &self,
        store: &dyn Store,
        frames: Range<usize>,
        use_cache: bool,
    ) -> Result<Vec<E>, ReadError> {
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        if use_cache && let Some(cached) = self.cached_frames(frames.clone()) {
            return Ok(concat(&cached));
        }
        Ok(match self.read_decoded(store, frames, use_cache).await? {
            Decoded::Whole(entries) => entries,
            Decoded::Framed(frames) => concat(&frames),
        })
    }

    /// Reads and decodes `frames` with one ranged read. A local copy that fails its checksums
    /// is reported and, when the bucket has the table, dropped for the bucket's copy.
    async fn read_decoded(
        &self,
        store: &dyn Store,
        frames: Range<usize>,
        use_cache: bool,
    ) -> Result<Decoded<E>, ReadError> {
        let (start, end) = self.meta.byte_range(frames.clone());
        let replaceable = self.uploaded.load(Ordering::Acquire);
        let failure = match self.read_range(store, start, end - start).await {
            Ok((bytes, place)) => match self.decode_range(frames.clone(), start, &bytes, use_cache) {
                Ok(entries) => return Ok(entries),
                Err(source) if place == Place::Local && replaceable => source.to_string(),
                Err(source) => return Err(self.corrupt(place, source)),
            },
            // A local copy that cannot even be read (truncated, say) is as bad as a corrupt one.
            Err(ReadError::Io { source, .. }) if replaceable => source.to_string(),
            Err(e) => return Err(e),
        };
        report_corruption(ObjectKind::Data, Place::Local, &self.local_data_name(), &failure);
        self.drop_local_copy();
        BUCKET_READS.fetch_add(1, Ordering::Relaxed);
        let bytes = store.get_range(&self.data_key(), start, end - start).await?;
        self.decode_range(frames, start, &bytes, use_cache).map_err(|source| self.corrupt(Place::Bucket, source))
    }

    /// Every frame of `frames` from the frame cache, or `None` if one is missing.
    fn cached_frames(&self, frames: Range<usize>) -> Option<Vec<Arc<[E]>>> {
        frames.map(|i| self.frame_cache.get(self.serial, i as u32)).collect()
    }

    /// Decodes `frames` from `bytes` (read from data-file offset `start`), checking every frame.
    /// With `use_cache`, frame by frame, each one cached as it is (no copy); without, all at once.
    fn decode_range(
        &self,
        frames: Range<usize>,
        start: u64,
        bytes: &[u8],
        use_cache: bool,
    ) -> Result<Decoded<E>, FormatError> {
        if !use_cache {
            let mut out = Vec::new();
            decode_frames(&self.meta, frames, bytes, &mut out)?;
            return Ok(Decoded::Whole(out));
        }
        let mut out = Vec::with_capacity(frames.len());
        for i in frames {
            let (frame_start, frame_end) = self.meta.byte_range(i..i + 1);
            let slice = &bytes[(frame_start - start) as usize..(frame_end - start) as usize];
            let mut decoded = Vec::new();
            decode_frames(&self.meta, i..i + 1, slice, &mut decoded)?;
            let decoded: Arc<[E]> = decoded.into();
            self.frame_cache.insert(self.serial, i as u32, decoded.clone());
            out.push(decoded);
        }
        Ok(Decoded::Framed(out))
    }

    /// Logs and counts a corrupt data file, and the error (naming it) that the reader returns.
    fn corrupt(&self, place: Place, source: FormatError) -> ReadError {
        let object = match place {
            Place::Bucket => self.data_key(),
            Place::Local => self.local_data_name(),
        };
        report_corruption(ObjectKind::Data, place, &object, &source);
        ReadError::Corrupt { object, source }
    }

    /// How errors name the local copy of the data file.
    fn local_data_name(&self) -> String {
        format!("{} (local copy {})", self.data_key(), self.data_path.display())
    }

    /// Stops reading the local copy and deletes it; the bucket's copy serves from now on.
    fn drop_local_copy(&self) {
        if self.local_data.write().expect("table lock poisoned").take().is_none() {
            return; // another reader dropped it already
        }
        if let Err(e) = std::fs::remove_file(&self.data_path) {
            tracing::warn!(path = %self.data_path.display(), error = %e, "could not delete a corrupt local copy");
        }
    }

    /// Reads `len` bytes at `offset` of the data file: from the local copy when there is one.
    async fn read_range(&self, store: &dyn Store, offset: u64, len: u64) -> Result<(Bytes, Place), ReadError> {
        self.last_read.store(READ_TICKS.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        let local = self.local_data.read().expect("table lock poisoned").clone();
        let Some(file) = local else {
            BUCKET_READS.fetch_add(1, Ordering::Relaxed);
            return Ok((store.get_range(&self.data_key(), offset, len).await?, Place::Bucket));
        };
        LOCAL_READS.fetch_add(1, Ordering::Relaxed);
        let object = self.data_key();
        let read = move || {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, offset).map(|_| Bytes::from(buf))
        };
        // A query's read (a frame or a few, usually in the page cache) is a few microseconds:
        // handing it to the blocking pool cost more in thread wake-ups than the read itself
        // (a tenth of a warm query's CPU, by profile). Large reads (compaction) still go there.
        let bytes = if len <= INLINE_READ_BYTES {
            read()
        } else {
            tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| ReadError::Io { object: object.clone(), source: std::io::Error::other(e) })?
        };
        let bytes = bytes.map_err(|source| ReadError::Io { object, source })?;
        Ok((bytes, Place::Local))
    }

    /// Records that the bucket now holds this table (after its upload).
    pub fn mark_uploaded(&self) {
        self.uploaded.store(true, Ordering::Release);
    }
}

impl<E: Entry> TableHandle<E> {
    /// Bytes of the local data copy (0 when not cached).
    pub fn cached_bytes(&self) -> u64 {
        if self.local_data.read().expect("table lock poisoned").is_some() { self.record.data_len } else { 0 }
    }

    pub fn last_read(&self) -> u64 {
        self.last_read.load(Ordering::Relaxed)
    }

    /// Drops the local data copy (reads go to the bucket from now on) and deletes its file. The
    /// caller checks the table is uploaded. Readers holding the open file finish unharmed.
    pub fn evict_local(&self, dir: &Path) -> std::io::Result<u64> {
        let Some(_file) = self.local_data.write().expect("table lock poisoned").take() else { return Ok(0) };
        match std::fs::remove_file(dir.join(format!("{}.data", self.record.id))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(self.record.data_len),
        }
    }
}

/// `tables/<tree>/<id>.<ext>`: the object key of a table file.
pub fn table_key(tree: &str, id: &str, ext: &str) -> String {
    format!("tables/{tree}/{id}.{ext}")
}

#[derive(Debug)]
struct TreeState<E: Entry> {
    active: Memtable<E>,
    frozen: Vec<Arc<Memtable<E>>>,
    runs: Arc<Vec<Arc<Run<E>>>>,
}

/// What a reader sees at one instant: matching memtable entries and the run list.
pub struct Snapshot<E: Entry> {
    pub memtable_entries: Vec<E>,
    pub runs: Arc<Vec<Arc<Run<E>>>>,
}

#[derive(Debug)]
pub struct Tree<E: Entry> {
    dir: PathBuf,
    options: TableOptions,
    /// Decoded frames of this tree's tables, shared by all of them.
    pub frame_cache: Arc<FrameCache<E>>,
    state: RwLock<TreeState<E>>,
}

impl<E: Entry> Tree<E> {
    /// `dir` holds this tree's local table files; `frame_cache_bytes` bounds its decoded frames.
    pub fn new(dir: PathBuf, options: TableOptions, frame_cache_bytes: usize) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let state = TreeState { active: Memtable::default(), frozen: Vec::new(), runs: Arc::new(Vec::new()) };
        let frame_cache = Arc::new(FrameCache::new(frame_cache_bytes));
        Ok(Self { dir, options, frame_cache, state: RwLock::new(state) })
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

    /// Entries `e` with `lo <= e <= hi` from every memtable, plus the run list, taken atomically.
    pub fn snapshot(&self, ranges: &[(E, E)]) -> Snapshot<E> {
        let state = self.state.read().expect("tree lock poisoned");
        let mut memtable_entries = Vec::new();
        for memtable in std::iter::once(&state.active).chain(state.frozen.iter().map(|m| m.as_ref())) {
            for (lo, hi) in ranges {
                memtable_entries.extend(memtable.range(*lo, *hi).copied());
            }
        }
        Snapshot { memtable_entries, runs: state.runs.clone() }
    }

    /// Every table of every run, oldest run first.
    pub fn tables(&self) -> Vec<Arc<TableHandle<E>>> {
        self.runs().iter().flat_map(|run| run.tables.iter().cloned()).collect()
    }

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
        self.state.write().expect("tree lock poisoned").runs = Arc::new(runs);
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

    /// Writes sorted, unique entries as table `id`; `count_hint` reserves room for key hashes.
    /// `entries` gives them twice: once to learn the column models from, once to write (entries
    /// in memory, such as a frozen memtable's, need no spill that way).
    pub fn write_sorted<I: Iterator<Item = E>>(
        &self,
        id: &str,
        count_hint: usize,
        entries: impl Fn() -> I,
    ) -> std::io::Result<TableSummary> {
        let models = learn_models(entries(), &self.options);
        let (file, tmp_data) = self.tmp_data_file(id)?;
        let builder = TableBuilder::with_models(file, models, &self.options, count_hint)?;
        let mut writer = self.writer_for(id, builder, tmp_data);
        for entry in entries() {
            writer.push(&entry)?;
        }
        writer.finish()
    }

    /// A writer of table `id` whose files become visible (durably) only at `finish`; it spills
    /// its first frames while it learns its column models.
    pub fn table_writer(&self, id: &str, count_hint: usize) -> std::io::Result<TableWriter<E>> {
        let (file, tmp_data) = self.tmp_data_file(id)?;
        let builder = TableBuilder::with_spill(file, Box::new(anonymous_spill(&tmp_data)?), &self.options, count_hint)?;
        Ok(self.writer_for(id, builder, tmp_data))
    }

    /// The temporary data file of table `id`, and its path.
    fn tmp_data_file(&self, id: &str) -> std::io::Result<(BufWriter<File>, PathBuf)> {
        let tmp_data = self.local_path(id, "data").with_extension("data.tmp");
        Ok((BufWriter::new(File::create(&tmp_data)?), tmp_data))
    }

    fn writer_for(&self, id: &str, builder: TableBuilder<E, BufWriter<File>>, tmp_data: PathBuf) -> TableWriter<E> {
        let (data_path, meta_path, dir) = (self.local_path(id, "data"), self.local_path(id, "meta"), self.dir.clone());
        TableWriter { builder, tmp_data, data_path, meta_path, dir }
    }

    /// Deletes the local files of table `id` (a retired table; missing files are fine).
    pub fn remove_local(&self, id: &str) -> std::io::Result<()> {
        for ext in ["data", "meta"] {
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

    /// Opens a table whose files are on local disk (meta required; data optional = not cached).
    pub fn open_table(&self, record: TableRecord) -> Result<TableHandle<E>, ReadError> {
        let meta_path = self.local_path(&record.id, "meta");
        let object = table_key(E::TREE, &record.id, "meta");
        let bytes = std::fs::read(&meta_path).map_err(|source| ReadError::Io { object: object.clone(), source })?;
        let meta = TableMeta::decode(&bytes).map_err(|source| {
            let object = format!("{object} (local copy {})", meta_path.display());
            report_corruption(ObjectKind::Meta, Place::Local, &object, &source);
            ReadError::Corrupt { object, source }
        })?;
        let data_path = self.local_path(&record.id, "data");
        let local_data = File::open(&data_path).ok().map(Arc::new);
        Ok(TableHandle {
            uploaded: AtomicBool::new(record.uploaded),
            record,
            meta,
            local_data: RwLock::new(local_data),
            data_path,
            last_read: AtomicU64::new(0),
            frame_cache: self.frame_cache.clone(),
            serial: next_serial(),
        })
    }

    /// Makes `table` visible as a delta run and drops the frozen memtable it replaces, in one step.
    pub fn install(&self, table: TableHandle<E>, replaces: Option<&Arc<Memtable<E>>>) {
        let run = Run::from_tables(vec![Arc::new(table)]).expect("a flushed table is a whole delta run");
        let mut state = self.state.write().expect("tree lock poisoned");
        let mut runs: Vec<_> = state.runs.as_ref().clone();
        runs.push(Arc::new(run));
        state.runs = Arc::new(runs);
        if let Some(frozen) = replaces {
            state.frozen.retain(|m| !Arc::ptr_eq(m, frozen));
        }
    }

    /// Drops a frozen memtable whose flush wrote no table (every entry in it was dead).
    pub fn retire_frozen(&self, memtable: &Arc<Memtable<E>>) {
        self.state.write().expect("tree lock poisoned").frozen.retain(|m| !Arc::ptr_eq(m, memtable));
    }

    /// Swaps the runs `removed` for `added` in one step (a compaction's result). The new run takes
    /// the place of the oldest removed one, so the list stays oldest first.
    pub fn replace_runs(&self, removed: &[String], added: Run<E>) {
        let mut state = self.state.write().expect("tree lock poisoned");
        let position = state.runs.iter().position(|r| removed.contains(&r.id)).unwrap_or(state.runs.len());
        let mut runs: Vec<_> = state.runs.iter().filter(|r| !removed.contains(&r.id)).cloned().collect();
        runs.insert(position.min(runs.len()), Arc::new(added));
        state.runs = Arc::new(runs);
    }

    pub fn local_path(&self, id: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{id}.{ext}"))
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
        let (file, meta, summary) = self.builder.finish()?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&self.tmp_data, &self.data_path)?;
        write_durably(&self.meta_path, &meta)?;
        sync_dir(&self.dir)?;
        Ok(summary)
    }
}

/// A table builder's spill file beside `tmp_data`, unlinked at once: it holds the raw frames
/// until the builder finishes and disappears with the builder, crash or not. Unbuffered: the
/// builder writes and reads whole frames.
fn anonymous_spill(tmp_data: &Path) -> std::io::Result<File> {
    let path = tmp_data.with_extension("spill");
    let file = File::options().read(true).write(true).create(true).truncate(true).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// Write to a temporary name, fsync, rename over: the file appears whole or not at all.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
