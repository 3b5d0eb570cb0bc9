//! Repository CAR files (`com.atproto.sync.getRepo`) -> every record, in key order, as atproto JSON.
//!
//! Crates used, and why:
//! - `iroh-car`: only its `CarHeader::decode`, for the header. Its `CarReader` is not used: it
//!   decodes a 10-byte length prefix that overflows u64 by dropping the high bits, so it framed
//!   such a CAR differently from the slice parser (found by the `car` fuzz target).
//! - `serde_ipld_dagcbor`: DAG-CBOR bytes -> `Ipld` (the commit, MST nodes and records). Its decoder
//!   nests at most 256 levels and caps preallocation from declared lengths.
//! - `ipld-core`: the `Ipld` value type and `Cid`.
//!
//! [`read_repo_bytes`] parses the framing itself over the slice (no runtime, no copies);
//! [`read_repo`] reads the whole CAR (at most `max_bytes`) and hands it to the same code, so the
//! two readers agree on every input by construction; the tests and the fuzz target check it.
//!
//! Invariants:
//! - Never more than `max_bytes` read, `max_blocks` frames stored, `max_block_bytes` per frame (CID
//!   plus data), `max_mst_depth` MST levels, `max_records` MST entries, `max_record_depth` nesting.
//!   No allocation is sized by an untrusted length beyond these limits.
//!   Recursion (MST walk, JSON conversion) never goes deeper than 256 levels, whatever the limits say.
//! - A cut inside a frame is [`CarError::Truncated`]. A cut exactly at a frame boundary cannot be
//!   told from a partial CAR: the blocks that did not arrive are counted in `missing_blocks`.
//! - A missing MST node or record block is counted, never fatal; a record block that does not
//!   decode to an atproto JSON object is counted in `bad_records`, never fatal. A malformed commit
//!   or MST node, a cycle, a too-deep tree or keys out of order are fatal: the walk cannot be trusted.
//! - Records come out in strictly increasing MST key order (`collection/rkey`, bytewise).
//! - Neither block hashes nor the commit signature are verified here.

use ipld_core::cid::Cid;
use ipld_core::ipld::Ipld;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest MST key accepted: an NSID (at most 317 chars), `/`, and a record key (at most 512).
pub const MAX_MST_KEY_BYTES: usize = 1024;
/// Hard caps on recursion, whatever the limits say: the MST walk and the JSON conversion recurse
/// once per level, and these keep their stack use small on any thread. 256 matches the nesting
/// limit of the DAG-CBOR decoder.
pub const MST_DEPTH_CAP: usize = 256;
pub const RECORD_DEPTH_CAP: usize = 256;
/// Longest length prefix: a u64 in unsigned LEB128 takes at most 10 bytes.
const MAX_VARINT_BYTES: usize = 10;

/// Bounds on everything a CAR can make us do. The defaults suit a full repo on a small VPS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CarLimits {
    /// Whole CAR, header included. Default 512 MiB: the blocks are all held in memory during the walk.
    pub max_bytes: u64,
    /// Block frames, commit and MST nodes included. Default 4 Mi (a 512 MiB repo of ~128 B blocks).
    pub max_blocks: usize,
    /// One frame (CID plus block bytes). Default 2 MiB: records are small documents, and blobs
    /// (images, video) never travel inside a repo CAR.
    pub max_block_bytes: usize,
    /// MST levels below the root (capped at [`MST_DEPTH_CAP`]). Default 64; with fanout 4, even
    /// millions of records make trees under 20 levels deep.
    pub max_mst_depth: usize,
    /// MST entries visited, present or not. Default 4 Mi, like `max_blocks`.
    pub max_records: usize,
    /// Nesting of maps and lists inside one record (capped at [`RECORD_DEPTH_CAP`]). Default 128;
    /// lexicons nest a handful of levels.
    pub max_record_depth: usize,
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
        }
    }
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
    /// The record in the atproto JSON data model; always an object.
    pub record: Value,
}

