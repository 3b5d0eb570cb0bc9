//! Size-tiered compaction: merge `fan_in` runs of similar compressed size into one run,
//! radix-split by the hash of the key into shards (one table per shard).
//!
//! Invariants:
//! - Merging never changes an answer. Of entries with the same identity it keeps the freshest
//!   (largest stamp), which is the one a reader would pick; for revocations that is the newest
//!   threshold per source, the only one a reader uses.
//! - A merge drops a backlink only when a revocation that is already in a *table* of the
//!   revocation tree kills it (stamp below its record- or repo-level threshold); a flush only
//!   when a revocation frozen with it kills it, which commits in the same catalog transaction.
//!   Revocations are never dropped (only superseded by newer ones for the same source), so such
//!   a backlink is dead for every reader forever: dropping it only saves space. No other
//!   memtable's revocations are consulted, so a crash cannot lose the reason a backlink was
//!   dropped.
//! - A surviving backlink stamped at or below `Thresholds::complete_through` is written with its
//!   stamp lowered to its threshold (0 for a source never revoked), which changes no answer
//!   (proof at `Thresholds::settle`) and leaves the stamp column of merged tables nearly all
//!   zeros, which compress to almost nothing.
//! - `keep` may drop an entry or lower its stamp, never change its identity, so the output stays
//!   strictly increasing.
//! - Work is streamed: one batch of frames per input plus one frame per output shard in memory,
//!   and the merge holds no lock of the tree; the result replaces its inputs in one step.
//! - Runs are merged oldest first within a tier, and every input's size is bounded by its tier,
//!   so one compaction's work is bounded by `fan_in` times its tier's size.

use crate::buckets::Buckets;
use crate::lsm::entry::Entry;
use crate::lsm::run::{MAX_SHARDS, Run, shard_of};
use crate::lsm::table::TableSummary;
use crate::lsm::tree::{ReadError, TableHandle, TableWriter, Tree};
use crate::model::ids::{Backlink, RecordId, Revocation};
use crate::store::object::Store;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

#[derive(Debug, Clone, PartialEq)]
pub struct CompactionOptions {
    /// Runs merged at once (and runs per tier that trigger a merge).
    pub fan_in: usize,
    /// Runs below this many compressed bytes all belong to tier 0.
    pub min_run_bytes: u64,
    /// Target compressed bytes of one output shard table.
    pub shard_bytes: u64,
    /// Frames fetched per ranged read of an input table.
    pub frames_per_read: usize,
    /// Upper bound on input bytes read per second (pacing), or `None` for no limit.
    pub max_bytes_per_sec: Option<u64>,
    /// Most revocations held in memory to drop killed backlinks; above it nothing is dropped.
    pub max_thresholds: usize,
}

impl Default for CompactionOptions {
    fn default() -> Self {
        Self {
            fan_in: 8,
            min_run_bytes: 1 << 20,
            shard_bytes: 64 << 20,
            frames_per_read: 16,
            max_bytes_per_sec: Some(64 << 20),
            max_thresholds: 4 << 20,
        }
    }
}

/// The size tier of a run: `floor(log_fan_in(bytes / min_run_bytes))`, 0 for small runs.
pub fn tier(bytes: u64, options: &CompactionOptions) -> u32 {
    let fan_in = options.fan_in.max(2) as u64;
    let mut bound = options.min_run_bytes.max(1).saturating_mul(fan_in);
    let mut tier = 0;
    while bytes >= bound && bound < u64::MAX {
        tier += 1;
        bound = bound.saturating_mul(fan_in);
    }
    tier
}

/// The oldest `fan_in` runs of the lowest tier that has at least `fan_in` runs.
pub fn pick<E: Entry>(runs: &[Arc<Run<E>>], options: &CompactionOptions) -> Option<Vec<Arc<Run<E>>>> {
    let mut tiers: Vec<(u32, Vec<Arc<Run<E>>>)> = Vec::new();
    for run in runs {
        let t = tier(run.data_bytes(), options);
        match tiers.iter_mut().find(|(tier, _)| *tier == t) {
            Some((_, members)) => members.push(run.clone()),
            None => tiers.push((t, vec![run.clone()])),
        }
    }
    tiers.sort_by_key(|(t, _)| *t);
    tiers.into_iter().find(|(_, members)| members.len() >= options.fan_in.max(2)).map(|(_, mut members)| {
        members.truncate(options.fan_in.max(2));
        members
    })
}

