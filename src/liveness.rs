//! Liveness: which backlinks are alive, given the revocations written after them.
//!
//! The rule is `Backlink::survives`: a backlink is live iff its stamp is at or above both the
//! newest revocation of its source record and the newest revocation of its source's repository.
//! It is applied in two places, each with what it can know:
//! - a writer (a flush, a merge) drops the backlinks that a revocation it knows for certain kills,
//!   and a merge settles the stamps of the survivors (`KnownRevocations`);
//! - a query's second round reads the thresholds of exactly the sources of its candidates
//!   (`read_thresholds`), from every memtable and table of the revocation tree.
//!
//! Hidden accounts (deactivated, suspended, taken down) are not revocations: the index keeps that
//! set and the query applies it.
//!
//! Invariants:
//! - A merge drops a backlink only when a revocation that is already in a *table* of the
//!   revocation tree kills it (stamp below its record- or repo-level threshold); a flush only
//!   when a revocation frozen with it kills it, which commits in the same catalog transaction.
//!   Revocations are never dropped (only superseded by newer ones for the same source), so such
//!   a backlink is dead for every reader forever: dropping it only saves space. No other
//!   memtable's revocations are consulted, so a crash cannot lose the reason a backlink was
//!   dropped.
//! - A merge holds at most `max_thresholds` revocations, the newest: it knows every revocation
//!   stamped at or above `KnownRevocations::complete_from` and none below it.
//! - A surviving backlink stamped in `[complete_from, complete_through]` is written with its
//!   stamp raised to `complete_through`, which changes no answer (proof at
//!   `KnownRevocations::settle`), leaves the stamp column of a merged table nearly all one
//!   value, which compresses to almost nothing, and lets a query skip the revocation tables
//!   whose revocations are all at or below a candidate's stamp.
//! - A query's thresholds hold, for every key asked for, the newest revocation of that key in the
//!   snapshot it read (memtables and tables taken at one instant) when it is above the oldest
//!   stamp of the links the key was asked for, else a value at most that stamp.

use crate::base::positions::PositionIndex;
use crate::lsm::compaction::CompactionOptions;
use crate::lsm::entry::Entry;
use crate::lsm::filter::{Filter, FilterBuilder, KeyHash};
use crate::lsm::handle::ReadError;
use crate::lsm::lookup::read_keys_newer;
use crate::lsm::run::Run;
use crate::lsm::scan::TableScan;
use crate::lsm::tree::Tree;
use crate::model::ids::{Backlink, ForwardLink, HotLink, RecordId, Revocation};
use crate::store::object::Store;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// The newest revocation of every source that a writer knows for certain, for dropping killed
/// backlinks and settling stamps: a merge's from the revocation tree's tables (`load`, only the
/// newest past its limit), a flush's from its frozen revocation memtable (`of_flush`). A merge asks it twice
/// per backlink, in target order, so the sources come at random: an index of positions
/// (`base::positions`, 8 bytes per bucket, at most 3/4 full) finds a source in one or two cache
/// misses, where a binary search would miss the cache at every step. Most sources asked for
/// were never revoked: a filter of the sources (`lsm::filter`, 1 % false positives, about 1.2
/// bytes a revocation: 600 KiB for 512 Ki, which the CPU's caches hold) answers those without
/// touching the index. The revocations themselves stay in one vector, 32 bytes each.
#[derive(Debug)]
pub struct KnownRevocations {
    /// Sorted by source, one per source: its newest revocation.
    newest: Vec<Revocation>,
    /// Positions in `newest`, by the hash of their source.
    by_source: PositionIndex,
    /// Every source in `newest`.
    sources: Filter,
    /// Every revocation stamped at or below this is in `newest`: the ingest clock of the last
    /// flush whose tables were installed before the revocation tables were read (0 for a flush's).
    complete_through: u64,
    /// Every revocation stamped at or above this is in `newest` (0: every one). A merge past its
    /// limit keeps only the newest.
    complete_from: u64,
}

