//! Backfill: whole repositories (`com.atproto.sync.getRepo` CARs, or CAR files) into the index,
//! for one repo, one PDS, or every PDS behind a relay; resumable, paced, and safe next to live
//! ingest.
//!
//! The pieces: `xrpc` (the sync endpoints and what their answers mean), `repos` (repos.db, the
//! durable state), `limiter` (per-host pacing), `gate` (the meeting point with live ingest),
//! `progress` (figures). This module drives them: listings fill repos.db with pending
//! repositories while a bounded pool of fetches drains it.
//!
//! Invariants:
//! - At most `concurrency` repositories are fetched or parsed at once; at most one per DID.
//! - Every fetch of a DID is bracketed by `gate.begin` and exactly one of `gate.finish` /
//!   `gate.abandon`, whatever fails in between.
//! - A repository is marked done only after its snapshot is in the index; the index's flush makes
//!   it durable, and `ReposDb::reset_undurable` undoes marks a crash got ahead of. So a killed
//!   backfill, restarted, ends with the same index as one that was never killed.
//! - Retries are bounded (`max_attempts`), spaced by capped, jittered exponential backoff from an
//!   injected seed, or by the server's `Retry-After`; unavailable repositories are recorded once.
//! - The index is flushed whenever a memtable is full, so memory stays bounded on any repo count.

pub mod checkpoint;
pub mod gate;
pub mod limiter;
pub mod progress;
pub mod repos;
pub mod xrpc;

use crate::base::clock::Clock;
use crate::base::rng::splitmix64;
use crate::index::{Index, IndexError};
use crate::ingest::car::{CarError, CarLimits, RepoCommit, RepoRecord, read_repo_bytes};
use crate::ingest::http::HttpClient;
use crate::store::object::StoreError;
use gate::{GateError, GateLimits, SnapshotGate, SnapshotOutcome};
use limiter::HostLimiter;
use progress::BackfillProgress;
use repos::{Listed, RepoRow, RepoStatus, ReposDb, ReposError};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;
use xrpc::Failure;

/// Where repositories come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A repository CAR file on disk.
    Car(PathBuf),
    /// One repository, fetched from the PDS its DID document names.
    Repo(String),
    /// Every repository `listRepos` shows on one PDS.
    Pds(String),
    /// Every repository of every host `listHosts` shows on a relay, fetched from each host.
    Relay(String),
}

#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Repositories fetched (and parsed) at once.
    pub concurrency: usize,
    /// Requests started per second on one host, and how many may go back to back.
    pub per_host_per_second: f64,
    pub host_burst: u32,
    /// Attempts before a repository that keeps failing transiently is recorded as failed.
    pub max_attempts: u32,
    /// Deadline of one getRepo (headers and whole body).
    pub fetch_timeout: Duration,
    /// Deadline of one listing page or DID document.
    pub listing_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub car: CarLimits,
    /// The PLC directory that resolves `did:plc` identities.
    pub plc_url: String,
    /// Seeds the retry jitter.
    pub seed: u64,
}

