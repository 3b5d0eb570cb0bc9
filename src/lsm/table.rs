//! The table format: `<id>.data` holds frames of sorted entries (zstd, or rANS under the table's
//! column models), `<id>.meta` holds the key filter, the frame index and the column models.
//! Generic over any fixed-width `Entry`. docs/format.md has the byte-by-byte layout.
//!
//! Invariants:
//! - Entries are strictly increasing across the whole table (byte order == `Ord`).
//! - A frame holds `1..=max_frame_entries::<E>()` entries (at most `MAX_FRAME_RAW_BYTES` before
//!   compression) and an xxh3-64 over its header and payload. The meta file ends with an xxh3-64
//!   over everything before it. Lengths are checked against fixed maxima (and a version-2 or 3
//!   meta's frame count against what its compressed index can expand to) before anything is allocated
//!   from them, and checksums before any payload is trusted.
//! - `frames[0].offset == 0`, each frame starts where the previous one ends, the last one ends at
//!   `data_len`; the entry counts sum to `entries`.
//! - `frames[i].first` is the first entry of frame i; `frames[i].continues` is true exactly when
//!   its key equals the key of the last entry of frame i - 1 (never for frame 0); `last` is the
//!   table's last entry (`None` only for an empty table, which has no frames).
//! - Header integers are little-endian; entries keep their own big-endian encoding.
//! - `sampled_firsts[j] == frames[j * SAMPLE_STRIDE].first` for every j (derived at decode and
//!   build, never stored): searches narrow through them first.
//! - Decoding returns a `FormatError` for any inconsistency and never panics; on error the output
//!   vector is left as it was, so a caller never sees entries from a bad frame.
//! - A table has column models (meta version 3) exactly when it held at least
//!   `max(1, model_min_entries)` entries when its builder decided them; only such a table has
//!   encoding-4 frames. The builder learns the models from every `MODEL_SAMPLE_STRIDE`th frame of
//!   at most its first `spill_bytes` (spilled raw meanwhile), then encodes every frame once.

use super::coder::{self, ColumnModels, Layout, ModelCounts};
use super::entry::Entry;
pub use super::filter::FormatError;
use super::filter::{Filter, FilterBuilder, KeyHash, MAX_ENCODED_LEN as MAX_FILTER_LEN, MAX_FPR, MIN_FPR};
use crate::model::ids::RecordId;
use crate::model::tid;
use std::cell::Cell;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64;

/// Default raw (uncompressed) bytes per frame: 256 backlinks. A warm query decodes whole frames
/// to use a few entries, so smaller frames cost it less and more of them fit the frame cache; at
/// 10 M links 16 KiB frames answered 3.2x the queries of 64 KiB ones per CPU-second, for 6 % more
/// bucket bytes (BENCHMARKS.md, "Frame size"). DESIGN.md's "about 64 KiB" was the starting point.
pub const DEFAULT_FRAME_BYTES: usize = 16 * 1024;
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
pub const DEFAULT_FILTER_FPR: f64 = 0.01;
/// Largest raw frame: sixteen times the default, so one frame is cheap to hold in memory.
pub const MAX_FRAME_RAW_BYTES: usize = 1 << 20;
/// Compressed payloads may exceed the raw size a little on incompressible input (zstd's bound
/// is raw + raw/256 + small); this bound is looser than that.
pub const MAX_FRAME_PAYLOAD_BYTES: usize = MAX_FRAME_RAW_BYTES + MAX_FRAME_RAW_BYTES / 128;
/// Header (20) + checksum (8).
pub const FRAME_OVERHEAD: usize = FRAME_HEADER_LEN + CHECKSUM_LEN;
/// Largest encoded frame.
pub const MAX_FRAME_BYTES: usize = FRAME_OVERHEAD + MAX_FRAME_PAYLOAD_BYTES;
/// Most frames in one table (2^24 frames of 64 KiB is 1 TiB of raw entries).
pub const MAX_FRAMES: usize = 1 << 24;
/// Tables of at least this many entries get column models (payload encoding 4) by default; the
/// models (up to ~30 KB in the meta, compressed) would cost smaller tables more than they save.
pub const DEFAULT_MODEL_MIN_ENTRIES: u64 = 1 << 16;
/// Raw bytes a builder spills before it decides its models: 4 M backlinks, 8 M revocations. On
/// the 10 M-link benchmark half of this (models from the first 2 M backlinks of its 3.9 M-entry
/// merged tables) left the tables 3.8 % larger than models from all of them.
pub const DEFAULT_SPILL_BYTES: usize = 256 << 20;
/// A table's column models are learnt from every `MODEL_SAMPLE_STRIDE`th frame: on the
/// benchmark's link tables that sample coded them as well as all frames did (within 0.4 %).
const MODEL_SAMPLE_STRIDE: usize = 16;
/// Most key hashes a builder reserves room for up front (it grows past this as keys arrive).
const MAX_RESERVED_KEYS: usize = 1 << 20;
pub const MIN_ZSTD_LEVEL: i32 = 1;
pub const MAX_ZSTD_LEVEL: i32 = 19;

const FRAME_MAGIC: [u8; 4] = *b"BLKF";
const FRAME_VERSION: u8 = 1;
/// Payload encoding 1: XOR with the previous entry, byte-transpose, zstd. Read, no longer written.
const ENCODING_XOR_TRANSPOSE_ZSTD: u8 = 1;
/// Payload encoding 2: record keys spread (`tid::spread`), then as encoding 1. Written for frames
/// whose keys are (nearly) all distinct.
const ENCODING_SPREAD_XOR_TRANSPOSE_ZSTD: u8 = 2;
/// Payload encoding 3: record keys spread, then each run of entries with the same key stored as
/// that key once, the run's length, and the rest of each entry (`key_runs_transpose`). Written
/// when it is the shorter raw payload.
const ENCODING_SPREAD_KEY_RUNS_ZSTD: u8 = 3;
/// Payload encoding 4: encoding 3's layout (runs even where they do not shorten it), each byte
/// column rANS-coded under the table's column models (`coder`). Written in tables with models
/// whenever it is no longer than the raw entries.
const ENCODING_SPREAD_KEY_RUNS_MODELLED: u8 = 4;
const ENCODINGS: [u8; 4] = [
    ENCODING_XOR_TRANSPOSE_ZSTD,
    ENCODING_SPREAD_XOR_TRANSPOSE_ZSTD,
    ENCODING_SPREAD_KEY_RUNS_ZSTD,
    ENCODING_SPREAD_KEY_RUNS_MODELLED,
];
/// Bytes of a run length in payload encoding 3 (a big-endian u16: a frame holds at most
/// `max_frame_entries` <= 32,768 entries).
const RUN_LEN_BYTES: usize = 2;
const FRAME_HEADER_LEN: usize = 20;
const CHECKSUM_LEN: usize = 8;

const META_MAGIC: [u8; 4] = *b"BLKM";
/// Meta version 1: the frame index as fixed records. Read, no longer written.
const META_ROWS_VERSION: u16 = 1;
/// Meta version 2: the frame index as compressed columns (`encode_frame_index`). Written for
/// tables without column models.
const META_COLUMNS_VERSION: u16 = 2;
/// Meta version 3: version 2 plus the table's column models. Written for tables with models.
const META_MODELS_VERSION: u16 = 3;
const META_HEADER_LEN: usize = 36;
/// Version 2's header adds the compressed frame index's length (u32 LE).
const META_V2_HEADER_LEN: usize = 40;
/// Version 3's header adds the compressed column models' length (u32 LE).
const META_V3_HEADER_LEN: usize = 44;
/// A version-2 frame index column set: the first entry, flags (1), length (4), entries (4).
const FRAME_COLUMNS_FIXED_LEN: usize = 9;
/// Most a version-2 frame index may expand when decompressed. Real indexes compress about
/// sixfold; a writer falls back to version 1 for one that would compress more.
const MAX_INDEX_EXPANSION: usize = 64;
/// A frame index record is the first entry plus flags (1), offset (8), length (4), entries (4).
const FRAME_INFO_FIXED_LEN: usize = 17;
const CONTINUES_FLAG: u8 = 1;

/// Most entries one frame of `E` may hold.
pub fn max_frame_entries<E: Entry>() -> usize {
    MAX_FRAME_RAW_BYTES / E::WIDTH
}

/// How tables are written. `validate` checks the documented limits.
#[derive(Clone, Debug, PartialEq)]
pub struct TableOptions {
    /// Target raw bytes per frame; a frame holds `max(1, frame_bytes / WIDTH)` entries.
    pub frame_bytes: usize,
    pub zstd_level: i32,
    /// Target false-positive rate of the key filter.
    pub filter_fpr: f64,
    /// Tables with at least this many entries get column models and payload encoding 4.
    pub model_min_entries: u64,
    /// Raw bytes of the first frames a builder keeps aside while it learns the column models
    /// (local disk); the models of a larger table are learnt from its first `spill_bytes`.
    pub spill_bytes: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            frame_bytes: DEFAULT_FRAME_BYTES,
            zstd_level: DEFAULT_ZSTD_LEVEL,
            filter_fpr: DEFAULT_FILTER_FPR,
            model_min_entries: DEFAULT_MODEL_MIN_ENTRIES,
            spill_bytes: DEFAULT_SPILL_BYTES,
        }
    }
}

impl TableOptions {
    pub fn validate(&self) -> io::Result<()> {
        let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if !(1..=MAX_FRAME_RAW_BYTES).contains(&self.frame_bytes) {
            return invalid(format!("frame_bytes {} is outside 1..={MAX_FRAME_RAW_BYTES}", self.frame_bytes));
        }
        if !(MIN_ZSTD_LEVEL..=MAX_ZSTD_LEVEL).contains(&self.zstd_level) {
            return invalid(format!("zstd_level {} is outside {MIN_ZSTD_LEVEL}..={MAX_ZSTD_LEVEL}", self.zstd_level));
        }
        if !(MIN_FPR..=MAX_FPR).contains(&self.filter_fpr) {
            return invalid(format!("filter_fpr {} is outside {MIN_FPR}..={MAX_FPR}", self.filter_fpr));
        }
        Ok(())
    }

    fn entries_per_frame<E: Entry>(&self) -> usize {
        (self.frame_bytes / E::WIDTH).clamp(1, max_frame_entries::<E>())
    }
}

/// What a finished table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableSummary {
    pub entries: u64,
    pub frames: u32,
    pub data_len: u64,
    pub meta_len: u64,
    /// Smallest and largest stamp written; (0, 0) for an empty table.
    pub stamps: (u64, u64),
}

/// One frame index record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo<E> {
    /// The frame's first entry (for backlinks: first target and first source).
    pub first: E,
    /// The first entry's key equals the key of the previous frame's last entry.
    pub continues: bool,
    /// Byte offset of the frame in the data file.
    pub offset: u64,
    /// Encoded frame length in bytes.
    pub len: u32,
    pub entries: u32,
}

/// The decoded meta file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableMeta<E: Entry> {
    pub filter: Filter,
    pub frames: Vec<FrameInfo<E>>,
    pub last: Option<E>,
    pub entries: u64,
    pub data_len: u64,
    /// The column models of payload encoding 4 (meta version 3); `None` for smaller tables.
    pub models: Option<ColumnModels>,
    /// Every `SAMPLE_STRIDE`th frame's first entry. A search over a big table's frames (40 k of
    /// them, 88 bytes each) touched a new page at nearly every step, a TLB miss each: measured at
    /// 2 µs a search on a warm server. Through these it reads a few mostly cached pages, then
    /// one stride of frames.
    sampled_firsts: Vec<E>,
}

/// Frames per entry of `TableMeta::sampled_firsts`: one stride of frame index records spans
/// about a page and a half.
const SAMPLE_STRIDE: usize = 64;

/// The first entry of a frame, whether it continues the previous key, and its entry count.
struct FrameStart<E> {
    first: E,
    continues: bool,
    entries: usize,
}

/// Where a builder keeps its first raw frames while it learns the table's column models from a
/// sample of them (at most `spill_bytes`): a file for real tables (page cache and disk, never
/// resident memory), a vector in tests and benches.
pub trait Spill: Read + Write + Seek + Send {}
impl<T: Read + Write + Seek + Send> Spill for T {}

/// How a builder encodes: still learning (frames go to the spill), or decided (frames are
/// encoded as they fill, under the models if the table has any).
enum Coding {
    Learning { spilled_frames: usize, spilled_bytes: usize },
    Decided(Option<ColumnModels>),
}

/// Writes a table. The first frames are spilled raw while every `MODEL_SAMPLE_STRIDE`th is
/// counted for the column models; when the spill reaches `spill_bytes` or the table ends, the
/// models are decided (a table of at least `model_min_entries` entries gets them), the spilled
/// frames are encoded to `data_out`, and later frames are encoded as they fill. `finish` returns
/// the meta. After an I/O error the builder refuses further use.
pub struct TableBuilder<E: Entry, W: Write> {
    data_out: W,
    spill: Box<dyn Spill>,
    spill_bytes: usize,
    coding: Coding,
    counts: ModelCounts,
    encoder: FrameEncoder,
    entries_per_frame: usize,
    model_min_entries: u64,
    /// Encoded entries of the frame being filled.
    pending: Vec<u8>,
    /// The frame being filled (set while `pending` is not empty) and the spilled ones.
    starts: Vec<FrameStart<E>>,
    frames: Vec<FrameInfo<E>>,
    data_len: u64,
    /// One hash per distinct key, in order; the filter is built from them at `finish`.
    key_hashes: Vec<KeyHash>,
    filter_fpr: f64,
    last: Option<E>,
    entries: u64,
    /// Smallest and largest stamp pushed (`u64::MAX, 0` while empty).
    stamps: (u64, u64),
    failed: bool,
}

