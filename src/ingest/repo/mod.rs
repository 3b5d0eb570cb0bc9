//! Repositories (`com.atproto.sync.getRepo` CARs): checked, then every record in key order, as
//! atproto JSON.
//!
//! - `framing`: the CAR's frames, and blocks checked against their CIDs;
//! - `commit`: the signed commit (DID, rev, signature);
//! - `mst`: the tree under it, walked in key order, its shape checked;
//! - `json`: records in the atproto JSON data model.
//!
//! What a `Repo` vouches for: every block it used hashed to its CID; the commit names the DID
//! asked for and a `rev` that is not in the future; the records are exactly those reachable from
//! the commit's MST root, in order, under a well-formed tree; and, when a key was given
//! (`Repo::signed`), the commit's signature verified with it. A CAR that fails any of it is an
//! error that says which check failed; nothing of it is returned.
//!
//! Invariants:
//! - Never more than `max_bytes` read, `max_blocks` frames, `max_block_bytes` per frame,
//!   `max_mst_depth` levels, `max_records` entries, `max_record_depth` nesting; the bytes of
//!   records referenced stay under `referenced_limit` of the CAR's size; the walk stops at its
//!   deadline. No allocation is sized by an untrusted length beyond these.
//! - Blocks are read from memory or from a file (`CarSource`), so a large CAR need not be held
//!   whole: the walk holds the index, the decoded records and one block at a time.

mod commit;
mod framing;
mod json;
mod mst;

pub use commit::MAX_REV_SKEW_US;
pub use framing::{CarSource, check_block};
pub use json::{RECORD_DEPTH_CAP, base64_encode_unpadded, dagcbor_to_json};
pub use mst::{MAX_MST_KEY_BYTES, MST_DEPTH_CAP, key_height};

use crate::identity::keys::PublicKey;
use framing::CarIndex;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Bounds on everything a CAR can make us do. The defaults suit a full repo on a small VPS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CarLimits {
    /// Whole CAR, header included. Default 512 MiB.
    pub max_bytes: u64,
    /// Block frames, commit and MST nodes included. Default 4 Mi (a 512 MiB repo of ~128 B blocks).
    pub max_blocks: usize,
    /// One frame (CID plus block bytes). Default 2 MiB: records are small documents, and blobs
    /// (images, video) never travel inside a repo CAR.
    pub max_block_bytes: usize,
    /// MST levels below the root (capped at [`MST_DEPTH_CAP`]). Default 64; with four keys per
    /// layer on average, even millions of records make trees under 20 levels deep.
    pub max_mst_depth: usize,
    /// MST entries visited. Default 4 Mi, like `max_blocks`.
    pub max_records: usize,
    /// Nesting of maps and lists inside one record (capped at [`RECORD_DEPTH_CAP`]). Default 128;
    /// lexicons nest a handful of levels.
    pub max_record_depth: usize,
    /// Bytes of records the tree may reference, repeats included, per byte of CAR (plus 1 MiB).
    /// Default 4: a repository references each record once, so at most the CAR's size.
    pub referenced_per_byte: u64,
}

impl Default for CarLimits {
    fn default() -> Self {
        Self {
            max_bytes: 512 << 20,
            max_blocks: 4 << 20,
            max_block_bytes: 2 << 20,
            max_mst_depth: 64,
            max_records: 4 << 20,
            max_record_depth: 128,
            referenced_per_byte: 4,
        }
    }
}

impl CarLimits {
    /// The most record bytes a CAR of `car_len` bytes may reference.
    pub fn referenced_limit(&self, car_len: u64) -> u64 {
        car_len.saturating_mul(self.referenced_per_byte).saturating_add(1 << 20)
    }
}

/// What the reader is told to expect of the repository.
#[derive(Clone, Debug)]
pub struct Expect<'a> {
    /// The DID the repository must belong to (`None`: whichever the commit names, for a CAR file).
    pub did: Option<&'a str>,
    /// The key the commit must be signed with (`None`: hashes and structure only).
    pub key: Option<&'a PublicKey>,
    /// Now, in microseconds since the epoch (injected): no `rev` may be later than this plus
    /// `MAX_REV_SKEW_US`.
    pub now_us: i64,
    /// When the walk gives up (`Deadline`).
    pub deadline: Option<Instant>,
}

