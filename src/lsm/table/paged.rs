//! Meta version 4, the paged meta: laid out so that a reader keeps only a small directory in
//! memory and reads the rest a page at a time (docs/format.md "Meta file, version 4").
//!
//! The file: a fixed header; the resident part (the last entry, one directory record per chunk of
//! `CHUNK_FRAMES` frames, the compressed column models) and its xxh3-64; the filter's blocks in
//! pages of `PAGE_BLOCKS` blocks, each followed by its xxh3-64; the frame index in chunks, each a
//! zstd frame of version 2's columns followed by its xxh3-64; and an xxh3-64 of the whole file.
//!
//! `PagedMeta` is the reader: it reads the header and the resident part when a table is opened
//! and a filter page, an index chunk or the decoded column models when a read needs them, through
//! the tree's `MetaCache`.
//!
//! Invariants:
//! - Memory per open table is the directory (one record per `CHUNK_FRAMES` frames, about 90
//!   bytes per 16,000 entries) and where its models lie: nothing that grows with the filter or the
//!   index. Decoded models (some 600 KiB a table) live in the cache, under its budget, like pages,
//!   once a lookup needed them. Opening a table decodes them only to check them, and a scan holds
//!   the ones it uses itself (found again through a weak reference while it does): neither a
//!   flush, a merge nor an import fills the cache with models no query asked for.
//! - Every page and chunk is checked against its own checksum before it is used or cached; the
//!   resident part against its checksum, and every directory record against its neighbours and
//!   the header, when the table is opened. A chunk must agree with its directory record.
//! - The whole-file checksum lets a whole check work as for every other version, and in file
//!   order (`check_in_order`: an upload, a meta fetched whole) it needs one page or chunk in
//!   memory at a time; a writer writes it the same way (`assemble`).
//! - A filter page that cannot be read or fails its checksum answers "may contain" (the filter
//!   only saves reads; the frames' own checksums guard the answer) and is reported.

use super::meta::encode_frame_index;
use super::meta::{META_MAGIC, check_last_entry, decode_entry, decode_frame_index, decode_models, encode_entry};
use super::partial::PartialFile;
use super::{FrameInfo, MAX_FRAMES, TableMeta, max_frame_entries};
use crate::lsm::bytes::{CHECKSUM_LEN, FormatError, Reader, check_range, invalid};
use crate::lsm::cache::{BudgetCache, CacheValue};
use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::filter::{BLOCK_BYTES, Filter, FilterShape, KeyHash, MAX_BLOCKS, MAX_K, encoded_block_may_contain};
use crate::model::ids::RecordId;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, Weak};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

pub const META_PAGED_VERSION: u16 = 4;
/// Bytes of version 4's fixed header.
pub const HEADER_LEN: usize = 68;
/// Filter blocks per page: 4 KiB of filter per read.
pub const PAGE_BLOCKS: usize = 64;
/// Frames per index chunk: about 16,000 entries of a default table, a few KiB decoded.
pub const CHUNK_FRAMES: usize = 64;
/// Bytes of one directory record beyond its first entry: flags (1), data offset (8), chunk length (4).
const DIRECTORY_FIXED_LEN: usize = 13;
const CONTINUES_FLAG: u8 = 1;
const WHAT: &str = "paged meta";
/// Cache keys: filter pages count up from 0, index chunks from this bit, the models at the top.
const INDEX_KEY_BIT: u32 = 1 << 31;
const MODELS_KEY: u32 = u32::MAX;
const _: () = assert!(INDEX_KEY_BIT as usize + super::MAX_FRAMES / CHUNK_FRAMES < MODELS_KEY as usize);

/// One page of a paged meta: a run of filter blocks as encoded, a chunk of the frame index, or
/// the table's column models, decoded.
#[derive(Debug)]
pub enum MetaPage<E> {
    Filter(Arc<[u8]>),
    Index(Arc<[FrameInfo<E>]>),
    Models(Arc<ColumnModels>),
}

impl<E> Clone for MetaPage<E> {
    fn clone(&self) -> Self {
        match self {
            MetaPage::Filter(bytes) => MetaPage::Filter(bytes.clone()),
            MetaPage::Index(frames) => MetaPage::Index(frames.clone()),
            MetaPage::Models(models) => MetaPage::Models(models.clone()),
        }
    }
}

impl<E> CacheValue for MetaPage<E> {
    /// A filter page; index chunks are a few KiB, models far more (a cache of them holds fewer
    /// values than slots).
    const TYPICAL_BYTES: usize = 4 << 10;
    fn bytes(&self) -> usize {
        match self {
            MetaPage::Filter(bytes) => bytes.len(),
            MetaPage::Index(frames) => std::mem::size_of_val(frames.as_ref()),
            MetaPage::Models(models) => models.memory_bytes(),
        }
    }
}

/// Pages of a tree's paged metas.
pub type MetaCache<E> = BudgetCache<MetaPage<E>>;

/// Where a paged meta's bytes are read from.
#[derive(Debug)]
pub enum PageSource {
    File(File),
    Memory(Arc<[u8]>),
    /// A local copy being fetched piece by piece from the bucket.
    Partial(PartialFile),
}

impl PageSource {
    fn len(&self) -> Result<u64, FormatError> {
        match self {
            PageSource::File(file) => file.metadata().map(|m| m.len()).map_err(unreadable),
            PageSource::Memory(bytes) => Ok(bytes.len() as u64),
            PageSource::Partial(partial) => Ok(partial.meta_len()),
        }
    }

    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, FormatError> {
        match self {
            PageSource::Partial(partial) => partial.read(offset, len),
            PageSource::File(file) => {
                let mut buffer = vec![0u8; len];
                file.read_exact_at(&mut buffer, offset).map_err(unreadable)?;
                Ok(buffer)
            }
            PageSource::Memory(bytes) => {
                let range = usize::try_from(offset).ok().and_then(|start| Some(start..start.checked_add(len)?));
                let slice = range.and_then(|range| bytes.get(range));
                slice.map(<[u8]>::to_vec).ok_or(FormatError::Length {
                    what: WHAT,
                    expected: offset + len as u64,
                    found: bytes.len() as u64,
                })
            }
        }
    }
}

fn unreadable(error: std::io::Error) -> FormatError {
    FormatError::Unreadable { what: WHAT, detail: error.to_string() }
}

/// One directory record: where a chunk of the frame index starts and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkInfo<E> {
    /// Its first frame's first entry, and whether that frame continues the previous one's key.
    first: E,
    continues: bool,
    /// Its first frame's offset in the data file.
    data_offset: u64,
    /// Where the chunk lies in the meta file (its checksum included).
    meta_offset: u64,
    len: u32,
}

