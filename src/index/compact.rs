//! Compaction driven by the index: picks a full tier of any tree (backlinks, forward links, hot
//! links, revocations, then tallies), merges it on the calling thread with the revocations a merge may use, and
//! swaps the result in.
//!
//! Invariants:
//! - One compaction at a time (`Index::compacting`). A merge pauses between its passes for the
//!   full tiers below its inputs' (of any tree), at most `MERGES_BETWEEN_PASSES` merges a
//!   pause, which do not pause in turn: a long merge of a deep tier does not leave the small
//!   runs piling up behind it. Those merges never take its inputs (they are of lower tiers)
//!   and use its revocations (`Revocations::Held`).
//! - A merge of backlinks or forward links (`Revocable`) reads the revocation tables only after
//!   it read `tables_clock`, so every revocation stamped at or below that clock is among those it
//!   read (`KnownRevocations::load`):
//!   the runs earlier merges read it knows from them (`RevocationsRead`, kept under the
//!   compaction lock), the others it scans.
//! - The catalog retires the inputs and adds the output in one transaction before the tree swaps
//!   them; the inputs' local files go only after that, and only once no publish that may be
//!   uploading them is in flight (`retired`).

use super::{Index, IndexError, add_elapsed};
use crate::liveness::{KnownRevocations, Revocable, RevocationsRead};
use crate::lsm::compaction::{self, CompactionOptions};
use crate::lsm::entry::Entry;
use crate::lsm::record::{RunKind, TableRecord};
use crate::lsm::run::Run;
use crate::lsm::tree::Tree;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Most merges of lower tiers made between two passes of a longer merge. Enough for what the
/// flushes of one pass's time leave (at 1 B links a pass of the deepest merge took about a
/// minute, in which some 40 runs came), few enough that the longer merge always goes on.
const MERGES_BETWEEN_PASSES: usize = 16;

/// Which merge a tree is asked for.
#[derive(Clone, Copy)]
enum Picker {
    /// A full tier (`compaction::pick`).
    FullTier,
    /// Every run of tier 0 (`compaction::pick_settle`).
    Settle,
    /// A full tier below this one: what runs between the passes of a merge of that tier. Its
    /// inputs are never the longer merge's, which are all of that tier or above.
    Below(u32),
}

impl Picker {
    fn pick<E: Entry>(self, runs: &[Arc<Run<E>>], options: &CompactionOptions) -> Option<Vec<Arc<Run<E>>>> {
        match self {
            Picker::FullTier => compaction::pick(runs, options),
            Picker::Settle => compaction::pick_settle(runs, options),
            Picker::Below(tier) => {
                let lower: Vec<Arc<Run<E>>> =
                    runs.iter().filter(|run| compaction::tier(run.data_bytes(), options) < tier).cloned().collect();
                compaction::pick(&lower, options)
            }
        }
    }
}

/// What every merge of one compaction shares, those between the passes of another too.
struct Compaction<'a> {
    runtime: &'a tokio::runtime::Handle,
    /// Read when each merge retires its inputs: a merge between the passes of a long one ends
    /// minutes after the compaction began, and GC's grace counts from the retirement.
    now_ms: &'a dyn Fn() -> u64,
    options: &'a CompactionOptions,
}

/// The revocations a merge of backlinks or forward links uses.
enum Revocations<'a> {
    /// Loaded for this merge from what earlier merges read (`KnownRevocations::load`).
    Load(&'a mut RevocationsRead),
    /// Those of the merge this one runs between the passes of: older than a fresh load, which
    /// is sound (`KnownRevocations` holds every revocation stamped in its range, for good).
    Held(&'a KnownRevocations, &'a mut RevocationsRead),
}

impl Index {
    /// One compaction, if a tier of any tree is full: merges its oldest `fan_in` runs into one
    /// sharded run; each merge retires its inputs at the time `clock` gives when it ends. Blocking (it reads through `runtime` when a table
    /// is not local): call it from a blocking thread. Returns whether it merged anything.
    pub fn compact_once(&self, runtime: &tokio::runtime::Handle, clock: &dyn Fn() -> u64) -> Result<bool, IndexError> {
        self.compact_once_with(runtime, clock, &self.options.compaction)
    }

