//! Paged range reads: the entries of a range of keys in key order, a bounded part at a time, for
//! a query that lists a range too large to read whole (a hot target's accounts).
//!
//! Invariants:
//! - The keys of a range agree in their first `E::SHARD_WIDTH` bytes, so that each run has one
//!   table that may hold them. No filter is asked: filters answer for keys, not ranges.
//! - A part holds whole keys: every copy of every entry of each key it covers, and nothing of the
//!   others. `RangePart::frontier` is the key where it ends, itself not covered: ascending, the
//!   part is the range's keys below it; descending, those above it; the whole range without one.
//!   The next part starts at the frontier's key, so every read covers at least one more key
//!   than the last (a walk always ends).
//! - One read takes, in each table, the frames overlapping the range from its start in the
//!   reading direction until they hold at least `want` entries and the next frame starts past
//!   the range's first key: about `want` entries a run plus a frame (plus the entries of the
//!   range's first key, when it fills frames). It reads the frame index 64 frames at a time,
//!   fetching what a partial meta lacks before reading it.
//! - A read cut between entries (`read_entries_part`, ascending) is the same walk with entries
//!   for keys: its part is every entry of the range below its frontier (an entry, itself not
//!   covered), so one key's entries too many to hold at once are read a bounded part at a time.
//!   Copies of one identity differ in their stamps, so a frontier may fall between them. The
//!   memtables count as one more table there: a part holds about `want` of their entries too
//!   (the snapshot still copies all of the range's memtable entries above `lo` for each part).

use crate::lsm::entry::{Entry, within};
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::run::shard_hash;
use crate::lsm::table::{CHUNK_FRAMES, FrameInfo, PageUse};
use crate::lsm::tree::Tree;
use crate::model::ids::RecordId;
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
    /// The key where the part ends, not covered (module invariants); `None` when the part is the
    /// whole range.
    pub frontier: Option<RecordId>,
}

/// What one read of a range cut between entries found.
#[derive(Debug)]
pub struct EntriesPart<E> {
    /// Every entry of the range below `frontier`, sorted.
    pub entries: Vec<E>,
    /// The entry where the part ends, not covered; `None` when the part is the whole range.
    pub frontier: Option<E>,
}

/// Where a walk may end a part: between two keys, or between two entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    Keys,
    Entries,
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
    let (mut entries, frontiers) =
        read_part(tree, store, (lo, hi), direction, want, (Cut::Keys, PageUse::Lookup)).await?;
    let frontier = frontiers.map(|frontier| frontier.key()).reduce(|a, b| match direction {
        Direction::Ascending => a.min(b),
        Direction::Descending => a.max(b),
    });
    entries.retain(|entry| is_covered(entry.key(), frontier, direction));
    Ok(RangePart { entries, frontier })
}

/// Reads the entries `lo..=hi` of `tree` in ascending order, about `want` a table, the part
/// ending between two entries (module invariants): the next part starts at its frontier. `with`
/// says whether the pages and frames it reads are cached (a flush's reads are not).
pub async fn read_entries_part<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    (lo, hi): (E, E),
    want: usize,
    with: PageUse,
) -> Result<EntriesPart<E>, ReadError> {
    let cut = (Cut::Entries, with);
    let (mut entries, frontiers) = read_part(tree, store, (lo, hi), Direction::Ascending, want, cut).await?;
    let frontier = frontiers.min();
    entries.retain(|entry| frontier.is_none_or(|frontier| *entry < frontier));
    Ok(EntriesPart { entries, frontier })
}