/// Shards for an output of about `bytes` compressed bytes: a power of two near bytes / shard_bytes.
pub fn shard_count_for(bytes: u64, options: &CompactionOptions) -> u32 {
    let wanted = bytes.div_ceil(options.shard_bytes.max(1)).clamp(1, MAX_SHARDS as u64);
    (wanted as u32).next_power_of_two().min(MAX_SHARDS)
}

/// Revocation thresholds (newest per source), for dropping killed backlinks and settling stamps:
/// a merge's from the revocation tree's tables (`load_thresholds`, `None` past its limit), a
/// flush's from its frozen revocation memtable (`Thresholds::of_flush`). A merge asks it twice per
/// backlink, in target order, so the sources come at random: a binary search missed the cache
/// at every step (by profile, 60 % of a 10 M-link import's merge), so an index of positions
/// (`crate::buckets`, 8 bytes per bucket, at most 3/4 full) finds a source, or its absence, in
/// one or two cache misses. The revocations themselves stay in one vector, 32 bytes each.
#[derive(Debug)]
pub struct Thresholds {
    /// Sorted by source, one per source: its newest revocation.
    newest: Vec<Revocation>,
    /// Positions in `newest`, by the hash of their source.
    by_source: Buckets,
    /// Every revocation stamped at or below this is in `newest`: the ingest clock of the last
    /// flush whose tables were installed before the revocation tables were read (0 for a flush's).
    complete_through: u64,
}

impl Thresholds {
    /// What a flush knows: the revocations frozen with its backlinks, which commit with them, so
    /// a backlink they kill is dead for good. Complete through no clock, so `settle` lowers no
    /// stamp (a flush proving that no revocation table holds a source's threshold cost the
    /// import's memory goal: BENCHMARKS.md, runs 14-16).
    pub fn of_flush(revocations: Vec<Revocation>) -> Self {
        Self::from_revocations(revocations, 0)
    }

    /// Keeps the newest revocation of each source from `revocations` (any order), which hold
    /// every revocation stamped at or below `complete_through`.
    fn from_revocations(mut revocations: Vec<Revocation>, complete_through: u64) -> Self {
        revocations.sort_unstable();
        // Sorted by (source, rev): the last of each source's run is its newest.
        revocations.reverse();
        revocations.dedup_by_key(|r| r.source);
        revocations.reverse();
        let mut by_source = Buckets::new();
        let hash_of = |position: usize| source_hash(&revocations[position].source);
        for position in 0..revocations.len() {
            by_source.insert(hash_of(position), position, hash_of);
        }
        Thresholds { newest: revocations, by_source, complete_through }
    }

    fn threshold(&self, source: &RecordId) -> u64 {
        let found = self.by_source.find(source_hash(source), |position| self.newest[position].source == *source);
        found.map_or(0, |position| self.newest[position].rev)
    }

    /// What a merge writes for `link`: nothing when a durable revocation kills it; else `link`,
    /// its stamp lowered to its threshold when it is at most `complete_through`.
    ///
    /// Why that changes no answer. Liveness compares a stamp `s` with the newest revocation `r`
    /// of the source and of its repository (live iff `s >= r`), and a reader that finds copies
    /// of one link keeps the largest stamp. With `t` the threshold (`t <= s`, the link
    /// survives), every revocation of these two sources is either here, so at most `t`, or
    /// not yet written, so stamped later by the ingest clock, above `complete_through >= s`.
    /// No revocation is in `(t, s]`, so `s` and `t` compare alike with every revocation, now and
    /// later. A copy of the link elsewhere with a stamp `c`: if `c > s` it wins either way; if
    /// `t < c <= s` it now wins instead, and compares alike with every revocation as `s` did.
    pub fn settle(&self, link: Backlink) -> Option<Backlink> {
        let threshold = link.threshold(|key| self.threshold(key));
        if link.source_rev < threshold {
            return None;
        }
        let settled = if link.source_rev <= self.complete_through { threshold } else { link.source_rev };
        Some(Backlink { source_rev: settled, ..link })
    }
}

