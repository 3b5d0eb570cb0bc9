//! An open table: its catalog record, its meta (paged for version 4: a directory in memory and
//! pages read through the tree's meta cache; whole for the versions before), its local data file
//! while cached, and the reads of its frames (from the frame cache, the local file, or the bucket
//! by range). A server that only reads may hold a paged meta as a partial copy, and fetches the
//! pieces a key's lookup reads before the lookup (`fetch_meta_for_key`).
//!
//! Invariants:
//! - Entries reach a reader only from frames that passed their checksums. A corrupt frame is
//!   reported (`base::corruption`) and fails the read with an error naming the object;
//!   a corrupt local copy of an uploaded table is deleted and the read served from the bucket
//!   (a table not yet uploaded exists nowhere else, so its local copy is never deleted).
//! - A read fetches one contiguous byte range: the frames asked for, coalesced.
//! - A filter page that cannot be read answers "may contain" and is reported: the filter only
//!   saves reads, so a bad page costs a read, never an answer. Every other meta read that fails
//!   fails the lookup with an error naming the meta file.
//! - A meta piece from the bucket is checked against its own checksum before it is written
//!   locally; a bad one fails the query naming the meta and is not kept.

use crate::base::corruption::{ObjectKind, Place, report_corruption};
use crate::lsm::cache::{CachedFrame, FrameCache, next_serial};
use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::filter::KeyHash;
use crate::lsm::record::TableRecord;
use crate::lsm::table::{
    FormatError, FrameInfo, FrameSpan, MetaCache, MetaPiece, PAGED_HEADER_LEN, PageSource, PageUse, PagedMeta,
    PartialFile, TableMeta, declared_lengths, decode_span, is_paged, resident_len, verify_span,
};
use crate::model::ids::RecordId;
use crate::model::ids::TreeKind;
use crate::store::object::{Store, StoreError};
use bytes::Bytes;
use std::borrow::Cow;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Decoded entries of a range of frames: all in one vector, or one shared slice per frame.
enum Decoded<E> {
    Whole(Vec<E>),
    Framed(Vec<Arc<CachedFrame<E>>>),
}

/// The entries of consecutive whole frames in one vector.
fn concat<E: Copy>(frames: &[Arc<CachedFrame<E>>]) -> Vec<E> {
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

/// A table's meta as its handle holds it: whole (versions 1 to 3, written before paged metas)
/// or paged (version 4).
#[derive(Debug)]
enum MetaView<E: Entry> {
    Resident(TableMeta<E>),
    Paged(PagedMeta<E>),
}

/// What a lookup asks a table's filter: the hash of its key, and when it looks for one filter
/// prefix (`Entry::FILTER_WIDTH` bytes, `lsm::lookup::read_prefixes_uncached`) that prefix's. Each
/// table answers from the one its filter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterProbe {
    pub key: KeyHash,
    pub prefix: Option<KeyHash>,
}

impl FilterProbe {
    /// A lookup of every entry of `key`.
    pub fn of_key(key: &RecordId) -> Self {
        FilterProbe { key: KeyHash::of_record(key), prefix: None }
    }

    /// A lookup of the entries that agree with `probe` in their first `FILTER_WIDTH` bytes.
    pub fn of_prefix<E: Entry>(probe: &E) -> Self {
        let bytes = crate::lsm::entry::encode_to_vec(probe);
        FilterProbe { key: KeyHash::of_record(&probe.key()), prefix: Some(KeyHash::of(&bytes[..E::FILTER_WIDTH])) }
    }
}

/// One table: its catalog record, its meta, and (when cached locally) its data file.
#[derive(Debug)]
pub struct TableHandle<E: Entry> {
    pub record: TableRecord,
    meta: MetaView<E>,
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
    /// Opens a table whose meta is at `meta_path` (a paged meta's header and directory read and
    /// checked now, an older meta decoded whole), or, when that file does not exist, whose
    /// partial copy is at `part_path` (see `table::partial`); its data file at `data_path` is used
    /// while it exists (else the table is read from the bucket).
    pub fn open(
        record: TableRecord,
        (meta_path, part_path, data_path): (&Path, &Path, PathBuf),
        (frame_cache, meta_cache): (Arc<FrameCache<E>>, Arc<MetaCache<E>>),
    ) -> Result<Self, ReadError> {
        let serial = next_serial();
        let meta = match File::open(meta_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && part_path.exists() => {
                open_partial(&record, part_path, meta_cache, serial)?
            }
            opened => open_whole(&record, meta_path, opened, meta_cache, serial)?,
        };
        let local_data = File::open(&data_path).ok().map(Arc::new);
        Ok(TableHandle {
            uploaded: AtomicBool::new(record.uploaded),
            record,
            meta,
            local_data: RwLock::new(local_data),
            data_path,
            last_read: AtomicU64::new(0),
            frame_cache,
            serial,
        })
    }

    /// The table's entries, frames, data length and last entry (from the header: no read).
    pub fn entries(&self) -> u64 {
        match &self.meta {
            MetaView::Resident(meta) => meta.entries,
            MetaView::Paged(meta) => meta.entries(),
        }
    }

