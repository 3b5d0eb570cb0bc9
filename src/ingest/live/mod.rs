//! Live ingest: a Jetstream client (v2 `subscribeEvents` or v1 `/subscribe`, several instances in
//! order of preference) feeding the index through a bounded queue, with time- and size-bounded
//! flushes; its `Writer` does the rest (compaction, manifests, garbage collection, the lease).
//!
//! Invariants:
//! - Nothing is dropped between socket and index: the queue is bounded and the socket task waits
//!   on it, so when the engine is behind, reading pauses (the server buffers, or drops us as too
//!   slow, and we resume from our cursor).
//! - The socket task never gives up: every failure reconnects after a capped, jittered exponential
//!   backoff (randomness from an injected seed); repeated failures move to the next instance.
//! - Durability is the firehose: the durable cursor is the event's `time_us`, which every instance
//!   and both protocols accept (v2 reads cursors >= 1e15 as timestamps), committed atomically with
//!   each flush. A restart or an instance switch resumes `rewind_us` before it, because `time_us`
//!   is neither unique nor comparable to the exact instant across instances. Seq cursors (exact,
//!   instance-local) are used only to resume on the same instance within this process.
//! - Replay is idempotent: a replayed event gets a fresh, higher stamp. A replayed create writes
//!   a duplicate (target, source, location) that dedup folds into one; a replayed delete or update
//!   revokes the record at its new stamp, and every later write of that record in the stream
//!   (a re-create) is replayed after it, so it gets a still higher stamp and stays live. Replay is
//!   always of a contiguous suffix of the stream, so the last operation per record still wins.
//! - Compression never stops the tail: a v2 instance's dictionary is fetched from it
//!   (`getZstdDictionary`, at most 1 MiB; the embedded one when the fetch fails); a refused
//!   dictionary (a rotation) is refetched once, after which that instance is followed uncompressed.
//! - Wall time comes only from the injected `Clock`.

mod follower;

use follower::follow;
pub use follower::{DICTIONARY_PATH, Instance, Resume, V1_PATH, V2_PATH};

use crate::base::clock::Clock;
use crate::index::{Index, IndexError};
use crate::ingest::backfill::gate::SnapshotGate;
use crate::ingest::frames::{EventKind, StreamEvent};
use crate::model::operation::Operation;
use crate::push::PushError;
use crate::push::feed::Feed;
use crate::writer::Writer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// Events the engine applies between checks of its timers.
const ENGINE_BATCH: usize = 1024;
/// How often the engine wakes with no events, to flush by age and run its periodic work.
const ENGINE_TICK: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("jetstream URL {:?}: {reason}", crate::base::redact::redact_url(.url))]
    Url { url: String, reason: &'static str },
    #[error("no jetstream instance configured")]
    NoInstances,
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Writer(#[from] crate::writer::WriterError),
    #[error("backfill gate: {0}")]
    Gate(String),
    #[error("the ingest engine thread panicked")]
    Panicked,
}

#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// In order of preference; the first is tried first.
    pub instances: Vec<Instance>,
    /// Ask for dict-zstd frames (with the embedded dictionaries).
    pub compress: bool,
    /// Events queued between socket and engine.
    pub queue_events: usize,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Consecutive failed connections (no event delivered) before moving to the next instance.
    pub failures_before_switch: u32,
    /// How far before a timestamp cursor to resume (restart, instance switch).
    pub rewind_us: i64,
    /// A connection that delivers nothing for this long is presumed dead.
    pub idle_timeout: Duration,
    /// Flush when the oldest unflushed event was applied this long ago.
    pub max_unflushed_ms: u64,
    /// Seeds the backoff jitter.
    pub seed: u64,
    /// Routes every write through backfill's gate (when backfill may run in this process or
    /// later on this data): commits are ordered against repository snapshots, and their
    /// revisions recorded in repos.db before each flush.
    pub gate: Option<Arc<SnapshotGate>>,
    /// Told the DID of every `#identity` event (its key or PDS may have changed): the resolver
    /// backfill uses forgets what it knew.
    pub on_identity: Option<IdentityHook>,
    /// Told every event (before the index; subscribers see a batch at its end), for live push.
    pub push: Option<PushFeed>,
}

/// Live push's feed, as live ingest drives it: every event, then the end of each batch (when
/// subscribers may see it), and a sync with every flush. A failure is logged and counted, never
/// a reason to stop indexing.
#[derive(Clone)]
pub struct PushFeed(pub Arc<std::sync::Mutex<Feed>>);

impl std::fmt::Debug for PushFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PushFeed")
    }
}