impl<E: Entry, W: Write> TableBuilder<E, W> {
    /// A builder that spills to memory (tests, benches). `expected_keys` only reserves room for
    /// key hashes: the filter is sized at `finish` from the exact number of distinct keys pushed
    /// (a streaming writer, such as a compaction, cannot know it up front). Fails on invalid
    /// options.
    pub fn new(data_out: W, opts: &TableOptions, expected_keys: usize) -> io::Result<Self> {
        Self::with_spill(data_out, Box::new(io::Cursor::new(Vec::new())), opts, expected_keys)
    }

    /// A builder whose column models are already decided (`learn_models`): it encodes every
    /// frame as it fills and never spills.
    pub fn with_models(
        data_out: W,
        models: Option<ColumnModels>,
        opts: &TableOptions,
        expected_keys: usize,
    ) -> io::Result<Self> {
        let mut builder = Self::new(data_out, opts, expected_keys)?;
        builder.coding = Coding::Decided(models);
        Ok(builder)
    }

    /// A builder that spills to `spill` (an empty, readable and writable file).
    pub fn with_spill(
        data_out: W,
        spill: Box<dyn Spill>,
        opts: &TableOptions,
        expected_keys: usize,
    ) -> io::Result<Self> {
        opts.validate()?;
        let entries_per_frame = opts.entries_per_frame::<E>();
        Ok(TableBuilder {
            data_out,
            spill,
            spill_bytes: opts.spill_bytes,
            coding: Coding::Learning { spilled_frames: 0, spilled_bytes: 0 },
            counts: ModelCounts::new(layout_of::<E>()),
            encoder: FrameEncoder::new(opts.zstd_level)?,
            entries_per_frame,
            model_min_entries: opts.model_min_entries,
            pending: Vec::with_capacity(entries_per_frame * E::WIDTH),
            starts: Vec::new(),
            frames: Vec::new(),
            data_len: 0,
            key_hashes: Vec::with_capacity(expected_keys.min(MAX_RESERVED_KEYS)),
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
        if self.last.is_none_or(|last| last.key() != entry.key()) {
            self.key_hashes.push(KeyHash::of(&self.pending[at..at + E::KEY_WIDTH]));
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
    pub fn finish(mut self) -> io::Result<(W, Vec<u8>, TableSummary)> {
        self.check_usable()?;
        self.or_fail(|builder| {
            builder.end_frame()?;
            builder.decide()
        })?;
        self.data_out.flush()?;
        let mut filter = FilterBuilder::new(self.key_hashes.len(), self.filter_fpr);
        for hash in self.key_hashes.drain(..) {
            filter.insert(hash);
        }
        let Coding::Decided(models) = std::mem::replace(&mut self.coding, Coding::Decided(None)) else {
            unreachable!("finish decides the coding")
        };
        let frames = std::mem::take(&mut self.frames);
        let meta = TableMeta::new(filter.finish(), frames, self.last, self.entries, self.data_len, models);
        let mut meta_bytes = Vec::new();
        meta.encode(&mut meta_bytes);
        let summary = TableSummary {
            entries: meta.entries,
            frames: meta.frames.len() as u32,
            data_len: meta.data_len,
            meta_len: meta_bytes.len() as u64,
            stamps: if self.entries == 0 { (0, 0) } else { self.stamps },
        };
        Ok((self.data_out, meta_bytes, summary))
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
        if self.frames.len() + self.starts.len() >= MAX_FRAMES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a table holds at most {MAX_FRAMES} frames"),
            ));
        }
        let continues = self.last.is_some_and(|last| last.key() == entry.key());
        self.starts.push(FrameStart { first: *entry, continues, entries: 0 });
        Ok(())
    }

    /// Runs `step`, marking the builder failed if it fails.
    fn or_fail<T>(&mut self, step: impl FnOnce(&mut Self) -> io::Result<T>) -> io::Result<T> {
        let result = step(self);
        self.failed = result.is_err();
        result
    }

    /// Ends the frame being filled: spills it while learning (counting every sampled frame's
    /// bytes, and deciding once the spill is full), else encodes it.
    fn end_frame(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let entries = self.pending.len() / E::WIDTH;
        assert!((1..=self.entries_per_frame).contains(&entries));
        self.starts.last_mut().expect("a frame is being filled").entries = entries;
        match &mut self.coding {
            Coding::Decided(_) => {
                let start = self.starts.pop().expect("a frame is being filled");
                self.write_frame(start)?;
            }
            Coding::Learning { spilled_frames, spilled_bytes } => {
                if spilled_frames.is_multiple_of(MODEL_SAMPLE_STRIDE) {
                    self.encoder.count::<E>(&self.pending, &mut self.counts);
                }
                *spilled_frames += 1;
                *spilled_bytes += self.pending.len();
                let full = *spilled_bytes >= self.spill_bytes;
                self.spill.write_all(&self.pending)?;
                if full {
                    self.decide()?;
                }
            }
        }
        self.pending.clear();
        Ok(())
    }

    /// Decides the models (once) and encodes the spilled frames.
    fn decide(&mut self) -> io::Result<()> {
        if matches!(self.coding, Coding::Decided(_)) {
            return Ok(());
        }
        let modelled = self.entries > 0 && self.entries >= self.model_min_entries;
        self.coding = Coding::Decided(modelled.then(|| self.counts.finish()));
        self.spill.seek(SeekFrom::Start(0))?;
        for start in std::mem::take(&mut self.starts) {
            self.pending.resize(start.entries * E::WIDTH, 0);
            self.spill.read_exact(&mut self.pending)?;
            self.write_frame(start)?;
        }
        self.pending.clear();
        Ok(())
    }

    /// Encodes `pending` as the frame `start` and appends it to the data.
    fn write_frame(&mut self, start: FrameStart<E>) -> io::Result<()> {
        let Coding::Decided(models) = &self.coding else { unreachable!("frames are written once decided") };
        let frame = self.encoder.encode::<E>(&self.pending, models.as_ref())?;
        self.data_out.write_all(frame)?;
        let (len, entries) = (frame.len() as u32, start.entries as u32);
        let info = FrameInfo { first: start.first, continues: start.continues, offset: self.data_len, len, entries };
        self.frames.push(info);
        self.data_len += u64::from(len);
        Ok(())
    }
}

/// The column models a builder would learn from sorted, unique `entries` (every
/// `MODEL_SAMPLE_STRIDE`th frame of them, all of them read), for `TableBuilder::with_models`;
/// `None` when they are fewer than `model_min_entries` (or none).
pub fn learn_models<E: Entry>(entries: impl Iterator<Item = E>, opts: &TableOptions) -> Option<ColumnModels> {
    let per_frame = opts.entries_per_frame::<E>();
    let mut sampler = FrameEncoder::sampler();
    let mut counts = ModelCounts::new(layout_of::<E>());
    let (mut raw, mut total) = (Vec::with_capacity(per_frame * E::WIDTH), 0u64);
    for (i, entry) in entries.enumerate() {
        total += 1;
        if (i / per_frame).is_multiple_of(MODEL_SAMPLE_STRIDE) {
            let at = raw.len();
            raw.resize(at + E::WIDTH, 0);
            entry.encode(&mut raw[at..]);
        }
        if raw.len() == per_frame * E::WIDTH {
            sampler.count::<E>(&raw, &mut counts);
            raw.clear();
        }
    }
    if !raw.is_empty() {
        sampler.count::<E>(&raw, &mut counts);
    }
    (total > 0 && total >= opts.model_min_entries).then(|| counts.finish())
}

/// The byte columns of payload encodings 3 and 4 for `E`.
fn layout_of<E: Entry>() -> Layout {
    Layout { key_width: E::KEY_WIDTH, rest_width: E::WIDTH - E::KEY_WIDTH }
}

/// Fixed fields at the start of every frame.
struct FrameHeader {
    encoding: u8,
    entry_width: usize,
    entries: usize,
    /// Key runs of encodings 3 and 4 (the entry count otherwise); derived from `raw_len`.
    runs: usize,
    /// The payload's length after decoding (`check_raw_len`).
    raw_len: usize,
    payload_len: usize,
}

impl FrameHeader {
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&FRAME_MAGIC);
        out.push(FRAME_VERSION);
        out.push(self.encoding);
        out.extend_from_slice(&(self.entry_width as u16).to_le_bytes());
        out.extend_from_slice(&(self.entries as u32).to_le_bytes());
        out.extend_from_slice(&(self.raw_len as u32).to_le_bytes());
        out.extend_from_slice(&(self.payload_len as u32).to_le_bytes());
        assert_eq!(out.len() - start, FRAME_HEADER_LEN);
    }

    /// Parses and bounds-checks the header of `frame`, which must be exactly one whole frame.
    fn parse<E: Entry>(frame: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "frame";
        let mut reader = Reader::new(WHAT, frame);
        let magic = reader.array::<4>()?;
        if magic != FRAME_MAGIC {
            return Err(FormatError::Magic { what: WHAT, found: magic });
        }
        let version = reader.u8()?;
        if version != FRAME_VERSION {
            return Err(FormatError::Version { what: WHAT, found: version.into() });
        }
        let encoding = reader.u8()?;
        if !ENCODINGS.contains(&encoding) {
            return Err(invalid(WHAT, format!("unknown payload encoding {encoding}")));
        }
        let entry_width = reader.u16()? as usize;
        check_range(WHAT, "entry width", entry_width as u64, E::WIDTH as u64, E::WIDTH as u64)?;
        let entries = reader.u32()? as usize;
        check_range(WHAT, "entry count", entries as u64, 1, max_frame_entries::<E>() as u64)?;
        let raw_len = reader.u32()? as usize;
        let runs = check_raw_len::<E>(encoding, entries, raw_len)?;
        let payload_len = reader.u32()? as usize;
        check_range(WHAT, "payload length", payload_len as u64, 1, MAX_FRAME_PAYLOAD_BYTES as u64)?;
        let header = FrameHeader { encoding, entry_width, entries, runs, raw_len, payload_len };
        let frame_len = FRAME_OVERHEAD + payload_len;
        if frame.len() != frame_len {
            return Err(FormatError::Length { what: WHAT, expected: frame_len as u64, found: frame.len() as u64 });
        }
        Ok(header)
    }
}

/// The decoded payload's length: every entry's bytes in encodings 1 and 2; in encodings 3 and 4
/// every entry's rest plus a key and a run length for each of 1..=`entries` runs, and in encoding
/// 3 never more than encoding 2's (a writer picks 3 only then). Returns the number of runs.
fn check_raw_len<E: Entry>(encoding: u8, entries: usize, raw_len: usize) -> Result<usize, FormatError> {
    let whole = entries * E::WIDTH;
    if ![ENCODING_SPREAD_KEY_RUNS_ZSTD, ENCODING_SPREAD_KEY_RUNS_MODELLED].contains(&encoding) {
        check_range("frame", "raw length", raw_len as u64, whole as u64, whole as u64)?;
        return Ok(entries);
    }
    let rests = entries * (E::WIDTH - E::KEY_WIDTH);
    let run_bytes = E::KEY_WIDTH + RUN_LEN_BYTES;
    let runs = raw_len.checked_sub(rests).filter(|keyed| keyed % run_bytes == 0).map(|keyed| keyed / run_bytes);
    let shorter = raw_len <= whole || encoding == ENCODING_SPREAD_KEY_RUNS_MODELLED;
    match runs {
        Some(runs) if (1..=entries).contains(&runs) && shorter => Ok(runs),
        _ => Err(invalid(
            "frame",
            format!("raw length {raw_len} is no encoding-{encoding} payload of {entries} entries"),
        )),
    }
}

/// Reusable compressor and buffers for writing frames.
struct FrameEncoder {
    compressor: zstd::bulk::Compressor<'static>,
    spread: Vec<u8>,
    keys: Vec<u8>,
    runs: Vec<u16>,
    rests: Vec<u8>,
    shuffled: Vec<u8>,
    steps: Vec<coder::Step>,
    payload: Vec<u8>,
    frame: Vec<u8>,
}

impl FrameEncoder {
    fn new(zstd_level: i32) -> io::Result<Self> {
        Ok(Self::with_compressor(zstd::bulk::Compressor::new(zstd_level)?))
    }

    /// An encoder only for `count` (its compressor never compresses).
    fn sampler() -> Self {
        Self::with_compressor(zstd::bulk::Compressor::default())
    }

    fn with_compressor(compressor: zstd::bulk::Compressor<'static>) -> Self {
        FrameEncoder {
            compressor,
            spread: Vec::new(),
            keys: Vec::new(),
            runs: Vec::new(),
            rests: Vec::new(),
            shuffled: Vec::new(),
            steps: Vec::new(),
            payload: Vec::new(),
            frame: Vec::new(),
        }
    }

    /// Encodes sorted raw entries of `E` as one frame and returns its bytes: with `models`,
    /// payload encoding 4 when its payload is no longer than the raw entries; otherwise encoding
    /// 3 when its raw payload is no longer than encoding 2's (the frame repeats keys), else 2.
    fn encode<E: Entry>(&mut self, raw: &[u8], models: Option<&ColumnModels>) -> io::Result<&[u8]> {
        let width = E::WIDTH;
        assert!(!raw.is_empty() && raw.len().is_multiple_of(width) && raw.len() <= MAX_FRAME_RAW_BYTES);
        const { assert!(E::KEY_WIDTH < E::WIDTH && MAX_FRAME_RAW_BYTES / E::WIDTH <= u16::MAX as usize) };
        let entries = raw.len() / width;
        self.spread_runs::<E>(raw);
        let encoding = match models {
            Some(models) if self.code_under(models, entries) <= raw.len() => ENCODING_SPREAD_KEY_RUNS_MODELLED,
            _ => self.compress::<E>(entries)?,
        };
        let payload_len = self.payload.len();
        assert!(payload_len <= MAX_FRAME_PAYLOAD_BYTES);
        self.frame.clear();
        let runs = self.runs.len();
        FrameHeader { encoding, entry_width: width, entries, runs, raw_len: self.shuffled.len(), payload_len }
            .encode(&mut self.frame);
        self.frame.extend_from_slice(&self.payload);
        let checksum = xxh3_64(&self.frame);
        self.frame.extend_from_slice(&checksum.to_le_bytes());
        assert_eq!(self.frame.len(), FRAME_OVERHEAD + payload_len);
        Ok(&self.frame)
    }

