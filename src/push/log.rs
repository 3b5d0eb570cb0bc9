//! The change log: every push event of the last hours, on local disk, in cursor order, so a
//! subscriber can resume from a cursor and the hub can follow the newest entries.
//!
//! The log is a directory of segment files `NNNNNNNNNN-CURSOR.log` (a sequence number and the
//! first cursor the segment holds), each a run of frames `len u32, xxh3-64 of the body u64,
//! body` (an `Entry`). Once sealed, a segment is packed (`packed`: `NNNNNNNNNN-CURSOR.logz`) by a
//! thread of its own at the lowest priority; offsets stay those of the frames as written. One writer appends (the ingest engine's feed); any number of readers follow.
//! A new segment starts at the first entry after a publish once the current one reaches
//! `segment_bytes` (never within a batch, so a crash keeps all of an event's entries or none;
//! within a batch only near `MAX_SEGMENT_BYTES`); the oldest segments are
//! deleted once a newer one starts more than `retain_us` before the newest cursor, or the log is
//! over `max_bytes`.
//!
//! Invariants:
//! - Cursors are strictly increasing through the log, across segments.
//! - Readers never read past the published end (`LogEnd`): bytes are written before the end is
//!   moved over them, so a reader never sees half an entry.
//! - A frame is believed only when its checksum matches; on open, the last segment is cut at its
//!   first bad frame (a write the process did not finish), and a bad frame met by a reader is an
//!   error, never an event.
//! - Bytes in the log are durable after `sync`; before that they survive a crash of the process
//!   (they are in the kernel's page cache) but not of the machine.
//! - A sealed segment is readable throughout its packing: the packed file is renamed into place
//!   before the plain one goes, and readers look for the plain file first, then the packed one
//!   (a reader holding the plain file open keeps reading it). A retired segment leaves the list
//!   before its files go, and the packer removes what it packed for a segment no longer listed.

use super::PushError;
use super::entry::{Entry, MAX_ENTRY_BYTES};
use super::frame::{FRAME_HEADER, frame_in, header_fields};
use super::packed::{PackedSegment, pack};
use crate::base::durable::sync_dir;
use crate::base::priority::lower_this_thread;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use xxhash_rust::xxh3::xxh3_64;

/// Bytes a reader asks the kernel for at once.
const READ_CHUNK: usize = 256 << 10;
/// Segments may not reach 4 GiB: positions keep offsets in 32 bits.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone)]
pub struct LogOptions {
    /// A new segment starts past this size.
    pub segment_bytes: u64,
    /// Keep at least this much of the newest history (in cursor microseconds), unless over
    /// `max_bytes`.
    pub retain_us: i64,
    /// The most the log may hold on disk (plus one segment).
    pub max_bytes: u64,
    /// Pack sealed segments (`packed`) on a thread of the log's own.
    pub pack: bool,
}

/// The packer's priority: below everything else the server does.
const PACKER_NICE: i32 = 19;

/// Where an entry is: its segment and offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: u32,
    pub offset: u32,
}

impl Position {
    pub fn packed(self) -> i64 {
        ((self.segment as i64) << 32) | self.offset as i64
    }

    pub fn unpacked(packed: i64) -> Self {
        Position { segment: (packed >> 32) as u32, offset: packed as u32 }
    }
}

/// How far the log is written: readers stop there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    pub segment: u32,
    pub offset: u64,
    /// The newest cursor written (0: none yet).
    pub last_cursor: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    number: u32,
    first_cursor: i64,
    bytes: u64,
}

/// What the writer and every reader share.
pub struct LogShared {
    dir: PathBuf,
    /// What readers may read; readers that want more wait for it to move.
    end: tokio::sync::watch::Sender<LogEnd>,
    segments: Mutex<Vec<Segment>>,
}

impl LogShared {
    pub fn end(&self) -> LogEnd {
        *self.end.borrow()
    }

    /// Resolves once the log has published a cursor past `cursor` (at once if it has).
    pub async fn published_past(&self, cursor: i64) {
        let mut end = self.end.subscribe();
        // The sender lives as long as `self`: waiting cannot end in an error.
        let _ = end.wait_for(|end| end.last_cursor > cursor).await;
    }

