//! Backfill: whole repositories (`com.atproto.sync.getRepo` CARs, or CAR files) into the index,
//! for one repo, one PDS, or every PDS behind a relay; verified, resumable, paced, and safe next
//! to live ingest.
//!
//! The pieces: `xrpc` (the sync endpoints and what their answers mean), `listing` (relays' and
//! hosts' listings, interleaved and capped), `fetch` (one repository: its identity, its own PDS,
//! its verified snapshot), `car_file` (CAR files read offline), `repos` (repos.db, the durable
//! state), `limiter` (per-host pacing), `hosts` (per-host slots and circuit breaker), `gate` (the
//! meeting point with live ingest), `progress` (figures). This module drives them: listings fill
//! repos.db with pending repositories while a bounded pool of fetches drains it.
//!
//! Trust: a listing is a hint. A repository is fetched only from the PDS its DID document names,
//! and written only when its commit is signed by the DID document's key and everything under it
//! checks out (`ingest::repo`). What fails is recorded `rejected` with the check that failed.
//!
//! Invariants:
//! - At most `concurrency` repositories are fetched or checked at once; at most one per DID; at
//!   most `breaker.slots_per_host` from one PDS; CAR bytes in memory stay within
//!   `car_memory_budget` (the rest waits in unnamed files).
//! - Every fetch of a DID is bracketed by `gate.begin` and exactly one of `gate.finish` /
//!   `gate.abandon`, whatever fails in between.
//! - A repository is marked done only after its snapshot is in the index; the index's flush makes
//!   it durable, and `ReposDb::reset_undurable` undoes marks a crash got ahead of. So a killed
//!   backfill, restarted, ends with the same index as one that was never killed.
//! - Retries are bounded (`max_attempts`), spaced by capped, jittered exponential backoff from an
//!   injected seed, or by the server's `Retry-After`; unavailable repositories are recorded once;
//!   rejected ones are tried again by a later run after `reject_retry`, `max_attempts` times in all.
//! - The index is flushed whenever a memtable is full, so memory stays bounded on any repo count.

pub mod car_file;
pub mod checkpoint;
pub mod fetch;
pub mod gate;
pub mod hosts;
pub mod limiter;
pub mod listing;
pub mod progress;
pub mod repos;
pub mod xrpc;

use crate::base::clock::Clock;
use crate::base::rng::splitmix64;
use crate::identity::directory::Directory;
use crate::identity::resolve::{Resolver, ResolverOptions};
use crate::index::{Index, IndexError};
use crate::ingest::repo::{CarError, CarLimits};
use crate::net::guard::AddressPolicy;
use crate::net::http::HttpClient;
use crate::net::spill::MemoryBudget;
use crate::store::object::StoreError;
use gate::{GateError, GateLimits, SnapshotGate, SnapshotOutcome};
use hosts::{BreakerOptions, HostGuard};
use limiter::HostLimiter;
use progress::BackfillProgress;
use repos::{RepoRow, RepoStatus, ReposDb, ReposError};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;
use xrpc::{CarSpill, Failure};

/// How often the local PLC directory asks the export for news once caught up.
pub const PLC_EXPORT_POLL: Duration = Duration::from_secs(60);

/// Where repositories come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A repository CAR file on disk.
    Car(PathBuf),
    /// One repository, fetched from the PDS its DID document names.
    Repo(String),
    /// Every repository `listRepos` shows on one PDS.
    Pds(String),
    /// Every repository of every host `listHosts` shows on a relay.
    Relay(String),
}

