//! backlinks: a standalone AT Protocol backlink index.
//!
//! The modules follow the design's nouns: `model` (ids, TIDs, syntax), `outline` (string <-> id
//! tables), `extract` (links in a record), `lsm` (the one generic fixed-width LSM), `store`
//! (object storage), `catalog` (local SQLite state), `manifest` (the published view),
//! `account_log` (the account states a manifest names), `index` (the write path over all of
//! them), `ingest` (events in), `query` (two-round listBacklinks),
//! `count` (countBacklinks, bounded), `constellation` (compatible endpoints), `server` (HTTP),
//! `status` (HTML pages), `metrics` (Prometheus), `verify` (corruption reports and checks),
//! `buckets` (an index of positions shared by the outline cache and compaction) and `config`.

pub mod account_log;
pub mod base;
pub mod catalog;
pub mod config;
pub mod constellation;
pub mod count;
pub mod extract;
pub mod identity;
pub mod index;
pub mod ingest;
pub mod liveness;
pub mod lsm;
pub mod manifest;
pub mod metrics;
pub mod model;
pub mod net;
pub mod outline;
pub mod push;
pub mod query;
pub mod server;
pub mod status;
pub mod store;
pub mod verify;
pub mod writer;
