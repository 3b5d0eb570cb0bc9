//! Writes repository CARs by hand, for tests and benchmarks: CAR v1 framing, DAG-CBOR blocks,
//! commits, MST nodes, and a generated repository of any size. CIDs are made-up digests: the
//! reader does not verify hashes, so any graph can be wired.
#![allow(dead_code)] // each test or benchmark that includes it uses a part

use ipld_core::cid::Cid;
use ipld_core::cid::multihash::Multihash;
use ipld_core::ipld::Ipld;

/// Length-prefixes one frame (unsigned LEB128).
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut len = payload.len();
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(payload);
    out
}

/// A DAG-CBOR CID over a made-up sha2-256 digest.
pub fn fake_cid(seed: u32) -> Cid {
    let mut digest = [0u8; 32];
    digest[..4].copy_from_slice(&seed.to_be_bytes());
    Cid::new_v1(0x71, Multihash::wrap(0x12, &digest).unwrap())
}

pub fn map<const N: usize>(fields: [(&str, Ipld); N]) -> Ipld {
    Ipld::Map(fields.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}

pub fn encode_car(roots: &[Cid], blocks: &[(Cid, Ipld)]) -> Vec<u8> {
    let header =
        map([("roots", Ipld::List(roots.iter().map(|r| Ipld::Link(*r)).collect())), ("version", Ipld::Integer(1))]);
    let mut car = frame(&serde_ipld_dagcbor::to_vec(&header).unwrap());
    for (cid, block) in blocks {
        car.extend(frame(&[cid.to_bytes(), serde_ipld_dagcbor::to_vec(block).unwrap()].concat()));
    }
    car
}

/// A version 3 commit of `did` at `rev` whose MST root is `data`.
pub fn commit_block(did: &str, rev: &str, data: Cid) -> Ipld {
    map([
        ("did", Ipld::String(did.into())),
        ("version", Ipld::Integer(3)),
        ("data", Ipld::Link(data)),
        ("rev", Ipld::String(rev.into())),
        ("prev", Ipld::Null),
        ("sig", Ipld::Bytes(vec![7; 64])),
    ])
}

pub fn mst_node(left: Option<Cid>, entries: Vec<Ipld>) -> Ipld {
    map([("l", left.map_or(Ipld::Null, Ipld::Link)), ("e", Ipld::List(entries))])
}

/// An MST entry: `prefix_len` bytes shared with the previous key of the node, then `suffix`;
/// `right` is the subtree of keys between this one and the next.
pub fn mst_entry(prefix_len: usize, suffix: &str, value: Cid, right: Option<Cid>) -> Ipld {
    map([
        ("p", Ipld::Integer(prefix_len as i128)),
        ("k", Ipld::Bytes(suffix.into())),
        ("v", Ipld::Link(value)),
        ("t", right.map_or(Ipld::Null, Ipld::Link)),
    ])
}

/// The entries of one node over sorted `keys`, prefix-compressed, with their subtrees.
fn node_entries(keys: &[(String, Cid, Option<Cid>)]) -> Vec<Ipld> {
    let mut previous = "";
    keys.iter()
        .map(|(key, value, right)| {
            let shared = key.bytes().zip(previous.bytes()).take_while(|(a, b)| a == b).count();
            previous = key;
            mst_entry(shared, &key[shared..], *value, *right)
        })
        .collect()
}

/// A repository of `records` likes (of posts by a few hundred authors), as a two-level MST:
/// leaves of up to `FANOUT` keys hang between the keys of one root node.
pub fn generated_repo(did: &str, records: usize) -> Vec<u8> {
    const FANOUT: usize = 1000;
    let mut next_seed = 16u32;
    let mut cid = || {
        next_seed += 1;
        fake_cid(next_seed)
    };
    let mut blocks = Vec::new();
    let keys: Vec<(String, Cid)> = (0..records)
        .map(|i| {
            let rkey = backlinks::model::tid::format_tid(1_700_000_000_000_000 + i as u64 * 997);
            let post = backlinks::model::tid::format_tid(1_600_000_000_000_000 + (i as u64 * 7919) % 50_000);
            let record = map([
                ("$type", Ipld::String("app.bsky.feed.like".into())),
                ("createdAt", Ipld::String("2024-01-01T00:00:00.000Z".into())),
                (
                    "subject",
                    map([
                        ("uri", Ipld::String(format!("at://did:plc:author{:016}/app.bsky.feed.post/{post}", i % 300))),
                        ("cid", Ipld::String("bafyreib2rxk3rh6kzwqqlrwyodnwulkyt3wctg6dqdjgeqfqfxfgbl4l7y".into())),
                    ]),
                ),
            ]);
            let record_cid = cid();
            blocks.push((record_cid, record));
            (format!("app.bsky.feed.like/{rkey}"), record_cid)
        })
        .collect();
    // Root keys every FANOUT + 1 keys; the leaves hold the runs between them.
    let mut leaf = |run: &[(String, Cid)], blocks: &mut Vec<(Cid, Ipld)>| -> Option<Cid> {
        if run.is_empty() {
            return None;
        }
        let entries = node_entries(&run.iter().map(|(k, v)| (k.clone(), *v, None)).collect::<Vec<_>>());
        let node_cid = cid();
        blocks.push((node_cid, mst_node(None, entries)));
        Some(node_cid)
    };
    let chunks: Vec<&[(String, Cid)]> = keys.chunks(FANOUT + 1).collect();
    let left = chunks.first().and_then(|c| leaf(&c[..c.len().min(FANOUT)], &mut blocks));
    let mut root_keys = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        if chunk.len() <= FANOUT {
            break;
        }
        let (key, value) = chunk[FANOUT].clone();
        let next = chunks.get(i + 1).map_or(&[][..], |c| &c[..c.len().min(FANOUT)]);
        root_keys.push((key, value, leaf(next, &mut blocks)));
    }
    let root = cid();
    blocks.push((root, mst_node(left, node_entries(&root_keys))));
    let commit = cid();
    blocks.insert(0, (commit, commit_block(did, "3m2jradrsah2s", root)));
    encode_car(&[commit], &blocks)
}