impl KnownRevocations {
    /// The memory it holds: the revocations, their index by source and the filter of sources.
    pub fn memory_bytes(&self) -> usize {
        self.newest.capacity() * size_of::<Revocation>() + self.by_source.memory_bytes() + self.sources.encoded_len()
    }

    /// What a flush knows: the revocations frozen with its backlinks, which commit with them, so
    /// a backlink they kill is dead for good. Complete through no clock, so `settle` lowers no
    /// stamp (proving that no revocation table holds a source's threshold would cost a flush a
    /// read of every revocation table).
    pub fn of_flush(revocations: Vec<Revocation>) -> Self {
        Self::from_revocations(revocations, 0, 0)
    }

    /// What a merge knows: the newest revocations in `runs`, at most `options.max_thresholds` of
    /// them, and every one stamped at or above the floor it reports (`complete_from`). Memory is
    /// bounded by the option, not by the tree: the scan keeps a buffer of one and a half times the
    /// limit and cuts it back to the newest `max_thresholds` whenever it fills. It starts from
    /// what earlier merges read (`read`) and scans only the runs they did not; give it back with
    /// `RevocationsRead::keep` after the merge. `complete_through` is a clock every revocation
    /// at or below which is in `runs`.
    pub fn load(
        runs: &[Arc<Run<Revocation>>],
        complete_through: u64,
        store: &dyn Store,
        runtime: &tokio::runtime::Handle,
        options: &CompactionOptions,
        read: &mut RevocationsRead,
    ) -> Result<Self, ReadError> {
        read.runs.retain(|id| runs.iter().any(|run| run.id == *id));
        let unread: Vec<&Arc<Run<Revocation>>> = runs.iter().filter(|run| !read.runs.contains(&run.id)).collect();
        let expected = unread.iter().map(|r| r.entries()).sum::<u64>() + read.newest.len() as u64;
        let mut newest = NewestRevocations::new(options.max_thresholds, expected);
        newest.resume(std::mem::take(&mut read.newest), read.floor);
        read.floor = 0;
        // What earlier merges read is now only in `newest`: a scan that fails must not leave
        // `read` naming runs whose revocations it no longer holds (the next load would think
        // itself complete without them). It forgets them all, and the next load reads them again.
        let scanned = unread.iter().flat_map(|r| r.tables.iter()).try_for_each(|table| {
            let mut scan = TableScan::new(table.clone(), options.frames_per_read)?;
            while let Some(revocation) = scan.next(store, runtime)? {
                newest.push(revocation);
            }
            Ok(())
        });
        if let Err(error) = scanned {
            *read = RevocationsRead::default();
            return Err(error);
        }
        read.runs.extend(unread.iter().map(|run| run.id.clone()));
        let (revocations, complete_from) = newest.finish();
        Ok(Self::from_revocations(revocations, complete_through, complete_from))
    }

    /// Keeps the newest revocation of each source from `revocations` (any order), which hold
    /// every revocation stamped at or below `complete_through` and at or above `complete_from`.
    fn from_revocations(mut revocations: Vec<Revocation>, complete_through: u64, complete_from: u64) -> Self {
        revocations.sort_unstable();
        // Sorted by (source, rev): the last of each source's run is its newest.
        revocations.reverse();
        revocations.dedup_by_key(|r| r.source);
        revocations.reverse();
        // Held until the next merge resumes from it: without a scan's spare room.
        revocations.shrink_to_fit();
        let mut by_source = PositionIndex::with_capacity(revocations.len());
        let mut sources = FilterBuilder::new(revocations.len(), SOURCES_FPR);
        let hash_of = |position: usize| source_hash(&revocations[position].source);
        for (position, revocation) in revocations.iter().enumerate() {
            by_source.insert(hash_of(position), position, hash_of);
            sources.insert(KeyHash::of_record(&revocation.source));
        }
        let sources = sources.finish();
        KnownRevocations { newest: revocations, by_source, sources, complete_through, complete_from }
    }

