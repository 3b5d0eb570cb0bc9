//! `TableBuilder`: streams sorted entries into a table's frames and meta.
//!
//! Invariants:
//! - A builder is given its column models before its first entry (a flush's from
//!   `learn_models` over its memtable, a merge's from its `ModelSampler`) and encodes every frame
//!   exactly once, in order, as it fills.
//! - After an I/O error the builder refuses further use.
//! - Memory does not grow with the table: the distinct keys' hashes (16 bytes each, what the
//!   filter is sized and built from at `finish`) go to the key spill past `KEY_HASHES_IN_MEMORY`,
//!   and each finished chunk of the frame index to the index spill. What stays is one directory
//!   record per chunk of `CHUNK_FRAMES` frames. A merge writes to as many builders at once as it
//!   has output shards, so what each holds is small: the open frame, the encoder's buffers,
//!   64 KiB of key hashes and one open chunk; the zstd context is the thread's and the models
//!   the merge's. At `finish` a builder holds its filter (about two bytes a distinct key) while
//!   it writes the meta a page at a time (`finish_to`), never the meta whole.

use super::frame::with_encoder;
use super::paged::{IndexWriter, MetaParts, assemble};
use super::{FrameInfo, MAX_FRAMES, TableOptions, TableSummary, layout_of};
use crate::lsm::coder::{ColumnModels, ModelCounts};
use crate::lsm::entry::{Entry, same_filter_prefix, shard_prefix_hash};
use crate::lsm::filter::{FilterBuilder, KeyHash};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::Arc;

/// A table's column models are learnt from every `MODEL_SAMPLE_STRIDE`th frame (a sample that
/// codes a table about as well as all of its frames: BENCHMARKS.md, "column models").
const MODEL_SAMPLE_STRIDE: usize = 16;

/// Key hashes a builder holds before it writes them to its key spill (64 KiB).
pub(super) const KEY_HASHES_IN_MEMORY: usize = 1 << 12;

/// The first entry of a frame, and whether it continues the previous key.
struct FrameStart<E> {
    first: E,
    continues: bool,
}

/// Where a builder keeps what would otherwise grow with its table: a file for a merge's tables
/// (page cache and disk, never resident memory), a vector for a flush's, tests and benches.
pub trait Spill: Read + Write + Seek + Send {}
impl<T: Read + Write + Seek + Send> Spill for T {}

/// The spills of one builder, each empty, readable and writable: its distinct keys' hashes and
/// its finished frame-index chunks.
pub struct Spills {
    pub keys: Box<dyn Spill>,
    pub index: Box<dyn Spill>,
}

impl Spills {
    /// Spills in memory (tests, benches, flushes of a bounded memtable).
    pub fn in_memory() -> Self {
        let in_memory = || Box::new(io::Cursor::new(Vec::new())) as Box<dyn Spill>;
        Spills { keys: in_memory(), index: in_memory() }
    }
}

/// The hashes of a table's distinct keys, in order: the newest in memory, the rest in a spill.
struct KeyHashes {
    recent: Vec<KeyHash>,
    spill: Box<dyn Spill>,
    spilled: usize,
}

impl KeyHashes {
    fn new(spill: Box<dyn Spill>) -> Self {
        KeyHashes { recent: Vec::with_capacity(KEY_HASHES_IN_MEMORY), spill, spilled: 0 }
    }

    fn push(&mut self, hash: KeyHash) -> io::Result<()> {
        if self.recent.len() == KEY_HASHES_IN_MEMORY {
            let bytes: Vec<u8> = self.recent.iter().flat_map(|h| h.to_le_bytes()).collect();
            self.spill.write_all(&bytes)?;
            self.spilled += self.recent.len();
            self.recent.clear();
        }
        self.recent.push(hash);
        Ok(())
    }

    fn len(&self) -> usize {
        self.spilled + self.recent.len()
    }

