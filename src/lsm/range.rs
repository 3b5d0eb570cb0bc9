//! Paged range reads: the entries of a range of keys in key order, a bounded part at a time, for
//! a query that lists a range too large to read whole (a hot target's accounts).
//!
//! Invariants:
//! - The keys of a range agree in their first `E::SHARD_WIDTH` bytes, so that each run has one
//!   table that may hold them. No filter is asked: filters answer for keys, not ranges.
//! - One read takes, in each table, the frames overlapping the range from its start in the
//!   reading direction until they hold at least `want` entries (or the range ends), so its work
//!   is about `want` entries a run plus one frame, whatever the range's size.
//! - `RangePart::frontier` bounds the part of the range that every table was read through (the
//!   memtables are read whole): ascending, every entry below it; descending, every entry at or
//!   above it. Every copy of every entry of that part is returned, and nothing else.

use crate::lsm::entry::{Entry, within};
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::run::shard_hash;
use crate::lsm::table::PageUse;
use crate::lsm::tree::Tree;
use crate::store::object::Store;
use std::ops::Range;
use std::sync::Arc;

/// Which end of a range a read starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ascending,
    Descending,
}

/// What one read of a range found.
#[derive(Debug)]
pub struct RangePart<E> {
    /// Every copy of every entry of the part read, sorted.
    pub entries: Vec<E>,
    /// Where the part read ends (see the module invariants); `None` when it is the whole range.
    pub frontier: Option<E>,
}

/// Reads the entries `lo..=hi` of `tree` from the end `direction` names, about `want` a table
/// (module invariants).
pub async fn read_range_part<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    (lo, hi): (E, E),
    direction: Direction,
    want: usize,
) -> Result<RangePart<E>, ReadError> {
    assert!(lo <= hi, "an empty range");
    let (first, last) = (lo.key(), hi.key());
    assert_eq!(first.to_bytes()[..E::SHARD_WIDTH], last.to_bytes()[..E::SHARD_WIDTH], "keys of two shards");
    let snapshot = tree.snapshot([(lo, hi)]);
    let shard = shard_hash::<E>(&first);
    let tables: Vec<Arc<TableHandle<E>>> = snapshot.runs.iter().map(|run| run.table_for_hash(shard).clone()).collect();
    let mut plans = Vec::new();
    for table in &tables {
        table.fetch_meta_for_range(store, lo, hi).await?;
        plans.extend(plan_table(table, (lo, hi), direction, want)?);
    }
    let keys = (first, last);
    let reads = futures::future::try_join_all(
        plans.iter().map(|plan| plan.table.read_frame_slices(store, plan.frames.clone(), keys)),
    )
    .await?;
    let frontier = plans.iter().filter_map(|plan| plan.frontier).reduce(|a, b| match direction {
        Direction::Ascending => a.min(b),
        Direction::Descending => a.max(b),
    });
    let mut entries = snapshot.memtable_entries;
    for slice in reads.iter().flatten() {
        entries.extend_from_slice(within(slice, &lo, &hi));
    }
    entries.retain(|entry| lo <= *entry && *entry <= hi && is_covered(entry, frontier, direction));
    entries.sort_unstable();
    Ok(RangePart { entries, frontier })
}

/// Whether `entry` lies in the part a read with `frontier` covered.
fn is_covered<E: Ord>(entry: &E, frontier: Option<E>, direction: Direction) -> bool {
    match (frontier, direction) {
        (None, _) => true,
        (Some(frontier), Direction::Ascending) => *entry < frontier,
        (Some(frontier), Direction::Descending) => *entry >= frontier,
    }
}

/// The frames of one table a read takes, and where they stop short of the range's far end.
struct Plan<E: Entry> {
    table: Arc<TableHandle<E>>,
    frames: Range<usize>,
    frontier: Option<E>,
}

