//! `TableMeta`: the decoded meta file (the key filter, the frame index, the column models) and
//! the lookups a reader makes through it; its codec in three versions. docs/format.md "Meta file".
//!
//! Invariants:
//! - `sampled_firsts[j] == frames[j * SAMPLE_STRIDE].first` for every j (derived at decode and
//!   build, never stored): searches narrow through them first.
//! - A decoded meta passed its checksum and every cross-field check (offsets, counts, order,
//!   the last entry); a version-2 or 3 frame index is decompressed only after its header proved
//!   the frame count fits what the compressed bytes can expand to.

use super::columns::{map_rkeys, untranspose_xor_undelta, xor_delta_transpose};
use super::{DEFAULT_ZSTD_LEVEL, FRAME_OVERHEAD, FrameInfo, MAX_FRAME_BYTES, MAX_FRAMES, layout_of, max_frame_entries};
use crate::lsm::bytes::{CHECKSUM_LEN, FormatError, Reader, check_range, invalid, verify_checksum};
use crate::lsm::bytes::{transpose_into, untransposed};
use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::filter::{Filter, KeyHash, MAX_ENCODED_LEN as MAX_FILTER_LEN};
use crate::model::ids::RecordId;
use crate::model::tid;
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64;

pub(super) const META_MAGIC: [u8; 4] = *b"BLKM";

/// Meta version 1: the frame index as fixed records. Read, no longer written.
const META_ROWS_VERSION: u16 = 1;

/// Meta version 2: the frame index as compressed columns (`encode_frame_index`). Written for
/// tables without column models.
const META_COLUMNS_VERSION: u16 = 2;

/// Meta version 3: version 2 plus the table's column models. Written for tables with models.
const META_MODELS_VERSION: u16 = 3;

pub(super) const META_HEADER_LEN: usize = 36;

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
pub(super) const FRAME_INFO_FIXED_LEN: usize = 17;

const CONTINUES_FLAG: u8 = 1;

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

impl<E: Entry> TableMeta<E> {
    pub(super) fn new(
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
    pub(super) fn frames_starting_at_or_before(&self, bound: &E) -> usize {
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
    /// for the fuzz targets' round trip and the older formats' tests; tables are written as
    /// version 4 (`encode`).
    pub fn encode_resident(&self, out: &mut Vec<u8>) {
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

    /// Appends the meta file encoding as tables are written: version 4, the paged meta
    /// (`paged`), which a reader never holds whole.
    pub fn encode(&self, out: &mut Vec<u8>) {
        super::paged::encode(self, out);
    }

    /// Parses a meta file of any version, whole: header, exact length, checksums, then body and
    /// cross-field checks (for version 4, every page and chunk too).
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if super::paged::is_paged(bytes) {
            return super::paged::decode_whole(bytes);
        }
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
        meta.check()?;
        Ok(meta)
    }

    /// Checks a whole meta of any version as `decode` does and gives its data file's length; a
    /// version-4 meta is checked a page at a time (`paged::check_in_order`), never decoded whole.
    pub fn check_encoded(bytes: &[u8]) -> Result<u64, FormatError> {
        if !super::paged::is_paged(bytes) {
            return Self::decode(bytes).map(|meta| meta.data_len);
        }
        let checked =
            super::paged::check_in_order::<E, FormatError>(&mut &bytes[..], bytes.len() as u64, |_| {}, |_| Ok(()))?;
        Ok(checked.data_len)
    }

    /// Cross-field checks of a decoded index (the checksum only proves it was written whole).
    pub(super) fn check(&self) -> Result<(), FormatError> {
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
        check_last_entry(self.last, self.frames.last())
    }
}

/// The table's last entry must fit its last frame: its first entry when the frame holds one,
/// else after it.
pub(super) fn check_last_entry<E: Entry>(
    last: Option<E>,
    last_frame: Option<&FrameInfo<E>>,
) -> Result<(), FormatError> {
    let (Some(last), Some(last_frame)) = (last, last_frame) else { return Ok(()) };
    let fits = if last_frame.entries == 1 { last == last_frame.first } else { last > last_frame.first };
    if !fits {
        return Err(invalid(META_WHAT, format!("last entry {last:?} does not fit the last frame")));
    }
    Ok(())
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
pub(super) fn encode_frame_index<E: Entry>(frames: &[FrameInfo<E>]) -> Vec<u8> {
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
pub(super) fn decode_frame_index<E: Entry>(compressed: &[u8], count: usize) -> Result<Vec<FrameInfo<E>>, FormatError> {
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
pub(super) fn decode_models<E: Entry>(compressed: &[u8]) -> Result<ColumnModels, FormatError> {
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

pub(super) fn encode_entry<E: Entry>(entry: &E, out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + E::WIDTH, 0);
    entry.encode(&mut out[at..]);
}

pub(super) fn decode_entry<E: Entry>(bytes: &[u8]) -> E {
    assert_eq!(bytes.len(), E::WIDTH);
    E::decode(bytes)
}