/// The freshest of each identity in sorted `entries` (copies of one identity sort next to each
/// other, oldest first), as a merge keeps them.
pub fn freshest<E: Entry>(entries: impl Iterator<Item = E>) -> impl Iterator<Item = E> {
    let mut entries = entries.peekable();
    std::iter::from_fn(move || {
        let mut entry = entries.next()?;
        while let Some(newer) = entries.next_if(|next| next.same_identity(&entry)) {
            entry = newer;
        }
        Some(entry)
    })
}

fn source_hash(source: &RecordId) -> u64 {
    xxh3_64(&source.to_bytes())
}

/// Reads every revocation in `runs`, or gives up (`None`) past `limit` entries.
/// `complete_through` is a clock every revocation at or below which is in `runs`.
pub fn load_thresholds(
    runs: &[Arc<Run<Revocation>>],
    complete_through: u64,
    store: &dyn Store,
    runtime: &tokio::runtime::Handle,
    options: &CompactionOptions,
) -> Result<Option<Thresholds>, ReadError> {
    let total: u64 = runs.iter().map(|r| r.entries()).sum();
    // Positions in the index are below u32::MAX, whatever the option says.
    if total > options.max_thresholds as u64 || total >= u64::from(u32::MAX) {
        return Ok(None);
    }
    let mut revocations = Vec::with_capacity(total as usize);
    for table in runs.iter().flat_map(|r| r.tables.iter()) {
        let mut scan = TableScan::new(table.clone(), options.frames_per_read);
        while let Some(revocation) = scan.next(store, runtime)? {
            revocations.push(revocation);
        }
    }
    Ok(Some(Thresholds::from_revocations(revocations, complete_through)))
}

/// Reads one table in order, a batch of frames at a time.
struct TableScan<E: Entry> {
    table: Arc<TableHandle<E>>,
    next_frame: usize,
    frames_per_read: usize,
    buffer: Vec<E>,
    position: usize,
}

impl<E: Entry> TableScan<E> {
    fn new(table: Arc<TableHandle<E>>, frames_per_read: usize) -> Self {
        Self { table, next_frame: 0, frames_per_read: frames_per_read.max(1), buffer: Vec::new(), position: 0 }
    }

    fn next(&mut self, store: &dyn Store, runtime: &tokio::runtime::Handle) -> Result<Option<E>, ReadError> {
        if self.position == self.buffer.len() {
            let frames = self.table.meta.frames.len();
            if self.next_frame == frames {
                return Ok(None);
            }
            let batch = self.next_frame..(self.next_frame + self.frames_per_read).min(frames);
            self.next_frame = batch.end;
            self.buffer = runtime.block_on(self.table.read_frames_with(store, batch, false))?;
            self.position = 0;
        }
        let entry = self.buffer[self.position];
        self.position += 1;
        Ok(Some(entry))
    }

    /// Compressed bytes of the frames read so far (for pacing).
    fn bytes_read(&self) -> u64 {
        let (start, end) = self.table.meta.byte_range(0..self.next_frame);
        end - start
    }
}

/// Keeps reading at or below a byte rate by sleeping between batches (we run on our own thread).
struct Pacer {
    started: Instant,
    max_bytes_per_sec: Option<u64>,
}

impl Pacer {
    fn wait(&self, bytes_so_far: u64) {
        let Some(rate) = self.max_bytes_per_sec else { return };
        let due = Duration::from_secs_f64(bytes_so_far as f64 / rate.max(1) as f64);
        if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
            std::thread::sleep(ahead.min(Duration::from_secs(1)));
        }
    }
}

/// What a merge wrote.
#[derive(Debug)]
pub struct MergeOutput {
    /// (shard, summary) per output table, in shard order.
    pub tables: Vec<(u32, TableSummary)>,
    pub entries_in: u64,
    pub duplicates_dropped: u64,
    pub killed_dropped: u64,
}

