//! backlinks: a standalone AT Protocol backlink index.
//!
//! The modules follow the design's nouns: `model` (ids, TIDs, syntax), `outline` (string <-> id
//! tables), `extract` (links in a record), `lsm` (the one generic fixed-width LSM), `store`
//! (object storage), `catalog` (local SQLite state), `manifest` (the published view), `index`
//! (the write path over all of them), `ingest` (events in), `query` (two-round listBacklinks),
//! `server` (HTTP) and `config`.

pub mod catalog;
pub mod config;
pub mod extract;
pub mod index;
pub mod ingest;
pub mod lsm;
pub mod manifest;
pub mod model;
pub mod outline;
pub mod query;
pub mod server;
pub mod store;
