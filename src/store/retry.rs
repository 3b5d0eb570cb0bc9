//! The one retry policy of object-store requests: at most `max_attempts` attempts, retrying only
//! errors that `StoreError::is_retryable` accepts (5xx, throttling, timeouts, connection failures;
//! never another 4xx), sleeping a full-jitter exponential backoff, capped, whose randomness comes
//! from an injected seed. `S3Store` uses it for every request; `RetryingStore` puts any store
//! behind it (tests wrap a `FaultyStore`).
//!
//! Invariants:
//! - An operation is attempted at most `max_attempts <= MAX_ATTEMPTS` times, and never again after
//!   an error that is not retryable.
//! - Each sleep lies in `0..=min(max_delay, base_delay * 2^retry)`; the same seed and the same
//!   order of draws give the same sleeps.

use super::object::{LocalFile, ObjectInfo, Store, StoreError};
use crate::base::rng::splitmix64;
use bytes::Bytes;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Most attempts a `RetryPolicy` may make for one operation.
pub const MAX_ATTEMPTS: u32 = 20;
/// Longest backoff sleep and longest per-request timeout a configuration may ask for.
pub const MAX_DELAY: Duration = Duration::from_secs(60);

/// How often and how patiently an operation is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included: 1 means never retry.
    pub max_attempts: u32,
    /// Cap of the first backoff; each retry doubles it, up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Seed of the jitter generator (injected: the same seed sleeps the same delays).
    pub seed: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(2),
            seed: 0,
        }
    }
}

impl RetryPolicy {
    pub fn validate(&self) -> Result<(), StoreError> {
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(StoreError::Other(format!("retry max_attempts must be 1..={MAX_ATTEMPTS}")));
        }
        if self.base_delay > self.max_delay || self.max_delay > MAX_DELAY {
            return Err(StoreError::Other(format!("retry delays must satisfy base <= max <= {MAX_DELAY:?}")));
        }
        Ok(())
    }

    /// Upper bound of the sleep before retry number `retry` (0 for the first retry):
    /// `min(max_delay, base_delay * 2^retry)`.
    pub fn backoff_cap(&self, retry: u32) -> Duration {
        let doubled = self.base_delay.saturating_mul(1u32 << retry.min(31));
        doubled.min(self.max_delay)
    }
}

/// A splitmix64 stream shared by concurrent operations: each draw takes the next state, so the
/// sequence of delays depends only on the seed and the order of draws.
#[derive(Debug)]
pub struct Jitter {
    state: AtomicU64,
}

/// The increment splitmix64 adds to its state per draw.
const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Jitter { state: AtomicU64::new(seed) }
    }

    /// A uniformly random duration in `[0, cap]` ("full jitter").
    pub fn delay(&self, cap: Duration) -> Duration {
        let mut state = self.state.fetch_add(SPLITMIX_GAMMA, Ordering::Relaxed);
        let random = splitmix64(&mut state);
        let cap_nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        // Multiply-shift maps the 64 random bits onto 0..=cap without division.
        let nanos = ((random as u128 * (cap_nanos as u128 + 1)) >> 64) as u64;
        assert!(nanos <= cap_nanos);
        Duration::from_nanos(nanos)
    }
}

/// Runs `attempt` until it succeeds, fails with an error that is not retryable, or has been made
/// `policy.max_attempts` times; sleeps a jittered backoff between attempts.
pub async fn with_retries<T, F, Fut>(policy: &RetryPolicy, jitter: &Jitter, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let attempts = policy.max_attempts.clamp(1, MAX_ATTEMPTS);
    let mut retry = 0;
    loop {
        match attempt().await {
            Err(error) if error.is_retryable() && retry + 1 < attempts => {
                let delay = jitter.delay(policy.backoff_cap(retry));
                tracing::debug!(%error, retry, ?delay, "retrying object store request");
                tokio::time::sleep(delay).await;
                retry += 1;
            }
            outcome => return outcome,
        }
    }
}

/// Any store behind the retry policy (tests put it around a `FaultyStore`).
#[derive(Debug)]
pub struct RetryingStore<S: Store> {
    inner: S,
    policy: RetryPolicy,
    jitter: Jitter,
}