    pub fn frame_count(&self) -> usize {
        match &self.meta {
            MetaView::Resident(meta) => meta.frames.len(),
            MetaView::Paged(meta) => meta.frame_count(),
        }
    }

    /// What this table's filter is asked for `probe`: its key's hash, or for a filter of longer
    /// prefixes (`Entry::FILTER_WIDTH`) the prefix's; `None` when the probe names no prefix, or
    /// the meta is a partial copy (which holds only the filter pages key lookups fetched).
    fn filter_hash(&self, probe: FilterProbe) -> Option<KeyHash> {
        match &self.meta {
            MetaView::Paged(meta) if !meta.filter_holds_keys() => probe.prefix.filter(|_| meta.partial().is_none()),
            _ => Some(probe.key),
        }
    }

    /// True unless the filter proves that no entry matches `probe` (see the module header); a
    /// filter of longer prefixes than keys cannot rule out a key alone.
    pub fn may_contain(&self, probe: FilterProbe) -> bool {
        let Some(h) = self.filter_hash(probe) else { return true };
        match &self.meta {
            MetaView::Resident(meta) => meta.may_contain(h),
            MetaView::Paged(meta) => meta.may_contain(h).unwrap_or_else(|source| {
                let _ = meta_error(&self.meta_name(), source);
                true
            }),
        }
    }

    /// `may_contain` of each of `probes`; a paged filter reads each page they need once, and for
    /// a scan caches none.
    pub fn may_contain_many(&self, probes: &[FilterProbe], with: PageUse) -> Vec<bool> {
        let hashes: Vec<Option<KeyHash>> = probes.iter().map(|probe| self.filter_hash(*probe)).collect();
        let asked: Vec<KeyHash> = hashes.iter().flatten().copied().collect();
        let answers = match &self.meta {
            MetaView::Resident(meta) => asked.iter().map(|h| meta.may_contain(*h)).collect(),
            MetaView::Paged(meta) => meta.may_contain_many(&asked, with).unwrap_or_else(|source| {
                let _ = meta_error(&self.meta_name(), source);
                vec![true; asked.len()]
            }),
        };
        let mut answers = answers.into_iter();
        hashes.iter().map(|h| h.is_none() || answers.next().expect("one answer a hash")).collect()
    }

    /// For each of `shards` (hashes of shard prefixes, `entry::shard_prefix_hash`), false when
    /// the filter proves the table holds no key with that prefix; true for all when its filter
    /// holds no shard prefixes, or its meta is a partial copy (whose filter pages are fetched
    /// for key lookups only). For a scan, caches no filter page.
    pub fn may_hold_shards(&self, shards: &[KeyHash], with: PageUse) -> Vec<bool> {
        match &self.meta {
            MetaView::Paged(meta) if meta.filter_holds_shards() && meta.partial().is_none() => {
                meta.may_contain_many(shards, with).unwrap_or_else(|source| {
                    let _ = meta_error(&self.meta_name(), source);
                    vec![true; shards.len()]
                })
            }
            _ => vec![true; shards.len()],
        }
    }

    /// Starts loading what `may_contain(probe)` will read, for a resident filter (a paged one
    /// reads its page when asked).
    pub fn prefetch(&self, probe: FilterProbe) {
        if let MetaView::Resident(meta) = &self.meta {
            meta.prefetch(probe.key);
        }
    }

    /// Frames that may hold entries `e` with `lo <= e <= hi` (see `TableMeta::frames_overlapping`).
    pub fn frames_overlapping(&self, lo: &E, hi: &E) -> Result<Range<usize>, ReadError> {
        match &self.meta {
            MetaView::Resident(meta) => Ok(meta.frames_overlapping(lo, hi)),
            MetaView::Paged(meta) => meta.frames_overlapping(lo, hi).map_err(|e| meta_error(&self.meta_name(), e)),
        }
    }

    /// `frames_overlapping` of each of `bounds`, for many at once: a paged meta decodes an index
    /// chunk again only when the bounds leave the two it last used (they should come sorted) and,
    /// for a scan, caches none.
    pub fn frames_overlapping_each(
        &self,
        bounds: impl IntoIterator<Item = (E, E)>,
        with: PageUse,
    ) -> Result<Vec<Range<usize>>, ReadError> {
        match &self.meta {
            MetaView::Resident(meta) => {
                Ok(bounds.into_iter().map(|(lo, hi)| meta.frames_overlapping(&lo, &hi)).collect())
            }
            MetaView::Paged(meta) => {
                meta.frames_overlapping_each(bounds, with).map_err(|e| meta_error(&self.meta_name(), e))
            }
        }
    }

    /// The frames that may hold entries of `key` and their index records (a paged meta's chunks
    /// cached for a lookup; for a scan, each decoded once for both).
    pub fn frame_infos_for_key(
        &self,
        key: RecordId,
        with: PageUse,
    ) -> Result<(Range<usize>, Vec<FrameInfo<E>>), ReadError> {
        match &self.meta {
            MetaView::Resident(meta) => {
                let frames = meta.frames_for_key(key);
                Ok((frames.clone(), meta.frames[frames].to_vec()))
            }
            MetaView::Paged(meta) => meta.frame_infos_for_key(key, with).map_err(|e| meta_error(&self.meta_name(), e)),
        }
    }

