//! Configuration: defaults, then the config file, then `BACKLINKS_*` environment variables and
//! flags (clap reads both; flags win).
//!
//! Invariants:
//! - Every flag has a config-file key of the same name (with `_` for `-`) and an environment
//!   variable `BACKLINKS_<NAME>`.
//! - Unknown config-file keys are an error, so a typo never silently falls back to a default.

use crate::base::redact::redact_url;
use crate::index::IndexOptions;
use crate::ingest::backfill::BackfillOptions;
use crate::store::s3::{S3ConfigKeys, Secret};
use crate::writer::WriterOptions;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// v2 (`subscribeEvents`) first, then the v1 `/subscribe` wire of the same hosts.
pub const DEFAULT_JETSTREAM: &[&str] = &[
    "wss://jetstream1.us-east.bsky.network/xrpc/network.bsky.jetstream.subscribeEvents",
    "wss://jetstream2.us-east.bsky.network/xrpc/network.bsky.jetstream.subscribeEvents",
    "wss://jetstream1.us-east.bsky.network/subscribe",
    "wss://jetstream2.us-east.bsky.network/subscribe",
];

/// The config file (TOML). Every field is optional.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub store: Option<String>,
    pub listen: Option<String>,
    pub jetstream: Option<Vec<String>>,
    pub no_ingest: Option<bool>,
    pub read_only: Option<bool>,
    pub memtable_bytes: Option<usize>,
    /// Live ingest flushes when its oldest unflushed event is this many seconds old (default 60).
    pub max_unflushed_secs: Option<u64>,
    /// Live ingest and backfill publish a manifest (uploading new tables) and collect garbage
    /// this often, in seconds (default 30, at most 30).
    pub publish_interval_secs: Option<u64>,
    /// Every writer (serve, import, backfill) deletes a retired table this many seconds after its
    /// retirement (default 600): readers holding an older manifest have that long to finish.
    pub gc_grace_secs: Option<u64>,
    pub frame_bytes: Option<usize>,
    pub zstd_level: Option<i32>,
    pub filter_fpr: Option<f64>,
    pub outline_cache_entries: Option<usize>,
    /// Bytes of outlines.db read through a memory map (default 0: none).
    pub outline_map_bytes: Option<u64>,
    /// Local bytes of table data kept as a cache; colder uploaded tables are read by range.
    pub cache_bytes: Option<u64>,
    /// Memory for decoded frames, all trees together (default 64 MiB): a warm query's frames
    /// skip the read and the decode (a small key's frame is kept as that key's part of it).
    pub frame_cache_bytes: Option<usize>,
    /// Memory for the pages of the tables' metas (filter pages, frame-index chunks, decoded
    /// column models), all trees together (default 128 MiB): all a meta costs in memory beyond a
    /// small directory per table.
    pub meta_cache_bytes: Option<usize>,
    /// A target with at least this many entries gets its counts kept by every flush, exact
    /// without reading its links (default 16384).
    pub hot_target_entries: Option<u64>,
    /// Runs of one size tier that trigger a compaction (and that it merges).
    pub compaction_fan_in: Option<usize>,
    /// Compressed bytes per shard table of a compacted run.
    pub compaction_shard_bytes: Option<u64>,
    /// Input bytes a compaction reads per second at most (pacing).
    pub compaction_bytes_per_sec: Option<u64>,
    /// Most revocations a merge holds (the newest; about 64 bytes each while it scans) to drop
    /// killed backlinks and settle stamps.
    pub compaction_max_revocations: Option<usize>,
    /// Queries served at once; one more gets an immediate 503 (serve).
    pub max_concurrent_queries: Option<usize>,
    /// A query running longer than this many milliseconds is stopped with a 503 (serve).
    pub request_timeout_ms: Option<u64>,
    /// HTTP connections open at once; more wait in the accept backlog (serve, default 1024).
    pub max_connections: Option<usize>,
    /// HTTP connections one IP address may hold; more are closed at once (serve, default 256;
    /// behind a reverse proxy, raise it to `max_connections`).
    pub max_connections_per_address: Option<usize>,
    /// Seconds a client has to send a whole request head (serve, default 10).
    pub header_read_timeout_secs: Option<u64>,
    /// Threads serving HTTP connections (serve, default: one per core).
    pub http_threads: Option<usize>,
    /// `Cache-Control: max-age` of successful query answers, in seconds (serve).
    pub cache_max_age_secs: Option<u64>,
    /// Entries countBacklinks reads before it answers with an estimate (serve).
    pub count_exact_limit: Option<usize>,
    /// Live push (subscribeBacklinks, /subscribe) off: no change log is written (serve).
    pub no_push: Option<bool>,
    /// Hours of changes the push log keeps for cursor replay (serve, default 26).
    pub push_retain_hours: Option<u64>,
    /// Most bytes the push log may hold, whatever `push_retain_hours` asks (serve, default 64 GiB).
    pub push_log_max_bytes: Option<u64>,
    /// Subscribers at once (serve, default 1000).
    pub push_max_subscribers: Option<usize>,
    /// Events queued for one subscriber before it is cut off as too slow (serve, default 1024).
    pub push_buffer_events: Option<usize>,
    /// Size of the recent-links table that routes deletes and updates (serve, default 2 GiB).
    pub push_recent_bytes: Option<u64>,
    /// S3 endpoint URL (default: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, else AWS itself).
    pub s3_endpoint: Option<String>,
    /// S3 region (default: `AWS_REGION`, `AWS_DEFAULT_REGION`, else us-east-1).
    pub s3_region: Option<String>,
    /// S3 credentials; both or neither (default: the AWS credential chain).
    pub s3_access_key_id: Option<String>,
    /// Redacted in `Debug`.
    pub s3_secret_access_key: Option<Secret>,
    /// Path-style addressing (default: on with a custom endpoint).
    pub s3_force_path_style: Option<bool>,
    /// Backfill sources (`backfill --relay/--pds/--repo/--car`; `serve` runs the network ones
    /// next to live ingest).
    pub backfill_relay: Option<Vec<String>>,
    pub backfill_pds: Option<Vec<String>>,
    pub backfill_repo: Option<Vec<String>>,
    pub backfill_car: Option<Vec<PathBuf>>,
    /// Repositories fetched at once (default 8).
    pub backfill_concurrency: Option<usize>,
    /// Requests started per second on one PDS (default 5).
    pub backfill_per_host_per_second: Option<f64>,
    /// Attempts before a repository that keeps failing is recorded as failed (default 6).
    pub backfill_max_attempts: Option<u32>,
    /// Largest repository CAR fetched, in bytes (default 512 MiB).
    pub backfill_max_repo_bytes: Option<u64>,
    /// Deadline of one repository download, in seconds (default 300).
    pub backfill_fetch_timeout_secs: Option<u64>,
    /// Slowest average transfer accepted for a download, in bytes per second, after a 10 s grace
    /// (default 16384).
    pub backfill_min_bytes_per_sec: Option<u64>,
    /// Bytes of repository CARs held in memory at once across all downloads (default 256 MiB);
    /// the rest waits in unnamed files in the data directory.
    pub backfill_car_memory_budget: Option<u64>,
    /// Downloads from one PDS at once (default 4).
    pub backfill_host_fetches: Option<usize>,
    /// First pause of a host that keeps failing, in seconds (default 300; doubles each time).
    pub backfill_host_pause_secs: Option<u64>,
    /// Listing pages, and listed repositories, one host (or relay) may give (default 20000 and
    /// 5000000).
    pub backfill_max_pages_per_host: Option<u64>,
    pub backfill_max_dids_per_host: Option<u64>,
    /// Seconds before a rejected repository (one that failed verification) is fetched again by
    /// a later run (default 86400; doubles with each rejection).
    pub backfill_reject_retry_secs: Option<u64>,
    /// Private, loopback or link-local addresses backfill and DID resolution may reach anyway:
    /// `IP` or `IP:port` entries, for local setups and tests (default none: public addresses only).
    pub backfill_allow_private: Option<Vec<String>>,
    /// DID documents (files) to verify `--car` files' signatures with, offline.
    pub backfill_did_doc: Option<Vec<PathBuf>>,
    /// The PLC directory resolving `did:plc` identities (default https://plc.directory).
    pub plc_url: Option<String>,
    /// Keep a local copy of the PLC directory (`plc.db`) from its bulk export while backfilling
    /// (default: on when a relay is backfilled).
    pub plc_sync: Option<bool>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl FileConfig {
    /// The config file (if any) with `BACKLINKS_<KEY>` environment variables over its keys.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(path, &|name| std::env::var(name).ok())
    }

    /// `load` with the environment injected (tests pass a map).
    pub fn load_with_env(path: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut table = load_table(path)?;
        apply_env(&mut table, env);
        let origin = path.map_or_else(|| PathBuf::from("<environment>"), Path::to_path_buf);
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse { path: origin, message: describe(&e, None) })
    }

    /// How a writer publishes and collects garbage, from the file (defaults for what it leaves
    /// out).
    pub fn writer_options(&self) -> WriterOptions {
        let mut options = WriterOptions::default();
        if let Some(secs) = self.publish_interval_secs {
            options.publish_every_ms = Some(secs.clamp(1, 30) * 1_000);
        }
        if let Some(secs) = self.gc_grace_secs {
            options.gc_grace_ms = secs.saturating_mul(1_000);
        }
        options
    }

    /// Engine options from the file, with defaults for what it leaves out.
    pub fn index_options(&self) -> Result<IndexOptions, ConfigError> {
        let mut options = IndexOptions::default();
        if let Some(bytes) = self.memtable_bytes {
            options.memtable_bytes = bounded("memtable_bytes", bytes, 1 << 16, 4 << 30)?;
        }
        if let Some(bytes) = self.frame_bytes {
            options.table.frame_bytes = bounded("frame_bytes", bytes, 4 << 10, 4 << 20)?;
        }
        if let Some(level) = self.zstd_level {
            options.table.zstd_level = bounded("zstd_level", level as usize, 1, 19)? as i32;
        }
        if let Some(fpr) = self.filter_fpr {
            if !(1e-6..=0.5).contains(&fpr) {
                return Err(ConfigError::Invalid(format!("filter_fpr must be between 1e-6 and 0.5, got {fpr}")));
            }
            options.table.filter_fpr = fpr;
        }
        if let Some(entries) = self.outline_cache_entries {
            options.outline_cache_entries = bounded("outline_cache_entries", entries, 1024, 1 << 30)?;
        }
        if let Some(bytes) = self.outline_map_bytes {
            options.outline_map_bytes = bounded("outline_map_bytes", bytes, 0, 1 << 40)?;
        }
        if let Some(bytes) = self.cache_bytes {
            options.cache_bytes = bytes;
        }
        if let Some(bytes) = self.frame_cache_bytes {
            options.frame_cache_bytes = bounded("frame_cache_bytes", bytes, 0, 16 << 30)?;
        }
        if let Some(bytes) = self.meta_cache_bytes {
            options.meta_cache_bytes = bounded("meta_cache_bytes", bytes, 0, 16 << 30)?;
        }
        if let Some(entries) = self.hot_target_entries {
            options.hot_target_entries = bounded("hot_target_entries", entries, 64, 1 << 40)?;
        }
        if let Some(fan_in) = self.compaction_fan_in {
            options.compaction.fan_in = bounded("compaction_fan_in", fan_in, 2, 64)?;
        }
        if let Some(bytes) = self.compaction_shard_bytes {
            options.compaction.shard_bytes =
                bounded("compaction_shard_bytes", bytes as usize, 1 << 20, 4 << 30)? as u64;
        }
        if let Some(rate) = self.compaction_bytes_per_sec {
            options.compaction.max_bytes_per_sec =
                Some(bounded("compaction_bytes_per_sec", rate as usize, 1 << 20, 1 << 40)? as u64);
        }
        if let Some(revocations) = self.compaction_max_revocations {
            options.compaction.max_thresholds = bounded("compaction_max_revocations", revocations, 0, 1 << 26)?;
        }
        Ok(options)
    }

    /// Live push settings from the file, with defaults for what it leaves out.
    pub fn push_settings(&self) -> Result<PushSettings, ConfigError> {
        let mut settings = PushSettings::default();
        if let Some(hours) = self.push_retain_hours {
            settings.retain_hours = bounded("push_retain_hours", hours, 1, 24 * 90)?;
        }
        if let Some(bytes) = self.push_log_max_bytes {
            settings.log_max_bytes = bounded("push_log_max_bytes", bytes, 64 << 20, 1 << 44)?;
        }
        if let Some(n) = self.push_max_subscribers {
            settings.max_subscribers = bounded("push_max_subscribers", n, 1, 1 << 20)?;
        }
        if let Some(n) = self.push_buffer_events {
            settings.buffer_events = bounded("push_buffer_events", n, 16, 1 << 20)?;
        }
        if let Some(bytes) = self.push_recent_bytes {
            settings.recent_bytes = bounded("push_recent_bytes", bytes, 1 << 20, 1 << 40)?;
        }
        settings.enabled = self.no_push != Some(true);
        Ok(settings)
    }

    /// Backfill options from the file, with defaults for what it leaves out.
    pub fn backfill_options(&self) -> Result<BackfillOptions, ConfigError> {
        let mut options = BackfillOptions::default();
        if let Some(n) = self.backfill_concurrency {
            options.concurrency = bounded("backfill_concurrency", n, 1, 256)?;
        }
        if let Some(rate) = self.backfill_per_host_per_second {
            if !(0.01..=10_000.0).contains(&rate) {
                return Err(ConfigError::Invalid(format!(
                    "backfill_per_host_per_second must be between 0.01 and 10000, got {rate}"
                )));
            }
            options.per_host_per_second = rate;
        }
        if let Some(n) = self.backfill_max_attempts {
            options.max_attempts = bounded("backfill_max_attempts", n as usize, 1, 100)? as u32;
        }
        if let Some(bytes) = self.backfill_max_repo_bytes {
            options.car.max_bytes = bounded("backfill_max_repo_bytes", bytes as usize, 1 << 10, 16 << 30)? as u64;
        }
        if let Some(secs) = self.backfill_fetch_timeout_secs {
            options.fetch_timeout =
                Duration::from_secs(bounded("backfill_fetch_timeout_secs", secs as usize, 1, 86_400)? as u64);
        }
        if let Some(rate) = self.backfill_min_bytes_per_sec {
            options.min_bytes_per_sec = bounded("backfill_min_bytes_per_sec", rate as usize, 0, 1 << 30)? as u64;
        }
        if let Some(bytes) = self.backfill_car_memory_budget {
            options.car_memory_budget = bounded("backfill_car_memory_budget", bytes as usize, 0, 64 << 30)?;
            options.car_memory_bytes = options.car_memory_bytes.min(options.car_memory_budget);
        }
        if let Some(n) = self.backfill_host_fetches {
            options.breaker.slots_per_host = bounded("backfill_host_fetches", n, 1, 256)?;
        }
        if let Some(secs) = self.backfill_host_pause_secs {
            options.breaker.pause =
                Duration::from_secs(bounded("backfill_host_pause_secs", secs as usize, 1, 86_400)? as u64);
        }
        if let Some(n) = self.backfill_max_pages_per_host {
            options.max_pages_per_host = bounded("backfill_max_pages_per_host", n as usize, 1, 1 << 40)? as u64;
        }
        if let Some(n) = self.backfill_max_dids_per_host {
            options.max_dids_per_host = bounded("backfill_max_dids_per_host", n as usize, 1, 1 << 40)? as u64;
        }
        if let Some(secs) = self.backfill_reject_retry_secs {
            options.reject_retry = Duration::from_secs(secs);
        }
        if let Some(entries) = &self.backfill_allow_private {
            crate::net::guard::AddressPolicy::with_allowed(entries)
                .map_err(|e| ConfigError::Invalid(format!("backfill_allow_private: {e}")))?;
            options.allow_private = entries.clone();
        }
        options.did_documents = self.backfill_did_doc.clone().unwrap_or_default();
        if let Some(url) = &self.plc_url {
            options.plc_url = url.clone();
        }
        let relays = self.backfill_relay.as_ref().is_some_and(|relays| !relays.is_empty());
        options.plc_sync = self.plc_sync.unwrap_or(relays);
        Ok(options)
    }

    /// The S3 keys, for `S3Settings::resolve`.
    pub fn s3_keys(&self) -> S3ConfigKeys {
        S3ConfigKeys {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            access_key_id: self.s3_access_key_id.clone(),
            secret_access_key: self.s3_secret_access_key.clone(),
            force_path_style: self.s3_force_path_style,
        }
    }
}