/// What the walk saw besides the records it returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepoStats {
    /// Block frames in the CAR, commit and duplicates included.
    pub blocks: usize,
    /// Records returned.
    pub records: usize,
    /// MST entries whose key or record block was unusable.
    pub bad_records: usize,
    /// Referenced MST nodes or record blocks absent from the CAR.
    pub missing_blocks: usize,
    /// MST nodes decoded.
    pub mst_nodes: usize,
}

/// Why a CAR (or one record) could not be read.
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
    #[error("root block {root} (the commit) is not in the CAR")]
    NoRoot { root: String },
    #[error("bad commit: {0}")]
    BadCommit(String),
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

/// Reads a repository CAR from `reader` and returns its commit and records in key order.
///
/// The CAR is read whole first (the walk holds every block in memory anyway), then parsed exactly
/// as [`read_repo_bytes`] parses it.
pub async fn read_repo<R: AsyncRead + Unpin + Send>(
    reader: R,
    limits: &CarLimits,
) -> Result<(RepoCommit, Vec<RepoRecord>, RepoStats), CarError> {
    let bytes = read_at_most(reader, limits.max_bytes).await?;
    read_repo_bytes(&bytes, limits)
}

/// Everything `reader` holds, or `TooBig` as soon as it holds more than `max_bytes`.
async fn read_at_most<R: AsyncRead + Unpin>(reader: R, max_bytes: u64) -> Result<Vec<u8>, CarError> {
    let mut bytes = Vec::new();
    // One byte past the budget is enough to tell "exactly max_bytes" from "too big".
    let mut budgeted = reader.take(max_bytes.saturating_add(1));
    budgeted.read_to_end(&mut bytes).await.map_err(|e| CarError::Io(e.to_string()))?;
    if bytes.len() as u64 > max_bytes {
        return Err(CarError::TooBig { max_bytes });
    }
    Ok(bytes)
}

/// Same as [`read_repo`] over an in-memory CAR. It parses the framing itself over the slice (no
/// async runtime, so it is safe to call from inside one) and borrows the blocks instead of copying.
pub fn read_repo_bytes(bytes: &[u8], limits: &CarLimits) -> Result<(RepoCommit, Vec<RepoRecord>, RepoStats), CarError> {
    let car = read_blocks_from_slice(bytes, limits)?;
    walk_repo(&car, limits)
}

/// Converts a DAG-CBOR value to the atproto JSON data model: links become `{"$link": cid}`, bytes
/// `{"$bytes": base64}` (standard alphabet, no padding); floats and integers outside i64 are errors.
/// Nesting beyond `max_depth` (itself capped at [`RECORD_DEPTH_CAP`]) is an error.
pub fn dagcbor_to_json(ipld: &Ipld, max_depth: usize) -> Result<Value, CarError> {
    let max_depth = max_depth.min(RECORD_DEPTH_CAP);
    ipld_to_json(ipld, max_depth, max_depth)
}

fn ipld_to_json(ipld: &Ipld, depth_left: usize, max_depth: usize) -> Result<Value, CarError> {
    let nested_depth = || depth_left.checked_sub(1).ok_or(CarError::RecordTooDeep { max: max_depth });
    Ok(match ipld {
        Ipld::Null => Value::Null,
        Ipld::Bool(flag) => Value::Bool(*flag),
        Ipld::Integer(int) => Value::from(i64::try_from(*int).map_err(|_| CarError::RecordInteger(*int))?),
        Ipld::Float(_) => return Err(CarError::RecordFloat),
        Ipld::String(text) => Value::String(text.clone()),
        Ipld::Bytes(bytes) => single_key_object("$bytes", base64_encode_unpadded(bytes)),
        Ipld::Link(cid) => single_key_object("$link", cid.to_string()),
        Ipld::List(items) => {
            let depth = nested_depth()?;
            Value::Array(items.iter().map(|item| ipld_to_json(item, depth, max_depth)).collect::<Result<_, _>>()?)
        }
        Ipld::Map(fields) => {
            let depth = nested_depth()?;
            let mut object = Map::new();
            for (key, field) in fields {
                object.insert(key.clone(), ipld_to_json(field, depth, max_depth)?);
            }
            Value::Object(object)
        }
    })
}

