//! Prometheus metrics: what the server measures (query latency, rejections, object-store
//! requests) and what the index already counts (ingest counters, tables, runs), rendered as
//! OpenMetrics text for `GET /metrics`.
//!
//! Why `prometheus-client`: its registry is a plain value, not a process-wide recorder, so every
//! router (and every test, several per process) owns its metrics; it encodes the text format
//! itself, with no HTTP exporter, background thread or clock crate; and it has no default
//! features to trim. (`metrics` + `metrics-exporter-prometheus` installs a global recorder once per
//! process, which tests that build many servers cannot share cleanly.)
//!
//! Names, all prefixed `backlinks_`. Live ingest will add `ingest_lag_seconds` (gauge) and
//! `ingest_events_total{kind}` (counter) next to the `ingest_*` ones here. Flush, compaction and
//! upload durations (microsecond counters) and bytes are here; the cache hit ratio is
//! `table_reads{source="local"}` over all `table_reads`. `corrupt_objects_total{kind, place}`
//! counts objects that failed a checksum when read (see `verify`): any rise deserves an alert.
//! `memory_<part>_bytes` gauges say what each bounded part of the index holds (`MemoryUse`).
//!
//! Invariants:
//! - Every label value comes from a fixed set (`&'static str`), so no request can grow a family.
//! - Index figures are read at scrape time from counters and the in-memory table lists: a scrape
//!   never touches SQLite or the bucket.

