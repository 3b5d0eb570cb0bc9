//! Configuration: defaults, then the config file, then `BACKLINKS_*` environment variables and
//! flags (clap reads both; flags win).
//!
//! Invariants:
//! - Every flag has a config-file key of the same name (with `_` for `-`) and an environment
//!   variable `BACKLINKS_<NAME>`.
//! - Unknown config-file keys are an error, so a typo never silently falls back to a default.

use crate::index::IndexOptions;
use crate::store::s3::{S3ConfigKeys, Secret};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_JETSTREAM: &[&str] =
    &["wss://jetstream1.us-east.bsky.network/subscribe", "wss://jetstream2.us-east.bsky.network/subscribe"];

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
    pub frame_bytes: Option<usize>,
    pub zstd_level: Option<i32>,
    pub filter_fpr: Option<f64>,
    pub outline_cache_entries: Option<usize>,
    /// Local bytes of table data kept as a cache; colder uploaded tables are read by range.
    pub cache_bytes: Option<u64>,
    /// Runs of one size tier that trigger a compaction (and that it merges).
    pub compaction_fan_in: Option<usize>,
    /// Compressed bytes per shard table of a compacted run.
    pub compaction_shard_bytes: Option<u64>,
    /// Input bytes a compaction reads per second at most (pacing).
    pub compaction_bytes_per_sec: Option<u64>,
    /// Queries served at once; one more gets an immediate 503 (serve).
    pub max_concurrent_queries: Option<usize>,
    /// A query running longer than this many milliseconds is stopped with a 503 (serve).
    pub request_timeout_ms: Option<u64>,
    /// `Cache-Control: max-age` of successful query answers, in seconds (serve).
    pub cache_max_age_secs: Option<u64>,
    /// Entries countBacklinks reads before it answers with an estimate (serve).
    pub count_exact_limit: Option<usize>,
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
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })
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
        if let Some(bytes) = self.cache_bytes {
            options.cache_bytes = bytes;
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
    text.parse().map_err(|e: toml::de::Error| ConfigError::Parse { path: path.into(), message: e.to_string() })
}

/// Words that mark a key whose value must never be printed.
const SECRET_MARKERS: [&str; 3] = ["secret", "password", "token"];

/// Replaces the value of every key (at any depth) whose name contains a secret marker.
pub fn redact_secrets(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        let lower = key.to_ascii_lowercase();
        if SECRET_MARKERS.iter().any(|marker| lower.contains(marker)) {
            *value = toml::Value::String("<redacted>".into());
        } else if let toml::Value::Table(inner) = value {
            redact_secrets(inner);
        }
    }
}

fn bounded(name: &str, value: usize, min: usize, max: usize) -> Result<usize, ConfigError> {
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