fn single_key_object(key: &str, value: String) -> Value {
    let mut object = Map::new();
    object.insert(key.to_owned(), Value::String(value));
    Value::Object(object)
}

const BASE64_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (RFC 4648 section 4) without `=` padding, as atproto's `$bytes` uses.
pub fn base64_encode_unpadded(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(base64_unpadded_len(bytes.len()));
    for chunk in bytes.chunks(3) {
        let mut group = [0u8; 4];
        group[1..1 + chunk.len()].copy_from_slice(chunk);
        let bits = u32::from_be_bytes(group);
        // n input bytes carry 8n bits: n + 1 six-bit symbols cover them.
        for symbol in 0..=chunk.len() {
            let index = (bits >> (18 - 6 * symbol)) & 0x3f;
            out.push(char::from(BASE64_ALPHABET[index as usize]));
        }
    }
    assert_eq!(out.len(), base64_unpadded_len(bytes.len()), "base64 output length");
    out
}

fn base64_unpadded_len(input_len: usize) -> usize {
    input_len / 3 * 4 + [0, 2, 3][input_len % 3]
}

// ---------------------------------------------------------------------------------------------
// Framing.

/// The blocks of one CAR, keyed by CID; the first copy of a duplicated CID wins.
struct CarBlocks<'a> {
    root: Cid,
    blocks: HashMap<Cid, &'a [u8]>,
    frames: usize,
}

impl<'a> CarBlocks<'a> {
    fn new(roots: &[Cid]) -> Result<Self, CarError> {
        match roots {
            [root] => Ok(Self { root: *root, blocks: HashMap::new(), frames: 0 }),
            _ => Err(CarError::BadHeader(format!("expected exactly one root, found {}", roots.len()))),
        }
    }

    fn insert(&mut self, cid: Cid, data: &'a [u8], frame_len: u64, limits: &CarLimits) -> Result<(), CarError> {
        if frame_len > limits.max_block_bytes as u64 {
            return Err(CarError::BlockTooBig { len: frame_len, max: limits.max_block_bytes });
        }
        if self.frames >= limits.max_blocks {
            return Err(CarError::TooManyBlocks { max: limits.max_blocks });
        }
        self.frames += 1;
        self.blocks.entry(cid).or_insert(data);
        Ok(())
    }

    fn get(&self, cid: &Cid) -> Option<&[u8]> {
        self.blocks.get(cid).copied()
    }
}

fn decode_header(bytes: &[u8]) -> Result<Vec<Cid>, CarError> {
    let header = iroh_car::CarHeader::decode(bytes).map_err(|e| CarError::BadHeader(e.to_string()))?;
    Ok(header.roots().to_vec())
}

/// A cursor over an in-memory CAR that hands out length-prefixed frames.
struct SliceFrames<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> SliceFrames<'a> {
    /// The next frame, `None` at a clean end; a frame longer than `max_len` is refused before use.
    fn next_frame(&mut self, max_len: usize) -> Result<Option<&'a [u8]>, CarError> {
        if self.offset == self.bytes.len() {
            return Ok(None);
        }
        let len = self.read_varint()?;
        if len > max_len as u64 {
            return Err(CarError::BlockTooBig { len, max: max_len });
        }
        let len = len as usize; // fits: it is at most max_len
        let rest = &self.bytes[self.offset..];
        let frame = rest.get(..len).ok_or(CarError::Truncated { offset: self.bytes.len() as u64 })?;
        self.offset += len;
        assert!(self.offset <= self.bytes.len());
        Ok(Some(frame))
    }

    /// Unsigned LEB128, minimally encoded, as multiformats requires.
    fn read_varint(&mut self) -> Result<u64, CarError> {
        let mut value = 0u64;
        for index in 0..MAX_VARINT_BYTES {
            let byte = *self.bytes.get(self.offset).ok_or(CarError::Truncated { offset: self.bytes.len() as u64 })?;
            self.offset += 1;
            let payload = u64::from(byte & 0x7f);
            if index == MAX_VARINT_BYTES - 1 && payload > 1 {
                return Err(CarError::BadFraming("length prefix overflows u64".into()));
            }
            value |= payload << (7 * index);
            if byte & 0x80 == 0 {
                if byte == 0 && index > 0 {
                    return Err(CarError::BadFraming("length prefix is not minimally encoded".into()));
                }
                return Ok(value);
            }
        }
        Err(CarError::BadFraming("length prefix longer than 10 bytes".into()))
    }
}