use crate::base::corruption::{ObjectKind, Place};
use crate::index::Index;
use crate::ingest::backfill::progress::BackfillProgress;
use crate::ingest::frames::EventKind;
use crate::ingest::live::IngestStatus;
use crate::lsm::entry::Entry;
use crate::lsm::tree::Tree;
use crate::model::ids::{AccountTally, Backlink, ForwardLink, HotLink, Revocation, Tally};
use crate::push::PushCounters;
use crate::store::object::{LocalFile, ObjectInfo, Store, StoreError};
use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The content type of the OpenMetrics text that `render` produces.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    pub endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub endpoint: &'static str,
    /// `capacity` (too many concurrent queries) or `timeout`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreRequestLabels {
    pub operation: &'static str,
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 0.5 ms to about 16 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The metrics the server updates as it runs.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    query_seconds: HistogramFamily<EndpointLabel>,
    query_rejections: Family<RejectionLabels, Counter>,
    store_requests: Family<StoreRequestLabels, Counter>,
    store_seconds: HistogramFamily<OperationLabel>,
    store_bytes: Family<OperationLabel, Counter>,
    /// Live ingest's figures, once `serve` starts following Jetstream.
    ingest: std::sync::OnceLock<Arc<IngestStatus>>,
    backfill: std::sync::OnceLock<Arc<BackfillProgress>>,
    push: std::sync::OnceLock<Arc<PushCounters>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let query_seconds: HistogramFamily<EndpointLabel> = Family::new_with_constructor(latency_histogram);
        let query_rejections: Family<RejectionLabels, Counter> = Family::default();
        let store_requests: Family<StoreRequestLabels, Counter> = Family::default();
        let store_seconds: HistogramFamily<OperationLabel> = Family::new_with_constructor(latency_histogram);
        let store_bytes: Family<OperationLabel, Counter> = Family::default();
        let mut registry = Registry::with_prefix("backlinks");
        let version = Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]);
        registry.register("build", "The running version", version);
        let help = "Time to answer a query, by endpoint";
        registry.register("http_query_duration_seconds", help, query_seconds.clone());
        let help = "Queries refused, by endpoint and reason (capacity, timeout)";
        registry.register("http_query_rejections", help, query_rejections.clone());
        let help = "Object-store requests, by operation and outcome";
        registry.register("store_requests", help, store_requests.clone());
        let help = "Object-store request time, by operation";
        registry.register("store_request_duration_seconds", help, store_seconds.clone());
        let help = "Bytes read or written by object-store requests, by operation";
        registry.register("store_bytes", help, store_bytes.clone());
        Metrics {
            registry,
            query_seconds,
            query_rejections,
            store_requests,
            store_seconds,
            store_bytes,
            ingest: std::sync::OnceLock::new(),
            backfill: std::sync::OnceLock::new(),
            push: std::sync::OnceLock::new(),
        }
    }

    pub fn observe_query(&self, endpoint: &'static str, elapsed: Duration) {
        self.query_seconds.get_or_create(&EndpointLabel { endpoint }).observe(elapsed.as_secs_f64());
    }

    pub fn count_rejection(&self, endpoint: &'static str, reason: &'static str) {
        self.query_rejections.get_or_create(&RejectionLabels { endpoint, reason }).inc();
    }

    fn observe_store(&self, operation: &'static str, status: &'static str, elapsed: Duration, bytes: u64) {
        self.store_requests.get_or_create(&StoreRequestLabels { operation, status }).inc();
        self.store_seconds.get_or_create(&OperationLabel { operation }).observe(elapsed.as_secs_f64());
        self.store_bytes.get_or_create(&OperationLabel { operation }).inc_by(bytes);
    }

    /// The OpenMetrics text of these metrics and of `index`'s figures.
    /// Exports live ingest's figures from now on (called once, when ingest starts).
    pub fn attach_ingest(&self, status: Arc<IngestStatus>) {
        let _ = self.ingest.set(status);
    }

    /// Exports backfill's figures from now on (called once, when a backfill starts).
    pub fn attach_backfill(&self, progress: Arc<BackfillProgress>) {
        let _ = self.backfill.set(progress);
    }

    /// Exports live push's figures from now on (called once, when push starts).
    pub fn attach_push(&self, counters: Arc<PushCounters>) {
        let _ = self.push.set(counters);
    }

    pub fn render(&self, index: &Index) -> String {
        let mut out = String::new();
        let mut snapshot = index_registry(index);
        if let Some(status) = self.ingest.get() {
            register_ingest(&mut snapshot, status);
        }
        if let Some(progress) = self.backfill.get() {
            register_backfill(&mut snapshot, progress);
        }
        if let Some(counters) = self.push.get() {
            register_push(&mut snapshot, counters);
        }
        // Writing into a String cannot fail; the encoder only reports fmt::Error from its writer.
        encode_registry(&mut out, &self.registry).expect("encoding into a String");
        encode_registry(&mut out, &snapshot).expect("encoding into a String");
        encode_eof(&mut out).expect("encoding into a String");
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TreeLabel {
    tree: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    tree: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

fn counter(value: u64) -> Counter {
    let counter = Counter::default();
    counter.inc_by(value);
    counter
}

fn gauge(value: u64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
    gauge
}

/// A registry holding the index's figures as of now (built per scrape).
fn index_registry(index: &Index) -> Registry {
    let mut registry = Registry::with_prefix("backlinks");
    let counters = &index.counters;
    let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    registry.register("ingest_operations", "Operations applied", counter(read(&counters.operations)));
    registry.register("ingest_backlinks", "Backlink entries written", counter(read(&counters.backlinks)));
    registry.register("ingest_revocations", "Revocations written", counter(read(&counters.revocations)));
    registry.register("ingest_flushes", "Memtable flushes", counter(read(&counters.flushes)));
    for (name, help, value) in [
        ("flush_duration_microseconds", "Time spent flushing memtables", &counters.flush_micros),
        (
            "flush_tally_duration_microseconds",
            "Of the flushes' time, keeping hot targets' tallies",
            &counters.tally_micros,
        ),
        (
            "flush_tally_record_hot_link_reads_microseconds",
            "Of the tallies' time, reading the installed hot links of single records",
            &counters.tally_reads.hot_link_keys_micros,
        ),
        (
            "flush_tally_account_hot_link_reads_microseconds",
            "Of the tallies' time, reading the installed hot links of whole accounts",
            &counters.tally_reads.hot_link_accounts_micros,
        ),
        (
            "flush_tally_revocation_reads_microseconds",
            "Of the tallies' time, reading the revocations of installed hot links",
            &counters.tally_reads.revocations_micros,
        ),
        (
            "flush_tally_account_tally_reads_microseconds",
            "Of the tallies' time, reading account tallies",
            &counters.tally_reads.account_tallies_micros,
        ),
        (
            "flush_tally_promotion_microseconds",
            "Of the tallies' time, checking and promoting targets",
            &counters.tally_reads.promotions_micros,
        ),
        ("flush_bytes", "Bytes of table files written by flushes", &counters.flush_bytes),
        ("compactions", "Merges of runs", &counters.compactions),
        ("compaction_duration_microseconds", "Time spent merging runs", &counters.compaction_micros),
        ("compaction_read_bytes", "Compressed bytes merges read", &counters.compaction_bytes_in),
        ("compaction_written_bytes", "Bytes of table files merges wrote", &counters.compaction_bytes_out),
        ("upload_duration_microseconds", "Time spent uploading table files", &counters.upload_micros),
        ("upload_bytes", "Bytes of table files uploaded", &counters.upload_bytes),
        (
            "retired_files_kept_for_publish",
            "Retired tables whose local files waited for a publish in flight",
            &counters.retired_files_kept_for_publish,
        ),
        ("cache_evicted_bytes", "Bytes of local table data evicted by the cache budget", &counters.cache_evicted_bytes),
    ] {
        registry.register(name, help, counter(read(value)));
    }
    let reads: Family<SourceLabel, Counter> = Family::default();
    reads
        .get_or_create(&SourceLabel { source: "local" })
        .inc_by(crate::lsm::handle::LOCAL_READS.load(Ordering::Relaxed));
    reads
        .get_or_create(&SourceLabel { source: "bucket" })
        .inc_by(crate::lsm::handle::BUCKET_READS.load(Ordering::Relaxed));
    registry.register(
        "table_reads",
        "Ranged reads of table data, by where they were served from (cache hits: local)",
        reads,
    );
    registry.register("cache_bytes", "Bytes of table data cached on local disk", gauge(index.cached_bytes()));
    for (part, bytes) in index.memory_use().parts() {
        registry.register(
            format!("memory_{part}_bytes"),
            format!("Bytes of memory held by the {part}"),
            gauge(bytes as u64),
        );
    }
    let frame_hits: Family<TreeLabel, Counter> = Family::default();
    let frame_misses: Family<TreeLabel, Counter> = Family::default();
    let frame_bytes: Family<TreeLabel, Gauge> = Family::default();
    let meta_hits: Family<TreeLabel, Counter> = Family::default();
    let meta_misses: Family<TreeLabel, Counter> = Family::default();
    let meta_bytes: Family<TreeLabel, Gauge> = Family::default();
    let trees = [
        cache_figures(&index.links),
        cache_figures(&index.thresholds),
        cache_figures(&index.forward),
        cache_figures(&index.hot),
        cache_figures(&index.tallies),
        cache_figures(&index.account_tallies),
    ];
    for (tree, frames, metas) in trees {
        let label = TreeLabel { tree };
        frame_hits.get_or_create(&label).inc_by(frames.0);
        frame_misses.get_or_create(&label).inc_by(frames.1);
        frame_bytes.get_or_create(&label).set(frames.2);
        meta_hits.get_or_create(&label).inc_by(metas.0);
        meta_misses.get_or_create(&label).inc_by(metas.1);
        meta_bytes.get_or_create(&label).set(metas.2);
    }
    registry.register("frame_cache_hits", "Frame reads served decoded from memory, by tree", frame_hits);
    registry.register("frame_cache_misses", "Frame reads that had to read and decode, by tree", frame_misses);
    registry.register("frame_cache_bytes", "Bytes of decoded frames held in memory, by tree", frame_bytes);
    registry.register("meta_cache_hits", "Meta page reads of queries served from memory, by tree", meta_hits);
    registry.register("meta_cache_misses", "Meta page reads of queries from the local meta file, by tree", meta_misses);
    registry.register("meta_cache_bytes", "Bytes of meta pages held in memory, by tree", meta_bytes);
    let skipped: Family<ReasonLabel, Counter> = Family::default();
    for (reason, value) in [
        ("collection_only", &counters.links_collection_only),
        ("handle_authority", &counters.links_handle_authority),
        ("over_limit", &counters.links_over_limit),
    ] {
        skipped.get_or_create(&ReasonLabel { reason }).inc_by(read(value));
    }
    registry.register("extract_links_skipped", "Link-like strings not indexed, by reason", skipped);
    registry.register(
        "corrupt_objects",
        "Objects that failed a checksum or format check when read, by kind and place (never served)",
        corrupt_objects(),
    );
    let position = index.position();
    registry.register("ingest_clock", "The ingest clock (stamp of the last operation)", gauge(position.clock));
    let cursor = position.cursor.and_then(|c| u64::try_from(c).ok()).unwrap_or(0);
    registry.register("ingest_cursor_microseconds", "Time of the last ingested event (0: none)", gauge(cursor));
    register_tree_figures(&mut registry, index);
    registry
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CorruptionLabels {
    kind: &'static str,
    place: &'static str,
}

/// Every (kind, place) pair, zeros included, so an alert can watch the series from the start.
fn corrupt_objects() -> Family<CorruptionLabels, Counter> {
    let family: Family<CorruptionLabels, Counter> = Family::default();
    for kind in ObjectKind::ALL {
        for place in Place::ALL {
            let labels = CorruptionLabels { kind: kind.label(), place: place.label() };
            family.get_or_create(&labels).inc_by(crate::base::corruption::corrupt_objects(kind, place));
        }
    }
    family
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// Live ingest: events by kind, lag, cursor, reconnects, switches, errors.
fn register_ingest(registry: &mut Registry, status: &IngestStatus) {
    let events: Family<KindLabel, Counter> = Family::default();
    for kind in EventKind::ALL {
        events.get_or_create(&KindLabel { kind: kind.name() }).inc_by(status.events_of(kind));
    }
    registry.register("ingest_events", "Live events applied, by kind (rate() gives events/s)", events);
    let load = |v: &std::sync::atomic::AtomicI64| u64::try_from(v.load(Ordering::Relaxed)).unwrap_or(0);
    registry.register(
        "ingest_lag_milliseconds",
        "Now minus the time of the last applied event",
        gauge(load(&status.lag_ms)),
    );
    registry.register(
        "ingest_stream_cursor",
        "Cursor of the last applied event on its instance",
        gauge(load(&status.cursor)),
    );
    let connected = u64::from(status.connected.load(Ordering::Relaxed));
    registry.register("ingest_connected", "1 while a Jetstream connection is open", gauge(connected));
    for (name, help, value) in [
        ("ingest_reconnects", "Jetstream reconnections", &status.reconnects),
        ("ingest_instance_switches", "Fail-overs to another Jetstream instance", &status.instance_switches),
        ("ingest_decode_errors", "Frames that could not be decoded (skipped)", &status.decode_errors),
        ("ingest_server_errors", "XRPC error frames from Jetstream", &status.server_errors),
    ] {
        registry.register(name, help, counter(value.load(Ordering::Relaxed)));
    }
}

fn register_push(registry: &mut Registry, counters: &PushCounters) {
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    registry.register("push_subscribers", "Live push subscribers connected", gauge(load(&counters.subscribers)));
    let cuts: Family<ReasonLabel, Counter> = Family::default();
    for (reason, value) in [
        ("too_slow", &counters.cut_too_slow),
        ("behind", &counters.cut_behind),
        ("error", &counters.cut_error),
        ("refused", &counters.refused),
    ] {
        cuts.get_or_create(&ReasonLabel { reason }).inc_by(load(value));
    }
    let help = "Subscribers cut off or refused, by reason (too_slow: queue full; behind: past the log; refused: over the limit)";
    registry.register("push_drops", help, cuts);
    for (name, help, value) in [
        ("push_events_sent", "Frames sent to subscribers", &counters.events_sent),
        ("push_log_entries", "Change-log entries written", &counters.entries),
        ("push_log_events", "Events in the change log's entries", &counters.events_logged),
        ("push_replays_skipped", "Events the stream sent again and the feed recognised", &counters.replays_skipped),
        (
            "push_unrouted_deletes",
            "Deletes of records older than the log's window (not pushed)",
            &counters.unrouted_deletes,
        ),
        ("push_bad_lookups", "Recent-links slots that led nowhere", &counters.bad_lookups),
        (
            "push_recent_displaced",
            "Recent-links slots given up to newer records in a full table",
            &counters.recent_displaced,
        ),
        ("push_errors", "Failed feed steps (indexing went on)", &counters.errors),
        ("push_filter_updates", "Filter updates from subscribers", &counters.filter_updates),
    ] {
        registry.register(name, help, counter(load(value)));
    }
}

fn register_backfill(registry: &mut Registry, progress: &BackfillProgress) {
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    registry.register(
        "backfill_repos_known",
        "Repositories in repos.db, any status",
        gauge(load(&progress.repos_known)),
    );
    registry.register(
        "backfill_repos_settled",
        "Repositories finished, any way, this run or before",
        gauge(progress.settled()),
    );
    for (name, help, value) in [
        ("backfill_repos_indexed", "Repository snapshots written by this run", &progress.repos_done),
        (
            "backfill_repos_other",
            "Repositories settled without a snapshot (unavailable, failed, unchanged)",
            &progress.repos_other,
        ),
        ("backfill_records", "Records read from snapshots", &progress.records),
        ("backfill_links", "Backlinks written from snapshots (rate() gives links/s)", &progress.links),
        ("backfill_bytes", "CAR bytes read", &progress.bytes),
        ("backfill_retries", "Fetches and listings retried", &progress.retries),
        ("backfill_rate_limited", "HTTP 429 answers", &progress.rate_limited),
        ("backfill_stale_snapshots", "Snapshots older than live commits, fetched again", &progress.stale),
        ("backfill_repos_verified", "Snapshots whose commit signature verified", &progress.verified),
        (
            "backfill_repos_unverified",
            "CAR files indexed with CIDs and structure checked, no key to check the signature",
            &progress.unverified,
        ),
        ("backfill_host_pauses", "Times a host's circuit breaker paused it", &progress.host_pauses),
        ("backfill_listings_capped", "Listings cut off at a per-host cap", &progress.listings_capped),
    ] {
        registry.register(name, help, counter(load(value)));
    }
    let rejected: Family<ReasonLabel, Counter> = Family::default();
    for (reason, count) in progress.rejected() {
        rejected.get_or_create(&ReasonLabel { reason }).inc_by(count);
    }
    registry.register(
        "backfill_repos_rejected",
        "Repositories that failed verification, by the check that failed",
        rejected,
    );
}

fn register_tree_figures(registry: &mut Registry, index: &Index) {
    let tables: Family<TreeLabel, Gauge> = Family::default();
    let runs: Family<RunLabels, Gauge> = Family::default();
    let entries: Family<TreeLabel, Gauge> = Family::default();
    let bytes: Family<TreeLabel, Gauge> = Family::default();
    let memtable: Family<TreeLabel, Gauge> = Family::default();
    let add = |tree: &'static str, records: Vec<crate::lsm::record::TableRecord>, memtable_bytes: usize| {
        let label = TreeLabel { tree };
        tables.get_or_create(&label).set(records.len() as i64);
        entries.get_or_create(&label).set(records.iter().map(|r| r.entries as i64).sum());
        bytes.get_or_create(&label).set(records.iter().map(|r| (r.data_len + r.meta_len) as i64).sum());
        memtable.get_or_create(&label).set(memtable_bytes as i64);
        for kind in [crate::lsm::record::RunKind::Delta, crate::lsm::record::RunKind::Compacted] {
            let distinct: HashSet<&str> =
                records.iter().filter(|r| r.run_kind == kind).map(|r| r.run_id.as_str()).collect();
            runs.get_or_create(&RunLabels { tree, kind: kind.as_str() }).set(distinct.len() as i64);
        }
    };
    add(Backlink::TREE.name(), records_of(&index.links), index.links.memtable_bytes());
    add(Revocation::TREE.name(), records_of(&index.thresholds), index.thresholds.memtable_bytes());
    add(ForwardLink::TREE.name(), records_of(&index.forward), index.forward.memtable_bytes());
    add(HotLink::TREE.name(), records_of(&index.hot), 0);
    add(Tally::TREE.name(), records_of(&index.tallies), 0);
    add(AccountTally::TREE.name(), records_of(&index.account_tallies), 0);
    registry.register("tables", "Tables, by tree", tables);
    registry.register("runs", "Runs, by tree and kind", runs);
    registry.register("table_entries", "Entries in tables, by tree", entries);
    registry.register("table_bytes", "Bytes of table files (data and meta), by tree", bytes);
    registry.register("memtable_bytes", "Bytes in the active memtable, by tree", memtable);
}

fn records_of<E: Entry>(tree: &Tree<E>) -> Vec<crate::lsm::record::TableRecord> {
    tree.tables().iter().map(|table| table.record.clone()).collect()
}

/// A store that counts every request of the store it wraps, by operation and outcome.
#[derive(Debug)]
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    fn record<T>(&self, operation: &'static str, started: Instant, result: &Result<T, StoreError>, bytes: u64) {
        self.metrics.observe_store(operation, status_of(result), started.elapsed(), bytes);
    }
}

/// The outcome label of a store request.
fn status_of<T>(result: &Result<T, StoreError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(StoreError::NotFound { .. }) => "not_found",
        Err(StoreError::InvalidKey { .. }) => "invalid_key",
        Err(StoreError::ShortRead { .. }) => "short_read",
        Err(e) if e.is_retryable() => "transient_error",
        Err(_) => "error",
    }
}

#[async_trait::async_trait]
impl Store for MeteredStore {
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        let (started, len) = (Instant::now(), body.len() as u64);
        let result = self.inner.put(key, body).await;
        self.record("put", started, &result, if result.is_ok() { len } else { 0 });
        result
    }

    async fn put_file(&self, key: &str, file: &LocalFile) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.inner.put_file(key, file).await;
        self.record("put", started, &result, if result.is_ok() { file.len } else { 0 });
        result
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let started = Instant::now();
        let result = self.inner.get(key).await;
        self.record("get", started, &result, result.as_ref().map_or(0, |b| b.len() as u64));
        result
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let started = Instant::now();
        let result = self.inner.get_range(key, offset, len).await;
        self.record("get_range", started, &result, result.as_ref().map_or(0, |b| b.len() as u64));
        result
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let started = Instant::now();
        let result = self.inner.list(prefix).await;
        self.record("list", started, &result, 0);
        result
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.inner.delete(key).await;
        self.record("delete", started, &result, 0);
        result
    }
}

