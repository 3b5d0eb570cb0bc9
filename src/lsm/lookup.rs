//! Point reads: every entry of a few keys (or of a few filter prefixes, `Entry::FILTER_WIDTH`),
//! from a tree's memtables and tables, in one concurrent round of ranged reads (a query's
//! revocation round, the many-to-many forward round, a flush's tallies); and a writer's reads of
//! whole key ranges sharing a shard prefix (an account's hot links).
//!
//! Invariants:
//! - Only tables whose filter admits a lookup are read (a filter of keys asked for the key, one
//!   of longer prefixes for the prefix, or nothing when the lookup names no prefix), and of each
//!   only the frames that can hold it; frames of several lookups in one table that touch or
//!   overlap are fetched by one read.
//! - Every copy of every key (or prefix) asked for, in the snapshot taken at one instant, is
//!   returned (in no particular order): choosing among copies is the caller's. With a bound on a
//!   key, every copy stamped above it.

use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::{Entry, filter_prefix_bounds, shard_prefix_hash, within};
use crate::lsm::filter::KeyHash;
use crate::lsm::handle::{FilterProbe, ReadError, TableHandle};
use crate::lsm::run::{group_by_shard, shard_hash};
use crate::lsm::table::PageUse;
use crate::lsm::tree::{Look, Snapshot, Tree};
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
    let looks = KeyLooks::of(keys);
    let (mut found, reads) = plan_reads(tree, store, &looks, PageUse::Lookup).await?;
    let fetched = futures::future::try_join_all(reads.iter().map(|(table, frames, members)| {
        let span = members.iter().fold((RecordId::MAX, RecordId::MIN), |(lo, hi), &i| {
            let key = looks.looks[i].key;
            (lo.min(key), hi.max(key))
        });
        table.read_frame_slices(store, frames.clone(), span)
    }))
    .await?;
    // Each read is sorted: search it for the keys it was made for instead of scanning it.
    for ((_, _, members), slices) in reads.iter().zip(&fetched) {
        for slice in slices {
            looks.extend_with(&mut found, slice, members);
        }
    }
    Ok(found)
}

/// `read_keys` for a writer (a flush's tallies): the frames, filter pages and index chunks it
/// reads go to no cache, so that what queries keep there stays, and a writer that never queries
/// holds none. Many keys are read a part at a time (`hash_parts`), so what it holds besides the
/// entries it finds is one part's plan.
pub async fn read_keys_uncached<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[RecordId],
) -> Result<Vec<E>, ReadError> {
    read_keys_in_parts(tree, store, unbounded(keys)).await
}

/// `read_keys_newer` for a writer: `read_keys_uncached` with a bound on each key.
pub async fn read_keys_newer_uncached<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: &[(RecordId, Option<u64>)],
) -> Result<Vec<E>, ReadError> {
    read_keys_in_parts(tree, store, keys.to_vec()).await
}

/// The writer's lookups of `keys`, a part of them at a time (`hash_parts`).
async fn read_keys_in_parts<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    keys: Vec<(RecordId, Option<u64>)>,
) -> Result<Vec<E>, ReadError> {
    let mut found = Vec::new();
    for part in hash_parts(keys, |(key, _)| KeyHash::of_record(key)) {
        found.extend(read_looks_uncached(tree, store, &KeyLooks::of(&part)).await?);
    }
    Ok(found)
}

/// Every entry that agrees with one of `probes` in its first `Entry::FILTER_WIDTH` bytes, for a
/// writer (as `read_keys_uncached`). Tables whose filters hold such prefixes are asked for
/// exactly them: a lookup of one account tally's group skips the tables that hold only other
/// groups of its key.
///
/// The lookups are planned at once, some 300 bytes each: a caller with many (a flush may ask for
/// as many account tallies as it holds links, a million at the default `memtable_bytes`) reads
/// them in `prefix_parts`.
pub async fn read_prefixes_uncached<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    probes: &[E],
) -> Result<Vec<E>, ReadError> {
    let looks = KeyLooks {
        looks: probes.iter().map(Look::of_prefix).collect(),
        bounds: probes.iter().map(filter_prefix_bounds).collect(),
    };
    read_looks_uncached(tree, store, &looks).await
}