    /// The oldest cursor still in the log, if any (read from the oldest segment's first frame).
    pub fn oldest_cursor(&self) -> Option<i64> {
        let first = self.segments.lock().expect("segments lock poisoned").first().copied()?;
        let mut reader = ChunkReader::new(self.open(first).ok()??).ok()?;
        match reader.lookup(0) {
            Ok(Some(Ok(entry))) => Some(entry.first_cursor),
            _ => None,
        }
    }

    pub fn oldest_segment(&self) -> u32 {
        self.segments.lock().expect("segments lock poisoned").first().map_or(0, |s| s.number)
    }

    fn path_of(&self, segment: Segment) -> PathBuf {
        segment_path(&self.dir, segment)
    }

    fn packed_path_of(&self, segment: Segment) -> PathBuf {
        self.path_of(segment).with_extension("logz")
    }

    /// The segment's file, plain or packed (`None`: retired).
    fn open(&self, segment: Segment) -> Result<Option<SegmentFile>, PushError> {
        let path = self.path_of(segment);
        match File::open(&path) {
            Ok(file) => return Ok(Some(SegmentFile::Plain(file))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(PushError::io(&path, e)),
        }
        let packed = self.packed_path_of(segment);
        match File::open(&packed) {
            Ok(file) => {
                PackedSegment::open(file).map(|p| Some(SegmentFile::Packed(p))).map_err(|e| PushError::io(&packed, e))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(PushError::io(&packed, e)),
        }
    }

    /// Sealed segments (numbered below `current`) still as written.
    fn unpacked_sealed(&self, current: u32) -> Vec<Segment> {
        let segments = self.segments.lock().expect("segments lock poisoned").clone();
        segments.into_iter().filter(|s| s.number < current && self.path_of(*s).exists()).collect()
    }

    /// Packs sealed `segment` and removes it as written (module invariants: it stays readable
    /// throughout; a segment retired meanwhile loses the packed file too).
    fn pack_segment(&self, segment: Segment) -> Result<(), PushError> {
        let (plain, packed) = (self.path_of(segment), self.packed_path_of(segment));
        let packed_bytes = match pack(&plain, &packed) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(PushError::io(&plain, e)),
        };
        sync_dir(&self.dir).map_err(|e| PushError::io(&self.dir, e))?;
        if self.segment(segment.number).is_none() {
            return remove_if_there(&packed);
        }
        remove_if_there(&plain)?;
        let mut segments = self.segments.lock().expect("segments lock poisoned");
        if let Some(listed) = segments.iter_mut().find(|s| s.number == segment.number) {
            listed.bytes = packed_bytes;
        }
        Ok(())
    }

    fn segment(&self, number: u32) -> Option<Segment> {
        self.segments.lock().expect("segments lock poisoned").iter().find(|s| s.number == number).copied()
    }

    /// The segment to read from for events after `cursor`: the last one starting at or before
    /// the next cursor, or the oldest.
    fn segment_for(&self, cursor: i64) -> Option<Segment> {
        let segments = self.segments.lock().expect("segments lock poisoned");
        let later = segments.partition_point(|s| s.first_cursor <= cursor.saturating_add(1));
        segments.get(later.saturating_sub(1)).copied()
    }
}

/// The writing side.
pub struct ChangeLog {
    shared: Arc<LogShared>,
    options: LogOptions,
    file: File,
    current: Segment,
    /// Bytes of the current segment on disk; `pending` follows them.
    written: u64,
    pending: Vec<u8>,
    last_cursor: i64,
    /// The sealed segment `read_at` read last, kept open for the next lookup.
    looked_up: Option<(u32, ChunkReader)>,
    /// Sealed segments to pack (`None` when the options say not to).
    packer: Option<Packer>,
}

impl ChangeLog {
    /// Opens (creating) the log in `dir`, cutting a torn tail off the last segment.
    pub fn open(dir: &Path, options: LogOptions) -> Result<Self, PushError> {
        assert!(options.segment_bytes > 0 && options.segment_bytes <= MAX_SEGMENT_BYTES);
        std::fs::create_dir_all(dir).map_err(|e| PushError::io(dir, e))?;
        let mut segments = list_segments(dir)?;
        let shared_dir = dir.to_owned();
        if segments.is_empty() {
            segments.push(Segment { number: 0, first_cursor: 0, bytes: 0 });
        }
        let current = *segments.last().expect("one segment at least");
        let path = segment_path(&shared_dir, current);
        let file =
            OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(|e| PushError::io(&path, e))?;
        let (valid, last_in_current) = scan_valid(&file, &path)?;
        if valid < file.metadata().map_err(|e| PushError::io(&path, e))?.len() {
            tracing::warn!(path = %path.display(), valid, "cutting a torn tail off the change log");
            file.set_len(valid).map_err(|e| PushError::io(&path, e))?;
        }
        let mut last_cursor = last_in_current;
        if last_cursor.is_none() && segments.len() > 1 {
            let previous = segments[segments.len() - 2];
            let previous_path = segment_path(&shared_dir, previous);
            let previous_file = File::open(&previous_path).map_err(|e| PushError::io(&previous_path, e))?;
            last_cursor = scan_valid(&previous_file, &previous_path)?.1;
        }
        let last_cursor = last_cursor.unwrap_or(0);
        segments.last_mut().expect("one segment at least").bytes = valid;
        let end = LogEnd { segment: current.number, offset: valid, last_cursor };
        let shared = Arc::new(LogShared {
            dir: shared_dir,
            end: tokio::sync::watch::Sender::new(end),
            segments: Mutex::new(segments),
        });
        let current = Segment { bytes: valid, ..current };
        let packer = options.pack.then(|| start_packer(shared.clone()));
        if let Some(packer) = &packer {
            shared.unpacked_sealed(current.number).into_iter().for_each(|sealed| packer.send(sealed));
        }
        let pending = vec![];
        Ok(ChangeLog { shared, options, file, current, written: valid, pending, last_cursor, looked_up: None, packer })
    }

