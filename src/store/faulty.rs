//! `FaultyStore`: a store wrapper for tests that injects seeded, replayable faults (errors,
//! latency, truncated bodies, dropped connections, a crash after N puts) and logs every request.
//!
//! Invariants:
//! - Determinism: rule `i` decides its `n`-th matching call from `xxh3(seed, i, n)` alone, so a
//!   failing seed replays exactly, whatever other calls interleave. Any random amount (a latency, a
//!   truncation length) comes from the same hash.
//! - Injected failures are retryable `Io` errors (what a flaky network gives), except a truncated
//!   body, which surfaces as `ShortRead`, exactly as a real store reports a short body.
//! - `DropBefore` and `Error` never reach the wrapped store; `DropAfter` always does (the effect
//!   happened, the answer was lost). After a crash, no call reaches the wrapped store.
//! - Every call is logged, even one whose future is dropped (`Outcome::Cancelled`); the log holds at
//!   most `MAX_LOG_RECORDS` records and counts what it had to drop.
//! - No lock is held across an `.await`.

use super::object::{LocalFile, ObjectInfo, Store, StoreError};
use crate::base::rng::splitmix64;
use bytes::Bytes;
use std::future::Future;
use std::io::ErrorKind;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Most records the request log keeps; later calls are counted in `dropped_records` only.
pub const MAX_LOG_RECORDS: usize = 1 << 20;
/// Most rules one store takes.
pub const MAX_RULES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Put,
    Get,
    GetRange,
    List,
    Delete,
}

/// What a rule does to a call it fires on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The store answers with a transient error (a 503, say); nothing happens.
    Error,
    /// The call waits `min..=max` (uniform, seeded; fixed when equal) before it is made.
    Latency { min: Duration, max: Duration },
    /// A `get`/`get_range` receives fewer bytes than the object has: `ShortRead`.
    TruncatedBody,
    /// The connection drops before the request is sent: nothing happens.
    DropBefore,
    /// The connection drops after the store did the work: it happened, but the caller sees an error.
    DropAfter,
    /// After this many matching puts succeed, the store is gone: every later call fails.
    /// Deterministic: the rule's probability does not apply.
    CrashAfterPuts(u64),
}

/// A fault, the calls it applies to, and how often it fires.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub fault: Fault,
    /// Operations it applies to; empty means all.
    pub operations: Vec<Operation>,
    /// Keys (or list prefixes) it applies to: those that start with this.
    pub key_prefix: String,
    /// Chance that a matching call fires, in `0.0..=1.0`.
    pub probability: f64,
}

impl FaultRule {
    /// A rule that fires on every call.
    pub fn new(fault: Fault) -> Self {
        FaultRule { fault, operations: Vec::new(), key_prefix: String::new(), probability: 1.0 }
    }

    pub fn operations(mut self, operations: &[Operation]) -> Self {
        self.operations = operations.to_vec();
        self
    }

    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.key_prefix = prefix.to_owned();
        self
    }

    pub fn probability(mut self, probability: f64) -> Self {
        self.probability = probability;
        self
    }

    fn matches(&self, operation: Operation, key: &str) -> bool {
        let applicable = match self.fault {
            Fault::TruncatedBody => matches!(operation, Operation::Get | Operation::GetRange),
            _ => true,
        };
        applicable
            && (self.operations.is_empty() || self.operations.contains(&operation))
            && key.starts_with(&self.key_prefix)
    }
}

/// A failure the store made up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    Error,
    TruncatedBody,
    DropBefore,
    DropAfter,
    Crashed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The wrapped store failed (not injected).
    Failed(String),
    Injected(InjectedFault),
    /// The caller dropped the call before it finished.
    Cancelled,
}

/// One logged call. Times are since the store was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub operation: Operation,
    /// The key, or the prefix of a `list`.
    pub key: String,
    /// `(offset, len)` of a `get_range`.
    pub range: Option<(u64, u64)>,
    pub start: Duration,
    pub end: Duration,
    /// Latency the store added.
    pub delay: Duration,
    pub outcome: Outcome,
}

/// What the rules decided for one call, before it is made.
#[derive(Debug, Default)]
struct Decision {
    crashed: bool,
    delay: Duration,
    /// The first failure that fired (`Error`, `DropBefore` or `DropAfter`), if any.
    failure: Option<InjectedFault>,
    /// Random bits for a truncation, when a `TruncatedBody` rule fired.
    truncate: Option<u64>,
}