fn read_blocks_from_slice<'a>(bytes: &'a [u8], limits: &CarLimits) -> Result<CarBlocks<'a>, CarError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(CarError::TooBig { max_bytes: limits.max_bytes });
    }
    let mut frames = SliceFrames { bytes, offset: 0 };
    // An unreadable header frame is a header error, whatever the cause.
    let header = match frames.next_frame(limits.max_block_bytes) {
        Ok(Some(header)) => header,
        Ok(None) => return Err(CarError::Truncated { offset: 0 }),
        Err(CarError::BadFraming(reason)) => return Err(CarError::BadHeader(reason)),
        Err(other) => return Err(other),
    };
    let mut car = CarBlocks::new(&decode_header(header)?)?;
    while let Some(frame) = frames.next_frame(limits.max_block_bytes)? {
        let (cid, data) = split_frame(frame)?;
        car.insert(cid, data, frame.len() as u64, limits)?;
    }
    Ok(car)
}

/// A frame is a binary CID followed by the block bytes.
fn split_frame(frame: &[u8]) -> Result<(Cid, &[u8]), CarError> {
    let mut rest = frame;
    let cid = Cid::read_bytes(&mut rest).map_err(|e| CarError::BadFraming(format!("bad block CID: {e}")))?;
    assert_eq!(cid.encoded_len() + rest.len(), frame.len(), "CID and data must split the frame");
    Ok((cid, rest))
}

// ---------------------------------------------------------------------------------------------
// Commit and MST.

fn walk_repo(car: &CarBlocks<'_>, limits: &CarLimits) -> Result<(RepoCommit, Vec<RepoRecord>, RepoStats), CarError> {
    let root_bytes = car.get(&car.root).ok_or_else(|| CarError::NoRoot { root: car.root.to_string() })?;
    let (commit, data_root) = decode_commit(root_bytes)?;
    let mut walk = MstWalk::new(car, limits);
    walk.visit_node(&data_root, 0)?;
    let MstWalk { records, mut stats, .. } = walk;
    stats.blocks = car.frames;
    stats.records = records.len();
    Ok((commit, records, stats))
}

fn decode_ipld(bytes: &[u8]) -> Result<Ipld, String> {
    serde_ipld_dagcbor::from_slice::<Ipld>(bytes).map_err(|e| e.to_string())
}

fn decode_commit(bytes: &[u8]) -> Result<(RepoCommit, Cid), CarError> {
    let bad = CarError::BadCommit;
    let Ipld::Map(fields) = decode_ipld(bytes).map_err(bad)? else {
        return Err(bad("commit is not a map".into()));
    };
    let did = match fields.get("did") {
        Some(Ipld::String(did)) => did.clone(),
        _ => return Err(bad("missing or non-string `did`".into())),
    };
    let version = match fields.get("version") {
        Some(Ipld::Integer(version @ 2..=3)) => *version as i64, // in 2..=3, so the cast is exact
        other => return Err(bad(format!("unsupported `version` {other:?}"))),
    };
    let data = match fields.get("data") {
        Some(Ipld::Link(cid)) => *cid,
        _ => return Err(bad("missing or non-link `data`".into())),
    };
    let rev = match (fields.get("rev"), version) {
        (Some(Ipld::String(rev)), _) => rev.clone(),
        (None, 2) => String::new(),
        _ => return Err(bad("missing or non-string `rev`".into())),
    };
    Ok((RepoCommit { did, rev, data: data.to_string(), version }, data))
}

/// One decoded MST node: `l` is the subtree left of every entry, each entry's `t` the subtree
/// right of it. Keys are prefix-compressed against the previous entry of the same node.
struct MstNode {
    left: Option<Cid>,
    entries: Vec<MstEntry>,
}

