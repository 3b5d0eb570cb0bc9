//! A tree: one LSM of one entry type (backlinks or revocations) - memtables plus tables.
//!
//! Invariants:
//! - Queries see every entry that was written before they started: an entry lives in the active
//!   memtable, then in a frozen memtable, then in a table, and the switch from frozen memtable to
//!   table happens under one write lock, so a reader (who takes memtable entries and the table list
//!   under one read lock) never falls between the two.
//! - A table file pair is complete on disk (written, fsynced, renamed) before it is installed.
//! - The table list is an immutable `Arc<Vec<_>>` swapped as a whole; a reader's snapshot never
//!   changes under it.

use crate::catalog::TableRecord;
use crate::lsm::entry::Entry;
use crate::lsm::memtable::Memtable;
use crate::lsm::table::{FormatError, TableBuilder, TableMeta, TableOptions, TableSummary, decode_frames};
use crate::store::object::{Store, StoreError};
use bytes::Bytes;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

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
    local_data: Option<Arc<File>>,
}

impl<E: Entry> TableHandle<E> {
    /// Object key of the data file in the bucket.
    pub fn data_key(&self) -> String {
        table_key(E::TREE, &self.record.id, "data")
    }

    /// Reads and decodes frames `frames` with one ranged read (local file or the bucket).
    pub async fn read_frames(&self, store: &dyn Store, frames: Range<usize>) -> Result<Vec<E>, ReadError> {
        let mut out = Vec::new();
        if frames.is_empty() {
            return Ok(out);
        }
        let (start, end) = self.meta.byte_range(frames.clone());
        let bytes = self.read_range(store, start, end - start).await?;
        decode_frames(&self.meta, frames, &bytes, &mut out)
            .map_err(|source| ReadError::Corrupt { object: self.data_key(), source })?;
        Ok(out)
    }

    async fn read_range(&self, store: &dyn Store, offset: u64, len: u64) -> Result<Bytes, ReadError> {
        let Some(file) = self.local_data.clone() else {
            return Ok(store.get_range(&self.data_key(), offset, len).await?);
        };
        let object = self.data_key();
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, offset).map(|_| Bytes::from(buf))
        })
        .await
        .map_err(|e| ReadError::Io { object: object.clone(), source: std::io::Error::other(e) })?
        .map_err(|source| ReadError::Io { object, source })
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
    tables: Arc<Vec<Arc<TableHandle<E>>>>,
}

/// What a reader sees at one instant: matching memtable entries and the table list.
pub struct Snapshot<E: Entry> {
    pub memtable_entries: Vec<E>,
    pub tables: Arc<Vec<Arc<TableHandle<E>>>>,
}

#[derive(Debug)]
pub struct Tree<E: Entry> {
    dir: PathBuf,
    options: TableOptions,
    state: RwLock<TreeState<E>>,
}

impl<E: Entry> Tree<E> {
    /// `dir` holds this tree's local table files (`state/tables/<tree>`).
    pub fn new(dir: PathBuf, options: TableOptions) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let state = TreeState { active: Memtable::default(), frozen: Vec::new(), tables: Arc::new(Vec::new()) };
        Ok(Self { dir, options, state: RwLock::new(state) })
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

    /// Entries `e` with `lo <= e <= hi` from every memtable, plus the table list, taken atomically.
    pub fn snapshot(&self, ranges: &[(E, E)]) -> Snapshot<E> {
        let state = self.state.read().expect("tree lock poisoned");
        let mut memtable_entries = Vec::new();
        for memtable in std::iter::once(&state.active).chain(state.frozen.iter().map(|m| m.as_ref())) {
            for (lo, hi) in ranges {
                memtable_entries.extend(memtable.range(lo, hi).copied());
            }
        }
        Snapshot { memtable_entries, tables: state.tables.clone() }
    }

    pub fn tables(&self) -> Arc<Vec<Arc<TableHandle<E>>>> {
        self.state.read().expect("tree lock poisoned").tables.clone()
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

    /// Writes `memtable` as table `id` (data + meta), durable on local disk before returning.
    pub fn write_table(&self, memtable: &Memtable<E>, id: &str) -> std::io::Result<TableSummary> {
        let distinct_keys = count_distinct_keys(memtable.iter());
        self.write_sorted(id, distinct_keys, memtable.iter().copied())
    }

    /// Writes sorted, unique entries as table `id`; `distinct_keys` sizes its filter.
    pub fn write_sorted(
        &self,
        id: &str,
        distinct_keys: usize,
        entries: impl Iterator<Item = E>,
    ) -> std::io::Result<TableSummary> {
        let data_path = self.local_path(id, "data");
        let tmp_data = data_path.with_extension("data.tmp");
        let file = BufWriter::new(File::create(&tmp_data)?);
        let mut builder = TableBuilder::<E, _>::new(file, &self.options, distinct_keys)?;
        for entry in entries {
            builder.push(&entry)?;
        }
        let (file, meta, summary) = builder.finish()?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp_data, &data_path)?;
        write_durably(&self.local_path(id, "meta"), &meta)?;
        sync_dir(&self.dir)?;
        Ok(summary)
    }

    /// Opens a table whose files are on local disk (meta required; data optional = not cached).
    pub fn open_table(&self, record: TableRecord) -> Result<TableHandle<E>, ReadError> {
        let meta_path = self.local_path(&record.id, "meta");
        let object = table_key(E::TREE, &record.id, "meta");
        let bytes = std::fs::read(&meta_path).map_err(|source| ReadError::Io { object: object.clone(), source })?;
        let meta = TableMeta::decode(&bytes).map_err(|source| ReadError::Corrupt { object, source })?;
        let local_data = File::open(self.local_path(&record.id, "data")).ok().map(Arc::new);
        Ok(TableHandle { record, meta, local_data })
    }

    /// Makes `table` visible and drops the frozen memtable it replaces, in one step.
    pub fn install(&self, table: TableHandle<E>, replaces: Option<&Arc<Memtable<E>>>) {
        let mut state = self.state.write().expect("tree lock poisoned");
        let mut tables: Vec<_> = state.tables.as_ref().clone();
        tables.push(Arc::new(table));
        state.tables = Arc::new(tables);
        if let Some(frozen) = replaces {
            state.frozen.retain(|m| !Arc::ptr_eq(m, frozen));
        }
    }

    /// Drops a frozen memtable whose contents were empty or are otherwise installed.
    pub fn forget_frozen(&self, frozen: &Arc<Memtable<E>>) {
        self.state.write().expect("tree lock poisoned").frozen.retain(|m| !Arc::ptr_eq(m, frozen));
    }

    pub fn local_path(&self, id: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{id}.{ext}"))
    }
}

/// Keys in sorted entries: the filter is over keys, and a popular key has many entries.
fn count_distinct_keys<'a, E: Entry>(sorted: impl Iterator<Item = &'a E>) -> usize {
    let mut previous = None;
    sorted.filter(|e| previous.replace(e.key()) != Some(e.key())).count()
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