/// A piece of a paged meta a lookup reads: one filter page, or consecutive index chunks. What a
/// partial copy fetches from the bucket, by range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaPiece {
    pub offset: u64,
    pub len: u64,
    what: PieceKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PieceKind {
    FilterPage,
    Chunks(Range<usize>),
}

/// The fixed header.
#[derive(Clone, Copy, Debug)]
struct Header {
    /// Whether the filter holds each entry's first `Entry::FILTER_WIDTH` bytes, longer than its
    /// key (else it holds keys, as every table written before filter widths).
    filter_holds_prefixes: bool,
    /// Whether the filter also holds each distinct shard prefix (`Entry::FILTER_HOLDS_SHARDS`).
    filter_holds_shards: bool,
    frames: usize,
    entries: u64,
    data_len: u64,
    shape: FilterShape,
    directory_len: usize,
    models_len: usize,
    filter_len: u64,
    index_len: u64,
}

impl Header {
    fn chunks(&self) -> usize {
        self.frames.div_ceil(CHUNK_FRAMES)
    }

    fn pages(&self) -> usize {
        self.shape.blocks.div_ceil(PAGE_BLOCKS)
    }

    fn resident_len(&self) -> usize {
        HEADER_LEN + self.directory_len + self.models_len + CHECKSUM_LEN
    }

    fn filter_offset(&self) -> u64 {
        self.resident_len() as u64
    }

    fn index_offset(&self) -> u64 {
        self.filter_offset() + self.filter_len
    }

    fn file_len(&self) -> u64 {
        self.index_offset() + self.index_len + CHECKSUM_LEN as u64
    }

    /// Where filter page `page` lies in the file (its checksum included).
    fn filter_page_place(&self, page: usize) -> (u64, usize) {
        let blocks = PAGE_BLOCKS.min(self.shape.blocks - page * PAGE_BLOCKS);
        let offset = self.filter_offset() + (page * PAGE_BLOCKS * BLOCK_BYTES + page * CHECKSUM_LEN) as u64;
        (offset, blocks * BLOCK_BYTES + CHECKSUM_LEN)
    }
}

/// The most bytes one compressed index chunk (checksum included) may take.
fn chunk_bound<E: Entry>() -> usize {
    zstd::zstd_safe::compress_bound(CHUNK_FRAMES * (E::WIDTH + 9)) + CHECKSUM_LEN
}

/// Appends `meta` encoded as version 4.
pub(super) fn encode<E: Entry>(meta: &TableMeta<E>, out: &mut Vec<u8>) {
    let mut index = IndexWriter::new(std::io::Cursor::new(Vec::new()));
    meta.frames.iter().for_each(|frame| index.push(*frame).expect("an index in memory takes every frame"));
    let index = index.finish().expect("an index in memory is written");
    let parts = MetaParts {
        filter: &meta.filter,
        last: meta.last,
        entries: meta.entries,
        data_len: meta.data_len,
        models: meta.models.as_ref(),
    };
    assemble(&parts, index, out).expect("the chunks in memory are read");
}

/// What a version-4 meta holds besides its frame index.
pub(super) struct MetaParts<'a, E> {
    pub filter: &'a Filter,
    pub last: Option<E>,
    pub entries: u64,
    pub data_len: u64,
    pub models: Option<&'a ColumnModels>,
}

/// A version-4 meta's frame index as its table is written: each full chunk of `CHUNK_FRAMES`
/// frames is encoded (checksum included) to `sink` at once and only its directory record kept,
/// so memory is the open chunk and about 80 bytes per chunk, not a record per frame.
pub(super) struct IndexWriter<E, S> {
    open: Vec<FrameInfo<E>>,
    /// The directory records of the chunks in `sink`, as encoded.
    records: Vec<u8>,
    sink: S,
    frames: usize,
    index_len: u64,
}

/// A finished index: its chunks in `sink`, in order, from its start.
pub(super) struct FinishedIndex<S> {
    sink: S,
    records: Vec<u8>,
    frames: usize,
    index_len: u64,
}

impl<S> FinishedIndex<S> {
    pub(super) fn frames(&self) -> usize {
        self.frames
    }
}

impl<E: Entry, S: std::io::Write> IndexWriter<E, S> {
    pub(super) fn new(sink: S) -> Self {
        IndexWriter { open: Vec::with_capacity(CHUNK_FRAMES), records: Vec::new(), sink, frames: 0, index_len: 0 }
    }

    /// Frames pushed so far.
    pub(super) fn frames(&self) -> usize {
        self.frames
    }

    /// Appends the next frame. Not checked here: tests write inconsistent indexes on purpose, and
    /// the reader checks every chunk against its neighbours.
    pub(super) fn push(&mut self, frame: FrameInfo<E>) -> std::io::Result<()> {
        self.open.push(frame);
        self.frames += 1;
        if self.open.len() == CHUNK_FRAMES {
            self.close_chunk()?;
        }
        Ok(())
    }

    /// Writes the open chunk (if any) and keeps its directory record.
    fn close_chunk(&mut self) -> std::io::Result<()> {
        let Some(first) = self.open.first() else { return Ok(()) };
        let chunk = with_checksum(encode_frame_index(&self.open));
        encode_entry(&first.first, &mut self.records);
        self.records.push(if first.continues { CONTINUES_FLAG } else { 0 });
        self.records.extend_from_slice(&first.offset.to_le_bytes());
        self.records.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        self.sink.write_all(&chunk)?;
        self.index_len += chunk.len() as u64;
        self.open.clear();
        Ok(())
    }

    /// Writes the last chunk.
    pub(super) fn finish(mut self) -> std::io::Result<FinishedIndex<S>> {
        self.close_chunk()?;
        assert_eq!(self.records.len(), self.frames.div_ceil(CHUNK_FRAMES) * (E::WIDTH + DIRECTORY_FIXED_LEN));
        Ok(FinishedIndex { sink: self.sink, records: self.records, frames: self.frames, index_len: self.index_len })
    }
}

/// Writes the version-4 meta of `parts` and `index` to `out`, a page or an index chunk's worth at
/// a time (a large table's meta is tens of MiB, mostly filter), and gives its length.
pub(super) fn assemble<E: Entry, S: std::io::Read + std::io::Seek>(
    parts: &MetaParts<'_, E>,
    mut index: FinishedIndex<S>,
    out: &mut impl std::io::Write,
) -> std::io::Result<u64> {
    let mut out = ChecksummedWriter { inner: out, hasher: Xxh3::new(), len: 0 };
    let resident = resident_part(parts, &index);
    out.write(&resident)?;
    out.write(&xxh3_64(&resident).to_le_bytes())?;
    let blocks = parts.filter.shape().blocks;
    let mut page = Vec::with_capacity(PAGE_BLOCKS * BLOCK_BYTES + CHECKSUM_LEN);
    for first in (0..blocks).step_by(PAGE_BLOCKS) {
        page.clear();
        parts.filter.encode_blocks(first..(first + PAGE_BLOCKS).min(blocks), &mut page);
        let checksum = xxh3_64(&page);
        page.extend_from_slice(&checksum.to_le_bytes());
        out.write(&page)?;
    }
    index.sink.seek(std::io::SeekFrom::Start(0))?;
    let mut left = index.index_len;
    let mut piece = vec![0u8; (64 << 10).min(left as usize)];
    while left > 0 {
        let n = piece.len().min(left as usize);
        std::io::Read::read_exact(&mut index.sink, &mut piece[..n])?;
        out.write(&piece[..n])?;
        left -= n as u64;
    }
    let checksum = out.hasher.digest();
    out.write(&checksum.to_le_bytes())?;
    Ok(out.len)
}