    /// `compact_once` with other options (a benchmark or an operator's one-off).
    pub fn compact_once_with(
        &self,
        runtime: &tokio::runtime::Handle,
        clock: &dyn Fn() -> u64,
        options: &CompactionOptions,
    ) -> Result<bool, IndexError> {
        self.merge_picked(&Compaction { runtime, now_ms: clock, options }, Picker::FullTier)
    }

    /// Compressed bytes below which a run is in tier 0 (`compaction::tier_zero_bound`).
    pub fn tier_zero_bytes(&self) -> u64 {
        compaction::tier_zero_bound(&self.options.compaction)
    }

    /// One settling merge, if any tree has two or more runs in its lowest tier: merges them all
    /// (`compaction::pick_settle`). For a quiet tree and a writer about to stop: what an import
    /// leaves in tier 0 is otherwise up to `fan_in - 1` runs every query visits. Blocking, as
    /// `compact_once`; returns whether it merged anything.
    pub fn settle_once(&self, runtime: &tokio::runtime::Handle, clock: &dyn Fn() -> u64) -> Result<bool, IndexError> {
        self.merge_picked(&Compaction { runtime, now_ms: clock, options: &self.options.compaction }, Picker::Settle)
    }

    fn merge_picked(&self, compaction: &Compaction, picker: Picker) -> Result<bool, IndexError> {
        let mut read = self.compacting.lock().expect("compaction lock poisoned");
        self.merge_first(compaction, picker, &mut read, None)
    }