    fn threshold(&self, source: &RecordId) -> u64 {
        if !self.sources.may_contain(KeyHash::of_record(source)) {
            return 0;
        }
        let found = self.by_source.find(source_hash(source), |position| self.newest[position].source == *source);
        found.map_or(0, |position| self.newest[position].rev)
    }

    /// What a merge writes for `link`: nothing when a durable revocation kills it; else `link`,
    /// its stamp raised to `complete_through` when it is at most that and at least
    /// `complete_from`.
    ///
    /// Why that changes no answer. Liveness compares a stamp `s` with the newest revocation `r`
    /// of the source and of its repository (live iff `s >= r`), and a reader that finds copies
    /// of one link keeps the largest stamp. Let `t` be the known threshold (the newest known of
    /// either source, `t <= s` as the link survives), `f = complete_from` and
    /// `c = complete_through`. Every revocation of these two sources stamped in `[f, c]` is
    /// known, so at most `t <= s`; every one not yet written is stamped later by the ingest
    /// clock, above `c`. With `f <= s <= c`, no revocation of them is in `(s, c]`, so `s` and `c`
    /// compare alike with every revocation, now and later. A copy of the link elsewhere with a
    /// stamp `k`: if `k > c` it wins either way; if `s < k <= c` this one now wins instead, and
    /// `k` too compared alike with every revocation, as it lies in `[s, c]`; copies differ in
    /// nothing else. A link stamped below `f` may be killed by a revocation this merge does not
    /// know: it is kept as it is. Why raise: every settled stamp of a merge is then one value,
    /// which compresses to nothing, and a query looks for the revocations of a settled link only
    /// in revocation tables written after `c` (`read_thresholds`).
    pub fn settle(&self, link: Backlink) -> Option<Backlink> {
        let threshold = link.threshold(|key| self.threshold(key));
        if link.source_rev < threshold {
            return None;
        }
        let known_around = self.complete_from..=self.complete_through;
        let settled = if known_around.contains(&link.source_rev) { self.complete_through } else { link.source_rev };
        Some(Backlink { source_rev: settled, ..link })
    }
}

/// An entry that revocations kill: a backlink, or a forward link by its backlink's rule. Flushes
/// and merges drop and settle both through this one rule.
pub trait Revocable: Entry {
    /// `KnownRevocations::settle` of this entry: `None` when it is dead, else its settled copy.
    fn settle_by(self, known: &KnownRevocations) -> Option<Self>;
}

impl Revocable for Backlink {
    fn settle_by(self, known: &KnownRevocations) -> Option<Self> {
        known.settle(self)
    }
}

impl Revocable for ForwardLink {
    fn settle_by(self, known: &KnownRevocations) -> Option<Self> {
        known.settle(self.backlink()).map(Backlink::forward)
    }
}

impl Revocable for HotLink {
    fn settle_by(self, known: &KnownRevocations) -> Option<Self> {
        known.settle(self.backlink()).map(HotLink::of)
    }
}

/// What merges have read of the revocation tree, for the next merge: the newest revocations they
/// held (one per source), the floor from which those are complete, and the runs they read
/// whole. Invariant: every revocation in those runs stamped at or above `floor` is in `newest`
/// or superseded there by a newer one of its source.
#[derive(Debug, Default)]
pub struct RevocationsRead {
    newest: Vec<Revocation>,
    floor: u64,
    runs: HashSet<String>,
}

impl RevocationsRead {
    /// The memory it holds for the next merge.
    pub fn memory_bytes(&self) -> usize {
        self.newest.capacity() * size_of::<Revocation>()
    }

    /// Takes back what a merge held, for the next one.
    pub fn keep(&mut self, known: KnownRevocations) {
        self.newest = known.newest;
        self.floor = known.complete_from;
    }