#[derive(Debug)]
struct State {
    /// Per rule: calls it matched so far (its `n`).
    matched: Vec<u64>,
    /// Per rule: matching puts that succeeded (for `CrashAfterPuts`).
    puts: Vec<u64>,
    log: Vec<RequestRecord>,
    dropped_records: u64,
}

/// Wraps `S`, injecting the faults its rules describe.
#[derive(Debug)]
pub struct FaultyStore<S: Store> {
    inner: S,
    seed: u64,
    rules: Vec<FaultRule>,
    origin: Instant,
    state: Mutex<State>,
}

impl<S: Store> FaultyStore<S> {
    /// `rules` beyond `MAX_RULES` are ignored; probabilities are clamped to `0.0..=1.0`.
    pub fn new(inner: S, seed: u64, mut rules: Vec<FaultRule>) -> Self {
        rules.truncate(MAX_RULES);
        for rule in &mut rules {
            rule.probability = if rule.probability.is_nan() { 0.0 } else { rule.probability.clamp(0.0, 1.0) };
        }
        let state =
            State { matched: vec![0; rules.len()], puts: vec![0; rules.len()], log: Vec::new(), dropped_records: 0 };
        FaultyStore { inner, seed, rules, origin: Instant::now(), state: Mutex::new(state) }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Every call so far, in the order they finished.
    pub fn log(&self) -> Vec<RequestRecord> {
        self.lock().log.clone()
    }

    pub fn clear_log(&self) {
        self.lock().log.clear();
    }

    /// Calls not logged because the log was full.
    pub fn dropped_records(&self) -> u64 {
        self.lock().dropped_records
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the log from the others.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// 64 random bits for the `n`-th matching call of rule `rule`.
    fn draw(&self, rule: usize, n: u64) -> u64 {
        let mut input = [0u8; 16];
        input[..8].copy_from_slice(&(rule as u64).to_le_bytes());
        input[8..].copy_from_slice(&n.to_le_bytes());
        xxh3_64_with_seed(&input, self.seed)
    }

    fn decide(&self, operation: Operation, key: &str) -> Decision {
        let mut state = self.lock();
        let mut decision = Decision { crashed: self.crashed(&state), ..Decision::default() };
        for (index, rule) in self.rules.iter().enumerate() {
            if !rule.matches(operation, key) || matches!(rule.fault, Fault::CrashAfterPuts(_)) {
                continue;
            }
            let n = state.matched[index];
            state.matched[index] += 1;
            let bits = self.draw(index, n);
            if unit_interval(bits) >= rule.probability {
                continue;
            }
            // A second draw from the same bits sizes the fault, independent of the decision.
            let mut amount_state = bits;
            let amount = splitmix64(&mut amount_state);
            match &rule.fault {
                Fault::Latency { min, max } => decision.delay += pick_delay(*min, *max, amount),
                Fault::TruncatedBody => decision.truncate = decision.truncate.or(Some(amount)),
                Fault::Error => decision.failure = decision.failure.or(Some(InjectedFault::Error)),
                Fault::DropBefore => decision.failure = decision.failure.or(Some(InjectedFault::DropBefore)),
                Fault::DropAfter => decision.failure = decision.failure.or(Some(InjectedFault::DropAfter)),
                // Counted by `count_put` instead (skipped above).
                Fault::CrashAfterPuts(_) => {}
            }
        }
        decision
    }

    fn crashed(&self, state: &State) -> bool {
        self.rules
            .iter()
            .zip(&state.puts)
            .any(|(rule, &puts)| matches!(rule.fault, Fault::CrashAfterPuts(n) if puts >= n))
    }

    fn count_put(&self, key: &str) {
        let mut state = self.lock();
        for (index, rule) in self.rules.iter().enumerate() {
            if matches!(rule.fault, Fault::CrashAfterPuts(_)) && rule.matches(Operation::Put, key) {
                state.puts[index] += 1;
            }
        }
    }

    fn record(&self, record: RequestRecord) {
        let mut state = self.lock();
        if state.log.len() < MAX_LOG_RECORDS {
            state.log.push(record);
        } else {
            state.dropped_records += 1;
        }
    }

    /// Runs one call through the rules. `call` is the wrapped store's future (not yet polled);
    /// `truncate` turns a successful result into the `ShortRead` a cut body would give.
    async fn intercept<T>(
        &self,
        operation: Operation,
        key: &str,
        range: Option<(u64, u64)>,
        call: impl Future<Output = Result<T, StoreError>>,
        truncate: impl FnOnce(&T, u64) -> Option<StoreError>,
    ) -> Result<T, StoreError> {
        let mut guard = CallGuard::new(self, operation, key, range);
        let decision = self.decide(operation, key);
        let (result, outcome) = self.perform(operation, key, decision, &mut guard, call, truncate).await;
        guard.finish(outcome);
        result
    }

    async fn perform<T>(
        &self,
        operation: Operation,
        key: &str,
        decision: Decision,
        guard: &mut CallGuard<'_, S>,
        call: impl Future<Output = Result<T, StoreError>>,
        truncate: impl FnOnce(&T, u64) -> Option<StoreError>,
    ) -> (Result<T, StoreError>, Outcome) {
        let injected = |fault| (Err(injected_error(key, fault)), Outcome::Injected(fault));
        if decision.crashed {
            return injected(InjectedFault::Crashed);
        }
        guard.delay = decision.delay;
        if !decision.delay.is_zero() {
            tokio::time::sleep(decision.delay).await;
        }
        if let Some(fault @ (InjectedFault::Error | InjectedFault::DropBefore)) = decision.failure {
            return injected(fault);
        }
        let result = call.await;
        if operation == Operation::Put && result.is_ok() {
            self.count_put(key);
        }
        if decision.failure == Some(InjectedFault::DropAfter) {
            return injected(InjectedFault::DropAfter);
        }
        match result {
            Ok(value) => match decision.truncate.and_then(|bits| truncate(&value, bits)) {
                Some(short) => (Err(short), Outcome::Injected(InjectedFault::TruncatedBody)),
                None => (Ok(value), Outcome::Ok),
            },
            Err(error) => {
                let message = error.to_string();
                (Err(error), Outcome::Failed(message))
            }
        }
    }
}

/// Logs its call when dropped: with the outcome if it finished, as `Cancelled` otherwise.
struct CallGuard<'a, S: Store> {
    store: &'a FaultyStore<S>,
    operation: Operation,
    key: String,
    range: Option<(u64, u64)>,
    start: Duration,
    delay: Duration,
    outcome: Option<Outcome>,
}

impl<'a, S: Store> CallGuard<'a, S> {
    fn new(store: &'a FaultyStore<S>, operation: Operation, key: &str, range: Option<(u64, u64)>) -> Self {
        let start = store.origin.elapsed();
        CallGuard { store, operation, key: key.to_owned(), range, start, delay: Duration::ZERO, outcome: None }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }
}

impl<S: Store> Drop for CallGuard<'_, S> {
    fn drop(&mut self) {
        let record = RequestRecord {
            operation: self.operation,
            key: std::mem::take(&mut self.key),
            range: self.range,
            start: self.start,
            end: self.store.origin.elapsed(),
            delay: self.delay,
            outcome: self.outcome.take().unwrap_or(Outcome::Cancelled),
        };
        self.store.record(record);
    }
}

