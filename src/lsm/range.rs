//! Paged range reads: the entries of a range of keys in key order, a bounded part at a time, for
//! a query that lists a range too large to read whole (a hot target's accounts).
//!
//! Invariants:
//! - The keys of a range agree in their first `E::SHARD_WIDTH` bytes, so that each run has one
//!   table that may hold them. No filter is asked: filters answer for keys, not ranges.
//! - A part holds whole keys: every copy of every entry of each key it covers, and nothing of the
//!   others. `RangePart::frontier` is where it ends, the smallest entry of a key
//!   (`E::min_for_key`): ascending, the part is the range's entries below it; descending, those
//!   at or above it; the whole range when there is none.
//! - One read takes, in each table, the frames overlapping the range from its start in the
//!   reading direction until they hold at least `want` entries, and then on to the end of the
//!   key it stopped in, so every read covers at least one key (it makes progress whatever
//!   `want`). It reads the index records of the frames it takes, a chunk at a time, and the
//!   chunks at the range's two ends: its work is about `want` entries a run plus the entries of
//!   one key, whatever the size of the range.

use crate::lsm::entry::{Entry, within};
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::run::shard_hash;
use crate::lsm::table::{CHUNK_FRAMES, FrameInfo, PageUse};
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
    let plans = futures::future::try_join_all(
        tables.iter().map(|table| plan_table(table, store, (lo, hi), direction, want.max(1))),
    )
    .await?;
    let plans: Vec<Plan<E>> = plans.into_iter().flatten().collect();
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
/// entries and end a key; `None` when none overlap.
async fn plan_table<E: Entry>(
    table: &Arc<TableHandle<E>>,
    store: &dyn Store,
    (lo, hi): (E, E),
    direction: Direction,
    want: usize,
) -> Result<Option<Plan<E>>, ReadError> {
    table.fetch_meta_for_range_ends(store, lo, hi).await?;
    let all = table.frames_overlapping(&lo, &hi)?;
    if all.is_empty() {
        return Ok(None);
    }
    let plan = |frames, frontier: Option<&FrameInfo<E>>| {
        let frontier = frontier.map(|info| E::min_for_key(info.first.key()));
        Ok(Some(Plan { table: table.clone(), frames, frontier }))
    };
    let mut taken = 0usize;
    match direction {
        Direction::Ascending => {
            let mut end = all.start;
            while end < all.end {
                for info in frame_infos(table, store, end..(end + CHUNK_FRAMES).min(all.end)).await? {
                    // A frame that starts a key ends the part when it holds enough.
                    if taken >= want && !info.continues {
                        return plan(all.start..end, Some(&info));
                    }
                    taken += info.entries as usize;
                    end += 1;
                }
            }
        }
        Direction::Descending => {
            let mut start = all.end;
            while start > all.start {
                for info in frame_infos(table, store, start.saturating_sub(CHUNK_FRAMES).max(all.start)..start)
                    .await?
                    .iter()
                    .rev()
                {
                    taken += info.entries as usize;
                    start -= 1;
                    if taken >= want && !info.continues && start > all.start {
                        return plan(start..all.end, Some(info));
                    }
                }
            }
        }
    }
    plan(all, None)
}