    /// Codes the layout in `shuffled` under `models` into `payload` (encoding 4); returns its length.
    fn code_under(&mut self, models: &ColumnModels, entries: usize) -> usize {
        self.payload.clear();
        coder::encode(models, &self.shuffled, self.runs.len(), entries, &mut self.steps, &mut self.payload);
        self.payload.len()
    }

    /// Compresses the spread entries into `payload` with zstd: encoding 3's layout (already in
    /// `shuffled`) when it is no longer than encoding 2's, which stores every entry's key.
    fn compress<E: Entry>(&mut self, entries: usize) -> io::Result<u8> {
        let encoding = if self.runs.len() * (E::KEY_WIDTH + RUN_LEN_BYTES) <= entries * E::KEY_WIDTH {
            ENCODING_SPREAD_KEY_RUNS_ZSTD
        } else {
            self.shuffled.clear();
            xor_delta_transpose(&self.spread, E::WIDTH, &mut self.shuffled);
            ENCODING_SPREAD_XOR_TRANSPOSE_ZSTD
        };
        assert!(self.shuffled.len() <= entries * E::WIDTH);
        self.payload.clear();
        self.payload.reserve(zstd::zstd_safe::compress_bound(self.shuffled.len()));
        self.compressor.compress_to_buffer(self.shuffled.as_slice(), &mut self.payload)?;
        Ok(encoding)
    }

    /// Counts the bytes of encoding 4's layout of sorted raw entries for a table's models.
    fn count<E: Entry>(&mut self, raw: &[u8], counts: &mut ModelCounts) {
        self.spread_runs::<E>(raw);
        counts.add(&self.shuffled, self.runs.len(), raw.len() / E::WIDTH);
    }

    /// Leaves raw entries spread in `spread` and their encoding-3 layout in `shuffled`.
    fn spread_runs<E: Entry>(&mut self, raw: &[u8]) {
        let width = E::WIDTH;
        self.spread.clear();
        self.spread.extend_from_slice(raw);
        map_rkeys(&mut self.spread, width, E::RKEY_OFFSETS, tid::spread);
        split_key_runs(&self.spread, width, E::KEY_WIDTH, &mut self.keys, &mut self.runs, &mut self.rests);
        self.shuffled.clear();
        key_runs_transpose(
            &self.keys,
            &self.runs,
            &self.rests,
            (E::KEY_WIDTH, width - E::KEY_WIDTH),
            &mut self.shuffled,
        );
    }
}

/// Replaces each record key (the big-endian `u64` at each of `offsets` in every entry) by `map`
/// of it: `tid::spread` before encoding 2's XOR, `tid::gather` after it.
fn map_rkeys(raw: &mut [u8], width: usize, offsets: &[usize], map: fn(u64) -> u64) {
    for entry in raw.chunks_exact_mut(width) {
        for &at in offsets {
            let field: &mut [u8; 8] = (&mut entry[at..at + 8]).try_into().expect("a record key is 8 bytes");
            *field = map(u64::from_be_bytes(*field)).to_be_bytes();
        }
    }
}

/// XOR each entry with the previous one (the first with zeros), then transpose: all byte 0s,
/// then all byte 1s, and so on, appended to `out`. Sorted neighbours share long prefixes, so the
/// deltas are mostly zero bytes, and transposing puts the zeros (and the slowly changing bytes)
/// next to each other where zstd compresses them best.
fn xor_delta_transpose(raw: &[u8], width: usize, out: &mut Vec<u8>) {
    let count = raw.len() / width;
    let start = out.len();
    out.resize(start + raw.len(), 0);
    for byte in 0..width {
        let column = &mut out[start + byte * count..start + (byte + 1) * count];
        let mut previous = 0u8;
        for (i, slot) in column.iter_mut().enumerate() {
            let value = raw[i * width + byte];
            *slot = value ^ previous;
            previous = value;
        }
    }
}

/// Appends fixed-width fields as byte columns: byte 0 of `item(0)..item(count)`, then byte 1 of
/// each, and so on (run lengths, frame index fields, outline range ids and lengths).
pub(crate) fn transpose_into<const N: usize>(count: usize, item: impl Fn(usize) -> [u8; N], out: &mut Vec<u8>) {
    for byte in 0..N {
        out.extend((0..count).map(|i| item(i)[byte]));
    }
}

/// Field `i` of `count` fields that `transpose_into` stored in `columns`.
pub(crate) fn untransposed<const N: usize>(columns: &[u8], count: usize, i: usize) -> [u8; N] {
    std::array::from_fn(|byte| columns[byte * count + i])
}

/// How many runs of equal keys (the first `key_width` bytes) the sorted entries form.
fn count_key_runs(raw: &[u8], width: usize, key_width: usize) -> usize {
    let keys = || raw.chunks_exact(width).map(|entry| &entry[..key_width]);
    1 + keys().zip(keys().skip(1)).filter(|(previous, key)| previous != key).count()
}

/// Splits sorted entries into their runs of equal keys (the first `key_width` bytes): each run's
/// key once into `keys`, its length into `runs`, and every entry's remaining bytes into `rests`.
fn split_key_runs(
    raw: &[u8],
    width: usize,
    key_width: usize,
    keys: &mut Vec<u8>,
    runs: &mut Vec<u16>,
    rests: &mut Vec<u8>,
) {
    keys.clear();
    runs.clear();
    rests.clear();
    for entry in raw.chunks_exact(width) {
        let (key, rest) = entry.split_at(key_width);
        match runs.last_mut() {
            Some(run) if keys[keys.len() - key_width..] == *key => *run += 1,
            _ => {
                keys.extend_from_slice(key);
                runs.push(1);
            }
        }
        rests.extend_from_slice(rest);
    }
    assert_eq!(runs.iter().map(|&r| usize::from(r)).sum::<usize>(), raw.len() / width);
    assert_eq!(runs.len(), count_key_runs(raw, width, key_width));
}

/// Payload encoding 3's layout, appended to `out`: the runs' keys XOR-delta'd and transposed,
/// the run lengths as big-endian u16s transposed (every high byte, then every low byte), then the
/// entries' rests XOR-delta'd and transposed.
fn key_runs_transpose(keys: &[u8], runs: &[u16], rests: &[u8], widths: (usize, usize), out: &mut Vec<u8>) {
    let (key_width, rest_width) = widths;
    xor_delta_transpose(keys, key_width, out);
    transpose_into(runs.len(), |i| runs[i].to_be_bytes(), out);
    xor_delta_transpose(rests, rest_width, out);
}

/// Inverse of `xor_delta_transpose`: a running XOR down each column restores the entries.
///
/// Eight entries by eight columns at a time when the width allows: each column's eight bytes are
/// read as one word, un-XORed with a prefix XOR inside the word, and the 8x8 block is transposed
/// with word operations, so every output word is written whole. Byte by byte (the rest, and the
/// reference in the tests) it was the hottest loop of a warm query, by profile.
fn untranspose_xor_undelta(shuffled: &[u8], width: usize, raw: &mut Vec<u8>) {
    let count = shuffled.len() / width;
    raw.clear();
    raw.resize(shuffled.len(), 0);
    let blocked = if width.is_multiple_of(8) { count / 8 * 8 } else { 0 };
    // Eight columns at a time, down all the entries: eight read streams. All the columns at once
    // would be `width` streams a power of two apart, more than the L1 cache's ways can hold.
    for group in (0..width).step_by(8) {
        let columns = group..(group + 8).min(width);
        let mut running = [0u8; 8];
        for first in (0..blocked).step_by(8) {
            let mut block = [0u64; 8];
            for (k, word) in block.iter_mut().enumerate() {
                let at = (group + k) * count + first;
                let deltas = u64::from_le_bytes(shuffled[at..at + 8].try_into().expect("eight bytes"));
                *word = prefix_xor(deltas) ^ (u64::from(running[k]) * 0x0101_0101_0101_0101);
                running[k] = (*word >> 56) as u8;
            }
            for (j, row) in transpose_8x8(block).iter().enumerate() {
                let at = (first + j) * width + group;
                raw[at..at + 8].copy_from_slice(&row.to_le_bytes());
            }
        }
        for (k, column) in columns.enumerate() {
            let mut value = running[k];
            for i in blocked..count {
                value ^= shuffled[column * count + i];
                raw[i * width + column] = value;
            }
        }
    }
}

/// Byte `j` of the result is the XOR of bytes `0..=j` of `x` (little-endian byte order).
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 8;
    x ^= x << 16;
    x ^ (x << 32)
}

/// Transposes an 8x8 byte matrix held as eight little-endian words (word = row, byte = column):
/// swaps 1-byte, then 2-byte, then 4-byte sub-blocks across the diagonal.
fn transpose_8x8(mut m: [u64; 8]) -> [u64; 8] {
    for (shift, mask, pairs) in [
        (8, 0x00FF_00FF_00FF_00FF_u64, [(0, 1), (2, 3), (4, 5), (6, 7)]),
        (16, 0x0000_FFFF_0000_FFFF_u64, [(0, 2), (1, 3), (4, 6), (5, 7)]),
        (32, 0x0000_0000_FFFF_FFFF_u64, [(0, 4), (1, 5), (2, 6), (3, 7)]),
    ] {
        for (a, b) in pairs {
            let swap = ((m[a] >> shift) ^ m[b]) & mask;
            m[b] ^= swap;
            m[a] ^= swap << shift;
        }
    }
    m
}

thread_local! {
    /// Each thread's frame decoder, reused: creating a zstd context (and growing the buffers)
    /// cost more than decompressing a frame (5 % of a warm query's CPU, by profile).
    static DECODER: Cell<Option<FrameDecoder>> = const { Cell::new(None) };
}

/// Runs `work` with this thread's decoder (a new one if it is in use or was never made).
fn with_decoder<T>(work: impl FnOnce(&mut FrameDecoder) -> Result<T, FormatError>) -> Result<T, FormatError> {
    let mut decoder = match DECODER.take() {
        Some(decoder) => decoder,
        None => FrameDecoder::new()?,
    };
    let result = work(&mut decoder);
    DECODER.set(Some(decoder));
    result
}

/// Reusable buffers for decoding frames.
struct FrameDecoder {
    decompressor: zstd::bulk::Decompressor<'static>,
    shuffled: Vec<u8>,
    keys: Vec<u8>,
    rests: Vec<u8>,
    raw: Vec<u8>,
}

impl FrameDecoder {
    fn new() -> Result<Self, FormatError> {
        let decompressor =
            zstd::bulk::Decompressor::new().map_err(|e| invalid("frame", format!("zstd context: {e}")))?;
        Ok(FrameDecoder { decompressor, shuffled: Vec::new(), keys: Vec::new(), rests: Vec::new(), raw: Vec::new() })
    }

    /// Decodes one whole frame and appends its entries to `out`; on error `out` may hold a
    /// partial frame (the public wrappers truncate it).
    fn decode<E: Entry>(
        &mut self,
        frame: &[u8],
        models: Option<&ColumnModels>,
        out: &mut Vec<E>,
    ) -> Result<(), FormatError> {
        let header = FrameHeader::parse::<E>(frame)?;
        verify_checksum("frame", frame)?;
        let payload = &frame[FRAME_HEADER_LEN..FRAME_HEADER_LEN + header.payload_len];
        if header.encoding == ENCODING_SPREAD_KEY_RUNS_MODELLED {
            let models =
                models.ok_or_else(|| invalid("frame", "an encoding-4 frame in a table without models".into()))?;
            coder::decode(models, payload, header.runs, header.entries, &mut self.shuffled)?;
        } else {
            self.decompress(payload, header.raw_len)?;
        }
        if header.encoding >= ENCODING_SPREAD_KEY_RUNS_ZSTD {
            self.join_key_runs::<E>(header.runs)?;
        } else {
            untranspose_xor_undelta(&self.shuffled, header.entry_width, &mut self.raw);
        }
        if header.encoding != ENCODING_XOR_TRANSPOSE_ZSTD {
            map_rkeys(&mut self.raw, header.entry_width, E::RKEY_OFFSETS, tid::gather);
        }
        push_increasing(&self.raw, out)?;
        assert_eq!(self.raw.len(), header.entries * E::WIDTH);
        Ok(())
    }

    /// Inverse of `key_runs_transpose` for `runs` runs (the header checks bounded them and the
    /// layout's length): each run's key joined to the rests of its entries. Runs of length 0 and
    /// run lengths that do not add up to the entry count are rejected.
    fn join_key_runs<E: Entry>(&mut self, runs: usize) -> Result<(), FormatError> {
        let (key_width, rest_width) = (E::KEY_WIDTH, E::WIDTH - E::KEY_WIDTH);
        let (keys, tail) = self.shuffled.split_at(runs * key_width);
        let (lengths, rests) = tail.split_at(runs * RUN_LEN_BYTES);
        untranspose_xor_undelta(keys, key_width, &mut self.keys);
        untranspose_xor_undelta(rests, rest_width, &mut self.rests);
        self.raw.clear();
        let mut rest_rows = self.rests.chunks_exact(rest_width);
        for (i, key) in self.keys.chunks_exact(key_width).enumerate() {
            let run = u16::from_be_bytes(untransposed(lengths, runs, i));
            if run == 0 {
                return Err(invalid("frame", "a key run of length 0".into()));
            }
            for _ in 0..run {
                let rest = rest_rows
                    .next()
                    .ok_or_else(|| invalid("frame", "key runs hold more entries than the frame".into()))?;
                self.raw.extend_from_slice(key);
                self.raw.extend_from_slice(rest);
            }
        }
        if rest_rows.next().is_some() {
            return Err(invalid("frame", "key runs hold fewer entries than the frame".into()));
        }
        Ok(())
    }

