//! One generic LSM over fixed-width entries, used for backlinks, forward links and revocations.
//!
//! `entry` defines what a tree stores; `memtable` holds recent writes; `table` is the on-disk and
//! in-bucket format (frames + meta); `filter` the one-hash blocked bloom filter in each meta;
//! `tree` ties memtables and tables together for one entry type; `lookup` reads keys and `range`
//! pages through a range of keys.

pub mod bytes;
pub mod cache;
pub mod coder;
pub mod compaction;
pub mod entry;
pub mod filter;
pub mod handle;
pub mod lookup;
pub mod memtable;
pub mod range;
pub mod record;
pub mod run;
pub mod scan;
pub mod sorter;
pub mod table;
pub mod tree;