/// The header, the directory and the compressed models: the part of a version-4 meta a reader
/// keeps (its checksum follows it).
fn resident_part<E: Entry, S>(parts: &MetaParts<'_, E>, index: &FinishedIndex<S>) -> Vec<u8> {
    let shape = parts.filter.shape();
    let models = parts.models.map(|models| {
        zstd::bulk::compress(&models.encode(), super::DEFAULT_ZSTD_LEVEL).expect("zstd compresses in memory")
    });
    let pages = shape.blocks.div_ceil(PAGE_BLOCKS);
    let mut directory = Vec::with_capacity(E::WIDTH + index.records.len());
    if let Some(last) = &parts.last {
        encode_entry(last, &mut directory);
    }
    directory.extend_from_slice(&index.records);
    let mut out = Vec::with_capacity(HEADER_LEN + directory.len() + models.as_ref().map_or(0, Vec::len));
    out.extend_from_slice(&META_MAGIC);
    out.extend_from_slice(&META_PAGED_VERSION.to_le_bytes());
    out.extend_from_slice(&(E::WIDTH as u16).to_le_bytes());
    out.extend_from_slice(&(E::KEY_WIDTH as u16).to_le_bytes());
    out.extend_from_slice(&declared_width(prefix_width::<E>()).to_le_bytes());
    out.extend_from_slice(&(index.frames as u32).to_le_bytes());
    out.extend_from_slice(&parts.entries.to_le_bytes());
    out.extend_from_slice(&parts.data_len.to_le_bytes());
    out.push(shape.k as u8);
    out.push(0);
    out.extend_from_slice(&(PAGE_BLOCKS as u16).to_le_bytes());
    out.extend_from_slice(&(shape.blocks as u32).to_le_bytes());
    out.extend_from_slice(&(CHUNK_FRAMES as u16).to_le_bytes());
    out.extend_from_slice(&declared_width(shard_width::<E>()).to_le_bytes());
    out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
    out.extend_from_slice(&(models.as_ref().map_or(0, Vec::len) as u32).to_le_bytes());
    out.extend_from_slice(&((shape.blocks * BLOCK_BYTES + pages * CHECKSUM_LEN) as u64).to_le_bytes());
    out.extend_from_slice(&index.index_len.to_le_bytes());
    assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(&directory);
    if let Some(models) = &models {
        out.extend_from_slice(models);
    }
    out
}

/// A writer of a meta in file order that keeps the xxh3-64 and the length of everything written.
struct ChecksummedWriter<'a, W> {
    inner: &'a mut W,
    hasher: Xxh3,
    len: u64,
}

impl<W: std::io::Write> ChecksummedWriter<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }
}

fn with_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
    let checksum = xxh3_64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes
}

/// `bytes` without their trailing xxh3-64, once it matches.
fn checked<'a>(what: &'static str, bytes: &'a [u8]) -> Result<&'a [u8], FormatError> {
    crate::lsm::bytes::verify_checksum(what, bytes)?;
    Ok(&bytes[..bytes.len() - CHECKSUM_LEN])
}

/// How a read uses the filter pages, frame-index chunks and column models it reads: a lookup
/// keeps them in the cache; a scan (a merge reads every chunk of its inputs once; a flush's
/// lookups touch pages all over a tree) uses what the cache holds but adds nothing to it, so it
/// neither evicts what queries use nor holds memory for pages it will not read again. A scan
/// holds the models it decodes with for as long as it runs (`PagedMeta::models`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageUse {
    Lookup,
    Scan,
}

/// Where a table's compressed column models lie in its meta file, and their xxh3-64 (taken when
/// the resident part that holds them passed its checksum, so a later read is checked alone).
#[derive(Clone, Copy, Debug)]
struct ModelsPlace {
    offset: u64,
    len: usize,
    checksum: u64,
}

/// A version-4 meta as a reader holds it: the header and the directory; pages and models on
/// demand.
#[derive(Debug)]
pub struct PagedMeta<E: Entry> {
    header: Header,
    pub last: Option<E>,
    models: Option<ModelsPlace>,
    chunks: Vec<ChunkInfo<E>>,
    source: PageSource,
    cache: Arc<MetaCache<E>>,
    serial: u64,
    /// The decoded models while some reader holds them (a scan), whether or not they are cached.
    held_models: Mutex<Weak<ColumnModels>>,
}

impl<E: Entry> PagedMeta<E> {
    /// Reads and checks the header and the resident part of the meta in `source`, and decodes
    /// its models once (and drops them) so that a table whose models do not decode never opens.
    pub fn open(source: PageSource, cache: Arc<MetaCache<E>>, serial: u64) -> Result<Self, FormatError> {
        let file_len = source.len()?;
        let header = parse_header::<E>(&source.read(0, HEADER_LEN.min(file_len as usize))?)?;
        if header.file_len() != file_len {
            return Err(FormatError::Length { what: WHAT, expected: header.file_len(), found: file_len });
        }
        let Resident { last, chunks, models } = parse_resident::<E>(&header, &source.read(0, header.resident_len())?)?;
        let models = models.map(|(place, _)| place);
        let held_models = Mutex::new(Weak::new());
        Ok(PagedMeta { header, last, models, chunks, source, cache, serial, held_models })
    }

    /// What names the table's column models by content (their bytes' xxh3-64 and length), `None`
    /// for a table of raw frames: tables with equal ids decode to equal models.
    pub fn models_id(&self) -> Option<(u64, usize)> {
        self.models.map(|place| (place.checksum, place.len))
    }