impl<S: Store> RetryingStore<S> {
    pub fn new(inner: S, policy: RetryPolicy) -> Result<Self, StoreError> {
        policy.validate()?;
        Ok(RetryingStore { inner, jitter: Jitter::new(policy.seed), policy })
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for RetryingStore<S> {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        with_retries(&self.policy, &self.jitter, || self.inner.put(key, body.clone())).await
    }

    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        with_retries(&self.policy, &self.jitter, || self.inner.put_file(key, file)).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        with_retries(&self.policy, &self.jitter, || self.inner.get(key)).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        with_retries(&self.policy, &self.jitter, || self.inner.get_range(key, offset, len)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        with_retries(&self.policy, &self.jitter, || self.inner.list(prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        with_retries(&self.policy, &self.jitter, || self.inner.delete(key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::dir::DirStore;
    use crate::store::faulty::{Fault, FaultRule, FaultyStore, Operation, Outcome};

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_is_seeded() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(70),
            seed: 7,
        };
        let caps: Vec<u128> = (0..5).map(|retry| policy.backoff_cap(retry).as_millis()).collect();
        assert_eq!(caps, [10, 20, 40, 70, 70]);
        assert_eq!(policy.backoff_cap(1000), Duration::from_millis(70));
        let draws = |seed| {
            let jitter = Jitter::new(seed);
            (0..64).map(|_| jitter.delay(Duration::from_millis(10))).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        assert!(draws(7).iter().all(|d| *d <= Duration::from_millis(10)));
        // Full jitter spreads over the whole interval, not just its top.
        assert!(draws(7).iter().any(|d| *d < Duration::from_millis(3)));
        assert!(draws(7).iter().any(|d| *d > Duration::from_millis(7)));
        assert_eq!(Jitter::new(1).delay(Duration::ZERO), Duration::ZERO);
        assert!(RetryPolicy { max_attempts: 0, ..policy.clone() }.validate().is_err());
        assert!(RetryPolicy { base_delay: Duration::from_secs(1), ..policy }.validate().is_err());
    }

    fn fast_policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy { max_attempts, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(4), seed: 3 }
    }

    fn faulty_dir(dir: &tempfile::TempDir, rules: Vec<FaultRule>) -> FaultyStore<DirStore> {
        FaultyStore::new(DirStore::new(dir.path().to_path_buf()), 11, rules)
    }

    #[tokio::test]
    async fn retries_transient_errors_up_to_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let always = FaultRule::new(Fault::Error).operations(&[Operation::Get]);
        let store = RetryingStore::new(faulty_dir(&dir, vec![always]), fast_policy(4)).unwrap();
        store.put("k", Bytes::from_static(b"v")).await.unwrap();
        let error = store.get("k").await.unwrap_err();
        assert!(error.is_retryable(), "{error}");
        let gets = store.inner().log().iter().filter(|r| r.operation == Operation::Get).count();
        assert_eq!(gets, 4, "exactly max_attempts attempts");
    }

    #[tokio::test]
    async fn retries_until_success_and_never_retries_permanent_errors() {
        let dir = tempfile::tempdir().unwrap();
        let flaky = FaultRule::new(Fault::Error).operations(&[Operation::Get]).probability(0.5);
        let store = RetryingStore::new(faulty_dir(&dir, vec![flaky]), fast_policy(20)).unwrap();
        store.put("k", Bytes::from_static(b"v")).await.unwrap();
        for _ in 0..20 {
            assert_eq!(store.get("k").await.unwrap(), Bytes::from_static(b"v"));
        }
        let log = store.inner().log();
        let injected = log.iter().filter(|r| matches!(r.outcome, Outcome::Injected(_))).count();
        assert!(injected > 0, "the flaky rule fired");
        assert_eq!(log.iter().filter(|r| r.operation == Operation::Get).count(), 20 + injected);
    }

    #[tokio::test]
    async fn permanent_errors_are_tried_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = RetryingStore::new(faulty_dir(&dir, vec![]), fast_policy(5)).unwrap();
        store.put("k", Bytes::from_static(b"v")).await.unwrap();
        assert!(matches!(store.get("missing").await, Err(StoreError::NotFound { .. })));
        assert!(matches!(store.get_range("k", 0, 9).await, Err(StoreError::ShortRead { .. })));
        assert!(matches!(store.get("../k").await, Err(StoreError::InvalidKey { .. })));
        assert_eq!(store.inner().log().len(), 4, "one put and one attempt per failing call");
    }
}
