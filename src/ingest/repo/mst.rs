//! The Merkle Search Tree under a commit, walked in key order, its shape checked as it goes.
//!
//! A node is `{l: link|null, e: [{p, k, v, t}]}`: `l` the subtree before every key of the node,
//! each entry a key (`p` bytes shared with the previous key of the node, then `k`), the record
//! `v`, and `t` the subtree between it and the next key. A key's height is half the leading zero
//! bits of its SHA-256; every key of a node has the node's layer as its height, and children sit
//! exactly one layer lower.
//!
//! Invariants:
//! - The records returned are exactly those reachable from the commit's root, in strictly
//!   increasing key order; every block on the way hashed to its CID (`framing::CarIndex::block`).
//! - Every node is decoded once (a second visit is a cycle or a shared subtree: an error), every
//!   distinct record block at most once; the bytes of records referenced, repeats included, stay
//!   under `CarLimits::referenced_limit`, so a small CAR cannot make the walk (or the extraction
//!   after it) do unbounded work.
//! - Depth, entries and time are bounded (`max_mst_depth`, `max_records`, the deadline).

use super::framing::CarIndex;
use super::json::dagcbor_to_json;
use super::{CarError, CarLimits, RepoRecord, RepoStats};
use ipld_core::cid::Cid;
use ipld_core::ipld::Ipld;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// Longest MST key accepted: an NSID (at most 317 chars), `/`, and a record key (at most 512).
pub const MAX_MST_KEY_BYTES: usize = 1024;
/// Hard cap on the walk's recursion, whatever the limits say (the DAG-CBOR decoder nests at most
/// 256 levels too).
pub const MST_DEPTH_CAP: usize = 256;
/// Entries visited between looks at the deadline.
const DEADLINE_EVERY: usize = 256;

/// One decoded MST node.
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

/// In-order traversal state.
pub(super) struct MstWalk<'c, 'a> {
    car: &'c CarIndex<'a>,
    max_depth: usize,
    max_records: usize,
    max_record_depth: usize,
    referenced_limit: u64,
    deadline: Option<Instant>,
    visited: HashSet<Cid>,
    /// Each record block decoded so far: its value (`None`: not an atproto record) and size.
    decoded: HashMap<Cid, (Option<Arc<Value>>, u64)>,
    referenced: u64,
    entries_seen: usize,
    /// Last full key seen, across nodes, to check the global order.
    last_key: Option<Vec<u8>>,
    pub records: Vec<RepoRecord>,
    pub stats: RepoStats,
}

impl<'c, 'a> MstWalk<'c, 'a> {
    pub fn new(car: &'c CarIndex<'a>, limits: &CarLimits, deadline: Option<Instant>) -> Self {
        Self {
            car,
            max_depth: limits.max_mst_depth.min(MST_DEPTH_CAP),
            max_records: limits.max_records,
            max_record_depth: limits.max_record_depth,
            referenced_limit: limits.referenced_limit(car.len),
            deadline,
            visited: HashSet::new(),
            decoded: HashMap::new(),
            referenced: 0,
            entries_seen: 0,
            last_key: None,
            records: Vec::new(),
            stats: RepoStats::default(),
        }
    }

    /// Walks the whole tree from its root.
    pub fn walk(&mut self, root: &Cid) -> Result<(), CarError> {
        self.visit_node(root, None, 0)
    }