    /// The index records of frames `r` (a paged meta's chunks cached for a lookup).
    pub fn frame_infos(&self, r: Range<usize>, with: PageUse) -> Result<Vec<FrameInfo<E>>, ReadError> {
        match &self.meta {
            MetaView::Resident(meta) => meta.frames.get(r.clone()).map(<[FrameInfo<E>]>::to_vec).ok_or_else(|| {
                meta_error(&self.meta_name(), FormatError::Invalid { what: "meta", detail: format!("no frames {r:?}") })
            }),
            MetaView::Paged(meta) => meta.frame_infos(r, with).map_err(|e| meta_error(&self.meta_name(), e)),
        }
    }

    /// The data-file byte range covering frames `r` (see `TableMeta::byte_range`).
    pub fn byte_range(&self, r: Range<usize>, with: PageUse) -> Result<(u64, u64), ReadError> {
        match &self.meta {
            MetaView::Resident(meta) if r.end <= meta.frames.len() => Ok(meta.byte_range(r)),
            MetaView::Resident(_) => Err(meta_error(
                &self.meta_name(),
                FormatError::Invalid { what: "meta", detail: format!("no frames {r:?}") },
            )),
            MetaView::Paged(meta) => meta.byte_range(r, with).map_err(|e| meta_error(&self.meta_name(), e)),
        }
    }

    /// Bytes of the table's key filter (resident, or paged through the meta cache).
    pub fn filter_bytes(&self) -> usize {
        match &self.meta {
            MetaView::Resident(meta) => meta.filter.encoded_len(),
            MetaView::Paged(meta) => meta.filter_shape().encoded_len(),
        }
    }

    /// How errors name the local meta file.
    fn meta_name(&self) -> String {
        table_key(E::TREE, &self.record.id, "meta")
    }

    /// Object key of the data file in the bucket.
    pub fn data_key(&self) -> String {
        table_key(E::TREE, &self.record.id, "data")
    }

    /// Reads and decodes frames `frames`: from the frame cache when all of them are there, else
    /// with one ranged read (local file or the bucket), caching each frame it decodes.
    pub async fn read_frames(&self, store: &dyn Store, frames: Range<usize>) -> Result<Vec<E>, ReadError> {
        self.read_frames_with(store, frames, PageUse::Lookup).await
    }

    /// Every entry of `frames` whose key is in `keys` (`lo..=hi`), in sorted slices (together in
    /// order; they may hold other entries too), without copying: the decoded frames or their
    /// parts, from the cache or read now (and cached, each as `CachedFrame::of_keys` keeps it).
    /// A query searches them for its keys.
    pub async fn read_frame_slices(
        &self,
        store: &dyn Store,
        frames: Range<usize>,
        keys: (RecordId, RecordId),
    ) -> Result<Vec<Arc<CachedFrame<E>>>, ReadError> {
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        // A frame cached as the part of other keys is wanted by several: keep it whole now.
        let keep = match self.cached_frames(frames.clone(), Some(keys)) {
            Ok(cached) => return Ok(cached),
            Err(other_part_cached) => (!other_part_cached).then_some(keys),
        };
        Ok(match self.read_decoded(store, frames, PageUse::Lookup, keep).await? {
            Decoded::Whole(entries) => vec![CachedFrame::whole(entries)],
            Decoded::Framed(frames) => frames,
        })
    }

    /// `read_frames`; a scan that reads every frame once (a compaction) passes `PageUse::Scan` so
    /// it neither pollutes the frame and meta caches nor is slowed by them.
    pub async fn read_frames_with(
        &self,
        store: &dyn Store,
        frames: Range<usize>,
        with: PageUse,
    ) -> Result<Vec<E>, ReadError> {
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        if with == PageUse::Lookup
            && let Ok(cached) = self.cached_frames(frames.clone(), None)
        {
            return Ok(concat(&cached));
        }
        Ok(match self.read_decoded(store, frames, with, None).await? {
            Decoded::Whole(entries) => entries,
            Decoded::Framed(frames) => concat(&frames),
        })
    }

    /// Reads and decodes `frames` with one ranged read (for a lookup of `keys` when it names
    /// them). A local copy that fails its checksums is reported and, when the bucket has the
    /// table, dropped for the bucket's copy.
    async fn read_decoded(
        &self,
        store: &dyn Store,
        frames: Range<usize>,
        with: PageUse,
        keys: Option<(RecordId, RecordId)>,
    ) -> Result<Decoded<E>, ReadError> {
        assert!(!frames.is_empty(), "a read of no frames");
        let infos = self.span_infos(frames.clone(), with)?;
        let last = &infos[frames.len() - 1];
        let (start, end) = (infos[0].offset, last.offset.saturating_add(u64::from(last.len)));
        let decode = |bytes: &Bytes, _| self.decode_range(frames.clone(), &infos, (start, bytes), with, keys);
        self.read_checked(store, (start, end - start), decode).await
    }