/// The frames of `table` overlapping `lo..=hi` from the `direction` end until they hold `want`
/// entries; `None` when none overlap.
fn plan_table<E: Entry>(
    table: &Arc<TableHandle<E>>,
    (lo, hi): (E, E),
    direction: Direction,
    want: usize,
) -> Result<Option<Plan<E>>, ReadError> {
    let all = table.frames_overlapping(&lo, &hi)?;
    if all.is_empty() {
        return Ok(None);
    }
    let infos = table.frame_infos(all.clone(), PageUse::Lookup)?;
    let mut taken = 0usize;
    let mut count = 0usize;
    let order: Box<dyn Iterator<Item = &_>> = match direction {
        Direction::Ascending => Box::new(infos.iter()),
        Direction::Descending => Box::new(infos.iter().rev()),
    };
    for info in order {
        if taken >= want.max(1) {
            break;
        }
        taken += info.entries as usize;
        count += 1;
    }
    let (frames, frontier) = match direction {
        Direction::Ascending => {
            let end = all.start + count;
            (all.start..end, infos.get(count).map(|next| next.first))
        }
        Direction::Descending => {
            let start = all.end - count;
            (start..all.end, (start > all.start).then(|| infos[start - all.start].first))
        }
    };
    Ok(Some(Plan { table: table.clone(), frames, frontier }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::record::{RunKind, TableRecord};
    use crate::lsm::table::TableOptions;
    use crate::lsm::tree::TreeCaches;
    use crate::model::ids::{AccountTally, RecordId, TreeKind};
    use proptest::prelude::*;

    const TARGETS: [RecordId; 2] =
        [RecordId { rkey: 7, collection: 1, did: 9 }, RecordId { rkey: 8, collection: 1, did: 9 }];

    fn tally((target, account, location, stamp): (usize, u64, u64, u64)) -> AccountTally {
        AccountTally::of(account, TARGETS[target], (1, location), stamp, 1)
    }

    fn entry() -> impl Strategy<Value = AccountTally> {
        (0..2usize, 1..60u64, 1..3u64, 1..4u64).prop_map(tally)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Over runs of tables of a few entries a frame and a memtable, each part read holds
        /// exactly every copy of the range's entries in the part it says it covers, and a walk
        /// that goes on from each frontier reaches the range's far end.
        #[test]
        fn each_part_holds_every_copy_of_what_it_covers(
            runs in proptest::collection::vec(proptest::collection::vec(entry(), 0..120), 0..4),
            memtable in proptest::collection::vec(entry(), 0..20),
            accounts in (1..60u64, 1..60u64),
            want in 0..40usize,
            ascending: bool,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let options = TableOptions { frame_bytes: 4 * AccountTally::WIDTH, ..TableOptions::default() };
            let tree: Tree<AccountTally> = Tree::new(dir.path().join("t"), options, TreeCaches::of_bytes(0, 0)).unwrap();
            let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
            for (at, run) in runs.iter().enumerate() {
                let mut entries = run.clone();
                entries.sort_unstable();
                entries.dedup();
                let id = format!("{:016x}aaaaaaaa", at + 1);
                let summary = tree.write_sorted(&id, || entries.iter().copied()).unwrap();
                let record = TableRecord::written(TreeKind::AccountTallies, id.clone(), (id, RunKind::Delta), (0, 1), &summary);
                tree.install(tree.open_table(record).unwrap(), None);
            }
            tree.insert(memtable.iter().copied());
            let (first, last) = (accounts.0.min(accounts.1), accounts.0.max(accounts.1));
            let lo = AccountTally::min_for_key(AccountTally::key_of(first, TARGETS[0]));
            let mut hi = AccountTally::max_for_key(AccountTally::key_of(last, TARGETS[0]));
            let mut lo_now = lo;
            let direction = if ascending { Direction::Ascending } else { Direction::Descending };
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut everything: Vec<AccountTally> = memtable.clone();
            everything.sort_unstable();
            everything.dedup();
            for run in &runs {
                let mut entries = run.clone();
                entries.sort_unstable();
                entries.dedup();
                everything.extend(entries);
            }
            let mut want = want;
            for _ in 0..64 {
                let part = runtime.block_on(read_range_part(&tree, &store, (lo_now, hi), direction, want)).unwrap();
                let mut expected: Vec<AccountTally> = everything
                    .iter()
                    .filter(|e| lo_now <= **e && **e <= hi && is_covered(*e, part.frontier, direction))
                    .copied()
                    .collect();
                expected.sort_unstable();
                prop_assert_eq!(&part.entries, &expected);
                match (part.frontier, direction) {
                    (None, _) => return Ok(()),
                    (Some(frontier), Direction::Ascending) => {
                        prop_assert!(frontier > lo_now, "the walk goes on");
                        lo_now = frontier;
                    }
                    // Going on from the frontier itself (as a walk by key does), with more each time.
                    (Some(frontier), Direction::Descending) => {
                        prop_assert!(lo_now < frontier && frontier <= hi);
                        hi = frontier;
                    }
                }
                want = want.max(1) * 2;
            }
            prop_assert!(false, "the walk never ended");
        }
    }
}