    /// Merges what `picker` chooses in the first tree it chooses anything in (backlinks, forward
    /// links, hot links, revocations, tallies, then account tallies). `held`: the revocations of the merge this one runs
    /// between the passes of.
    fn merge_first(
        &self,
        compaction: &Compaction,
        picker: Picker,
        read: &mut RevocationsRead,
        held: Option<&KnownRevocations>,
    ) -> Result<bool, IndexError> {
        let revocations = |read| match held {
            Some(known) => Revocations::Held(known, read),
            None => Revocations::Load(read),
        };
        if let Some(inputs) = picker.pick(&self.links.runs(), compaction.options) {
            self.compact_revoked(&self.links, &inputs, compaction, picker, revocations(read))?;
            return Ok(true);
        }
        if let Some(inputs) = picker.pick(&self.forward.runs(), compaction.options) {
            self.compact_revoked(&self.forward, &inputs, compaction, picker, revocations(read))?;
            return Ok(true);
        }
        if let Some(inputs) = picker.pick(&self.hot.runs(), compaction.options) {
            self.compact_revoked(&self.hot, &inputs, compaction, picker, revocations(read))?;
            return Ok(true);
        }
        if let Some(inputs) = picker.pick(&self.thresholds.runs(), compaction.options) {
            let (output, failed) = self.compact_freshest(&self.thresholds, &inputs, compaction, picker, read, held)?;
            read.replaced(&inputs.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), &output);
            return failed.map_or(Ok(true), Err);
        }
        if let Some(inputs) = picker.pick(&self.tallies.runs(), compaction.options) {
            let (_, failed) = self.compact_freshest(&self.tallies, &inputs, compaction, picker, read, held)?;
            return failed.map_or(Ok(true), Err);
        }
        if let Some(inputs) = picker.pick(&self.account_tallies.runs(), compaction.options) {
            let (_, failed) = self.compact_freshest(&self.account_tallies, &inputs, compaction, picker, read, held)?;
            return failed.map_or(Ok(true), Err);
        }
        Ok(false)
    }

    /// Merges runs of a tree whose entries only fresher copies replace (revocations, tallies and
    /// account tallies).
    /// Returns the output's run id, and the first error of the merges between its passes.
    fn compact_freshest<E: Entry>(
        &self,
        tree: &Tree<E>,
        inputs: &[Arc<Run<E>>],
        compaction: &Compaction,
        picker: Picker,
        read: &mut RevocationsRead,
        held: Option<&KnownRevocations>,
    ) -> Result<(String, Option<IndexError>), IndexError> {
        let mut failed = None;
        let output = self.compact_tree(tree, inputs, compaction, &mut Some, &mut || {
            self.merge_between_passes(compaction, (picker, inputs), read, held, &mut failed)
        });
        Ok((either_failure(output, &mut failed)?, failed))
    }

    /// Merges runs of a tree whose entries revocations kill (backlinks, forward links), with the
    /// revocations a merge may use (module invariants).
    fn compact_revoked<E: Revocable>(
        &self,
        tree: &Tree<E>,
        inputs: &[Arc<Run<E>>],
        compaction: &Compaction,
        picker: Picker,
        revocations: Revocations,
    ) -> Result<(), IndexError> {
        let (loaded, held, read) = match revocations {
            Revocations::Held(known, read) => (None, Some(known), read),
            Revocations::Load(read) => (Some(self.load_revocations(compaction, read)?), None, read),
        };
        let known = held.or(loaded.as_ref()).expect("revocations held or loaded");
        let mut failed = None;
        let merged = self.compact_tree(tree, inputs, compaction, &mut |entry: E| entry.settle_by(known), &mut || {
            self.merge_between_passes(compaction, (picker, inputs), read, Some(known), &mut failed)
        });
        if let Some(known) = loaded {
            read.keep(known);
            self.revocations_held_bytes.store(read.memory_bytes(), Ordering::Relaxed);
        }
        either_failure(merged, &mut failed)?;
        failed.map_or(Ok(()), Err)
    }

    /// The revocations a merge of backlinks or forward links may use, from what earlier merges
    /// read (give them back with `RevocationsRead::keep`).
    fn load_revocations(
        &self,
        compaction: &Compaction,
        read: &mut RevocationsRead,
    ) -> Result<KnownRevocations, IndexError> {
        // Read before the revocation tables: what it promises is installed already.
        let complete_through = self.tables_clock.load(Ordering::Acquire);
        let runs = self.thresholds.runs();
        let (store, runtime) = (self.store.as_ref(), compaction.runtime);
        let known = KnownRevocations::load(&runs, complete_through, store, runtime, compaction.options, read)?;
        self.revocations_held_bytes.store(known.memory_bytes(), Ordering::Relaxed);
        Ok(known)
    }

    /// What runs between two passes of a merge of `inputs` (chosen by `picker`): the merges of
    /// the tiers below its inputs', at most `MERGES_BETWEEN_PASSES`, which do not pause in turn.
    /// The first that fails stops them and is kept in `failed`, for after the longer merge.
    fn merge_between_passes<E: Entry>(
        &self,
        compaction: &Compaction,
        (picker, inputs): (Picker, &[Arc<Run<E>>]),
        read: &mut RevocationsRead,
        held: Option<&KnownRevocations>,
        failed: &mut Option<IndexError>,
    ) {
        if matches!(picker, Picker::Below(_)) || failed.is_some() {
            return;
        }
        let tier = inputs.iter().map(|run| compaction::tier(run.data_bytes(), compaction.options)).min().unwrap_or(0);
        for _ in 0..MERGES_BETWEEN_PASSES {
            match self.merge_first(compaction, Picker::Below(tier), read, held) {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => return *failed = Some(error),
            }
        }
    }

    /// Merges `inputs` of `tree` with `keep` (see `compaction::merge`), swaps the output in and
    /// retires them; returns the output's run id.
    fn compact_tree<E: Entry>(
        &self,
        tree: &Tree<E>,
        inputs: &[Arc<Run<E>>],
        compaction: &Compaction,
        keep: &mut dyn FnMut(E) -> Option<E>,
        between_passes: &mut dyn FnMut(),
    ) -> Result<String, IndexError> {
        let (runtime, options) = (compaction.runtime, compaction.options);
        let started = std::time::Instant::now();
        let mut nested = std::time::Duration::ZERO;
        let mut between_passes = || {
            let paused = std::time::Instant::now();
            between_passes();
            nested += paused.elapsed();
        };
        let bytes_in: u64 = inputs.iter().map(|r| r.data_bytes()).sum();
        let shard_count = compaction::shard_count_for(bytes_in, options);
        let (run_id, ids) = {
            let mut writer = self.writer.lock().expect("writer lock poisoned");
            let run_id = self.new_table_id(&mut writer)?;
            let ids: Vec<String> =
                (0..shard_count).map(|_| self.new_table_id(&mut writer)).collect::<Result<_, _>>()?;
            (run_id, ids)
        };
        let output =
            compaction::merge(tree, inputs, &ids, self.store.as_ref(), runtime, options, keep, &mut between_passes)?;
        let records: Vec<TableRecord> = output
            .tables
            .iter()
            .zip(&ids)
            .map(|((shard, summary), id)| {
                let run = (run_id.clone(), RunKind::Compacted);
                TableRecord::written(E::TREE, id.clone(), run, (*shard, shard_count), summary)
            })
            .collect();
        let removed: Vec<String> = inputs.iter().map(|r| r.id.clone()).collect();
        let removed_refs: Vec<&str> = removed.iter().map(String::as_str).collect();
        self.catalog.replace_runs(&removed_refs, &records, (compaction.now_ms)())?;
        let tables = records.into_iter().map(|r| tree.open_table(r).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
        let run = Run::from_tables(tables).expect("a compaction writes every shard of its run");
        tree.replace_runs(&removed, run);
        let retired: Vec<String> = inputs.iter().flat_map(|r| r.tables.iter()).map(|t| t.record.id.clone()).collect();
        self.remove_retired_files(E::TREE, &retired)?;
        self.counters.compactions.fetch_add(1, Ordering::Relaxed);
        let bytes_out: u64 = output.tables.iter().map(|(_, summary)| summary.data_len + summary.meta_len).sum();
        self.counters.compaction_bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.counters.compaction_bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        // Its time less the merges' between its passes, which counted theirs.
        add_elapsed(&self.counters.compaction_micros, started + nested);
        tracing::info!(
            tree = E::TREE.name(),
            inputs = inputs.len(),
            shards = shard_count,
            passes = output.passes,
            entries_in = output.entries_in,
            duplicates = output.duplicates_dropped,
            killed = output.killed_dropped,
            "compacted"
        );
        Ok(run_id)
    }
}

