//! Point reads: every entry of a few keys, from a tree's memtables and tables, in one concurrent
//! round of ranged reads (a query's revocation round, the many-to-many forward round).
//!
//! Invariants:
//! - Only tables whose filter admits a key are read, and of each only the frames that can hold
//!   it; frames of several keys in one table that touch or overlap are fetched by one read.
//! - Every copy of every key asked for, in the snapshot taken at one instant, is returned (in no
//!   particular order): choosing among copies is the caller's. With a bound on a key, every copy
//!   stamped above it.

use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::{Entry, within};
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::run::{group_by_shard, shard_hash};
use crate::lsm::table::PageUse;
use crate::lsm::tree::Tree;
use crate::model::ids::RecordId;
use crate::store::object::Store;
use futures::StreamExt;
use std::ops::Range;
use std::sync::Arc;

/// Every entry of `keys` in `tree` (memtables and tables), in no particular order.
pub async fn read_keys<E: Entry>(tree: &Tree<E>, store: &dyn Store, keys: &[RecordId]) -> Result<Vec<E>, ReadError> {
    read_keys_newer(tree, store, &unbounded(keys)).await
}

/// `keys`, each with no bound: every copy wanted.
fn unbounded(keys: &[RecordId]) -> Vec<(RecordId, Option<u64>)> {
    keys.iter().map(|key| (*key, None)).collect()
}

/// `read_keys`, where only the entries of each key stamped above its bound (`Some(stamp)`) are
/// wanted: tables whose entries are all stamped at or below it are not read for it (so some
/// entries at or below a bound may come too, from memtables and from tables read for newer ones).
pub async fn read_keys_newer<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[(RecordId, Option<u64>)],
) -> Result<Vec<E>, ReadError> {
    let (mut found, reads) = plan_reads(tree, store, keys, PageUse::Lookup).await?;
    let fetched = futures::future::try_join_all(reads.iter().map(|(table, frames, keys)| {
        let span = keys.iter().fold((RecordId::MAX, RecordId::MIN), |(lo, hi), k| (lo.min(*k), hi.max(*k)));
        table.read_frame_slices(store, frames.clone(), span)
    }))
    .await?;
    // Each read is sorted: search it for the keys it was made for instead of scanning it.
    for ((_, _, read_keys), slices) in reads.iter().zip(&fetched) {
        for slice in slices {
            extend_with_keys(&mut found, slice, read_keys);
        }
    }
    Ok(found)
}

/// `read_keys` for a writer (a flush's tallies): the frames, filter pages and index chunks it
/// reads go to no cache, so that what queries keep there stays, and a writer that never queries
/// holds none.
pub async fn read_keys_uncached<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[RecordId],
) -> Result<Vec<E>, ReadError> {
    read_keys_newer_uncached(tree, store, &unbounded(keys)).await
}

/// `read_keys_newer` for a writer: `read_keys_uncached` with a bound on each key.
pub async fn read_keys_newer_uncached<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[(RecordId, Option<u64>)],
) -> Result<Vec<E>, ReadError> {
    let (mut found, reads) = plan_reads(tree, store, keys, PageUse::Scan).await?;
    read_uncached(store, &reads, |entries, keys| extend_with_keys(&mut found, entries, keys)).await?;
    Ok(found)
}

/// A writer's uncached lookup decodes at most this many frames a read, with at most
/// `UNCACHED_READS_IN_FLIGHT` reads at once, keeping only its keys' entries of each: its memory
/// is a few frames, not the tables it looks in (a flush's lookups of hot links and revocations
/// touch frames all over them: a filter's false positives alone are one key in a hundred).
const UNCACHED_FRAMES_PER_READ: usize = 8;
const UNCACHED_READS_IN_FLIGHT: usize = 4;

/// Reads the frames of `reads` in pieces of at most `UNCACHED_FRAMES_PER_READ`, at most
/// `UNCACHED_READS_IN_FLIGHT` at once, bypassing the caches, and hands each piece's entries
/// (sorted) with what its read was made for to `take`. A table's reads come one after another:
/// its pieces hold its column models, which are decoded once for them all (a scan caches no
/// models, and decoding them for each piece was two fifths of a flush's tallies, by profile).
async fn read_uncached<E: Entry, T>(
    store: &dyn Store,
    reads: &[Read<E, T>],
    mut take: impl FnMut(&[E], &T),
) -> Result<(), ReadError> {
    let mut holder: Option<&Arc<TableHandle<E>>> = None;
    let mut held: Option<Arc<ColumnModels>> = None;
    let pieces = reads.iter().flat_map(move |(table, frames, wanted)| {
        if !holder.is_some_and(|holder| Arc::ptr_eq(holder, table)) {
            // A failure here is the read's to report: it asks for the models again.
            (holder, held) = (Some(table), table.paged_models(PageUse::Scan).ok().flatten());
        }
        let models = held.clone();
        frames.clone().step_by(UNCACHED_FRAMES_PER_READ).map(move |start| {
            let end = (start + UNCACHED_FRAMES_PER_READ).min(frames.end);
            let models = models.clone();
            async move {
                let _held = models;
                table.read_frames_with(store, start..end, PageUse::Scan).await.map(|entries| (entries, wanted))
            }
        })
    });
    let mut fetched = futures::stream::iter(pieces).buffer_unordered(UNCACHED_READS_IN_FLIGHT);
    while let Some(read) = fetched.next().await {
        let (entries, wanted) = read?;
        take(&entries, wanted);
    }
    Ok(())
}