    /// The table's column models (`None` for a table of raw frames): in the cache, held by
    /// another reader, or read again from the meta, checked, and (for a lookup) cached.
    pub fn models(&self, with: PageUse) -> Result<Option<Arc<ColumnModels>>, FormatError> {
        let Some(place) = self.models else { return Ok(None) };
        // Under the lock (taken before any cache lock, never after), so that two readers that miss
        // read, decode and cache the models once.
        let mut held = self.held_models.lock().expect("held models lock poisoned");
        let cached = self.cached(MODELS_KEY, with, |cached| match cached {
            MetaPage::Models(models) => Some(models.clone()),
            _ => None,
        });
        let was_cached = cached.is_some();
        let models = match cached.or_else(|| held.upgrade()) {
            Some(models) => models,
            None => self.read_models(place)?,
        };
        // What the caller may hold is what the next reader finds, even once the cache lost it.
        *held = Arc::downgrade(&models);
        if with == PageUse::Lookup && !was_cached {
            self.cache.insert(self.serial, MODELS_KEY, MetaPage::Models(models.clone()));
        }
        Ok(Some(models))
    }

    /// `f` of cached page `key`, if any: counted as a hit or a miss for a lookup, not for a scan
    /// (`BudgetCache::peek`).
    fn cached<T>(&self, key: u32, with: PageUse, f: impl FnOnce(&MetaPage<E>) -> Option<T>) -> Option<T> {
        match with {
            PageUse::Lookup => self.cache.with(self.serial, key, f),
            PageUse::Scan => self.cache.peek(self.serial, key, f),
        }
        .flatten()
    }

    /// The models read from the meta, checked against the checksum taken at open, and decoded.
    fn read_models(&self, place: ModelsPlace) -> Result<Arc<ColumnModels>, FormatError> {
        let bytes = self.source.read(place.offset, place.len)?;
        let computed = xxh3_64(&bytes);
        if computed != place.checksum {
            return Err(FormatError::Checksum { what: "column models", stored: place.checksum, computed });
        }
        Ok(Arc::new(decode_models::<E>(&bytes)?))
    }

    pub fn entries(&self) -> u64 {
        self.header.entries
    }

    pub fn data_len(&self) -> u64 {
        self.header.data_len
    }

    pub fn frame_count(&self) -> usize {
        self.header.frames
    }

    /// Whether the filter holds keys (else longer prefixes: a lookup of a key alone cannot ask it).
    pub fn filter_holds_keys(&self) -> bool {
        !self.header.filter_holds_prefixes
    }

    /// Whether the filter also holds each distinct shard prefix.
    pub fn filter_holds_shards(&self) -> bool {
        self.header.filter_holds_shards
    }

    pub fn filter_shape(&self) -> FilterShape {
        self.header.shape
    }

    /// True unless the filter proves no entry has the hashed key (and when its page cannot be
    /// read: see the module header).
    pub fn may_contain(&self, h: KeyHash) -> Result<bool, FormatError> {
        let (page, at) = self.filter_place(h);
        let cached = self.cached(page as u32, PageUse::Lookup, |cached| match cached {
            MetaPage::Filter(bytes) => Some(self.block_may_contain(bytes, at, h)),
            _ => None,
        });
        match cached {
            Some(answer) => Ok(answer),
            None => Ok(self.block_may_contain(&self.filter_page(page)?, at, h)),
        }
    }

    /// `may_contain` of each of `hashes`. A lookup's pages are cached by the first key that needs
    /// each; a scan (a writer probing many keys at once) reads each page it needs once, in page
    /// order, and caches none.
    pub fn may_contain_many(&self, hashes: &[KeyHash], with: PageUse) -> Result<Vec<bool>, FormatError> {
        if with == PageUse::Lookup {
            return hashes.iter().map(|h| self.may_contain(*h)).collect();
        }
        let mut order: Vec<usize> = (0..hashes.len()).collect();
        order.sort_unstable_by_key(|&i| self.filter_place(hashes[i]).0);
        let mut answers = vec![true; hashes.len()];
        let mut held: Option<(usize, Arc<[u8]>)> = None;
        for i in order {
            let (page, at) = self.filter_place(hashes[i]);
            let bytes = match held.take() {
                Some((held_page, bytes)) if held_page == page => bytes,
                _ => self.scanned_filter_page(page)?,
            };
            answers[i] = self.block_may_contain(&bytes, at, hashes[i]);
            held = Some((page, bytes));
        }
        Ok(answers)
    }

    /// The filter page holding `h`'s block, and the block's offset in that page.
    fn filter_place(&self, h: KeyHash) -> (usize, usize) {
        let block = h.block_index(self.header.shape.blocks);
        (block / PAGE_BLOCKS, (block % PAGE_BLOCKS) * BLOCK_BYTES)
    }

    /// Whether the block at `at` of a filter page admits `h`.
    fn block_may_contain(&self, page: &[u8], at: usize, h: KeyHash) -> bool {
        encoded_block_may_contain(self.header.shape.k, &page[at..at + BLOCK_BYTES], h)
    }

    /// Filter page `page` for a scan: the cached copy, or read and checked without caching it.
    fn scanned_filter_page(&self, page: usize) -> Result<Arc<[u8]>, FormatError> {
        let cached = self.cached(page as u32, PageUse::Scan, |cached| match cached {
            MetaPage::Filter(bytes) => Some(bytes.clone()),
            _ => None,
        });
        match cached {
            Some(bytes) => Ok(bytes),
            None => self.read_filter_page(page),
        }
    }

    /// Filter page `page`, read, checked and cached (its callers looked in the cache already).
    fn filter_page(&self, page: usize) -> Result<Arc<[u8]>, FormatError> {
        let bytes = self.read_filter_page(page)?;
        self.cache.insert(self.serial, page as u32, MetaPage::Filter(bytes.clone()));
        Ok(bytes)
    }

    /// Filter page `page`, read and checked.
    fn read_filter_page(&self, page: usize) -> Result<Arc<[u8]>, FormatError> {
        let (offset, len) = self.filter_page_place(page);
        let bytes = self.source.read(offset, len)?;
        Ok(checked("filter page", &bytes)?.into())
    }

    /// Where filter page `page` lies in the file (its checksum included).
    fn filter_page_place(&self, page: usize) -> (u64, usize) {
        self.header.filter_page_place(page)
    }

    /// The partial local copy this meta reads, while some of it is still to be fetched.
    pub fn partial(&self) -> Option<&PartialFile> {
        match &self.source {
            PageSource::Partial(partial) if !partial.is_complete() => Some(partial),
            _ => None,
        }
    }

    /// The pieces that lookups of keys hashed `hashes` and reads of the entry ranges `ranges`
    /// (each `lo..=hi`) read and a partial copy does not hold yet: each key's filter page, and
    /// the index chunks from the one holding `lo`'s predecessor frame through the one after
    /// `hi`'s (the frame after a range is read too). Each page once; chunk ranges that touch
    /// merged into one piece.
    pub fn missing_pieces(&self, hashes: &[KeyHash], ranges: &[(E, E)]) -> Vec<MetaPiece> {
        let mut pages: Vec<usize> =
            hashes.iter().map(|h| h.block_index(self.header.shape.blocks) / PAGE_BLOCKS).collect();
        pages.sort_unstable();
        pages.dedup();
        let chunks: Vec<Range<usize>> = ranges.iter().map(|(lo, hi)| self.chunks_read(lo, hi)).collect();
        self.pieces_lacking(pages, chunks)
    }