struct MstEntry {
    prefix_len: usize,
    key_suffix: Vec<u8>,
    value: Cid,
    right: Option<Cid>,
}

fn decode_mst_node(cid: &Cid, bytes: &[u8]) -> Result<MstNode, CarError> {
    let bad = |reason: String| CarError::BadMstNode { cid: cid.to_string(), reason };
    let Ipld::Map(mut fields) = decode_ipld(bytes).map_err(bad)? else {
        return Err(bad("node is not a map".into()));
    };
    let left = optional_link(fields.get("l")).ok_or_else(|| bad("`l` is neither a link nor null".into()))?;
    let Some(Ipld::List(raw_entries)) = fields.remove("e") else {
        return Err(bad("`e` is missing or not a list".into()));
    };
    let entries = raw_entries.into_iter().map(decode_mst_entry).collect::<Result<_, _>>().map_err(bad)?;
    Ok(MstNode { left, entries })
}

fn decode_mst_entry(entry: Ipld) -> Result<MstEntry, String> {
    let Ipld::Map(mut fields) = entry else {
        return Err("entry is not a map".into());
    };
    let prefix_len = match fields.get("p") {
        Some(Ipld::Integer(len)) => usize::try_from(*len).map_err(|_| format!("bad prefix length {len}"))?,
        _ => return Err("entry `p` is missing or not an integer".into()),
    };
    let Some(Ipld::Bytes(key_suffix)) = fields.remove("k") else {
        return Err("entry `k` is missing or not bytes".into());
    };
    let value = match fields.get("v") {
        Some(Ipld::Link(cid)) => *cid,
        _ => return Err("entry `v` is missing or not a link".into()),
    };
    let right = optional_link(fields.get("t")).ok_or("entry `t` is neither a link nor null")?;
    Ok(MstEntry { prefix_len, key_suffix, value, right })
}

/// `Some(None)` for null or absent, `Some(Some(cid))` for a link, `None` for anything else.
fn optional_link(field: Option<&Ipld>) -> Option<Option<Cid>> {
    match field {
        None | Some(Ipld::Null) => Some(None),
        Some(Ipld::Link(cid)) => Some(Some(*cid)),
        Some(_) => None,
    }
}

/// In-order MST traversal state.
struct MstWalk<'c, 'a> {
    car: &'c CarBlocks<'a>,
    max_depth: usize,
    max_records: usize,
    max_record_depth: usize,
    visited: HashSet<Cid>,
    /// Last full key seen, across nodes, to check the global order.
    last_key: Option<Vec<u8>>,
    entries_seen: usize,
    records: Vec<RepoRecord>,
    stats: RepoStats,
}

impl<'c, 'a> MstWalk<'c, 'a> {
    fn new(car: &'c CarBlocks<'a>, limits: &CarLimits) -> Self {
        Self {
            car,
            max_depth: limits.max_mst_depth.min(MST_DEPTH_CAP),
            max_records: limits.max_records,
            max_record_depth: limits.max_record_depth,
            visited: HashSet::new(),
            last_key: None,
            entries_seen: 0,
            records: Vec::new(),
            stats: RepoStats::default(),
        }
    }

    /// Visits the subtree at `cid`: left subtree, then each entry followed by its right subtree.
    fn visit_node(&mut self, cid: &Cid, depth: usize) -> Result<(), CarError> {
        if depth > self.max_depth {
            return Err(CarError::MstTooDeep { max: self.max_depth });
        }
        // A well-formed MST reaches every node exactly once: a second visit means a cycle or a DAG.
        if !self.visited.insert(*cid) {
            return Err(CarError::MstCycle { cid: cid.to_string() });
        }
        let Some(bytes) = self.car.get(cid) else {
            self.stats.missing_blocks += 1;
            return Ok(());
        };
        let node = decode_mst_node(cid, bytes)?;
        self.stats.mst_nodes += 1;
        if let Some(left) = &node.left {
            self.visit_node(left, depth + 1)?;
        }
        let mut key = Vec::new();
        for entry in &node.entries {
            key = expand_key(cid, &key, entry)?;
            self.visit_entry(&key, &entry.value)?;
            if let Some(right) = &entry.right {
                self.visit_node(right, depth + 1)?;
            }
        }
        Ok(())
    }