/// A merge's outcome when merges ran between its passes (`failed`, the first of theirs that
/// failed): the merge's own error first, the other one logged (it is also in the catalog's
/// untouched inputs, and the next merge meets it again).
fn either_failure<T>(merged: Result<T, IndexError>, failed: &mut Option<IndexError>) -> Result<T, IndexError> {
    if merged.is_err()
        && let Some(nested) = failed.take()
    {
        tracing::error!(error = %nested, "a merge between the passes of a failed merge failed too");
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constellation::many;
    use crate::index::{IndexOptions, open_in_dir};
    use crate::model::ids::TreeKind;
    use crate::model::operation::{Operation, RecordOp, RecordRef};
    use crate::query::{Cursor, ListParams, list_backlinks};
    use std::collections::{BTreeMap, BTreeSet};

    const TARGETS: usize = 7;

    fn follow_of(n: usize) -> RecordRef<'static> {
        RecordRef {
            did: format!("did:plc:author{:018}", n % 500).into(),
            collection: "app.bsky.graph.follow".into(),
            rkey: format!("3kfollow{n:06}").into(),
        }
    }

    fn target_of(n: usize) -> String {
        format!("did:plc:target{:018}", n % TARGETS)
    }

    fn uri_of(record: &RecordRef) -> String {
        format!("at://{}/{}/{}", record.did, record.collection, record.rkey)
    }

    /// Records of two links each, `range` (and deletes of the follows in `deleted`), then a flush: one run of each
    /// tree they write to. `live` is the model: the sources of each target.
    fn flushed(
        index: &Index,
        range: std::ops::Range<usize>,
        deleted: &[usize],
        live: &mut BTreeMap<String, BTreeSet<String>>,
    ) {
        for n in range {
            // Two links, so the record has forward links too.
            let record = serde_json::json!({ "subject": target_of(n), "via": target_of(n + 3) });
            let create = Operation::Create(RecordOp { record_ref: follow_of(n), record });
            index.apply(&create, Some(n as i64 + 1)).unwrap();
            for target in [target_of(n), target_of(n + 3)] {
                live.entry(target).or_default().insert(uri_of(&follow_of(n)));
            }
        }
        for &n in deleted {
            index.apply(&Operation::Delete(follow_of(n)), None).unwrap();
            for target in [target_of(n), target_of(n + 3)] {
                live.get_mut(&target).unwrap().remove(&uri_of(&follow_of(n)));
            }
        }
        assert!(index.flush().unwrap() > 0);
    }

    fn sources_of(index: &Index, runtime: &tokio::runtime::Runtime, target: &str) -> BTreeSet<String> {
        let mut sources = BTreeSet::new();
        let mut params = ListParams { limit: 1000, ..ListParams::new(target) };
        loop {
            let page = runtime.block_on(list_backlinks(index, &params)).unwrap();
            sources.extend(page.items.into_iter().map(|(_, source)| source));
            match page.cursor {
                Some(cursor) => params.cursor = Some(Cursor::decode(&cursor).unwrap()),
                None => return sources,
            }
        }
    }

    /// The records linking to `target` by `subject`, each with its `via` subject: getManyToMany,
    /// which reads the forward tree, paged.
    fn joined_of(index: &Index, runtime: &tokio::runtime::Runtime, target: &str) -> BTreeSet<(String, String)> {
        let mut joined = BTreeSet::new();
        let mut cursor = None;
        loop {
            let mut pairs = vec![
                ("subject", target.to_string()),
                ("source", "app.bsky.graph.follow:subject".to_string()),
                ("pathToOther", "via".to_string()),
                ("limit", "1000".to_string()),
            ];
            pairs.extend(cursor.take().map(|cursor| ("cursor", cursor)));
            let pairs: Vec<(String, String)> = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let params = many::parse_many_query(&pairs, "linkDid").unwrap();
            let page = runtime.block_on(many::get_many_to_many(index, &params)).unwrap();
            for item in page["items"].as_array().unwrap() {
                let record = &item["linkRecord"];
                let text = |field: &str| record[field].as_str().unwrap().to_string();
                let uri = format!("at://{}/{}/{}", text("did"), text("collection"), text("rkey"));
                joined.insert((uri, item["otherSubject"].as_str().unwrap().to_string()));
            }
            match page["cursor"].as_str() {
                Some(next) => cursor = Some(next.to_string()),
                None => return joined,
            }
        }
    }

    fn tiers<E: Entry>(runs: &[Arc<Run<E>>], options: &CompactionOptions) -> Vec<u32> {
        runs.iter().map(|run| compaction::tier(run.data_bytes(), options)).collect()
    }

    /// Options under which a run of `bytes` is the first of tier 1 with `fan_in` 2, so that
    /// runs of up to twice as many bytes are in tier 1 and smaller ones in tier 0.
    fn tier_one_from(bytes: u64) -> CompactionOptions {
        CompactionOptions {
            fan_in: 2,
            min_run_bytes: bytes / 2,
            shard_bytes: 1 << 10,
            max_bytes_per_sec: None,
            ..CompactionOptions::default()
        }
    }

    /// A merge of split runs of tier 1 in the links tree, while the forward and revocation
    /// trees have a full tier 0: those merges run between its passes, in the same
    /// `compact_once`, and the answers are the model's (the deletes' backlinks are gone).
    #[test]
    fn a_long_merge_lets_the_lower_tiers_merge_between_its_passes() {
        let dir = tempfile::tempdir().unwrap();
        let index = open_in_dir(dir.path(), IndexOptions::default());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut live = BTreeMap::new();
        let everything_in_tier_zero = CompactionOptions { min_run_bytes: u64::MAX >> 8, ..tier_one_from(0) };
        let compact = |options: &CompactionOptions| index.compact_once_with(runtime.handle(), &|| 1, options).unwrap();
        // Two runs of each tree, merged (split into shards): links L12, forward F12.
        flushed(&index, 0..3_000, &[], &mut live);
        flushed(&index, 3_000..6_000, &[], &mut live);
        assert!(compact(&everything_in_tier_zero) && compact(&everything_in_tier_zero));
        let links = index.links.runs();
        let [l12] = &links[..] else { panic!("one links run") };
        // Two more of each, with deletes (two revocation runs); their links runs merged: L34.
        let deleted: Vec<usize> = (0..3_000).step_by(7).chain((3_000..6_000).step_by(5)).collect();
        let (first, second) = deleted.split_at(deleted.partition_point(|&n| n < 3_000));
        flushed(&index, 6_000..9_000, first, &mut live);
        flushed(&index, 9_000..12_000, second, &mut live);
        assert!(compact(&tier_one_from(l12.data_bytes())));
        let links = index.links.runs();
        assert_eq!(links.len(), 2, "L12 and L34");
        let smaller = links.iter().map(|run| run.data_bytes()).min().unwrap();
        let options = tier_one_from(smaller);
        assert_eq!(tiers(&index.links.runs(), &options), [1, 1], "the premise: a full tier 1 of links");
        assert!(index.links.runs().iter().all(|run| run.shard_count() > 1), "split, so merged in passes");
        assert_eq!(tiers(&index.forward.runs(), &options)[1..], [0, 0], "the premise: F3 and F4");
        assert_eq!(index.thresholds.runs().len(), 2, "the premise: R3 and R4");
        let compactions = index.counters.compactions.load(Ordering::Relaxed);
        let ticks = std::cell::Cell::new(100);
        let clock = || {
            ticks.set(ticks.get() + 1);
            ticks.get()
        };
        let merging = std::time::Instant::now();
        let merge_micros = index.counters.compaction_micros.load(Ordering::Relaxed);
        assert!(index.compact_once_with(runtime.handle(), &clock, &options).unwrap());
        let counted = index.counters.compaction_micros.load(Ordering::Relaxed) - merge_micros;
        assert!(counted <= merging.elapsed().as_micros() as u64, "the merges between the passes counted twice");
        assert_eq!(index.counters.compactions.load(Ordering::Relaxed), compactions + 3);
        // Each merge retires its inputs when it ends (GC's grace counts from then): the two
        // between the passes first, the long one last.
        let retired = index.catalog.obsolete_tables(u64::MAX).unwrap();
        let mut times: Vec<u64> = retired.iter().map(|(_, at)| *at).filter(|at| *at > 100).collect();
        times.dedup();
        assert_eq!(times, [101, 102, 103]);
        let links_retired_at = retired.iter().filter(|(t, _)| t.tree == TreeKind::Links).map(|(_, at)| *at).max();
        assert_eq!(links_retired_at, Some(103));
        assert_eq!(index.links.runs().len(), 1);
        assert_eq!(index.forward.runs().len(), 2, "F12, and F34 merged between the passes");
        assert_eq!(index.thresholds.runs().len(), 1, "merged between the passes");
        for n in 0..TARGETS {
            let target = target_of(n);
            assert_eq!(sources_of(&index, &runtime, &target), live[&target], "{target}");
            let joined: BTreeSet<(String, String)> = (0..12_000)
                .filter(|m| target_of(*m) == target && deleted.binary_search(m).is_err())
                .map(|m| (uri_of(&follow_of(m)), target_of(m + 3)))
                .collect();
            assert_eq!(joined_of(&index, &runtime, &target), joined, "{target}: its records' other subjects");
        }
    }
}