    /// Reads `len` bytes at `start` of the data file and gives them to `check` (a decode, or a
    /// pass over the checksums): from the local copy, or, when that copy cannot be read or
    /// `check` rejects it and the bucket has the table, from the bucket, the local copy reported
    /// and dropped.
    async fn read_checked<T>(
        &self,
        store: &dyn Store,
        (start, len): (u64, u64),
        check: impl Fn(&Bytes, Place) -> Result<T, FormatError>,
    ) -> Result<T, ReadError> {
        let replaceable = self.uploaded.load(Ordering::Acquire);
        let failure = match self.read_range(store, start, len).await {
            Ok((bytes, place)) => match check(&bytes, place) {
                Ok(checked) => return Ok(checked),
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
        let bytes = store.get_range(&self.data_key(), start, len).await?;
        check(&bytes, Place::Bucket).map_err(|source| self.corrupt(Place::Bucket, source))
    }

    /// Reads `frames` for a scan with one ranged read and checks them by their checksums (a local
    /// copy that fails is reported and, when the bucket has the table, dropped for the bucket's
    /// copy); `decode_scan_frame` then decodes them one at a time, so a scan holds its batch
    /// compressed and one frame decoded.
    pub async fn read_scan_batch(&self, store: &dyn Store, frames: Range<usize>) -> Result<ScanBatch<E>, ReadError> {
        assert!(!frames.is_empty(), "a read of no frames");
        let infos = self.span_infos(frames.clone(), PageUse::Scan)?.into_owned();
        let (first_index, count) = (frames.start, frames.len());
        let last = &infos[count - 1];
        let (start, end) = (infos[0].offset, last.offset.saturating_add(u64::from(last.len)));
        let span = FrameSpan { first_index, infos: &infos[..count], next: None, last: None, models: None };
        let verify = |bytes: &Bytes, place| verify_span(&span, bytes).map(|()| (bytes.clone(), place));
        let (bytes, place) = self.read_checked(store, (start, end - start), verify).await?;
        Ok(ScanBatch { first_index, infos, count, start, bytes, place, decoded: 0 })
    }

    /// Decodes the next frame of `batch` onto `out` and checks it against the index; `false`
    /// when the batch has no frame left. `held` are the table's `paged_models`, which the scan
    /// holds (a paged meta keeps none in its cache for a scan).
    pub fn decode_scan_frame(
        &self,
        batch: &mut ScanBatch<E>,
        held: Option<&ColumnModels>,
        out: &mut Vec<E>,
    ) -> Result<bool, ReadError> {
        if batch.decoded == batch.count {
            return Ok(false);
        }
        let at = batch.decoded;
        let info = &batch.infos[at];
        let from = (info.offset - batch.start) as usize;
        let bytes = &batch.bytes[from..from + info.len as usize];
        let (last, models) = match &self.meta {
            MetaView::Resident(meta) => (meta.last, meta.models.as_ref()),
            MetaView::Paged(meta) => {
                assert_eq!(held.is_some(), meta.models_id().is_some(), "a scan holds its table's models");
                (meta.last, held)
            }
        };
        let span = FrameSpan {
            first_index: batch.first_index + at,
            infos: &batch.infos[at..at + 1],
            next: batch.infos.get(at + 1),
            last,
            models,
        };
        decode_span(&span, bytes, out).map_err(|source| self.corrupt(batch.place, source))?;
        batch.decoded += 1;
        Ok(true)
    }

    /// The index records of `frames` and of the frame after them (if any), read once for both the
    /// byte range a read fetches and the decode (a paged meta's chunks are not cached for a scan).
    fn span_infos(&self, frames: Range<usize>, with: PageUse) -> Result<Cow<'_, [FrameInfo<E>]>, ReadError> {
        match &self.meta {
            MetaView::Resident(meta) if frames.end <= meta.frames.len() => {
                Ok(Cow::Borrowed(&meta.frames[frames.start..(frames.end + 1).min(meta.frames.len())]))
            }
            MetaView::Resident(_) => Err(meta_error(
                &self.meta_name(),
                FormatError::Invalid { what: "meta", detail: format!("no frames {frames:?}") },
            )),
            MetaView::Paged(meta) => meta
                .frame_infos(frames.start..(frames.end + 1).min(meta.frame_count()), with)
                .map(Cow::Owned)
                .map_err(|e| meta_error(&self.meta_name(), e)),
        }
    }

    /// What names a paged meta's column models by content (`PagedMeta::models_id`): `None` for
    /// a resident meta or a table of raw frames.
    pub fn paged_models_id(&self) -> Option<(u64, usize)> {
        match &self.meta {
            MetaView::Resident(_) => None,
            MetaView::Paged(meta) => meta.models_id(),
        }
    }

    /// The column models of a paged meta, for a reader to hold while it decodes many batches
    /// (`None` for a resident meta, which holds its own, or a table of raw frames).
    pub fn paged_models(&self, with: PageUse) -> Result<Option<Arc<ColumnModels>>, ReadError> {
        match &self.meta {
            MetaView::Resident(_) => Ok(None),
            MetaView::Paged(meta) => meta.models(with).map_err(|e| meta_error(&self.meta_name(), e)),
        }
    }

    /// Every frame of `frames` from the frame cache, whole or holding all of `keys`' entries
    /// (whole only, for `None`); if one is missing, whether one was cached as a part that will not
    /// do.
    fn cached_frames(
        &self,
        frames: Range<usize>,
        keys: Option<(RecordId, RecordId)>,
    ) -> Result<Vec<Arc<CachedFrame<E>>>, bool> {
        let usable = |frame: &Arc<CachedFrame<E>>| keys.map_or(frame.is_whole(), |keys| frame.holds(keys));
        let mut other_part_cached = false;
        let wanted = frames.len();
        let mut found = Vec::with_capacity(wanted);
        for i in frames {
            match self.frame_cache.get_usable(self.serial, i as u32, usable) {
                Ok(frame) => found.push(frame),
                Err(cached) => other_part_cached |= cached,
            }
        }
        if found.len() == wanted { Ok(found) } else { Err(other_part_cached) }
    }

    /// Decodes `frames` from `bytes` (read from data-file offset `start`), checking every frame;
    /// `span` holds their index records and the next frame's (`span_infos`). For a lookup frame
    /// by frame, each one cached whole or as the part `keys` asked for; for a scan all at once.
    fn decode_range(
        &self,
        frames: Range<usize>,
        span: &[FrameInfo<E>],
        (start, bytes): (u64, &[u8]),
        with: PageUse,
        keys: Option<(RecordId, RecordId)>,
    ) -> Result<Decoded<E>, FormatError> {
        let (infos, next) = span.split_at(frames.len());
        let next = next.first();
        self.with_last_and_models(with, |last, models| {
            self.decode_infos(frames, (infos, next), (start, bytes), (last, models), with, keys)
        })
    }

    /// Runs `work` with the table's last entry and its column models (a paged meta's from the
    /// cache or read now, as `with` says).
    fn with_last_and_models<T>(
        &self,
        with: PageUse,
        work: impl FnOnce(Option<E>, Option<&ColumnModels>) -> Result<T, FormatError>,
    ) -> Result<T, FormatError> {
        match &self.meta {
            MetaView::Resident(meta) => work(meta.last, meta.models.as_ref()),
            MetaView::Paged(meta) => work(meta.last, meta.models(with)?.as_deref()),
        }
    }

    /// `decode_range` once the last entry and the models are known.
    fn decode_infos(
        &self,
        frames: Range<usize>,
        (infos, next): (&[FrameInfo<E>], Option<&FrameInfo<E>>),
        (start, bytes): (u64, &[u8]),
        (last, models): (Option<E>, Option<&ColumnModels>),
        with: PageUse,
        keys: Option<(RecordId, RecordId)>,
    ) -> Result<Decoded<E>, FormatError> {
        let span = |at: Range<usize>| FrameSpan {
            first_index: frames.start + at.start,
            infos: &infos[at.clone()],
            next: infos.get(at.end).or(next),
            last,
            models,
        };
        if with == PageUse::Scan {
            let mut out = Vec::new();
            decode_span(&span(0..infos.len()), bytes, &mut out)?;
            return Ok(Decoded::Whole(out));
        }
        let mut out = Vec::with_capacity(infos.len());
        for (at, info) in infos.iter().enumerate() {
            let from = (info.offset - start) as usize;
            let slice = bytes.get(from..from + info.len as usize).ok_or_else(|| FormatError::Invalid {
                what: "frame range",
                detail: format!("frame at {} is outside the bytes read", info.offset),
            })?;
            let mut decoded = Vec::new();
            decode_span(&span(at..at + 1), slice, &mut decoded)?;
            let decoded = match keys {
                Some(keys) => CachedFrame::of_keys(decoded, keys),
                None => CachedFrame::whole(decoded),
            };
            self.frame_cache.insert(self.serial, (frames.start + at) as u32, decoded.clone());
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

    /// Whether this table's meta is a partial copy still being fetched.
    pub fn meta_is_partial(&self) -> bool {
        matches!(&self.meta, MetaView::Paged(meta) if meta.partial().is_some())
    }

    /// For a partial meta: fetches from the bucket the pieces lookups of `keys` read that it
    /// lacks (one ranged read each, concurrently), checks them, and keeps them locally.
    pub async fn fetch_meta_for_keys(&self, store: &dyn Store, keys: &[RecordId]) -> Result<(), ReadError> {
        let MetaView::Paged(meta) = &self.meta else { return Ok(()) };
        let hashes: Vec<KeyHash> = keys.iter().filter_map(|key| self.filter_hash(FilterProbe::of_key(key))).collect();
        let ranges: Vec<(E, E)> = keys.iter().map(|key| (E::min_for_key(*key), E::max_for_key(*key))).collect();
        self.fetch_meta_pieces(store, meta, meta.missing_pieces(&hashes, &ranges)).await
    }

    /// For a partial meta: fetches what `frames_overlapping(lo, hi)` reads of the frame index
    /// (the chunks at both ends; a range read asks no filter).
    pub async fn fetch_meta_for_range_ends(&self, store: &dyn Store, lo: E, hi: E) -> Result<(), ReadError> {
        let MetaView::Paged(meta) = &self.meta else { return Ok(()) };
        self.fetch_meta_pieces(store, meta, meta.missing_pieces(&[], &[(lo, lo), (hi, hi)])).await
    }

    /// For a partial meta: fetches the index records of frames `frames`.
    pub async fn fetch_meta_for_frames(&self, store: &dyn Store, frames: Range<usize>) -> Result<(), ReadError> {
        let MetaView::Paged(meta) = &self.meta else { return Ok(()) };
        self.fetch_meta_pieces(store, meta, meta.missing_frame_chunks(frames)).await
    }

    /// Fetches, checks and keeps `pieces` of this table's partial meta `meta`.
    async fn fetch_meta_pieces(
        &self,
        store: &dyn Store,
        meta: &PagedMeta<E>,
        pieces: Vec<MetaPiece>,
    ) -> Result<(), ReadError> {
        if pieces.is_empty() {
            return Ok(());
        }
        let object = self.meta_name();
        let fetches = pieces.iter().map(|piece| store.get_range(&object, piece.offset, piece.len));
        let fetched = futures::future::try_join_all(fetches).await?;
        for (piece, bytes) in pieces.iter().zip(fetched) {
            meta.accept(piece, &bytes).map_err(|source| {
                report_corruption(ObjectKind::Meta, Place::Bucket, &object, &source);
                ReadError::Corrupt { object: object.clone(), source }
            })?;
        }
        Ok(())
    }

    /// For a partial meta: fetches the whole meta, checks it, writes it over the partial copy
    /// and renames that to `meta_path` (durably), so the table opens as any other from now on.
    pub async fn complete_meta(&self, store: &dyn Store, part_path: &Path, meta_path: &Path) -> Result<(), ReadError> {
        let MetaView::Paged(meta) = &self.meta else { return Ok(()) };
        let Some(partial) = meta.partial() else { return Ok(()) };
        let whole = store.get(&self.meta_name()).await?;
        check_fetched_meta::<E>(&self.record, &whole)?;
        let io = |source| ReadError::Io { object: format!("local copy {}", meta_path.display()), source };
        partial.complete(&whole).map_err(io)?;
        std::fs::rename(part_path, meta_path).map_err(io)?;
        crate::base::durable::sync_dir(meta_path.parent().unwrap_or(Path::new("."))).map_err(io)
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

/// A table's local meta file, opened (`opened`): paged, or decoded whole for older versions.
fn open_whole<E: Entry>(
    record: &TableRecord,
    meta_path: &Path,
    opened: std::io::Result<File>,
    meta_cache: Arc<MetaCache<E>>,
    serial: u64,
) -> Result<MetaView<E>, ReadError> {
    let object = format!("{} (local copy {})", table_key(E::TREE, &record.id, "meta"), meta_path.display());
    let io = |source| ReadError::Io { object: object.clone(), source };
    let mut file = opened.map_err(io)?;
    let mut start = [0u8; 6];
    // Too short for any version: the whole decode says so.
    let paged = std::io::Read::read_exact(&mut file, &mut start).is_ok() && is_paged(&start);
    let meta = match paged {
        true => PagedMeta::open(PageSource::File(file), meta_cache, serial).map(MetaView::Paged),
        false => TableMeta::decode(&std::fs::read(meta_path).map_err(io)?).map(MetaView::Resident),
    };
    meta.map_err(|source| meta_error(&object, source))
}

/// A table's partial local meta (its resident part present, the rest fetched on demand).
fn open_partial<E: Entry>(
    record: &TableRecord,
    part_path: &Path,
    meta_cache: Arc<MetaCache<E>>,
    serial: u64,
) -> Result<MetaView<E>, ReadError> {
    let object = format!("{} (partial copy {})", table_key(E::TREE, &record.id, "meta"), part_path.display());
    let io = |source| ReadError::Io { object: object.clone(), source };
    let mut header = vec![0u8; PAGED_HEADER_LEN];
    File::open(part_path).and_then(|file| file.read_exact_at(&mut header, 0)).map_err(io)?;
    let prefix_len = resident_len::<E>(&header).map_err(|source| meta_error(&object, source))?;
    let partial = PartialFile::reopen(part_path, record.meta_len, prefix_len).map_err(io)?;
    PagedMeta::open(PageSource::Partial(partial), meta_cache, serial)
        .map(MetaView::Paged)
        .map_err(|source| meta_error(&object, source))
}

/// Checks a whole meta fetched from the bucket: it decodes, and its sizes are the ones `record`
/// gives. A corrupt one is reported and never written locally.
pub fn check_fetched_meta<E: Entry>(record: &TableRecord, bytes: &[u8]) -> Result<(), ReadError> {
    let key = table_key(E::TREE, &record.id, "meta");
    let checked = TableMeta::<E>::check_encoded(bytes).and_then(|data_len| {
        if bytes.len() as u64 == record.meta_len && data_len == record.data_len {
            return Ok(());
        }
        let detail = format!(
            "meta of {} bytes for {} bytes of data; the manifest says {} and {}",
            bytes.len(),
            data_len,
            record.meta_len,
            record.data_len
        );
        Err(FormatError::Invalid { what: "meta", detail })
    });
    checked.map_err(|source| {
        report_corruption(ObjectKind::Meta, Place::Bucket, &key, &source);
        ReadError::Corrupt { object: key, source }
    })
}

/// Fetches the resident part of a paged meta from the bucket (one ranged read, two when its
/// directory and models are longer than a first guess) and starts a partial copy at `part_path`.
/// A meta of an older version has no pieces to fetch: it is fetched whole and written to
/// `meta_path`.
pub async fn fetch_meta_start<E: Entry>(
    store: &dyn Store,
    record: &TableRecord,
    (meta_path, part_path): (&Path, &Path),
) -> Result<(), ReadError> {
    // Most resident parts fit (a directory is ~90 bytes per 64 frames; models, when a table has
    // them, up to ~30 KB take a second read).
    const FIRST_READ: u64 = 4 * 1024;
    let key = table_key(E::TREE, &record.id, "meta");
    let first = store.get_range(&key, 0, FIRST_READ.min(record.meta_len)).await?;
    if !is_paged(&first) {
        return fetch_whole_meta::<E>(store, record, meta_path).await;
    }
    let corrupt = |source: FormatError| {
        report_corruption(ObjectKind::Meta, Place::Bucket, &key, &source);
        ReadError::Corrupt { object: key.clone(), source }
    };
    // Checked against the manifest before anything is written, as a whole fetch is.
    let (prefix_len, meta_len, data_len) = declared_lengths::<E>(&first).map_err(corrupt)?;
    if (meta_len, data_len) != (record.meta_len, record.data_len) {
        let detail = format!(
            "a meta of {meta_len} bytes for {data_len} bytes of data; the manifest says {} and {}",
            record.meta_len, record.data_len
        );
        return Err(corrupt(FormatError::Invalid { what: "meta", detail }));
    }
    let prefix = match prefix_len <= first.len() as u64 {
        true => first.slice(..prefix_len as usize),
        false => store.get_range(&key, 0, prefix_len).await?,
    };
    crate::lsm::bytes::verify_checksum("paged meta resident part", &prefix).map_err(corrupt)?;
    PartialFile::create(part_path, record.meta_len, &prefix).map(drop).map_err(local_io(&key, part_path))
}

/// Fetches table `record`'s whole meta from the bucket, checks it and writes it to `meta_path`.
pub async fn fetch_whole_meta<E: Entry>(
    store: &dyn Store,
    record: &TableRecord,
    meta_path: &Path,
) -> Result<(), ReadError> {
    let key = table_key(E::TREE, &record.id, "meta");
    let whole = store.get(&key).await?;
    check_fetched_meta::<E>(record, &whole)?;
    crate::base::durable::write_durably(meta_path, &whole).map_err(local_io(&key, meta_path))
}

/// The error of local I/O on `path`, a copy of the object `key`.
fn local_io(key: &str, path: &Path) -> impl FnOnce(std::io::Error) -> ReadError {
    let object = format!("{key} (local copy {})", path.display());
    move |source| ReadError::Io { object, source }
}

/// The error of a meta read that failed: unreadable (I/O), or corrupt (reported).
fn meta_error(object: &str, source: FormatError) -> ReadError {
    match source {
        FormatError::Unreadable { detail, .. } => {
            ReadError::Io { object: object.to_string(), source: std::io::Error::other(detail) }
        }
        source => {
            report_corruption(ObjectKind::Meta, Place::Local, object, &source);
            ReadError::Corrupt { object: object.to_string(), source }
        }
    }
}

/// A scan's batch of frames: read and checked by their checksums, decoded one at a time.
pub struct ScanBatch<E> {
    first_index: usize,
    /// The batch's index records and the next frame's, if any.
    infos: Vec<FrameInfo<E>>,
    count: usize,
    start: u64,
    bytes: Bytes,
    place: Place,
    decoded: usize,
}

/// `tables/<tree>/<id>.<ext>`: the object key of a table file.
pub fn table_key(tree: TreeKind, id: &str, ext: &str) -> String {
    format!("tables/{tree}/{id}.{ext}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::entry::within;
    use crate::lsm::record::RunKind;
    use crate::lsm::table::{TableOptions, write_table};
    use crate::model::ids::Backlink;
    use crate::store::dir::DirStore;
    use proptest::prelude::*;

    /// A table of `entries` (sorted) on local disk, opened with a frame cache of `cache_bytes`.
    fn open_table(dir: &Path, entries: &[Backlink], cache_bytes: usize) -> TableHandle<Backlink> {
        let options = TableOptions { frame_bytes: 64 * 8, ..TableOptions::default() };
        let data_path = dir.join("t.data");
        let (_, meta, summary) = write_table(File::create(&data_path).unwrap(), entries, &options).unwrap();
        std::fs::write(dir.join("t.meta"), meta).unwrap();
        let run = ("r".to_string(), RunKind::Delta);
        let record = TableRecord::written(TreeKind::Links, "t".into(), run, (0, 1), &summary);
        let caches = (FrameCache::new(cache_bytes), MetaCache::new(1 << 20));
        TableHandle::open(record, (&dir.join("t.meta"), &dir.join("t.part"), data_path), caches).unwrap()
    }

    /// Entries of `targets` targets with a number of backlinks each: small targets share frames.
    fn entries(counts: &[usize]) -> Vec<Backlink> {
        let mut out = Vec::new();
        for (t, &count) in counts.iter().enumerate() {
            for s in 0..count as u64 {
                let source = RecordId { rkey: s, collection: 1, did: s % 7 };
                out.push(Backlink { target: RecordId::repo(t as u64 * 2), source, location: 3, source_rev: s });
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the cache holds of a frame (a part for some keys, the whole), a read of a span
        /// of keys finds every entry of those keys, and a whole read the whole frames.
        #[test]
        fn reads_through_cached_parts_answer_as_the_table(
            counts in prop::collection::vec(0usize..40, 1..30),
            reads in prop::collection::vec((0u64..62, 0u64..4, any::<bool>()), 1..60),
            cache_bytes in prop::sample::select(vec![0usize, 2_000, 1 << 20]),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let all = entries(&counts);
            prop_assume!(!all.is_empty());
            let table = open_table(dir.path(), &all, cache_bytes);
            let store = DirStore::new(dir.path().join("bucket"));
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            for (lo, width, whole) in reads {
                let (lo, hi) = (RecordId::repo(lo), RecordId::repo(lo + width));
                let (min, max) = (Backlink::min_for_key(lo), Backlink::max_for_key(hi));
                let frames = table.frames_overlapping(&min, &max).unwrap();
                let want: Vec<Backlink> = all.iter().filter(|e| lo <= e.target && e.target <= hi).copied().collect();
                let found: Vec<Backlink> = if whole {
                    let read = runtime.block_on(table.read_frames(&store, frames.clone())).unwrap();
                    let (start, end) = (frames.start, frames.end);
                    let expected: usize = (start..end).map(|i| table.frame_infos(i..i + 1, PageUse::Lookup).unwrap()[0].entries as usize).sum();
                    prop_assert_eq!(read.len(), expected, "a whole read gives whole frames");
                    read.into_iter().filter(|e| min <= *e && *e <= max).collect()
                } else {
                    let slices = runtime.block_on(table.read_frame_slices(&store, frames, (lo, hi))).unwrap();
                    slices.iter().flat_map(|s| within(s, &min, &max).to_vec()).collect()
                };
                prop_assert_eq!(found, want);
            }
        }
    }

    #[test]
    fn a_small_key_is_cached_as_its_part_and_a_second_key_gets_the_whole_frame() {
        let dir = tempfile::tempdir().unwrap();
        let all = entries(&[1, 1, 1, 1, 1, 1, 1, 1]); // one frame of eight targets
        let table = open_table(dir.path(), &all, 1 << 20);
        assert_eq!(table.frame_count(), 1);
        let store = DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let key = |t: u64| (RecordId::repo(t * 2), RecordId::repo(t * 2));
        let read = |t: u64| runtime.block_on(table.read_frame_slices(&store, 0..1, key(t))).unwrap();
        assert_eq!(read(1)[0].len(), 1, "one target of eight: its part");
        assert_eq!(table.frame_cache.get(table.serial, 0).unwrap().len(), 1);
        assert_eq!(read(1)[0].len(), 1, "found again");
        assert_eq!(table.frame_cache.hits_and_misses(), (2, 1));
        assert_eq!(read(5)[0].len(), 8, "another key of the frame: kept whole");
        assert!(table.frame_cache.get(table.serial, 0).unwrap().is_whole());
    }

    /// A scan holds its batch compressed and decodes it a frame at a time; a local copy that
    /// fails its checksums is read from the bucket when the bucket has the table, and is a named
    /// error when it is the only copy.
    #[test]
    fn a_scan_decodes_its_batches_frame_by_frame_and_reads_past_a_corrupt_local_copy() {
        use crate::lsm::scan::TableScan;
        let all = entries(&[300, 1, 40, 900, 2, 2, 2, 500]);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for uploaded in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let table = Arc::new(open_table(dir.path(), &all, 1 << 20));
            assert!(table.frame_count() > 20, "{} frames", table.frame_count());
            let store = DirStore::new(dir.path().join("bucket"));
            let data = std::fs::read(dir.path().join("t.data")).unwrap();
            runtime.block_on(store.put(&table.data_key(), data.clone().into())).unwrap();
            if uploaded {
                table.mark_uploaded();
            }
            let mut flipped = data;
            let at = flipped.len() / 2;
            flipped[at] ^= 0x40;
            std::fs::write(dir.path().join("t.data"), flipped).unwrap();
            let mut scan = TableScan::new(table.clone(), 4).unwrap();
            let mut read = Vec::new();
            let outcome = loop {
                match scan.next(&store, runtime.handle()) {
                    Ok(Some(entry)) => read.push(entry),
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            if uploaded {
                outcome.unwrap();
                assert_eq!(read, all, "every entry, the damaged ones from the bucket");
            } else {
                let error = outcome.unwrap_err().to_string();
                assert!(error.contains("local copy"), "{error}");
                assert!(read.len() < all.len() && all.starts_with(&read), "only entries before the damage");
            }
        }
    }
}