    /// The index chunks holding the records of frames `frames` that a partial copy lacks, as
    /// pieces.
    pub fn missing_frame_chunks(&self, frames: Range<usize>) -> Vec<MetaPiece> {
        let end = frames.end.min(self.header.frames).div_ceil(CHUNK_FRAMES);
        self.pieces_lacking(Vec::new(), std::iter::once(frames.start / CHUNK_FRAMES..end))
    }

    /// Filter pages `pages` (sorted, distinct) and index chunk ranges `chunks` as pieces (chunk
    /// ranges that touch merged), less those a partial copy holds; none for a whole meta.
    fn pieces_lacking(&self, pages: Vec<usize>, chunks: impl IntoIterator<Item = Range<usize>>) -> Vec<MetaPiece> {
        let Some(partial) = self.partial() else { return Vec::new() };
        let mut pieces: Vec<MetaPiece> = pages
            .into_iter()
            .map(|page| self.filter_page_place(page))
            .map(|(offset, len)| MetaPiece { offset, len: len as u64, what: PieceKind::FilterPage })
            .collect();
        let mut chunks: Vec<Range<usize>> = chunks.into_iter().collect();
        chunks.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::new();
        for range in chunks.into_iter().filter(|r| !r.is_empty()) {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        for chunks in merged {
            let offset = self.chunks[chunks.start].meta_offset;
            let len = self.chunks[chunks.clone()].iter().map(|chunk| u64::from(chunk.len)).sum();
            pieces.push(MetaPiece { offset, len, what: PieceKind::Chunks(chunks) });
        }
        pieces.retain(|piece| !partial.covers(&(piece.offset..piece.offset + piece.len)));
        pieces
    }

    /// The index chunks a lookup of entries in `lo..=hi` reads (see `missing_pieces`).
    fn chunks_read(&self, lo: &E, hi: &E) -> Range<usize> {
        let first = self.chunks.partition_point(|chunk| chunk.first <= *lo).saturating_sub(1);
        let end = (self.chunks.partition_point(|chunk| chunk.first <= *hi) + 1).min(self.chunks.len());
        first..end.max(first)
    }

    /// Checks a fetched piece against its checksums (each page or chunk its own) and writes it
    /// into the partial copy. A piece that fails is not written.
    pub fn accept(&self, piece: &MetaPiece, bytes: &[u8]) -> Result<(), FormatError> {
        let Some(partial) = self.partial() else { return Ok(()) };
        if bytes.len() as u64 != piece.len {
            return Err(FormatError::Length { what: WHAT, expected: piece.len, found: bytes.len() as u64 });
        }
        match &piece.what {
            PieceKind::FilterPage => crate::lsm::bytes::verify_checksum("filter page", bytes)?,
            PieceKind::Chunks(chunks) => {
                let mut at = 0;
                for chunk in &self.chunks[chunks.clone()] {
                    crate::lsm::bytes::verify_checksum("frame index chunk", &bytes[at..at + chunk.len as usize])?;
                    at += chunk.len as usize;
                }
            }
        }
        partial.fill(piece.offset, bytes).map_err(unreadable)
    }

    /// Chunk `c`'s frames: held by `reader`, in the cache, or read, checked and (for a lookup)
    /// cached; `reader` holds them for its next question.
    fn chunk_in(&self, c: usize, reader: &mut ChunkReader<E>) -> Result<Arc<[FrameInfo<E>]>, FormatError> {
        if let Some(frames) = reader.held(c) {
            return Ok(frames);
        }
        let cached = self.cached(INDEX_KEY_BIT | c as u32, reader.with, |cached| match cached {
            MetaPage::Index(frames) => Some(frames.clone()),
            _ => None,
        });
        let frames = match cached {
            Some(frames) => frames,
            None => self.chunk(c, reader.with)?,
        };
        reader.hold(c, frames.clone());
        Ok(frames)
    }

    /// The frames of chunk `c`, read, checked and (for a lookup) cached (its caller looked in the
    /// cache already).
    fn chunk(&self, c: usize, with: PageUse) -> Result<Arc<[FrameInfo<E>]>, FormatError> {
        let key = INDEX_KEY_BIT | c as u32;
        let info = &self.chunks[c];
        let bytes = self.source.read(info.meta_offset, info.len as usize)?;
        let frames: Arc<[FrameInfo<E>]> = decode_chunk(&self.header, &self.chunks, c, &bytes)?.into();
        if with == PageUse::Lookup {
            self.cache.insert(self.serial, key, MetaPage::Index(frames.clone()));
        }
        Ok(frames)
    }

    /// Frame `i`'s index record.
    fn frame_in(&self, i: usize, reader: &mut ChunkReader<E>) -> Result<FrameInfo<E>, FormatError> {
        if i >= self.header.frames {
            return Err(invalid(WHAT, format!("frame {i} of a table with {}", self.header.frames)));
        }
        Ok(self.chunk_in(i / CHUNK_FRAMES, reader)?[i % CHUNK_FRAMES])
    }

    /// The index records of `r`.
    pub fn frame_infos(&self, r: Range<usize>, with: PageUse) -> Result<Vec<FrameInfo<E>>, FormatError> {
        self.frame_infos_in(r, &mut ChunkReader::new(with))
    }

    /// The frames that may hold entries of `key` and their index records, through one reader:
    /// a scan decodes each chunk once for both.
    pub fn frame_infos_for_key(
        &self,
        key: RecordId,
        with: PageUse,
    ) -> Result<(Range<usize>, Vec<FrameInfo<E>>), FormatError> {
        let mut reader = ChunkReader::new(with);
        let frames = self.frames_overlapping_in(&E::min_for_key(key), &E::max_for_key(key), &mut reader)?;
        Ok((frames.clone(), self.frame_infos_in(frames, &mut reader)?))
    }

    fn frame_infos_in(&self, r: Range<usize>, reader: &mut ChunkReader<E>) -> Result<Vec<FrameInfo<E>>, FormatError> {
        if r.start > r.end || r.end > self.header.frames {
            return Err(invalid(WHAT, format!("frames {r:?} of a table with {}", self.header.frames)));
        }
        let mut out = Vec::with_capacity(r.len());
        let mut i = r.start;
        while i < r.end {
            let base = i - i % CHUNK_FRAMES;
            let chunk = self.chunk_in(i / CHUNK_FRAMES, reader)?;
            let within = i - base..(r.end - base).min(chunk.len());
            out.extend_from_slice(&chunk[within.clone()]);
            i += within.len();
        }
        Ok(out)
    }

    /// How many frames start at or before `bound` (see `TableMeta`): through the directory, then
    /// one chunk.
    fn frames_starting_at_or_before(&self, bound: &E, reader: &mut ChunkReader<E>) -> Result<usize, FormatError> {
        let c = self.chunks.partition_point(|chunk| chunk.first <= *bound);
        if c == 0 {
            return Ok(0);
        }
        let within = self.chunk_in(c - 1, reader)?.partition_point(|frame| frame.first <= *bound);
        Ok((c - 1) * CHUNK_FRAMES + within)
    }

    /// `TableMeta::frames_overlapping`, paged: a lookup's, whose chunks go to the cache.
    pub fn frames_overlapping(&self, lo: &E, hi: &E) -> Result<Range<usize>, FormatError> {
        self.frames_overlapping_in(lo, hi, &mut ChunkReader::new(PageUse::Lookup))
    }

    /// `frames_overlapping` of each of `bounds` (`(lo, hi)`) in one reader, which keeps the chunks
    /// it read for the next (a writer's lookup of many sorted keys asks for the same chunks key
    /// after key: for a scan, a chunk is decoded again only when the keys leave the two held, not
    /// once a key, and none is cached).
    pub fn frames_overlapping_each(
        &self,
        bounds: impl IntoIterator<Item = (E, E)>,
        with: PageUse,
    ) -> Result<Vec<Range<usize>>, FormatError> {
        let mut reader = ChunkReader::new(with);
        bounds.into_iter().map(|(lo, hi)| self.frames_overlapping_in(&lo, &hi, &mut reader)).collect()
    }

    fn frames_overlapping_in(&self, lo: &E, hi: &E, reader: &mut ChunkReader<E>) -> Result<Range<usize>, FormatError> {
        let Some(last) = self.last else { return Ok(0..0) };
        if lo > hi || *lo > last {
            return Ok(0..0);
        }
        let end = self.frames_starting_at_or_before(hi, reader)?;
        let mut start = self.frames_starting_at_or_before(lo, reader)?.saturating_sub(1);
        if start + 1 < self.header.frames {
            let next = self.frame_in(start + 1, reader)?;
            if next.first.key() == lo.key() && !next.continues {
                start += 1;
            }
        }
        Ok(start.min(end)..end)
    }

    pub fn frames_for_key(&self, key: RecordId) -> Result<Range<usize>, FormatError> {
        self.frames_overlapping(&E::min_for_key(key), &E::max_for_key(key))
    }

    /// `TableMeta::byte_range`, paged.
    pub fn byte_range(&self, r: Range<usize>, with: PageUse) -> Result<(u64, u64), FormatError> {
        if r.start > r.end || r.end > self.header.frames {
            return Err(invalid(WHAT, format!("frames {r:?} of a table with {}", self.header.frames)));
        }
        let mut reader = ChunkReader::new(with);
        if r.is_empty() {
            let at = if r.start == self.header.frames {
                self.header.data_len
            } else {
                self.frame_in(r.start, &mut reader)?.offset
            };
            return Ok((at, at));
        }
        let last = self.frame_in(r.end - 1, &mut reader)?;
        Ok((self.frame_in(r.start, &mut reader)?.offset, last.offset.saturating_add(u64::from(last.len))))
    }
}

/// A chunk's number and its frames.
type HeldChunk<E> = (usize, Arc<[FrameInfo<E>]>);

/// The index chunks one reader of a paged meta has in hand: the last two it used. A writer's
/// lookup caches no chunk (`PageUse::Scan`), and its keys come sorted, so the next key's frames
/// are nearly always in a chunk it just decoded (or the one after: a range's next frame is read
/// too); a lookup's reader saves the cache's lock.
struct ChunkReader<E> {
    with: PageUse,
    held: [Option<HeldChunk<E>>; 2],
}

impl<E> ChunkReader<E> {
    fn new(with: PageUse) -> Self {
        ChunkReader { with, held: [None, None] }
    }