/// `items` cut into parts of about `MAX_LOOKS_PER_PART`, to read their probes (`probe_of`) with
/// `read_prefixes_uncached` a part at a time: a part is the items whose prefix hashes fall in
/// one slice of the hash space, in slice order. In filters that hold the prefixes (the account
/// tallies') the high bits of that hash choose the block, so each part reads its own slice of
/// every filter's pages and the parts together read each page about once, as one plan would.
pub fn prefix_parts<T, E: Entry>(items: Vec<T>, probe_of: impl Fn(&T) -> E) -> Vec<Vec<T>> {
    hash_parts(items, |item| prefix_hash(&probe_of(item)))
}

/// `items` cut into parts of about `MAX_LOOKS_PER_PART` by the filter hash of each (`hash_of`):
/// a part is the items whose hashes fall in one slice of the hash space, in slice order. A
/// filter's block is chosen by the high bits of the hash it holds, so the parts read disjoint
/// slices of each filter's pages.
fn hash_parts<T>(items: Vec<T>, hash_of: impl Fn(&T) -> KeyHash) -> Vec<Vec<T>> {
    let count = items.len().div_ceil(MAX_LOOKS_PER_PART).max(1);
    if count == 1 {
        return vec![items];
    }
    let mut parts: Vec<Vec<T>> = (0..count).map(|_| Vec::new()).collect();
    for item in items {
        parts[hash_of(&item).block_index(count)].push(item);
    }
    parts
}

/// About the most lookups a part of `hash_parts` holds (some 20 MiB of plan). A flush at
/// 100 M links asks for tens of thousands of account tallies and more than a hundred thousand
/// hot links of its sources: a few parts. Smaller parts (16,384) of account tallies did not
/// lower the import's peak there, and those reads took a sixth more time (likely each part
/// reading its frames and frame-index chunks on its own; not profiled).
const MAX_LOOKS_PER_PART: usize = 1 << 16;

/// The hash of `probe`'s filter prefix.
fn prefix_hash<E: Entry>(probe: &E) -> KeyHash {
    FilterProbe::of_prefix(probe).prefix.expect("a prefix probe names its prefix")
}

/// The entries of `looks`, for a writer: through no cache.
async fn read_looks_uncached<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    looks: &KeyLooks<E>,
) -> Result<Vec<E>, ReadError> {
    let (mut found, reads) = plan_reads(tree, store, looks, PageUse::Scan).await?;
    read_uncached(store, &reads, |entries, members| looks.extend_with(&mut found, entries, members)).await?;
    Ok(found)
}

/// Lookups, each with the entries it wants (`lo..=hi`: a key's, or a filter prefix's).
struct KeyLooks<E> {
    looks: Vec<Look>,
    bounds: Vec<(E, E)>,
}

impl<E: Entry> KeyLooks<E> {
    /// Lookups of every entry of each key, above its bound.
    fn of(keys: &[(RecordId, Option<u64>)]) -> Self {
        KeyLooks {
            looks: keys.iter().map(|&(key, bound)| Look::of_key(key, bound)).collect(),
            bounds: keys.iter().map(|(key, _)| (E::min_for_key(*key), E::max_for_key(*key))).collect(),
        }
    }

    /// Adds the entries `members` (indices of looks) want from the sorted `entries`.
    fn extend_with(&self, found: &mut Vec<E>, entries: &[E], members: &[usize]) {
        extend_within(found, entries, &self.bounds, members);
    }
}