    fn visit_entry(&mut self, key: &[u8], value: &Cid) -> Result<(), CarError> {
        self.entries_seen += 1;
        if self.entries_seen > self.max_records {
            return Err(CarError::TooManyRecords { max: self.max_records });
        }
        if self.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(CarError::MstKeyOrder { key: String::from_utf8_lossy(key).into_owned() });
        }
        self.last_key = Some(key.to_vec());
        let Some((collection, rkey)) = split_key(key) else {
            self.stats.bad_records += 1;
            return Ok(());
        };
        let Some(block) = self.car.get(value) else {
            self.stats.missing_blocks += 1;
            return Ok(());
        };
        match decode_record(block, self.max_record_depth) {
            Ok(record) => self.records.push(RepoRecord { collection, rkey, cid: value.to_string(), record }),
            Err(_) => self.stats.bad_records += 1,
        }
        Ok(())
    }
}

/// Rebuilds an entry's full key from the previous key of the same node.
fn expand_key(node: &Cid, previous: &[u8], entry: &MstEntry) -> Result<Vec<u8>, CarError> {
    let bad = |reason: String| CarError::BadMstNode { cid: node.to_string(), reason };
    let prefix = previous
        .get(..entry.prefix_len)
        .ok_or_else(|| bad(format!("prefix length {} exceeds previous key", entry.prefix_len)))?;
    if prefix.len() + entry.key_suffix.len() > MAX_MST_KEY_BYTES {
        return Err(bad(format!("key longer than {MAX_MST_KEY_BYTES} bytes")));
    }
    let key = [prefix, &entry.key_suffix].concat();
    assert_eq!(key.len(), entry.prefix_len + entry.key_suffix.len());
    Ok(key)
}

/// `collection/rkey`, both non-empty, exactly one `/`, UTF-8.
fn split_key(key: &[u8]) -> Option<(String, String)> {
    let key = std::str::from_utf8(key).ok()?;
    let (collection, rkey) = key.split_once('/')?;
    let well_formed = !collection.is_empty() && !rkey.is_empty() && !rkey.contains('/');
    well_formed.then(|| (collection.to_owned(), rkey.to_owned()))
}