    pub fn shared(&self) -> &Arc<LogShared> {
        &self.shared
    }

    /// The newest cursor appended (published or not).
    pub fn last_cursor(&self) -> i64 {
        self.last_cursor
    }

    /// Adds an entry (readers see it after `publish`); returns where it is.
    pub fn append(&mut self, entry: &Entry) -> Result<Position, PushError> {
        assert!(entry.first_cursor > self.last_cursor, "cursors increase through the log");
        // A new segment starts only after a publish, that is between the feed's events (starting
        // one writes what is pending): a crash can then never keep some of one event's entries
        // and lose the others. Unless the segment would near the limit of its offsets.
        let size = self.written + self.pending.len() as u64;
        if size >= self.options.segment_bytes && (self.pending.is_empty() || size >= MAX_SEGMENT_BYTES / 2) {
            self.start_segment(entry.first_cursor)?;
        }
        let offset = self.written + self.pending.len() as u64;
        let start = self.pending.len();
        self.pending.extend_from_slice(&[0; FRAME_HEADER]);
        entry.encode(&mut self.pending);
        let body = &self.pending[start + FRAME_HEADER..];
        let (len, checksum) = (body.len() as u32, xxh3_64(body));
        self.pending[start..start + 4].copy_from_slice(&len.to_le_bytes());
        self.pending[start + 4..start + FRAME_HEADER].copy_from_slice(&checksum.to_le_bytes());
        self.last_cursor = entry.last_cursor();
        Ok(Position { segment: self.current.number, offset: offset as u32 })
    }