    /// A merge of the revocation tree replaced `inputs` by `output`: what was read of the inputs
    /// covers the output (the same revocations, less superseded ones) when it covered them all.
    pub fn replaced(&mut self, inputs: &[String], output: &str) {
        if inputs.iter().all(|id| self.runs.contains(id)) {
            self.runs.insert(output.to_string());
        }
        inputs.iter().for_each(|id| {
            self.runs.remove(id);
        });
    }
}

/// The newest revocations of a scan in bounded memory: a buffer that, whenever it holds
/// `limit + limit / 2` of them, keeps only the `limit` newest (by stamp) and raises its floor past
/// the ones it dropped; revocations below the floor are not kept.
struct NewestRevocations {
    kept: Vec<Revocation>,
    limit: usize,
    capacity: usize,
    /// Room the buffer is given at once: the revocations the scan expects, up to `capacity`.
    reserve: usize,
    /// Every revocation pushed with a stamp at or above this is in `kept`.
    floor: u64,
}

impl NewestRevocations {
    /// `expected` is how many revocations the scan will push (only sizes the buffer, which is
    /// allocated at the first push or taken over by `resume`).
    fn new(limit: usize, expected: u64) -> Self {
        let capacity = limit.saturating_add(limit / 2).max(1);
        let reserve = usize::try_from(expected).unwrap_or(usize::MAX).min(capacity);
        // A limit of 0 keeps nothing: the floor starts above every stamp.
        let floor = if limit == 0 { u64::MAX } else { 0 };
        Self { kept: Vec::new(), limit, capacity, reserve, floor }
    }

    /// Starts from `kept`, complete from `floor`, as a scan that has already pushed them. Their
    /// vector becomes the buffer (grown in place), so the earlier revocations are never held twice.
    fn resume(&mut self, kept: Vec<Revocation>, floor: u64) {
        assert!(self.kept.is_empty(), "a scan resumes before its first push");
        self.floor = self.floor.max(floor);
        let floor = self.floor;
        self.kept = kept;
        self.kept.retain(|r| r.rev >= floor);
        self.reserve_room();
        if self.kept.len() >= self.capacity {
            self.cut();
        }
    }

    /// Grows the buffer to `reserve` in one step (the scan then pushes without reallocating).
    fn reserve_room(&mut self) {
        let len = self.kept.len();
        if self.reserve > len {
            self.kept.reserve_exact(self.reserve - len);
        }
    }

    fn push(&mut self, revocation: Revocation) {
        if revocation.rev < self.floor {
            return;
        }
        if self.kept.capacity() == 0 {
            self.reserve_room();
        }
        self.kept.push(revocation);
        if self.kept.len() >= self.capacity {
            self.cut();
        }
    }

    /// Keeps the `limit` newest: the floor moves just past the stamp the cut falls on, so a
    /// revocation is either kept or below the floor (ties at the cut all go).
    fn cut(&mut self) {
        let dropped = self.kept.len() - self.limit;
        let (_, pivot, _) = self.kept.select_nth_unstable_by_key(dropped, |r| r.rev);
        self.floor = pivot.rev.saturating_add(1);
        let floor = self.floor;
        self.kept.retain(|r| r.rev >= floor);
        assert!(self.kept.len() <= self.limit, "a cut keeps at most the limit");
    }

    /// The revocations kept and the floor from which they are complete.
    fn finish(self) -> (Vec<Revocation>, u64) {
        (self.kept, self.floor)
    }
}

/// False positives of `KnownRevocations::sources`: each costs one look in the index.
const SOURCES_FPR: f64 = 0.01;

fn source_hash(source: &RecordId) -> u64 {
    xxh3_64(&source.to_bytes())
}

/// The newest revocation stamp of each source asked for, read for one page (0 for a source never
/// revoked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceThresholds {
    /// Sorted by key, one per key.
    by_key: Vec<(RecordId, u64)>,
}

