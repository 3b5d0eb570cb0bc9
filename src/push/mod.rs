//! Live push: every change to the index's answers, as events a subscriber can follow over a
//! websocket and resume from a cursor.
//!
//! - `entry`: one change-log entry (what one ingested event changed) and its events;
//! - `frame`: one frame of the log (length, checksum, entry);
//! - `log`: the change log on local disk, segments kept for `retain_us`;
//! - `packed`: a sealed segment, compressed;
//! - `recent`: recent records' links, so deletes reach the subscribers of what they unlinked;
//! - `feed`: turns ingested events into entries (live ingest calls it);
//! - `filter`: what a subscriber wants;
//! - `hub`: follows the log and hands events to subscribers through bounded queues.
//!
//! The push path sits beside the index, not in it: live ingest hands each event to the feed and
//! to the index, and ends each batch with the feed's `end_batch`, so subscribers see a batch once
//! the index holds all of it; the hub and the subscribers only read the log. Backfill snapshots and
//! `import` are history, not live changes, and make no events. (An event backfill's gate holds
//! for a repository being read is pushed at once and reaches the index with the snapshot; one
//! the gate skips, as older than a snapshot, is pushed all the same: the change did happen.)
//!
//! Invariants:
//! - Applying a subscription's events in cursor order to the answer it had gives the answer now,
//!   for changes within the log's window (deletes and updates of records older than the window
//!   cannot be routed: see `feed`); `hide` and `show` say which accounts' links to leave out.
//! - Nothing here can slow ingest beyond the feed's own work: no subscriber, replay or hub is
//!   ever waited for.

pub mod entry;
pub mod feed;
pub mod filter;
pub mod frame;
pub mod hub;
pub mod log;
pub mod packed;
pub mod recent;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("change log: {0}")]
    Corrupt(String),
    #[error("the change log no longer holds the events after this cursor")]
    Behind,
}

impl PushError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        PushError::Io { path: path.to_owned(), source }
    }
}

/// What the push path counts, read by the metrics.
#[derive(Debug, Default)]
pub struct PushCounters {
    /// Change-log entries written, and the events in them.
    pub entries: AtomicU64,
    pub events_logged: AtomicU64,
    /// Events the stream sent again (after a resume) and the feed recognised.
    pub replays_skipped: AtomicU64,
    /// Deletes of records the window does not hold (older, or never linking).
    pub unrouted_deletes: AtomicU64,
    /// Recent-links slots that led to no entry of theirs.
    pub bad_lookups: AtomicU64,
    /// Recent-links slots given up for newer ones in a full table (those records left the
    /// window early).
    pub recent_displaced: AtomicU64,
    /// Feed steps that failed (logged; indexing went on).
    pub errors: AtomicU64,
    /// Subscribers connected now.
    pub subscribers: AtomicU64,
    /// Subscriptions refused because `max_subscribers` were connected.
    pub refused: AtomicU64,
    pub events_sent: AtomicU64,
    /// Subscribers cut off, by reason.
    pub cut_too_slow: AtomicU64,
    pub cut_behind: AtomicU64,
    pub cut_error: AtomicU64,
    pub filter_updates: AtomicU64,
}

#[cfg(test)]
mod tests;
