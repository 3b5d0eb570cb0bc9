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

use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::handle::{ReadError, ScanBatch, TableHandle};
use crate::lsm::table::PageUse;
use crate::store::object::Store;
use std::sync::Arc;

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
    _models: Option<Arc<ColumnModels>>,
}

impl<E: Entry> TableScan<E> {
    pub fn new(table: Arc<TableHandle<E>>, frames_per_read: usize) -> Self {
        let frames_per_read = frames_per_read.max(1);
        Self { table, next_frame: 0, frames_per_read, batch: None, buffer: Vec::new(), position: 0, _models: None }
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
                if self.next_frame == 0 {
                    self._models = self.table.paged_models(PageUse::Scan)?;
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
            Some(batch) => self.table.decode_scan_frame(batch, &mut self.buffer),
            None => Ok(false),
        }
    }

    /// Compressed bytes of the frames read so far (for pacing).
    pub fn bytes_read(&self) -> Result<u64, ReadError> {
        let (start, end) = self.table.byte_range(0..self.next_frame, PageUse::Scan)?;
        Ok(end - start)
    }
}