impl SourceThresholds {
    fn new(keys: impl Iterator<Item = RecordId>) -> Self {
        let mut by_key: Vec<(RecordId, u64)> = keys.map(|k| (k, 0)).collect();
        by_key.sort_unstable();
        by_key.dedup_by_key(|(k, _)| *k);
        SourceThresholds { by_key }
    }

    /// The threshold of `key`; 0 for a key that was not asked for.
    pub fn get(&self, key: &RecordId) -> u64 {
        self.by_key.binary_search_by(|(k, _)| k.cmp(key)).map_or(0, |i| self.by_key[i].1)
    }

    fn raise(&mut self, key: &RecordId, rev: u64) {
        if let Ok(i) = self.by_key.binary_search_by(|(k, _)| k.cmp(key)) {
            self.by_key[i].1 = self.by_key[i].1.max(rev);
        }
    }
}

/// The revocation keys that decide `links` (their sources and repositories), each bounded by the
/// oldest stamp of the links it decides: only a revocation stamped above that can kill one.
pub fn revocation_keys(links: impl IntoIterator<Item = Backlink>) -> Vec<(RecordId, Option<u64>)> {
    // A flush asks for hundreds of thousands of links of a few thousand accounts: one repository
    // key an account, not one a link.
    let mut oldest_of_repo: HashMap<u64, u64> = HashMap::new();
    let mut keys: Vec<(RecordId, Option<u64>)> = links
        .into_iter()
        .map(|link| {
            let oldest = oldest_of_repo.entry(link.source.did).or_insert(link.source_rev);
            *oldest = (*oldest).min(link.source_rev);
            (link.source, Some(link.source_rev))
        })
        .collect();
    keys.extend(oldest_of_repo.into_iter().map(|(did, stamp)| (RecordId::repo(did), Some(stamp))));
    // Sorted by key, then stamp: the first of each key has its oldest stamp.
    keys.sort_unstable();
    keys.dedup_by_key(|(key, _)| *key);
    keys
}