/// Streams the entries of `inputs` into `ids.len()` shard tables of `tree`, keeping the freshest
/// of each identity and writing what `keep` makes of it: `None` drops it, `Some` is the entry or
/// the entry with a lower stamp. Blocking: run it on a blocking thread.
pub fn merge<E: Entry>(
    tree: &Tree<E>,
    inputs: &[Arc<Run<E>>],
    ids: &[String],
    store: &dyn Store,
    runtime: &tokio::runtime::Handle,
    options: &CompactionOptions,
    keep: &mut dyn FnMut(E) -> Option<E>,
) -> Result<MergeOutput, ReadError> {
    let shard_count = ids.len() as u32;
    assert!((1..=MAX_SHARDS).contains(&shard_count), "bad shard count {shard_count}");
    let io = |source| ReadError::Io { object: format!("compaction output in {}", tree.dir().display()), source };
    let hint = (inputs.iter().map(|r| r.entries()).sum::<u64>() / shard_count as u64) as usize;
    let mut outs: Vec<TableWriter<E>> =
        ids.iter().map(|id| tree.table_writer(id, hint)).collect::<Result<_, _>>().map_err(io)?;
    let mut scans: Vec<TableScan<E>> = inputs
        .iter()
        .flat_map(|r| r.tables.iter())
        .map(|t| TableScan::new(t.clone(), options.frames_per_read))
        .collect();
    let mut heap = BinaryHeap::with_capacity(scans.len());
    for (i, scan) in scans.iter_mut().enumerate() {
        if let Some(entry) = scan.next(store, runtime)? {
            heap.push(Reverse((entry, i)));
        }
    }
    let pacer = Pacer { started: Instant::now(), max_bytes_per_sec: options.max_bytes_per_sec };
    let mut output = MergeOutput { tables: Vec::new(), entries_in: 0, duplicates_dropped: 0, killed_dropped: 0 };
    let mut pending: Option<E> = None;
    while let Some(Reverse((entry, i))) = heap.pop() {
        output.entries_in += 1;
        if let Some(next) = scans[i].next(store, runtime)? {
            heap.push(Reverse((next, i)));
        }
        match pending {
            Some(previous) if previous.same_identity(&entry) => output.duplicates_dropped += 1,
            Some(previous) => emit(&mut outs, previous, keep, &mut output).map_err(io)?,
            None => {}
        }
        pending = Some(entry);
        if output.entries_in.is_multiple_of(65_536) {
            pacer.wait(scans.iter().map(|s| s.bytes_read()).sum());
        }
    }
    if let Some(last) = pending {
        emit(&mut outs, last, keep, &mut output).map_err(io)?;
    }
    for (shard, out) in outs.into_iter().enumerate() {
        output.tables.push((shard as u32, out.finish().map_err(io)?));
    }
    Ok(output)
}

