//! Repository CARs: arbitrary bytes read from memory and from a file, with the default limits and
//! with tight ones (no key: hashes and structure).
//!
//! Invariants checked (src/ingest/repo/ states them):
//! - The two sources agree on every input: the same commit, records and stats, or errors of the
//!   same kind.
//! - On success: records in strictly increasing `collection/rkey` order, each key well formed and
//!   each record an object; the stats count them exactly; no limit is exceeded.
#![no_main]

use backlinks::ingest::repo::{
    CarLimits, CarSource, Expect, RepoCommit, RepoRecord, RepoStats, read_repo, read_repo_bytes,
};
use libfuzzer_sys::fuzz_target;

const ANY: Expect<'static> = Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };

#[path = "../../tests/support/car_readers.rs"]
mod car_readers;
use car_readers::{RepoResult, agree};

/// Limits small enough that fuzzed inputs reach every "too many" and "too deep" path.
fn tight_limits() -> CarLimits {
    CarLimits {
        max_bytes: 64 << 10,
        max_blocks: 64,
        max_block_bytes: 4 << 10,
        max_mst_depth: 4,
        max_records: 32,
        max_record_depth: 6,
        referenced_per_byte: 1,
    }
}

fuzz_target!(|data: &[u8]| {
    for limits in [CarLimits::default(), tight_limits()] {
        if let Ok((commit, records, stats)) = read_both(data, &limits) {
            check_repo(&commit, &records, &stats, &limits);
        }
    }
});

fn read_both(bytes: &[u8], limits: &CarLimits) -> RepoResult {
    let from_memory = read_repo_bytes(bytes, limits, &ANY).map(|repo| (repo.commit, repo.records, repo.stats));
    let mut file = tempfile::tempfile().expect("a temporary file");
    std::io::Write::write_all(&mut file, bytes).expect("writing the temporary file");
    let from_file =
        read_repo(&CarSource::File(&file), limits, &ANY).map(|repo| (repo.commit, repo.records, repo.stats));
    agree(from_memory, from_file)
}

fn check_repo(commit: &RepoCommit, records: &[RepoRecord], stats: &RepoStats, limits: &CarLimits) {
    assert!((2..=3).contains(&commit.version), "commit version {}", commit.version);
    assert!(commit.version == 2 || !commit.rev.is_empty(), "a v3 commit without rev");
    assert_eq!(stats.records, records.len());
    assert!(records.len() + stats.bad_records <= limits.max_records, "{stats:?}");
    assert!(stats.blocks <= limits.max_blocks, "{stats:?}");
    let mut previous: Option<String> = None;
    for record in records {
        assert!(!record.collection.is_empty() && !record.rkey.is_empty() && !record.rkey.contains('/'), "{record:?}");
        assert!(record.record.is_object(), "record {}/{} is not an object", record.collection, record.rkey);
        let key = format!("{}/{}", record.collection, record.rkey);
        assert!(
            previous.as_deref().is_none_or(|previous| previous.as_bytes() < key.as_bytes()),
            "{key:?} out of order"
        );
        previous = Some(key);
    }
}