/// One table's frames to read for some keys (or for what else `T` names).
type Read<E, T = Vec<RecordId>> = (Arc<TableHandle<E>>, Range<usize>, T);

/// The memtables' entries of `keys`, and the ranged reads that find theirs in tables. A scan's
/// filter pages and index chunks go to no cache.
async fn plan_reads<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[(RecordId, Option<u64>)],
    with: PageUse,
) -> Result<(Vec<E>, Vec<Read<E>>), ReadError> {
    let snapshot = tree.snapshot(keys.iter().map(|(key, _)| (E::min_for_key(*key), E::max_for_key(*key))));
    snapshot.fetch_metas_for_keys(store, keys).await?;
    let mut reads = Vec::new();
    for (table, keys) in snapshot.tables_for_keys(keys, with) {
        let bounds = keys.iter().map(|key| (E::min_for_key(*key), E::max_for_key(*key)));
        let frames = table.frames_overlapping_each(bounds, with)?;
        for (frames, keys) in coalesce(frames.into_iter().zip(keys).collect()) {
            reads.push((table.clone(), frames, keys));
        }
    }
    Ok((snapshot.memtable_entries, reads))
}

/// Adds the entries of `keys` from the sorted `entries`.
fn extend_with_keys<E: Entry>(found: &mut Vec<E>, entries: &[E], keys: &[RecordId]) {
    for key in keys {
        found.extend_from_slice(within(entries, &E::min_for_key(*key), &E::max_for_key(*key)));
    }
}

/// Every entry whose key is in one of `ranges` (each `first..=last`), from memtables and tables,
/// in no particular order. The keys of a range must agree in their first `E::SHARD_WIDTH` bytes
/// (an account's hot links), so that one table of each compacted run holds them all. Tables have
/// no filter of key ranges: each run is asked its frame index, and the frames of all ranges in
/// one table are read together. For a writer: the frames and index chunks read go to no cache.
pub async fn read_key_ranges<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    ranges: &[(RecordId, RecordId)],
) -> Result<Vec<E>, ReadError> {
    let bounds: Vec<(E, E)> = ranges.iter().map(|(first, last)| key_range_bounds(*first, *last)).collect();
    let snapshot = tree.snapshot(bounds.iter().copied());
    let mut reads = Vec::new();
    for run in snapshot.runs.iter() {
        let shards = ranges.iter().enumerate().map(|(at, (first, _))| (run.shard_for_hash(shard_hash::<E>(first)), at));
        for (shard, ats) in group_by_shard(shards) {
            let table = &run.tables[shard];
            let frames = table.frames_overlapping_each(ats.iter().map(|at| bounds[*at]), PageUse::Scan)?;
            for (frames, ats) in coalesce(frames.into_iter().zip(ats).collect()) {
                reads.push((table.clone(), frames, ats));
            }
        }
    }
    let mut found = snapshot.memtable_entries;
    read_uncached(store, &reads, |entries, ats: &Vec<usize>| {
        for at in ats {
            let (lo, hi) = &bounds[*at];
            found.extend_from_slice(within(entries, lo, hi));
        }
    })
    .await?;
    Ok(found)
}

/// The smallest and largest entries of the keys `first..=last`, which must agree in their first
/// `E::SHARD_WIDTH` bytes.
fn key_range_bounds<E: Entry>(first: RecordId, last: RecordId) -> (E, E) {
    assert!(first <= last, "an empty key range");
    assert_eq!(first.to_bytes()[..E::SHARD_WIDTH], last.to_bytes()[..E::SHARD_WIDTH], "keys of two shards");
    (E::min_for_key(first), E::max_for_key(last))
}

/// Merges overlapping or adjacent frame ranges of keys into maximal runs (one ranged read each),
/// each with the keys whose frames it holds (a key whose range is empty needs no read).
fn coalesce<T>(mut ranges: Vec<(Range<usize>, T)>) -> Vec<(Range<usize>, Vec<T>)> {
    ranges.retain(|(r, _)| !r.is_empty());
    ranges.sort_by_key(|(r, _)| r.start);
    let mut runs: Vec<(Range<usize>, Vec<T>)> = Vec::new();
    for (range, key) in ranges {
        match runs.last_mut() {
            Some((last, keys)) if range.start <= last.end => {
                last.end = last.end.max(range.end);
                keys.push(key);
            }
            _ => runs.push((range, vec![key])),
        }
    }
    runs
}