#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Repositories fetched (and checked) at once.
    pub concurrency: usize,
    /// Requests started per second on one host, and how many may go back to back.
    pub per_host_per_second: f64,
    pub host_burst: u32,
    /// Fetches at once per PDS, and when a host that keeps failing is paused or given up.
    pub breaker: BreakerOptions,
    /// Attempts before a repository that keeps failing transiently is recorded as failed; also
    /// how many times in all a rejected repository is fetched.
    pub max_attempts: u32,
    /// How long a rejected repository waits before a later run fetches it again (doubling with
    /// each rejection).
    pub reject_retry: Duration,
    /// Deadline of one getRepo (headers and whole body); a body must also keep arriving at
    /// `min_bytes_per_sec` (after a grace period) and never be silent for `stall`.
    pub fetch_timeout: Duration,
    pub min_bytes_per_sec: u64,
    pub stall: Duration,
    /// Deadline of one listing page or DID resolution.
    pub listing_timeout: Duration,
    /// Listing pages and listed DIDs one host (or relay) may give; its listing is cut off past
    /// either, and the cut reported.
    pub max_pages_per_host: u64,
    pub max_dids_per_host: u64,
    /// Hosts whose listings are paged at once, a page each in turn.
    pub listing_concurrency: usize,
    /// Deadline of checking one repository once fetched.
    pub parse_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub car: CarLimits,
    /// Bytes of one CAR kept in memory, and of all CARs in flight together; the rest goes to
    /// unnamed files in the data directory.
    pub car_memory_bytes: usize,
    pub car_memory_budget: usize,
    /// The PLC directory (or a mirror) that resolves `did:plc` identities.
    pub plc_url: String,
    /// Keep a local copy of the PLC directory (`plc.db`) from its bulk export while backfilling,
    /// and resolve did:plc from it: one request per page of 1,000 operations instead of one per
    /// DID.
    pub plc_sync: bool,
    /// Identities resolved are kept this long, this many at most.
    pub identity_ttl: Duration,
    pub identity_cache_entries: usize,
    /// Non-public addresses that backfill and DID resolution may reach anyway (`IP` or
    /// `IP:port`): for local setups and tests. Empty: public addresses only, https only.
    pub allow_private: Vec<String>,
    /// DID documents at hand for CAR files (`--did-doc`), to verify their signatures offline.
    pub did_documents: Vec<PathBuf>,
    /// Seeds the retry jitter.
    pub seed: u64,
}

