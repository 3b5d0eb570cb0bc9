//! Per-host bounds beyond pacing (`limiter`): how many fetches one host may have in flight, and a
//! circuit breaker that pauses a host that keeps failing, so one bad host costs a few slots for a
//! while, not the whole backfill.
//!
//! Invariants:
//! - At most `slots_per_host` fetches from one host hold a slot at once; a slot is released when
//!   its guard drops, whatever happened.
//! - `trip_after` failures in a row (transport errors, timeouts, too-slow bodies, 5xx, malformed
//!   answers, forgeries) pause the host, for `pause` the first time and twice as long each time
//!   after; a success resets the count. While paused, `slot` refuses at once (the caller
//!   postpones the work to when the pause ends). After `give_up_after` pauses the host is given
//!   up for the rest of the process: `slot` refuses with no end, and its work is recorded failed.
//! - The table is bounded (`MAX_HOSTS`): idle, healthy hosts are forgotten first.
//! - Time is tokio's clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Hosts tracked at once.
pub const MAX_HOSTS: usize = 100_000;

#[derive(Debug)]
struct HostState {
    slots: Arc<Semaphore>,
    failures_in_a_row: u32,
    paused_until: Option<Instant>,
    /// Times the breaker tripped (reported; the pause doubles with each).
    trips: u32,
    last_error: String,
}

/// A host's fetch slot; dropping it frees the slot.
#[derive(Debug)]
pub struct HostSlot {
    _permit: OwnedSemaphorePermit,
}

/// A host the breaker paused, for reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PausedHost {
    pub host: String,
    pub trips: u32,
    pub seconds_left: u64,
    pub given_up: bool,
    pub last_error: String,
}

/// How a host's breaker is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerOptions {
    /// Fetches from one host at once.
    pub slots_per_host: usize,
    /// Failures in a row that pause a host.
    pub trip_after: u32,
    /// The first pause (each later one is twice the one before).
    pub pause: Duration,
    /// Pauses after which the host is given up for the rest of the process.
    pub give_up_after: u32,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        BreakerOptions { slots_per_host: 4, trip_after: 10, pause: Duration::from_secs(300), give_up_after: 4 }
    }
}

#[derive(Debug)]
pub struct HostGuard {
    options: BreakerOptions,
    hosts: Mutex<HashMap<String, HostState>>,
}

impl HostGuard {
    pub fn new(options: BreakerOptions) -> Self {
        let options = BreakerOptions {
            slots_per_host: options.slots_per_host.max(1),
            trip_after: options.trip_after.max(1),
            give_up_after: options.give_up_after.max(1),
            ..options
        };
        HostGuard { options, hosts: Mutex::default() }
    }

    /// Waits for a fetch slot on `host`; at once `Err(Some(until))` while the host is paused,
    /// `Err(None)` once it is given up.
    pub async fn slot(&self, host: &str) -> Result<HostSlot, Option<Instant>> {
        let slots = {
            let mut hosts = self.lock();
            if hosts.len() >= MAX_HOSTS && !hosts.contains_key(host) {
                forget_idle(&mut hosts, self.options.slots_per_host);
            }
            let state = hosts.entry(host.to_string()).or_insert_with(|| HostState {
                slots: Arc::new(Semaphore::new(self.options.slots_per_host)),
                failures_in_a_row: 0,
                paused_until: None,
                trips: 0,
                last_error: String::new(),
            });
            if state.trips >= self.options.give_up_after {
                return Err(None);
            }
            if let Some(until) = state.paused_until.filter(|until| *until > Instant::now()) {
                return Err(Some(until));
            }
            state.slots.clone()
        };
        let permit = slots.acquire_owned().await.expect("host slots are never closed");
        Ok(HostSlot { _permit: permit })
    }

    /// The host answered as it should.
    pub fn succeeded(&self, host: &str) {
        if let Some(state) = self.lock().get_mut(host) {
            state.failures_in_a_row = 0;
        }
    }

    /// The host failed; returns true when this failure paused it.
    pub fn failed(&self, host: &str, error: &str) -> bool {
        let mut hosts = self.lock();
        let Some(state) = hosts.get_mut(host) else { return false };
        state.failures_in_a_row += 1;
        state.last_error = error.chars().take(200).collect();
        if state.failures_in_a_row < self.options.trip_after {
            return false;
        }
        state.failures_in_a_row = 0;
        state.trips += 1;
        let pause = self.options.pause.saturating_mul(1 << (state.trips - 1).min(16));
        state.paused_until = Some(Instant::now() + pause);
        let given_up = state.trips >= self.options.give_up_after;
        tracing::warn!(
            host,
            trips = state.trips,
            pause_secs = pause.as_secs(),
            given_up,
            error,
            "host paused: it keeps failing"
        );
        true
    }

