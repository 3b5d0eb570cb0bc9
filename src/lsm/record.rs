//! What the catalog knows of a table, and the kinds of run: the LSM's shape as records, apart from
//! the open tables (`handle`) and runs (`run`) built from them.

use crate::lsm::table::TableSummary;
use crate::model::ids::TreeKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// One flushed memtable: one table, any target.
    Delta,
    /// The output of a compaction: one table per shard of the target hash.
    Compacted,
}

impl RunKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            RunKind::Delta => "delta",
            RunKind::Compacted => "compacted",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [RunKind::Delta, RunKind::Compacted].into_iter().find(|kind| kind.as_str() == name)
    }
}

/// One table of one run: where it sits in the tree's shape, its sizes and stamps, and whether the
/// bucket has it. The catalog stores these; the manifest publishes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRecord {
    pub id: String,
    pub tree: TreeKind,
    pub run_id: String,
    pub run_kind: RunKind,
    pub shard: u32,
    pub shard_count: u32,
    pub entries: u64,
    pub data_len: u64,
    pub meta_len: u64,
    pub uploaded: bool,
    pub min_stamp: u64,
    pub max_stamp: u64,
}

impl TableRecord {
    /// Whether the table may hold entries stamped above `bound` (`None`: any entry).
    pub fn has_stamps_above(&self, bound: Option<u64>) -> bool {
        bound.is_none_or(|stamp| self.max_stamp > stamp)
    }

    /// A table just written (not uploaded yet): shard `shard` of `shard_count` in run `run_id`.
    pub fn written(
        tree: TreeKind,
        id: String,
        (run_id, run_kind): (String, RunKind),
        (shard, shard_count): (u32, u32),
        summary: &TableSummary,
    ) -> Self {
        TableRecord {
            id,
            tree,
            run_id,
            run_kind,
            shard,
            shard_count,
            entries: summary.entries,
            data_len: summary.data_len,
            meta_len: summary.meta_len,
            uploaded: false,
            min_stamp: summary.stamps.0,
            max_stamp: summary.stamps.1,
        }
    }
}
