//! An external sort of entries: what a writer must write sorted but produces in another order,
//! and may produce more of than it may hold (a promotion's hot links, for a target with
//! millions of backlinks).
//!
//! Invariants:
//! - A sorter holds at most `run_entries` entries in memory; past that it sorts them and
//!   appends them, raw, to one unlinked spill file as a run. The last run stays in memory.
//! - `Sorted::merged` yields every entry pushed, each once (duplicates too), in order: a merge
//!   of the runs holding one read buffer of `READ_ENTRIES` entries a run. It may be called
//!   again (a table is written from two passes), each time reading the spill anew.
//! - A read error of the spill ends the merge early and is kept: `Sorted::check` reports it,
//!   so that a table written from a short merge is never committed.

use super::entry::Entry;
use super::tree::{Tree, anonymous_spill};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Entries a merge reads from a spilled run at a time.
const READ_ENTRIES: usize = 256;

/// Entries pushed in any order, sorted outside memory when they are many.
pub struct Sorter<E: Entry> {
    run_entries: usize,
    buffer: Vec<E>,
    /// Where the spill file goes (named after it, unlinked at once).
    spill_beside: PathBuf,
    spill: Option<Spill>,
}

struct Spill {
    file: BufWriter<File>,
    /// Each spilled run's first entry and its length, in entries.
    runs: Vec<(u64, u64)>,
    written: u64,
}

impl<E: Entry> Sorter<E> {
    /// A sorter of at most `run_entries` in memory, spilling beside `tree`'s tables.
    pub fn beside(tree: &Tree<E>, name: &str, run_entries: usize) -> Self {
        assert!(run_entries > 0, "a run holds at least one entry");
        Sorter { run_entries, buffer: Vec::new(), spill_beside: tree.dir().join(name), spill: None }
    }

    /// Where the spill is made (named after it; unlinked at once), to name it in errors.
    pub fn spill_path(&self) -> &Path {
        &self.spill_beside
    }

    pub fn push(&mut self, entry: E) -> io::Result<()> {
        if self.buffer.len() == self.run_entries {
            self.spill_run()?;
        }
        self.buffer.push(entry);
        Ok(())
    }

    fn spill_run(&mut self) -> io::Result<()> {
        if self.spill.is_none() {
            let file = anonymous_spill(&self.spill_beside, "sort")?;
            self.spill = Some(Spill { file: BufWriter::with_capacity(1 << 20, file), runs: Vec::new(), written: 0 });
        }
        let spill = self.spill.as_mut().expect("made above");
        self.buffer.sort_unstable();
        let length = self.buffer.len() as u64;
        let mut raw = vec![0u8; E::WIDTH];
        for entry in self.buffer.drain(..) {
            entry.encode(&mut raw);
            spill.file.write_all(&raw)?;
        }
        spill.runs.push((spill.written, length));
        spill.written += length;
        Ok(())
    }

    /// Every entry pushed, ready to be merged in order.
    pub fn finish(mut self) -> io::Result<Sorted<E>> {
        self.buffer.sort_unstable();
        let (file, runs) = match self.spill {
            Some(spill) => (Some(spill.file.into_inner().map_err(io::IntoInnerError::into_error)?), spill.runs),
            None => (None, Vec::new()),
        };
        Ok(Sorted { last: self.buffer, file, runs, error: Mutex::new(None), spill_path: self.spill_beside })
    }
}

/// A sorter's entries: its spilled runs and the last run, in memory.
pub struct Sorted<E: Entry> {
    last: Vec<E>,
    file: Option<File>,
    runs: Vec<(u64, u64)>,
    error: Mutex<Option<io::Error>>,
    /// Where the spill was made, to name it in errors.
    spill_path: PathBuf,
}

impl<E: Entry> Sorted<E> {
    pub fn len(&self) -> u64 {
        self.last.len() as u64 + self.runs.iter().map(|(_, length)| length).sum::<u64>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the spill was made, to name it in errors.
    pub fn spill_path(&self) -> &Path {
        &self.spill_path
    }

    /// Runs spilled to the file (the last is never spilled).
    pub fn spilled_runs(&self) -> usize {
        self.runs.len()
    }

    /// Every entry, in order (module invariants).
    pub fn merged(&self) -> impl Iterator<Item = E> + '_ {
        let mut sources: Vec<RunReader<'_, E>> =
            self.runs.iter().map(|&(first, length)| RunReader::spilled(self, first, length)).collect();
        sources.push(RunReader::Memory(self.last.iter()));
        let mut heap = BinaryHeap::new();
        for (at, source) in sources.iter_mut().enumerate() {
            if let Some(entry) = source.next() {
                heap.push(Reverse((entry, at)));
            }
        }
        std::iter::from_fn(move || {
            let Reverse((entry, at)) = heap.pop()?;
            if let Some(next) = sources[at].next() {
                heap.push(Reverse((next, at)));
            }
            Some(entry)
        })
    }