    /// The hosts paused now or given up (`seconds_left` 0).
    pub fn paused(&self) -> Vec<PausedHost> {
        let now = Instant::now();
        let mut paused: Vec<PausedHost> = self
            .lock()
            .iter()
            .filter_map(|(host, state)| {
                let given_up = state.trips >= self.options.give_up_after;
                let until = state.paused_until.filter(|until| *until > now || given_up)?;
                Some(PausedHost {
                    host: host.clone(),
                    trips: state.trips,
                    seconds_left: until.saturating_duration_since(now).as_secs(),
                    given_up,
                    last_error: state.last_error.clone(),
                })
            })
            .collect();
        paused.sort_by(|a, b| a.host.cmp(&b.host));
        paused
    }

    /// Hosts the breaker ever tripped on, with how often.
    #[cfg(test)]
    pub fn tripped(&self) -> Vec<(String, u32)> {
        let mut tripped: Vec<(String, u32)> =
            self.lock().iter().filter(|(_, s)| s.trips > 0).map(|(h, s)| (h.clone(), s.trips)).collect();
        tripped.sort();
        tripped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HostState>> {
        self.hosts.lock().expect("host guard lock poisoned")
    }
}

/// Forgets hosts with nothing in flight and nothing to remember (rare: only past `MAX_HOSTS`).
fn forget_idle(hosts: &mut HashMap<String, HostState>, slots_per_host: usize) {
    let now = Instant::now();
    hosts.retain(|_, state| {
        let busy = state.slots.available_permits() < slots_per_host;
        busy || state.paused_until.is_some_and(|until| until > now) || state.failures_in_a_row > 0
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(slots_per_host: usize, trip_after: u32) -> HostGuard {
        HostGuard::new(BreakerOptions { slots_per_host, trip_after, pause: Duration::from_secs(60), give_up_after: 2 })
    }

    #[tokio::test]
    async fn a_host_has_a_bounded_number_of_slots() {
        let guard = guard(2, 3);
        let first = guard.slot("a").await.unwrap();
        let _second = guard.slot("a").await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(50), guard.slot("a")).await;
        assert!(third.is_err(), "a third fetch waits for a slot");
        let _other = guard.slot("b").await.unwrap();
        drop(first);
        let third = tokio::time::timeout(Duration::from_millis(50), guard.slot("a")).await;
        assert!(third.is_ok(), "a freed slot is taken");
    }

    #[tokio::test]
    async fn failures_in_a_row_pause_a_host_and_a_success_resets_the_count() {
        let guard = guard(2, 3);
        drop(guard.slot("a").await.unwrap());
        assert!(!guard.failed("a", "timeout"));
        assert!(!guard.failed("a", "timeout"));
        guard.succeeded("a");
        assert!(!guard.failed("a", "timeout"));
        assert!(!guard.failed("a", "timeout"));
        assert!(guard.failed("a", "HTTP 502"), "three in a row");
        assert!(guard.slot("a").await.is_err(), "paused");
        assert!(guard.slot("b").await.is_ok(), "other hosts are not");
        let paused = guard.paused();
        assert_eq!(paused.len(), 1);
        assert_eq!((paused[0].host.as_str(), paused[0].trips, paused[0].last_error.as_str()), ("a", 1, "HTTP 502"));
        assert_eq!(guard.tripped(), vec![("a".to_string(), 1)]);
    }

    #[tokio::test]
    async fn pauses_end_double_and_run_out() {
        let pause = Duration::from_millis(40);
        let guard = HostGuard::new(BreakerOptions { slots_per_host: 1, trip_after: 1, pause, give_up_after: 2 });
        drop(guard.slot("a").await.unwrap());
        guard.failed("a", "x");
        assert!(matches!(guard.slot("a").await, Err(Some(_))));
        tokio::time::sleep(pause + Duration::from_millis(10)).await;
        assert!(guard.slot("a").await.is_ok(), "the pause ended");
        assert!(guard.paused().is_empty());
        let failed_at = Instant::now();
        guard.failed("a", "x");
        let until = guard.lock()["a"].paused_until.unwrap();
        assert!(until - failed_at >= 2 * pause, "the second pause is twice the first");
        assert!(matches!(guard.slot("a").await, Err(None)), "given up after two pauses");
        tokio::time::sleep(3 * pause).await;
        assert!(matches!(guard.slot("a").await, Err(None)), "for good");
        assert!(guard.paused()[0].given_up);
    }
}
