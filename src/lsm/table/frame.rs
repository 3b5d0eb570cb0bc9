//! One frame: a fixed header, a payload in one of four encodings, and an xxh3-64 over both.
//! docs/format.md "Data file" has the layout of each encoding.
//!
//! Invariants:
//! - A frame is parsed only whole (its exact bytes), its header bounds-checked and its checksum
//!   verified before the payload is decoded; decoded entries must be strictly increasing and agree
//!   with the frame's record in the meta.
//! - Encodings 1 to 3 are read; 2, 3 and 4 are written (4 only in tables with column models).

use super::columns::{key_runs_transpose, map_rkeys, split_key_runs, untranspose_xor_undelta, xor_delta_transpose};
use super::meta::TableMeta;
use super::{
    FRAME_OVERHEAD, FrameInfo, MAX_FRAME_BYTES, MAX_FRAME_PAYLOAD_BYTES, MAX_FRAME_RAW_BYTES, max_frame_entries,
};
use crate::lsm::bytes::{FormatError, Reader, check_range, invalid, untransposed, verify_checksum};
use crate::lsm::coder::{self, ColumnModels, ModelCounts};
use crate::lsm::entry::Entry;
use crate::model::tid;
use std::cell::Cell;
use std::io;
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64;

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
pub(super) const ENCODING_SPREAD_KEY_RUNS_MODELLED: u8 = 4;

const ENCODINGS: [u8; 4] = [
    ENCODING_XOR_TRANSPOSE_ZSTD,
    ENCODING_SPREAD_XOR_TRANSPOSE_ZSTD,
    ENCODING_SPREAD_KEY_RUNS_ZSTD,
    ENCODING_SPREAD_KEY_RUNS_MODELLED,
];

/// Bytes of a run length in payload encoding 3 (a big-endian u16: a frame holds at most
/// `max_frame_entries` <= 32,768 entries).
const RUN_LEN_BYTES: usize = 2;

pub(super) const FRAME_HEADER_LEN: usize = 20;

/// Fixed fields at the start of every frame.
pub(super) struct FrameHeader {
    pub(super) encoding: u8,
    pub(super) entry_width: usize,
    pub(super) entries: usize,
    /// Key runs of encodings 3 and 4 (the entry count otherwise); derived from `raw_len`.
    pub(super) runs: usize,
    /// The payload's length after decoding (`check_raw_len`).
    pub(super) raw_len: usize,
    pub(super) payload_len: usize,
}

impl FrameHeader {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
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

/// Reusable compressor and buffers for writing frames, at one zstd level. A thread keeps one
/// (`with_encoder`) for every table it writes.
pub(super) struct FrameEncoder {
    compressor: zstd::bulk::Compressor<'static>,
    zstd_level: i32,
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
    pub(super) fn new(zstd_level: i32) -> io::Result<Self> {
        Ok(FrameEncoder {
            compressor: zstd::bulk::Compressor::new(zstd_level)?,
            zstd_level,
            spread: Vec::new(),
            keys: Vec::new(),
            runs: Vec::new(),
            rests: Vec::new(),
            shuffled: Vec::new(),
            steps: Vec::new(),
            payload: Vec::new(),
            frame: Vec::new(),
        })
    }