    /// Every hash, in the order pushed, into `filter`.
    fn insert_into(&mut self, filter: &mut FilterBuilder) -> io::Result<()> {
        self.spill.seek(SeekFrom::Start(0))?;
        let mut chunk = vec![0u8; KEY_HASHES_IN_MEMORY * 16];
        let mut left = self.spilled;
        while left > 0 {
            let n = left.min(KEY_HASHES_IN_MEMORY);
            self.spill.read_exact(&mut chunk[..n * 16])?;
            for bytes in chunk[..n * 16].chunks_exact(16) {
                filter.insert(KeyHash::from_le_bytes(bytes.try_into().expect("16 bytes")));
            }
            left -= n;
        }
        self.recent.drain(..).for_each(|hash| filter.insert(hash));
        Ok(())
    }
}

/// Writes a table: frames are encoded to `data_out` as they fill, under the column models it was
/// given (none: payloads without models); `finish` returns the meta. After an I/O error the
/// builder refuses further use.
pub struct TableBuilder<E: Entry, W: Write> {
    data_out: W,
    models: Option<Arc<ColumnModels>>,
    zstd_level: i32,
    entries_per_frame: usize,
    /// Encoded entries of the frame being filled.
    pending: Vec<u8>,
    /// The frame being filled (set while `pending` is not empty).
    open: Option<FrameStart<E>>,
    index: IndexWriter<E, Box<dyn Spill>>,
    data_len: u64,
    /// One hash per distinct filter prefix (`Entry::FILTER_WIDTH`), in order; the filter is built
    /// from them at `finish`.
    key_hashes: KeyHashes,
    filter_fpr: f64,
    last: Option<E>,
    entries: u64,
    /// Smallest and largest stamp pushed (`u64::MAX, 0` while empty).
    stamps: (u64, u64),
    failed: bool,
}

impl<E: Entry, W: Write> TableBuilder<E, W> {
    /// A builder that spills to memory (tests, benches, flushes of a bounded memtable), writing
    /// under `models` (`learn_models`). The filter is sized at `finish` from the exact number of
    /// distinct keys pushed (a streaming writer, such as a compaction, cannot know it up front).
    /// Fails on invalid options.
    pub fn new(data_out: W, models: Option<Arc<ColumnModels>>, opts: &TableOptions) -> io::Result<Self> {
        Self::with_spills(data_out, Spills::in_memory(), models, opts)
    }

    /// A builder that spills to `spills`, writing under `models` (a merge's, from its
    /// `ModelSampler`, which all its tables share).
    pub fn with_spills(
        data_out: W,
        spills: Spills,
        models: Option<Arc<ColumnModels>>,
        opts: &TableOptions,
    ) -> io::Result<Self> {
        opts.validate()?;
        let entries_per_frame = opts.entries_per_frame::<E>();
        Ok(TableBuilder {
            data_out,
            models,
            zstd_level: opts.zstd_level,
            entries_per_frame,
            pending: Vec::with_capacity(entries_per_frame * E::WIDTH),
            open: None,
            index: IndexWriter::new(spills.index),
            data_len: 0,
            key_hashes: KeyHashes::new(spills.keys),
            filter_fpr: opts.filter_fpr,
            last: None,
            entries: 0,
            stamps: (u64::MAX, 0),
            failed: false,
        })
    }

    /// Entries pushed so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Appends one entry; entries must be strictly increasing (a panic in debug builds, an
    /// `InvalidInput` error otherwise, and the entry is not added).
    pub fn push(&mut self, entry: &E) -> io::Result<()> {
        self.check_usable()?;
        self.check_order(entry)?;
        if self.pending.is_empty() {
            self.start_frame(entry)?;
        }
        let at = self.pending.len();
        self.pending.resize(at + E::WIDTH, 0);
        entry.encode(&mut self.pending[at..]);
        if self.last.is_none_or(|last| !same_filter_prefix(&last, entry)) {
            let hash = KeyHash::of(&self.pending[at..at + E::FILTER_WIDTH]);
            self.or_fail(|builder| builder.key_hashes.push(hash))?;
        }
        let new_shard = |last: E| last.key().to_bytes()[..E::SHARD_WIDTH] != entry.key().to_bytes()[..E::SHARD_WIDTH];
        if E::FILTER_HOLDS_SHARDS && self.last.is_none_or(new_shard) {
            let hash = shard_prefix_hash::<E>(&entry.key());
            self.or_fail(|builder| builder.key_hashes.push(hash))?;
        }
        self.last = Some(*entry);
        self.entries += 1;
        self.stamps = (self.stamps.0.min(entry.stamp()), self.stamps.1.max(entry.stamp()));
        if self.pending.len() == self.entries_per_frame * E::WIDTH {
            self.or_fail(Self::end_frame)?;
        }
        Ok(())
    }