impl Default for BackfillOptions {
    fn default() -> Self {
        BackfillOptions {
            concurrency: 8,
            per_host_per_second: 5.0,
            host_burst: 5,
            breaker: BreakerOptions::default(),
            max_attempts: 6,
            reject_retry: Duration::from_secs(24 * 3600),
            fetch_timeout: Duration::from_secs(300),
            min_bytes_per_sec: 16 << 10,
            stall: Duration::from_secs(30),
            listing_timeout: Duration::from_secs(60),
            max_pages_per_host: 20_000,
            max_dids_per_host: 5_000_000,
            listing_concurrency: 8,
            parse_timeout: Duration::from_secs(300),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(600),
            car: CarLimits::default(),
            car_memory_bytes: 32 << 20,
            car_memory_budget: 256 << 20,
            plc_url: "https://plc.directory".into(),
            plc_sync: false,
            identity_ttl: Duration::from_secs(3600),
            identity_cache_entries: 100_000,
            allow_private: Vec::new(),
            did_documents: Vec::new(),
            seed: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error(transparent)]
    Repos(#[from] ReposError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("{path}: {reason}")]
    CarFile { path: String, reason: String },
    #[error("backfill options: {0}")]
    Options(String),
    #[error(transparent)]
    Directory(#[from] crate::identity::directory::DirectoryError),
    #[error("backfill task failed: {0}")]
    Task(String),
}

/// The backfill driver; one per process.
pub struct Backfill {
    gate: Arc<SnapshotGate>,
    repos: Arc<ReposDb>,
    http: HttpClient,
    resolver: Resolver,
    directory: Option<Arc<Directory>>,
    limiter: HostLimiter,
    hosts: HostGuard,
    spill: CarSpill,
    options: BackfillOptions,
    clock: Clock,
    pub progress: Arc<BackfillProgress>,
    jitter: Mutex<u64>,
    in_flight: Mutex<HashSet<String>>,
    flushing: tokio::sync::Mutex<()>,
    listings_done: AtomicBool,
    listing_news: tokio::sync::Notify,
}

/// Opens backfill's state beside `index` in `data_dir`: repos.db (restored from the newest
/// checkpoint the bucket has for the index's manifest, when the file is missing), the gate that
/// live ingest shares, and the driver.
pub async fn open(
    index: Arc<Index>,
    data_dir: &Path,
    options: BackfillOptions,
    clock: Clock,
) -> Result<Arc<Backfill>, BackfillError> {
    let path = data_dir.join("repos.db");
    if let Some((generation, _)) = index.catalog.last_manifest()?
        && let Some(key) = checkpoint::restore_if_missing(index.store.as_ref(), &path, generation).await?
    {
        tracing::info!(%key, "restored repos.db from a checkpoint");
    }
    let repos = Arc::new(ReposDb::open(&path)?);
    let gate = Arc::new(SnapshotGate::new(index, repos.clone(), GateLimits::default()));
    Ok(Arc::new(Backfill::new(gate, repos, options, clock)?))
}

impl Backfill {
    /// How many repositories repos.db holds in each status.
    pub fn repo_counts(&self) -> Result<std::collections::BTreeMap<RepoStatus, u64>, BackfillError> {
        Ok(self.repos.counts()?)
    }

    pub fn gate(&self) -> &Arc<SnapshotGate> {
        &self.gate
    }

    /// Uploads a checkpoint of repos.db under the newest manifest this index published (none
    /// before the first). Returns its key.
    pub async fn save_checkpoint(&self) -> Result<Option<String>, BackfillError> {
        let index = self.gate.index();
        let Some((generation, _)) = index.catalog.last_manifest()? else { return Ok(None) };
        let id = splitmix64(&mut self.jitter.lock().expect("jitter lock poisoned"));
        let scratch = index.data_dir.join("repos.db.checkpoint");
        Ok(Some(checkpoint::save(index.store.as_ref(), &self.repos, generation, id, &scratch).await?))
    }

    pub fn new(
        gate: Arc<SnapshotGate>,
        repos: Arc<ReposDb>,
        options: BackfillOptions,
        clock: Clock,
    ) -> Result<Self, BackfillError> {
        assert!(options.concurrency > 0 && options.max_attempts > 0, "backfill needs workers and attempts");
        let policy = AddressPolicy::with_allowed(&options.allow_private).map_err(BackfillError::Options)?;
        let http = HttpClient::new(policy);
        let directory = match options.plc_sync {
            true => Some(Arc::new(Directory::open(&gate.index().data_dir.join("plc.db"))?)),
            false => None,
        };
        let resolver = Resolver::new(
            http.clone(),
            ResolverOptions {
                plc_url: options.plc_url.clone(),
                timeout: options.listing_timeout,
                cache_entries: options.identity_cache_entries,
                ttl_ms: options.identity_ttl.as_millis() as u64,
            },
            clock.clone(),
        );
        let resolver = match &directory {
            Some(directory) => resolver.with_directory(directory.clone()),
            None => resolver,
        };
        let spill = CarSpill {
            memory_bytes: options.car_memory_bytes,
            budget: MemoryBudget::new(options.car_memory_budget),
            directory: gate.index().data_dir.clone(),
        };
        Ok(Backfill {
            gate,
            repos,
            http,
            resolver,
            directory,
            limiter: HostLimiter::new(options.per_host_per_second, options.host_burst),
            hosts: HostGuard::new(options.breaker),
            spill,
            jitter: Mutex::new(options.seed),
            options,
            clock,
            progress: Arc::new(BackfillProgress::default()),
            in_flight: Mutex::default(),
            flushing: tokio::sync::Mutex::new(()),
            listings_done: AtomicBool::new(false),
            listing_news: tokio::sync::Notify::new(),
        })
    }

    /// `did`'s identity may have changed (an `#identity` event): resolve it afresh next time.
    pub fn forget_identity(&self, did: &str) {
        self.resolver.forget(did);
    }

    /// The local PLC directory, when kept: DIDs held, stale among them, the export position.
    pub fn directory_figures(&self) -> Result<Option<(u64, u64, u64)>, BackfillError> {
        let Some(directory) = &self.directory else { return Ok(None) };
        let (dids, stale) = directory.counts()?;
        Ok(Some((dids, stale, directory.position()?)))
    }

    /// Hosts paused by their circuit breaker now, or given up (for reports).
    pub fn paused_hosts(&self) -> Vec<hosts::PausedHost> {
        self.hosts.paused()
    }

    /// The most recently rejected repositories, with why (for reports).
    pub fn rejected(&self, limit: usize) -> Result<Vec<(String, String)>, BackfillError> {
        Ok(self.repos.rejected(limit)?)
    }

    fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// The injected clock in microseconds (what a commit's `rev` is checked against).
    fn now_us(&self) -> i64 {
        (self.now_ms() as i64).saturating_mul(1_000)
    }

    /// Indexes every repository of `sources`; returns when none is left to fetch (all settled or
    /// given up). Resumes from repos.db: listings continue from their saved cursors and done
    /// repositories are not fetched again unless a listing shows a newer revision.
    pub async fn run(self: &Arc<Self>, sources: Vec<Source>) -> Result<(), BackfillError> {
        let durable = self.gate.index().catalog.position()?.clock;
        let reset = self.repos.reset_undurable(durable)?;
        if reset > 0 {
            tracing::info!(reset, "repositories marked done past the durable clock go back to pending");
        }
        self.start_progress()?;
        let (files, network): (Vec<_>, Vec<_>) = sources.into_iter().partition(|s| matches!(s, Source::Car(_)));
        for source in files {
            if let Source::Car(path) = source {
                self.index_car_file(&path).await?;
            }
        }
        let lister = self.clone();
        let listing = tokio::spawn(async move { lister.list_all(network).await });
        let following = self.follow_directory().await;
        let fetched = self.fetch_until_settled().await;
        listing.abort();
        if let Some(following) = following {
            following.abort();
        }
        fetched?;
        self.flush().await?;
        self.count_known()?;
        Ok(())
    }

    /// Takes one page of the PLC export now (so what it holds serves this run from the start),
    /// then follows the export in the background; `None` when no local directory is kept.
    async fn follow_directory(&self) -> Option<tokio::task::JoinHandle<()>> {
        let directory = self.directory.clone()?;
        let (http, url) = (self.http.clone(), self.options.plc_url.clone());
        if let Err(e) = directory.sync_page(&http, &url, self.options.listing_timeout).await {
            tracing::warn!(error = %e, "the PLC export could not be read; resolving DID by DID meanwhile");
        }
        Some(tokio::spawn(directory.follow(http, url, PLC_EXPORT_POLL)))
    }

    fn start_progress(&self) -> Result<(), BackfillError> {
        let settled: u64 =
            self.repos.counts()?.iter().filter(|(status, _)| status.is_settled()).map(|(_, count)| count).sum();
        self.progress.repos_settled_before.store(settled, Ordering::Relaxed);
        self.progress.started_ms.store(self.now_ms(), Ordering::Relaxed);
        self.count_known()
    }

    fn count_known(&self) -> Result<(), BackfillError> {
        let known: u64 = self.repos.counts()?.values().sum();
        self.progress.repos_known.store(known, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `call` on `host` with its slot, pacing and breaker, retrying transient failures and
    /// rate limits within `max_attempts`.
    async fn with_retries<T, F, Fut>(&self, host: &str, mut call: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut attempt = 0;
        loop {
            let _slot = self.hosts.slot(host).await.map_err(|until| Failure::HostPaused { until })?;
            self.limiter.acquire(host).await;
            let failure = match call().await {
                Ok(value) => {
                    self.hosts.succeeded(host);
                    return Ok(value);
                }
                Err(failure) => failure,
            };
            if failure.counts_against_host() && self.hosts.failed(host, &failure.to_string()) {
                self.progress.host_pauses.fetch_add(1, Ordering::Relaxed);
            }
            attempt += 1;
            let wait = match &failure {
                _ if attempt >= self.options.max_attempts => return Err(failure),
                Failure::RateLimited { retry_after } => self.rate_limited(host, *retry_after, attempt),
                Failure::Transient(_) => self.backoff(attempt),
                _ => return Err(failure),
            };
            self.progress.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
        }
    }

    /// `host` answered 429: it is paused for what it asked (or a backoff); returns the wait.
    fn rate_limited(&self, host: &str, retry_after: Option<Duration>, attempt: u32) -> Duration {
        self.progress.rate_limited.fetch_add(1, Ordering::Relaxed);
        let wait = retry_after.unwrap_or_else(|| self.backoff(attempt));
        self.limiter.pause(host, wait);
        wait
    }

    /// Capped exponential backoff with full jitter in its upper half.
    fn backoff(&self, attempt: u32) -> Duration {
        let base = self.options.backoff_min.saturating_mul(1 << attempt.min(20)).min(self.options.backoff_max);
        let random = splitmix64(&mut self.jitter.lock().expect("jitter lock poisoned"));
        let half = base / 2;
        half + Duration::from_nanos(random % (half.as_nanos().max(1) as u64))
    }

    /// Fetches pending repositories until listings are done and nothing is pending or in flight.
    async fn fetch_until_settled(self: &Arc<Self>) -> Result<(), BackfillError> {
        let mut tasks: JoinSet<Result<(), BackfillError>> = JoinSet::new();
        loop {
            while let Some(done) = tasks.try_join_next() {
                done.map_err(|e| BackfillError::Task(e.to_string()))??;
            }
            let spawned = self.spawn_due(&mut tasks)?;
            if spawned > 0 {
                continue;
            }
            let listings_done = self.listings_done.load(Ordering::Acquire);
            if tasks.is_empty() && listings_done && self.repos.next_due_ms()?.is_none() {
                return Ok(());
            }
            let wait = self.idle_wait()?;
            tokio::select! {
                Some(done) = tasks.join_next() => done.map_err(|e| BackfillError::Task(e.to_string()))??,
                _ = self.listing_news.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long to wait for news: until the next retry is due, at most a second.
    fn idle_wait(&self) -> Result<Duration, BackfillError> {
        let next = self.repos.next_due_ms()?.unwrap_or(u64::MAX);
        Ok(Duration::from_millis(next.saturating_sub(self.now_ms()).clamp(10, 1000)))
    }

    fn spawn_due(self: &Arc<Self>, tasks: &mut JoinSet<Result<(), BackfillError>>) -> Result<usize, BackfillError> {
        let room = self.options.concurrency.saturating_sub(tasks.len());
        if room == 0 {
            return Ok(0);
        }
        let mut in_flight = self.in_flight.lock().expect("in-flight lock poisoned");
        let mut due = self.repos.due(room + in_flight.len(), self.now_ms(), self.options.max_attempts)?;
        due.retain(|row| !in_flight.contains(&row.did));
        let mut spawned = 0;
        for row in due.into_iter().take(room) {
            in_flight.insert(row.did.clone());
            let this = self.clone();
            tasks.spawn(async move {
                let did = row.did.clone();
                let result = this.backfill_repo(row).await;
                this.in_flight.lock().expect("in-flight lock poisoned").remove(&did);
                result
            });
            spawned += 1;
        }
        Ok(spawned)
    }

    /// One repository: resolve, fetch, verify, hand to the gate, record the outcome.
    async fn backfill_repo(self: &Arc<Self>, row: RepoRow) -> Result<(), BackfillError> {
        if !self.gate.begin(&row.did) {
            return Ok(());
        }
        let snapshot = match self.fetch_verified(&row.did).await {
            Ok(snapshot) => snapshot,
            Err(failure) => {
                self.gate.abandon(&row.did)?;
                return self.record_failure(&row, failure);
            }
        };
        self.progress.verified.fetch_add(1, Ordering::Relaxed);
        let gate = self.gate.clone();
        let (commit, records) = (snapshot.repo.commit, snapshot.repo.records);
        let (outcome, records) =
            tokio::task::spawn_blocking(move || gate.finish(&commit, &records).map(|o| (o, records.len())))
                .await
                .map_err(|e| BackfillError::Task(e.to_string()))??;
        self.progress.bytes.fetch_add(snapshot.bytes, Ordering::Relaxed);
        self.record_outcome(&row.did, outcome, records)?;
        self.flush_if_full().await
    }

    fn record_failure(&self, row: &RepoRow, failure: Failure) -> Result<(), BackfillError> {
        let now = self.now_ms();
        let retry_in = match &failure {
            Failure::RateLimited { retry_after } => Some(retry_after.unwrap_or_else(|| self.backoff(row.attempts + 1))),
            Failure::Transient(_) => Some(self.backoff(row.attempts + 1)),
            _ => None,
        };
        match (retry_in, &failure) {
            (Some(wait), _) => {
                let next = now + wait.as_millis() as u64;
                let status =
                    self.repos.mark_retry(&row.did, &failure.to_string(), next, self.options.max_attempts, now)?;
                self.progress.retries.fetch_add(1, Ordering::Relaxed);
                if status == RepoStatus::Failed {
                    self.progress.repos_other.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(did = row.did, error = %failure, "giving up on the repository");
                }
            }
            (None, Failure::HostPaused { until: Some(until) }) => {
                let wait = until.saturating_duration_since(tokio::time::Instant::now());
                self.repos.postpone(&row.did, &failure.to_string(), now + wait.as_millis() as u64, now)?;
            }
            (None, Failure::Rejected { reason, message }) => {
                let wait = self.options.reject_retry.saturating_mul(1 << row.attempts.min(10));
                self.repos.mark_rejected(&row.did, message, now + wait.as_millis() as u64, now)?;
                self.progress.reject(reason);
                self.progress.repos_other.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(did = row.did, reason, error = %message, "repository rejected: it failed verification");
            }
            (None, Failure::Unavailable(status)) => {
                self.repos.mark_settled(&row.did, *status, None, now)?;
                self.progress.repos_other.fetch_add(1, Ordering::Relaxed);
            }
            (None, _) => {
                self.repos.mark_settled(&row.did, RepoStatus::Failed, Some(&failure.to_string()), now)?;
                self.progress.repos_other.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(did = row.did, error = %failure, "repository failed");
            }
        }
        Ok(())
    }

    fn record_outcome(&self, did: &str, outcome: SnapshotOutcome, records: usize) -> Result<(), BackfillError> {
        let now = self.now_ms();
        match outcome {
            SnapshotOutcome::Written { rev, stamp, links, .. } => {
                self.repos.mark_done(did, rev, stamp, records as u64, links, now)?;
                self.progress.repos_done.fetch_add(1, Ordering::Relaxed);
                self.progress.records.fetch_add(records as u64, Ordering::Relaxed);
                self.progress.links.fetch_add(links, Ordering::Relaxed);
            }
            SnapshotOutcome::Stale { .. } => {
                // Live commits moved past the snapshot: fetch a newer one soon.
                self.progress.stale.fetch_add(1, Ordering::Relaxed);
                let next = now + self.backoff(1).as_millis() as u64;
                self.repos.mark_retry(did, "snapshot older than live commits", next, self.options.max_attempts, now)?;
            }
            SnapshotOutcome::AlreadyIndexed => {
                self.repos.mark_unchanged(did, now)?;
                self.progress.repos_other.fetch_add(1, Ordering::Relaxed);
            }
            SnapshotOutcome::AccountDeleted => {
                self.repos.mark_settled(did, RepoStatus::Deleted, None, now)?;
                self.progress.repos_other.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Flushes the index when a memtable is full (one flush at a time).
    async fn flush_if_full(&self) -> Result<(), BackfillError> {
        if self.gate.index().wants_flush() {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), BackfillError> {
        let _one = self.flushing.lock().await;
        let gate = self.gate.clone();
        tokio::task::spawn_blocking(move || gate.flush()).await.map_err(|e| BackfillError::Task(e.to_string()))??;
        Ok(())
    }
}

/// A CAR that failed: a transfer cut short (or a check that ran out of time) is worth another
/// try within the attempt limit; a CAR that is wrong as served is rejected.
fn car_failure(error: CarError) -> Failure {
    if error.is_verification_failure() {
        Failure::Rejected { reason: error.reason(), message: error.to_string() }
    } else {
        Failure::Transient(error.to_string())
    }
}