    /// Decompresses into exactly `raw_len` bytes (already bounded by the header checks).
    fn decompress(&mut self, payload: &[u8], raw_len: usize) -> Result<(), FormatError> {
        // zstd writes from the start of the vector and never past its capacity.
        self.shuffled.clear();
        self.shuffled.reserve_exact(raw_len);
        let written = self
            .decompressor
            .decompress_to_buffer(payload, &mut self.shuffled)
            .map_err(|e| invalid("frame", format!("zstd: {e}")))?;
        if written != raw_len || self.shuffled.len() != raw_len {
            return Err(FormatError::Length { what: "frame payload", expected: raw_len as u64, found: written as u64 });
        }
        Ok(())
    }
}

/// Decodes raw entries into `out`, checking that they are strictly increasing.
fn push_increasing<E: Entry>(raw: &[u8], out: &mut Vec<E>) -> Result<(), FormatError> {
    let mut previous: Option<&[u8]> = None;
    for encoded in raw.chunks_exact(E::WIDTH) {
        if previous.is_some_and(|previous| previous >= encoded) {
            return Err(invalid("frame", format!("entries are not strictly increasing at {:?}", E::decode(encoded))));
        }
        out.push(E::decode(encoded));
        previous = Some(encoded);
    }
    Ok(())
}

/// Decodes one whole frame (exactly its bytes) of a table with the column models `models` (an
/// encoding-4 frame without them is an error), verifying magic, lengths, checksum and order. On
/// error `out` is unchanged.
pub fn decode_frame<E: Entry>(
    bytes: &[u8],
    models: Option<&ColumnModels>,
    out: &mut Vec<E>,
) -> Result<(), FormatError> {
    let original = out.len();
    let result = with_decoder(|decoder| decoder.decode(bytes, models, out));
    if result.is_err() {
        out.truncate(original);
    }
    result
}

/// Decodes `meta.frames[r]` from `bytes`, the contiguous range `meta.byte_range(r)` of the data
/// file, and checks every frame against its index record. On error `out` is unchanged.
pub fn decode_frames<E: Entry>(
    meta: &TableMeta<E>,
    r: Range<usize>,
    bytes: &[u8],
    out: &mut Vec<E>,
) -> Result<(), FormatError> {
    let original = out.len();
    let result = decode_frames_checked(meta, r, bytes, out);
    if result.is_err() {
        out.truncate(original);
    }
    result
}

fn decode_frames_checked<E: Entry>(
    meta: &TableMeta<E>,
    r: Range<usize>,
    bytes: &[u8],
    out: &mut Vec<E>,
) -> Result<(), FormatError> {
    const WHAT: &str = "frame range";
    if r.start > r.end || r.end > meta.frames.len() {
        return Err(invalid(WHAT, format!("frames {r:?} of a table with {}", meta.frames.len())));
    }
    let (start, end) = meta.byte_range(r.clone());
    let expected = end.saturating_sub(start);
    if bytes.len() as u64 != expected {
        return Err(FormatError::Length { what: WHAT, expected, found: bytes.len() as u64 });
    }
    with_decoder(|decoder| {
        for index in r {
            let before = out.len();
            decoder.decode(frame_bytes(bytes, start, &meta.frames[index])?, meta.models.as_ref(), out)?;
            check_frame_against_index(meta, index, &out[before..])?;
        }
        Ok(())
    })
}

/// Checks a whole data file against its meta without decompressing it: the exact length, then
/// every frame's header and checksum. An upload runs this, so a local copy that rotted on disk
/// never reaches the bucket (where it would replace the only good copy's chance of existing).
pub fn verify_data_checksums<E: Entry>(meta: &TableMeta<E>, data: &[u8]) -> Result<(), FormatError> {
    if data.len() as u64 != meta.data_len {
        return Err(FormatError::Length { what: "data file", expected: meta.data_len, found: data.len() as u64 });
    }
    for info in &meta.frames {
        let frame = frame_bytes(data, 0, info)?;
        FrameHeader::parse::<E>(frame)?;
        verify_checksum("frame", frame)?;
    }
    Ok(())
}

/// The bytes of one frame within a range read that starts at data-file offset `start`. A meta
/// from `TableMeta::decode` always fits; a hand-made inconsistent one gets an error, not a panic.
fn frame_bytes<'a, E>(bytes: &'a [u8], start: u64, info: &FrameInfo<E>) -> Result<&'a [u8], FormatError> {
    let at = info.offset.checked_sub(start).and_then(|at| usize::try_from(at).ok());
    let range = at.and_then(|at| Some(at..at.checked_add(info.len as usize)?));
    range
        .and_then(|range| bytes.get(range))
        .ok_or_else(|| invalid("frame range", format!("frame at {} is outside the bytes read", info.offset)))
}

/// The decoded entries of frame `index` must agree with the index: count, first entry, the next
/// frame's first entry and `continues` flag, or the table's last entry.
fn check_frame_against_index<E: Entry>(meta: &TableMeta<E>, index: usize, decoded: &[E]) -> Result<(), FormatError> {
    let info = &meta.frames[index];
    let mismatch =
        |detail: &str| Err(invalid("frame", format!("frame {index} disagrees with the meta file: {detail}")));
    let (Some(first), Some(last)) = (decoded.first(), decoded.last()) else { return mismatch("no entries") };
    if decoded.len() != info.entries as usize {
        return mismatch("entry count");
    }
    if *first != info.first {
        return mismatch("first entry");
    }
    match meta.frames.get(index + 1) {
        Some(next) if *last >= next.first => mismatch("overlaps the next frame"),
        Some(next) if (last.key() == next.first.key()) != next.continues => mismatch("next frame's continues flag"),
        None if Some(*last) != meta.last => mismatch("last entry"),
        _ => Ok(()),
    }
}

impl<E: Entry> TableMeta<E> {
    fn new(
        filter: Filter,
        frames: Vec<FrameInfo<E>>,
        last: Option<E>,
        entries: u64,
        data_len: u64,
        models: Option<ColumnModels>,
    ) -> Self {
        let sampled_firsts = frames.iter().step_by(SAMPLE_STRIDE).map(|frame| frame.first).collect();
        TableMeta { filter, frames, last, entries, data_len, models, sampled_firsts }
    }

    /// True unless the filter proves that no entry has the hashed key.
    pub fn may_contain(&self, h: KeyHash) -> bool {
        self.filter.may_contain(h)
    }

    /// Starts loading what `may_contain(h)` will read (see `Filter::prefetch`).
    pub fn prefetch(&self, h: KeyHash) {
        self.filter.prefetch(h)
    }

    /// Frames that may hold entries `e` with `lo <= e <= hi`: every frame that does, plus at
    /// most one extra frame at the start. Empty when the range is empty or misses the table.
    pub fn frames_overlapping(&self, lo: &E, hi: &E) -> Range<usize> {
        let Some(last) = self.last else { return 0..0 };
        if lo > hi || *lo > last {
            return 0..0;
        }
        // Frames starting at or before `hi`; the ones after them start past the range.
        let end = self.frames_starting_at_or_before(hi);
        // The last frame starting at or before `lo` is the only earlier one that may reach `lo`.
        let mut start = self.frames_starting_at_or_before(lo).saturating_sub(1);
        // It does not, when the next frame starts `lo`'s key without continuing it: then every
        // entry of `start` has a smaller key than `lo`. This saves a frame on every key lookup.
        if self.frames.get(start + 1).is_some_and(|next| next.first.key() == lo.key() && !next.continues) {
            start += 1;
        }
        start.min(end)..end
    }

    /// How many frames start at or before `bound`: `frames.partition_point(|f| f.first <= *bound)`,
    /// found through `sampled_firsts` and then within one stride.
    fn frames_starting_at_or_before(&self, bound: &E) -> usize {
        let samples = self.sampled_firsts.partition_point(|first| first <= bound);
        // Sample `samples - 1` is at or before `bound` and sample `samples` is past it: the answer
        // lies in the stride between them.
        let lo = samples.saturating_sub(1) * SAMPLE_STRIDE;
        let hi = (samples * SAMPLE_STRIDE).min(self.frames.len());
        lo + self.frames[lo..hi].partition_point(|frame| frame.first <= *bound)
    }

    /// Frames that may hold entries whose key is `key`.
    pub fn frames_for_key(&self, key: RecordId) -> Range<usize> {
        self.frames_overlapping(&E::min_for_key(key), &E::max_for_key(key))
    }

    /// The half-open byte range `(start, end)` of the data file covering `frames[r]`, for one
    /// coalesced ranged read. An empty `r` gives an empty range. Panics if `r` is out of bounds.
    pub fn byte_range(&self, r: Range<usize>) -> (u64, u64) {
        assert!(r.start <= r.end && r.end <= self.frames.len(), "frame range {r:?} out of bounds");
        let offset_of = |index: usize| self.frames.get(index).map_or(self.data_len, |frame| frame.offset);
        if r.is_empty() {
            return (offset_of(r.start), offset_of(r.start));
        }
        let last = &self.frames[r.end - 1];
        (self.frames[r.start].offset, last.offset.saturating_add(u64::from(last.len)))
    }

    /// Appends the meta file encoding (docs/format.md "Meta file"): version 3 for a table with
    /// column models, else version 2, or version 1 when the frame index compresses more than
    /// `MAX_INDEX_EXPANSION`-fold (a reader refuses such a compressed index, so that a small file
    /// cannot make it allocate gigabytes; version 3 then keeps version 1's fixed records). Public
    /// for the fuzz targets' round trip; tables are written by `TableBuilder`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        assert_eq!(self.entries == 0, self.frames.is_empty());
        assert_eq!(self.entries == 0, self.last.is_none());
        let index = encode_frame_index(&self.frames);
        let columns_len = self.frames.len() * (E::WIDTH + FRAME_COLUMNS_FIXED_LEN);
        let index = (columns_len <= MAX_INDEX_EXPANSION * index.len()).then_some(index);
        let models = self.models.as_ref().map(|models| {
            zstd::bulk::compress(&models.encode(), DEFAULT_ZSTD_LEVEL).expect("zstd compresses in memory")
        });
        let start = out.len();
        out.extend_from_slice(&META_MAGIC);
        let version = match (&index, &models) {
            (_, Some(_)) => META_MODELS_VERSION,
            (Some(_), None) => META_COLUMNS_VERSION,
            (None, None) => META_ROWS_VERSION,
        };
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(E::WIDTH as u16).to_le_bytes());
        out.extend_from_slice(&(E::KEY_WIDTH as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.frames.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.entries.to_le_bytes());
        out.extend_from_slice(&self.data_len.to_le_bytes());
        out.extend_from_slice(&(self.filter.encoded_len() as u32).to_le_bytes());
        // Versions 2 and 3 give the index length (0 in version 3 for fixed records), 3 the models'.
        if version >= META_COLUMNS_VERSION {
            out.extend_from_slice(&(index.as_ref().map_or(0, Vec::len) as u32).to_le_bytes());
        }
        if let Some(models) = &models {
            out.extend_from_slice(&(models.len() as u32).to_le_bytes());
        }
        self.filter.encode(out);
        if let Some(last) = &self.last {
            encode_entry(last, out);
        }
        match &index {
            Some(index) => out.extend_from_slice(index),
            None => self.frames.iter().for_each(|frame| encode_frame_info(frame, out)),
        }
        if let Some(models) = &models {
            out.extend_from_slice(models);
        }
        let checksum = xxh3_64(&out[start..]);
        out.extend_from_slice(&checksum.to_le_bytes());
    }

    /// Parses a meta file of either version: header, exact length, checksum, then body and
    /// cross-field checks.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let header = MetaHeader::parse::<E>(bytes)?;
        verify_checksum(META_WHAT, bytes)?;
        let mut reader = Reader::new(META_WHAT, &bytes[header.header_len()..bytes.len() - CHECKSUM_LEN]);
        let filter = Filter::decode(reader.take(header.filter_len)?)?;
        let last = if header.entries > 0 { Some(decode_entry(reader.take(E::WIDTH)?)) } else { None };
        let frames = match header.index_len {
            None => (0..header.frames).map(|_| decode_frame_info(&mut reader)).collect::<Result<Vec<_>, _>>()?,
            Some(len) => decode_frame_index(reader.take(len)?, header.frames)?,
        };
        let models = match header.models_len {
            Some(len) => Some(decode_models::<E>(reader.take(len)?)?),
            None => None,
        };
        reader.expect_end()?;
        let meta = TableMeta::new(filter, frames, last, header.entries, header.data_len, models);
        meta.check_index()?;
        Ok(meta)
    }

    /// Cross-field checks of a decoded index (the checksum only proves it was written whole).
    fn check_index(&self) -> Result<(), FormatError> {
        let bad = |detail: String| Err(invalid(META_WHAT, detail));
        if (self.entries == 0) != self.frames.is_empty() {
            return bad(format!("{} entries in {} frames", self.entries, self.frames.len()));
        }
        let (mut offset, mut entries) = (0u64, 0u64);
        for (index, frame) in self.frames.iter().enumerate() {
            check_range(META_WHAT, "frame entries", frame.entries.into(), 1, max_frame_entries::<E>() as u64)?;
            check_range(
                META_WHAT,
                "frame length",
                frame.len.into(),
                FRAME_OVERHEAD as u64 + 1,
                MAX_FRAME_BYTES as u64,
            )?;
            if frame.offset != offset {
                return bad(format!("frame {index} at offset {} instead of {offset}", frame.offset));
            }
            let previous = index.checked_sub(1).map(|i| &self.frames[i]);
            if previous.is_some_and(|previous| previous.first >= frame.first) {
                return bad(format!("frame {index} does not start after frame {}", index - 1));
            }
            if index == 0 && frame.continues {
                return bad("frame 0 continues a previous frame".into());
            }
            offset += u64::from(frame.len);
            entries += u64::from(frame.entries);
        }
        if offset != self.data_len || entries != self.entries {
            return bad(format!(
                "frames cover {offset} bytes and {entries} entries, header says {} and {}",
                self.data_len, self.entries
            ));
        }
        self.check_last()
    }

    fn check_last(&self) -> Result<(), FormatError> {
        let (Some(last), Some(last_frame)) = (self.last, self.frames.last()) else { return Ok(()) };
        let fits = if last_frame.entries == 1 { last == last_frame.first } else { last > last_frame.first };
        if !fits {
            return Err(invalid(META_WHAT, format!("last entry {last:?} does not fit the last frame")));
        }
        Ok(())
    }
}

