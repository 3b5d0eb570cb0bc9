//! The writer: the one process that changes a bucket prefix, and the life every writing command
//! shares (`serve` with ingest, `import`, `backfill`).
//!
//! - `lease`: one writer per bucket prefix, enforced by a lease object the writer renews;
//! - `compactor`: merges on a thread of their own, nudged after every flush.
//!
//! A `Writer` takes the lease, restores an empty data directory from the bucket, and starts the
//! compactor; then, on the injected clock, it renews the lease, publishes manifests, collects
//! garbage and has the trees of a slow or quiet writer settled (`tick`); `finish` drains and
//! settles the merges, publishes once more, collects garbage and gives the lease back.
//!
//! Invariants:
//! - Nothing is uploaded and no manifest written before the lease is held; a lost lease (another
//!   writer took the prefix) stops the writer with an error, never a retry.
//! - The lease is renewed at least every quarter of its lifetime while `tick` is called that often.
//! - Garbage is collected only right after a manifest was published, with the grace period of
//!   `WriterOptions::gc_grace_ms`: a retired table outlives every manifest that named it by that long.
//! - A failed publish or collection is logged and retried at the next publish time; nothing it
//!   did not finish is lost (objects are uploaded before a manifest names them).

pub mod compactor;
pub mod lease;

use crate::base::clock::Clock;
use crate::index::{Index, IndexError};
use compactor::Compactor;
use lease::{LeaseError, WriterLease};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How a writer keeps its lease, publishes and collects garbage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterOptions {
    /// How often to publish a manifest (uploading new tables and outline ranges) and then collect
    /// garbage; `None`: only when the writer finishes.
    pub publish_every_ms: Option<u64>,
    /// Retired tables are deleted this long after their retirement.
    pub gc_grace_ms: u64,
    /// How long the lease lasts without renewal (it is renewed every quarter of that).
    pub lease_ttl_ms: u64,
    /// How long a new writer waits before reading its lease back (see `lease`).
    pub lease_settle: Duration,
    /// Windows of this length decide whether the compactor settles the trees (merges each
    /// tree's lowest tier into one run: fewer runs for a query to visit): it does after a window
    /// in which the writer flushed something, but no more than tier 0 holds
    /// (`Index::tier_zero_bytes`). `None`: only at `finish`.
    pub settle_window_ms: Option<u64>,
}

/// Default of `WriterOptions::publish_every_ms` for the long-running writers.
pub const DEFAULT_PUBLISH_EVERY_MS: u64 = 30_000;
/// Default of `WriterOptions::gc_grace_ms`.
pub const DEFAULT_GC_GRACE_MS: u64 = 600_000;
/// Default of `WriterOptions::lease_ttl_ms`.
pub const DEFAULT_LEASE_TTL_MS: u64 = 60_000;
/// Default of `WriterOptions::settle_window_ms`. A live writer flushes at least once a minute
/// (`LiveOptions::max_unflushed_ms`); while that stays under what tier 0 holds its tier 0 is
/// settled every minute or so. An import or a backfill flushes tens of megabytes a second, is
/// left to its full-tier merges, and settles when it finishes (or falls quiet).
pub const DEFAULT_SETTLE_WINDOW_MS: u64 = 60_000;

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            publish_every_ms: Some(DEFAULT_PUBLISH_EVERY_MS),
            gc_grace_ms: DEFAULT_GC_GRACE_MS,
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            lease_settle: Duration::from_millis(200),
            settle_window_ms: Some(DEFAULT_SETTLE_WINDOW_MS),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("writer lease: {0}")]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Index(#[from] IndexError),
}

impl From<WriterError> for IndexError {
    /// For the import's flush callback, which speaks `IndexError`.
    fn from(error: WriterError) -> Self {
        match error {
            WriterError::Lease(e) => IndexError::Lease(e.to_string()),
            WriterError::Index(e) => e,
        }
    }
}

/// What `finish` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Merges the compactor made over the writer's life.
    pub merges: usize,
    /// The manifest published last.
    pub manifest: String,
}

pub struct Writer {
    index: Arc<Index>,
    lease: Option<WriterLease>,
    /// Taken by `finish`.
    compactor: Option<Compactor>,
    clock: Clock,
    options: WriterOptions,
    last_publish_ms: u64,
    last_renew_ms: u64,
    manifests: u64,
    /// The current settle window: when it began, and `flush_bytes` then.
    settle_window: (u64, u64),
    /// No flush since the last settle was asked for.
    settled: AtomicBool,
}