/// The entries `lo..=hi` of the frames each table's plan takes and of the memtables, sorted, and
/// each plan's frontier: the first entry of the first frame it did not take.
async fn read_part<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    (lo, hi): (E, E),
    direction: Direction,
    want: usize,
    (cut, with): (Cut, PageUse),
) -> Result<(Vec<E>, impl Iterator<Item = E>), ReadError> {
    assert!(lo <= hi, "an empty range");
    let (first, last) = (lo.key(), hi.key());
    assert_eq!(first.to_bytes()[..E::SHARD_WIDTH], last.to_bytes()[..E::SHARD_WIDTH], "keys of two shards");
    let snapshot = tree.snapshot([(lo, hi)]);
    let shard = shard_hash::<E>(&first);
    let tables: Vec<Arc<TableHandle<E>>> = snapshot.runs.iter().map(|run| run.table_for_hash(shard).clone()).collect();
    let plans = futures::future::try_join_all(
        tables.iter().map(|table| plan_table(table, store, (lo, hi), direction, want.max(1), (cut, with))),
    )
    .await?;
    let plans: Vec<Plan<E>> = plans.into_iter().flatten().collect();
    let mut entries = snapshot.memtable_entries;
    let memtable_frontier = match cut {
        Cut::Keys => None,
        Cut::Entries => memtables_frontier(&mut entries, lo, want.max(1)),
    };
    match with {
        PageUse::Lookup => {
            let reads = futures::future::try_join_all(
                plans.iter().map(|plan| plan.table.read_frame_slices(store, plan.frames.clone(), (first, last))),
            )
            .await?;
            for slice in reads.iter().flatten() {
                entries.extend_from_slice(within(slice, &lo, &hi));
            }
        }
        PageUse::Scan => {
            let reads = futures::future::try_join_all(
                plans.iter().map(|plan| plan.table.read_frames_with(store, plan.frames.clone(), PageUse::Scan)),
            )
            .await?;
            entries.extend(reads.into_iter().flatten());
        }
    }
    entries.retain(|entry| lo <= *entry && *entry <= hi);
    entries.sort_unstable();
    Ok((entries, plans.into_iter().filter_map(|plan| plan.frontier).chain(memtable_frontier)))
}

/// Cut between entries, the memtables' entries of the range (`from`, all at or above `lo`) are
/// one more source of about `want`: the first of them past `lo` from the `want`th on, if any,
/// ends the part there (sorting `from`).
fn memtables_frontier<E: Entry>(from: &mut [E], lo: E, want: usize) -> Option<E> {
    if from.len() <= want {
        return None;
    }
    from.sort_unstable();
    from[want..].iter().copied().find(|entry| *entry > lo)
}

/// Whether the entries of `key` lie in the part a read with `frontier` covered.
fn is_covered(key: RecordId, frontier: Option<RecordId>, direction: Direction) -> bool {
    match (frontier, direction) {
        (None, _) => true,
        (Some(frontier), Direction::Ascending) => key < frontier,
        (Some(frontier), Direction::Descending) => key > frontier,
    }
}

/// The frames of one table a read takes, and the first entry of the frame where they stop short
/// of the range's far end.
struct Plan<E: Entry> {
    table: Arc<TableHandle<E>>,
    frames: Range<usize>,
    frontier: Option<E>,
}

