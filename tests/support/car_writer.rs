//! Writes repository CARs by hand, for tests and benchmarks: CAR v1 framing, DAG-CBOR blocks with
//! their real CIDs, MST nodes, commits signed with a test key, and a generated repository of any
//! size whose tree follows the MST rules (built here, sharing no code with the reader).
#![allow(dead_code)] // each test or benchmark that includes it uses a part

use ipld_core::cid::Cid;
use ipld_core::cid::multihash::Multihash;
use ipld_core::ipld::Ipld;
use k256::ecdsa::signature::hazmat::PrehashSigner;
use sha2::{Digest, Sha256};

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

/// The CID of a block's bytes: CIDv1, dag-cbor, sha2-256.
pub fn cid_of_bytes(bytes: &[u8]) -> Cid {
    Cid::new_v1(0x71, Multihash::wrap(0x12, &Sha256::digest(bytes)).unwrap())
}

/// The CID of a DAG-CBOR value.
pub fn cid_of(block: &Ipld) -> Cid {
    cid_of_bytes(&serde_ipld_dagcbor::to_vec(block).unwrap())
}

/// A DAG-CBOR CID over a made-up sha2-256 digest (a block that is not in the CAR, or that is
/// not what it claims to be).
pub fn fake_cid(seed: u32) -> Cid {
    let mut digest = [0u8; 32];
    digest[..4].copy_from_slice(&seed.to_be_bytes());
    Cid::new_v1(0x71, Multihash::wrap(0x12, &digest).unwrap())
}