/// The config file's own keys as a TOML table (empty without a file), for `--print-config`.
pub fn load_table(path: Option<&Path>) -> Result<toml::Table, ConfigError> {
    let Some(path) = path else { return Ok(toml::Table::new()) };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse { path: path.into(), message: describe(&e, Some(&text)) })
}

/// How an environment variable's text becomes a config value.
#[derive(Clone, Copy)]
enum EnvKind {
    /// Taken as is.
    Text,
    /// Comma-separated list of strings.
    List,
    /// A TOML scalar: `true`, `65536`, `0.01`.
    Scalar,
}

/// Every config key, and how its `BACKLINKS_<KEY>` variable is read.
const ENV_KEYS: &[(&str, EnvKind)] = &[
    ("data_dir", EnvKind::Text),
    ("store", EnvKind::Text),
    ("listen", EnvKind::Text),
    ("jetstream", EnvKind::List),
    ("no_ingest", EnvKind::Scalar),
    ("read_only", EnvKind::Scalar),
    ("memtable_bytes", EnvKind::Scalar),
    ("frame_bytes", EnvKind::Scalar),
    ("zstd_level", EnvKind::Scalar),
    ("filter_fpr", EnvKind::Scalar),
    ("outline_cache_entries", EnvKind::Scalar),
    ("hot_target_entries", EnvKind::Scalar),
    ("outline_map_bytes", EnvKind::Scalar),
    ("cache_bytes", EnvKind::Scalar),
    ("frame_cache_bytes", EnvKind::Scalar),
    ("meta_cache_bytes", EnvKind::Scalar),
    ("compaction_fan_in", EnvKind::Scalar),
    ("compaction_shard_bytes", EnvKind::Scalar),
    ("compaction_bytes_per_sec", EnvKind::Scalar),
    ("compaction_max_revocations", EnvKind::Scalar),
    ("max_concurrent_queries", EnvKind::Scalar),
    ("request_timeout_ms", EnvKind::Scalar),
    ("max_connections", EnvKind::Scalar),
    ("max_connections_per_address", EnvKind::Scalar),
    ("header_read_timeout_secs", EnvKind::Scalar),
    ("http_threads", EnvKind::Scalar),
    ("cache_max_age_secs", EnvKind::Scalar),
    ("count_exact_limit", EnvKind::Scalar),
    ("no_push", EnvKind::Scalar),
    ("push_retain_hours", EnvKind::Scalar),
    ("push_log_max_bytes", EnvKind::Scalar),
    ("push_max_subscribers", EnvKind::Scalar),
    ("push_buffer_events", EnvKind::Scalar),
    ("push_recent_bytes", EnvKind::Scalar),
    ("s3_endpoint", EnvKind::Text),
    ("s3_region", EnvKind::Text),
    ("s3_access_key_id", EnvKind::Text),
    ("s3_secret_access_key", EnvKind::Text),
    ("s3_force_path_style", EnvKind::Scalar),
    ("max_unflushed_secs", EnvKind::Scalar),
    ("publish_interval_secs", EnvKind::Scalar),
    ("gc_grace_secs", EnvKind::Scalar),
    ("backfill_relay", EnvKind::List),
    ("backfill_pds", EnvKind::List),
    ("backfill_repo", EnvKind::List),
    ("backfill_car", EnvKind::List),
    ("backfill_concurrency", EnvKind::Scalar),
    ("backfill_per_host_per_second", EnvKind::Scalar),
    ("backfill_max_attempts", EnvKind::Scalar),
    ("backfill_max_repo_bytes", EnvKind::Scalar),
    ("backfill_fetch_timeout_secs", EnvKind::Scalar),
    ("backfill_min_bytes_per_sec", EnvKind::Scalar),
    ("backfill_car_memory_budget", EnvKind::Scalar),
    ("backfill_host_fetches", EnvKind::Scalar),
    ("backfill_host_pause_secs", EnvKind::Scalar),
    ("backfill_max_pages_per_host", EnvKind::Scalar),
    ("backfill_max_dids_per_host", EnvKind::Scalar),
    ("backfill_reject_retry_secs", EnvKind::Scalar),
    ("backfill_allow_private", EnvKind::List),
    ("backfill_did_doc", EnvKind::List),
    ("plc_url", EnvKind::Text),
    ("plc_sync", EnvKind::Scalar),
];