/// The frames of `table` overlapping `lo..=hi` from the `direction` end until they hold `want`
/// entries; `None` when none overlap. Ascending, they stop before a frame that starts a key
/// past `lo`'s (every entry below that key is in the frames taken), or cut between entries, a
/// frame that starts past `lo`; descending, at a frame that starts a key short of `hi`'s (every
/// entry above that key is in the frames taken).
async fn plan_table<E: Entry>(
    table: &Arc<TableHandle<E>>,
    store: &dyn Store,
    (lo, hi): (E, E),
    direction: Direction,
    want: usize,
    (cut, with): (Cut, PageUse),
) -> Result<Option<Plan<E>>, ReadError> {
    assert!(cut == Cut::Keys || direction == Direction::Ascending, "entries are cut ascending only");
    let starts_past_lo = |first: &E| match cut {
        Cut::Keys => first.key() > lo.key(),
        Cut::Entries => *first > lo,
    };
    table.fetch_meta_for_range_ends(store, lo, hi).await?;
    let all = table.frames_overlapping_each([(lo, hi)], with)?.pop().expect("one range asked");
    if all.is_empty() {
        return Ok(None);
    }
    let plan = |frames, frontier| Ok(Some(Plan { table: table.clone(), frames, frontier }));
    let mut taken = 0usize;
    match direction {
        Direction::Ascending => {
            let mut end = all.start;
            while end < all.end {
                for info in frame_infos(table, store, end..(end + CHUNK_FRAMES).min(all.end), with).await? {
                    if taken >= want && starts_past_lo(&info.first) {
                        return plan(all.start..end, Some(info.first));
                    }
                    taken += info.entries as usize;
                    end += 1;
                }
            }
        }
        Direction::Descending => {
            let mut start = all.end;
            while start > all.start {
                let window = start.saturating_sub(CHUNK_FRAMES).max(all.start)..start;
                for info in frame_infos(table, store, window, with).await?.iter().rev() {
                    taken += info.entries as usize;
                    start -= 1;
                    if taken >= want && info.first.key() < hi.key() && start > all.start {
                        return plan(start..all.end, Some(info.first));
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
    with: PageUse,
) -> Result<Vec<FrameInfo<E>>, ReadError> {
    table.fetch_meta_for_frames(store, frames.clone()).await?;
    table.frame_infos(frames, with)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::record::{RunKind, TableRecord};
    use crate::lsm::table::TableOptions;
    use crate::lsm::tree::TreeCaches;
    use crate::model::ids::{AccountTally, Backlink, RecordId, TreeKind};
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
                    Direction::Ascending => (AccountTally::min_for_key(frontier), hi),
                    Direction::Descending => (lo, AccountTally::max_for_key(frontier)),
                };
            }
            found.sort_unstable();
            assert_eq!(found, entries, "{direction:?}");
        }
    }

    /// Accounts of two tallies each, all shifted by one: every frame of four entries starts in
    /// the middle of an account. A part of `want` 2 still reads about a frame, either way.
    #[test]
    fn a_part_reads_about_want_when_every_frame_starts_inside_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { frame_bytes: 4 * AccountTally::WIDTH, ..TableOptions::default() };
        let tree: Tree<AccountTally> = Tree::new(dir.path().join("t"), options, TreeCaches::of_bytes(0, 0)).unwrap();
        let mut entries = vec![tally((0, 1, 1, 1))];
        entries.extend((2..=200).flat_map(|account| [1, 2].map(|location| tally((0, account, location, 1)))));
        let id = "0000000000000001aaaaaaaa".to_string();
        let summary = tree.write_sorted(&id, || entries.iter().copied()).unwrap();
        let record = TableRecord::written(TreeKind::AccountTallies, id.clone(), (id, RunKind::Delta), (0, 1), &summary);
        tree.install(tree.open_table(record).unwrap(), None);
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let range = (entries[0], *entries.last().unwrap());
        for direction in [Direction::Ascending, Direction::Descending] {
            let part = runtime.block_on(read_range_part(&tree, &store, range, direction, 2)).unwrap();
            assert!((1..=8).contains(&part.entries.len()), "{direction:?}: {} entries", part.entries.len());
            assert!(part.frontier.is_some(), "{direction:?}");
        }
    }

    fn backlink((rkey, location, stamp): (u64, u64, u64)) -> Backlink {
        Backlink { target: TARGETS[0], source: RecordId { rkey, collection: 2, did: 5 }, location, source_rev: stamp }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// One key's entries (a target's backlinks, copies of one identity with other stamps
        /// among them) over runs and a memtable, walked a part at a time cut between entries:
        /// each part is exactly the range's entries from where it starts to below its frontier,
        /// holds about `want` a table and of the memtable, and the walk reaches the range's end.
        #[test]
        fn a_walk_cut_between_entries_reads_every_entry_of_one_key_once(
            runs in proptest::collection::vec(proptest::collection::vec((1..200u64, 1..3u64, 1..4u64), 0..150), 0..4),
            memtable in proptest::collection::vec((1..200u64, 1..3u64, 1..4u64), 0..60),
            want in 0..40usize,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let options = TableOptions { frame_bytes: 4 * Backlink::WIDTH, ..TableOptions::default() };
            let tree: Tree<Backlink> = Tree::new(dir.path().join("t"), options, TreeCaches::of_bytes(0, 0)).unwrap();
            let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
            let mut everything: Vec<Backlink> = memtable.iter().copied().map(backlink).collect();
            everything.sort_unstable();
            everything.dedup();
            for (at, run) in runs.iter().enumerate() {
                let mut entries: Vec<Backlink> = run.iter().copied().map(backlink).collect();
                entries.sort_unstable();
                entries.dedup();
                everything.extend(&entries);
                let id = format!("{:016x}aaaaaaaa", at + 1);
                let summary = tree.write_sorted(&id, || entries.iter().copied()).unwrap();
                let record = TableRecord::written(TreeKind::Links, id.clone(), (id, RunKind::Delta), (0, 1), &summary);
                tree.install(tree.open_table(record).unwrap(), None);
            }
            tree.insert(memtable.iter().copied().map(backlink));
            everything.sort_unstable();
            let (mut lo, hi) = (Backlink::min_for_key(TARGETS[0]), Backlink::max_for_key(TARGETS[0]));
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut walked = Vec::new();
            for _ in 0..1_000 {
                let with = if want % 2 == 0 { PageUse::Scan } else { PageUse::Lookup };
                let part = runtime.block_on(read_entries_part(&tree, &store, (lo, hi), want, with)).unwrap();
                let expected: Vec<Backlink> = everything
                    .iter()
                    .filter(|e| lo <= **e && part.frontier.is_none_or(|frontier| **e < frontier))
                    .copied()
                    .collect();
                prop_assert_eq!(&part.entries, &expected);
                walked.extend(part.entries.iter().copied());
                let bound = (runs.len() + 1) * (want.max(1) + 8);
                prop_assert!(part.entries.len() <= bound, "{} entries for {want}", part.entries.len());
                let Some(frontier) = part.frontier else {
                    walked.dedup();
                    let mut all = everything.clone();
                    all.dedup();
                    prop_assert_eq!(walked, all);
                    return Ok(());
                };
                prop_assert!(frontier > lo && frontier <= hi, "each part covers at least one entry more");
                lo = frontier;
            }
            prop_assert!(false, "the walk never ended");
        }

        /// Over runs of tables of a few entries a frame (an account's entries often straddle two)
        /// and a memtable, each part read holds exactly every copy of the range's entries in the
        /// part it says it covers (whole keys), reads about `want` a table, and covers at least
        /// one more key, so that a walk going on from each frontier reaches the range's far end.
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
                    .filter(|e| lo_now <= **e && **e <= hi && is_covered(e.key(), part.frontier, direction))
                    .copied()
                    .collect();
                expected.sort_unstable();
                prop_assert_eq!(&part.entries, &expected);
                let Some(frontier) = part.frontier else { return Ok(()) };
                // Each read covers at least one key more, whatever `want`, and no more than
                // `want` entries a table, a frame's (four here) and the first key's (six at most).
                prop_assert!(lo_now.key() <= frontier && frontier <= hi.key());
                let bound = runs.len() * (want.max(1) + 12) + memtable.len();
                prop_assert!(part.entries.len() <= bound, "{} entries for {want}", part.entries.len());
                match direction {
                    Direction::Ascending => {
                        prop_assert!(frontier > lo_now.key());
                        lo_now = AccountTally::min_for_key(frontier);
                    }
                    Direction::Descending => {
                        prop_assert!(frontier < hi.key());
                        hi = AccountTally::max_for_key(frontier);
                    }
                }
            }
            prop_assert!(false, "the walk never ended");
        }
    }
}