    /// Writes what was appended and lets readers see it.
    pub fn publish(&mut self) -> Result<(), PushError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.pending).map_err(|e| PushError::io(&self.current_path(), e))?;
        self.written += self.pending.len() as u64;
        self.pending.clear();
        self.current.bytes = self.written;
        self.set_segment_bytes(self.current.number, self.written);
        self.shared.end.send_replace(LogEnd {
            segment: self.current.number,
            offset: self.written,
            last_cursor: self.last_cursor,
        });
        Ok(())
    }

    /// Makes everything published durable.
    pub fn sync(&mut self) -> Result<(), PushError> {
        self.file.sync_data().map_err(|e| PushError::io(&self.current_path(), e))
    }

    /// Reads the entry at `position` (published or still pending); `None` when its segment is
    /// gone from the log.
    pub fn read_at(&mut self, position: Position) -> Result<Option<Entry>, PushError> {
        if position.segment == self.current.number && position.offset as u64 >= self.written {
            let start = (position.offset as u64 - self.written) as usize;
            // Past the end: a position from before a crash whose entry was never written out.
            let Some(pending) = self.pending.get(start..).filter(|rest| !rest.is_empty()) else { return Ok(None) };
            let (body, _) = frame_in(pending).map_err(|reason| self.corrupt(position, reason))?;
            return Entry::decode(body).map(Some).map_err(|reason| self.corrupt(position, reason));
        }
        let Some(segment) = self.shared.segment(position.segment) else { return Ok(None) };
        let path = self.shared.path_of(segment);
        let frame = if segment.number == self.current.number {
            exact_frame_at(&self.file, position.offset as u64, self.written)
        } else {
            let mut reader = match self.looked_up.take().filter(|(number, _)| *number == segment.number) {
                Some((_, reader)) => reader,
                None => match self.shared.open(segment)? {
                    Some(file) => ChunkReader::new(file).map_err(|e| PushError::io(&path, e))?,
                    None => return Ok(None),
                },
            };
            let frame = reader.lookup(position.offset as u64);
            self.looked_up = Some((segment.number, reader));
            frame
        };
        match frame.map_err(|e| PushError::io(&path, e))? {
            Some(Ok(entry)) => Ok(Some(entry)),
            Some(Err(reason)) => Err(self.corrupt(position, reason)),
            None => Err(self.corrupt(position, "no frame there".into())),
        }
    }

    fn corrupt(&self, position: Position, reason: String) -> PushError {
        PushError::Corrupt(format!("change log segment {} offset {}: {reason}", position.segment, position.offset))
    }

    fn current_path(&self) -> PathBuf {
        self.shared.path_of(self.current)
    }

    fn set_segment_bytes(&self, number: u32, bytes: u64) {
        let mut segments = self.shared.segments.lock().expect("segments lock poisoned");
        if let Some(segment) = segments.iter_mut().find(|s| s.number == number) {
            segment.bytes = bytes;
        }
    }

    /// Seals the current segment (written and synced) and starts the next at `first_cursor`,
    /// then lets old segments go.
    fn start_segment(&mut self, first_cursor: i64) -> Result<(), PushError> {
        self.publish()?;
        self.sync()?;
        let next = Segment { number: self.current.number + 1, first_cursor, bytes: 0 };
        let path = self.shared.path_of(next);
        self.file =
            OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(|e| PushError::io(&path, e))?;
        sync_dir(&self.shared.dir).map_err(|e| PushError::io(&self.shared.dir, e))?;
        self.shared.segments.lock().expect("segments lock poisoned").push(next);
        let sealed = std::mem::replace(&mut self.current, next);
        if let Some(packer) = &self.packer {
            packer.send(sealed);
        }
        self.written = 0;
        // Readers move to the new segment once the end does.
        self.shared.end.send_replace(LogEnd { segment: next.number, offset: 0, last_cursor: self.last_cursor });
        self.retire_old_segments()
    }

    fn retire_old_segments(&mut self) -> Result<(), PushError> {
        let newest = self.last_cursor;
        loop {
            let doomed = {
                let segments = self.shared.segments.lock().expect("segments lock poisoned");
                let total: u64 = segments.iter().map(|s| s.bytes).sum();
                let too_old =
                    segments.len() > 1 && segments[1].first_cursor < newest.saturating_sub(self.options.retain_us);
                let too_big = segments.len() > 1 && total > self.options.max_bytes;
                (too_old || too_big).then(|| segments[0])
            };
            let Some(doomed) = doomed else { return Ok(()) };
            // Unlisted first: a packer that finishes after this removes what it wrote.
            self.shared.segments.lock().expect("segments lock poisoned").retain(|s| s.number != doomed.number);
            remove_if_there(&self.shared.path_of(doomed))?;
            remove_if_there(&self.shared.packed_path_of(doomed))?;
        }
    }
}

/// A follower of the log, from a cursor on.
pub struct LogReader {
    shared: Arc<LogShared>,
    segment: Option<Segment>,
    reader: Option<ChunkReader>,
    offset: u64,
    /// Entries whose last cursor is at or below this are skipped.
    after: i64,
}