impl Writer {
    /// Takes the bucket prefix's lease for `owner` (`None`: a writer that shares its bucket with
    /// no one, in tests), restores an empty data directory from the bucket, and starts the
    /// compactor on `runtime` (its reads of tables that are not local run there).
    pub async fn start(
        index: Arc<Index>,
        owner: Option<&str>,
        clock: Clock,
        options: WriterOptions,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, WriterError> {
        let now = clock();
        let lease = match owner {
            Some(owner) => Some(
                WriterLease::acquire(index.store.clone(), owner, now, options.lease_ttl_ms, options.lease_settle)
                    .await?,
            ),
            None => None,
        };
        if index.restore_if_empty(now).await? {
            tracing::info!(position = ?index.position(), "restored the data directory from the bucket");
        }
        let completed = index.complete_partial_metas().await?;
        if completed > 0 {
            tracing::info!(completed, "fetched whole the metas a read-only server had fetched in part");
        }
        let compactor = Compactor::spawn(index.clone(), runtime, clock.clone());
        let flushed_so_far = index.counters.flush_bytes.load(Ordering::Relaxed);
        Ok(Writer {
            index,
            lease,
            compactor: Some(compactor),
            clock,
            options,
            last_publish_ms: now,
            last_renew_ms: now,
            manifests: 0,
            settle_window: (now, flushed_so_far),
            settled: AtomicBool::new(true),
        })
    }

    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// Manifests this writer published.
    pub fn manifests(&self) -> u64 {
        self.manifests
    }

    /// Tells the compactor that a flush added a run (never blocks).
    pub fn flushed(&self) {
        self.settled.store(false, Ordering::Relaxed);
        if let Some(compactor) = &self.compactor {
            compactor.nudge();
        }
    }

    /// At the end of each settle window, asks the compactor to settle the trees if the writer
    /// flushed since the last settle and flushed little in the window (see
    /// `WriterOptions::settle_window_ms`).
    fn settle_if_slow(&mut self, now: u64) {
        let Some(window) = self.options.settle_window_ms else { return };
        let (began, bytes_then) = self.settle_window;
        if now.saturating_sub(began) < window {
            return;
        }
        let bytes_now = self.index.counters.flush_bytes.load(Ordering::Relaxed);
        self.settle_window = (now, bytes_now);
        let slow = bytes_now.saturating_sub(bytes_then) <= self.index.tier_zero_bytes();
        if slow
            && !self.settled.swap(true, Ordering::Relaxed)
            && let Some(compactor) = &self.compactor
        {
            compactor.settle();
        }
    }

    /// The periodic work due at the clock's time: the trees settled after a window of few
    /// flushes (`settle_window_ms`), the lease renewed when a quarter of its life has passed, and a
    /// manifest published (then garbage collected) when `publish_every_ms` has.
    /// Returns the manifest it published, if it did. A publish or collection that fails is logged
    /// and tried again at the next publish time; a lost lease is an error.
    pub async fn tick(&mut self) -> Result<Option<String>, WriterError> {
        let now = (self.clock)();
        self.settle_if_slow(now);
        let publish_due =
            self.options.publish_every_ms.is_some_and(|every| now.saturating_sub(self.last_publish_ms) >= every);
        if publish_due {
            self.last_publish_ms = now;
            return match self.publish().await {
                Ok(name) => Ok(Some(name)),
                Err(WriterError::Index(e)) => {
                    tracing::warn!(error = %e, "publishing a manifest failed; retrying later");
                    Ok(None)
                }
                Err(lost) => Err(lost),
            };
        }
        if now.saturating_sub(self.last_renew_ms) >= self.options.lease_ttl_ms / 4 {
            self.renew(now).await?;
        }
        Ok(None)
    }

    /// Renews the lease, publishes a manifest and collects garbage, now. A failed collection is
    /// logged (the next one retries it); the publish's outcome is returned.
    pub async fn publish(&mut self) -> Result<String, WriterError> {
        let now = (self.clock)();
        self.renew(now).await?;
        let name = self.index.publish_manifest().await?;
        self.manifests += 1;
        tracing::debug!(%name, "published a manifest");
        match self.index.collect_garbage(now, self.options.gc_grace_ms).await {
            Ok((0, 0)) => {}
            Ok((retired, orphans)) => tracing::info!(retired, orphans, "collected garbage"),
            Err(e) => tracing::warn!(error = %e, "garbage collection failed; retrying later"),
        }
        Ok(name)
    }

    /// Runs the merges still due, publishes and collects garbage a last time, and gives the lease
    /// back (the next writer need not wait for it to expire).
    pub async fn finish(mut self) -> Result<Finished, WriterError> {
        let finished = self.drain_and_publish().await?;
        self.release().await?;
        Ok(finished)
    }

    /// `finish` up to the lease: the merges still due, a last manifest and collection. Anything
    /// the caller publishes under that manifest (a checkpoint) goes before `release`.
    pub async fn drain_and_publish(&mut self) -> Result<Finished, WriterError> {
        let merges = match self.compactor.take() {
            Some(compactor) => tokio::task::spawn_blocking(move || compactor.finish())
                .await
                .map_err(|e| IndexError::Background(format!("waiting for the compactor: {e}")))??,
            None => 0,
        };
        let manifest = self.publish().await?;
        Ok(Finished { merges, manifest })
    }

    /// Gives the lease back, if this writer holds one.
    pub async fn release(mut self) -> Result<(), WriterError> {
        if let Some(lease) = self.lease.take() {
            lease.release().await?;
        }
        Ok(())
    }

    async fn renew(&mut self, now: u64) -> Result<(), WriterError> {
        if let Some(lease) = &mut self.lease {
            lease.renew(now).await?;
        }
        self.last_renew_ms = now;
        Ok(())
    }
}