/// Sets every key whose `BACKLINKS_<KEY>` variable is present (the environment wins over the file).
fn apply_env(table: &mut toml::Table, env: &dyn Fn(&str) -> Option<String>) {
    for (key, kind) in ENV_KEYS {
        let Some(raw) = env(&format!("BACKLINKS_{}", key.to_ascii_uppercase())) else { continue };
        let value = match kind {
            EnvKind::Text => toml::Value::String(raw),
            EnvKind::List => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.into()))
                    .collect(),
            ),
            // Not a valid scalar: keep the text, so deserialization names the key in its error.
            EnvKind::Scalar => toml::from_str::<toml::Table>(&format!("v = {raw}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(raw)),
        };
        table.insert(key.to_string(), value);
    }
}

/// Words that mark a key whose value must never be printed.
const SECRET_MARKERS: [&str; 3] = ["secret", "password", "token"];

/// Replaces the value of every key (at any depth) whose name contains a secret marker, and the
/// credentials inside every URL.
pub fn redact_secrets(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        let lower = key.to_ascii_lowercase();
        if SECRET_MARKERS.iter().any(|marker| lower.contains(marker)) {
            *value = toml::Value::String("<redacted>".into());
        } else {
            redact_urls(value);
        }
    }
}

fn redact_urls(value: &mut toml::Value) {
    match value {
        toml::Value::String(text) => *text = redact_url(text).into_owned(),
        toml::Value::Array(items) => items.iter_mut().for_each(redact_urls),
        toml::Value::Table(inner) => redact_secrets(inner),
        _ => {}
    }
}