    /// Encodes sorted raw entries of `E` as one frame and returns its bytes: with `models`,
    /// payload encoding 4 when its payload is no longer than the raw entries; otherwise encoding
    /// 3 when its raw payload is no longer than encoding 2's (the frame repeats keys), else 2.
    pub(super) fn encode<E: Entry>(&mut self, raw: &[u8], models: Option<&ColumnModels>) -> io::Result<&[u8]> {
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
    pub(super) fn count<E: Entry>(&mut self, raw: &[u8], counts: &mut ModelCounts) {
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

thread_local! {
    /// Each thread's frame encoder: a merge writes one table per output shard at once, and a
    /// zstd context (277 KiB at level 3) and scratch buffers each were most of what a shard's
    /// builder held.
    static ENCODER: Cell<Option<FrameEncoder>> = const { Cell::new(None) };
}

/// Runs `work` with this thread's frame encoder, at `zstd_level` (a new one if it is in use, at
/// another level or was never made); `None` takes any level (`count` never compresses).
pub(super) fn with_encoder<T>(
    zstd_level: Option<i32>,
    work: impl FnOnce(&mut FrameEncoder) -> io::Result<T>,
) -> io::Result<T> {
    let mut encoder = match ENCODER.take() {
        Some(encoder) if zstd_level.is_none_or(|level| level == encoder.zstd_level) => encoder,
        _ => FrameEncoder::new(zstd_level.unwrap_or(zstd::DEFAULT_COMPRESSION_LEVEL))?,
    };
    let result = work(&mut encoder);
    ENCODER.set(Some(encoder));
    result
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
            let models = models.ok_or_else(|| invalid("frame", "an encoding-4 frame in a table without models"))?;
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
                return Err(invalid("frame", "a key run of length 0"));
            }
            for _ in 0..run {
                let rest =
                    rest_rows.next().ok_or_else(|| invalid("frame", "key runs hold more entries than the frame"))?;
                self.raw.extend_from_slice(key);
                self.raw.extend_from_slice(rest);
            }
        }
        if rest_rows.next().is_some() {
            return Err(invalid("frame", "key runs hold fewer entries than the frame"));
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

/// What decoding consecutive frames needs from a meta: their index records, the record of the
/// frame after them (`None` when they end the table), the table's last entry and the column
/// models. A resident meta lends its slices; a paged one reads the chunks that hold them.
#[derive(Clone, Copy, Debug)]
pub struct FrameSpan<'a, E> {
    /// The index of the first frame (for messages).
    pub first_index: usize,
    pub infos: &'a [FrameInfo<E>],
    pub next: Option<&'a FrameInfo<E>>,
    pub last: Option<E>,
    pub models: Option<&'a ColumnModels>,
}

/// Decodes `meta.frames[r]` from `bytes`, the contiguous range `meta.byte_range(r)` of the data
/// file, and checks every frame against its index record. On error `out` is unchanged.
pub fn decode_frames<E: Entry>(
    meta: &TableMeta<E>,
    r: Range<usize>,
    bytes: &[u8],
    out: &mut Vec<E>,
) -> Result<(), FormatError> {
    if r.start > r.end || r.end > meta.frames.len() {
        return Err(invalid("frame range", format!("frames {r:?} of a table with {}", meta.frames.len())));
    }
    let span = FrameSpan {
        first_index: r.start,
        infos: &meta.frames[r.clone()],
        next: meta.frames.get(r.end),
        last: meta.last,
        models: meta.models.as_ref(),
    };
    decode_span(&span, bytes, out)
}

/// Decodes the frames of `span` from `bytes` (the contiguous range of the data file they
/// cover), checking every frame against its index record. On error `out` is unchanged.
pub fn decode_span<E: Entry>(span: &FrameSpan<'_, E>, bytes: &[u8], out: &mut Vec<E>) -> Result<(), FormatError> {
    let original = out.len();
    let result = decode_span_checked(span, bytes, out);
    if result.is_err() {
        out.truncate(original);
    }
    result
}

fn decode_span_checked<E: Entry>(span: &FrameSpan<'_, E>, bytes: &[u8], out: &mut Vec<E>) -> Result<(), FormatError> {
    const WHAT: &str = "frame range";
    let start = span.infos.first().map_or(0, |info| info.offset);
    let expected: u64 = span.infos.iter().map(|info| u64::from(info.len)).sum();
    if bytes.len() as u64 != expected {
        return Err(FormatError::Length { what: WHAT, expected, found: bytes.len() as u64 });
    }
    with_decoder(|decoder| {
        for (at, info) in span.infos.iter().enumerate() {
            let before = out.len();
            decoder.decode(frame_bytes(bytes, start, info)?, span.models, out)?;
            check_frame_against_index(span, at, &out[before..])?;
        }
        Ok(())
    })
}

/// Checks the frames of `span` in `bytes` (their contiguous range) by their headers and
/// checksums, without decompressing them: what a scan checks before it decodes them one at a time.
pub fn verify_span<E: Entry>(span: &FrameSpan<'_, E>, bytes: &[u8]) -> Result<(), FormatError> {
    let start = span.infos.first().map_or(0, |info| info.offset);
    let expected: u64 = span.infos.iter().map(|info| u64::from(info.len)).sum();
    if bytes.len() as u64 != expected {
        return Err(FormatError::Length { what: "frame range", expected, found: bytes.len() as u64 });
    }
    for info in span.infos {
        let frame = frame_bytes(bytes, start, info)?;
        FrameHeader::parse::<E>(frame)?;
        verify_checksum("frame", frame)?;
    }
    Ok(())
}

/// Checks a whole data file of `file_len` bytes against its meta without decompressing it: the
/// exact length, then every frame's header and checksum, read from `reader` one frame at a time
/// (a buffer of at most `MAX_FRAME_BYTES`), so that a large table is never held whole. An upload
/// runs this, so a local copy that rotted on disk never reaches the bucket (where it would
/// replace the only good copy's chance of existing). A read that fails after the length matched
/// (the file changed meanwhile) is `Unreadable`.
pub fn verify_data_file<E: Entry>(
    meta: &TableMeta<E>,
    file_len: u64,
    reader: &mut impl io::Read,
) -> Result<(), FormatError> {
    check_data_len(meta.data_len, file_len)?;
    verify_data_frames(&meta.frames, reader, &mut Vec::new())
}

const DATA_FILE: &str = "data file";

/// A data file must be exactly as long as its meta says.
pub fn check_data_len(data_len: u64, file_len: u64) -> Result<(), FormatError> {
    match file_len == data_len {
        true => Ok(()),
        false => Err(FormatError::Length { what: DATA_FILE, expected: data_len, found: file_len }),
    }
}

/// Checks the next frames of a data file, `frames` (consecutive records of a checked meta), read
/// from `reader` one at a time into `buffer`: each frame's header and checksum.
pub fn verify_data_frames<E: Entry>(
    frames: &[FrameInfo<E>],
    reader: &mut impl io::Read,
    buffer: &mut Vec<u8>,
) -> Result<(), FormatError> {
    for info in frames {
        assert!(info.len as usize <= MAX_FRAME_BYTES, "a checked meta bounds its frames");
        buffer.resize(info.len as usize, 0);
        reader.read_exact(buffer).map_err(|e| FormatError::Unreadable { what: DATA_FILE, detail: e.to_string() })?;
        FrameHeader::parse::<E>(buffer)?;
        verify_checksum("frame", buffer)?;
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

/// The decoded entries of the span's frame `at` must agree with the index: count, first entry,
/// the next frame's first entry and `continues` flag, or the table's last entry.
fn check_frame_against_index<E: Entry>(span: &FrameSpan<'_, E>, at: usize, decoded: &[E]) -> Result<(), FormatError> {
    let (info, index) = (&span.infos[at], span.first_index + at);
    let mismatch =
        |detail: &str| Err(invalid("frame", format!("frame {index} disagrees with the meta file: {detail}")));
    let (Some(first), Some(last)) = (decoded.first(), decoded.last()) else { return mismatch("no entries") };
    if decoded.len() != info.entries as usize {
        return mismatch("entry count");
    }
    if *first != info.first {
        return mismatch("first entry");
    }
    match span.infos.get(at + 1).or(span.next) {
        Some(next) if *last >= next.first => mismatch("overlaps the next frame"),
        Some(next) if (last.key() == next.first.key()) != next.continues => mismatch("next frame's continues flag"),
        None if Some(*last) != span.last => mismatch("last entry"),
        _ => Ok(()),
    }
}