fn decode_record(block: &[u8], max_depth: usize) -> Result<Value, CarError> {
    let ipld = decode_ipld(block).map_err(CarError::RecordDecode)?;
    if !matches!(ipld, Ipld::Map(_)) {
        return Err(CarError::RecordNotObject);
    }
    dagcbor_to_json(&ipld, max_depth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn ipld_map<const N: usize>(fields: [(&str, Ipld); N]) -> Ipld {
        Ipld::Map(fields.into_iter().map(|(key, value)| (key.to_owned(), value)).collect::<BTreeMap<_, _>>())
    }

    /// Test-side decoder, written independently of the encoder, for round trips.
    fn base64_decode_unpadded(text: &str) -> Option<Vec<u8>> {
        let mut bits = 0u32;
        let mut bit_count = 0;
        let mut out = Vec::new();
        for symbol in text.bytes() {
            let value = BASE64_ALPHABET.iter().position(|&c| c == symbol)? as u32;
            bits = (bits << 6) | value;
            bit_count += 6;
            if bit_count >= 8 {
                bit_count -= 8;
                out.push((bits >> bit_count) as u8);
                bits &= (1 << bit_count) - 1;
            }
        }
        (bits == 0).then_some(out)
    }

    #[test]
    fn base64_matches_rfc4648_vectors_without_padding() {
        let vectors = [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg")];
        for (input, expected) in vectors.into_iter().chain([("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy")]) {
            assert_eq!(base64_encode_unpadded(input.as_bytes()), expected);
            assert_eq!(base64_decode_unpadded(expected).as_deref(), Some(input.as_bytes()));
        }
        assert_eq!(base64_encode_unpadded(&[0xfb, 0xff]), "+/8");
    }

    proptest! {
        #[test]
        fn base64_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let text = base64_encode_unpadded(&bytes);
            prop_assert_eq!(text.len(), base64_unpadded_len(bytes.len()));
            prop_assert_eq!(base64_decode_unpadded(&text), Some(bytes));
        }

        #[test]
        fn slice_reader_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = read_repo_bytes(&bytes, &CarLimits::default());
        }
    }

    #[test]
    fn json_conversion_follows_the_atproto_data_model() {
        let cid: Cid = "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy".parse().unwrap();
        let record = ipld_map([
            ("b", Ipld::Bytes(vec![1, 2, 3, 4])),
            ("l", Ipld::Link(cid)),
            ("n", Ipld::List(vec![Ipld::Null, Ipld::Bool(true), Ipld::Integer(-7)])),
            ("s", Ipld::String("x".into())),
        ]);
        let expected = serde_json::json!({
            "b": {"$bytes": "AQIDBA"},
            "l": {"$link": "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy"},
            "n": [null, true, -7],
            "s": "x",
        });
        assert_eq!(dagcbor_to_json(&record, 8).unwrap(), expected);
    }

    #[test]
    fn json_conversion_rejects_floats_big_integers_and_deep_nesting() {
        let float = ipld_map([("f", Ipld::Float(1.5))]);
        assert!(matches!(dagcbor_to_json(&float, 8), Err(CarError::RecordFloat)));
        let big = Ipld::Integer(i128::from(i64::MAX) + 1);
        assert!(matches!(dagcbor_to_json(&big, 8), Err(CarError::RecordInteger(_))));
        let nested = Ipld::List(vec![Ipld::List(vec![Ipld::List(vec![])])]);
        assert!(dagcbor_to_json(&nested, 3).is_ok());
        assert!(matches!(dagcbor_to_json(&nested, 2), Err(CarError::RecordTooDeep { max: 2 })));
    }

    #[test]
    fn keys_split_into_collection_and_rkey() {
        assert_eq!(split_key(b"app.bsky.feed.post/3k"), Some(("app.bsky.feed.post".into(), "3k".into())));
        assert_eq!(split_key(b"app.bsky.feed.post"), None);
        assert_eq!(split_key(b"a/b/c"), None);
        assert_eq!(split_key(b"/x"), None);
        assert_eq!(split_key(&[0xff, b'/', b'x']), None);
    }

    /// The header frame of a real repo CAR (one root, version 1).
    const HEADER_HEX: &str = "3aa265726f6f747381d82a5825000171122069c0e6977d9999baddb2377c23f3f53752df512d2101efdcbc63e76ed050cebc6776657273696f6e01";

    fn from_hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap()).collect()
    }

    /// Found by the `car` fuzz target: a 10-byte length prefix whose last byte overflows u64 is
    /// bad framing, not another length (dropping the high bits would read a too-big block, or a
    /// frame of the wrong size). Both readers share the slice parser.
    #[test]
    fn an_overflowing_length_prefix_is_bad_framing_in_both_readers() {
        let car = [from_hex(HEADER_HEX), vec![0x8c; 9], vec![0x0c]].concat();
        let from_slice = read_repo_bytes(&car, &CarLimits::default());
        assert!(matches!(&from_slice, Err(CarError::BadFraming(reason)) if reason.contains("overflows")));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let streamed = runtime.block_on(read_repo(&car[..], &CarLimits::default()));
        assert!(matches!(&streamed, Err(CarError::BadFraming(reason)) if reason.contains("overflows")), "{streamed:?}");
    }

    #[test]
    fn varints_must_be_minimal_and_bounded() {
        let read = |bytes: &[u8]| SliceFrames { bytes, offset: 0 }.read_varint();
        assert_eq!(read(&[0x00]).unwrap(), 0);
        assert_eq!(read(&[0xac, 0x02]).unwrap(), 300);
        assert!(matches!(read(&[0x80, 0x00]), Err(CarError::BadFraming(_))));
        assert!(matches!(read(&[0x80]), Err(CarError::Truncated { .. })));
        assert!(matches!(read(&[0xff; 11]), Err(CarError::BadFraming(_))));
        assert_eq!(read(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).unwrap(), u64::MAX);
    }
}