fn injected_error(key: &str, fault: InjectedFault) -> StoreError {
    let (kind, message) = match fault {
        InjectedFault::Error => (ErrorKind::Interrupted, "injected: server error"),
        InjectedFault::DropBefore => (ErrorKind::ConnectionReset, "injected: connection dropped before the request"),
        InjectedFault::DropAfter => (ErrorKind::ConnectionReset, "injected: connection dropped after the request"),
        InjectedFault::Crashed => (ErrorKind::ConnectionRefused, "injected: the store crashed"),
        InjectedFault::TruncatedBody => (ErrorKind::UnexpectedEof, "injected: truncated body"),
    };
    StoreError::io(key, std::io::Error::new(kind, message))
}

/// Maps 64 random bits to `[0, 1)`.
fn unit_interval(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A duration in `min..=max` from 64 random bits (`min` when `max <= min`).
fn pick_delay(min: Duration, max: Duration, bits: u64) -> Duration {
    let span = u64::try_from(max.saturating_sub(min).as_nanos()).unwrap_or(u64::MAX);
    let offset = ((bits as u128 * (span as u128 + 1)) >> 64) as u64;
    assert!(offset <= span);
    min + Duration::from_nanos(offset)
}

/// A `ShortRead` of `expected` bytes that kept fewer than `available` (random, seeded); `None`
/// for an empty body, which cannot be cut.
fn short_read(key: &str, expected: u64, available: u64, bits: u64) -> Option<StoreError> {
    if available == 0 {
        return None;
    }
    let got = ((bits as u128 * available as u128) >> 64) as u64;
    assert!(got < available);
    Some(StoreError::ShortRead { key: key.to_owned(), expected, got })
}

#[async_trait::async_trait]
impl<S: Store> Store for FaultyStore<S> {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        self.intercept(Operation::Put, key, None, self.inner.put(key, body), |_, _| None).await
    }

    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        self.intercept(Operation::Put, key, None, self.inner.put_file(key, file), |_, _| None).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let cut = |body: &Bytes, bits| short_read(key, body.len() as u64, body.len() as u64, bits);
        self.intercept(Operation::Get, key, None, self.inner.get(key), cut).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let cut = |body: &Bytes, bits| short_read(key, len, body.len() as u64, bits);
        self.intercept(Operation::GetRange, key, Some((offset, len)), self.inner.get_range(key, offset, len), cut).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.intercept(Operation::List, prefix, None, self.inner.list(prefix), |_, _| None).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.intercept(Operation::Delete, key, None, self.inner.delete(key), |_, _| None).await
    }
}