    /// Encodes what is left and returns the data sink, the meta file bytes and a summary.
    pub fn finish(self) -> io::Result<(W, Vec<u8>, TableSummary)> {
        let mut meta = Vec::new();
        let (data_out, summary) = self.finish_to(&mut meta)?;
        Ok((data_out, meta, summary))
    }

    /// Encodes what is left, writes the meta file to `meta_out` (a page or a chunk at a time: a
    /// large table's meta is never whole in memory) and returns the data sink and a summary.
    pub fn finish_to(mut self, meta_out: &mut impl Write) -> io::Result<(W, TableSummary)> {
        self.check_usable()?;
        self.or_fail(Self::end_frame)?;
        self.data_out.flush()?;
        let mut filter = FilterBuilder::new(self.key_hashes.len(), self.filter_fpr);
        self.key_hashes.insert_into(&mut filter)?;
        let index = self.index.finish()?;
        let frames = index.frames() as u32;
        let filter = filter.finish();
        let parts = MetaParts {
            filter: &filter,
            last: self.last,
            entries: self.entries,
            data_len: self.data_len,
            models: self.models.as_deref(),
        };
        let meta_len = assemble(&parts, index, meta_out)?;
        let summary = TableSummary {
            entries: self.entries,
            frames,
            data_len: self.data_len,
            meta_len,
            stamps: if self.entries == 0 { (0, 0) } else { self.stamps },
        };
        Ok((self.data_out, summary))
    }

    fn check_usable(&self) -> io::Result<()> {
        if self.failed {
            return Err(io::Error::other("table builder already failed; discard it"));
        }
        Ok(())
    }

    fn check_order(&self, entry: &E) -> io::Result<()> {
        let in_order = self.last.is_none_or(|last| last < *entry);
        debug_assert!(in_order, "entries must be strictly increasing: {entry:?} after {:?}", self.last);
        if !in_order {
            let message = format!("entries must be strictly increasing: {entry:?} after {:?}", self.last);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        }
        Ok(())
    }

    fn start_frame(&mut self, entry: &E) -> io::Result<()> {
        if self.index.frames() >= MAX_FRAMES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a table holds at most {MAX_FRAMES} frames"),
            ));
        }
        let continues = self.last.is_some_and(|last| last.key() == entry.key());
        self.open = Some(FrameStart { first: *entry, continues });
        Ok(())
    }

    /// Runs `step`, marking the builder failed if it fails.
    fn or_fail<T>(&mut self, step: impl FnOnce(&mut Self) -> io::Result<T>) -> io::Result<T> {
        let result = step(self);
        self.failed = result.is_err();
        result
    }

    /// Encodes the frame being filled, if any, and appends it to the data.
    fn end_frame(&mut self) -> io::Result<()> {
        let Some(start) = self.open.take() else { return Ok(()) };
        let entries = self.pending.len() / E::WIDTH;
        assert!((1..=self.entries_per_frame).contains(&entries));
        let (pending, data_out, models) = (&self.pending, &mut self.data_out, self.models.as_deref());
        let len = with_encoder(Some(self.zstd_level), |encoder| {
            let frame = encoder.encode::<E>(pending, models)?;
            data_out.write_all(frame)?;
            Ok(frame.len() as u32)
        })?;
        let info = FrameInfo {
            first: start.first,
            continues: start.continues,
            offset: self.data_len,
            len,
            entries: entries as u32,
        };
        self.index.push(info)?;
        self.data_len += u64::from(len);
        self.pending.clear();
        Ok(())
    }
}

