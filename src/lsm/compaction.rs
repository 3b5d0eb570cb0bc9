//! Size-tiered compaction: merge `fan_in` runs of similar compressed size into one run,
//! radix-split by the hash of the key into shards (one table per shard).
//!
//! What a merge may drop or rewrite beyond duplicates is the caller's: its `keep` (for backlinks,
//! `liveness::KnownRevocations::settle`).
//!
//! Invariants:
//! - Of entries with the same identity a merge keeps the freshest (largest stamp), which is the
//!   one a reader would pick; for revocations that is the newest threshold per source, the only
//!   one a reader uses.
//! - `keep` may drop an entry or lower its stamp, never change its identity, so the output stays
//!   strictly increasing.
//! - Work is streamed, in passes over slices of the key hash (`passes`: the fewest shards of any
//!   input or of the output): a pass holds one batch of frames per input table of its slice and
//!   one frame per output shard of its slice, so a merge of 8 runs of 128 shards into 1,024
//!   holds 8 scans and 8 builders at a time, not 1,024 and 1,024 (memory does not grow with
//!   the runs). The merge holds no lock of the tree; the result replaces its inputs in one step.
//! - Between two passes a merge holds no scan and no input: its caller's `between_passes` runs
//!   there (the index merges lower tiers meanwhile, so one long merge does not hold back the
//!   small ones), and the pacing does not count that time as the merge's.
//! - A merge learns one set of column models for all its output tables (`ModelSampler`) from
//!   its first `TableOptions::spill_bytes` of kept entries, which wait raw in one spill file
//!   meanwhile: a merge into many shards holds one set of counts and models, not one a shard, and
//!   spills those bytes once, not once a shard.
//! - Runs are merged oldest first within a tier, and every input's size is bounded by its tier,
//!   so one compaction's work is bounded by `fan_in` times its tier's size.

use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::handle::ReadError;
use crate::lsm::run::{MAX_SHARDS, Run, shard_of};
use crate::lsm::scan::{SharedModels, TableScan};
use crate::lsm::table::{ModelSampler, TableSummary};
use crate::lsm::tree::{TableWriter, Tree};
use crate::store::object::Store;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct CompactionOptions {
    /// Runs merged at once (and runs per tier that trigger a merge).
    pub fan_in: usize,
    /// Runs below this many compressed bytes all belong to tier 0.
    pub min_run_bytes: u64,
    /// Target compressed bytes of one output shard table.
    pub shard_bytes: u64,
    /// Frames fetched per ranged read of an input table (held compressed; a scan decodes one at a time).
    pub frames_per_read: usize,
    /// Upper bound on input bytes read per second (pacing), or `None` for no limit.
    pub max_bytes_per_sec: Option<u64>,
    /// Most revocations a merge holds to drop killed backlinks and settle stamps: the newest
    /// (`liveness::KnownRevocations::load`). About 64 bytes each at the peak (a scan buffer of
    /// 1.5 times as many at 32 bytes, then an index of 8 bytes per slot): the default 512 Ki is
    /// about 32 MiB. Fewer keep more dead entries in mid-sized runs until a later merge: 512 Ki
    /// instead of 1 Mi made a 100 M-link import's links tables 0.13 % larger (BENCHMARKS.md).
    pub max_thresholds: usize,
}

impl Default for CompactionOptions {
    fn default() -> Self {
        Self {
            fan_in: 8,
            min_run_bytes: 1 << 20,
            shard_bytes: 64 << 20,
            frames_per_read: 32,
            max_bytes_per_sec: Some(64 << 20),
            max_thresholds: 1 << 19,
        }
    }
}

/// Compressed bytes from which a run is above tier 0.
pub fn tier_zero_bound(options: &CompactionOptions) -> u64 {
    options.min_run_bytes.max(1).saturating_mul(options.fan_in.max(2) as u64)
}