fn emit<E: Entry>(
    outs: &mut [TableWriter<E>],
    entry: E,
    keep: &mut dyn FnMut(E) -> Option<E>,
    output: &mut MergeOutput,
) -> std::io::Result<()> {
    let Some(kept) = keep(entry) else {
        output.killed_dropped += 1;
        return Ok(());
    };
    assert!(kept.same_identity(&entry) && kept.stamp() <= entry.stamp(), "keep changed more than a stamp");
    outs[shard_of(&kept.key(), outs.len() as u32) as usize].push(&kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_grow_by_fan_in() {
        let options = CompactionOptions { fan_in: 8, min_run_bytes: 1000, ..CompactionOptions::default() };
        assert_eq!(tier(0, &options), 0);
        assert_eq!(tier(7_999, &options), 0);
        assert_eq!(tier(8_000, &options), 1);
        assert_eq!(tier(63_999, &options), 1);
        assert_eq!(tier(64_000, &options), 2);
        assert_eq!(tier(u64::MAX, &options), 18);
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
            let thresholds = Thresholds::from_revocations(list.collect(), 0);
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
        let thresholds = Thresholds::from_revocations(revocations, 20);
        assert_eq!(thresholds.newest, vec![revocation(repo, 2), revocation(record, 9)]);
        assert_eq!((thresholds.threshold(&record), thresholds.threshold(&repo)), (9, 2));
        assert_eq!(thresholds.threshold(&RecordId::repo(4)), 0);
        let link = |source_rev| Backlink { target: RecordId::repo(8), source: record, location: 1, source_rev };
        assert_eq!(thresholds.settle(link(8)), None, "older than the record's revocation");
        assert_eq!(thresholds.settle(link(9)), Some(link(9)), "written with the revocation (an update)");
        assert_eq!(thresholds.settle(link(15)), Some(link(9)), "lowered to the record's threshold");
        assert_eq!(thresholds.settle(link(21)), Some(link(21)), "past the complete clock: kept as is");
        let other = Backlink { source: RecordId { rkey: 8, ..record }, ..link(1) };
        assert_eq!(thresholds.settle(other), None, "older than the repo-level revocation");
        let settled = |source_rev| thresholds.settle(Backlink { source_rev, ..other }).map(|l| l.source_rev);
        assert_eq!((settled(2), settled(20), settled(30)), (Some(2), Some(2), Some(30)));
        let stranger = Backlink { source: RecordId { did: 4, ..record }, ..link(12) };
        assert_eq!(thresholds.settle(stranger), Some(Backlink { source_rev: 0, ..stranger }), "never revoked");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Settling changes no answer, now or later: for any history of one link's copies and its
        /// sources' revocations, split at a clock `complete` (revocations up to it known, the
        /// others stamped after it), the copy a reader keeps is live exactly when it was before,
        /// after every revocation the merge did not see.
        #[test]
        fn settled_stamps_answer_like_the_originals(
            known in proptest::collection::vec((proptest::bool::ANY, 1u64..60), 0..6),
            complete in 0u64..60,
            merged in 1u64..80,
            other_copy in proptest::option::of(1u64..80),
            later in proptest::collection::vec((proptest::bool::ANY, 1u64..80), 0..4),
        ) {
            let record = RecordId { rkey: 7, collection: 1, did: 3 };
            let source = |repo_level: bool| if repo_level { RecordId::repo(3) } else { record };
            // What a merge may see: every revocation up to `complete`, and maybe some after it.
            let known: Vec<Revocation> = known.iter().map(|&(repo, rev)| Revocation { source: source(repo), rev }).collect();
            let thresholds = Thresholds::from_revocations(known.clone(), complete);
            let link = Backlink { target: RecordId::repo(8), source: record, location: 1, source_rev: merged };
            let Some(settled) = thresholds.settle(link) else {
                proptest::prop_assert!(!link.survives(|key| thresholds.threshold(key)));
                return Ok(());
            };
            // Every revocation the merge did not see is stamped past `complete`, but maybe before
            // `merged` (a link flushed after `complete` was read can be newer than it).
            let later = later.into_iter().map(|(repo, step)| Revocation { source: source(repo), rev: complete + step });
            let mut all = known;
            for revocation in std::iter::once(None).chain(later.map(Some)) {
                all.extend(revocation);
                let newest = |key: &RecordId| all.iter().filter(|r| r.source == *key).map(|r| r.rev).max().unwrap_or(0);
                let reader = |copy: Backlink| {
                    let freshest = other_copy.map_or(copy.source_rev, |c| c.max(copy.source_rev));
                    Backlink { source_rev: freshest, ..copy }.survives(newest)
                };
                proptest::prop_assert_eq!(reader(settled), reader(link), "after {:?}", all);
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
        let flush = Thresholds::of_flush(memtable);
        let link =
            |did, source_rev| Backlink { target: RecordId::repo(9), source: record(did), location: 1, source_rev };
        let links = [link(2, 19), link(2, 25), link(5, 11), link(5, 12), link(5, 15), link(6, 3)];
        let kept: Vec<Backlink> = links.into_iter().filter_map(|link| flush.settle(link)).collect();
        assert_eq!(kept, [link(2, 25), link(5, 12), link(5, 15), link(6, 3)], "killed ones dropped, stamps kept");
    }

    #[test]
    fn freshest_keeps_the_last_copy_of_each_identity() {
        let link = |did, source_rev| Backlink {
            target: RecordId::repo(9),
            source: RecordId::repo(did),
            location: 1,
            source_rev,
        };
        let sorted = [link(1, 2), link(1, 5), link(1, 9), link(2, 1), link(3, 4), link(3, 6)];
        let kept: Vec<Backlink> = freshest(sorted.into_iter()).collect();
        assert_eq!(kept, vec![link(1, 9), link(2, 1), link(3, 6)]);
        assert_eq!(freshest(std::iter::empty::<Backlink>()).count(), 0);
    }

    #[test]
    fn shard_counts_are_powers_of_two_and_bounded() {
        let options = CompactionOptions { shard_bytes: 100, ..CompactionOptions::default() };
        assert_eq!(shard_count_for(0, &options), 1);
        assert_eq!(shard_count_for(100, &options), 1);
        assert_eq!(shard_count_for(101, &options), 2);
        assert_eq!(shard_count_for(500, &options), 8);
        assert_eq!(shard_count_for(u64::MAX, &options), MAX_SHARDS);
    }
}
