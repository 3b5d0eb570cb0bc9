//! Compaction driven by the index: picks a full tier of any tree (backlinks, then forward links,
//! then revocations), merges it on the calling thread with the revocations a merge may use, and
//! swaps the result in.
//!
//! Invariants:
//! - One merge at a time (`Index::compacting`).
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

/// Which merge a tree is asked for.
#[derive(Clone, Copy)]
enum Picker {
    /// A full tier (`compaction::pick`).
    FullTier,
    /// Every run of tier 0 (`compaction::pick_settle`).
    Settle,
}

impl Picker {
    fn pick<E: Entry>(self, runs: &[Arc<Run<E>>], options: &CompactionOptions) -> Option<Vec<Arc<Run<E>>>> {
        match self {
            Picker::FullTier => compaction::pick(runs, options),
            Picker::Settle => compaction::pick_settle(runs, options),
        }
    }
}

impl Index {
    /// One compaction, if a tier of any tree is full: merges its oldest `fan_in` runs into one
    /// sharded run and retires them at `now_ms`. Blocking (it reads through `runtime` when a table
    /// is not local): call it from a blocking thread. Returns whether it merged anything.
    pub fn compact_once(&self, runtime: &tokio::runtime::Handle, now_ms: u64) -> Result<bool, IndexError> {
        self.compact_once_with(runtime, now_ms, &self.options.compaction)
    }

    /// `compact_once` with other options (a benchmark or an operator's one-off).
    pub fn compact_once_with(
        &self,
        runtime: &tokio::runtime::Handle,
        now_ms: u64,
        options: &CompactionOptions,
    ) -> Result<bool, IndexError> {
        self.merge_picked(runtime, now_ms, options, Picker::FullTier)
    }

    /// Compressed bytes below which a run is in tier 0 (`compaction::tier_zero_bound`).
    pub fn tier_zero_bytes(&self) -> u64 {
        compaction::tier_zero_bound(&self.options.compaction)
    }

    /// One settling merge, if any tree has two or more runs in its lowest tier: merges them all
    /// (`compaction::pick_settle`). For a quiet tree and a writer about to stop: what an import
    /// leaves in tier 0 is otherwise up to `fan_in - 1` runs every query visits. Blocking, as
    /// `compact_once`; returns whether it merged anything.
    pub fn settle_once(&self, runtime: &tokio::runtime::Handle, now_ms: u64) -> Result<bool, IndexError> {
        self.merge_picked(runtime, now_ms, &self.options.compaction, Picker::Settle)
    }

    /// Merges what `picker` chooses in the first tree it chooses anything in (backlinks, then
    /// forward links, then revocations).
    fn merge_picked(
        &self,
        runtime: &tokio::runtime::Handle,
        now_ms: u64,
        options: &CompactionOptions,
        picker: Picker,
    ) -> Result<bool, IndexError> {
        let mut read = self.compacting.lock().expect("compaction lock poisoned");
        if let Some(inputs) = picker.pick(&self.links.runs(), options) {
            self.compact_revoked(&self.links, &inputs, runtime, now_ms, options, &mut read)?;
            return Ok(true);
        }
        if let Some(inputs) = picker.pick(&self.forward.runs(), options) {
            self.compact_revoked(&self.forward, &inputs, runtime, now_ms, options, &mut read)?;
            return Ok(true);
        }
        if let Some(inputs) = picker.pick(&self.thresholds.runs(), options) {
            let output = self.compact_tree(&self.thresholds, &inputs, runtime, now_ms, options, &mut Some)?;
            read.replaced(&inputs.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), &output);
            return Ok(true);
        }
        Ok(false)
    }

    /// Merges runs of a tree whose entries revocations kill (backlinks, forward links), with the
    /// revocations a merge may use (module invariants).
    fn compact_revoked<E: Revocable>(
        &self,
        tree: &Tree<E>,
        inputs: &[Arc<Run<E>>],
        runtime: &tokio::runtime::Handle,
        now_ms: u64,
        options: &CompactionOptions,
        read: &mut RevocationsRead,
    ) -> Result<(), IndexError> {
        // Read before the revocation tables: what it promises is installed already.
        let complete_through = self.tables_clock.load(Ordering::Acquire);
        let runs = self.thresholds.runs();
        let known = KnownRevocations::load(&runs, complete_through, self.store.as_ref(), runtime, options, read)?;
        self.revocations_held_bytes.store(known.memory_bytes(), Ordering::Relaxed);
        let merged = self.compact_tree(tree, inputs, runtime, now_ms, options, &mut |entry: E| entry.settle_by(&known));
        read.keep(known);
        self.revocations_held_bytes.store(read.memory_bytes(), Ordering::Relaxed);
        merged.map(|_| ())
    }

    fn compact_tree<E: Entry>(
        &self,
        tree: &Tree<E>,
        inputs: &[Arc<Run<E>>],
        runtime: &tokio::runtime::Handle,
        now_ms: u64,
        options: &CompactionOptions,
        keep: &mut dyn FnMut(E) -> Option<E>,
    ) -> Result<String, IndexError> {
        let started = std::time::Instant::now();
        let bytes_in: u64 = inputs.iter().map(|r| r.data_bytes()).sum();
        let shard_count = compaction::shard_count_for(bytes_in, options);
        let (run_id, ids) = {
            let mut writer = self.writer.lock().expect("writer lock poisoned");
            let run_id = self.new_table_id(&mut writer)?;
            let ids: Vec<String> =
                (0..shard_count).map(|_| self.new_table_id(&mut writer)).collect::<Result<_, _>>()?;
            (run_id, ids)
        };
        let output = compaction::merge(tree, inputs, &ids, self.store.as_ref(), runtime, options, keep)?;
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
        self.catalog.replace_runs(&removed_refs, &records, now_ms)?;
        let tables = records.into_iter().map(|r| tree.open_table(r).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
        let run = Run::from_tables(tables).expect("a compaction writes every shard of its run");
        tree.replace_runs(&removed, run);
        let retired: Vec<String> = inputs.iter().flat_map(|r| r.tables.iter()).map(|t| t.record.id.clone()).collect();
        self.remove_retired_files(E::TREE, &retired)?;
        self.counters.compactions.fetch_add(1, Ordering::Relaxed);
        let bytes_out: u64 = output.tables.iter().map(|(_, summary)| summary.data_len + summary.meta_len).sum();
        self.counters.compaction_bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.counters.compaction_bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        add_elapsed(&self.counters.compaction_micros, started);
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