/// The column models of a table of sorted, unique `entries` (learnt from every
/// `MODEL_SAMPLE_STRIDE`th frame of them, all of them read), for `TableBuilder::new`; `None` when
/// they are fewer than `model_min_entries` (or none).
pub fn learn_models<E: Entry>(entries: impl Iterator<Item = E>, opts: &TableOptions) -> Option<Arc<ColumnModels>> {
    let mut sampler = ModelSampler::new(1, opts);
    entries.for_each(|entry| sampler.add(0, &entry));
    sampler.finish()
}

/// Writes sorted, unique `entries` as one table to `data_out`, under models learnt from all of
/// them (as a flush writes its memtable): the data sink, the meta and the summary.
pub fn write_table<E: Entry, W: Write>(
    data_out: W,
    entries: &[E],
    opts: &TableOptions,
) -> io::Result<(W, Vec<u8>, TableSummary)> {
    let models = learn_models(entries.iter().copied(), opts);
    let mut builder = TableBuilder::new(data_out, models, opts)?;
    entries.iter().try_for_each(|entry| builder.push(entry))?;
    builder.finish()
}

/// Learns one set of column models for the tables a stream of sorted, unique entries is split
/// into (a merge's shards): it counts every `MODEL_SAMPLE_STRIDE`th frame each table's builder
/// will make, as `learn_models` would for each table alone, into one set of counts. Memory: one frame's raw
/// entries per table at most, and the counts.
pub struct ModelSampler<E: Entry> {
    per_frame: usize,
    /// Per table: entries added, and the raw entries of its sampled frame being filled.
    tables: Vec<(u64, Vec<u8>)>,
    counts: ModelCounts,
    entries: u64,
    model_min_entries: u64,
    _entries: std::marker::PhantomData<E>,
}

impl<E: Entry> ModelSampler<E> {
    pub fn new(tables: usize, opts: &TableOptions) -> Self {
        ModelSampler {
            per_frame: opts.entries_per_frame::<E>(),
            tables: vec![(0, Vec::new()); tables],
            counts: ModelCounts::new(layout_of::<E>()),
            entries: 0,
            model_min_entries: opts.model_min_entries,
            _entries: std::marker::PhantomData,
        }
    }

    /// The next entry of table `table` (in that table's order).
    pub fn add(&mut self, table: usize, entry: &E) {
        let (added, raw) = &mut self.tables[table];
        if (*added / self.per_frame as u64).is_multiple_of(MODEL_SAMPLE_STRIDE as u64) {
            let at = raw.len();
            raw.resize(at + E::WIDTH, 0);
            entry.encode(&mut raw[at..]);
            if raw.len() == self.per_frame * E::WIDTH {
                count_frame::<E>(raw, &mut self.counts);
                raw.clear();
            }
        }
        *added += 1;
        self.entries += 1;
    }

    /// The models (counting each table's last, partly filled sampled frame), or `None` when the
    /// entries added are fewer than `model_min_entries` (or none).
    pub fn finish(mut self) -> Option<Arc<ColumnModels>> {
        for (_, raw) in &self.tables {
            if !raw.is_empty() {
                count_frame::<E>(raw, &mut self.counts);
            }
        }
        let modelled = self.entries > 0 && self.entries >= self.model_min_entries;
        modelled.then(|| Arc::new(self.counts.finish()))
    }
}

/// Counts one frame's raw entries into `counts`, with this thread's encoder.
fn count_frame<E: Entry>(raw: &[u8], counts: &mut ModelCounts) {
    let counted = with_encoder(None, |encoder| {
        encoder.count::<E>(raw, counts);
        Ok(())
    });
    counted.expect("an encoder at the default level is always made")
}
