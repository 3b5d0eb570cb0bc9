//! Point reads: every entry of a few keys, from a tree's memtables and tables, in one concurrent
//! round of ranged reads (a query's revocation round, the many-to-many forward round).
//!
//! Invariants:
//! - Only tables whose filter admits a key are read, and of each only the frames that can hold
//!   it; frames of several keys in one table that touch or overlap are fetched by one read.
//! - Every copy of every key asked for, in the snapshot taken at one instant, is returned (in no
//!   particular order): choosing among copies is the caller's. With a bound on a key, every copy
//!   stamped above it.

use crate::lsm::entry::{Entry, within};
use crate::lsm::handle::ReadError;
use crate::lsm::tree::Tree;
use crate::model::ids::RecordId;
use crate::store::object::Store;
use std::ops::Range;

/// Every entry of `keys` in `tree` (memtables and tables), in no particular order.
pub async fn read_keys<E: Entry>(tree: &Tree<E>, store: &dyn Store, keys: &[RecordId]) -> Result<Vec<E>, ReadError> {
    let unbounded: Vec<(RecordId, Option<u64>)> = keys.iter().map(|key| (*key, None)).collect();
    read_keys_newer(tree, store, &unbounded).await
}

/// `read_keys`, where only the entries of each key stamped above its bound (`Some(stamp)`) are
/// wanted: tables whose entries are all stamped at or below it are not read for it (so some
/// entries at or below a bound may come too, from memtables and from tables read for newer ones).
pub async fn read_keys_newer<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[(RecordId, Option<u64>)],
) -> Result<Vec<E>, ReadError> {
    let ranges: Vec<_> = keys.iter().map(|(k, _)| (E::min_for_key(*k), E::max_for_key(*k))).collect();
    let snapshot = tree.snapshot(&ranges);
    snapshot.fetch_metas_for_keys(store, keys).await?;
    let mut reads = Vec::new();
    for (table, keys) in snapshot.tables_for_keys(keys) {
        let frames =
            keys.iter().map(|key| table.frames_for_key(*key).map(|r| (r, *key))).collect::<Result<Vec<_>, _>>()?;
        for (frames, keys) in coalesce(frames) {
            reads.push((table.clone(), frames, keys));
        }
    }
    let fetched = futures::future::try_join_all(reads.iter().map(|(table, frames, keys)| {
        let span = keys.iter().fold((RecordId::MAX, RecordId::MIN), |(lo, hi), k| (lo.min(*k), hi.max(*k)));
        table.read_frame_slices(store, frames.clone(), span)
    }))
    .await?;
    let mut found = snapshot.memtable_entries;
    // Each read is sorted: search it for the keys it was made for instead of scanning it.
    for ((_, _, read_keys), slices) in reads.iter().zip(&fetched) {
        for slice in slices {
            for key in read_keys {
                found.extend_from_slice(within(slice, &E::min_for_key(*key), &E::max_for_key(*key)));
            }
        }
    }
    Ok(found)
}

/// Merges overlapping or adjacent frame ranges of keys into maximal runs (one ranged read each),
/// each with the keys whose frames it holds (a key whose range is empty needs no read).
fn coalesce(mut ranges: Vec<(Range<usize>, RecordId)>) -> Vec<(Range<usize>, Vec<RecordId>)> {
    ranges.retain(|(r, _)| !r.is_empty());
    ranges.sort_by_key(|(r, _)| r.start);
    let mut runs: Vec<(Range<usize>, Vec<RecordId>)> = Vec::new();
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