    /// Chunk `c` if held, now the one used last.
    fn held(&mut self, c: usize) -> Option<Arc<[FrameInfo<E>]>> {
        let at = self.held.iter().position(|held| held.as_ref().is_some_and(|(held, _)| *held == c))?;
        self.held.swap(0, at);
        self.held[0].as_ref().map(|(_, frames)| frames.clone())
    }

    /// Keeps chunk `c` in place of the one used longer ago.
    fn hold(&mut self, c: usize, frames: Arc<[FrameInfo<E>]>) {
        self.held.swap(0, 1);
        self.held[0] = Some((c, frames));
    }
}

/// Whether the meta file whose first bytes are `start` is version 4 (its version field, bytes 4..6;
/// a file too short for one is not).
pub fn is_paged(start: &[u8]) -> bool {
    start.get(4..6) == Some(&META_PAGED_VERSION.to_le_bytes()[..])
}

/// The length of the resident part (header, directory, models, checksum) of the version-4 meta
/// whose first bytes are `start` (at least `HEADER_LEN` of them).
pub fn resident_len<E: Entry>(start: &[u8]) -> Result<u64, FormatError> {
    Ok(declared_lengths::<E>(start)?.0)
}

/// What the header of the version-4 meta whose first bytes are `start` declares: the length of
/// its resident part, of the whole file, and of the table's data file.
pub fn declared_lengths<E: Entry>(start: &[u8]) -> Result<(u64, u64, u64), FormatError> {
    let header = parse_header::<E>(start.get(..HEADER_LEN).unwrap_or(start))?;
    Ok((header.resident_len() as u64, header.file_len(), header.data_len))
}

/// A header field declaring an optional filter content of `width` bytes: 0 when there is none
/// (as every table wrote before such fields), else the width.
fn declared_width(width: Option<usize>) -> u16 {
    u16::try_from(width.unwrap_or(0)).expect("an entry's widths fit the header")
}

/// Reads a field `declared_width` wrote: whether it declares `expected` (0 declares nothing; any
/// other value than `expected` is refused).
fn declares_width(reader: &mut Reader, field: &str, expected: Option<usize>) -> Result<bool, FormatError> {
    match reader.u16()? {
        0 => Ok(false),
        width if Some(usize::from(width)) == expected => Ok(true),
        width => Err(invalid(WHAT, format!("{field} {width} (0 or {})", expected.unwrap_or(0)))),
    }
}

/// What the filter of a new table of `E` holds beyond its keys: longer prefixes
/// (`Entry::FILTER_WIDTH`), and shard prefixes (`Entry::FILTER_HOLDS_SHARDS`).
fn prefix_width<E: Entry>() -> Option<usize> {
    (E::FILTER_WIDTH != E::KEY_WIDTH).then_some(E::FILTER_WIDTH)
}

fn shard_width<E: Entry>() -> Option<usize> {
    E::FILTER_HOLDS_SHARDS.then_some(E::SHARD_WIDTH)
}

/// Parses and bounds-checks version 4's fixed header.
fn parse_header<E: Entry>(bytes: &[u8]) -> Result<Header, FormatError> {
    let mut reader = Reader::new(WHAT, bytes);
    let magic = reader.array::<4>()?;
    if magic != META_MAGIC {
        return Err(FormatError::Magic { what: WHAT, found: magic });
    }
    let version = reader.u16()?;
    if version != META_PAGED_VERSION {
        return Err(FormatError::Version { what: WHAT, found: version.into() });
    }
    check_range(WHAT, "entry width", reader.u16()?.into(), E::WIDTH as u64, E::WIDTH as u64)?;
    check_range(WHAT, "key width", reader.u16()?.into(), E::KEY_WIDTH as u64, E::KEY_WIDTH as u64)?;
    let filter_holds_prefixes = declares_width(&mut reader, "filter width", prefix_width::<E>())?;
    let frames = reader.u32()? as usize;
    check_range(WHAT, "frame count", frames as u64, 0, MAX_FRAMES as u64)?;
    let entries = reader.u64()?;
    check_range(WHAT, "entry count", entries, 0, MAX_FRAMES as u64 * max_frame_entries::<E>() as u64)?;
    let data_len = reader.u64()?;
    check_range(WHAT, "data length", data_len, 0, MAX_FRAMES as u64 * super::MAX_FRAME_BYTES as u64)?;
    let k = reader.u8()? as usize;
    check_range(WHAT, "filter k", k as u64, 1, MAX_K as u64)?;
    check_range(WHAT, "reserved", reader.u8()?.into(), 0, 0)?;
    check_range(WHAT, "filter page blocks", reader.u16()?.into(), PAGE_BLOCKS as u64, PAGE_BLOCKS as u64)?;
    let blocks = reader.u32()? as usize;
    check_range(WHAT, "filter blocks", blocks as u64, 1, MAX_BLOCKS as u64)?;
    check_range(WHAT, "chunk frames", reader.u16()?.into(), CHUNK_FRAMES as u64, CHUNK_FRAMES as u64)?;
    let filter_holds_shards = declares_width(&mut reader, "shard filter width", shard_width::<E>())?;
    let directory_len = reader.u32()? as usize;
    let models_len = reader.u32()? as usize;
    let filter_len = reader.u64()?;
    let index_len = reader.u64()?;
    let header = Header {
        filter_holds_prefixes,
        filter_holds_shards,
        frames,
        entries,
        data_len,
        shape: FilterShape { k, blocks },
        directory_len,
        models_len,
        filter_len,
        index_len,
    };
    let last_len = if entries > 0 { E::WIDTH } else { 0 };
    let directory_expected = last_len + header.chunks() * (E::WIDTH + DIRECTORY_FIXED_LEN);
    check_range(WHAT, "directory length", directory_len as u64, directory_expected as u64, directory_expected as u64)?;
    let models_bound = zstd::zstd_safe::compress_bound(ColumnModels::encoded_len(super::layout_of::<E>()));
    check_range(WHAT, "column models length", models_len as u64, 0, models_bound as u64)?;
    let filter_expected = (blocks * BLOCK_BYTES + header.pages() * CHECKSUM_LEN) as u64;
    check_range(WHAT, "filter length", filter_len, filter_expected, filter_expected)?;
    check_range(WHAT, "index length", index_len, 0, (header.chunks() * chunk_bound::<E>()) as u64)?;
    if (entries == 0) != (frames == 0) {
        return Err(invalid(WHAT, format!("{entries} entries in {frames} frames")));
    }
    Ok(header)
}

/// The last entry and the chunk records, checked against each other and the header.
fn parse_directory<E: Entry>(header: &Header, bytes: &[u8]) -> Result<(Option<E>, Vec<ChunkInfo<E>>), FormatError> {
    let mut reader = Reader::new(WHAT, bytes);
    let last = if header.entries > 0 { Some(decode_entry(reader.take(E::WIDTH)?)) } else { None };
    let mut chunks: Vec<ChunkInfo<E>> = Vec::with_capacity(header.chunks());
    let mut meta_offset = header.index_offset();
    for c in 0..header.chunks() {
        let first: E = decode_entry(reader.take(E::WIDTH)?);
        let flags = reader.u8()?;
        if flags & !CONTINUES_FLAG != 0 {
            return Err(invalid(WHAT, format!("unknown chunk flags {flags:#04x}")));
        }
        let data_offset = reader.u64()?;
        let len = reader.u32()?;
        let chunk = ChunkInfo { first, continues: flags & CONTINUES_FLAG != 0, data_offset, meta_offset, len };
        let previous = chunks.last();
        let ordered = previous.is_none_or(|p| p.first < chunk.first && p.data_offset < chunk.data_offset);
        let starts_right = c > 0 || (chunk.data_offset == 0 && !chunk.continues);
        let fits = (CHECKSUM_LEN + 1..=chunk_bound::<E>()).contains(&(len as usize));
        if !ordered || !starts_right || data_offset >= header.data_len || !fits {
            return Err(invalid(WHAT, format!("directory record {c} is out of place")));
        }
        if last.is_some_and(|last| chunk.first > last) {
            return Err(invalid(WHAT, format!("directory record {c} starts after the last entry")));
        }
        meta_offset += u64::from(len);
        chunks.push(chunk);
    }
    reader.expect_end()?;
    if meta_offset != header.index_offset() + header.index_len {
        return Err(invalid(WHAT, "the chunks do not fill the index"));
    }
    Ok((last, chunks))
}

/// A chunk's frames must match its directory record, be contiguous and ordered, and end where
/// the next chunk (or the data file) begins.
fn check_chunk<E: Entry>(
    header: &Header,
    chunks: &[ChunkInfo<E>],
    c: usize,
    frames: &[FrameInfo<E>],
) -> Result<(), FormatError> {
    let info = &chunks[c];
    let bad = |detail: &str| Err(invalid(WHAT, format!("chunk {c}: {detail}")));
    if frames.first().is_none_or(|f| f.first != info.first || f.continues != info.continues) {
        return bad("its first frame is not its directory record's");
    }
    for pair in frames.windows(2) {
        if pair[1].first <= pair[0].first || pair[1].offset != pair[0].offset + u64::from(pair[0].len) {
            return bad("frames out of order");
        }
    }
    for frame in frames {
        check_range(WHAT, "frame entries", frame.entries.into(), 1, max_frame_entries::<E>() as u64)?;
        check_range(
            WHAT,
            "frame length",
            frame.len.into(),
            super::FRAME_OVERHEAD as u64 + 1,
            super::MAX_FRAME_BYTES as u64,
        )?;
    }
    let last = frames.last().expect("a chunk has frames");
    let end = last.offset + u64::from(last.len);
    let expected_end = chunks.get(c + 1).map_or(header.data_len, |next| next.data_offset);
    if end != expected_end {
        return bad("its frames do not end where the next chunk begins");
    }
    if c + 1 < chunks.len() && chunks[c + 1].first <= last.first {
        return bad("the next chunk does not start after it");
    }
    Ok(())
}

/// The whole meta, decoded and checked (every page and chunk): what `TableMeta::decode` gives
/// for version 4.
pub(super) fn decode_whole<E: Entry>(bytes: &[u8]) -> Result<TableMeta<E>, FormatError> {
    let (mut blocks, mut frames) = (Vec::new(), Vec::new());
    let checked = check_in_order::<E, FormatError>(
        &mut &bytes[..],
        bytes.len() as u64,
        |page| blocks.extend_from_slice(page),
        |chunk| {
            frames.extend_from_slice(chunk);
            Ok(())
        },
    )?;
    let filter: Filter = crate::lsm::filter::from_blocks(checked.shape, &blocks)?;
    let meta = TableMeta::new(filter, frames, checked.last, checked.entries, checked.data_len, checked.models);
    meta.check()?;
    Ok(meta)
}

/// What a whole check of a version-4 meta found, besides its pages and chunks.
#[derive(Debug)]
pub struct CheckedMeta<E> {
    pub shape: FilterShape,
    pub last: Option<E>,
    pub entries: u64,
    pub data_len: u64,
    pub models: Option<ColumnModels>,
}

/// Reads a whole version-4 meta of `file_len` bytes from `reader`, in file order, and checks all
/// of it: the header, the resident part, every filter page, every index chunk (against its
/// directory record and neighbours), the frames' cover of the data file, the last entry and the
/// whole-file checksum. Holds one page or chunk at a time (an upload checks metas of tens of MiB
/// this way), handing each page's blocks to `on_page` and each chunk's frames to `on_chunk`, in
/// order; an error from `on_chunk` ends the check. A read that fails is `Unreadable`.
pub fn check_in_order<E: Entry, X: From<FormatError>>(
    reader: &mut impl std::io::Read,
    file_len: u64,
    mut on_page: impl FnMut(&[u8]),
    mut on_chunk: impl FnMut(&[FrameInfo<E>]) -> Result<(), X>,
) -> Result<CheckedMeta<E>, X> {
    let mut reader = ChecksummedReader { inner: reader, hasher: Xxh3::new(), buffer: Vec::new() };
    let mut resident = reader.take(HEADER_LEN.min(file_len as usize))?.to_vec();
    let header = parse_header::<E>(&resident)?;
    if header.file_len() != file_len {
        return Err(FormatError::Length { what: WHAT, expected: header.file_len(), found: file_len }.into());
    }
    resident.extend_from_slice(reader.take(header.resident_len() - HEADER_LEN)?);
    let Resident { last, chunks, models } = parse_resident::<E>(&header, &resident)?;
    drop(resident);
    for page in 0..header.pages() {
        on_page(checked("filter page", reader.take(header.filter_page_place(page).1)?)?);
    }
    let (mut entries, mut last_frame) = (0u64, None);
    for c in 0..chunks.len() {
        let frames = decode_chunk(&header, &chunks, c, reader.take(chunks[c].len as usize)?)?;
        entries += frames.iter().map(|frame| u64::from(frame.entries)).sum::<u64>();
        last_frame = frames.last().copied();
        on_chunk(&frames)?;
    }
    let computed = reader.hasher.digest();
    let stored = u64::from_le_bytes(reader.take(CHECKSUM_LEN)?.try_into().expect("8 bytes"));
    if stored != computed {
        return Err(FormatError::Checksum { what: "meta", stored, computed }.into());
    }
    if entries != header.entries {
        return Err(invalid(WHAT, format!("frames hold {entries} entries, header says {}", header.entries)).into());
    }
    check_last_entry(last, last_frame.as_ref())?;
    let models = models.map(|(_, models)| models);
    Ok(CheckedMeta { shape: header.shape, last, entries, data_len: header.data_len, models })
}

/// A reader of a meta in file order that keeps the xxh3-64 of everything it read, reading each
/// piece into one reused buffer.
struct ChecksummedReader<'a, R> {
    inner: &'a mut R,
    hasher: Xxh3,
    buffer: Vec<u8>,
}

