//! Per-host request pacing: at most `per_second` requests started per host, with a small burst,
//! and a pause when a host says `429 Retry-After`.
//!
//! Invariants:
//! - Requests to one host start at least `1 / per_second` apart once the burst is spent; a paused
//!   host starts nothing before its pause ends.
//! - The table of hosts is bounded (`MAX_HOSTS`): when full, hosts idle the longest are forgotten
//!   (a forgotten host starts again with a full burst, which is harmless).
//! - Time is tokio's clock; the booking itself is a function of the `now` it is given.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Hosts tracked at once.
pub const MAX_HOSTS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct HostPace {
    /// The earliest time the next request may start.
    next_start: Instant,
    last_used: Instant,
}

#[derive(Debug)]
pub struct HostLimiter {
    interval: Duration,
    burst: u32,
    hosts: Mutex<HashMap<String, HostPace>>,
}

impl HostLimiter {
    /// `per_second` requests per host (at least one per minute), `burst` of them back to back.
    pub fn new(per_second: f64, burst: u32) -> Self {
        let per_second = per_second.clamp(1.0 / 60.0, 1_000_000.0);
        HostLimiter {
            interval: Duration::from_secs_f64(1.0 / per_second),
            burst: burst.max(1),
            hosts: Mutex::default(),
        }
    }

    /// Waits until a request to `host` may start, and books it.
    pub async fn acquire(&self, host: &str) {
        let start = self.book(host, Instant::now());
        tokio::time::sleep_until(start).await;
    }

    /// Books the next slot of `host` at or after `now`; returns when it starts.
    fn book(&self, host: &str, now: Instant) -> Instant {
        let mut hosts = self.hosts.lock().expect("limiter lock poisoned");
        if hosts.len() >= MAX_HOSTS && !hosts.contains_key(host) {
            forget_idlest(&mut hosts);
        }
        // A host idle for a while earns its burst back: its slot may lie that far in the past.
        let earliest = now.checked_sub(self.interval * (self.burst - 1)).unwrap_or(now);
        let pace = hosts.entry(host.to_string()).or_insert(HostPace { next_start: earliest, last_used: now });
        let start = pace.next_start.max(earliest);
        pace.next_start = start + self.interval;
        pace.last_used = now;
        start.max(now)
    }

    /// `host` asked us to wait: nothing starts there before `now + wait`.
    pub fn pause(&self, host: &str, wait: Duration) {
        self.pause_at(host, Instant::now(), wait);
    }

    fn pause_at(&self, host: &str, now: Instant, wait: Duration) {
        let mut hosts = self.hosts.lock().expect("limiter lock poisoned");
        let pace = hosts.entry(host.to_string()).or_insert(HostPace { next_start: now, last_used: now });
        pace.next_start = pace.next_start.max(now + wait);
    }
}

fn forget_idlest(hosts: &mut HashMap<String, HostPace>) {
    // Rare (only past MAX_HOSTS hosts): drop the idlest tenth in one pass.
    let mut by_age: Vec<(Instant, String)> = hosts.iter().map(|(h, p)| (p.last_used, h.clone())).collect();
    by_age.sort();
    for (_, host) in by_age.into_iter().take(MAX_HOSTS / 10) {
        hosts.remove(&host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis_after(t0: Instant, t: Instant) -> u128 {
        (t - t0).as_millis()
    }

    #[test]
    fn requests_to_one_host_are_spaced_after_the_burst() {
        let limiter = HostLimiter::new(10.0, 2);
        let t0 = Instant::now();
        let starts: Vec<u128> = (0..5).map(|_| millis_after(t0, limiter.book("a", t0))).collect();
        assert_eq!(starts, vec![0, 0, 100, 200, 300]);
        // Another host is not held up by the first.
        assert_eq!(limiter.book("b", t0), t0);
        // A host idle long enough has its burst back.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(limiter.book("a", later), later);
        assert_eq!(limiter.book("a", later), later);
        assert_eq!(millis_after(later, limiter.book("a", later)), 100);
    }

    #[test]
    fn a_pause_delays_the_next_request() {
        let limiter = HostLimiter::new(100.0, 1);
        let t0 = Instant::now();
        assert_eq!(limiter.book("a", t0), t0);
        limiter.pause_at("a", t0, Duration::from_secs(7));
        assert_eq!(millis_after(t0, limiter.book("a", t0)), 7_000);
    }

    #[test]
    fn the_host_table_is_bounded() {
        let limiter = HostLimiter::new(1.0, 1);
        let t0 = Instant::now();
        for i in 0..=MAX_HOSTS {
            limiter.book(&format!("h{i}"), t0 + Duration::from_nanos(i as u64));
        }
        let hosts = limiter.hosts.lock().unwrap();
        assert!(hosts.len() <= MAX_HOSTS);
        assert!(hosts.contains_key(&format!("h{MAX_HOSTS}")), "the newest host is kept");
        assert!(!hosts.contains_key("h0"), "the idlest host is forgotten");
    }
}