    /// The first read error a merge met, if any: its entries were cut short.
    pub fn check(&self) -> io::Result<()> {
        match self.error.lock().expect("sort error lock poisoned").take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn failed(&self, error: io::Error) {
        self.error.lock().expect("sort error lock poisoned").get_or_insert(error);
    }
}

/// One run of a merge: the last run, in memory, or a spilled run read `READ_ENTRIES` at a time.
enum RunReader<'a, E: Entry> {
    Memory(std::slice::Iter<'a, E>),
    Spilled {
        sorted: &'a Sorted<E>,
        buffer: std::vec::IntoIter<E>,
        /// The next entry of the spill to read, and the end of the run.
        next: u64,
        end: u64,
    },
}

impl<'a, E: Entry> RunReader<'a, E> {
    fn spilled(sorted: &'a Sorted<E>, first: u64, length: u64) -> Self {
        RunReader::Spilled { sorted, buffer: Vec::new().into_iter(), next: first, end: first + length }
    }
}

/// The next `READ_ENTRIES` (at most) of a spilled run, from entry `next` to `end`.
fn read_run<E: Entry>(file: &File, next: u64, end: u64) -> io::Result<Vec<E>> {
    let count = (end - next).min(READ_ENTRIES as u64) as usize;
    let mut raw = vec![0u8; count * E::WIDTH];
    file.read_exact_at(&mut raw, next * E::WIDTH as u64)?;
    Ok(raw.chunks_exact(E::WIDTH).map(E::decode).collect())
}

impl<E: Entry> Iterator for RunReader<'_, E> {
    type Item = E;

    fn next(&mut self) -> Option<E> {
        let RunReader::Spilled { sorted, buffer, next, end } = self else {
            let RunReader::Memory(entries) = self else { unreachable!() };
            return entries.next().copied();
        };
        if buffer.len() == 0 && *next < *end {
            let file = sorted.file.as_ref().expect("a spilled run has its file");
            match read_run(file, *next, *end) {
                Ok(entries) => {
                    *next += entries.len() as u64;
                    *buffer = entries.into_iter();
                }
                Err(error) => {
                    sorted.failed(error);
                    return None;
                }
            }
        }
        buffer.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::table::TableOptions;
    use crate::lsm::tree::TreeCaches;
    use crate::model::ids::{HotLink, RecordId};
    use proptest::prelude::*;

    fn link(account: u64, rkey: u64) -> HotLink {
        HotLink {
            account,
            collection: 1,
            rkey,
            target: RecordId { rkey: 3, collection: 1, did: 2 },
            location: 1,
            source_rev: 1,
        }
    }

    #[test]
    fn a_spill_cut_short_ends_the_merge_and_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<HotLink> =
            Tree::new(dir.path().join("hot"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let mut sorter = Sorter::beside(&tree, "promotion", 4);
        (0..10).for_each(|rkey| sorter.push(link(1, rkey)).unwrap());
        let sorted = sorter.finish().unwrap();
        sorted.check().unwrap();
        sorted.file.as_ref().unwrap().set_len(HotLink::WIDTH as u64).unwrap();
        assert!(sorted.merged().count() < 10);
        assert!(sorted.check().is_err(), "the short read is reported");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the order pushed and the size of a run, a merge gives every entry pushed in
        /// order, duplicates kept, as often as asked; only the last run stays in memory.
        #[test]
        fn a_merge_gives_every_entry_pushed_in_order(
            pushed in proptest::collection::vec((0..50u64, 0..50u64), 0..400),
            run_entries in 1..40usize,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let tree: Tree<HotLink> =
                Tree::new(dir.path().join("hot"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
            let mut sorter = Sorter::beside(&tree, "promotion", run_entries);
            for &(account, rkey) in &pushed {
                sorter.push(link(account, rkey)).unwrap();
            }
            let sorted = sorter.finish().unwrap();
            let mut expected: Vec<HotLink> = pushed.iter().map(|&(a, r)| link(a, r)).collect();
            expected.sort_unstable();
            prop_assert_eq!(sorted.len(), expected.len() as u64);
            prop_assert_eq!(sorted.spilled_runs(), pushed.len().saturating_sub(1) / run_entries);
            for _ in 0..2 {
                prop_assert_eq!(sorted.merged().collect::<Vec<_>>(), expected.clone());
            }
            sorted.check().unwrap();
            let leftovers = std::fs::read_dir(dir.path().join("hot")).unwrap().count();
            prop_assert_eq!(leftovers, 0, "the spill is unlinked");
        }
    }
}