const META_WHAT: &str = "meta";

/// Fixed fields at the start of a meta file.
struct MetaHeader {
    version: u16,
    frames: usize,
    entries: u64,
    data_len: u64,
    filter_len: usize,
    /// The compressed frame index's length (versions 2 and 3); `None` in version 1 (fixed records).
    index_len: Option<usize>,
    /// The compressed column models' length (version 3).
    models_len: Option<usize>,
}

impl MetaHeader {
    /// Parses and bounds-checks the header; the file must be exactly the length it implies.
    fn parse<E: Entry>(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut reader = Reader::new(META_WHAT, bytes);
        let magic = reader.array::<4>()?;
        if magic != META_MAGIC {
            return Err(FormatError::Magic { what: META_WHAT, found: magic });
        }
        let version = reader.u16()?;
        if ![META_ROWS_VERSION, META_COLUMNS_VERSION, META_MODELS_VERSION].contains(&version) {
            return Err(FormatError::Version { what: META_WHAT, found: version.into() });
        }
        let width = reader.u16()?;
        check_range(META_WHAT, "entry width", width.into(), E::WIDTH as u64, E::WIDTH as u64)?;
        let key_width = reader.u16()?;
        check_range(META_WHAT, "key width", key_width.into(), E::KEY_WIDTH as u64, E::KEY_WIDTH as u64)?;
        let reserved = reader.u16()?;
        check_range(META_WHAT, "reserved", reserved.into(), 0, 0)?;
        let frames = reader.u32()? as usize;
        check_range(META_WHAT, "frame count", frames as u64, 0, MAX_FRAMES as u64)?;
        let entries = reader.u64()?;
        check_range(META_WHAT, "entry count", entries, 0, MAX_FRAMES as u64 * max_frame_entries::<E>() as u64)?;
        let data_len = reader.u64()?;
        check_range(META_WHAT, "data length", data_len, 0, MAX_FRAMES as u64 * MAX_FRAME_BYTES as u64)?;
        let filter_len = reader.u32()? as usize;
        check_range(META_WHAT, "filter length", filter_len as u64, 0, MAX_FILTER_LEN as u64)?;
        let index_len = if version >= META_COLUMNS_VERSION {
            let len = reader.u32()? as usize;
            if version == META_MODELS_VERSION && len == 0 {
                None // version 3 with the index as version 1's fixed records
            } else {
                Some(Self::check_index_len::<E>(frames, len)?)
            }
        } else {
            None
        };
        let models_len = if version == META_MODELS_VERSION {
            let len = reader.u32()? as usize;
            let bound = zstd::zstd_safe::compress_bound(ColumnModels::encoded_len(layout_of::<E>()));
            check_range(META_WHAT, "column models length", len as u64, 1, bound as u64)?;
            Some(len)
        } else {
            None
        };
        let header = MetaHeader { version, frames, entries, data_len, filter_len, index_len, models_len };
        let expected = header.file_len::<E>();
        if bytes.len() != expected {
            return Err(FormatError::Length { what: META_WHAT, expected: expected as u64, found: bytes.len() as u64 });
        }
        Ok(header)
    }

    /// A compressed frame index of `len` bytes for `frames` frames: within zstd's bound, and
    /// expanding at most `MAX_INDEX_EXPANSION`-fold.
    fn check_index_len<E: Entry>(frames: usize, len: usize) -> Result<usize, FormatError> {
        let columns = frames * (E::WIDTH + FRAME_COLUMNS_FIXED_LEN);
        let bound = zstd::zstd_safe::compress_bound(columns) as u64;
        check_range(META_WHAT, "frame index length", len as u64, 0, bound)?;
        if columns > MAX_INDEX_EXPANSION * len {
            return Err(invalid(META_WHAT, format!("a frame index of {len} bytes cannot hold {frames} frames")));
        }
        Ok(len)
    }

    /// Total file length implied by the header (every term is bounded, so no overflow).
    fn file_len<E: Entry>(&self) -> usize {
        let last_len = if self.entries > 0 { E::WIDTH } else { 0 };
        let index_len = self.index_len.unwrap_or(self.frames * (E::WIDTH + FRAME_INFO_FIXED_LEN));
        let models_len = self.models_len.unwrap_or(0);
        self.header_len() + self.filter_len + last_len + index_len + models_len + CHECKSUM_LEN
    }

    fn header_len(&self) -> usize {
        match self.version {
            META_MODELS_VERSION => META_V3_HEADER_LEN,
            META_COLUMNS_VERSION => META_V2_HEADER_LEN,
            _ => META_HEADER_LEN,
        }
    }
}

/// Version 2's frame index: one zstd frame (stating its size) of columns, each byte-transposed:
/// the first entries (record keys spread, XOR delta, as payload encoding 2), the flags, the
/// lengths (u32 LE) and the entry counts (u32 LE). Offsets are not stored: each frame starts
/// where the previous one ends.
fn encode_frame_index<E: Entry>(frames: &[FrameInfo<E>]) -> Vec<u8> {
    let mut firsts = Vec::with_capacity(frames.len() * E::WIDTH);
    frames.iter().for_each(|frame| encode_entry(&frame.first, &mut firsts));
    map_rkeys(&mut firsts, E::WIDTH, E::RKEY_OFFSETS, tid::spread);
    let mut columns = Vec::with_capacity(frames.len() * (E::WIDTH + FRAME_COLUMNS_FIXED_LEN));
    xor_delta_transpose(&firsts, E::WIDTH, &mut columns);
    columns.extend(frames.iter().map(|frame| if frame.continues { CONTINUES_FLAG } else { 0 }));
    transpose_into(frames.len(), |i| frames[i].len.to_le_bytes(), &mut columns);
    transpose_into(frames.len(), |i| frames[i].entries.to_le_bytes(), &mut columns);
    assert_eq!(columns.len(), frames.len() * (E::WIDTH + FRAME_COLUMNS_FIXED_LEN));
    zstd::bulk::compress(&columns, DEFAULT_ZSTD_LEVEL).expect("zstd compresses in memory")
}

/// Inverse of `encode_frame_index` for `count` frames (bounded by the header checks).
fn decode_frame_index<E: Entry>(compressed: &[u8], count: usize) -> Result<Vec<FrameInfo<E>>, FormatError> {
    let expected = count * (E::WIDTH + FRAME_COLUMNS_FIXED_LEN);
    let columns = crate::store::inflate(compressed, expected).map_err(|e| invalid(META_WHAT, e))?;
    if columns.len() != expected {
        return Err(FormatError::Length {
            what: "frame index",
            expected: expected as u64,
            found: columns.len() as u64,
        });
    }
    let (firsts, rest) = columns.split_at(count * E::WIDTH);
    let mut raw = Vec::new();
    untranspose_xor_undelta(firsts, E::WIDTH, &mut raw);
    map_rkeys(&mut raw, E::WIDTH, E::RKEY_OFFSETS, tid::gather);
    let (flags, rest) = rest.split_at(count);
    let (lens, entries) = rest.split_at(4 * count);
    let u32_at = |column: &[u8], i: usize| u32::from_le_bytes(untransposed(column, count, i));
    let mut offset = 0u64;
    let mut frames = Vec::with_capacity(count);
    for (i, first) in raw.chunks_exact(E::WIDTH).enumerate() {
        if flags[i] & !CONTINUES_FLAG != 0 {
            return Err(invalid(META_WHAT, format!("unknown frame flags {:#04x}", flags[i])));
        }
        let (len, entries) = (u32_at(lens, i), u32_at(entries, i));
        let continues = flags[i] & CONTINUES_FLAG != 0;
        frames.push(FrameInfo { first: decode_entry(first), continues, offset, len, entries });
        offset += u64::from(len);
    }
    Ok(frames)
}

/// Version 3's column models: one zstd frame (stating its size) of `ColumnModels::encode`.
fn decode_models<E: Entry>(compressed: &[u8]) -> Result<ColumnModels, FormatError> {
    let layout = layout_of::<E>();
    let bytes =
        crate::store::inflate(compressed, ColumnModels::encoded_len(layout)).map_err(|e| invalid(META_WHAT, e))?;
    ColumnModels::decode(layout, &bytes)
}

/// A version-1 frame index record.
fn encode_frame_info<E: Entry>(frame: &FrameInfo<E>, out: &mut Vec<u8>) {
    encode_entry(&frame.first, out);
    out.push(if frame.continues { CONTINUES_FLAG } else { 0 });
    out.extend_from_slice(&frame.offset.to_le_bytes());
    out.extend_from_slice(&frame.len.to_le_bytes());
    out.extend_from_slice(&frame.entries.to_le_bytes());
}

fn decode_frame_info<E: Entry>(reader: &mut Reader<'_>) -> Result<FrameInfo<E>, FormatError> {
    let first = decode_entry(reader.take(E::WIDTH)?);
    let flags = reader.u8()?;
    if flags & !CONTINUES_FLAG != 0 {
        return Err(invalid(META_WHAT, format!("unknown frame flags {flags:#04x}")));
    }
    let offset = reader.u64()?;
    let len = reader.u32()?;
    let entries = reader.u32()?;
    Ok(FrameInfo { first, continues: flags & CONTINUES_FLAG != 0, offset, len, entries })
}

fn encode_entry<E: Entry>(entry: &E, out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + E::WIDTH, 0);
    entry.encode(&mut out[at..]);
}

fn decode_entry<E: Entry>(bytes: &[u8]) -> E {
    assert_eq!(bytes.len(), E::WIDTH);
    E::decode(bytes)
}

/// Checks the trailing little-endian xxh3-64 of `bytes` against everything before it.
fn verify_checksum(what: &'static str, bytes: &[u8]) -> Result<(), FormatError> {
    let Some(split) = bytes.len().checked_sub(CHECKSUM_LEN) else {
        return Err(FormatError::Length { what, expected: CHECKSUM_LEN as u64, found: bytes.len() as u64 });
    };
    let stored = u64::from_le_bytes(bytes[split..].try_into().expect("8 bytes"));
    let computed = xxh3_64(&bytes[..split]);
    if stored != computed {
        return Err(FormatError::Checksum { what, stored, computed });
    }
    Ok(())
}

fn check_range(what: &'static str, field: &'static str, value: u64, min: u64, max: u64) -> Result<(), FormatError> {
    if (min..=max).contains(&value) { Ok(()) } else { Err(FormatError::OutOfRange { what, field, value, min, max }) }
}

fn invalid(what: &'static str, detail: String) -> FormatError {
    FormatError::Invalid { what, detail }
}