/// Where a reader starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadStart {
    /// The oldest cursor in the log when the reader started (`None`: the log is empty).
    pub oldest_cursor: Option<i64>,
    /// The requested cursor is older than the log: the reader starts at the log's start.
    pub from_log_start: bool,
}

impl LogReader {
    /// A reader of the events after `cursor`.
    pub fn after(shared: Arc<LogShared>, cursor: i64) -> Self {
        let segment = shared.segment_for(cursor);
        LogReader { shared, segment, reader: None, offset: 0, after: cursor }
    }

    /// Where a reader after `cursor` starts, as a subscriber is told.
    pub fn start_of(shared: &LogShared, cursor: i64) -> ReadStart {
        let oldest_cursor = shared.oldest_cursor();
        let from_log_start = oldest_cursor.is_some_and(|oldest| cursor.saturating_add(1) < oldest);
        ReadStart { oldest_cursor, from_log_start }
    }

    /// The next entry with an event after the reader's cursor, or `None` at the published end.
    /// An entry may hold events at or before the cursor too: the caller skips those.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, PushError> {
        Ok(self.next_with_position()?.map(|(_, entry)| entry))
    }

    /// `next`, with where the entry is.
    pub fn next_with_position(&mut self) -> Result<Option<(Position, Entry)>, PushError> {
        loop {
            let end = self.shared.end();
            let Some(segment) = self.segment else {
                // The log was empty when the reader started.
                self.segment = self.shared.segment(end.segment);
                if self.segment.is_none() {
                    return Ok(None);
                }
                continue;
            };
            let sealed = segment.number < end.segment;
            let limit = if sealed { self.sealed_length(segment)? } else { end.offset };
            if self.offset >= limit {
                if !sealed {
                    return Ok(None);
                }
                self.next_segment(segment)?;
                continue;
            }
            let reader = match &mut self.reader {
                Some(reader) => reader,
                None => self.reader.insert(self.open(segment)?),
            };
            reader.limit = limit;
            let path = self.shared.path_of(segment);
            let position = Position { segment: segment.number, offset: self.offset as u32 };
            let entry = match reader.frame_at(self.offset).map_err(|e| PushError::io(&path, e))? {
                Some(Ok((entry, length))) => {
                    self.offset += length;
                    entry
                }
                Some(Err(reason)) => {
                    return Err(PushError::Corrupt(format!("{} at {}: {reason}", path.display(), self.offset)));
                }
                None => {
                    return Err(PushError::Corrupt(format!(
                        "{}: a frame cut short at {}",
                        path.display(),
                        self.offset
                    )));
                }
            };
            if entry.last_cursor() > self.after {
                return Ok(Some((position, entry)));
            }
        }
    }

    fn open(&self, segment: Segment) -> Result<ChunkReader, PushError> {
        let file = self.shared.open(segment)?.ok_or(PushError::Behind)?;
        ChunkReader::new(file).map_err(|e| PushError::io(&self.shared.path_of(segment), e))
    }

    fn sealed_length(&mut self, segment: Segment) -> Result<u64, PushError> {
        if self.reader.is_none() {
            self.reader = Some(self.open(segment)?);
        }
        let reader = self.reader.as_ref().expect("opened above");
        reader.source.plain_len().map_err(|e| PushError::io(&self.shared.path_of(segment), e))
    }

    fn next_segment(&mut self, segment: Segment) -> Result<(), PushError> {
        let next = self.shared.segment(segment.number + 1).ok_or(PushError::Behind)?;
        self.segment = Some(next);
        self.reader = None;
        self.offset = 0;
        Ok(())
    }
}

/// A segment's file: as written, or packed once sealed.
enum SegmentFile {
    Plain(File),
    Packed(PackedSegment),
}

impl SegmentFile {
    /// The segment's length as written.
    fn plain_len(&self) -> std::io::Result<u64> {
        match self {
            SegmentFile::Plain(file) => file.metadata().map(|m| m.len()),
            SegmentFile::Packed(packed) => Ok(packed.plain_len()),
        }
    }
}

/// Positioned reads of one segment through a buffer (a chunk of a plain file, a block of a
/// packed one), never past `limit`.
struct ChunkReader {
    source: SegmentFile,
    limit: u64,
    buffer: Vec<u8>,
    buffer_offset: u64,
}

