//! A body that stays in memory while it is small and moves to an unnamed temporary file once it
//! grows past a threshold, so a download's memory is bounded whatever its size.
//!
//! Invariants:
//! - At most `memory_bytes` are held in memory, and no more than the shared `MemoryBudget` has
//!   room for (the budget of every body in flight at once); everything past that is in the file
//!   (the memory part moves there too, so the body is one contiguous file).
//! - A body in memory keeps its share of the budget until it is dropped.
//! - The file has no name (it disappears when dropped, even if the process dies) and lives in the
//!   directory the caller chose (the data directory, not a possibly small `/tmp`).

use super::http::BodySink;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes that all bodies in flight may hold in memory together.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(MemoryBudget { limit, used: AtomicUsize::new(0) })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "a budget gives back only what it gave");
    }
}

/// A share of a `MemoryBudget`, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// A finished body.
pub enum Spilled {
    /// In memory, holding its share of the budget.
    Memory(Vec<u8>, Reservation),
    File {
        file: File,
        len: u64,
    },
}

impl Spilled {
    pub fn len(&self) -> u64 {
        match self {
            Spilled::Memory(bytes, _) => bytes.len() as u64,
            Spilled::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The sink that builds a [`Spilled`].
pub struct SpillSink {
    memory: Vec<u8>,
    memory_bytes: usize,
    reservation: Reservation,
    file: Option<(std::io::BufWriter<File>, u64)>,
    directory: PathBuf,
}

impl SpillSink {
    /// A body kept in memory up to `memory_bytes` (within `budget`), in a file in `directory`
    /// past that.
    pub fn new(memory_bytes: usize, budget: &Arc<MemoryBudget>, directory: &Path) -> Self {
        SpillSink {
            memory: Vec::new(),
            memory_bytes,
            reservation: Reservation { budget: budget.clone(), bytes: 0 },
            file: None,
            directory: directory.to_path_buf(),
        }
    }

    pub fn finish(self) -> std::io::Result<Spilled> {
        match self.file {
            None => Ok(Spilled::Memory(self.memory, self.reservation)),
            Some((writer, len)) => {
                let file = writer.into_inner().map_err(|e| e.into_error())?;
                Ok(Spilled::File { file, len })
            }
        }
    }

    /// Room in memory for `more` bytes: under this body's limit, and taken from the budget.
    fn room_for(&mut self, more: usize) -> bool {
        let fits = self.memory.len() + more <= self.memory_bytes;
        let taken = fits && self.reservation.budget.try_take(more);
        if taken {
            self.reservation.bytes += more;
        }
        taken
    }

    fn spill(&mut self) -> std::io::Result<()> {
        let mut writer = std::io::BufWriter::with_capacity(256 << 10, tempfile::tempfile_in(&self.directory)?);
        writer.write_all(&self.memory)?;
        let len = self.memory.len() as u64;
        self.memory = Vec::new();
        self.reservation.budget.give_back(std::mem::take(&mut self.reservation.bytes));
        self.file = Some((writer, len));
        Ok(())
    }
}

impl BodySink for SpillSink {
    fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        if self.file.is_none() && !self.room_for(chunk.len()) {
            self.spill()?;
        }
        match &mut self.file {
            Some((writer, len)) => {
                writer.write_all(chunk)?;
                *len += chunk.len() as u64;
            }
            None => self.memory.extend_from_slice(chunk),
        }
        debug_assert!(self.memory.len() <= self.memory_bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    #[test]
    fn small_bodies_stay_in_memory_and_large_ones_move_whole_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(100);
        let mut small = SpillSink::new(10, &budget, dir.path());
        small.write(b"0123456789").unwrap();
        let small = small.finish().unwrap();
        assert!(matches!(&small, Spilled::Memory(bytes, _) if bytes == b"0123456789"));
        assert_eq!(budget.used(), 10, "held while the body lives");
        drop(small);
        assert_eq!(budget.used(), 0);

        let mut large = SpillSink::new(10, &budget, dir.path());
        large.write(b"01234").unwrap();
        large.write(b"567890").unwrap();
        large.write(b"abc").unwrap();
        assert!(large.memory.is_empty());
        assert_eq!(budget.used(), 0, "a spilled body gives its share back");
        let Spilled::File { mut file, len } = large.finish().unwrap() else { panic!("expected a file") };
        assert_eq!(len, 14);
        let mut back = String::new();
        file.rewind().unwrap();
        file.read_to_string(&mut back).unwrap();
        assert_eq!(back, "01234567890abc");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the file has no name");
    }

    #[test]
    fn the_shared_budget_sends_bodies_to_files_when_it_is_spent() {
        let dir = tempfile::tempdir().unwrap();
        let budget = MemoryBudget::new(15);
        let mut first = SpillSink::new(10, &budget, dir.path());
        first.write(b"0123456789").unwrap();
        let mut second = SpillSink::new(10, &budget, dir.path());
        second.write(b"01234").unwrap();
        second.write(b"5").unwrap();
        assert!(matches!(second.finish().unwrap(), Spilled::File { len: 6, .. }), "no room left in the budget");
        assert!(matches!(first.finish().unwrap(), Spilled::Memory(..)));
        assert_eq!(budget.used(), 0);
    }
}