impl Default for BackfillOptions {
    fn default() -> Self {
        BackfillOptions {
            concurrency: 8,
            per_host_per_second: 5.0,
            host_burst: 5,
            max_attempts: 6,
            fetch_timeout: Duration::from_secs(300),
            listing_timeout: Duration::from_secs(60),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(600),
            car: CarLimits::default(),
            plc_url: "https://plc.directory".into(),
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
    #[error("backfill task failed: {0}")]
    Task(String),
}

/// The backfill driver; one per process.
pub struct Backfill {
    gate: Arc<SnapshotGate>,
    repos: Arc<ReposDb>,
    http: HttpClient,
    limiter: HostLimiter,
    options: BackfillOptions,
    clock: Clock,
    pub progress: Arc<BackfillProgress>,
    jitter: Mutex<u64>,
    in_flight: Mutex<HashSet<String>>,
    flushing: tokio::sync::Mutex<()>,
    listings_done: AtomicBool,
    listing_news: tokio::sync::Notify,
}

/// What one fetched repository came to.
enum Fetched {
    Snapshot { commit: RepoCommit, records: Vec<RepoRecord>, bytes: usize },
    Failed(Failure),
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
    Ok(Arc::new(Backfill::new(gate, repos, options, clock)))
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

    pub fn new(gate: Arc<SnapshotGate>, repos: Arc<ReposDb>, options: BackfillOptions, clock: Clock) -> Self {
        assert!(options.concurrency > 0 && options.max_attempts > 0, "backfill needs workers and attempts");
        let limiter = HostLimiter::new(options.per_host_per_second, options.host_burst);
        Backfill {
            gate,
            repos,
            http: HttpClient::new(),
            limiter,
            jitter: Mutex::new(options.seed),
            options,
            clock,
            progress: Arc::new(BackfillProgress::default()),
            in_flight: Mutex::default(),
            flushing: tokio::sync::Mutex::new(()),
            listings_done: AtomicBool::new(false),
            listing_news: tokio::sync::Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        (self.clock)()
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
        let fetched = self.fetch_until_settled().await;
        listing.abort();
        fetched?;
        self.flush().await?;
        self.count_known()?;
        Ok(())
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

    /// Lists every network source into repos.db, then says so.
    async fn list_all(&self, sources: Vec<Source>) {
        for source in sources {
            let listed = match &source {
                Source::Repo(did) => self.list_one_repo(did).await,
                Source::Pds(url) => self.list_host(&xrpc::base_url(url, "https")).await,
                Source::Relay(url) => self.list_relay(url).await,
                Source::Car(_) => Ok(()),
            };
            if let Err(e) = listed {
                tracing::error!(?source, error = %e, "listing failed; the repositories listed so far are still fetched");
            }
        }
        self.listings_done.store(true, Ordering::Release);
        self.listing_news.notify_one();
    }

    async fn list_one_repo(&self, did: &str) -> Result<(), BackfillError> {
        let pds = self
            .with_retries(did, || {
                xrpc::resolve_pds(&self.http, &self.options.plc_url, did, self.options.listing_timeout)
            })
            .await;
        match pds {
            Ok(pds) => self.offer(&[Listed { did, host: &pds, rev: None, inactive: None }]),
            Err(failure) => {
                tracing::warn!(did, error = %failure, "could not resolve the repository's PDS");
                let listed = Listed { did, host: "", rev: None, inactive: None };
                self.repos.offer(&[listed], self.now_ms())?;
                self.repos.mark_settled(did, RepoStatus::Failed, Some(&failure.to_string()), self.now_ms())?;
                Ok(())
            }
        }
    }

    fn offer(&self, listed: &[Listed<'_>]) -> Result<(), BackfillError> {
        self.repos.offer(listed, self.now_ms())?;
        self.count_known()?;
        self.listing_news.notify_one();
        Ok(())
    }

    /// Pages through `listRepos` on one host from its saved cursor.
    async fn list_host(&self, base: &str) -> Result<(), BackfillError> {
        let source = format!("listRepos {base}");
        let (mut cursor, complete) = self.repos.listing(&source)?;
        if complete {
            return Ok(());
        }
        loop {
            let page = self
                .with_retries(base, || {
                    xrpc::list_repos(&self.http, base, cursor.as_deref(), self.options.listing_timeout)
                })
                .await;
            let page = match page {
                Ok(page) => page,
                Err(failure) => {
                    tracing::warn!(host = base, error = %failure, "listRepos failed; host skipped this run");
                    return Ok(());
                }
            };
            self.progress.invalid_listed.fetch_add(page.invalid as u64, Ordering::Relaxed);
            let listed: Vec<Listed<'_>> = page
                .items
                .iter()
                .map(|r| Listed { did: &r.did, host: base, rev: r.rev, inactive: r.inactive })
                .collect();
            self.offer(&listed)?;
            self.repos.set_listing(&source, page.next.as_deref(), page.next.is_none())?;
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// Lists a relay's hosts (every run: it is short), then each host's repositories.
    async fn list_relay(&self, relay: &str) -> Result<(), BackfillError> {
        let relay = xrpc::base_url(relay, "https");
        // Hosts are bare hostnames; they are reached the way the relay itself was (https in
        // production, plain http only when the relay was given as http://, as in local tests).
        let scheme = if relay.starts_with("http://") { "http" } else { "https" };
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .with_retries(&relay, || {
                    xrpc::list_hosts(&self.http, &relay, cursor.as_deref(), self.options.listing_timeout)
                })
                .await;
            let page = match page {
                Ok(page) => page,
                Err(failure) => {
                    tracing::error!(relay, error = %failure, "listHosts failed");
                    return Ok(());
                }
            };
            for host in &page.items {
                self.list_host(&xrpc::base_url(host, scheme)).await?;
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// Runs `call` with this host's pacing, retrying transient failures and rate limits within
    /// `max_attempts`.
    async fn with_retries<T, F, Fut>(&self, host: &str, mut call: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut attempt = 0;
        loop {
            self.limiter.acquire(host).await;
            let failure = match call().await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
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
        let mut due = self.repos.due(room + in_flight.len(), self.now_ms())?;
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

    /// One repository: fetch, parse, hand to the gate, record the outcome.
    async fn backfill_repo(self: &Arc<Self>, row: RepoRow) -> Result<(), BackfillError> {
        if !self.gate.begin(&row.did) {
            return Ok(());
        }
        let fetched = self.fetch_and_parse(&row).await;
        let (commit, records, bytes) = match fetched {
            Fetched::Snapshot { commit, records, bytes } => (commit, records, bytes),
            Fetched::Failed(failure) => {
                self.gate.abandon(&row.did)?;
                return self.record_failure(&row, failure);
            }
        };
        let gate = self.gate.clone();
        let (outcome, records) =
            tokio::task::spawn_blocking(move || gate.finish(&commit, &records).map(|o| (o, records.len())))
                .await
                .map_err(|e| BackfillError::Task(e.to_string()))??;
        self.progress.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.record_outcome(&row.did, outcome, records)?;
        self.flush_if_full().await
    }

    async fn fetch_and_parse(&self, row: &RepoRow) -> Fetched {
        self.limiter.acquire(&row.host).await;
        let max_bytes = usize::try_from(self.options.car.max_bytes).unwrap_or(usize::MAX);
        let body = match xrpc::get_repo(&self.http, &row.host, &row.did, max_bytes, self.options.fetch_timeout).await {
            Ok(body) => body,
            Err(failure) => return Fetched::Failed(failure),
        };
        let (limits, bytes) = (self.options.car.clone(), body.len());
        let parsed = tokio::task::spawn_blocking(move || read_repo_bytes(&body, &limits)).await;
        match parsed {
            Ok(Ok((commit, _, _))) if commit.did != row.did => {
                Fetched::Failed(Failure::Permanent(format!("getRepo answered a repository of {}", commit.did)))
            }
            Ok(Ok((commit, records, _stats))) => Fetched::Snapshot { commit, records, bytes },
            Ok(Err(error)) => Fetched::Failed(car_failure(error)),
            Err(join) => Fetched::Failed(Failure::Permanent(format!("parsing the CAR: {join}"))),
        }
    }

    fn record_failure(&self, row: &RepoRow, failure: Failure) -> Result<(), BackfillError> {
        let now = self.now_ms();
        let retry_in = match &failure {
            Failure::RateLimited { retry_after } => Some(self.rate_limited(&row.host, *retry_after, row.attempts + 1)),
            Failure::Transient(_) => Some(self.backoff(row.attempts + 1)),
            Failure::Unavailable(_) | Failure::Permanent(_) => None,
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

    /// A CAR file: parsed, then written through the gate like a fetched snapshot.
    async fn index_car_file(&self, path: &std::path::Path) -> Result<(), BackfillError> {
        let car_error = |reason: String| BackfillError::CarFile { path: path.display().to_string(), reason };
        let length = std::fs::metadata(path).map_err(|e| car_error(e.to_string()))?.len();
        if length > self.options.car.max_bytes {
            return Err(car_error(format!("larger than {} bytes", self.options.car.max_bytes)));
        }
        let bytes = tokio::fs::read(path).await.map_err(|e| car_error(e.to_string()))?;
        let limits = self.options.car.clone();
        let (commit, records, _) = tokio::task::spawn_blocking(move || read_repo_bytes(&bytes, &limits))
            .await
            .map_err(|e| BackfillError::Task(e.to_string()))?
            .map_err(|e| car_error(e.to_string()))?;
        let did = commit.did.clone();
        self.repos.offer(&[Listed { did: &did, host: "", rev: None, inactive: None }], self.now_ms())?;
        self.count_known()?;
        if !self.gate.begin(&did) {
            return Err(car_error(format!("{did} is already being backfilled")));
        }
        let gate = self.gate.clone();
        let (outcome, count) =
            tokio::task::spawn_blocking(move || gate.finish(&commit, &records).map(|o| (o, records.len())))
                .await
                .map_err(|e| BackfillError::Task(e.to_string()))??;
        self.progress.bytes.fetch_add(length, Ordering::Relaxed);
        if let SnapshotOutcome::Stale { .. } = outcome {
            // A file cannot be fetched again: say so and leave it recorded.
            self.repos.mark_settled(
                &did,
                RepoStatus::Stale,
                Some("CAR file older than live commits"),
                self.now_ms(),
            )?;
            tracing::warn!(path = %path.display(), did, "CAR file is older than live commits already applied; skipped");
        } else {
            self.record_outcome(&did, outcome, count)?;
        }
        self.flush_if_full().await
    }
}

/// A CAR that did not parse: a cut body is worth another try, a malformed one too (a proxy may
/// have mangled it), within the attempt limit; an oversized one is not.
fn car_failure(error: CarError) -> Failure {
    match error {
        CarError::TooBig { .. } | CarError::TooManyBlocks { .. } | CarError::TooManyRecords { .. } => {
            Failure::Permanent(error.to_string())
        }
        _ => Failure::Transient(error.to_string()),
    }
}
