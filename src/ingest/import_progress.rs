//! How far an import has come: events applied and flushes, counted by the import as it goes, and
//! shown by the command as a line on a terminal (a pipe's length is unknown, so no bar), or a log
//! line every so often otherwise, beside what the writer has yet to do (runs waiting to merge,
//! bytes not yet uploaded).
//!
//! Invariants:
//! - Rates are computed from the injected clock's milliseconds; a rendering never divides by
//!   zero and is one line.

use super::backfill::progress::format_duration;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct ImportProgress {
    pub events: AtomicU64,
    pub flushes: AtomicU64,
    pub started_ms: AtomicU64,
}

/// What the writer side has yet to do, for the line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Runs in every tree (merges bring them down to a few per size tier).
    pub runs: usize,
    /// Bytes of tables not yet uploaded.
    pub unuploaded_bytes: u64,
}

impl ImportProgress {
    pub fn new(now_ms: u64) -> Self {
        ImportProgress { started_ms: AtomicU64::new(now_ms), ..ImportProgress::default() }
    }

    /// Events so far and milliseconds since the start (for log lines a script reads).
    pub fn figures(&self, now_ms: u64) -> (u64, u64) {
        (self.events.load(Ordering::Relaxed), now_ms.saturating_sub(self.started_ms.load(Ordering::Relaxed)))
    }

    /// `1234567 events in 1m02s (19912 events/s), 12 flushes, 9 runs, 48.0 MiB not uploaded`
    pub fn line(&self, now_ms: u64, backlog: Backlog) -> String {
        let events = self.events.load(Ordering::Relaxed);
        let elapsed_ms = now_ms.saturating_sub(self.started_ms.load(Ordering::Relaxed));
        let rate = events as f64 * 1_000.0 / elapsed_ms.max(1) as f64;
        format!(
            "{events} events in {} ({rate:.0} events/s), {} flushes, {} runs, {:.1} MiB not uploaded",
            format_duration(elapsed_ms / 1_000),
            self.flushes.load(Ordering::Relaxed),
            backlog.runs,
            backlog.unuploaded_bytes as f64 / (1 << 20) as f64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_counts_rates_and_the_backlog() {
        let progress = ImportProgress::new(1_000);
        progress.events.store(123_000, Ordering::Relaxed);
        progress.flushes.store(4, Ordering::Relaxed);
        let backlog = Backlog { runs: 9, unuploaded_bytes: 48 << 20 };
        assert_eq!(
            progress.line(62_000, backlog),
            "123000 events in 1m01s (2016 events/s), 4 flushes, 9 runs, 48.0 MiB not uploaded"
        );
        assert!(ImportProgress::new(5).line(5, Backlog::default()).starts_with("0 events in 0s (0 events/s)"));
    }
}