/// The signed commit at the root of the CAR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoCommit {
    pub did: String,
    /// Empty for version 2 commits written before `rev` existed.
    pub rev: String,
    /// CID of the MST root, as a string.
    pub data: String,
    pub version: i64,
}

/// One record of the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoRecord {
    pub collection: String,
    pub rkey: String,
    pub cid: String,
    /// The record in the atproto JSON data model; always an object. Shared by the keys that
    /// reference the same block.
    pub record: Arc<Value>,
}

/// What the walk saw besides the records it returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepoStats {
    /// Block frames in the CAR, commit and duplicates included.
    pub blocks: usize,
    /// Records returned.
    pub records: usize,
    /// MST entries whose key or record block was not an atproto record (counted, skipped).
    pub bad_records: usize,
    /// MST nodes decoded.
    pub mst_nodes: usize,
}

/// A checked repository.
#[derive(Clone, Debug)]
pub struct Repo {
    pub commit: RepoCommit,
    pub records: Vec<RepoRecord>,
    pub stats: RepoStats,
    /// The commit's signature was verified (with `Expect::key`); false when no key was given.
    pub signed: bool,
}

/// Why a CAR could not be read, or failed a check.
#[derive(Debug, thiserror::Error)]
pub enum CarError {
    #[error("CAR truncated at byte {offset}")]
    Truncated { offset: u64 },
    #[error("CAR larger than {max_bytes} bytes")]
    TooBig { max_bytes: u64 },
    #[error("CAR frame of {len} bytes exceeds the limit of {max}")]
    BlockTooBig { len: u64, max: usize },
    #[error("CAR has more than {max} blocks")]
    TooManyBlocks { max: usize },
    #[error("malformed CAR framing: {0}")]
    BadFraming(String),
    #[error("bad CAR header: {0}")]
    BadHeader(String),
    #[error("I/O error reading the CAR: {0}")]
    Io(String),
    #[error("block {cid} is not in the CAR")]
    MissingBlock { cid: String },
    #[error("block {cid} does not hash to its CID")]
    BadHash { cid: String },
    #[error("CID {cid}: {reason}")]
    BadCid { cid: String, reason: String },
    #[error("bad commit: {0}")]
    BadCommit(String),
    #[error("the commit is for {found}, not {expected}")]
    WrongDid { expected: String, found: String },
    #[error("the commit's rev {rev} is in the future")]
    RevInFuture { rev: String },
    #[error("the commit's signature: {0}")]
    BadSignature(String),
    #[error("bad MST node {cid}: {reason}")]
    BadMstNode { cid: String, reason: String },
    #[error("MST node {cid} reached twice (cycle or shared subtree)")]
    MstCycle { cid: String },
    #[error("MST deeper than {max} levels")]
    MstTooDeep { max: usize },
    #[error("MST key {key:?} is not after the previous key")]
    MstKeyOrder { key: String },
    #[error("MST has more than {max} entries")]
    TooManyRecords { max: usize },
    #[error("the tree references more than {limit} bytes of records")]
    TooMuchReferenced { limit: u64 },
    #[error("reading the repository took too long")]
    Deadline,
    #[error("record is not valid DAG-CBOR: {0}")]
    RecordDecode(String),
    #[error("record is not an object")]
    RecordNotObject,
    #[error("record contains a float, which atproto does not allow")]
    RecordFloat,
    #[error("record integer {0} is outside the i64 range")]
    RecordInteger(i128),
    #[error("record nests deeper than {max} levels")]
    RecordTooDeep { max: usize },
}

impl CarError {
    /// The CAR is what its host meant to serve and it is wrong (a forgery, or a broken
    /// repository): fetching it again will not help, unlike a transfer cut short.
    pub fn is_verification_failure(&self) -> bool {
        !matches!(self, CarError::Truncated { .. } | CarError::Io(_) | CarError::Deadline)
    }