/// The frame at `offset` of `file`, read with two exact reads (a lookup wants one frame, not a
/// chunk); `None` when it runs past `limit`.
fn exact_frame_at(file: &File, offset: u64, limit: u64) -> std::io::Result<Option<Result<Entry, String>>> {
    if offset + FRAME_HEADER as u64 > limit {
        return Ok(None);
    }
    let mut header = [0; FRAME_HEADER];
    file.read_exact_at(&mut header, offset)?;
    let (len, checksum) = header_fields(&header);
    if len > MAX_ENTRY_BYTES {
        return Ok(Some(Err(format!("a frame of {len} bytes"))));
    }
    if offset + (FRAME_HEADER + len) as u64 > limit {
        return Ok(None);
    }
    let mut body = vec![0; len];
    file.read_exact_at(&mut body, offset + FRAME_HEADER as u64)?;
    if xxh3_64(&body) != checksum {
        return Ok(Some(Err("checksum mismatch".into())));
    }
    Ok(Some(Entry::decode(&body)))
}

impl ChunkReader {
    /// A reader of `source` up to its length as written (a follower of the current segment moves
    /// `limit` on as the log's end does).
    fn new(source: SegmentFile) -> std::io::Result<Self> {
        let limit = source.plain_len()?;
        Ok(ChunkReader { source, limit, buffer: vec![], buffer_offset: 0 })
    }

    /// The bytes `[offset, offset + len)`, or `None` past the limit.
    fn bytes(&mut self, offset: u64, len: usize) -> std::io::Result<Option<&[u8]>> {
        if offset + len as u64 > self.limit {
            return Ok(None);
        }
        let buffered =
            offset >= self.buffer_offset && offset + len as u64 <= self.buffer_offset + self.buffer.len() as u64;
        if !buffered {
            self.fill(offset, len)?;
        }
        let start = (offset - self.buffer_offset) as usize;
        Ok(Some(&self.buffer[start..start + len]))
    }

    /// Reads into the buffer what holds `[offset, offset + len)`: a chunk from `offset` of a plain
    /// file, the block holding `offset` of a packed one (frames never span blocks).
    fn fill(&mut self, offset: u64, len: usize) -> std::io::Result<()> {
        match &mut self.source {
            SegmentFile::Plain(file) => {
                let want = (len.max(READ_CHUNK) as u64).min(self.limit - offset) as usize;
                self.buffer.resize(want, 0);
                file.read_exact_at(&mut self.buffer, offset)?;
                self.buffer_offset = offset;
            }
            SegmentFile::Packed(packed) => {
                self.buffer_offset = packed.block_at(offset, &mut self.buffer)?.unwrap_or(offset);
                if offset + len as u64 > self.buffer_offset + self.buffer.len() as u64 {
                    self.buffer.clear();
                    let detail = format!("{len} bytes at {offset} are not in one block");
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, detail));
                }
            }
        }
        Ok(())
    }

    /// The frame at `offset`, for a lookup of one entry: two exact reads of a plain file (not a
    /// chunk), its block of a packed one (kept for the next lookup).
    fn lookup(&mut self, offset: u64) -> std::io::Result<Option<Result<Entry, String>>> {
        match &self.source {
            SegmentFile::Plain(file) => exact_frame_at(file, offset, self.limit.max(offset)),
            SegmentFile::Packed(_) => Ok(self.frame_at(offset)?.map(|frame| frame.map(|(entry, _)| entry))),
        }
    }

    /// The frame at `offset` decoded with its length, a reason it is bad, or `None` when it
    /// runs past the limit.
    fn frame_at(&mut self, offset: u64) -> std::io::Result<Option<Result<(Entry, u64), String>>> {
        let Some(header) = self.bytes(offset, FRAME_HEADER)? else { return Ok(None) };
        let (len, checksum) = header_fields(header);
        if len > MAX_ENTRY_BYTES {
            return Ok(Some(Err(format!("a frame of {len} bytes"))));
        }
        let Some(body) = self.bytes(offset + FRAME_HEADER as u64, len)? else { return Ok(None) };
        if xxh3_64(body) != checksum {
            return Ok(Some(Err("checksum mismatch".into())));
        }
        Ok(Some(Entry::decode(body).map(|entry| (entry, (FRAME_HEADER + len) as u64))))
    }
}