impl PushFeed {
    fn run(&self, what: &str, step: impl FnOnce(&mut Feed) -> Result<(), PushError>) {
        let mut feed = self.0.lock().expect("push feed lock poisoned");
        match step(&mut feed) {
            Ok(()) => feed.clear_failure(),
            // The first failure in a row is logged, the rest counted (a full disk fails them all).
            Err(error) if feed.count_error() => tracing::warn!(%error, what, "live push failed; indexing goes on"),
            Err(_) => {}
        }
    }

    fn observe(&self, event: &StreamEvent) {
        self.run("observe", |feed| feed.observe(&event.operation, event.time_us, event.rev));
    }

    fn end_batch(&self) {
        self.run("end_batch", Feed::end_batch);
    }

    fn sync(&self) {
        self.run("sync", Feed::sync);
    }
}

/// What live ingest calls for an `#identity` event.
#[derive(Clone)]
pub struct IdentityHook(pub Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for IdentityHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityHook")
    }
}

impl LiveOptions {
    pub fn new(instances: Vec<Instance>, seed: u64) -> Self {
        LiveOptions {
            instances,
            compress: true,
            queue_events: 8192,
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(30),
            failures_before_switch: 3,
            rewind_us: 10_000_000,
            idle_timeout: Duration::from_secs(60),
            max_unflushed_ms: 60_000,
            seed,
            gate: None,
            on_identity: None,
            push: None,
        }
    }
}

/// Ingest counters, readable by the HTTP layer while ingest runs.
#[derive(Debug, Default)]
pub struct IngestStatus {
    /// Events applied, by `EventKind` (in `EventKind::ALL` order).
    pub events: [AtomicU64; 5],
    pub reconnects: AtomicU64,
    pub instance_switches: AtomicU64,
    pub decode_errors: AtomicU64,
    pub server_errors: AtomicU64,
    /// Index of the instance currently followed.
    pub instance: AtomicUsize,
    /// The last applied event's cursor on its instance, and its time.
    pub cursor: AtomicI64,
    pub event_time_us: AtomicI64,
    /// now - event time of the last applied event, in milliseconds.
    pub lag_ms: AtomicI64,
    pub flushes: AtomicU64,
    pub manifests: AtomicU64,
    pub connected: AtomicBool,
}

impl IngestStatus {
    pub fn applied(&self) -> u64 {
        self.events.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn events_of(&self, kind: EventKind) -> u64 {
        let slot = EventKind::ALL.iter().position(|k| *k == kind).expect("every kind is in ALL");
        self.events[slot].load(Ordering::Relaxed)
    }

    fn count(&self, event: &StreamEvent, now_ms: u64) {
        let slot = EventKind::ALL.iter().position(|k| *k == event.kind()).expect("every kind is in ALL");
        self.events[slot].fetch_add(1, Ordering::Relaxed);
        self.cursor.store(event.cursor, Ordering::Relaxed);
        self.event_time_us.store(event.time_us, Ordering::Relaxed);
        self.lag_ms.store(now_ms as i64 - event.time_us / 1_000, Ordering::Relaxed);
    }

    fn log(&self) {
        let events: Vec<String> =
            EventKind::ALL.iter().map(|k| format!("{}={}", k.name(), self.events_of(*k))).collect();
        tracing::info!(
            events = %events.join(" "),
            reconnects = self.reconnects.load(Ordering::Relaxed),
            switches = self.instance_switches.load(Ordering::Relaxed),
            decode_errors = self.decode_errors.load(Ordering::Relaxed),
            instance = self.instance.load(Ordering::Relaxed),
            cursor = self.cursor.load(Ordering::Relaxed),
            lag_ms = self.lag_ms.load(Ordering::Relaxed),
            "ingest"
        );
    }
}

/// A running live ingest: the socket task and the engine thread.
pub struct LiveIngest {
    socket: tokio::task::JoinHandle<()>,
    engine: std::thread::JoinHandle<Result<(), LiveError>>,
    stopped: tokio::sync::watch::Receiver<bool>,
    pub status: Arc<IngestStatus>,
}

impl LiveIngest {
    /// Starts following the instances from the index's durable cursor (rewound by the margin),
    /// writing through `writer` (which compacts, publishes, collects garbage and keeps the lease).
    pub fn start(
        writer: Writer,
        options: LiveOptions,
        clock: Clock,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, LiveError> {
        let index = writer.index().clone();
        if options.instances.is_empty() {
            return Err(LiveError::NoInstances);
        }
        let status = Arc::new(IngestStatus::default());
        let (events, queue) = mpsc::channel(options.queue_events.max(1));
        let resume = Resume::from_durable(index.position().cursor, options.rewind_us);
        tracing::info!(?resume, instance = %crate::base::redact::redact_url(&options.instances[0].url), "starting live ingest");
        let options = Arc::new(options);
        let socket = runtime.spawn(follow(options.clone(), resume, events, status.clone()));
        let engine_status = status.clone();
        let (stop_signal, stopped) = tokio::sync::watch::channel(false);
        let engine = std::thread::Builder::new()
            .name("ingest-engine".into())
            .spawn(move || {
                let mut engine = Engine { index, options, status: engine_status, clock, runtime, writer: Some(writer) };
                let result = engine.run(queue);
                let _ = stop_signal.send(true);
                result
            })
            .expect("spawning the ingest engine thread");
        Ok(LiveIngest { socket, engine, stopped, status })
    }

    /// True once the engine has stopped (after an error: `stop` returns it).
    pub fn is_finished(&self) -> bool {
        self.engine.is_finished()
    }

    /// Resolves once the engine has stopped (an error; or after `stop`).
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopped = self.stopped.clone();
        async move {
            let _ = stopped.wait_for(|done| *done).await;
        }
    }

