//! Reading one table in key order, a batch of frames at a time: what a merge streams from each
//! input and what loads every revocation for a merge's thresholds.
//!
//! Invariants:
//! - At most one batch of `frames_per_read` frames is held at a time, compressed and checked by
//!   its checksums, and one frame of it decoded (a merge scans every table of its inputs at
//!   once: up to a hundred or more at the largest sizes). Reads bypass the frame
//!   cache and keep no frame-index chunk or column models in the meta cache (a scan reads each
//!   once; caching would only evict what queries use). The scan holds its table's models itself
//!   from its first read to its end, so each batch finds them without the cache.
//! - Scans that share a `SharedModels` hold one decoded copy of each distinct set of models:
//!   every shard of a compacted run was coded under one set (a merge's builders share it), so
//!   a merge over 8 runs of 128 shards holds 8 sets, not 128 (about 640 KiB each).

use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::handle::{ReadError, ScanBatch, TableHandle};
use crate::lsm::table::PageUse;
use crate::store::object::Store;
use std::collections::HashMap;
use std::sync::Arc;

/// Decoded column models by what names them (`TableHandle::paged_models_id`), for the scans of
/// one merge.
#[derive(Default)]
pub struct SharedModels(HashMap<(u64, usize), Arc<ColumnModels>>);

impl SharedModels {
    /// `table`'s paged models: a copy another table of the merge decoded, or read now.
    fn of<E: Entry>(&mut self, table: &TableHandle<E>) -> Result<Option<Arc<ColumnModels>>, ReadError> {
        let Some(id) = table.paged_models_id() else { return Ok(None) };
        if let Some(models) = self.0.get(&id) {
            return Ok(Some(models.clone()));
        }
        let models = table.paged_models(PageUse::Scan)?;
        if let Some(models) = &models {
            self.0.insert(id, models.clone());
        }
        Ok(models)
    }
}

/// Reads one table in order, a batch of frames at a time.
pub struct TableScan<E: Entry> {
    table: Arc<TableHandle<E>>,
    next_frame: usize,
    frames_per_read: usize,
    batch: Option<ScanBatch<E>>,
    /// The frame decoded last.
    buffer: Vec<E>,
    position: usize,
    /// The table's decoded column models, held for every batch (`TableHandle::paged_models`).
    models: Option<Arc<ColumnModels>>,
}

impl<E: Entry> TableScan<E> {
    /// A scan of `table` that holds its models alone.
    pub fn new(table: Arc<TableHandle<E>>, frames_per_read: usize) -> Result<Self, ReadError> {
        Self::sharing(table, frames_per_read, &mut SharedModels::default())
    }

    /// A scan of `table` that takes its models from `shared` (or reads them into it).
    pub fn sharing(
        table: Arc<TableHandle<E>>,
        frames_per_read: usize,
        shared: &mut SharedModels,
    ) -> Result<Self, ReadError> {
        let models = shared.of(&table)?;
        let frames_per_read = frames_per_read.max(1);
        Ok(Self { table, next_frame: 0, frames_per_read, batch: None, buffer: Vec::new(), position: 0, models })
    }

    pub fn next(&mut self, store: &dyn Store, runtime: &tokio::runtime::Handle) -> Result<Option<E>, ReadError> {
        if self.position == self.buffer.len() {
            self.buffer.clear();
            self.position = 0;
            while !self.decode_next_frame()? {
                let frames = self.table.frame_count();
                if self.next_frame == frames {
                    return Ok(None);
                }
                let batch = self.next_frame..(self.next_frame + self.frames_per_read).min(frames);
                self.next_frame = batch.end;
                self.batch = Some(runtime.block_on(self.table.read_scan_batch(store, batch))?);
            }
        }
        let entry = self.buffer[self.position];
        self.position += 1;
        Ok(Some(entry))
    }

    /// Decodes the next frame of the batch into the buffer; `false` when there is none.
    fn decode_next_frame(&mut self) -> Result<bool, ReadError> {
        match &mut self.batch {
            Some(batch) => self.table.decode_scan_frame(batch, self.models.as_deref(), &mut self.buffer),
            None => Ok(false),
        }
    }

    /// Compressed bytes of the frames read so far (for pacing).
    pub fn bytes_read(&self) -> Result<u64, ReadError> {
        let (start, end) = self.table.byte_range(0..self.next_frame, PageUse::Scan)?;
        Ok(end - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsm::compaction::{CompactionOptions, merge};
    use crate::lsm::record::{RunKind, TableRecord};
    use crate::lsm::run::Run;
    use crate::lsm::table::TableOptions;
    use crate::lsm::tree::{Tree, TreeCaches};
    use crate::model::ids::{Backlink, RecordId, TreeKind};

    /// The shards a merge writes share one set of models, and scans sharing a `SharedModels`
    /// hold one decoded copy of it; they read every entry back.
    #[test]
    fn scans_of_one_runs_shards_hold_one_copy_of_their_models() {
        let dir = tempfile::tempdir().unwrap();
        let options = TableOptions { frame_bytes: 64 * 16, model_min_entries: 100, ..TableOptions::default() };
        let caches = TreeCaches::of_bytes(1 << 20, 1 << 20);
        let tree = Tree::<Backlink>::new(dir.path().join("links"), options, caches).unwrap();
        let link = |i: u64| Backlink {
            target: RecordId::repo(i % 300),
            source: RecordId { rkey: i, collection: 1 + i % 3, did: i % 97 },
            location: 1 + i % 2,
            source_rev: 10,
        };
        let mut entries: Vec<Backlink> = (0..8_000).map(link).collect();
        entries.sort();
        let open = |id: &str, run: (String, RunKind), shard: (u32, u32), summary| {
            let record = TableRecord::written(TreeKind::Links, id.to_string(), run, shard, summary);
            Arc::new(tree.open_table(record).unwrap())
        };
        let summary = tree.write_sorted("in", || entries.iter().copied()).unwrap();
        let delta = open("in", ("in".into(), RunKind::Delta), (0, 1), &summary);
        let input = Arc::new(Run::from_tables(vec![delta]).unwrap());
        let store = crate::store::dir::DirStore::new(dir.path().join("bucket"));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let ids: Vec<String> = (0..4).map(|i| format!("out{i}")).collect();
        let options = CompactionOptions::default();
        let merged = merge(&tree, &[input], &ids, &store, runtime.handle(), &options, &mut Some, &mut || {});
        let shards: Vec<_> = merged
            .unwrap()
            .tables
            .iter()
            .zip(&ids)
            .map(|((shard, summary), id)| open(id, ("out".into(), RunKind::Compacted), (*shard, 4), summary))
            .collect();

        let mut shared = SharedModels::default();
        let mut scans: Vec<_> = shards.iter().map(|t| TableScan::sharing(t.clone(), 2, &mut shared).unwrap()).collect();
        let held = scans[0].models.clone().expect("the shards have models");
        assert!(scans.iter().all(|scan| scan.models.as_ref().is_some_and(|m| Arc::ptr_eq(m, &held))));
        assert_eq!(shared.0.len(), 1);
        let mut read = Vec::new();
        for scan in &mut scans {
            while let Some(entry) = scan.next(&store, runtime.handle()).unwrap() {
                read.push(entry);
            }
        }
        read.sort();
        assert_eq!(read, entries);
    }
}