/// A TOML error described without quoting what was written: a value (a secret, say) may be in
/// it. Says where (the line, when the text is at hand) and what was wrong.
fn describe(error: &toml::de::Error, text: Option<&str>) -> String {
    let mut message = hide_quoted(error.message());
    // Without the text, the error names the key it was reading (`in `key``): keep that.
    let key =
        error.to_string().lines().find_map(|line| Some(line.strip_prefix("in `")?.strip_suffix('`')?.to_string()));
    if let Some(key) = key {
        message = format!("{key}: {message}");
    }
    match (error.span(), text) {
        (Some(span), Some(text)) => {
            let line = text.get(..span.start).map_or(0, |before| before.matches('\n').count()) + 1;
            format!("line {line}: {message}")
        }
        _ => message,
    }
}

/// `message` with every quoted or back-quoted part elided, except the key names that "unknown
/// field", "missing field" and "duplicate key" messages are about.
fn hide_quoted(message: &str) -> String {
    let first_line = message.lines().next().unwrap_or_default();
    let names_keys = ["unknown field", "missing field", "duplicate key"].iter().any(|k| first_line.starts_with(k));
    let mut out = String::new();
    let mut quote: Option<char> = None;
    for (index, c) in first_line.char_indices() {
        match quote {
            Some(open) if c == open => {
                quote = None;
                out.push(c);
            }
            Some(_) => {}
            None if matches!(c, '"' | '`' | '\'') => {
                // The first quoted part of a message about a key names the key: keep it.
                if names_keys && !out.contains(['"', '`', '\'']) {
                    let rest = &first_line[index + 1..];
                    if let Some(end) = rest.find(c) {
                        out.push(c);
                        out.push_str(&rest[..end]);
                        quote = Some(c);
                        continue;
                    }
                }
                out.push(c);
                out.push('…');
                quote = Some(c);
            }
            None => out.push(c),
        }
    }
    out
}

