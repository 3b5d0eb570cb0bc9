//! Backfill figures: repositories done and known, records, links and bytes, retries. Rendered as a
//! progress bar on a terminal, as a log line otherwise, and read by `/metrics`.
//!
//! Invariants:
//! - Rates and the ETA are computed from the injected clock's milliseconds, never the wall clock.
//! - A rendering never panics on zero elapsed time or zero totals, and is one line.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared by the backfill's tasks.
#[derive(Debug, Default)]
pub struct BackfillProgress {
    /// Repositories known to repos.db when last counted (all statuses).
    pub repos_known: AtomicU64,
    /// Repositories settled before this run started (not counted in rates).
    pub repos_settled_before: AtomicU64,
    /// Snapshots written by this run.
    pub repos_done: AtomicU64,
    /// Repositories settled otherwise by this run (deactivated, not found, failed, unchanged).
    pub repos_other: AtomicU64,
    pub records: AtomicU64,
    pub links: AtomicU64,
    pub bytes: AtomicU64,
    pub retries: AtomicU64,
    pub rate_limited: AtomicU64,
    pub stale: AtomicU64,
    pub invalid_listed: AtomicU64,
    pub started_ms: AtomicU64,
    /// Snapshots whose commit signature verified with the identity's key.
    pub verified: AtomicU64,
    /// CAR files indexed with their CIDs and structure checked but no key to check the signature.
    pub unverified: AtomicU64,
    /// Repositories rejected by this run, by the check that failed (`CarError::reason`, or
    /// `identity`).
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    /// Times a host's circuit breaker paused it.
    pub host_pauses: AtomicU64,
    /// Listings cut off at a per-host cap.
    pub listings_capped: AtomicU64,
}

fn load(v: &AtomicU64) -> u64 {
    v.load(Ordering::Relaxed)
}

impl BackfillProgress {
    /// One more repository rejected for `reason`.
    pub fn reject(&self, reason: &'static str) {
        *self.rejected.lock().expect("progress lock poisoned").entry(reason).or_default() += 1;
    }

    /// Repositories rejected by this run, by reason.
    pub fn rejected(&self) -> BTreeMap<&'static str, u64> {
        self.rejected.lock().expect("progress lock poisoned").clone()
    }

    /// Repositories finished (any way) out of those known.
    pub fn settled(&self) -> u64 {
        load(&self.repos_settled_before) + load(&self.repos_done) + load(&self.repos_other)
    }

    fn rate(&self, count: u64, now_ms: u64) -> f64 {
        let elapsed_ms = now_ms.saturating_sub(load(&self.started_ms)).max(1);
        count as f64 * 1000.0 / elapsed_ms as f64
    }

    /// `1234/5000 repos (24.7%)  12.3 repos/s  4567 links/s  ETA 5m02s`
    pub fn line(&self, now_ms: u64) -> String {
        let (settled, known) = (self.settled(), load(&self.repos_known).max(self.settled()));
        let this_run = load(&self.repos_done) + load(&self.repos_other);
        let repos_per_s = self.rate(this_run, now_ms);
        let percent = if known == 0 { 100.0 } else { settled as f64 * 100.0 / known as f64 };
        let eta = match known - settled {
            0 => "done".to_string(),
            _ if repos_per_s <= 0.0 => "ETA --".to_string(),
            left => format!("ETA {}", format_duration((left as f64 / repos_per_s) as u64)),
        };
        format!(
            "{settled}/{known} repos ({percent:.1}%)  {repos_per_s:.1} repos/s  {:.0} links/s  {eta}",
            self.rate(load(&self.links), now_ms)
        )
    }

    /// The line behind a bar of `width` cells.
    pub fn bar(&self, now_ms: u64, width: usize) -> String {
        let (settled, known) = (self.settled(), load(&self.repos_known).max(self.settled()));
        let filled = if known == 0 { width } else { (settled as u128 * width as u128 / known as u128) as usize };
        format!("[{}{}] {}", "#".repeat(filled), ".".repeat(width - filled), self.line(now_ms))
    }
}

/// `3h04m`, `5m02s`, `42s`.
pub fn format_duration(seconds: u64) -> String {
    match seconds {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_counts_rates_and_eta() {
        let progress = BackfillProgress::default();
        progress.started_ms.store(1_000, Ordering::Relaxed);
        progress.repos_known.store(100, Ordering::Relaxed);
        progress.repos_settled_before.store(10, Ordering::Relaxed);
        progress.repos_done.store(20, Ordering::Relaxed);
        progress.links.store(5_000, Ordering::Relaxed);
        assert_eq!(progress.line(11_000), "30/100 repos (30.0%)  2.0 repos/s  500 links/s  ETA 35s");
        assert_eq!(progress.bar(11_000, 10), "[###.......] 30/100 repos (30.0%)  2.0 repos/s  500 links/s  ETA 35s");
        assert_eq!(BackfillProgress::default().line(0), "0/0 repos (100.0%)  0.0 repos/s  0 links/s  done");
        assert_eq!(format_duration(3 * 3600 + 4 * 60 + 5), "3h04m");
    }
}