    /// Which check failed, as a short fixed name (a metric label, a summary key).
    pub fn reason(&self) -> &'static str {
        match self {
            CarError::Truncated { .. } | CarError::Io(_) => "transfer",
            CarError::TooBig { .. }
            | CarError::BlockTooBig { .. }
            | CarError::TooManyBlocks { .. }
            | CarError::TooManyRecords { .. }
            | CarError::TooMuchReferenced { .. }
            | CarError::MstTooDeep { .. }
            | CarError::Deadline => "too_large",
            CarError::BadFraming(_) | CarError::BadHeader(_) => "bad_car",
            CarError::MissingBlock { .. } => "missing_block",
            CarError::BadHash { .. } | CarError::BadCid { .. } => "bad_cid",
            CarError::BadCommit(_) => "bad_commit",
            CarError::WrongDid { .. } => "wrong_did",
            CarError::RevInFuture { .. } => "rev_in_future",
            CarError::BadSignature(_) => "bad_signature",
            CarError::BadMstNode { .. } | CarError::MstCycle { .. } | CarError::MstKeyOrder { .. } => "bad_mst",
            CarError::RecordDecode(_)
            | CarError::RecordNotObject
            | CarError::RecordFloat
            | CarError::RecordInteger(_)
            | CarError::RecordTooDeep { .. } => "bad_record",
        }
    }
}

/// Reads and checks the repository in `source` (see the module header for what it vouches for).
pub fn read_repo(source: &CarSource<'_>, limits: &CarLimits, expect: &Expect<'_>) -> Result<Repo, CarError> {
    let car = CarIndex::read(source, limits)?;
    let (commit, data_root, signed) = commit::check_commit(&car.block(&car.root)?, expect)?;
    let mut walk = mst::MstWalk::new(&car, limits, expect.deadline);
    walk.walk(&data_root)?;
    let mut stats = walk.stats;
    stats.blocks = car.frames;
    stats.records = walk.records.len();
    Ok(Repo { commit, records: walk.records, stats, signed })
}

/// Reads and checks a CAR slice rooted at a signed commit, as a firehose `#commit` or `#sync`
/// frame carries: every block hashes to its CID, and the commit is checked as `read_repo` checks
/// it (DID, `rev`, signature with `expect.key`). The tree is not walked: a slice holds only the
/// nodes its operations touched. Returns the commit and whether its signature was verified.
pub fn read_commit(bytes: &[u8], limits: &CarLimits, expect: &Expect<'_>) -> Result<(RepoCommit, bool), CarError> {
    let source = CarSource::Memory(bytes);
    let car = CarIndex::read(&source, limits)?;
    car.check_all()?;
    let (commit, _, signed) = commit::check_commit(&car.block(&car.root)?, expect)?;
    Ok((commit, signed))
}

/// The DID the CAR's commit names, unverified (to find the document to verify it with).
pub fn peek_did(source: &CarSource<'_>, limits: &CarLimits) -> Result<String, CarError> {
    let car = CarIndex::read(source, limits)?;
    let anything = Expect { did: None, key: None, now_us: i64::MAX, deadline: None };
    Ok(commit::check_commit(&car.block(&car.root)?, &anything)?.0.did)
}

/// `read_repo` over a CAR in memory.
pub fn read_repo_bytes(bytes: &[u8], limits: &CarLimits, expect: &Expect<'_>) -> Result<Repo, CarError> {
    read_repo(&CarSource::Memory(bytes), limits, expect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn anything() -> Expect<'static> {
        Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None }
    }

    proptest! {
        #[test]
        fn garbage_is_an_error_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = read_repo_bytes(&bytes, &CarLimits::default(), &anything());
        }
    }

    /// The header frame of a real repo CAR (one root, version 1).
    const HEADER_HEX: &str = "3aa265726f6f747381d82a5825000171122069c0e6977d9999baddb2377c23f3f53752df512d2101efdcbc63e76ed050cebc6776657273696f6e01";

    fn from_hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap()).collect()
    }

    /// Found by the `car` fuzz target: a 10-byte length prefix whose last byte overflows u64 is
    /// bad framing, not another length (dropping the high bits would read a too-big block, or a
    /// frame of the wrong size), from memory and from a file alike.
    #[test]
    fn an_overflowing_length_prefix_is_bad_framing_from_memory_and_files() {
        let car = [from_hex(HEADER_HEX), vec![0x8c; 9], vec![0x0c]].concat();
        let from_memory = read_repo_bytes(&car, &CarLimits::default(), &anything());
        assert!(matches!(&from_memory, Err(CarError::BadFraming(reason)) if reason.contains("overflows")));
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &car).unwrap();
        let from_file = read_repo(&CarSource::File(&file), &CarLimits::default(), &anything());
        assert!(
            matches!(&from_file, Err(CarError::BadFraming(reason)) if reason.contains("overflows")),
            "{from_file:?}"
        );
    }
}