/// How many leading bytes of a segment are whole, valid frames, and the last cursor in them.
fn scan_valid(file: &File, path: &Path) -> Result<(u64, Option<i64>), PushError> {
    let file = SegmentFile::Plain(file.try_clone().map_err(|e| PushError::io(path, e))?);
    let mut reader = ChunkReader::new(file).map_err(|e| PushError::io(path, e))?;
    let (mut offset, mut last) = (0, None);
    while let Some(Ok((entry, len))) = reader.frame_at(offset).map_err(|e| PushError::io(path, e))? {
        if last.is_some_and(|last| entry.first_cursor <= last) {
            break;
        }
        last = Some(entry.last_cursor());
        offset += len;
    }
    Ok((offset, last))
}

/// The segments in `dir`, plain or packed. What a packer left behind is cleared: a packed file
/// it did not finish, and a plain file whose packed one is in place.
fn list_segments(dir: &Path) -> Result<Vec<Segment>, PushError> {
    let mut segments: Vec<(Segment, bool)> = vec![];
    for item in std::fs::read_dir(dir).map_err(|e| PushError::io(dir, e))? {
        let item = item.map_err(|e| PushError::io(dir, e))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".logz.tmp") {
            remove_if_there(&item.path())?;
            continue;
        }
        let Some((number, first_cursor, packed)) = parse_segment_name(name) else { continue };
        let bytes = item.metadata().map_err(|e| PushError::io(&item.path(), e))?.len();
        segments.push((Segment { number, first_cursor, bytes }, packed));
    }
    segments.sort_by_key(|(s, packed)| (s.number, !packed));
    let mut listed: Vec<Segment> = Vec::with_capacity(segments.len());
    for (segment, packed) in segments {
        if listed.last().is_some_and(|last| last.number == segment.number) {
            assert!(!packed, "the packed file of a segment comes first");
            remove_if_there(&segment_path(dir, segment))?;
            continue;
        }
        listed.push(segment);
    }
    Ok(listed)
}

/// The file of `segment` as written: `NNNNNNNNNN-CURSOR.log` in `dir`.
fn segment_path(dir: &Path, segment: Segment) -> PathBuf {
    dir.join(format!("{:010}-{}.log", segment.number, segment.first_cursor))
}

/// A segment file's number, first cursor, and whether it is packed.
fn parse_segment_name(name: &str) -> Option<(u32, i64, bool)> {
    let (stem, packed) = match name.strip_suffix(".logz") {
        Some(stem) => (stem, true),
        None => (name.strip_suffix(".log")?, false),
    };
    let (number, cursor) = stem.split_once('-')?;
    Some((number.parse().ok()?, cursor.parse().ok()?, packed))
}

fn remove_if_there(path: &Path) -> Result<(), PushError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PushError::io(path, e)),
    }
}

/// The packer: a thread that packs the sealed segments it is sent, one at a time, until the log
/// is dropped. Dropping it stops the thread after the segment it is packing and waits for it, so
/// that no packer outlives its log (one left running would remove files of segments its log had
/// retired while a log opened again on the directory lists them).
struct Packer {
    sender: Option<mpsc::Sender<Segment>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Packer {
    fn send(&self, segment: Segment) {
        // The thread ends only with the packer: a send cannot fail while it is alive.
        if let Some(sender) = &self.sender {
            let _ = sender.send(segment);
        }
    }
}

impl Drop for Packer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn start_packer(shared: Arc<LogShared>) -> Packer {
    let (sender, segments) = mpsc::channel::<Segment>();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let spawned = std::thread::Builder::new().name("log-packer".into()).spawn(move || {
        lower_this_thread(PACKER_NICE);
        for segment in segments {
            if stopped.load(Ordering::Relaxed) {
                return;
            }
            if let Err(error) = shared.pack_segment(segment) {
                tracing::warn!(%error, segment = segment.number, "could not pack a change-log segment (it stays as written)");
            }
        }
    });
    let thread =
        spawned.map_err(|error| tracing::warn!(%error, "no change-log packer: sealed segments stay as written"));
    Packer { sender: Some(sender), stop, thread: thread.ok() }
}