/// Bounds-checked little-endian reads from a byte slice.
struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Reader { what, bytes, position: 0 }
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], FormatError> {
        let end = self.position.checked_add(len).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            let expected = (self.position as u64).saturating_add(len as u64);
            return Err(FormatError::Length { what: self.what, expected, found: self.bytes.len() as u64 });
        };
        let taken = &self.bytes[self.position..end];
        self.position = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn expect_end(&self) -> Result<(), FormatError> {
        if self.position != self.bytes.len() {
            return Err(FormatError::Length {
                what: self.what,
                expected: self.position as u64,
                found: self.bytes.len() as u64,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{Backlink, OUTLINED_BIT, Revocation};
    use proptest::prelude::*;

    fn options(frame_bytes: usize) -> TableOptions {
        TableOptions { frame_bytes, ..TableOptions::default() }
    }

    /// Builds a table in memory: (data bytes, meta bytes, summary).
    fn build<E: Entry>(entries: &[E], opts: &TableOptions) -> (Vec<u8>, Vec<u8>, TableSummary) {
        let mut builder = TableBuilder::new(Vec::new(), opts, entries.len()).unwrap();
        entries.iter().for_each(|entry| builder.push(entry).unwrap());
        let (data, meta, summary) = builder.finish().unwrap();
        assert_eq!(summary.data_len, data.len() as u64);
        assert_eq!(summary.meta_len, meta.len() as u64);
        assert_eq!(summary.entries, entries.len() as u64);
        (data, meta, summary)
    }

    /// Reads frames[r] the way a query does: one contiguous byte range.
    fn read_frames<E: Entry>(meta: &TableMeta<E>, data: &[u8], r: Range<usize>) -> Vec<E> {
        let (start, end) = meta.byte_range(r.clone());
        let mut out = Vec::new();
        decode_frames(meta, r, &data[start as usize..end as usize], &mut out).unwrap();
        out
    }

    fn entries_between<E: Entry>(meta: &TableMeta<E>, data: &[u8], lo: &E, hi: &E) -> Vec<E> {
        let r = meta.frames_overlapping(lo, hi);
        let frames = read_frames(meta, data, r.clone());
        // Only the first frame of the range may miss the range entirely.
        for frame in &meta.frames[r.clone()][1.min(r.len())..] {
            assert!(*lo <= frame.first && frame.first <= *hi, "frame {frame:?} is outside {lo:?}..={hi:?}");
        }
        frames.into_iter().filter(|e| lo <= e && e <= hi).collect()
    }

    fn record(rkey: u64, collection: u64, did: u64) -> RecordId {
        RecordId { rkey, collection, did }
    }

    /// Backlinks from small domains, so that keys repeat and frames split keys.
    fn backlink_strategy() -> impl Strategy<Value = Backlink> {
        (0..6u64, 0..40u64, 0..3u64, 1..3u64, 0..3u64).prop_map(|(target, rkey, did, location, rev)| Backlink {
            target: record(target * 1000, 1, OUTLINED_BIT | target),
            source: record(rkey << 20, 2, OUTLINED_BIT | did),
            location,
            source_rev: rev,
        })
    }

    fn revocation_strategy() -> impl Strategy<Value = Revocation> {
        (0..50u64, 0..3u64, 0..4u64)
            .prop_map(|(rkey, did, rev)| Revocation { source: record(rkey, u64::from(rkey % 7 == 0), did), rev })
    }

    fn sorted_set<E: Entry>(mut entries: Vec<E>) -> Vec<E> {
        entries.sort();
        entries.dedup();
        entries
    }

    /// Round trip plus `frames_overlapping` against a plain filter over the full list.
    /// Builds `entries` as a table, with column models (payload encoding 4) when `modelled`,
    /// learnt from the frames within the first `spill_bytes`, and checks every way of reading it.
    fn check_table<E: Entry>(entries: &[E], frame_bytes: usize, modelled: bool, spill_bytes: usize, ranges: &[(E, E)]) {
        let model_min_entries = if modelled { 0 } else { u64::MAX };
        let options = TableOptions { model_min_entries, spill_bytes, ..options(frame_bytes) };
        let (data, meta_bytes, summary) = build(entries, &options);
        let meta = TableMeta::<E>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.models.is_some(), modelled && !entries.is_empty());
        let mut reencoded = Vec::new();
        meta.encode(&mut reencoded);
        assert_eq!(reencoded, meta_bytes, "a meta re-encodes to its own bytes");
        assert_eq!(meta.frames.len(), summary.frames as usize);
        assert_eq!(meta.last, entries.last().copied());
        assert_eq!(read_frames(&meta, &data, 0..meta.frames.len()), entries);
        for entry in entries {
            assert!(meta.may_contain(KeyHash::of_record(&entry.key())));
        }
        for (a, b) in ranges {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            for bound in [lo, hi] {
                let plain = meta.frames.partition_point(|frame| frame.first <= *bound);
                assert_eq!(meta.frames_starting_at_or_before(bound), plain, "bound {bound:?}");
            }
            let expected: Vec<E> = entries.iter().filter(|e| lo <= *e && *e <= hi).copied().collect();
            assert_eq!(entries_between(&meta, &data, lo, hi), expected, "range {lo:?}..={hi:?}");
            let key_entries: Vec<E> = entries.iter().filter(|e| e.key() == lo.key()).copied().collect();
            let r = meta.frames_for_key(lo.key());
            let found: Vec<E> = read_frames(&meta, &data, r).into_iter().filter(|e| e.key() == lo.key()).collect();
            assert_eq!(found, key_entries);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn backlink_tables_round_trip(
            entries in prop::collection::vec(backlink_strategy(), 0..300),
            frame_bytes in prop_oneof![1..400usize, 400..70_000usize],
            modelled in any::<bool>(),
            spill_bytes in 0..20_000usize,
            ranges in prop::collection::vec((backlink_strategy(), backlink_strategy()), 1..12),
        ) {
            check_table(&sorted_set(entries), frame_bytes, modelled, spill_bytes, &ranges);
        }

        #[test]
        fn revocation_tables_round_trip(
            entries in prop::collection::vec(revocation_strategy(), 0..300),
            frame_bytes in prop_oneof![1..200usize, 200..70_000usize],
            modelled in any::<bool>(),
            spill_bytes in 0..10_000usize,
            ranges in prop::collection::vec((revocation_strategy(), revocation_strategy()), 1..12),
        ) {
            check_table(&sorted_set(entries), frame_bytes, modelled, spill_bytes, &ranges);
        }
    }

    /// One target with 10,000 backlinks between two neighbours, laid out so that with 64 entries
    /// per frame the target starts inside frame 0 and the next neighbour starts frame 157.
    fn popular_target_table() -> (Vec<Backlink>, [RecordId; 3]) {
        let keys = [
            record(4_000, 3, OUTLINED_BIT | 1),
            record(5_000, 3, OUTLINED_BIT | 9),
            record(6_000, 3, OUTLINED_BIT | 2),
        ];
        let link = |target: RecordId, i: u64| Backlink {
            target,
            source: record(1_000_000 + i * 17, 1, OUTLINED_BIT | (i % 97)),
            location: 1,
            source_rev: i,
        };
        let counts = [48, 10_000, 30];
        let entries = keys.iter().zip(counts).flat_map(|(&key, count)| (0..count).map(move |i| link(key, i)));
        (sorted_set(entries.collect()), keys)
    }

    #[test]
    fn a_popular_target_spans_many_frames_and_all_are_found() {
        let (entries, [before, popular, after]) = popular_target_table();
        let (data, meta_bytes, _) = build(&entries, &options(64 * Backlink::WIDTH));
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.frames.len(), 158);
        // Entries 48..10_048 are the popular target: frames 0..=156, all but the first continuing it.
        let r = meta.frames_for_key(popular);
        assert_eq!(r, 0..157);
        assert!(meta.frames[1..157].iter().all(|frame| frame.continues && frame.first.target == popular));
        let found: Vec<Backlink> = read_frames(&meta, &data, r).into_iter().filter(|e| e.target == popular).collect();
        assert_eq!(found.len(), 10_000);

        // Paging by source inside the target (entries 5_048..=5_147): frames 78..=80 only.
        let page = &found[5_000..5_100];
        let (lo, hi) = (page[0], page[99]);
        assert_eq!(meta.frames_overlapping(&lo, &hi), 78..81);
        assert_eq!(entries_between(&meta, &data, &lo, &hi), page);
        let lo_source = Backlink { source: page[0].source, ..Backlink::min_for_key(popular) };
        let hi_source = Backlink { source: page[99].source, ..Backlink::max_for_key(popular) };
        assert_eq!(entries_between(&meta, &data, &lo_source, &hi_source), page);

        // `after` starts frame 157 without continuing, so frame 156 is skipped.
        assert!(!meta.frames[157].continues && meta.frames[157].first.target == after);
        assert_eq!(meta.frames_for_key(after), 157..158);
        assert_eq!(meta.frames_for_key(before), 0..1);
        assert_eq!(meta.frames_for_key(record(4_500, 3, 1)), 0..1); // absent, between keys
        assert_eq!(meta.frames_for_key(record(7_000, 3, 1)), 0..0); // past the last entry
        assert_eq!(meta.frames_for_key(record(1, 1, 1)), 0..0); // before the first entry
    }

    #[test]
    fn empty_tables_have_no_frames_and_reject_every_key() {
        let (data, meta_bytes, summary) = build::<Backlink>(&[], &TableOptions::default());
        assert!(data.is_empty());
        assert_eq!(
            summary,
            TableSummary { entries: 0, frames: 0, data_len: 0, meta_len: meta_bytes.len() as u64, stamps: (0, 0) }
        );
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.last, None);
        let key = record(1, 2, 3);
        assert!(!meta.may_contain(KeyHash::of_record(&key)));
        assert_eq!(meta.frames_for_key(key), 0..0);
        assert_eq!(meta.byte_range(0..0), (0, 0));
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "strictly increasing"))]
    fn pushing_out_of_order_is_refused() {
        let mut builder = TableBuilder::new(Vec::new(), &TableOptions::default(), 2).unwrap();
        let later = Revocation { source: record(2, 0, 0), rev: 0 };
        builder.push(&later).unwrap();
        let result = builder.push(&Revocation { source: record(1, 0, 0), rev: 0 });
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(builder.entries(), 1);
    }

    #[test]
    fn options_outside_their_limits_are_refused() {
        let refused = |opts: TableOptions| TableBuilder::<Revocation, _>::new(Vec::new(), &opts, 1).is_err();
        assert!(refused(options(0)));
        assert!(refused(options(MAX_FRAME_RAW_BYTES + 1)));
        assert!(refused(TableOptions { zstd_level: 0, ..TableOptions::default() }));
        assert!(refused(TableOptions { zstd_level: 20, ..TableOptions::default() }));
        assert!(refused(TableOptions { filter_fpr: f64::NAN, ..TableOptions::default() }));
        assert!(refused(TableOptions { filter_fpr: 0.9, ..TableOptions::default() }));
        assert!(!refused(options(1)));
        assert_eq!(options(1).entries_per_frame::<Backlink>(), 1);
        assert_eq!(options(MAX_FRAME_RAW_BYTES).entries_per_frame::<Backlink>(), MAX_FRAME_RAW_BYTES / 64);
    }

    fn small_backlink_table() -> (Vec<Backlink>, Vec<u8>, Vec<u8>) {
        let entries: Vec<Backlink> = (0..40u64)
            .map(|i| Backlink {
                target: record(100 + i / 8, 1, OUTLINED_BIT | 5),
                source: record(1_000 + i, 2, OUTLINED_BIT | (i % 3)),
                location: 1 + i % 2,
                source_rev: i,
            })
            .collect();
        let (data, meta, _) = build(&entries, &options(10 * Backlink::WIDTH));
        (entries, data, meta)
    }

    #[test]
    fn flipping_any_byte_of_the_data_file_is_detected() {
        let (_, data, meta_bytes) = small_backlink_table();
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.frames.len(), 4);
        for at in 0..data.len() {
            for mask in [0x01, 0x80, 0xFF] {
                let mut corrupt = data.clone();
                corrupt[at] ^= mask;
                let mut out = Vec::new();
                let result = decode_frames(&meta, 0..4, &corrupt, &mut out);
                assert!(result.is_err(), "flip {mask:#x} at {at} went unnoticed");
                assert!(out.is_empty(), "entries leaked from a corrupt range");
            }
        }
    }

    /// The byte-by-byte inverse `untranspose_xor_undelta` must equal.
    fn untranspose_reference(shuffled: &[u8], width: usize) -> Vec<u8> {
        let count = shuffled.len() / width;
        let mut raw = vec![0u8; shuffled.len()];
        for byte in 0..width {
            let mut value = 0u8;
            for i in 0..count {
                value ^= shuffled[byte * count + i];
                raw[i * width + byte] = value;
            }
        }
        raw
    }

    #[test]
    fn blocked_untranspose_equals_the_byte_by_byte_one_and_inverts_the_encoding() {
        let mut state = 7u64;
        for (width, count) in [(64, 0), (64, 1), (64, 7), (64, 8), (64, 1000), (32, 9), (32, 1024), (24, 17), (5, 33)] {
            let raw: Vec<u8> = (0..width * count).map(|_| crate::index::splitmix64(&mut state) as u8).collect();
            let mut shuffled = Vec::new();
            xor_delta_transpose(&raw, width, &mut shuffled);
            let mut restored = Vec::new();
            untranspose_xor_undelta(&shuffled, width, &mut restored);
            assert_eq!(restored, raw, "width {width}, {count} entries");
            assert_eq!(restored, untranspose_reference(&shuffled, width), "width {width}, {count} entries");
        }
    }

    #[test]
    fn an_8x8_transpose_moves_every_byte_across_the_diagonal() {
        let matrix: [u64; 8] =
            std::array::from_fn(|row| u64::from_le_bytes(std::array::from_fn(|c| (row * 8 + c) as u8)));
        let transposed = transpose_8x8(matrix);
        for (column, word) in transposed.iter().enumerate() {
            assert_eq!(word.to_le_bytes(), std::array::from_fn::<u8, 8, _>(|row| (row * 8 + column) as u8));
        }
        assert_eq!(transpose_8x8(transposed), matrix);
        assert_eq!(
            prefix_xor(u64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128])).to_le_bytes(),
            [1, 3, 7, 15, 31, 63, 127, 255]
        );
    }

    #[test]
    fn verifying_checksums_finds_every_flipped_bit_without_decoding() {
        let (_, data, meta_bytes) = small_backlink_table();
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert!(verify_data_checksums(&meta, &data).is_ok());
        for at in 0..data.len() {
            let mut corrupt = data.clone();
            corrupt[at] ^= 1 << (at % 8);
            assert!(verify_data_checksums(&meta, &corrupt).is_err(), "flip at {at} went unnoticed");
        }
        let short = &data[..data.len() - 1];
        assert!(matches!(verify_data_checksums(&meta, short), Err(FormatError::Length { what: "data file", .. })));
    }

    #[test]
    fn flipping_any_byte_of_the_meta_file_is_detected() {
        let (_, _, meta_bytes) = small_backlink_table();
        for at in 0..meta_bytes.len() {
            for mask in [0x01, 0x80, 0xFF] {
                let mut corrupt = meta_bytes.clone();
                corrupt[at] ^= mask;
                assert!(TableMeta::<Backlink>::decode(&corrupt).is_err(), "flip {mask:#x} at {at} went unnoticed");
            }
        }
        for len in 0..meta_bytes.len() {
            assert!(TableMeta::<Backlink>::decode(&meta_bytes[..len]).is_err());
        }
        assert!(TableMeta::<Revocation>::decode(&meta_bytes).is_err(), "entry width must be checked");
    }

    /// A golden table's files, `tests/data/<name>.data` and `.meta`.
    fn golden_files(name: &str) -> (Vec<u8>, Vec<u8>) {
        let path = |ext: &str| format!("{}/tests/data/{name}.{ext}", env!("CARGO_MANIFEST_DIR"));
        let read = |ext: &str| std::fs::read(path(ext)).unwrap_or_else(|e| panic!("{}: {e}", path(ext)));
        (read("data"), read("meta"))
    }

    /// Files written by format version 1 must keep decoding to the same entries.
    #[test]
    fn golden_table_files_still_decode() {
        let (entries, _, _) = small_backlink_table();
        let (data, meta_bytes) = golden_files("table_golden");
        assert_eq!(&data[..8], &[b'B', b'L', b'K', b'F', 1, 1, 64, 0]);
        assert_eq!(&meta_bytes[..16], &[b'B', b'L', b'K', b'M', 1, 0, 64, 0, 24, 0, 0, 0, 4, 0, 0, 0]);
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.frames.iter().map(|f| f.entries).collect::<Vec<_>>(), [10, 10, 10, 10]);
        assert_eq!(read_frames(&meta, &data, 0..4), entries);
        assert_eq!(entries_between(&meta, &data, &entries[12], &entries[25]), &entries[12..=25]);
    }

    /// A network-shaped TID: milliseconds, a microsecond rest and a clock id.
    fn golden_tid(ms: u64, micros: u64, clock: u64) -> u64 {
        ((ms * 1000 + micros) << 10) | clock
    }

    /// The `i`th backlink of a golden table's target, from one of `dids` accounts.
    fn golden_link(target: RecordId, i: u64, dids: u64) -> Backlink {
        let source =
            record(golden_tid(1_730_000_100_000 + i * 37, (i % 5) * 201, i % 32), 2, OUTLINED_BIT | (i % dids));
        Backlink { target, source, location: 1 + i % 2, source_rev: i }
    }

    /// Backlinks whose record keys take every path of `tid::spread`: network-shaped TIDs (whole
    /// milliseconds, small clock ids), odd microseconds, a time past `1000 << 43` µs, outlined
    /// keys and the repository form.
    fn spread_golden_entries() -> Vec<Backlink> {
        let late = (((1000u64 << 43) + 5) << 10) | 3;
        let targets = [
            record(golden_tid(1_730_000_000_000, 0, 7), 1, OUTLINED_BIT | 5),
            RecordId::repo(OUTLINED_BIT | 6),
            record(OUTLINED_BIT | 42, 4, OUTLINED_BIT | 7),
            record(late, 1, OUTLINED_BIT | 8),
        ];
        sorted_set((0..40u64).map(|i| golden_link(targets[(i % 4) as usize], i, 3)).collect())
    }

    /// Files written in payload encoding 2 must keep decoding to the same entries: the record
    /// key spread is part of the format, and a changed `spread` would still give sorted entries.
    #[test]
    fn golden_encoding_2_files_still_decode() {
        let (data, meta_bytes) = golden_files("table_golden_v2");
        assert_eq!(&data[..8], &[b'B', b'L', b'K', b'F', 1, 2, 64, 0]);
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.frames.len(), 4);
        assert_eq!(read_frames(&meta, &data, 0..4), spread_golden_entries());
    }

    /// Backlinks in runs of equal targets for the encoding-3 golden table: a repository target
    /// with 2, a post with 300 (a run length above 255), posts with 1, 4, 2 and 3; record keys
    /// shaped as in `spread_golden_entries`.
    fn key_runs_golden_entries() -> Vec<Backlink> {
        let post = |n: u64| record(golden_tid(1_730_000_000_000 + n * 1000, 0, n), 1, OUTLINED_BIT | (5 + n));
        let targets = [(RecordId::repo(OUTLINED_BIT | 6), 2), (post(0), 300), (post(1), 1), (post(2), 4), (post(3), 2)];
        let targets = targets.into_iter().chain([(post(4), 3)]);
        sorted_set(targets.flat_map(|(target, count)| (0..count).map(move |i| golden_link(target, i, 7))).collect())
    }

    /// Files written in payload encoding 3 must keep decoding to the same entries. The golden
    /// table's first frame holds four runs (one of 300 entries), its second three.
    #[test]
    fn golden_encoding_3_files_still_decode() {
        let (data, meta_bytes) = golden_files("table_golden_v3");
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.frames.iter().map(|f| f.entries).collect::<Vec<_>>(), [305, 7]);
        for frame in &meta.frames {
            assert_eq!(&data[frame.offset as usize..][..8], &[b'B', b'L', b'K', b'F', 1, 3, 64, 0]);
        }
        assert_eq!(read_frames(&meta, &data, 0..2), key_runs_golden_entries());
    }

    /// Files written in payload encoding 4 with a version-3 meta (column models) must keep
    /// decoding to the same entries: the encoding-3 golden table's entries, with models.
    #[test]
    fn golden_encoding_4_files_still_decode() {
        let data = std::fs::read(format!("{}/tests/data/table_golden_v4.data", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let meta_bytes =
            std::fs::read(format!("{}/tests/data/table_golden_meta_v3.meta", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(&meta_bytes[..6], b"BLKM\x03\x00");
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert!(meta.models.is_some());
        assert_eq!(meta.frames.iter().map(|f| f.entries).collect::<Vec<_>>(), [305, 7]);
        for frame in &meta.frames {
            assert_eq!(&data[frame.offset as usize..][..8], &[b'B', b'L', b'K', b'F', 1, 4, 64, 0]);
        }
        assert_eq!(read_frames(&meta, &data, 0..2), key_runs_golden_entries());
    }

    /// Meta files written in version 2 (a compressed frame index) must keep decoding to the same
    /// index: the encoding-3 golden table's meta, written again in version 2.
    #[test]
    fn golden_meta_version_2_still_decodes() {
        let (_, v1) = golden_files("table_golden_v3");
        let v2 = std::fs::read(format!("{}/tests/data/table_golden_meta_v2.meta", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(&v2[..6], b"BLKM\x02\x00");
        assert_eq!(TableMeta::<Backlink>::decode(&v2).unwrap(), TableMeta::<Backlink>::decode(&v1).unwrap());
    }

    /// A version-2 meta whose frame index (checksum fixed up) holds unknown flags, or decompresses
    /// to another size than the frame count implies, is rejected.
    #[test]
    fn hostile_version_2_frame_indexes_are_rejected() {
        let (_, v1) = golden_files("table_golden_v3");
        let meta = TableMeta::<Backlink>::decode(&v1).unwrap();
        let with_index = |index: Vec<u8>| {
            let mut bytes = Vec::new();
            meta.encode(&mut bytes);
            let index_len = u32::from_le_bytes(bytes[36..40].try_into().unwrap()) as usize;
            let index_at = bytes.len() - CHECKSUM_LEN - index_len;
            bytes.truncate(index_at);
            bytes[36..40].copy_from_slice(&(index.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&index);
            let checksum = xxh3_64(&bytes);
            bytes.extend_from_slice(&checksum.to_le_bytes());
            TableMeta::<Backlink>::decode(&bytes)
        };
        let columns = zstd::bulk::decompress(&encode_frame_index(&meta.frames), 1 << 20).unwrap();
        assert_eq!(with_index(zstd::bulk::compress(&columns, 3).unwrap()).unwrap(), meta);
        let flags_at = meta.frames.len() * Backlink::WIDTH;
        let mut bad_flags = columns.clone();
        bad_flags[flags_at] |= 2;
        let error = with_index(zstd::bulk::compress(&bad_flags, 3).unwrap()).unwrap_err().to_string();
        assert!(error.contains("unknown frame flags"), "{error}");
        let short = with_index(zstd::bulk::compress(&columns[1..], 3).unwrap()).unwrap_err();
        assert!(matches!(short, FormatError::Length { what: "frame index", .. }), "{short}");
        let mut long = columns.clone();
        long.push(0);
        let long = with_index(zstd::bulk::compress(&long, 3).unwrap()).unwrap_err().to_string();
        assert!(long.contains("over the limit"), "{long}");
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        encoder.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut encoder, &columns).unwrap();
        let error = with_index(encoder.finish().unwrap()).unwrap_err().to_string();
        assert!(error.contains("does not state its size"), "{error}");
        // A skippable frame (magic 0x184D2A50, 4 bytes of length, no content) after the index.
        let mut two_frames = zstd::bulk::compress(&columns, 3).unwrap();
        two_frames.extend_from_slice(&[0x50, 0x2A, 0x4D, 0x18, 0, 0, 0, 0]);
        for index in [two_frames, b"not zstd".to_vec()] {
            let error = with_index(index).unwrap_err().to_string();
            assert!(error.contains("not a zstd frame"), "{error}");
        }
    }

    /// Meta version 2's frame index columns, written out by hand (docs/format.md "Meta file"):
    /// two revocation frames whose record keys are outlined (spread leaves them as they are).
    #[test]
    fn version_2_frame_index_columns_are_byte_exact() {
        let first = Revocation { source: record(OUTLINED_BIT | 5, 1, OUTLINED_BIT | 1), rev: 0x0102 };
        let second = Revocation { source: record(OUTLINED_BIT | 5, 1, OUTLINED_BIT | 1), rev: 0x0304 };
        let frames = vec![
            FrameInfo { first, continues: false, offset: 0, len: 300, entries: 7 },
            FrameInfo { first: second, continues: true, offset: 300, len: 0x0001_0304, entries: 1 },
        ];
        let meta =
            TableMeta::new(FilterBuilder::new(1, 0.01).finish(), frames, Some(second), 8, 300 + 0x0001_0304, None);
        let mut bytes = Vec::new();
        meta.encode(&mut bytes);
        assert_eq!(&bytes[4..6], &[2, 0]);
        let index_len = u32::from_le_bytes(bytes[36..40].try_into().unwrap()) as usize;
        let index = &bytes[bytes.len() - CHECKSUM_LEN - index_len..bytes.len() - CHECKSUM_LEN];
        let columns = zstd::bulk::decompress(index, 1 << 10).unwrap();
        // First entries: byte j of the first, then byte j of (first XOR second), for j in 0..32.
        let (a, b) = (crate::lsm::entry::encode_to_vec(&first), crate::lsm::entry::encode_to_vec(&second));
        let mut expected: Vec<u8> = (0..32).flat_map(|j| [a[j], a[j] ^ b[j]]).collect();
        expected.extend_from_slice(&[0, 1]); // flags: the second continues
        expected.extend_from_slice(&[0x2c, 0x04, 0x01, 0x03, 0, 0x01, 0, 0]); // lengths 300, 0x00010304
        expected.extend_from_slice(&[7, 1, 0, 0, 0, 0, 0, 0]); // entry counts 7, 1
        assert_eq!(columns, expected);
        assert_eq!(TableMeta::<Revocation>::decode(&bytes).unwrap(), meta);
    }

    /// A version-2 header may not claim more frames than its index could expand to: a small
    /// file never makes a reader allocate for 2^24 frames.
    #[test]
    fn a_frame_count_its_index_cannot_hold_is_rejected_before_decompressing() {
        let mut v2 =
            std::fs::read(format!("{}/tests/data/table_golden_meta_v2.meta", env!("CARGO_MANIFEST_DIR"))).unwrap();
        v2[12..16].copy_from_slice(&(1u32 << 24).to_le_bytes());
        let body = v2.len() - CHECKSUM_LEN;
        let checksum = xxh3_64(&v2[..body]);
        v2[body..].copy_from_slice(&checksum.to_le_bytes());
        let error = TableMeta::<Backlink>::decode(&v2).unwrap_err().to_string();
        assert!(error.contains("cannot hold 16777216 frames"), "{error}");
    }

    /// An index that compresses more than a reader accepts of version 2 (thousands of frames of
    /// one entry with consecutive keys) is written as version 1, and reads back the same.
    #[test]
    fn a_too_compressible_frame_index_is_written_as_version_1() {
        let entries: Vec<Revocation> = (0..4000).map(|i| Revocation { source: record(i, 0, 0), rev: 0 }).collect();
        let (data, meta_bytes, _) = build(&entries, &options(Revocation::WIDTH));
        assert_eq!(&meta_bytes[4..6], &[1, 0], "written as version 1");
        let meta = TableMeta::<Revocation>::decode(&meta_bytes).unwrap();
        assert_eq!(meta.frames.len(), 4000);
        assert_eq!(read_frames(&meta, &data, 0..4000), entries);
        let (_, realistic, _) = build(&realistic_backlinks(20_000, 500, 50_000, 7), &TableOptions::default());
        assert_eq!(&realistic[4..6], &[2, 0], "realistic indexes are written as version 2");

        // With column models: version 3, an index length of 0 and the fixed records.
        let modelled = TableOptions { model_min_entries: 0, ..options(Revocation::WIDTH) };
        let (data, meta_bytes, _) = build(&entries, &modelled);
        assert_eq!(&meta_bytes[4..6], &[3, 0], "written as version 3");
        assert_eq!(&meta_bytes[36..40], &[0; 4], "with the index as fixed records");
        let meta = TableMeta::<Revocation>::decode(&meta_bytes).unwrap();
        assert!(meta.models.is_some());
        assert_eq!(read_frames(&meta, &data, 0..4000), entries);
    }

    /// Run with `--ignored` only when the format changes on purpose (and bump the versions):
    /// writes the current encoding's files (payload encoding 4's data, meta version 3: give new
    /// names to the next ones). It never overwrites a file: older golden files stay as written.
    #[test]
    #[ignore]
    fn write_golden_table_files() {
        let options = TableOptions { model_min_entries: 0, ..options(305 * Backlink::WIDTH) };
        let (data, meta, _) = build(&key_runs_golden_entries(), &options);
        let write_new = |name: &str, bytes: &[u8]| {
            let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path);
            let mut file = file.unwrap_or_else(|e| panic!("{path}: {e} (golden files are never rewritten)"));
            file.write_all(bytes).unwrap();
        };
        write_new("table_golden_v4.data", &data);
        write_new("table_golden_meta_v3.meta", &meta);
    }

    fn revocation(key: u64, rev: u64) -> Revocation {
        Revocation { source: record(key, 1, OUTLINED_BIT | key), rev }
    }

    fn raw_of<E: Entry>(entries: &[E]) -> Vec<u8> {
        let mut raw = Vec::new();
        entries.iter().for_each(|e| encode_entry(e, &mut raw));
        raw
    }

    /// Encoding 3 stores a run's key once plus a 2-byte length: it is written exactly when
    /// `runs * (key width + 2) <= entries * key width`, here 12 runs of 13 entries but not 13.
    #[test]
    fn frames_are_written_in_key_runs_exactly_when_that_is_shorter() {
        let distinct: Vec<Revocation> = (0..13).map(|key| revocation(key, 7)).collect();
        let mut one_repeat = distinct[..12].to_vec();
        one_repeat.insert(5, revocation(4, 9));
        let mut encoder = FrameEncoder::new(3).unwrap();
        for (entries, encoding) in [(&distinct, 2), (&one_repeat, 3)] {
            let frame = encoder.encode::<Revocation>(&raw_of(entries), None).unwrap().to_vec();
            assert_eq!(frame[5], encoding, "{} entries", entries.len());
            let mut out = Vec::new();
            decode_frame::<Revocation>(&frame, None, &mut out).unwrap();
            assert_eq!(&out, entries);
        }
    }

    /// A frame put together by hand: `payload` is the raw payload before zstd.
    fn handmade_frame<E: Entry>(encoding: u8, entries: usize, payload: &[u8]) -> Vec<u8> {
        let compressed = zstd::bulk::compress(payload, 3).unwrap();
        let mut frame = Vec::new();
        let (raw_len, payload_len) = (payload.len(), compressed.len());
        // `runs` is derived from the raw length when parsing; writing ignores it.
        FrameHeader { encoding, entry_width: E::WIDTH, entries, runs: 0, raw_len, payload_len }.encode(&mut frame);
        frame.extend_from_slice(&compressed);
        let checksum = xxh3_64(&frame);
        frame.extend_from_slice(&checksum.to_le_bytes());
        frame
    }

    /// The encoding-3 payload of `entries` with its run lengths replaced by `runs`.
    fn key_runs_payload(entries: &[Revocation], runs: Option<&[u16]>) -> Vec<u8> {
        let (mut keys, mut lengths, mut rests, mut payload) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        split_key_runs(&raw_of(entries), Revocation::WIDTH, Revocation::KEY_WIDTH, &mut keys, &mut lengths, &mut rests);
        let lengths = runs.map_or(lengths, <[u16]>::to_vec);
        key_runs_transpose(&keys, &lengths, &rests, (Revocation::KEY_WIDTH, 8), &mut payload);
        payload
    }

    #[test]
    fn key_runs_that_disagree_with_the_entry_count_are_rejected() {
        let entries = [revocation(1, 0), revocation(1, 5), revocation(2, 0)];
        let frame = |runs: Option<&[u16]>| handmade_frame::<Revocation>(3, 3, &key_runs_payload(&entries, runs));
        let mut out = Vec::new();
        decode_frame::<Revocation>(&frame(None), None, &mut out).unwrap();
        assert_eq!(out, entries, "the handmade frame is right before it is spoiled");
        for (runs, error) in [
            ([0, 3], "a key run of length 0"),
            ([3, 1], "key runs hold more entries than the frame"),
            ([1, 1], "key runs hold fewer entries than the frame"),
        ] {
            let found = decode_frame::<Revocation>(&frame(Some(&runs)), None, &mut out).unwrap_err();
            assert!(found.to_string().contains(error), "{runs:?}: {found}");
        }
        // Raw lengths no encoding-3 payload of three entries has: a stray byte, and three runs
        // of one (longer than encoding 2's payload, so never written).
        let mut stray = key_runs_payload(&entries, None);
        stray.push(0);
        let all_runs = key_runs_payload(&[revocation(1, 0), revocation(2, 0), revocation(3, 0)], None);
        for payload in [stray, all_runs] {
            let found = decode_frame::<Revocation>(&handmade_frame::<Revocation>(3, 3, &payload), None, &mut out);
            assert!(found.unwrap_err().to_string().contains("no encoding-3 payload"));
        }
        assert_eq!(out.len(), 3, "failed decodes must not append");
    }

    /// Re-encodes a meta with a fresh checksum, so that only the cross-field checks can object.
    fn reencoded(meta: &TableMeta<Backlink>) -> Result<TableMeta<Backlink>, FormatError> {
        let mut bytes = Vec::new();
        meta.encode(&mut bytes);
        TableMeta::decode(&bytes)
    }

    #[test]
    fn inconsistent_meta_with_a_valid_checksum_is_rejected() {
        let (_, data, meta_bytes) = small_backlink_table();
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(reencoded(&meta).unwrap(), meta);
        let altered = |change: &dyn Fn(&mut TableMeta<Backlink>)| {
            let mut copy = meta.clone();
            change(&mut copy);
            copy
        };
        // Version 2 stores no offsets (each frame starts where the previous one ends), so a wrong
        // offset in memory is written right; version 1 stored them, and a wrong one is rejected.
        assert_eq!(reencoded(&altered(&|m| m.frames[1].offset += 1)).unwrap(), meta);
        let (_, mut v1) = golden_files("table_golden");
        let filter_len = u32::from_le_bytes(v1[32..36].try_into().unwrap()) as usize;
        let frame_1_offset = META_HEADER_LEN + filter_len + 64 + (64 + FRAME_INFO_FIXED_LEN) + 64 + 1;
        v1[frame_1_offset] ^= 1;
        let body = v1.len() - CHECKSUM_LEN;
        let checksum = xxh3_64(&v1[..body]);
        v1[body..].copy_from_slice(&checksum.to_le_bytes());
        let error = TableMeta::<Backlink>::decode(&v1).unwrap_err().to_string();
        assert!(error.contains("instead of"), "{error}");
        assert!(reencoded(&altered(&|m| m.frames[0].continues = true)).is_err());
        assert!(reencoded(&altered(&|m| m.frames.swap(1, 2))).is_err());
        assert!(reencoded(&altered(&|m| m.data_len += 1)).is_err());
        assert!(reencoded(&altered(&|m| m.entries += 1)).is_err());
        assert!(reencoded(&altered(&|m| m.frames[3].entries = 0)).is_err());
        assert!(reencoded(&altered(&|m| m.last = Some(m.frames[3].first))).is_err());

        // A meta that passes its own checks but disagrees with the data is caught on decode.
        let lying = altered(&|m| m.frames[2].continues = !m.frames[2].continues);
        let lying = reencoded(&lying).unwrap();
        let mut out = Vec::new();
        assert!(decode_frames(&lying, 0..4, &data, &mut out).is_err());
        let (start, end) = lying.byte_range(1..2);
        assert!(decode_frames(&lying, 1..2, &data[start as usize..end as usize], &mut out).is_err());
        assert!(out.is_empty());
        assert!(decode_frames(&meta, 0..4, &data[1..], &mut out).is_err());
        assert!(decode_frames(&meta, 3..5, &data, &mut out).is_err());
    }

    #[test]
    fn frames_with_a_valid_checksum_but_bad_contents_are_rejected() {
        let entry = |i: u64| Revocation { source: record(i, 0, 0), rev: 0 };
        let mut encoder = FrameEncoder::new(3).unwrap();
        let mut out = Vec::new();
        let good = encoder.encode::<Revocation>(&raw_of(&[entry(1), entry(2)]), None).unwrap().to_vec();
        decode_frame::<Revocation>(&good, None, &mut out).unwrap();
        assert_eq!(out, [entry(1), entry(2)]);
        for entries in [[entry(2), entry(2)], [entry(3), entry(2)]] {
            let frame = encoder.encode::<Revocation>(&raw_of(&entries), None).unwrap().to_vec();
            let error = decode_frame::<Revocation>(&frame, None, &mut out).unwrap_err();
            assert!(error.to_string().contains("not strictly increasing"), "{error}");
        }
        assert_eq!(out.len(), 2, "failed decodes must not append");
        let mut wrong_width: Vec<Backlink> = Vec::new();
        assert!(matches!(decode_frame(&good, None, &mut wrong_width), Err(FormatError::OutOfRange { .. })));
    }

    /// SplitMix64, for realistic data that never changes between runs.
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            crate::index::splitmix64(&mut self.0)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A TID: microseconds since the epoch above a 10-bit clock id.
    fn tid(micros: u64, clock: u64) -> u64 {
        (micros << 10) | (clock & 0x3FF)
    }

    /// Firehose-like backlinks: `targets` posts and accounts with Zipf-ish popularity, liked,
    /// reposted and replied to by `users` accounts over about an hour, one stamp per link.
    fn realistic_backlinks(count: usize, targets: usize, users: u64, seed: u64) -> Vec<Backlink> {
        let mut rng = SplitMix(seed);
        let start = 1_730_000_000_000_000u64;
        let user = |rng: &mut SplitMix| OUTLINED_BIT | (1 + rng.below(users));
        let target_ids: Vec<RecordId> = (0..targets)
            .map(|i| match i % 5 {
                0 => RecordId::repo(user(&mut rng)),
                _ => record(tid(start - rng.below(86_400_000_000), rng.below(1024)), 3, user(&mut rng)),
            })
            .collect();
        let weights: Vec<f64> = (1..=targets).map(|rank| 1.0 / (rank as f64).powf(1.1)).collect();
        let cumulative: Vec<f64> = weights
            .iter()
            .scan(0.0, |sum, w| {
                *sum += w;
                Some(*sum)
            })
            .collect();
        let total = *cumulative.last().unwrap();
        let links = (0..count as u64).map(|i| {
            let pick = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let target = target_ids[cumulative.partition_point(|&c| c < pick).min(targets - 1)];
            let micros = start + i * 36_000 + rng.below(36_000);
            let (collection, location) = match (target.is_repo(), rng.below(10)) {
                (true, _) => (4, 3),      // follow: $.subject
                (false, 0..=5) => (1, 1), // like: $.subject
                (false, 6..=7) => (2, 1), // repost: $.subject
                (false, _) => (3, 2),     // reply: $.reply.parent
            };
            let source = record(tid(micros, rng.below(1024)), collection, user(&mut rng));
            Backlink { target, source, location, source_rev: 5_000_000 + i }
        });
        sorted_set(links.collect())
    }

    #[test]
    fn realistic_backlinks_compress_below_20_bytes_each() {
        let entries = realistic_backlinks(100_000, 3_000, 200_000, 42);
        assert!(entries.len() > 99_900);
        let (data, meta_bytes, summary) = build(&entries, &TableOptions::default());
        let per_entry = data.len() as f64 / entries.len() as f64;
        let meta_per_entry = meta_bytes.len() as f64 / entries.len() as f64;
        println!(
            "{} backlinks in {} frames: {per_entry:.2} data bytes/entry, {meta_per_entry:.2} meta bytes/entry",
            summary.entries, summary.frames
        );
        assert!(per_entry < 20.0, "{per_entry:.2} bytes per entry");
        assert_eq!(&data[..6], b"BLKF\x01\x04", "a table this large is written in payload encoding 4");
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert_eq!(read_frames(&meta, &data, 0..meta.frames.len()), entries);

        let without_models = TableOptions { model_min_entries: u64::MAX, ..TableOptions::default() };
        let (zstd_data, zstd_meta, _) = build(&entries, &without_models);
        assert_eq!(&zstd_data[..6], b"BLKF\x01\x03", "frames that repeat targets are written in payload encoding 3");
        let zstd_meta = TableMeta::<Backlink>::decode(&zstd_meta).unwrap();
        assert_eq!(read_frames(&zstd_meta, &zstd_data, 0..zstd_meta.frames.len()), entries);
        let modelled = (data.len() + meta_bytes.len()) as f64 / entries.len() as f64;
        let zstd_only = (zstd_data.len() + zstd_meta_len(&zstd_meta)) as f64 / entries.len() as f64;
        println!("with models {modelled:.2} bytes/entry (data and meta), zstd only {zstd_only:.2}");
        assert!(modelled < zstd_only, "column models cost more than they save: {modelled:.2} vs {zstd_only:.2}");
    }

    /// A spill in memory that remembers the most bytes it ever held.
    struct MeasuredSpill {
        bytes: io::Cursor<Vec<u8>>,
        most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Write for MeasuredSpill {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let written = self.bytes.write(buf)?;
            self.most.fetch_max(self.bytes.get_ref().len(), std::sync::atomic::Ordering::Relaxed);
            Ok(written)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Read for MeasuredSpill {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.bytes.read(buf)
        }
    }

    impl Seek for MeasuredSpill {
        fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
            self.bytes.seek(to)
        }
    }

    /// A table larger than the spill learns its models from the spilled frames, encodes the rest
    /// as they fill, and never spills more than `spill_bytes` and one frame.
    #[test]
    fn a_table_larger_than_its_spill_streams_after_learning_from_its_first_frames() {
        let entries = realistic_backlinks(20_000, 500, 20_000, 5);
        let options =
            TableOptions { model_min_entries: 0, spill_bytes: 10 * DEFAULT_FRAME_BYTES, ..TableOptions::default() };
        let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let spill = MeasuredSpill { bytes: io::Cursor::new(Vec::new()), most: most.clone() };
        let mut builder = TableBuilder::with_spill(Vec::new(), Box::new(spill), &options, 0).unwrap();
        entries.iter().for_each(|entry| builder.push(entry).unwrap());
        let (data, meta_bytes, _) = builder.finish().unwrap();
        let most = most.load(std::sync::atomic::Ordering::Relaxed);
        assert!((10 * DEFAULT_FRAME_BYTES..=11 * DEFAULT_FRAME_BYTES).contains(&most), "spilled {most} bytes");
        let meta = TableMeta::<Backlink>::decode(&meta_bytes).unwrap();
        assert!(meta.models.is_some() && meta.frames.len() > 70);
        for frame in &meta.frames {
            assert_eq!(data[frame.offset as usize + 5], ENCODING_SPREAD_KEY_RUNS_MODELLED);
        }
        assert_eq!(read_frames(&meta, &data, 0..meta.frames.len()), entries);
    }

    /// Models learnt up front from entries in memory (a flush) are the ones a builder learns from
    /// its spill (a merge), so both write the same table; too few entries learn none.
    #[test]
    fn models_learnt_up_front_write_the_same_table_as_models_learnt_from_the_spill() {
        let entries = realistic_backlinks(30_000, 800, 30_000, 11);
        let options = TableOptions { model_min_entries: 1000, ..TableOptions::default() };
        let spilled = build(&entries, &options);
        let models = learn_models(entries.iter().copied(), &options);
        assert!(models.is_some());
        let mut builder = TableBuilder::with_models(Vec::new(), models, &options, 0).unwrap();
        entries.iter().for_each(|entry| builder.push(entry).unwrap());
        assert_eq!(builder.finish().unwrap(), spilled);
        assert!(learn_models(entries[..999].iter().copied(), &options).is_none());
        assert!(
            learn_models(std::iter::empty::<Backlink>(), &TableOptions { model_min_entries: 0, ..options }).is_none()
        );
    }

    fn zstd_meta_len(meta: &TableMeta<Backlink>) -> usize {
        let mut bytes = Vec::new();
        meta.encode(&mut bytes);
        bytes.len()
    }
}
