//! Configuration: defaults, then the config file, then `BACKLINKS_*` environment variables and
//! flags (clap reads both; flags win).
//!
//! Invariants:
//! - Every flag has a config-file key of the same name (with `_` for `-`) and an environment
//!   variable `BACKLINKS_<NAME>`.
//! - Unknown config-file keys are an error, so a typo never silently falls back to a default.

use crate::index::IndexOptions;
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
        Ok(options)
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
    fn parses_known_keys_and_rejects_typos() {
        let config: FileConfig = toml::from_str("data_dir = \"/x\"\nmemtable_bytes = 1048576\n").unwrap();
        assert_eq!(config.data_dir.as_deref(), Some(Path::new("/x")));
        assert_eq!(config.index_options().unwrap().memtable_bytes, 1 << 20);
        assert!(toml::from_str::<FileConfig>("data_dri = \"/x\"").is_err());
        let too_small = FileConfig { memtable_bytes: Some(10), ..Default::default() };
        assert!(too_small.index_options().is_err());
    }
}
