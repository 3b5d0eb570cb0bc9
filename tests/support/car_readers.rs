//! A CAR read from memory and from a file must give the same answer for the same bytes. Shared by
//! `tests/car_fixtures.rs` and the `car` fuzz target, which include this file by path.

use backlinks::ingest::repo::{CarError, RepoCommit, RepoRecord, RepoStats};

pub type RepoResult = Result<(RepoCommit, Vec<RepoRecord>, RepoStats), CarError>;

/// Checks that the two reads agree (the same value, or the same error variant) and returns the
/// first.
pub fn agree(from_slice: RepoResult, from_stream: RepoResult) -> RepoResult {
    match (&from_slice, &from_stream) {
        (Ok(slice), Ok(stream)) => assert_eq!(slice, stream, "readers disagree"),
        (Err(slice), Err(stream)) => assert_eq!(
            std::mem::discriminant(slice),
            std::mem::discriminant(stream),
            "readers fail differently: {slice} vs {stream}"
        ),
        _ => panic!("one reader failed: slice {from_slice:?}, stream {from_stream:?}"),
    }
    from_slice
}