impl<R: std::io::Read> ChecksummedReader<'_, R> {
    /// The next `len` bytes (the caller bounded `len` by the header's checked lengths).
    fn take(&mut self, len: usize) -> Result<&[u8], FormatError> {
        self.buffer.resize(len, 0);
        self.inner.read_exact(&mut self.buffer).map_err(unreadable)?;
        self.hasher.update(&self.buffer);
        Ok(&self.buffer)
    }
}

/// What the resident part holds: the last entry, the chunk directory, and where the column models
/// lie with the models decoded (decoded to check them, whether or not they are kept).
struct Resident<E> {
    last: Option<E>,
    chunks: Vec<ChunkInfo<E>>,
    models: Option<(ModelsPlace, ColumnModels)>,
}

/// Checks the resident part (`bytes`, the header included, its checksum last) and parses it.
fn parse_resident<E: Entry>(header: &Header, bytes: &[u8]) -> Result<Resident<E>, FormatError> {
    let resident = checked("paged meta resident part", bytes)?;
    let mut reader = Reader::new(WHAT, &resident[HEADER_LEN..]);
    let directory = reader.take(header.directory_len)?;
    let models_bytes = reader.take(header.models_len)?;
    reader.expect_end()?;
    let (last, chunks) = parse_directory::<E>(header, directory)?;
    let models = match header.models_len {
        0 => None,
        len => {
            let offset = (HEADER_LEN + header.directory_len) as u64;
            let place = ModelsPlace { offset, len, checksum: xxh3_64(models_bytes) };
            Some((place, decode_models::<E>(models_bytes)?))
        }
    };
    Ok(Resident { last, chunks, models })
}

/// Chunk `c`'s bytes (its checksum last), checked, decoded, placed in the data file and checked
/// against its directory record and neighbours.
fn decode_chunk<E: Entry>(
    header: &Header,
    chunks: &[ChunkInfo<E>],
    c: usize,
    bytes: &[u8],
) -> Result<Vec<FrameInfo<E>>, FormatError> {
    let count = CHUNK_FRAMES.min(header.frames - c * CHUNK_FRAMES);
    let mut frames = decode_frame_index::<E>(checked("frame index chunk", bytes)?, count)?;
    frames.iter_mut().for_each(|frame| frame.offset += chunks[c].data_offset);
    check_chunk(header, chunks, c, &frames)?;
    Ok(frames)
}
