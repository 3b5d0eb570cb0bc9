//! Decoded frames, kept in memory for warm queries: a hit skips the read and the zstd decode.
//!
//! Invariants:
//! - Bounded: the entries held never exceed `capacity_bytes` (counted as decoded entry bytes);
//!   the oldest insertions go first (FIFO: cheap, and a hot frame is simply read again).
//! - A key is (table serial, frame index); serials are unique per process and never reused, so
//!   a frame of a retired table can never be served for another table. Retired tables' frames
//!   age out like any other.
//! - Only frames that decoded and passed their checksums are inserted.

use crate::lsm::entry::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Source of table serials (cache keys).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A fresh serial for a table handle.
pub fn next_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed)
}

type Key = (u64, u32);

#[derive(Debug)]
struct Inner<E> {
    frames: HashMap<Key, Arc<[E]>>,
    order: VecDeque<Key>,
    bytes: usize,
}

#[derive(Debug)]
pub struct FrameCache<E: Entry> {
    capacity_bytes: usize,
    inner: Mutex<Inner<E>>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl<E: Entry> FrameCache<E> {
    pub fn new(capacity_bytes: usize) -> Self {
        let inner = Inner { frames: HashMap::new(), order: VecDeque::new(), bytes: 0 };
        FrameCache { capacity_bytes, inner: Mutex::new(inner), hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    /// The frame if cached.
    pub fn get(&self, serial: u64, frame: u32) -> Option<Arc<[E]>> {
        let found = self.inner.lock().expect("frame cache poisoned").frames.get(&(serial, frame)).cloned();
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keeps a decoded frame, evicting the oldest ones to stay within the capacity.
    pub fn insert(&self, serial: u64, frame: u32, entries: Arc<[E]>) {
        let size = std::mem::size_of_val(entries.as_ref());
        if size > self.capacity_bytes {
            return;
        }
        let mut inner = self.inner.lock().expect("frame cache poisoned");
        if inner.frames.insert((serial, frame), entries).is_some() {
            return; // another reader decoded it too; same bytes, already counted
        }
        inner.order.push_back((serial, frame));
        inner.bytes += size;
        while inner.bytes > self.capacity_bytes {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(evicted) = inner.frames.remove(&oldest) {
                inner.bytes -= std::mem::size_of_val(evicted.as_ref());
            }
        }
        assert!(inner.bytes <= self.capacity_bytes, "frame cache over its capacity");
    }

    pub fn bytes(&self) -> usize {
        self.inner.lock().expect("frame cache poisoned").bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::{RecordId, Revocation};

    fn frame(n: u64) -> Arc<[Revocation]> {
        (0..n).map(|i| Revocation { source: RecordId::repo(i), rev: i }).collect()
    }

    #[test]
    fn stays_within_capacity_and_evicts_oldest_first() {
        let cache = FrameCache::new(32 * 10);
        cache.insert(1, 0, frame(4));
        cache.insert(1, 1, frame(4));
        assert_eq!(cache.bytes(), 32 * 8);
        cache.insert(2, 0, frame(4)); // 12 entries > 10: the oldest goes
        assert!(cache.get(1, 0).is_none());
        assert_eq!(cache.get(1, 1).unwrap().len(), 4);
        assert_eq!(cache.get(2, 0).unwrap().len(), 4);
        assert_eq!(cache.bytes(), 32 * 8);
        cache.insert(3, 0, frame(11)); // larger than the whole cache: not kept
        assert!(cache.get(3, 0).is_none());
        assert_eq!((cache.hits.load(Ordering::Relaxed), cache.misses.load(Ordering::Relaxed)), (2, 2));
    }

    #[test]
    fn serials_are_unique() {
        assert_ne!(next_serial(), next_serial());
    }
}