/// The size tier of a run: `floor(log_fan_in(bytes / min_run_bytes))`, 0 for small runs.
pub fn tier(bytes: u64, options: &CompactionOptions) -> u32 {
    let fan_in = options.fan_in.max(2) as u64;
    let mut bound = tier_zero_bound(options);
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

/// Every run of tier 0 when it holds two or more, oldest first: the merge a quiet tree (or a
/// writer about to stop) makes so that a query visits one small run rather than up to
/// `fan_in - 1`. Bounded like any merge: tier 0 holds fewer than `fan_in` runs of fewer than
/// `min_run_bytes * fan_in` bytes each once `pick` has nothing to do, and never more are taken.
pub fn pick_settle<E: Entry>(runs: &[Arc<Run<E>>], options: &CompactionOptions) -> Option<Vec<Arc<Run<E>>>> {
    let lowest: Vec<Arc<Run<E>>> =
        runs.iter().filter(|run| tier(run.data_bytes(), options) == 0).take(options.fan_in.max(2)).cloned().collect();
    (lowest.len() >= 2).then_some(lowest)
}

/// Shards for an output of about `bytes` compressed bytes: a power of two near bytes / shard_bytes.
pub fn shard_count_for(bytes: u64, options: &CompactionOptions) -> u32 {
    let wanted = bytes.div_ceil(options.shard_bytes.max(1)).clamp(1, MAX_SHARDS as u64);
    (wanted as u32).next_power_of_two().min(MAX_SHARDS)
}

/// `freshest` of a sorted vector, in place: no second copy of what may be a flush's largest list.
pub fn keep_freshest<E: Entry>(entries: &mut Vec<E>) {
    // `dedup_by` keeps the first of equal neighbours: the kept slot takes each newer copy.
    entries.dedup_by(|newer, kept| {
        let same = newer.same_identity(kept);
        if same {
            *kept = *newer;
        }
        same
    });
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

/// Keeps reading at or below a byte rate by sleeping between batches (we run on our own thread).
struct Pacer {
    started: Instant,
    max_bytes_per_sec: Option<u64>,
}

impl Pacer {
    /// Takes `paused` out of the merge's time, so a merge that waited does not read in a burst after.
    fn paused(&mut self, paused: Duration) {
        self.started += paused;
    }

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
    /// Slices of the key hash it went through (`passes`).
    pub passes: u32,
    pub duplicates_dropped: u64,
    pub killed_dropped: u64,
}

/// Streams the entries of `inputs` into `ids.len()` shard tables of `tree`, keeping the freshest
/// of each identity and writing what `keep` makes of it: `None` drops it, `Some` is the entry or
/// the entry with a lower stamp. Blocking: run it on a blocking thread.
///
/// The merge goes in passes over slices of the key hash (`passes`): every input table and every
/// output shard lies in one slice, so a pass scans the input tables of its slice alone and
/// writes its output shards alone. `between_passes` runs after every pass but the last, when
/// the merge holds no scan.
#[allow(clippy::too_many_arguments)]
pub fn merge<E: Entry>(
    tree: &Tree<E>,
    inputs: &[Arc<Run<E>>],
    ids: &[String],
    store: &dyn Store,
    runtime: &tokio::runtime::Handle,
    options: &CompactionOptions,
    keep: &mut dyn FnMut(E) -> Option<E>,
    between_passes: &mut dyn FnMut(),
) -> Result<MergeOutput, ReadError> {
    let shard_count = ids.len() as u32;
    assert!((1..=MAX_SHARDS).contains(&shard_count), "bad shard count {shard_count}");
    let io = |source| ReadError::Io { object: format!("compaction output in {}", tree.dir().display()), source };
    let passes = passes(inputs, shard_count);
    let mut outs = Outputs::Learning(Learning::new(tree, ids, passes).map_err(io)?);
    let mut pacer = Pacer { started: Instant::now(), max_bytes_per_sec: options.max_bytes_per_sec };
    let mut output =
        MergeOutput { tables: Vec::new(), entries_in: 0, passes, duplicates_dropped: 0, killed_dropped: 0 };
    let mut pending: Option<E> = None;
    let mut bytes_of_passes_done = 0;
    for pass in 0..passes {
        let mut models = SharedModels::default();
        let mut scans: Vec<TableScan<E>> = inputs
            .iter()
            .flat_map(|run| run.tables.iter().filter(|t| slice_of(t.record.shard, run.shard_count(), passes) == pass))
            .map(|t| TableScan::sharing(t.clone(), options.frames_per_read, &mut models))
            .collect::<Result<_, _>>()?;
        let mut heap = BinaryHeap::with_capacity(scans.len());
        for (i, scan) in scans.iter_mut().enumerate() {
            if let Some(entry) = scan.next(store, runtime)? {
                heap.push(Reverse((entry, i)));
            }
        }
        let bytes_read = |scans: &[TableScan<E>]| scans.iter().map(|s| s.bytes_read()).sum::<Result<u64, _>>();
        while let Some(Reverse((entry, i))) = heap.pop() {
            output.entries_in += 1;
            if let Some(next) = scans[i].next(store, runtime)? {
                heap.push(Reverse((next, i)));
            }
            match pending {
                Some(previous) if previous.same_identity(&entry) => output.duplicates_dropped += 1,
                Some(previous) => emit(&mut outs, tree, ids, previous, keep, &mut output).map_err(io)?,
                None => {}
            }
            pending = Some(entry);
            if output.entries_in.is_multiple_of(65_536) {
                pacer.wait(bytes_of_passes_done + bytes_read(&scans)?);
            }
        }
        bytes_of_passes_done += bytes_read(&scans)?;
        drop(scans);
        if pass + 1 < passes {
            let paused = Instant::now();
            between_passes();
            pacer.paused(paused.elapsed());
        }
    }
    if let Some(last) = pending {
        emit(&mut outs, tree, ids, last, keep, &mut output).map_err(io)?;
    }
    output.tables = outs.writing(tree, ids).map_err(io)?.finish(tree, ids).map_err(io)?;
    Ok(output)
}

/// How many slices of the key hash a merge into `shard_count` shards goes through: the fewest
/// shards of any input or of the output (all powers of two, so each table and output shard lies
/// in one slice: a power-of-two shard count takes the hash's top bits). One when an input has
/// another count (no run has one today).
fn passes<E: Entry>(inputs: &[Arc<Run<E>>], shard_count: u32) -> u32 {
    let counts = || inputs.iter().map(|run| run.shard_count()).chain([shard_count]);
    if counts().all(u32::is_power_of_two) { counts().min().unwrap_or(1) } else { 1 }
}

/// The slice (of `passes`) that shard `shard` of `shard_count` lies in.
fn slice_of(shard: u32, shard_count: u32, passes: u32) -> u32 {
    assert!(passes <= shard_count && shard < shard_count, "shard {shard} of {shard_count}, {passes} passes");
    (u64::from(shard) * u64::from(passes) / u64::from(shard_count)) as u32
}

/// Where a merge's kept entries go: into its spill while it learns its models, then into its
/// output tables.
enum Outputs<E: Entry> {
    Learning(Learning<E>),
    Writing(Writing<E>),
}

/// A merge learning its models: the kept entries so far, raw, in order, in an unlinked file.
struct Learning<E: Entry> {
    spill: BufWriter<File>,
    /// One entry's bytes.
    raw: Vec<u8>,
    spilled_bytes: usize,
    spill_bytes: usize,
    sampler: ModelSampler<E>,
    passes: u32,
}

impl<E: Entry> Learning<E> {
    fn new(tree: &Tree<E>, ids: &[String], passes: u32) -> std::io::Result<Self> {
        let spill = BufWriter::with_capacity(256 << 10, tree.anonymous_spill(&ids[0])?);
        let (sampler, spill_bytes) =
            (ModelSampler::new(ids.len(), tree.table_options()), tree.table_options().spill_bytes);
        Ok(Learning { spill, raw: vec![0; E::WIDTH], spilled_bytes: 0, spill_bytes, sampler, passes })
    }

    fn push(&mut self, shard: usize, entry: &E) -> std::io::Result<()> {
        entry.encode(&mut self.raw);
        self.spill.write_all(&self.raw)?;
        self.spilled_bytes += E::WIDTH;
        self.sampler.add(shard, entry);
        Ok(())
    }

    fn full(&self) -> bool {
        self.spilled_bytes >= self.spill_bytes
    }

    /// Decides the models and writes the spilled entries under them.
    fn into_writing(self, tree: &Tree<E>, ids: &[String]) -> std::io::Result<Writing<E>> {
        let models: Option<Arc<ColumnModels>> = self.sampler.finish();
        let mut writing = Writing { models, passes: self.passes, pass: 0, writers: Vec::new(), tables: Vec::new() };
        writing.open_pass(tree, ids)?;
        let mut spill = self.spill.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        spill.seek(SeekFrom::Start(0))?;
        let mut spill = BufReader::with_capacity(1 << 20, spill);
        let (mut raw, shards) = (self.raw, ids.len() as u32);
        for _ in 0..self.spilled_bytes / E::WIDTH {
            spill.read_exact(&mut raw)?;
            let entry = E::decode(&raw);
            writing.push(tree, ids, shard_of::<E>(&entry.key(), shards), &entry)?;
        }
        Ok(writing)
    }
}

/// A merge writing under its models: the output shards of one pass open at a time (entries come
/// pass by pass, so a shard's first entry of a later pass finishes the shards before it).
struct Writing<E: Entry> {
    models: Option<Arc<ColumnModels>>,
    passes: u32,
    /// The pass whose shards `writers` are.
    pass: u32,
    writers: Vec<TableWriter<E>>,
    /// Every finished shard, in order.
    tables: Vec<(u32, TableSummary)>,
}

impl<E: Entry> Writing<E> {
    /// Writes nothing (what `Outputs` holds for the moment it turns from learning to writing).
    fn none() -> Self {
        Writing { models: None, passes: 0, pass: 0, writers: Vec::new(), tables: Vec::new() }
    }

    /// The output shards of the current pass.
    fn shards(&self, shard_count: u32) -> std::ops::Range<u32> {
        let per_pass = shard_count / self.passes;
        self.pass * per_pass..(self.pass + 1) * per_pass
    }

    fn open_pass(&mut self, tree: &Tree<E>, ids: &[String]) -> std::io::Result<()> {
        assert!(self.writers.is_empty(), "pass {} opened twice", self.pass);
        let shards = self.shards(ids.len() as u32);
        self.writers =
            shards.map(|s| tree.table_writer(&ids[s as usize], self.models.clone())).collect::<Result<_, _>>()?;
        Ok(())
    }

    /// Finishes the current pass's shards and opens the next pass's, if any.
    fn next_pass(&mut self, tree: &Tree<E>, ids: &[String]) -> std::io::Result<()> {
        let shards = self.shards(ids.len() as u32);
        for (shard, writer) in shards.zip(std::mem::take(&mut self.writers)) {
            self.tables.push((shard, writer.finish()?));
        }
        self.pass += 1;
        if self.pass < self.passes { self.open_pass(tree, ids) } else { Ok(()) }
    }

    fn push(&mut self, tree: &Tree<E>, ids: &[String], shard: u32, entry: &E) -> std::io::Result<()> {
        let shard_count = ids.len() as u32;
        let pass = slice_of(shard, shard_count, self.passes);
        assert!(pass >= self.pass, "shard {shard} after pass {}", self.pass);
        while self.pass < pass {
            self.next_pass(tree, ids)?;
        }
        let first = self.shards(shard_count).start;
        self.writers[(shard - first) as usize].push(entry)
    }

    /// Finishes every shard left, each pass in turn: (shard, summary) of every output, in order.
    fn finish(mut self, tree: &Tree<E>, ids: &[String]) -> std::io::Result<Vec<(u32, TableSummary)>> {
        while self.pass < self.passes {
            self.next_pass(tree, ids)?;
        }
        assert_eq!(self.tables.len(), ids.len(), "a table for every shard");
        Ok(self.tables)
    }
}

impl<E: Entry> Outputs<E> {
    /// The writing outputs, once the models are decided (deciding them now if not yet).
    fn writing(self, tree: &Tree<E>, ids: &[String]) -> std::io::Result<Writing<E>> {
        match self {
            Outputs::Learning(learning) => learning.into_writing(tree, ids),
            Outputs::Writing(writing) => Ok(writing),
        }
    }
}

fn emit<E: Entry>(
    outs: &mut Outputs<E>,
    tree: &Tree<E>,
    ids: &[String],
    entry: E,
    keep: &mut dyn FnMut(E) -> Option<E>,
    output: &mut MergeOutput,
) -> std::io::Result<()> {
    let Some(kept) = keep(entry) else {
        output.killed_dropped += 1;
        return Ok(());
    };
    assert!(kept.same_identity(&entry), "keep changed more than a stamp");
    let shard = shard_of::<E>(&kept.key(), ids.len() as u32);
    match outs {
        Outputs::Writing(writing) => writing.push(tree, ids, shard, &kept),
        Outputs::Learning(learning) => {
            learning.push(shard as usize, &kept)?;
            if learning.full() {
                let learnt = std::mem::replace(outs, Outputs::Writing(Writing::none()));
                *outs = Outputs::Writing(learnt.writing(tree, ids)?);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{Backlink, RecordId};

    /// Runs of `entries` (each sorted and unique) as delta tables of `tree`.
    fn runs_of(tree: &Tree<Backlink>, inputs: &[Vec<Backlink>]) -> Vec<Arc<Run<Backlink>>> {
        use crate::lsm::record::{RunKind, TableRecord};
        use crate::model::ids::TreeKind;
        let open = |(i, entries): (usize, &Vec<Backlink>)| {
            let id = format!("in{i}");
            let summary = tree.write_sorted(&id, || entries.iter().copied()).unwrap();
            let record = TableRecord::written(TreeKind::Links, id.clone(), (id, RunKind::Delta), (0, 1), &summary);
            Arc::new(Run::from_tables(vec![Arc::new(tree.open_table(record).unwrap())]).unwrap())
        };
        inputs.iter().enumerate().map(open).collect()
    }

    /// The freshest entry of each identity over `inputs`, in order: what a merge keeps.
    fn freshest_of(inputs: &[Vec<Backlink>]) -> Vec<Backlink> {
        let mut all: Vec<Backlink> = inputs.concat();
        all.sort();
        freshest(all.into_iter()).collect()
    }

    /// A links tree of small frames whose merges learn their models from their first
    /// `spilled_entries` kept entries.
    fn tree_learning_from(dir: &std::path::Path, spilled_entries: usize) -> Tree<Backlink> {
        use crate::lsm::table::TableOptions;
        use crate::lsm::tree::TreeCaches;
        let options = TableOptions {
            frame_bytes: 64 * 16,
            model_min_entries: 100,
            spill_bytes: spilled_entries * 64,
            ..TableOptions::default()
        };
        Tree::<Backlink>::new(dir.join("links"), options, TreeCaches::of_bytes(1 << 20, 1 << 20)).unwrap()
    }

    /// A merge into several shards learns one set of models from its first `spill_bytes` of kept
    /// entries (every shard's frames sampled, as `ModelSampler` does), writes every table under
    /// it, and loses nothing it spilled: its tables hold exactly the inputs' freshest entries.
    #[test]
    fn a_merge_writes_every_shard_under_one_set_of_models_learnt_from_its_spill() {
        use crate::lsm::table::TableMeta;
        let link = |t: u64, s: u64, rev: u64| Backlink {
            target: RecordId::repo(t),
            source: RecordId { rkey: s, collection: 1 + s % 3, did: s % 97 },
            location: 1 + t % 2,
            source_rev: rev,
        };
        let inputs: Vec<Vec<Backlink>> = (0..3u64)
            .map(|input| {
                let mut entries: Vec<Backlink> =
                    (0..4_000u64).map(|i| link(i % 300, i / 3 + input * 500, 10 + input)).collect();
                entries.sort();
                entries.dedup_by(|a, b| a.same_identity(b));
                entries
            })
            .collect();
        let expected = freshest_of(&inputs);
        for spilled_entries in [500usize, 100_000] {
            let dir = tempfile::tempdir().unwrap();
            let tree = tree_learning_from(dir.path(), spilled_entries);
            let table = tree.table_options().clone();
            let runs = runs_of(&tree, &inputs);
            let ids: Vec<String> = (0..4).map(|i| format!("out{i}")).collect();
            let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let options = CompactionOptions::default();
            let output = merge(&tree, &runs, &ids, &store, runtime.handle(), &options, &mut Some, &mut || {}).unwrap();
            let mut sampler = ModelSampler::<Backlink>::new(ids.len(), &table);
            for entry in expected.iter().take(spilled_entries) {
                sampler.add(shard_of::<Backlink>(&entry.key(), ids.len() as u32) as usize, entry);
            }
            let learnt = sampler.finish().expect("more than model_min_entries").encode();
            let mut written = Vec::new();
            for ((shard, summary), id) in output.tables.iter().zip(&ids) {
                let meta = TableMeta::<Backlink>::decode(&std::fs::read(tree.local_path(id, "meta")).unwrap()).unwrap();
                assert_eq!(meta.models.as_ref().map(|m| m.encode()), Some(learnt.clone()), "shard {shard}");
                let data = std::fs::read(tree.local_path(id, "data")).unwrap();
                let mut entries = Vec::new();
                crate::lsm::table::decode_frames(&meta, 0..meta.frames.len(), &data, &mut entries).unwrap();
                assert_eq!(entries.len() as u64, summary.entries);
                assert!(entries.iter().all(|e| shard_of::<Backlink>(&e.key(), ids.len() as u32) == *shard));
                written.extend(entries);
            }
            written.sort();
            assert_eq!(written, expected, "spilling {spilled_entries} entries");
        }
    }

    /// The output of a merge of `inputs` into `shards` shards, opened as a compacted run `id`,
    /// with the passes it made and how often it paused between them.
    fn merged_run(
        tree: &Tree<Backlink>,
        inputs: &[Arc<Run<Backlink>>],
        (id, shards): (&str, u32),
        runtime: &tokio::runtime::Runtime,
    ) -> (Arc<Run<Backlink>>, u32, u32) {
        use crate::lsm::record::{RunKind, TableRecord};
        use crate::model::ids::TreeKind;
        let ids: Vec<String> = (0..shards).map(|i| format!("{id}-{i}")).collect();
        let store = crate::store::dir::DirStore::new(tree.dir().join("bucket"));
        let mut pauses = 0;
        let options = CompactionOptions::default();
        let output = merge(tree, inputs, &ids, &store, runtime.handle(), &options, &mut Some, &mut || pauses += 1);
        let output = output.unwrap();
        let passes = output.passes;
        let tables = output.tables.into_iter().zip(&ids).map(|((shard, summary), table_id)| {
            let run = (id.to_string(), RunKind::Compacted);
            let record = TableRecord::written(TreeKind::Links, table_id.clone(), run, (shard, shards), &summary);
            Arc::new(tree.open_table(record).unwrap())
        });
        (Arc::new(Run::from_tables(tables.collect()).unwrap()), passes, pauses)
    }

    /// A merge whose inputs are all split goes in passes over slices of the key hash (the fewest
    /// shards of an input or the output), pausing between them, and writes exactly the freshest
    /// entries, each in its shard, whether its models were decided in the first pass or at the end.
    #[test]
    fn a_merge_of_split_runs_goes_slice_by_slice_and_loses_nothing() {
        let link = |i: u64, rev: u64| Backlink {
            target: RecordId::repo(i % 500),
            source: RecordId { rkey: i, collection: 1 + i % 3, did: i % 97 },
            location: 1,
            source_rev: rev,
        };
        let input = |range: std::ops::Range<u64>, rev: u64| {
            let mut entries: Vec<Backlink> = range.map(|i| link(i, rev)).collect();
            entries.sort();
            entries
        };
        let inputs = [input(0..3_000, 10), input(2_000..6_000, 11), input(5_000..7_000, 12), input(0..500, 13)];
        let expected = freshest_of(&inputs);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for spilled_entries in [300usize, 100_000] {
            let dir = tempfile::tempdir().unwrap();
            let tree = tree_learning_from(dir.path(), spilled_entries);
            let deltas = runs_of(&tree, &inputs);
            let split = [
                merged_run(&tree, &deltas[0..1], ("a", 4), &runtime).0,
                merged_run(&tree, &deltas[1..2], ("b", 2), &runtime).0,
                merged_run(&tree, &deltas[2..4], ("c", 8), &runtime).0,
            ];
            assert_eq!(passes(&split, 16), 2);
            assert_eq!(passes(&split, 1), 1);
            assert_eq!(passes(&split[..1], 8), 4);
            assert_eq!(passes(&[split[0].clone(), deltas[0].clone()], 8), 1);
            let (merged, passes_made, pauses) = merged_run(&tree, &split, ("out", 16), &runtime);
            assert_eq!(passes_made, 2, "the merge went slice by slice");
            assert_eq!(pauses, 1, "between its two passes");
            let mut written = Vec::new();
            for (shard, table) in merged.tables.iter().enumerate() {
                let runtime = runtime.handle();
                let store = crate::store::dir::DirStore::new(tree.dir().join("bucket"));
                let mut scan = crate::lsm::scan::TableScan::new(table.clone(), 3).unwrap();
                while let Some(entry) = scan.next(&store, runtime).unwrap() {
                    assert_eq!(shard_of::<Backlink>(&entry.key(), 16) as usize, shard);
                    written.push(entry);
                }
            }
            written.sort();
            assert_eq!(written, expected, "spilling {spilled_entries} entries");
        }
    }

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
        let mut in_place = sorted.to_vec();
        keep_freshest(&mut in_place);
        assert_eq!(in_place, kept);
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
