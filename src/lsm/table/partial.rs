//! A partial local copy of a paged meta (`<id>.part`): a file of the meta's full length in which
//! only the byte ranges fetched so far are written, and the record of which those are. A replica
//! fetches a table's header and directory when it follows a manifest, then the filter pages and
//! index chunks its queries need, so it answers without first downloading every meta.
//!
//! Invariants:
//! - A byte is read from the file only inside a range recorded as present; a read that reaches
//!   outside fails (`FormatError::Unreadable`), it never returns the file's unwritten zeros.
//! - A range is recorded as present only after its bytes were written, and only bytes already
//!   checked against their own checksums are offered (`PagedMeta::accept`).
//! - The file always holds the meta's resident part (header, directory, models) from offset 0:
//!   it is created with it, and reopening keeps exactly it (what else was fetched before a
//!   restart is fetched again when needed).
//! - The present ranges are few: filter pages and index chunks merge as they touch, and there is
//!   at most one per page or chunk of the meta.

use crate::lsm::bytes::FormatError;
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

const WHAT: &str = "partial meta";

#[derive(Debug)]
pub struct PartialFile {
    file: File,
    len: u64,
    /// Sorted, disjoint, non-adjacent byte ranges written so far.
    present: Mutex<Vec<Range<u64>>>,
    /// Every byte is present (a whole meta was written into the file).
    complete: AtomicBool,
}

impl PartialFile {
    /// Creates `path` for a meta of `len` bytes whose first bytes are `prefix`, durably.
    pub fn create(path: &Path, len: u64, prefix: &[u8]) -> std::io::Result<Self> {
        assert!(prefix.len() as u64 <= len, "a prefix longer than its meta");
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        file.write_all_at(prefix, 0)?;
        file.set_len(len)?;
        file.sync_all()?;
        Ok(Self::with_prefix(file, len, prefix.len() as u64))
    }

    /// Reopens `path` (created by `create` with a prefix of `prefix_len` bytes) for a meta of
    /// `len` bytes: only the prefix counts as present.
    pub fn reopen(path: &Path, len: u64, prefix_len: u64) -> std::io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if file.metadata()?.len() != len || prefix_len > len {
            let detail = format!("{} holds {} bytes, not {len}", path.display(), file.metadata()?.len());
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, detail));
        }
        Ok(Self::with_prefix(file, len, prefix_len))
    }

    fn with_prefix(file: File, len: u64, prefix_len: u64) -> Self {
        let present = if prefix_len == 0 { Vec::new() } else { std::iter::once(0..prefix_len).collect() };
        PartialFile { file, len, present: Mutex::new(present), complete: AtomicBool::new(prefix_len == len) }
    }

    /// The meta's full length (what the file's length is).
    pub fn meta_len(&self) -> u64 {
        self.len
    }

    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Whether every byte of `range` is present.
    pub fn covers(&self, range: &Range<u64>) -> bool {
        if self.is_complete() || range.is_empty() {
            return true;
        }
        let present = self.present.lock().expect("partial meta lock poisoned");
        let at = present.partition_point(|r| r.end < range.end);
        present.get(at).is_some_and(|r| r.start <= range.start && range.end <= r.end)
    }

    /// Reads `len` bytes at `offset`, all of which must be present.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, FormatError> {
        let range = offset..offset.saturating_add(len as u64);
        if range.end > self.len || !self.covers(&range) {
            let detail = format!("bytes {range:?} of a meta not fetched yet");
            return Err(FormatError::Unreadable { what: WHAT, detail });
        }
        let mut buffer = vec![0u8; len];
        self.file
            .read_exact_at(&mut buffer, offset)
            .map_err(|e| FormatError::Unreadable { what: WHAT, detail: e.to_string() })?;
        Ok(buffer)
    }

    /// Writes checked bytes at `offset` and records them as present.
    pub fn fill(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let end = offset + bytes.len() as u64;
        assert!(end <= self.len, "bytes {offset}..{end} beyond a meta of {}", self.len);
        self.file.write_all_at(bytes, offset)?;
        add_range(&mut self.present.lock().expect("partial meta lock poisoned"), offset..end);
        Ok(())
    }

    /// Writes the whole meta (already checked as a whole) over the file, durably; every byte is
    /// present from now on.
    pub fn complete(&self, whole: &[u8]) -> std::io::Result<()> {
        assert_eq!(whole.len() as u64, self.len, "a whole meta of another length");
        self.file.write_all_at(whole, 0)?;
        self.file.sync_all()?;
        *self.present.lock().expect("partial meta lock poisoned") = std::iter::once(0..self.len).collect();
        self.complete.store(true, Ordering::Release);
        Ok(())
    }

    /// The present ranges.
    #[cfg(test)]
    pub fn present(&self) -> Vec<Range<u64>> {
        self.present.lock().expect("partial meta lock poisoned").clone()
    }
}

/// Adds `range` to sorted, disjoint, non-adjacent `ranges`, merging what it touches.
fn add_range(ranges: &mut Vec<Range<u64>>, mut range: Range<u64>) {
    if range.is_empty() {
        return;
    }
    let first = ranges.partition_point(|r| r.end < range.start);
    let mut last = first;
    while last < ranges.len() && ranges[last].start <= range.end {
        range.start = range.start.min(ranges[last].start);
        range.end = range.end.max(ranges[last].end);
        last += 1;
    }
    ranges.splice(first..last, [range]);
    debug_assert!(ranges.windows(2).all(|w| w[0].end < w[1].start), "present ranges overlap or touch");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::rng::splitmix64;

    #[test]
    fn ranges_merge_like_a_set_of_bytes() {
        let mut state = 11;
        let mut below = |n: u64| splitmix64(&mut state) % n;
        for _ in 0..200 {
            let mut ranges = Vec::new();
            let mut bytes = [false; 200];
            for _ in 0..below(30) {
                let start = below(200);
                let end = (start + below(20)).min(200);
                add_range(&mut ranges, start..end);
                (start..end).for_each(|b| bytes[b as usize] = true);
            }
            assert!(ranges.windows(2).all(|w| w[0].end < w[1].start));
            let from_ranges: Vec<bool> = (0..200u64).map(|b| ranges.iter().any(|r| r.contains(&b))).collect();
            assert_eq!(from_ranges, bytes.to_vec());
        }
    }

    #[test]
    fn only_present_bytes_are_read_and_reopening_keeps_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.part");
        let partial = PartialFile::create(&path, 100, &[7; 10]).unwrap();
        assert_eq!(partial.read(0, 10).unwrap(), vec![7; 10]);
        assert!(partial.read(5, 10).is_err(), "bytes 10..15 were never fetched");
        partial.fill(40, &[9; 20]).unwrap();
        assert_eq!(partial.read(45, 10).unwrap(), vec![9; 10]);
        assert!(partial.read(55, 10).is_err());
        assert!(!partial.is_complete());
        let reopened = PartialFile::reopen(&path, 100, 10).unwrap();
        assert_eq!(reopened.present(), std::iter::once(0..10).collect::<Vec<_>>());
        assert!(reopened.read(40, 5).is_err(), "a restart forgets what was fetched after the prefix");
        reopened.complete(&[1; 100]).unwrap();
        assert_eq!(reopened.read(0, 100).unwrap(), vec![1; 100]);
        assert!(PartialFile::reopen(&path, 99, 10).is_err(), "a file of another length");
    }
}