pub fn map<const N: usize>(fields: [(&str, Ipld); N]) -> Ipld {
    Ipld::Map(fields.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}

/// A block with its real CID.
pub fn block(value: Ipld) -> (Cid, Ipld) {
    (cid_of(&value), value)
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

/// The deterministic test key of `seed` (secp256k1).
pub fn signing_key(seed: u8) -> k256::ecdsa::SigningKey {
    k256::ecdsa::SigningKey::from_slice(&[seed.max(1); 32]).unwrap()
}

/// Its Multikey, as a DID document's `#atproto` method holds it.
pub fn multikey(key: &k256::ecdsa::SigningKey) -> String {
    let point = key.verifying_key().to_sec1_point(true);
    ipld_core::cid::multibase::encode(
        ipld_core::cid::multibase::Base::Base58Btc,
        [&[0xe7, 0x01][..], point.as_bytes()].concat(),
    )
}

/// A version 3 commit of `did` at `rev` whose MST root is `data`, signed by `key` (a made-up
/// signature when `None`).
pub fn commit_block(did: &str, rev: &str, data: Cid, key: Option<&k256::ecdsa::SigningKey>) -> Ipld {
    let unsigned = map([
        ("did", Ipld::String(did.into())),
        ("version", Ipld::Integer(3)),
        ("data", Ipld::Link(data)),
        ("rev", Ipld::String(rev.into())),
        ("prev", Ipld::Null),
    ]);
    let sig = match key {
        Some(key) => {
            let digest = Sha256::digest(serde_ipld_dagcbor::to_vec(&unsigned).unwrap());
            let signature: k256::ecdsa::Signature = key.sign_prehash(&digest).unwrap();
            signature.to_bytes().to_vec()
        }
        None => vec![7; 64],
    };
    let Ipld::Map(mut fields) = unsigned else { unreachable!() };
    fields.insert("sig".into(), Ipld::Bytes(sig));
    Ipld::Map(fields)
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

/// A key's MST height: two bits per layer of leading zeros in its SHA-256.
pub fn height(key: &str) -> u32 {
    let hash = Sha256::digest(key.as_bytes());
    let zeros: u32 = hash.iter().map(|b| b.leading_zeros()).take_while(|&z| z == 8).sum();
    let first_nonzero = hash.iter().find(|&&b| b != 0).map_or(0, |b| b.leading_zeros());
    (zeros + first_nonzero) / 2
}

/// The MST over sorted `(key, record CID)` pairs, by the rules: a node holds the keys of its
/// layer, the runs of lower keys between them hang one layer down. Returns the root's CID and
/// the nodes (appended to `blocks`).
pub fn build_mst(keys: &[(String, Cid)], blocks: &mut Vec<(Cid, Ipld)>) -> Cid {
    let layer = keys.iter().map(|(key, _)| height(key)).max().unwrap_or(0);
    build_node(keys, layer, blocks)
}

fn build_node(keys: &[(String, Cid)], layer: u32, blocks: &mut Vec<(Cid, Ipld)>) -> Cid {
    let subtree = |run: &[(String, Cid)], blocks: &mut Vec<(Cid, Ipld)>| {
        (!run.is_empty()).then(|| build_node(run, layer - 1, blocks))
    };
    let here: Vec<usize> = (0..keys.len()).filter(|&i| height(&keys[i].0) == layer).collect();
    let left = subtree(&keys[..here.first().copied().unwrap_or(keys.len())], blocks);
    let (mut entries, mut previous) = (Vec::new(), "");
    for (n, &i) in here.iter().enumerate() {
        let next = here.get(n + 1).copied().unwrap_or(keys.len());
        let right = subtree(&keys[i + 1..next], blocks);
        let key = keys[i].0.as_str();
        let shared = key.bytes().zip(previous.bytes()).take_while(|(a, b)| a == b).count();
        entries.push(mst_entry(shared, &key[shared..], keys[i].1, right));
        previous = key;
    }
    let (cid, node) = block(mst_node(left, entries));
    blocks.push((cid, node));
    cid
}

/// A like of a post by one of a few hundred authors.
pub fn like_record(i: usize) -> Ipld {
    let post = backlinks::model::tid::format_tid(1_600_000_000_000_000 + (i as u64 * 7919) % 50_000);
    map([
        ("$type", Ipld::String("app.bsky.feed.like".into())),
        ("createdAt", Ipld::String("2024-01-01T00:00:00.000Z".into())),
        (
            "subject",
            map([
                ("uri", Ipld::String(format!("at://did:plc:author{:016}/app.bsky.feed.post/{post}", i % 300))),
                ("cid", Ipld::String("bafyreib2rxk3rh6kzwqqlrwyodnwulkyt3wctg6dqdjgeqfqfxfgbl4l7y".into())),
            ]),
        ),
    ])
}

/// A repository CAR of `records` likes, its commit at `rev` signed by `key` (unsigned when
/// `None`), blocks in an order a PDS might use (commit, then records, then nodes).
pub fn signed_repo(did: &str, rev: &str, records: usize, key: Option<&k256::ecdsa::SigningKey>) -> Vec<u8> {
    let mut blocks = Vec::new();
    let keys: Vec<(String, Cid)> = (0..records)
        .map(|i| {
            let rkey = backlinks::model::tid::format_tid(1_700_000_000_000_000 + i as u64 * 997);
            let (cid, record) = block(like_record(i));
            blocks.push((cid, record));
            (format!("app.bsky.feed.like/{rkey}"), cid)
        })
        .collect();
    let root = build_mst(&keys, &mut blocks);
    let (commit, commit_value) = block(commit_block(did, rev, root, key));
    blocks.insert(0, (commit, commit_value));
    encode_car(&[commit], &blocks)
}

/// `signed_repo` with a made-up signature, at a fixed past rev.
pub fn generated_repo(did: &str, records: usize) -> Vec<u8> {
    signed_repo(did, "3m2jradrsah2s", records, None)
}

/// The records of a real repository CAR, moved into a new repository of `did` at `rev` signed by
/// `key`: the same record blocks, byte for byte, under a tree and commit built here.
pub fn rehome(car: &[u8], did: &str, rev: &str, key: &k256::ecdsa::SigningKey) -> Vec<u8> {
    let (commit, blocks) = repo_blocks(&records_of(car), did, rev, Some(key));
    encode_car(&[commit], &blocks)
}

/// Every record of a CAR: its key (`collection/rkey`) and its block, as the CAR holds it.
pub fn records_of(car: &[u8]) -> Vec<(String, Ipld)> {
    let any = backlinks::ingest::repo::Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };
    let repo = backlinks::ingest::repo::read_repo_bytes(car, &Default::default(), &any).expect("a readable CAR");
    let raw = raw_blocks(car);
    repo.records
        .iter()
        .map(|record| {
            let cid: Cid = record.cid.parse().unwrap();
            let value: Ipld = serde_ipld_dagcbor::from_slice(&raw[&cid]).unwrap();
            assert_eq!(cid_of(&value), cid, "the record re-encodes to its own bytes");
            (format!("{}/{}", record.collection, record.rkey), value)
        })
        .collect()
}

/// The blocks of a repository holding `records` (sorted by key), its commit first: the commit's
/// CID and every block, each record block once.
pub fn repo_blocks(
    records: &[(String, Ipld)],
    did: &str,
    rev: &str,
    key: Option<&k256::ecdsa::SigningKey>,
) -> (Cid, Vec<(Cid, Ipld)>) {
    let (mut blocks, mut keys, mut seen) = (Vec::new(), Vec::new(), std::collections::HashSet::new());
    let mut sorted: Vec<&(String, Ipld)> = records.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, value) in sorted {
        let cid = cid_of(value);
        if seen.insert(cid) {
            blocks.push((cid, value.clone()));
        }
        keys.push((path.clone(), cid));
    }
    let root = build_mst(&keys, &mut blocks);
    let (commit, commit_value) = block(commit_block(did, rev, root, key));
    blocks.insert(0, (commit, commit_value));
    (commit, blocks)
}

/// Every block of a CAR by its CID, unchecked (the test's own input).
pub fn raw_blocks(car: &[u8]) -> std::collections::HashMap<Cid, Vec<u8>> {
    let mut blocks = std::collections::HashMap::new();
    let mut at = 0;
    let mut first = true;
    while at < car.len() {
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let byte = car[at];
            at += 1;
            len |= ((byte & 0x7f) as usize) << shift;
            shift += 7;
            if byte < 0x80 {
                break;
            }
        }
        let frame = &car[at..at + len];
        at += len;
        if std::mem::take(&mut first) {
            continue; // the header
        }
        let mut cursor = std::io::Cursor::new(frame);
        let cid = Cid::read_bytes(&mut cursor).unwrap();
        blocks.insert(cid, frame[cursor.position() as usize..].to_vec());
    }
    blocks
}