    /// Stops reading, applies what is queued, flushes, finishes the writer and joins. Blocking.
    pub fn stop(self) -> Result<(), LiveError> {
        self.socket.abort();
        self.engine.join().map_err(|_| LiveError::Panicked)?
    }
}

/// The index side: applies queued events, flushes by size and age, and ticks the writer.
struct Engine {
    index: Arc<Index>,
    options: Arc<LiveOptions>,
    status: Arc<IngestStatus>,
    clock: Clock,
    runtime: tokio::runtime::Handle,
    /// Taken when the engine stops (`finish`).
    writer: Option<Writer>,
}

impl Engine {
    fn run(&mut self, mut queue: mpsc::Receiver<StreamEvent>) -> Result<(), LiveError> {
        let mut oldest_unflushed_ms: Option<u64> = None;
        loop {
            let runtime = self.runtime.clone();
            let first = runtime.block_on(async { tokio::time::timeout(ENGINE_TICK, queue.recv()).await });
            let closed = match first {
                Ok(Some(event)) => {
                    self.apply(event)?;
                    for _ in 1..ENGINE_BATCH {
                        match queue.try_recv() {
                            Ok(event) => self.apply(event)?,
                            Err(_) => break,
                        }
                    }
                    if let Some(push) = &self.options.push {
                        push.end_batch();
                    }
                    oldest_unflushed_ms.get_or_insert((self.clock)());
                    false
                }
                Ok(None) => true,
                Err(_elapsed) => false,
            };
            let now_ms = (self.clock)();
            let too_old =
                oldest_unflushed_ms.is_some_and(|t| now_ms.saturating_sub(t) >= self.options.max_unflushed_ms);
            if closed || too_old || self.index.wants_flush() {
                self.flush()?;
                oldest_unflushed_ms = None;
            }
            if closed {
                return self.finish();
            }
            self.tick()?;
        }
    }

    /// The writer's periodic work (a lost lease stops ingest: another writer owns the prefix).
    fn tick(&mut self) -> Result<(), LiveError> {
        let writer = self.writer.as_mut().expect("the writer lives until the engine stops");
        if self.runtime.block_on(writer.tick())?.is_some() {
            self.status.manifests.fetch_add(1, Ordering::Relaxed);
            self.status.log();
        }
        Ok(())
    }

    /// On a clean stop: the remaining merges, a last manifest, and the lease given back.
    fn finish(&mut self) -> Result<(), LiveError> {
        let writer = self.writer.take().expect("the engine finishes once");
        self.runtime.block_on(writer.finish())?;
        self.status.manifests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn apply(&self, event: StreamEvent) -> Result<(), LiveError> {
        self.status.count(&event, (self.clock)());
        if let (Operation::Identity { did }, Some(hook)) = (&event.operation, &self.options.on_identity) {
            (hook.0)(did);
        }
        // Subscribers see the batch at its end, once the index holds all of it.
        if let Some(push) = &self.options.push {
            push.observe(&event);
        }
        // The durable cursor is the time, valid on every instance (see the module header).
        match &self.options.gate {
            Some(gate) => {
                gate.apply_live(event).map_err(|e| LiveError::Gate(e.to_string()))?;
            }
            None => self.index.apply(&event.operation, Some(event.time_us))?,
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), LiveError> {
        match &self.options.gate {
            Some(gate) => {
                gate.flush().map_err(|e| LiveError::Gate(e.to_string()))?;
            }
            None => {
                self.index.flush()?;
            }
        }
        self.status.flushes.fetch_add(1, Ordering::Relaxed);
        if let Some(push) = &self.options.push {
            push.sync();
        }
        if let Some(writer) = &self.writer {
            writer.flushed();
        }
        Ok(())
    }
}