/// Adds the entries of the sorted `entries` within `bounds[i]` (`lo..=hi`) for each of `members`.
fn extend_within<E: Entry>(found: &mut Vec<E>, entries: &[E], bounds: &[(E, E)], members: &[usize]) {
    for &i in members {
        let (lo, hi) = &bounds[i];
        found.extend_from_slice(within(entries, lo, hi));
    }
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
async fn read_uncached<E: Entry>(
    store: &dyn Store,
    reads: &[Read<E>],
    mut take: impl FnMut(&[E], &[usize]),
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

/// One table's frames to read for some lookups (indices of them).
type Read<E> = (Arc<TableHandle<E>>, Range<usize>, Vec<usize>);

/// The memtables' entries of `looks`, and the ranged reads that find theirs in tables. A scan's
/// filter pages and index chunks go to no cache.
async fn plan_reads<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    looks: &KeyLooks<E>,
    with: PageUse,
) -> Result<(Vec<E>, Vec<Read<E>>), ReadError> {
    let snapshot = tree.snapshot(looks.bounds.iter().copied());
    let reads = table_reads(&snapshot, store, looks, with).await?;
    Ok((snapshot.memtable_entries, reads))
}

/// The ranged reads that find the entries of `looks` in the tables of `snapshot`.
async fn table_reads<E: Entry>(
    snapshot: &Snapshot<E>,
    store: &dyn Store,
    looks: &KeyLooks<E>,
    with: PageUse,
) -> Result<Vec<Read<E>>, ReadError> {
    let keys: Vec<(RecordId, Option<u64>)> = looks.looks.iter().map(|look| (look.key, look.bound)).collect();
    snapshot.fetch_metas_for_keys(store, &keys).await?;
    let mut reads = Vec::new();
    for (table, members) in snapshot.tables_for_looks(&looks.looks, with) {
        let frames = table.frames_overlapping_each(members.iter().map(|&i| looks.bounds[i]), with)?;
        for (frames, members) in coalesce(frames.into_iter().zip(members).collect()) {
            reads.push((table.clone(), frames, members));
        }
    }
    Ok(reads)
}

/// Every entry whose key is in one of `ranges` (each `first..=last`), from memtables and tables,
/// in no particular order. The keys of a range must agree in their first `E::SHARD_WIDTH` bytes
/// (an account's hot links), so that one table of each compacted run holds them all. A table
/// whose filter holds shard prefixes (`Entry::FILTER_HOLDS_SHARDS`) is skipped for a range it
/// proves it holds nothing of; the others are asked their frame index. The frames of all ranges
/// in one table are read together. For a writer: the frames, filter pages and index chunks read
/// go to no cache.
pub async fn read_key_ranges<E: Entry>(
    tree: &Tree<E>,
    store: &dyn Store,
    ranges: &[(RecordId, RecordId)],
) -> Result<Vec<E>, ReadError> {
    let bounds: Vec<(E, E)> = ranges.iter().map(|(first, last)| key_range_bounds(*first, *last)).collect();
    let snapshot = tree.snapshot(bounds.iter().copied());
    let reads = range_reads(&snapshot, ranges, &bounds)?;
    let mut found = snapshot.memtable_entries;
    read_uncached(store, &reads, |entries, ats| extend_within(&mut found, entries, &bounds, ats)).await?;
    Ok(found)
}

/// The tables' reads of `read_key_ranges`: for each run, the frames of the ranges (`bounds`, one a
/// range) its table of their shard may hold, coalesced.
fn range_reads<E: Entry>(
    snapshot: &Snapshot<E>,
    ranges: &[(RecordId, RecordId)],
    bounds: &[(E, E)],
) -> Result<Vec<Read<E>>, ReadError> {
    let prefixes: Vec<KeyHash> = ranges.iter().map(|(first, _)| shard_prefix_hash::<E>(first)).collect();
    let mut reads = Vec::new();
    for run in snapshot.runs.iter() {
        let shards = ranges.iter().enumerate().map(|(at, (first, _))| (run.shard_for_hash(shard_hash::<E>(first)), at));
        for (shard, ats) in group_by_shard(shards) {
            let table = &run.tables[shard];
            let held = table.may_hold_shards(&ats.iter().map(|&at| prefixes[at]).collect::<Vec<_>>(), PageUse::Scan);
            let ats: Vec<usize> = ats.into_iter().zip(held).filter_map(|(at, held)| held.then_some(at)).collect();
            let frames = table.frames_overlapping_each(ats.iter().map(|at| bounds[*at]), PageUse::Scan)?;
            for (frames, ats) in coalesce(frames.into_iter().zip(ats).collect()) {
                reads.push((table.clone(), frames, ats));
            }
        }
    }
    Ok(reads)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::handle::FilterProbe;
    use crate::lsm::record::{RunKind, TableRecord};
    use crate::lsm::table::TableOptions;
    use crate::lsm::tree::TreeCaches;
    use crate::model::ids::{AccountTally, Backlink, HotLink};
    use std::collections::BTreeSet;

    const TARGET: RecordId = RecordId { rkey: 7, collection: 1, did: 9 };
    const ACCOUNTS: u64 = 2_000;

    fn tally(account: u64, location: u64, stamp: u64) -> AccountTally {
        AccountTally::of(account, TARGET, (3, location), stamp, 1)
    }

    /// Writes `entries` (sorted, unique) as a new run of `tree`.
    fn install<E: Entry>(tree: &Tree<E>, id: &str, entries: &[E]) {
        let summary = tree.write_sorted(id, || entries.iter().copied()).unwrap();
        let record = TableRecord::written(E::TREE, id.to_string(), (id.to_string(), RunKind::Delta), (0, 1), &summary);
        tree.install(tree.open_table(record).unwrap(), None);
    }

    /// Every account has a tally of location 1 in the older table, every even one of location 2
    /// in the newer: a lookup of an account's location 2 asks the older table's filter for that
    /// identity (not the key both share) and is turned away, and finds exactly its entries.
    #[test]
    fn a_prefix_lookup_skips_tables_that_hold_only_other_groups_of_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<AccountTally> =
            Tree::new(dir.path().join("t"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let older: Vec<AccountTally> = (1..=ACCOUNTS).map(|account| tally(account, 1, 1)).collect();
        let newer: Vec<AccountTally> = (1..=ACCOUNTS).step_by(2).map(|account| tally(account, 2, 2)).collect();
        install(&tree, "0000000000000001aaaaaaaa", &older);
        install(&tree, "0000000000000002aaaaaaaa", &newer);
        tree.insert([tally(4, 2, 3)]);
        let probes: Vec<AccountTally> = (1..=ACCOUNTS).map(|account| tally(account, 2, 0)).collect();
        let looks: Vec<Look> = probes.iter().map(Look::of_prefix).collect();
        let snapshot = tree.snapshot([]);
        let admitted = snapshot.tables_for_looks(&looks, PageUse::Scan);
        let by_older = admitted.iter().find(|(table, _)| table.record.id.starts_with("0000000000000001"));
        let false_positives = by_older.map_or(0, |(_, members)| members.len());
        assert!(false_positives < ACCOUNTS as usize / 20, "{false_positives} lookups read the older table");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let found: BTreeSet<AccountTally> =
            runtime.block_on(read_prefixes_uncached(&tree, &store, &probes)).unwrap().into_iter().collect();
        let mut expected: BTreeSet<AccountTally> = newer.iter().copied().collect();
        expected.insert(tally(4, 2, 3));
        assert_eq!(found, expected);
        // A lookup of keys alone cannot ask such filters: it reads both tables, and finds all.
        let keys: Vec<RecordId> = (1..=ACCOUNTS).map(|account| tally(account, 1, 0).key()).collect();
        let all: BTreeSet<AccountTally> =
            runtime.block_on(read_keys(&tree, &store, &keys)).unwrap().into_iter().collect();
        assert_eq!(all, older.iter().chain(&newer).chain(&[tally(4, 2, 3)]).copied().collect());
    }

    /// Every account has hot links in the older table, every other one in the newer: a read of
    /// an account's whole range skips the newer table when it holds none of them (its filter
    /// holds each account's prefix), and finds every entry, memtables' too.
    #[test]
    fn a_range_read_skips_tables_that_hold_nothing_of_its_shard() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<HotLink> =
            Tree::new(dir.path().join("t"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let hot = |account: u64, rkey: u64, stamp: u64| {
            let source = RecordId { rkey, collection: 3, did: account };
            HotLink::of(Backlink { target: TARGET, source, location: 1, source_rev: stamp })
        };
        let older: Vec<HotLink> = (1..=ACCOUNTS).flat_map(|a| (1..=3).map(move |r| hot(a, r, 1))).collect();
        let newer: Vec<HotLink> = (2..=ACCOUNTS).step_by(2).map(|a| hot(a, 9, 2)).collect();
        install(&tree, "0000000000000001aaaaaaaa", &older);
        install(&tree, "0000000000000002aaaaaaaa", &newer);
        tree.insert([hot(3, 7, 3)]);
        let odd: Vec<(RecordId, RecordId)> = (1..=ACCOUNTS).step_by(2).map(HotLink::account_keys).collect();
        let bounds: Vec<(HotLink, HotLink)> = odd.iter().map(|(first, last)| key_range_bounds(*first, *last)).collect();
        let snapshot = tree.snapshot(bounds.iter().copied());
        let reads = range_reads(&snapshot, &odd, &bounds).unwrap();
        let of_newer: usize = reads
            .iter()
            .filter(|(table, _, _)| table.record.id.starts_with("0000000000000002"))
            .map(|(_, _, ats)| ats.len())
            .sum();
        assert!(of_newer < ACCOUNTS as usize / 40, "{of_newer} of {} ranges read the newer table", odd.len());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let found: BTreeSet<HotLink> =
            runtime.block_on(read_key_ranges(&tree, &store, &odd)).unwrap().into_iter().collect();
        let mut expected: BTreeSet<HotLink> = older.iter().filter(|h| h.account % 2 == 1).copied().collect();
        expected.insert(hot(3, 7, 3));
        assert_eq!(found, expected);
        let all: Vec<(RecordId, RecordId)> = (1..=ACCOUNTS).map(HotLink::account_keys).collect();
        let found = runtime.block_on(read_key_ranges(&tree, &store, &all)).unwrap();
        assert_eq!(found.len(), older.len() + newer.len() + 1, "every account's links, from both tables");
    }

    /// Which of `parts` equal slices of the filter hash space `probe`'s prefix hash falls in.
    fn filter_slice<E: Entry>(probe: &E, parts: usize) -> usize {
        prefix_hash(probe).block_index(parts)
    }

    /// More probes than one part plans: they are cut by their filter hashes into parts that
    /// together hold each probe once, and every entry of every probe is found, in tables and in
    /// the memtable alike.
    #[test]
    fn a_prefix_lookup_of_many_probes_reads_them_in_parts_and_finds_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<AccountTally> =
            Tree::new(dir.path().join("t"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let accounts = 2 * MAX_LOOKS_PER_PART as u64 + 1_000;
        let older: Vec<AccountTally> = (1..=accounts).map(|account| tally(account, 1, 1)).collect();
        let newer: Vec<AccountTally> = (1..=accounts).step_by(3).map(|account| tally(account, 2, 2)).collect();
        install(&tree, "0000000000000001aaaaaaaa", &older);
        install(&tree, "0000000000000002aaaaaaaa", &newer);
        tree.insert([tally(5, 2, 3)]);
        let probes: Vec<AccountTally> =
            (1..=accounts).flat_map(|account| [tally(account, 1, 0), tally(account, 2, 0)]).collect();
        let parts = probes.len().div_ceil(MAX_LOOKS_PER_PART);
        let mut sizes = vec![0; parts];
        probes.iter().for_each(|probe| sizes[filter_slice(probe, parts)] += 1);
        assert!(sizes.iter().all(|&size| size > 0 && size < 2 * MAX_LOOKS_PER_PART), "{sizes:?}");
        // Each part's probes fall in filter blocks of their own, in part order, whatever the
        // filter's size: the parts read disjoint runs of pages (but for one page at each seam).
        for blocks in [1_000, 77_777, 1 << 22] {
            let mut spans = vec![(usize::MAX, 0); parts];
            for probe in &probes {
                let block = FilterProbe::of_prefix(probe).prefix.unwrap().block_index(blocks);
                let span = &mut spans[filter_slice(probe, parts)];
                *span = (span.0.min(block), span.1.max(block));
            }
            assert!(spans.windows(2).all(|pair| pair[0].1 <= pair[1].0), "{blocks} blocks: {spans:?}");
        }
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let by_part = prefix_parts(probes.clone(), |probe| *probe);
        assert_eq!(by_part.iter().map(Vec::len).collect::<Vec<_>>(), sizes);
        let mut found = Vec::new();
        for part in &by_part {
            assert!(part.iter().all(|probe| filter_slice(probe, parts) == filter_slice(&part[0], parts)));
            found.extend(runtime.block_on(read_prefixes_uncached(&tree, &store, part)).unwrap());
        }
        found.sort_unstable();
        let mut expected: Vec<AccountTally> = older.iter().chain(&newer).copied().collect();
        expected.push(tally(5, 2, 3));
        expected.sort_unstable();
        assert_eq!(found, expected);
    }

    /// In a tree whose filters hold keys, a prefix lookup asks them for the key and finds every
    /// entry agreeing in the prefix (here the key itself).
    #[test]
    fn a_prefix_lookup_asks_filters_of_keys_for_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<Backlink> =
            Tree::new(dir.path().join("t"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let link = |target: u64, source: u64| Backlink {
            target: RecordId { rkey: target, collection: 1, did: 2 },
            source: RecordId { rkey: source, collection: 3, did: 4 },
            location: 5,
            source_rev: 6,
        };
        let entries: Vec<Backlink> =
            (1..=500).flat_map(|target| (1..=3).map(move |source| link(target, source))).collect();
        install(&tree, "0000000000000001aaaaaaaa", &entries);
        let probes = [link(7, 9), link(501, 1)];
        assert_eq!(FilterProbe::of_prefix(&probes[0]).key, FilterProbe::of_key(&probes[0].key()).key);
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut found = runtime.block_on(read_prefixes_uncached(&tree, &store, &probes)).unwrap();
        found.sort_unstable();
        assert_eq!(found, [link(7, 1), link(7, 2), link(7, 3)]);
    }

    /// A writer's lookup of more keys than one part plans reads them in parts that hold each key
    /// once, each part's keys in a slice of the key hash space of its own (so of every filter's
    /// blocks), and finds every entry of every key, bounds kept, in tables and memtable alike.
    #[test]
    fn a_key_lookup_of_many_keys_reads_them_in_parts_and_finds_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<Backlink> =
            Tree::new(dir.path().join("t"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let target = |n: u64| RecordId { rkey: n, collection: 1, did: 2 };
        let link = |n: u64, stamp: u64| Backlink {
            target: target(n),
            source: RecordId { rkey: n, collection: 3, did: 4 },
            location: 5,
            source_rev: stamp,
        };
        let keys = 2 * MAX_LOOKS_PER_PART as u64 + 1_000;
        let older: Vec<Backlink> = (1..=keys).map(|n| link(n, 1)).collect();
        let newer: Vec<Backlink> = (1..=keys).step_by(3).map(|n| link(n, 2)).collect();
        install(&tree, "0000000000000001aaaaaaaa", &older);
        install(&tree, "0000000000000002aaaaaaaa", &newer);
        tree.insert([link(5, 3)]);
        let targets: Vec<RecordId> = (1..=keys).map(target).collect();
        let parts = hash_parts(targets.clone(), KeyHash::of_record);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|part| !part.is_empty() && part.len() < 2 * MAX_LOOKS_PER_PART));
        let mut spans = vec![];
        for part in &parts {
            let blocks: Vec<usize> = part.iter().map(|key| KeyHash::of_record(key).block_index(1 << 20)).collect();
            spans.push((blocks.iter().min().copied().unwrap(), blocks.iter().max().copied().unwrap()));
        }
        assert!(spans.windows(2).all(|pair| pair[0].1 <= pair[1].0), "{spans:?}");
        let mut each_once: Vec<RecordId> = parts.concat();
        each_once.sort_unstable();
        assert_eq!(each_once, targets);

        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut found = runtime.block_on(read_keys_uncached(&tree, &store, &targets)).unwrap();
        found.sort_unstable();
        let mut expected: Vec<Backlink> = older.iter().chain(&newer).copied().chain([link(5, 3)]).collect();
        expected.sort_unstable();
        assert_eq!(found, expected);
        // Above a bound of 1, the older table (all stamped 1) is read for none of them.
        let bounded: Vec<(RecordId, Option<u64>)> = targets.iter().map(|key| (*key, Some(1))).collect();
        let mut found = runtime.block_on(read_keys_newer_uncached(&tree, &store, &bounded)).unwrap();
        found.sort_unstable();
        let mut expected: Vec<Backlink> = newer.iter().copied().chain([link(5, 3)]).collect();
        expected.sort_unstable();
        assert_eq!(found, expected);
    }
}