/// A query's second round: the thresholds of the sources of `links` (record-level and repo-level),
/// from the memtables and one concurrent round of ranged reads of the tables. Only revocations
/// stamped above the oldest stamp of the links a key is asked for can kill one of them, so the
/// tables whose revocations are all older are not read for it: a key's threshold is its newest
/// revocation when that is above the stamp, else at most the stamp (`survives` answers alike for
/// these links, and only for them). Merges settle the stamps of what they keep to the clock they
/// know every revocation through, so a link of a merged run skips the revocation runs written
/// before that merge, and a freshly flushed one nearly all of them.
pub async fn read_thresholds(
    thresholds: &Tree<Revocation>,
    store: &dyn Store,
    links: impl IntoIterator<Item = Backlink>,
) -> Result<SourceThresholds, ReadError> {
    let keys = revocation_keys(links);
    let mut found = SourceThresholds::new(keys.iter().map(|(key, _)| *key));
    for revocation in read_keys_newer(thresholds, store, &keys).await? {
        found.raise(&revocation.source, revocation.rev);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revocation_keys_are_each_source_and_repository_once_with_its_oldest_stamp() {
        let source = |did: u64, rkey: u64| RecordId { rkey, collection: 3, did };
        let link =
            |source: RecordId, source_rev: u64| Backlink { target: RecordId::repo(9), source, location: 1, source_rev };
        let links = [link(source(1, 5), 40), link(source(2, 6), 30), link(source(1, 5), 20), link(source(1, 7), 50)];
        let mut expected = vec![
            (source(1, 5), Some(20)),
            (source(1, 7), Some(50)),
            (source(2, 6), Some(30)),
            (RecordId::repo(1), Some(20)),
            (RecordId::repo(2), Some(30)),
        ];
        expected.sort_unstable();
        assert_eq!(revocation_keys(links), expected);
    }

    /// A load whose scan fails forgets every run earlier loads read (their revocations were
    /// handed to it): the next load reads them again and knows their revocations.
    #[test]
    fn a_load_that_fails_forgets_what_earlier_loads_read() {
        use crate::lsm::record::{RunKind, TableRecord};
        use crate::lsm::table::TableOptions;
        use crate::lsm::tree::TreeCaches;
        use crate::model::ids::TreeKind;
        let dir = tempfile::tempdir().unwrap();
        let tree: Tree<Revocation> =
            Tree::new(dir.path().join("thresholds"), TableOptions::default(), TreeCaches::of_bytes(0, 0)).unwrap();
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let run = |id: &str, revocation: Revocation| {
            let summary = tree.write_sorted(id, || std::iter::once(revocation)).unwrap();
            let record =
                TableRecord::written(TreeKind::Thresholds, id.into(), (id.into(), RunKind::Delta), (0, 1), &summary);
            Arc::new(Run::from_tables(vec![Arc::new(tree.open_table(record).unwrap())]).unwrap())
        };
        let (first, second) =
            (RecordId { rkey: 1, collection: 1, did: 1 }, RecordId { rkey: 2, collection: 1, did: 2 });
        let older = run("0000000000000001aaaaaaaa", Revocation { source: first, rev: 5 });
        let options = CompactionOptions::default();
        let mut read = RevocationsRead::default();
        let load = |runs: &[Arc<Run<Revocation>>], read: &mut RevocationsRead| {
            KnownRevocations::load(runs, 7, &store, runtime.handle(), &options, read)
        };
        let known = load(std::slice::from_ref(&older), &mut read).unwrap();
        read.keep(known);
        let newer = run("0000000000000002bbbbbbbb", Revocation { source: second, rev: 7 });
        let data = tree.local_path("0000000000000002bbbbbbbb", "data");
        let bytes = std::fs::read(&data).unwrap();
        std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(0).unwrap();
        let runs = [older, newer];
        assert!(load(&runs, &mut read).is_err(), "the newer run cannot be read");
        std::fs::write(&data, &bytes).unwrap();
        let known = load(&runs, &mut read).unwrap();
        assert_eq!((known.threshold(&first), known.threshold(&second)), (5, 7), "both runs' revocations");
    }

    fn revocation(did: u64, rev: u64) -> Revocation {
        Revocation { source: RecordId::repo(did), rev }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The hash index never hides a revocation: every source answers
        /// what a map of newest revocations says (0 when never revoked).
        #[test]
        fn thresholds_answer_like_a_map_of_newest_revocations(
            revocations in proptest::collection::vec((0u64..3, 0u64..400, 1u64..1_000), 0..2_000),
            probes in proptest::collection::vec((0u64..3, 0u64..400), 1..500),
        ) {
            let source = |(rkey, did): (u64, u64)| RecordId { rkey, collection: u64::from(rkey != 0), did };
            let mut model = std::collections::HashMap::new();
            for &(rkey, did, rev) in &revocations {
                let newest = model.entry(source((rkey, did))).or_insert(0);
                *newest = rev.max(*newest);
            }
            let list = revocations.iter().map(|&(rkey, did, rev)| Revocation { source: source((rkey, did)), rev });
            let thresholds = KnownRevocations::from_revocations(list.collect(), 0, 0);
            for probe in probes.into_iter().chain(revocations.iter().map(|&(rkey, did, _)| (rkey, did))) {
                let key = source(probe);
                proptest::prop_assert_eq!(thresholds.threshold(&key), model.get(&key).copied().unwrap_or(0));
            }
        }
    }

    #[test]
    fn thresholds_keep_the_newest_revocation_per_source() {
        let (record, repo) = (RecordId { rkey: 7, collection: 1, did: 3 }, RecordId::repo(3));
        let revocation = |source, rev| Revocation { source, rev };
        let revocations =
            vec![revocation(record, 5), revocation(repo, 2), revocation(record, 9), revocation(record, 1)];
        let thresholds = KnownRevocations::from_revocations(revocations, 20, 0);
        assert_eq!(thresholds.newest, vec![revocation(repo, 2), revocation(record, 9)]);
        assert_eq!((thresholds.threshold(&record), thresholds.threshold(&repo)), (9, 2));
        assert_eq!(thresholds.threshold(&RecordId::repo(4)), 0);
        let link = |source_rev| Backlink { target: RecordId::repo(8), source: record, location: 1, source_rev };
        assert_eq!(thresholds.settle(link(8)), None, "older than the record's revocation");
        assert_eq!(thresholds.settle(link(9)), Some(link(20)), "written with the revocation (an update)");
        assert_eq!(thresholds.settle(link(15)), Some(link(20)), "raised to the complete clock");
        assert_eq!(thresholds.settle(link(21)), Some(link(21)), "past the complete clock: kept as is");
        let other = Backlink { source: RecordId { rkey: 8, ..record }, ..link(1) };
        assert_eq!(thresholds.settle(other), None, "older than the repo-level revocation");
        let settled = |source_rev| thresholds.settle(Backlink { source_rev, ..other }).map(|l| l.source_rev);
        assert_eq!((settled(2), settled(20), settled(30)), (Some(20), Some(20), Some(30)));
        let stranger = Backlink { source: RecordId { did: 4, ..record }, ..link(12) };
        assert_eq!(thresholds.settle(stranger), Some(Backlink { source_rev: 20, ..stranger }), "never revoked");
        let partial = KnownRevocations::from_revocations(vec![revocation(record, 9)], 20, 6);
        let kept = |source_rev| partial.settle(Backlink { source_rev, ..link(0) }).map(|l| l.source_rev);
        assert_eq!((kept(5), kept(9), kept(21)), (None, Some(20), Some(21)), "known from 6 on");
        let below_floor = Backlink { source_rev: 4, ..stranger };
        assert_eq!(partial.settle(below_floor), Some(below_floor), "below the floor: kept as it is");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Settling changes no answer, now or later: for any history of one link's copies and its
        /// sources' revocations, split at a clock `complete` (revocations up to it written, the
        /// others stamped after it), of which the merge knows those stamped at or above `floor`
        /// (its limit cut the older ones), a link it drops is dead and the copy a reader keeps
        /// is live exactly when it was before, after every revocation the merge did not see.
        #[test]
        fn settled_stamps_answer_like_the_originals(
            written in proptest::collection::vec((proptest::bool::ANY, 1u64..60), 0..6),
            complete in 0u64..60,
            floor in proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..70],
            merged in 1u64..80,
            other_copy in proptest::option::of(1u64..80),
            // Often just past `complete`, where a settled stamp's bound lies.
            later in proptest::collection::vec((proptest::bool::ANY, proptest::prop_oneof![1u64..3, 1u64..80]), 0..4),
        ) {
            let record = RecordId { rkey: 7, collection: 1, did: 3 };
            let source = |repo_level: bool| if repo_level { RecordId::repo(3) } else { record };
            let written: Vec<Revocation> = written.iter().map(|&(repo, rev)| Revocation { source: source(repo), rev }).collect();
            let known = written.iter().copied().filter(|r| r.rev >= floor).collect();
            let thresholds = KnownRevocations::from_revocations(known, complete, floor);
            let link = Backlink { target: RecordId::repo(8), source: record, location: 1, source_rev: merged };
            let newest_of = |all: &[Revocation], key: &RecordId| all.iter().filter(|r| r.source == *key).map(|r| r.rev).max().unwrap_or(0);
            let Some(settled) = thresholds.settle(link) else {
                proptest::prop_assert!(!link.survives(|key| newest_of(&written, key)), "dropped a live link");
                return Ok(());
            };
            proptest::prop_assert!(
                settled.source_rev == link.source_rev || (settled.source_rev == complete && link.source_rev <= complete),
                "a stamp is kept or raised to the complete clock"
            );
            // Every revocation not yet written is stamped past `complete`, but maybe before
            // `merged` (a link flushed after `complete` was read can be newer than it).
            let later = later.into_iter().map(|(repo, step)| Revocation { source: source(repo), rev: complete + step });
            let mut all = written;
            for revocation in std::iter::once(None).chain(later.map(Some)) {
                all.extend(revocation);
                let reader = |copy: Backlink| {
                    let freshest = other_copy.map_or(copy.source_rev, |c| c.max(copy.source_rev));
                    Backlink { source_rev: freshest, ..copy }.survives(|key| newest_of(&all, key))
                };
                proptest::prop_assert_eq!(reader(settled), reader(link), "after {:?}", all);
            }
        }

        /// A bounded load keeps at most one and a half times `limit`, and every revocation
        /// stamped at or above the floor it reports, also when it resumes from what an earlier
        /// merge kept (the first `split` revocations) and scans only the rest.
        #[test]
        fn a_bounded_load_keeps_every_revocation_from_its_floor(
            stamps in proptest::collection::vec(0u64..500, 0..400),
            limit in 0usize..64,
            split in 0usize..400,
        ) {
            let split = split.min(stamps.len());
            let scan = |newest: &mut NewestRevocations, range: std::ops::Range<usize>| {
                for i in range {
                    newest.push(revocation(i as u64, stamps[i]));
                }
            };
            let mut earlier = NewestRevocations::new(limit, split as u64);
            scan(&mut earlier, 0..split);
            let (kept, floor) = earlier.finish();
            let known = KnownRevocations::from_revocations(kept, 0, floor);
            let mut newest = NewestRevocations::new(limit, stamps.len() as u64);
            newest.resume(known.newest, known.complete_from);
            scan(&mut newest, split..stamps.len());
            let (kept, floor) = newest.finish();
            proptest::prop_assert!(kept.len() <= limit + limit / 2);
            let mut expected: Vec<_> = stamps.iter().enumerate().filter(|(_, r)| **r >= floor).map(|(i, &r)| revocation(i as u64, r)).collect();
            let mut kept = kept;
            kept.sort_unstable();
            expected.sort_unstable();
            proptest::prop_assert_eq!(kept, expected);
            if stamps.len() < limit {
                proptest::prop_assert_eq!(floor, 0, "a scan within the limit keeps everything");
            }
        }
    }

    #[test]
    fn a_flush_drops_what_its_own_revocations_kill_and_keeps_stamps() {
        let record = |did| RecordId { rkey: 7, collection: 1, did };
        // This flush revoked did 5's record at 12 (an update: its new link has the same stamp)
        // and did 2's repository at 20.
        let memtable =
            vec![Revocation { source: RecordId::repo(2), rev: 20 }, Revocation { source: record(5), rev: 12 }];
        let flush = KnownRevocations::of_flush(memtable);
        let link =
            |did, source_rev| Backlink { target: RecordId::repo(9), source: record(did), location: 1, source_rev };
        let links = [link(2, 19), link(2, 25), link(5, 11), link(5, 12), link(5, 15), link(6, 3)];
        let kept: Vec<Backlink> = links.into_iter().filter_map(|link| flush.settle(link)).collect();
        assert_eq!(kept, [link(2, 25), link(5, 12), link(5, 15), link(6, 3)], "killed ones dropped, stamps kept");
    }

    #[test]
    fn thresholds_take_the_newest_revocation_of_each_key_asked_for() {
        let (a, b, c) = (RecordId::repo(1), RecordId::repo(2), RecordId::repo(3));
        let mut thresholds = SourceThresholds::new([b, a, b].into_iter());
        for revocation in [revocation(1, 4), revocation(1, 9), revocation(2, 5), revocation(3, 50)] {
            thresholds.raise(&revocation.source, revocation.rev);
        }
        thresholds.raise(&a, 7);
        thresholds.raise(&c, 99);
        assert_eq!((thresholds.get(&a), thresholds.get(&b), thresholds.get(&c)), (9, 5, 0));
        assert_eq!(thresholds.by_key.len(), 2, "one slot per distinct key asked for");
    }
}