/// (hits, misses, bytes) of a cache.
type CacheFigures = (u64, u64, i64);

/// A tree's name and the figures of its frame cache and its meta cache.
fn cache_figures<E: Entry>(tree: &Tree<E>) -> (&'static str, CacheFigures, CacheFigures) {
    let figures = |(hits, misses): (u64, u64), bytes: usize| (hits, misses, bytes as i64);
    (
        E::TREE.name(),
        figures(tree.frame_cache.hits_and_misses(), tree.frame_cache.bytes()),
        figures(tree.meta_cache.hits_and_misses(), tree.meta_cache.bytes()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexOptions;
    use crate::model::operation::{Operation, RecordOp, RecordRef};
    use crate::store::dir::DirStore;

    /// The value of the sample line `name{labels} value`, exactly as rendered.
    fn sample(text: &str, series: &str) -> Option<String> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ').map(str::to_string))
    }

    #[test]
    fn live_ingest_figures_appear_once_attached() {
        let dir = tempfile::tempdir().unwrap();
        let index =
            Index::open(dir.path(), Arc::new(DirStore::new(dir.path().join("bucket"))), IndexOptions::default(), 1)
                .unwrap();
        let metrics = Metrics::new();
        assert!(sample(&metrics.render(&index), "backlinks_ingest_lag_milliseconds").is_none(), "no ingest, no lag");
        let status = Arc::new(IngestStatus::default());
        status.events[0].store(3, Ordering::Relaxed);
        status.lag_ms.store(1500, Ordering::Relaxed);
        status.reconnects.store(2, Ordering::Relaxed);
        metrics.attach_ingest(status);
        let text = metrics.render(&index);
        assert_eq!(sample(&text, "backlinks_ingest_events_total{kind=\"create\"}").as_deref(), Some("3"), "{text}");
        assert_eq!(sample(&text, "backlinks_ingest_events_total{kind=\"delete\"}").as_deref(), Some("0"));
        assert_eq!(sample(&text, "backlinks_ingest_lag_milliseconds").as_deref(), Some("1500"));
        assert_eq!(sample(&text, "backlinks_ingest_reconnects_total").as_deref(), Some("2"));
    }

    #[tokio::test]
    async fn store_requests_are_counted_by_operation_and_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let store = MeteredStore::new(Arc::new(DirStore::new(dir.path().join("bucket"))), metrics.clone());
        store.put("a/b", Bytes::from_static(b"hello")).await.unwrap();
        assert_eq!(store.get("a/b").await.unwrap(), Bytes::from_static(b"hello"));
        assert!(store.get("missing").await.is_err());
        assert_eq!(store.get_range("a/b", 1, 3).await.unwrap(), Bytes::from_static(b"ell"));
        let index = Index::open(&dir.path().join("data"), Arc::new(store), IndexOptions::default(), 1).unwrap();
        let text = metrics.render(&index);
        let at = |series: &str| sample(&text, series);
        assert_eq!(at("backlinks_store_requests_total{operation=\"put\",status=\"ok\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_store_requests_total{operation=\"get\",status=\"ok\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_store_requests_total{operation=\"get\",status=\"not_found\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_store_bytes_total{operation=\"get_range\"}").as_deref(), Some("3"));
        assert_eq!(at("backlinks_store_bytes_total{operation=\"put\"}").as_deref(), Some("5"));
        assert_eq!(at("backlinks_store_request_duration_seconds_count{operation=\"get\"}").as_deref(), Some("2"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[tokio::test]
    async fn index_figures_follow_the_write_path() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store = Arc::new(DirStore::new(dir.path().join("bucket")));
        let index = Index::open(&dir.path().join("data"), store, IndexOptions::default(), 1).unwrap();
        let record = serde_json::json!({"subject": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "other": "at://x.example"});
        let record_ref = RecordRef {
            did: "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb".into(),
            collection: "a.b.c".into(),
            rkey: "self".into(),
        };
        index.apply(&Operation::Create(RecordOp { record_ref: record_ref.clone(), record }), Some(42)).unwrap();
        // Another record: a flush writes no backlink that a revocation of the same flush kills.
        index.apply(&Operation::Delete(RecordRef { rkey: "other".into(), ..record_ref }), Some(43)).unwrap();
        index.flush().unwrap();
        metrics.observe_query("listBacklinks", Duration::from_millis(3));
        metrics.count_rejection("listBacklinks", "capacity");
        let text = metrics.render(&index);
        let at = |series: &str| sample(&text, series);
        assert_eq!(at("backlinks_ingest_operations_total").as_deref(), Some("2"));
        assert_eq!(at("backlinks_ingest_backlinks_total").as_deref(), Some("1"));
        assert_eq!(at("backlinks_ingest_revocations_total").as_deref(), Some("1"));
        assert_eq!(at("backlinks_ingest_flushes_total").as_deref(), Some("1"));
        assert_eq!(at("backlinks_extract_links_skipped_total{reason=\"handle_authority\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_ingest_clock").as_deref(), Some("2"));
        assert_eq!(at("backlinks_ingest_cursor_microseconds").as_deref(), Some("43"));
        assert_eq!(at("backlinks_tables{tree=\"links\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_tables{tree=\"thresholds\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_runs{tree=\"links\",kind=\"delta\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_runs{tree=\"links\",kind=\"compacted\"}").as_deref(), Some("0"));
        assert_eq!(at("backlinks_table_entries{tree=\"links\"}").as_deref(), Some("1"));
        assert_eq!(at("backlinks_http_query_duration_seconds_count{endpoint=\"listBacklinks\"}").as_deref(), Some("1"));
        let rejected = "backlinks_http_query_rejections_total{endpoint=\"listBacklinks\",reason=\"capacity\"}";
        assert_eq!(at(rejected).as_deref(), Some("1"));
        let build = format!("backlinks_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        assert!(text.contains(&build), "{text}");
    }
}