/// How live push runs (see `push`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSettings {
    pub enabled: bool,
    pub retain_hours: u64,
    pub log_max_bytes: u64,
    pub max_subscribers: usize,
    pub buffer_events: usize,
    pub recent_bytes: u64,
}

impl Default for PushSettings {
    fn default() -> Self {
        PushSettings {
            enabled: true,
            retain_hours: 26,
            log_max_bytes: 64 << 30,
            max_subscribers: 1000,
            buffer_events: 1024,
            recent_bytes: 2 << 30,
        }
    }
}

fn bounded<T: PartialOrd + Copy + std::fmt::Display>(name: &str, value: T, min: T, max: T) -> Result<T, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::Invalid(format!("{name} must be between {min} and {max}, got {value}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let mut table: toml::Table =
            "s3_secret_access_key = \"hunter2\"\nlisten = \"x\"\n[a]\nApiToken = 3\nkeep = 1\n".parse().unwrap();
        redact_secrets(&mut table);
        let text = toml::to_string(&table).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(table["s3_secret_access_key"].as_str(), Some("<redacted>"));
        assert_eq!(table["a"]["ApiToken"].as_str(), Some("<redacted>"));
        assert_eq!((table["listen"].as_str(), table["a"]["keep"].as_integer()), (Some("x"), Some(1)));
    }

    #[test]
    fn urls_in_printed_config_lose_their_credentials() {
        let mut table: toml::Table =
            "s3_endpoint = \"https://GK1:hunter2@s3.example\"\njetstream = [\"wss://u:pw@j.example/subscribe\"]\n"
                .parse()
                .unwrap();
        redact_secrets(&mut table);
        let printed = toml::to_string(&table).unwrap();
        assert!(!printed.contains("hunter2") && !printed.contains("pw@"), "{printed}");
        assert!(printed.contains("https://<redacted>@s3.example"), "{printed}");
    }

    #[test]
    fn config_errors_never_echo_values() {
        let dir = tempfile::tempdir().unwrap();
        for (text, names) in [
            ("s3_secret_access_key = 12345\n", None),
            ("memtable_bytes = \"hunter2\"\n", None),
            ("s3_secret_acces_key = \"hunter2\"\n", Some("s3_secret_acces_key")),
            ("listen = \"hunter2\n", None),
        ] {
            let path = dir.path().join("c.toml");
            std::fs::write(&path, text).unwrap();
            let error = FileConfig::load_with_env(Some(&path), &|_| None).unwrap_err().to_string();
            assert!(!error.contains("hunter2") && !error.contains("12345"), "{text:?} gave {error}");
            if let Some(name) = names {
                assert!(error.contains(name), "the misspelt key is named: {error}");
            }
        }
        let env = |name: &str| (name == "BACKLINKS_MEMTABLE_BYTES").then(|| "\"hunter2\"".to_string());
        let error = FileConfig::load_with_env(None, &env).unwrap_err().to_string();
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn environment_variables_override_every_key() {
        let env = |name: &str| -> Option<String> {
            match name {
                "BACKLINKS_MEMTABLE_BYTES" => Some("1048576".into()),
                "BACKLINKS_JETSTREAM" => Some("wss://a.example/subscribe, wss://b.example/subscribe".into()),
                "BACKLINKS_S3_ACCESS_KEY_ID" => Some("12345".into()),
                "BACKLINKS_READ_ONLY" => Some("true".into()),
                "BACKLINKS_CACHE_BYTES" => Some("1000".into()),
                _ => None,
            }
        };
        let config = FileConfig::load_with_env(None, &env).unwrap();
        assert_eq!(config.memtable_bytes, Some(1 << 20));
        assert_eq!(config.jetstream.unwrap(), vec!["wss://a.example/subscribe", "wss://b.example/subscribe"]);
        assert_eq!(config.s3_access_key_id.as_deref(), Some("12345"), "text keys stay text");
        assert_eq!((config.read_only, config.cache_bytes), (Some(true), Some(1000)));
        let bad = |name: &str| (name == "BACKLINKS_ZSTD_LEVEL").then(|| "high".to_string());
        let error = FileConfig::load_with_env(None, &bad).unwrap_err().to_string();
        assert!(error.contains("zstd_level"), "{error}");
        // Every key in the list is a real key (the struct refuses unknown ones).
        let every = |name: &str| {
            ENV_KEYS
                .iter()
                .any(|(k, _)| format!("BACKLINKS_{}", k.to_ascii_uppercase()) == name)
                .then(|| "1".to_string())
        };
        let error = FileConfig::load_with_env(None, &every).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(!error.contains("unknown field"), "{error}");
    }

    #[test]
    fn parses_known_keys_and_rejects_typos() {
        let config: FileConfig = toml::from_str("data_dir = \"/x\"\nmemtable_bytes = 1048576\n").unwrap();
        assert_eq!(config.data_dir.as_deref(), Some(Path::new("/x")));
        assert_eq!(config.index_options().unwrap().memtable_bytes, 1 << 20);
        assert!(toml::from_str::<FileConfig>("data_dri = \"/x\"").is_err());
        let too_small = FileConfig { memtable_bytes: Some(10), ..Default::default() };
        assert!(too_small.index_options().is_err());
    }

    #[test]
    fn s3_keys_parse_and_the_secret_is_redacted() {
        let text = "s3_endpoint = \"http://127.0.0.1:3900\"\ns3_region = \"garage\"\ns3_access_key_id = \"GK1\"\n\
                    s3_secret_access_key = \"topsecret\"\ns3_force_path_style = true\n";
        let config: FileConfig = toml::from_str(text).unwrap();
        let keys = config.s3_keys();
        assert_eq!(keys.endpoint.as_deref(), Some("http://127.0.0.1:3900"));
        assert_eq!((keys.region.as_deref(), keys.access_key_id.as_deref()), (Some("garage"), Some("GK1")));
        assert_eq!(keys.secret_access_key.as_ref().map(Secret::expose), Some("topsecret"));
        assert_eq!(keys.force_path_style, Some(true));
        let shown = format!("{config:?} {keys:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
    }
}
