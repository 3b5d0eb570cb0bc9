//! The table format: `<id>.data` holds frames of sorted entries (zstd, or rANS under the table's
//! column models), `<id>.meta` holds the key filter, the frame index and the column models.
//! Generic over any fixed-width `Entry`. docs/format.md has the byte-by-byte layout.
//!
//! - `builder`: `TableBuilder`, which streams sorted entries into frames and the meta;
//! - `frame`: one frame: its header, its four payload encodings, encoding and decoding;
//! - `columns`: the byte-column layouts the payload encodings and the frame index share;
//! - `meta`: `TableMeta`, the decoded meta file, its lookups and its codec (versions 1 to 3, and
//!   whole reads of version 4);
//! - `paged`: version 4, the paged meta, and `PagedMeta`, which reads it a page at a time;
//! - `partial`: `PartialFile`, a local copy of a paged meta fetched piece by piece.
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
//! - Decoding returns a `FormatError` for any inconsistency and never panics; on error the output
//!   vector is left as it was, so a caller never sees entries from a bad frame.
//! - A table has column models (meta version 3) exactly when the entries they were learnt from
//!   (its own, or its merge's: `ModelSampler`) numbered at least `max(1, model_min_entries)`;
//!   only such a table has encoding-4 frames.

mod builder;
mod columns;
mod frame;
mod meta;
mod paged;
mod partial;
#[cfg(test)]
mod tests;

pub use super::bytes::FormatError;
pub use builder::{ModelSampler, Spill, Spills, TableBuilder, learn_models, write_table};
pub use frame::verify_span;
pub use frame::{
    FrameSpan, check_data_len, decode_frame, decode_frames, decode_span, verify_data_file, verify_data_frames,
};
pub use meta::TableMeta;
pub use paged::{
    CHUNK_FRAMES, CheckedMeta, HEADER_LEN as PAGED_HEADER_LEN, META_PAGED_VERSION, MetaCache, MetaPage, MetaPiece,
    PAGE_BLOCKS, PageSource, PageUse, PagedMeta, check_in_order, declared_lengths, is_paged, resident_len,
};
pub use partial::PartialFile;

use super::bytes::CHECKSUM_LEN;
use super::coder::Layout;
use super::entry::Entry;
use super::filter::{MAX_FPR, MIN_FPR};
use frame::FRAME_HEADER_LEN;
use std::io;

/// Default raw (uncompressed) bytes per frame: 256 backlinks. A warm query decodes whole frames
/// to use a few entries, so smaller frames cost it less and more of them fit the frame cache, for
/// a few percent more bucket bytes (BENCHMARKS.md, "Frame size").
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
/// Raw bytes a merge spills before it decides its models: 16 M backlinks, 32 M revocations
/// (local disk, not memory). A merge's models serve all its shards, so they are learnt from as
/// much of its key range as this covers: at 256 MiB, the 10 M-link
/// benchmark's links tree came out 2.5 % larger than with models learnt per shard.
pub const DEFAULT_SPILL_BYTES: usize = 1 << 30;
pub const MIN_ZSTD_LEVEL: i32 = 1;
pub const MAX_ZSTD_LEVEL: i32 = 19;

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
    /// Raw bytes of the first entries a merge keeps aside while it learns the column models
    /// (local disk); the models of a larger merge are learnt from its first `spill_bytes`.
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

    pub(super) fn entries_per_frame<E: Entry>(&self) -> usize {
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

/// The byte columns of payload encodings 3 and 4 for `E`.
pub(super) fn layout_of<E: Entry>() -> Layout {
    Layout { key_width: E::KEY_WIDTH, rest_width: E::WIDTH - E::KEY_WIDTH }
}