    /// Visits the subtree at `cid`, whose layer is `layer` (`None` for the root, whose keys say
    /// it): left subtree, then each entry followed by its right subtree.
    fn visit_node(&mut self, cid: &Cid, layer: Option<u32>, depth: usize) -> Result<(), CarError> {
        if depth > self.max_depth {
            return Err(CarError::MstTooDeep { max: self.max_depth });
        }
        if !self.visited.insert(*cid) {
            return Err(CarError::MstCycle { cid: cid.to_string() });
        }
        self.check_deadline()?;
        let node = decode_mst_node(cid, &self.car.block(cid)?)?;
        self.stats.mst_nodes += 1;
        let keys = expand_keys(cid, &node.entries)?;
        let layer = node_layer(cid, &node, &keys, layer)?;
        let child_layer = |child: &Option<Cid>| -> Result<Option<u32>, CarError> {
            match (child, layer.checked_sub(1)) {
                (None, _) => Ok(None),
                (Some(_), Some(below)) => Ok(Some(below)),
                (Some(_), None) => Err(shape(cid, "a node of layer 0 has a subtree")),
            }
        };
        if let (Some(left), Some(below)) = (&node.left, child_layer(&node.left)?) {
            self.visit_node(left, Some(below), depth + 1)?;
        }
        for (entry, key) in node.entries.iter().zip(&keys) {
            self.visit_entry(key, &entry.value)?;
            if let (Some(right), Some(below)) = (&entry.right, child_layer(&entry.right)?) {
                self.visit_node(right, Some(below), depth + 1)?;
            }
        }
        Ok(())
    }

    fn visit_entry(&mut self, key: &[u8], value: &Cid) -> Result<(), CarError> {
        self.entries_seen += 1;
        if self.entries_seen > self.max_records {
            return Err(CarError::TooManyRecords { max: self.max_records });
        }
        if self.entries_seen.is_multiple_of(DEADLINE_EVERY) {
            self.check_deadline()?;
        }
        if self.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(CarError::MstKeyOrder { key: String::from_utf8_lossy(key).into_owned() });
        }
        self.last_key = Some(key.to_vec());
        let record = self.record(value)?;
        match (split_key(key), record) {
            (Some((collection, rkey)), Some(record)) => {
                self.records.push(RepoRecord { collection, rkey, cid: value.to_string(), record })
            }
            _ => self.stats.bad_records += 1,
        }
        Ok(())
    }

    /// The record at `cid`, decoded the first time it is referenced; `None` when its block is not
    /// an atproto record (counted, not fatal: the rest of the repository stands).
    fn record(&mut self, cid: &Cid) -> Result<Option<Arc<Value>>, CarError> {
        let (record, size) = match self.decoded.get(cid) {
            Some((record, size)) => (record.clone(), *size),
            None => {
                let block = self.car.block(cid)?;
                let record = decode_record(&block, self.max_record_depth).ok().map(Arc::new);
                self.decoded.insert(*cid, (record.clone(), block.len() as u64));
                (record, block.len() as u64)
            }
        };
        self.referenced += size;
        if self.referenced > self.referenced_limit {
            return Err(CarError::TooMuchReferenced { limit: self.referenced_limit });
        }
        Ok(record)
    }

    fn check_deadline(&self) -> Result<(), CarError> {
        match self.deadline {
            Some(deadline) if Instant::now() > deadline => Err(CarError::Deadline),
            _ => Ok(()),
        }
    }
}

/// The layer of a node: its keys' common height (checked for every key); a non-root node with no
/// keys (only a left subtree) has the layer its parent gave it. The root may be empty only when
/// the whole repository is (no keys, no subtree).
fn node_layer(cid: &Cid, node: &MstNode, keys: &[Vec<u8>], given: Option<u32>) -> Result<u32, CarError> {
    let Some(first) = keys.first() else {
        return match (given, &node.left) {
            (None, None) => Ok(0),
            (None, Some(_)) => Err(shape(cid, "the root is a bare pointer to a subtree")),
            (Some(_), None) => Err(shape(cid, "an empty node below the root")),
            (Some(layer), Some(_)) => Ok(layer),
        };
    };
    let layer = key_height(first);
    if given.is_some_and(|given| given != layer) || keys.iter().any(|key| key_height(key) != layer) {
        return Err(shape(cid, "a key's height is not its node's layer"));
    }
    Ok(layer)
}

/// Half the leading zero bits of the key's SHA-256 (two bits per layer).
pub fn key_height(key: &[u8]) -> u32 {
    let hash = Sha256::digest(key);
    let mut zeros = 0;
    for byte in hash {
        zeros += byte.leading_zeros();
        if byte != 0 {
            break;
        }
    }
    zeros / 2
}