/// The index records of `frames`, fetched first when the table's meta is a partial copy.
async fn frame_infos<E: Entry>(
    table: &TableHandle<E>,
    store: &dyn Store,
    frames: Range<usize>,
) -> Result<Vec<FrameInfo<E>>, ReadError> {
    table.fetch_meta_for_frames(store, frames.clone()).await?;
    table.frame_infos(frames, PageUse::Lookup)
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

    /// A replica's partial meta (resident part only): a walk over a range of many index chunks,
    /// either way, a few chunks a part, fetches the chunks it reads as it reads them and finds
    /// every entry.
    #[test]
    fn a_walk_over_a_partial_meta_fetches_the_chunks_it_reads() {
        use crate::lsm::handle::table_key;
        use crate::store::object::Store as _;
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { frame_bytes: AccountTally::WIDTH, ..TableOptions::default() };
        let writer: Tree<AccountTally> =
            Tree::new(dir.path().join("w"), options.clone(), TreeCaches::of_bytes(0, 0)).unwrap();
        let entries: Vec<AccountTally> =
            (1..=3_000).flat_map(|account| [1, 2].map(|location| tally((0, account, location, 1)))).collect();
        let id = "0000000000000001aaaaaaaa".to_string();
        let summary = writer.write_sorted(&id, || entries.iter().copied()).unwrap();
        let mut record =
            TableRecord::written(TreeKind::AccountTallies, id.clone(), (id.clone(), RunKind::Delta), (0, 1), &summary);
        record.uploaded = true;
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for ext in ["meta", "data"] {
            let bytes = std::fs::read(writer.local_path(&id, ext)).unwrap();
            runtime.block_on(store.put(&table_key(TreeKind::AccountTallies, &id, ext), bytes.into())).unwrap();
        }
        let replica: Tree<AccountTally> = Tree::new(dir.path().join("r"), options, TreeCaches::of_bytes(0, 0)).unwrap();
        runtime.block_on(replica.fetch_meta(&store, &record, false)).unwrap();
        replica.install(replica.open_table(record).unwrap(), None);
        let table = replica.tables().pop().unwrap();
        assert!(table.frame_count() > 8 * crate::lsm::table::CHUNK_FRAMES, "a range of many index chunks");
        let lo = AccountTally::min_for_key(AccountTally::key_of(0, TARGETS[0]));
        let hi = AccountTally::max_for_key(AccountTally::key_of(u64::MAX, TARGETS[0]));
        for direction in [Direction::Ascending, Direction::Descending] {
            let (mut range, mut found) = ((lo, hi), Vec::new());
            loop {
                let part = runtime.block_on(read_range_part(&replica, &store, range, direction, 300)).unwrap();
                assert!(table.meta_is_partial(), "a range read fetches index chunks, never a whole meta");
                found.extend(part.entries);
                let Some(frontier) = part.frontier else { break };
                range = match direction {
                    Direction::Ascending => (frontier, hi),
                    Direction::Descending => {
                        (lo, AccountTally::max_for_key(AccountTally::key_of(frontier.account - 1, TARGETS[0])))
                    }
                };
            }
            found.sort_unstable();
            assert_eq!(found, entries, "{direction:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Over runs of tables of a few entries a frame (an account's entries often straddle two)
        /// and a memtable, each part read holds exactly every copy of the range's entries in the
        /// part it says it covers, ends where a key starts, and covers at least one more key, so
        /// that a walk going on after each part reaches the range's far end.
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
            for _ in 0..200 {
                let part = runtime.block_on(read_range_part(&tree, &store, (lo_now, hi), direction, want)).unwrap();
                let mut expected: Vec<AccountTally> = everything
                    .iter()
                    .filter(|e| lo_now <= **e && **e <= hi && is_covered(*e, part.frontier, direction))
                    .copied()
                    .collect();
                expected.sort_unstable();
                prop_assert_eq!(&part.entries, &expected);
                let Some(frontier) = part.frontier else { return Ok(()) };
                prop_assert_eq!(frontier, AccountTally::min_for_key(frontier.key()), "a part ends where a key starts");
                // Each read covers at least one key, whatever `want`.
                match direction {
                    Direction::Ascending => {
                        prop_assert!(frontier > lo_now);
                        lo_now = frontier;
                    }
                    Direction::Descending => {
                        prop_assert!(frontier > lo_now && frontier <= hi);
                        if frontier.account <= first {
                            return Ok(());
                        }
                        hi = AccountTally::max_for_key(AccountTally::key_of(frontier.account - 1, TARGETS[0]));
                    }
                }
            }
            prop_assert!(false, "the walk never ended");
        }
    }
}
