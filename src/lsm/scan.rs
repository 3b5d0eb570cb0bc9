//! Reading one table in key order, a batch of frames at a time: what a merge streams from each
//! input and what loads every revocation for a merge's thresholds.
//!
//! Invariants:
//! - At most one batch of `frames_per_read` frames is held at a time, and reads bypass the frame
//!   cache and keep no frame-index chunk or column models in the meta cache (a scan reads each
//!   once; caching would only evict what queries use). The scan holds its table's models itself
//!   from its first read to its end, so each batch finds them without the cache.

use crate::lsm::coder::ColumnModels;
use crate::lsm::entry::Entry;
use crate::lsm::handle::{ReadError, TableHandle};
use crate::lsm::table::PageUse;
use crate::store::object::Store;
use std::sync::Arc;

/// Reads one table in order, a batch of frames at a time.
pub struct TableScan<E: Entry> {
    table: Arc<TableHandle<E>>,
    next_frame: usize,
    frames_per_read: usize,
    buffer: Vec<E>,
    position: usize,
    /// The table's decoded column models, held for every batch (`TableHandle::paged_models`).
    _models: Option<Arc<ColumnModels>>,
}

impl<E: Entry> TableScan<E> {
    pub fn new(table: Arc<TableHandle<E>>, frames_per_read: usize) -> Self {
        let frames_per_read = frames_per_read.max(1);
        Self { table, next_frame: 0, frames_per_read, buffer: Vec::new(), position: 0, _models: None }
    }

    pub fn next(&mut self, store: &dyn Store, runtime: &tokio::runtime::Handle) -> Result<Option<E>, ReadError> {
        if self.position == self.buffer.len() {
            let frames = self.table.frame_count();
            if self.next_frame == frames {
                return Ok(None);
            }
            if self.next_frame == 0 {
                self._models = self.table.paged_models(PageUse::Scan)?;
            }
            let batch = self.next_frame..(self.next_frame + self.frames_per_read).min(frames);
            self.next_frame = batch.end;
            self.buffer = runtime.block_on(self.table.read_frames_with(store, batch, PageUse::Scan))?;
            self.position = 0;
        }
        let entry = self.buffer[self.position];
        self.position += 1;
        Ok(Some(entry))
    }

    /// Compressed bytes of the frames read so far (for pacing).
    pub fn bytes_read(&self) -> Result<u64, ReadError> {
        let (start, end) = self.table.byte_range(0..self.next_frame, PageUse::Scan)?;
        Ok(end - start)
    }
}