fn shape(cid: &Cid, reason: &str) -> CarError {
    CarError::BadMstNode { cid: cid.to_string(), reason: reason.to_string() }
}

fn decode_mst_node(cid: &Cid, bytes: &[u8]) -> Result<MstNode, CarError> {
    let bad = |reason: String| CarError::BadMstNode { cid: cid.to_string(), reason };
    let Ipld::Map(mut fields) = serde_ipld_dagcbor::from_slice::<Ipld>(bytes).map_err(|e| bad(e.to_string()))? else {
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

/// Every entry's full key, each rebuilt from the previous key of the same node.
fn expand_keys(node: &Cid, entries: &[MstEntry]) -> Result<Vec<Vec<u8>>, CarError> {
    let bad = |reason: String| CarError::BadMstNode { cid: node.to_string(), reason };
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(entries.len());
    for entry in entries {
        let previous = keys.last().map_or(&[][..], Vec::as_slice);
        let prefix = previous
            .get(..entry.prefix_len)
            .ok_or_else(|| bad(format!("prefix length {} exceeds previous key", entry.prefix_len)))?;
        if prefix.len() + entry.key_suffix.len() > MAX_MST_KEY_BYTES {
            return Err(bad(format!("key longer than {MAX_MST_KEY_BYTES} bytes")));
        }
        let key = [prefix, &entry.key_suffix].concat();
        assert_eq!(key.len(), entry.prefix_len + entry.key_suffix.len());
        keys.push(key);
    }
    Ok(keys)
}

/// `collection/rkey`, both non-empty, exactly one `/`, UTF-8.
pub(super) fn split_key(key: &[u8]) -> Option<(String, String)> {
    let key = std::str::from_utf8(key).ok()?;
    let (collection, rkey) = key.split_once('/')?;
    let well_formed = !collection.is_empty() && !rkey.is_empty() && !rkey.contains('/');
    well_formed.then(|| (collection.to_owned(), rkey.to_owned()))
}

fn decode_record(block: &[u8], max_depth: usize) -> Result<Value, CarError> {
    let ipld = serde_ipld_dagcbor::from_slice::<Ipld>(block).map_err(|e| CarError::RecordDecode(e.to_string()))?;
    if !matches!(ipld, Ipld::Map(_)) {
        return Err(CarError::RecordNotObject);
    }
    dagcbor_to_json(&ipld, max_depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interop key-height vectors (`tests/data/interop-mst`), and the example keys whose
    /// second character is their height.
    #[test]
    fn key_heights_match_the_interop_vectors() {
        let dir = format!("{}/tests/data/interop-mst", env!("CARGO_MANIFEST_DIR"));
        let vectors: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(format!("{dir}/key_heights.json")).unwrap()).unwrap();
        assert_eq!(vectors.len(), 9);
        for vector in vectors {
            let key = vector["key"].as_str().unwrap();
            assert_eq!(u64::from(key_height(key.as_bytes())), vector["height"].as_u64().unwrap(), "{key:?}");
        }
        let examples = std::fs::read_to_string(format!("{dir}/example_keys.txt")).unwrap();
        let mut checked = 0;
        for key in examples.lines().filter(|line| !line.is_empty()) {
            let height = key.as_bytes()[1] - b'0';
            assert_eq!(key_height(key.as_bytes()), u32::from(height), "{key}");
            checked += 1;
        }
        assert!(checked > 100);
    }

    #[test]
    fn keys_split_into_collection_and_rkey() {
        assert_eq!(split_key(b"app.bsky.feed.post/3k"), Some(("app.bsky.feed.post".into(), "3k".into())));
        assert_eq!(split_key(b"app.bsky.feed.post"), None);
        assert_eq!(split_key(b"a/b/c"), None);
        assert_eq!(split_key(b"/x"), None);
        assert_eq!(split_key(&[0xff, b'/', b'x']), None);
    }
}