/// How many serially dependent rounds the logged requests took. A round is a set of requests
/// each of which started before any request of the round had finished: a request that starts
/// after one of them ended may have waited for it, so it opens the next round.
pub fn serial_rounds(log: &[RequestRecord]) -> usize {
    let mut intervals: Vec<(Duration, Duration)> = log.iter().map(|r| (r.start, r.end)).collect();
    intervals.sort_unstable();
    let mut rounds = 0;
    let mut first_end: Option<Duration> = None;
    for (start, end) in intervals {
        match first_end {
            Some(earliest) if start < earliest => first_end = Some(earliest.min(end)),
            _ => {
                rounds += 1;
                first_end = Some(end);
            }
        }
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::dir::DirStore;

    fn faulty(dir: &tempfile::TempDir, seed: u64, rules: Vec<FaultRule>) -> FaultyStore<DirStore> {
        FaultyStore::new(DirStore::new(dir.path().to_path_buf()), seed, rules)
    }

    fn io_kind<T: std::fmt::Debug>(result: Result<T, StoreError>) -> ErrorKind {
        match result {
            Err(StoreError::Io { source, .. }) => source.kind(),
            other => panic!("expected an io error, got {other:?}"),
        }
    }

    fn outcomes(store: &FaultyStore<DirStore>) -> Vec<Outcome> {
        store.log().into_iter().map(|r| r.outcome).collect()
    }

    #[tokio::test]
    async fn error_fault_fails_retryably_and_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = faulty(&dir, 1, vec![FaultRule::new(Fault::Error)]);
        let error = store.put("k", Bytes::from_static(b"v")).await.unwrap_err();
        assert!(error.is_retryable());
        assert_eq!(io_kind::<()>(Err(error)), ErrorKind::Interrupted);
        assert!(matches!(store.inner().get("k").await, Err(StoreError::NotFound { .. })));
        assert_eq!(outcomes(&store), [Outcome::Injected(InjectedFault::Error)]);
    }

    #[tokio::test]
    async fn dropped_connections_before_and_after_the_put() {
        let dir = tempfile::tempdir().unwrap();
        let rules = vec![
            FaultRule::new(Fault::DropBefore).key_prefix("before/"),
            FaultRule::new(Fault::DropAfter).key_prefix("after/"),
        ];
        let store = faulty(&dir, 2, rules);
        assert_eq!(io_kind(store.put("before/x", Bytes::from_static(b"1")).await), ErrorKind::ConnectionReset);
        assert_eq!(io_kind(store.put("after/x", Bytes::from_static(b"2")).await), ErrorKind::ConnectionReset);
        assert!(matches!(store.inner().get("before/x").await, Err(StoreError::NotFound { .. })));
        assert_eq!(store.inner().get("after/x").await.unwrap(), Bytes::from_static(b"2"), "the put happened");
        assert_eq!(
            outcomes(&store),
            [Outcome::Injected(InjectedFault::DropBefore), Outcome::Injected(InjectedFault::DropAfter)]
        );
    }

    #[tokio::test]
    async fn truncated_bodies_are_short_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = faulty(&dir, 3, vec![FaultRule::new(Fault::TruncatedBody)]);
        store.put("obj", Bytes::from(vec![7u8; 1000])).await.unwrap();
        store.put("empty", Bytes::new()).await.unwrap();
        match store.get("obj").await {
            Err(StoreError::ShortRead { expected: 1000, got, .. }) => assert!(got < 1000),
            other => panic!("{other:?}"),
        }
        match store.get_range("obj", 100, 50).await {
            Err(StoreError::ShortRead { expected: 50, got, .. }) => assert!(got < 50),
            other => panic!("{other:?}"),
        }
        // An empty body cannot be cut; a put is never truncated.
        assert_eq!(store.get("empty").await.unwrap(), Bytes::new());
        let log = store.log();
        assert_eq!(log[3].range, Some((100, 50)));
        assert_eq!(log.iter().filter(|r| r.outcome == Outcome::Injected(InjectedFault::TruncatedBody)).count(), 2);
    }

    #[tokio::test]
    async fn latency_is_fixed_or_seeded_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let fixed = Duration::from_millis(30);
        let store = faulty(&dir, 4, vec![FaultRule::new(Fault::Latency { min: fixed, max: fixed })]);
        let started = std::time::Instant::now();
        store.put("k", Bytes::from_static(b"v")).await.unwrap();
        assert!(started.elapsed() >= fixed);
        let record = &store.log()[0];
        assert_eq!((record.delay, record.outcome.clone()), (fixed, Outcome::Ok));
        assert!(record.end - record.start >= fixed);

        let (min, max) = (Duration::from_micros(10), Duration::from_micros(900));
        let delays = |seed| async move {
            let dir = tempfile::tempdir().unwrap();
            let store =
                faulty(&dir, seed, vec![FaultRule::new(Fault::Latency { min, max }).operations(&[Operation::List])]);
            for _ in 0..40 {
                store.list("").await.unwrap();
            }
            store.log().into_iter().map(|r| r.delay).collect::<Vec<_>>()
        };
        let first = delays(5).await;
        assert_eq!(first, delays(5).await);
        assert_ne!(first, delays(6).await);
        assert!(first.iter().all(|d| (min..=max).contains(d)));
        assert!(
            first.iter().any(|d| *d < Duration::from_micros(300))
                && first.iter().any(|d| *d > Duration::from_micros(600))
        );
    }

    #[tokio::test]
    async fn crash_after_n_puts_fails_every_later_call() {
        let dir = tempfile::tempdir().unwrap();
        let store = faulty(&dir, 5, vec![FaultRule::new(Fault::CrashAfterPuts(2)).key_prefix("tables/")]);
        store.put("CURRENT", Bytes::from_static(b"x")).await.unwrap();
        store.put("tables/1", Bytes::from_static(b"1")).await.unwrap();
        store.get("CURRENT").await.unwrap();
        store.put("tables/2", Bytes::from_static(b"2")).await.unwrap();
        assert_eq!(io_kind(store.put("tables/3", Bytes::from_static(b"3")).await), ErrorKind::ConnectionRefused);
        assert_eq!(io_kind(store.get("CURRENT").await), ErrorKind::ConnectionRefused);
        assert_eq!(io_kind(store.list("").await), ErrorKind::ConnectionRefused);
        let stored: Vec<String> = store.inner().list("").await.unwrap().into_iter().map(|o| o.key).collect();
        assert_eq!(stored, ["CURRENT", "tables/1", "tables/2"]);
        let zero =
            FaultyStore::new(DirStore::new(dir.path().into()), 0, vec![FaultRule::new(Fault::CrashAfterPuts(0))]);
        assert_eq!(io_kind(zero.get("CURRENT").await), ErrorKind::ConnectionRefused);
    }

    #[tokio::test]
    async fn rules_filter_by_operation_and_key_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let rule = FaultRule::new(Fault::Error).operations(&[Operation::Get, Operation::Delete]).key_prefix("tables/");
        let store = faulty(&dir, 6, vec![rule]);
        store.put("tables/a", Bytes::from_static(b"a")).await.unwrap();
        store.put("other", Bytes::from_static(b"o")).await.unwrap();
        assert!(store.get("tables/a").await.is_err());
        assert!(store.delete("tables/a").await.is_err());
        assert_eq!(store.get_range("tables/a", 0, 1).await.unwrap(), Bytes::from_static(b"a"));
        assert_eq!(store.get("other").await.unwrap(), Bytes::from_static(b"o"));
        assert_eq!(store.list("tables/").await.unwrap().len(), 1);
        store.delete("other").await.unwrap();
        let injected = store.log().iter().filter(|r| matches!(r.outcome, Outcome::Injected(_))).count();
        assert_eq!(injected, 2);
    }

    /// Which of `calls` matching gets failed, with unrelated calls interleaved or not.
    async fn failure_pattern(seed: u64, interleave: bool) -> Vec<bool> {
        let dir = tempfile::tempdir().unwrap();
        let rule = FaultRule::new(Fault::Error).operations(&[Operation::Get]).probability(0.3);
        let store = faulty(&dir, seed, vec![rule]);
        store.put("k", Bytes::from_static(b"v")).await.unwrap();
        let mut pattern = Vec::new();
        for i in 0..200 {
            if interleave && i % 3 == 0 {
                store.list("").await.unwrap();
            }
            pattern.push(store.get("k").await.is_err());
        }
        pattern
    }

    #[tokio::test]
    async fn same_seed_same_faults() {
        let pattern = failure_pattern(42, false).await;
        assert_eq!(pattern, failure_pattern(42, false).await);
        assert_eq!(pattern, failure_pattern(42, true).await, "depends only on the seed and n");
        assert_ne!(pattern, failure_pattern(43, false).await);
        let failures = pattern.iter().filter(|f| **f).count();
        assert!((30..=90).contains(&failures), "p = 0.3 over 200 calls gave {failures}");
        assert!(failure_pattern(42, false).await.iter().any(|f| !f));
    }

    #[tokio::test]
    async fn cancelled_calls_are_logged() {
        let dir = tempfile::tempdir().unwrap();
        let slow = Duration::from_secs(5);
        let store = faulty(&dir, 7, vec![FaultRule::new(Fault::Latency { min: slow, max: slow })]);
        let result = tokio::time::timeout(Duration::from_millis(20), store.get("k")).await;
        assert!(result.is_err());
        let log = store.log();
        assert_eq!((log.len(), log[0].outcome.clone(), log[0].operation), (1, Outcome::Cancelled, Operation::Get));
    }

    fn record(start_ms: u64, end_ms: u64) -> RequestRecord {
        RequestRecord {
            operation: Operation::GetRange,
            key: "k".into(),
            range: None,
            start: Duration::from_millis(start_ms),
            end: Duration::from_millis(end_ms),
            delay: Duration::ZERO,
            outcome: Outcome::Ok,
        }
    }

    #[test]
    fn serial_rounds_counts_dependent_waves() {
        let rounds =
            |spans: &[(u64, u64)]| serial_rounds(&spans.iter().map(|&(s, e)| record(s, e)).collect::<Vec<_>>());
        assert_eq!(rounds(&[]), 0);
        assert_eq!(rounds(&[(0, 10)]), 1);
        assert_eq!(rounds(&[(0, 10), (1, 12), (2, 11)]), 1);
        assert_eq!(rounds(&[(0, 10), (10, 20), (20, 30)]), 3, "back to back is serial");
        assert_eq!(rounds(&[(20, 30), (0, 10), (11, 15), (12, 19)]), 3, "order of the log does not matter");
        // The third request starts after the second finished: it may have waited for it.
        assert_eq!(rounds(&[(0, 10), (1, 2), (3, 11)]), 2);
        assert_eq!(rounds(&[(0, 10), (5, 30), (15, 40)]), 2);
    }

    #[tokio::test]
    async fn serial_rounds_of_real_concurrent_calls() {
        let dir = tempfile::tempdir().unwrap();
        let wait = Duration::from_millis(20);
        let store = faulty(
            &dir,
            8,
            vec![FaultRule::new(Fault::Latency { min: wait, max: wait }).operations(&[Operation::Get])],
        );
        store.put("k", Bytes::from_static(b"v")).await.unwrap();
        store.clear_log();
        let round = || futures::future::join_all((0..5).map(|_| store.get("k")));
        assert!(round().await.iter().all(Result::is_ok));
        assert_eq!(serial_rounds(&store.log()), 1);
        round().await;
        assert_eq!(serial_rounds(&store.log()), 2);
        assert_eq!(store.log().len(), 10);
    }
}
