//! Repository CAR reading against real fixtures (tests/data/car, see SOURCE.md there).
//!
//! Invariants checked:
//! - the jetstream repo matches, row for row, the listing indigo's `goat` produced for it;
//! - every fixture reads the same through the async reader and the slice reader;
//! - record counts are exact, and agree with an independent breadth-first count of the MST made
//!   here with our own CAR framing parser;
//! - records come out in strictly increasing `collection/rkey` order;
//! - JSON conversion of real records matches expected JSON literally;
//! - truncated, oversized and hostile inputs give the right `CarError`, never a panic;
//! - links extracted from the fixture records sit at the expected paths, and never come from a CID.

#[path = "support/car_readers.rs"]
mod car_readers;
#[path = "support/car_writer.rs"]
mod car_writer;

use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::ingest::car::{
    CarError, CarLimits, RepoCommit, RepoRecord, RepoStats, base64_encode_unpadded, dagcbor_to_json, read_repo,
    read_repo_bytes,
};
use backlinks::model::syntax::LinkTarget;
use car_readers::{RepoResult, agree};
use car_writer::{encode_car, fake_cid, frame, map, mst_node};
use ipld_core::cid::Cid;
use ipld_core::ipld::Ipld;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/car");
const JETSTREAM_REPO: &str = "jetstream/repo.car";

fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}/{path}")).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

fn read_async(bytes: &[u8], limits: &CarLimits) -> RepoResult {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    // A small buffer makes the async reader cross many partial reads.
    runtime.block_on(read_repo(tokio::io::BufReader::with_capacity(97, bytes), limits))
}

/// Reads through both readers and checks they agree: same value, or the same error variant.
fn read_both(bytes: &[u8], limits: &CarLimits) -> RepoResult {
    agree(read_repo_bytes(bytes, limits), read_async(bytes, limits))
}

fn read_fixture(path: &str) -> (RepoCommit, Vec<RepoRecord>, RepoStats) {
    read_both(&fixture(path), &CarLimits::default()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// An independent CAR parser and MST counter, sharing no code with the module under test.

struct RawCar {
    root: Cid,
    blocks: HashMap<Cid, Vec<u8>>,
    /// Byte offset where each frame (header first) ends.
    frame_ends: Vec<usize>,
}

fn raw_varint(bytes: &[u8], offset: &mut usize) -> usize {
    let mut value = 0usize;
    for shift in (0..).step_by(7) {
        let byte = bytes[*offset];
        *offset += 1;
        value |= usize::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            break;
        }
    }
    value
}

fn parse_raw_car(bytes: &[u8]) -> RawCar {
    let mut offset = 0;
    let mut frames = Vec::new();
    let mut frame_ends = Vec::new();
    while offset < bytes.len() {
        let len = raw_varint(bytes, &mut offset);
        frames.push(&bytes[offset..offset + len]);
        offset += len;
        frame_ends.push(offset);
    }
    let header: Ipld = serde_ipld_dagcbor::from_slice(frames[0]).unwrap();
    let Ipld::List(roots) = &header.get("roots").unwrap().unwrap() else { panic!("roots") };
    let [Ipld::Link(root)] = roots.as_slice() else { panic!("one root") };
    let mut blocks = HashMap::new();
    for frame in &frames[1..] {
        let mut data = *frame;
        let cid = Cid::read_bytes(&mut data).unwrap();
        blocks.insert(cid, data.to_vec());
    }
    RawCar { root: *root, blocks, frame_ends }
}

fn decode(bytes: &[u8]) -> Ipld {
    serde_ipld_dagcbor::from_slice(bytes).unwrap()
}

fn link_field(ipld: &Ipld, field: &str) -> Option<Cid> {
    match ipld.get(field).ok().flatten() {
        Some(Ipld::Link(cid)) => Some(*cid),
        _ => None,
    }
}

/// Breadth-first over the MST, ignoring key order: (nodes present, entries with a record block,
/// blocks referenced but absent).
fn count_mst_breadth_first(car: &RawCar) -> (usize, usize, usize) {
    let data_root = link_field(&decode(&car.blocks[&car.root]), "data").unwrap();
    let (mut nodes, mut records, mut missing) = (0, 0, 0);
    let mut queue = VecDeque::from([data_root]);
    while let Some(cid) = queue.pop_front() {
        let Some(bytes) = car.blocks.get(&cid) else {
            missing += 1;
            continue;
        };
        nodes += 1;
        let node = decode(bytes);
        queue.extend(link_field(&node, "l"));
        let Some(Ipld::List(entries)) = node.get("e").unwrap() else { panic!("entries") };
        for entry in entries {
            queue.extend(link_field(entry, "t"));
            let value = link_field(entry, "v").unwrap();
            if car.blocks.contains_key(&value) { records += 1 } else { missing += 1 }
        }
    }
    (nodes, records, missing)
}

// ---------------------------------------------------------------------------------------------
// (a) The jetstream repo against goat's listing.

#[test]
fn jetstream_repo_matches_goat_listing_exactly() {
    let (commit, records, stats) = read_fixture(JETSTREAM_REPO);
    let expected_rows: Vec<String> = std::fs::read_to_string(format!("{DATA}/jetstream/car_expected_records.tsv"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let rows: Vec<String> = records.iter().map(|r| format!("{}/{}\t{}", r.collection, r.rkey, r.cid)).collect();
    assert_eq!(expected_rows.len(), 23);
    assert_eq!(rows, expected_rows);

    let inspect = std::fs::read_to_string(format!("{DATA}/jetstream/car_expected_commit.txt")).unwrap();
    let field = |name: &str| inspect.lines().find_map(|line| line.strip_prefix(name)).unwrap().trim().to_owned();
    assert_eq!(commit.did, field("DID:"));
    assert_eq!(commit.data, field("Data CID:"));
    assert_eq!(commit.rev, field("Revision:"));
    assert_eq!(commit.version.to_string(), field("ATProto Repo Spec Version:"));
    assert_eq!(stats, RepoStats { blocks: 29, records: 23, bad_records: 0, missing_blocks: 0, mst_nodes: 5 });
}

// ---------------------------------------------------------------------------------------------
// (b) Every other repo: exact counts, order, and an independent count.

struct Expected {
    path: &'static str,
    did: &'static str,
    version: i64,
    stats: RepoStats,
}

const fn stats(blocks: usize, records: usize, missing_blocks: usize, mst_nodes: usize) -> RepoStats {
    RepoStats { blocks, records, bad_records: 0, missing_blocks, mst_nodes }
}

/// The numbers our reader finds; the independent count below must agree with each.
const REPOS: &[Expected] = &[
    Expected { path: JETSTREAM_REPO, did: "did:plc:53iucmf5ldftgqyf2ac7hmhd", version: 3, stats: stats(29, 23, 0, 5) },
    Expected {
        path: "indigo/fakermaker.repo.car",
        did: "did:plc:dpg45vsnuir2vqqqadsn6afg",
        version: 2,
        stats: stats(690, 142, 0, 33),
    },
    Expected {
        path: "indigo/paul_staging.repo.car",
        did: "did:plc:cmpvykrzb2l22kj4ojlv3ox4",
        version: 2,
        stats: stats(458, 185, 0, 51),
    },
    Expected {
        path: "indigo/greenground.repo.car",
        did: "did:plc:kzcqyc3unb33eh5sxzsfs25z",
        version: 3,
        stats: stats(4, 2, 0, 1),
    },
    Expected {
        path: "indigo/divy.repo",
        did: "did:plc:fz36gecghqb353ek23nem3ca",
        version: 2,
        stats: stats(9, 6, 0, 2),
    },
    Expected {
        path: "repo-stream/little.car",
        did: "did:plc:lulmyldiq4sb2ikags5sfb25",
        version: 3,
        stats: stats(375, 278, 0, 96),
    },
    Expected {
        path: "repo-stream/tiny.car",
        did: "did:plc:7hptvnhdyeu53xp6rz7e42iy",
        version: 3,
        stats: stats(12, 8, 0, 3),
    },
    Expected {
        path: "repo-stream/empty.car",
        did: "did:plc:mhkgaud2jb4rypzt4ph2a3co",
        version: 3,
        stats: stats(2, 0, 0, 1),
    },
    Expected {
        path: "rsky/valid_repo.car",
        did: "did:plc:r7fdhqmw3h2cifeakw5hmvy6",
        version: 3,
        stats: stats(12, 6, 0, 5),
    },
    Expected {
        path: "indigo/repo_slice.car",
        did: "did:plc:6evlgoug7wwijzxhzt2riyic",
        version: 2,
        stats: stats(5, 1, 5, 3),
    },
    Expected {
        path: "indigo/bafyreieovfuizojpw3zresz7sx3nk4trm2by23pt5rxbey3jme4uo5ogiu.car",
        did: "did:plc:z5vnbioquyhivxirw3bbljmu",
        version: 2,
        stats: stats(10, 6, 0, 2),
    },
];

#[test]
fn every_fixture_repo_reads_with_exact_counts() {
    for expected in REPOS {
        let (commit, records, stats) = read_fixture(expected.path);
        assert_eq!(commit.did, expected.did, "{}", expected.path);
        assert_eq!(commit.version, expected.version, "{}", expected.path);
        assert_eq!(commit.rev.is_empty(), expected.version == 2, "only v2 commits predate rev: {}", expected.path);
        assert_eq!(stats, expected.stats, "{}", expected.path);
        assert_eq!(records.len(), stats.records);
        assert!(records.iter().all(|r| r.record.is_object() && r.record["$type"].is_string()), "{}", expected.path);
    }
}

#[test]
fn records_come_out_in_strict_key_order() {
    for expected in REPOS {
        let (_, records, _) = read_fixture(expected.path);
        let keys: Vec<String> = records.iter().map(|r| format!("{}/{}", r.collection, r.rkey)).collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "{} out of order", expected.path);
    }
}

#[test]
fn counts_agree_with_an_independent_breadth_first_walk() {
    for expected in REPOS {
        let raw = parse_raw_car(&fixture(expected.path));
        let (nodes, records, missing) = count_mst_breadth_first(&raw);
        let stats = &expected.stats;
        assert_eq!(
            (nodes, records, missing),
            (stats.mst_nodes, stats.records, stats.missing_blocks),
            "{}",
            expected.path
        );
        assert_eq!(raw.frame_ends.len() - 1, stats.blocks, "{}", expected.path);
    }
}

#[test]
fn current_repo_exports_hold_exactly_commit_nodes_and_records() {
    // v3 exports carry no history: every block is the commit, an MST node or a record.
    for expected in REPOS.iter().filter(|e| e.version == 3) {
        let stats = &expected.stats;
        assert_eq!(stats.blocks, 1 + stats.mst_nodes + stats.records, "{}", expected.path);
    }
}

fn collection_histogram(records: &[RepoRecord]) -> BTreeMap<&str, usize> {
    let mut histogram = BTreeMap::new();
    for record in records {
        *histogram.entry(record.collection.as_str()).or_insert(0) += 1;
    }
    histogram
}

#[test]
fn collections_of_two_repos_are_exact() {
    let (_, fakermaker, _) = read_fixture("indigo/fakermaker.repo.car");
    let expected = [
        ("app.bsky.actor.profile", 1),
        ("app.bsky.feed.like", 22),
        ("app.bsky.feed.post", 26),
        ("app.bsky.feed.repost", 15),
        ("app.bsky.graph.follow", 78),
    ];
    assert_eq!(collection_histogram(&fakermaker), BTreeMap::from(expected));

    // paul_staging's legacy vote, confirmation and declaration records sit only in its 27 older
    // commits' blocks, which the current MST does not reach.
    let (_, paul, _) = read_fixture("indigo/paul_staging.repo.car");
    let expected = [
        ("app.bsky.actor.profile", 1),
        ("app.bsky.feed.like", 60),
        ("app.bsky.feed.post", 101),
        ("app.bsky.feed.repost", 15),
        ("app.bsky.graph.follow", 8),
    ];
    assert_eq!(collection_histogram(&paul), BTreeMap::from(expected));

    let (_, little, _) = read_fixture("repo-stream/little.car");
    let histogram = collection_histogram(&little);
    assert_eq!(histogram.len(), 24);
    assert_eq!(histogram["app.bsky.feed.post"], 85);
    assert_eq!(histogram["sh.tangled.graph.follow"], 11);
    assert_eq!(histogram["pub.leaflet.document"], 7);
}

#[test]
fn partial_slice_counts_missing_blocks_and_keeps_what_is_there() {
    let (_, records, stats) = read_fixture("indigo/repo_slice.car");
    assert_eq!(stats.missing_blocks, 5);
    let keys: Vec<_> = records.iter().map(|r| (r.collection.as_str(), r.rkey.as_str())).collect();
    assert_eq!(keys, [("app.bsky.feed.post", "3jquh3emtzo2o")]);
}

// ---------------------------------------------------------------------------------------------
// (c) JSON conversion on real records.

#[test]
fn slice_record_json_equals_indigo_expected_json() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{DATA}/indigo/repo_slice_record.json")).unwrap())
            .unwrap();
    let (commit, records, _) = read_fixture("indigo/repo_slice.car");
    let [record] = records.as_slice() else { panic!("one record") };
    let uri = format!("at://{}/{}/{}", commit.did, record.collection, record.rkey);
    assert_eq!(Value::String(uri), expected["uri"]);
    assert_eq!(Value::String(record.cid.clone()), expected["cid"]);
    assert_eq!(record.record, expected["value"]);
}

fn cbor_fixture_json(path: &str) -> Value {
    dagcbor_to_json(&decode(&fixture(path)), 64).unwrap()
}

#[test]
fn feedpost_record_decodes_with_blob_link_and_quote() {
    let post = cbor_fixture_json("indigo/feedpost_record.cbor");
    assert_eq!(post["$type"], "app.bsky.feed.post");
    assert_eq!(post["text"], "Who the hell do you think you are");
    assert_eq!(post["createdAt"], "2023-03-29T20:59:19.417Z");
    let image = &post["embed"]["media"]["images"][0]["image"];
    assert_eq!(image["ref"], json!({"$link": "bafkreieqq463374bbcbeq7gpmet5rvrpeqow6t4rtjzrkhnlumdylagaqa"}));
    assert_eq!(image["size"], 751473);
    let quoted = &post["embed"]["record"]["record"];
    assert_eq!(quoted["uri"], "at://did:plc:rbtury4cp2sdk4tvnedaqu54/app.bsky.feed.post/3jilislho4s2k");
    assert_eq!(quoted["cid"], "bafyreiaku7udekkiijxcuue3sn6esz7qijqj637rigz4xqdw57fk5houji");
}

#[test]
fn richtext_link_post_decodes_with_facet_and_external_thumb() {
    let post = cbor_fixture_json("indigo/post_richtext_link.cbor");
    assert_eq!(post["text"], "QP of a QP with a link card https://atproto.com");
    let facet = &post["facets"][0];
    assert_eq!(facet["index"], json!({"byteEnd": 47, "byteStart": 28}));
    assert_eq!(facet["features"][0], json!({"$type": "app.bsky.richtext.facet#link", "uri": "https://atproto.com"}));
    let external = &post["embed"]["media"]["external"];
    assert_eq!(external["thumb"]["ref"]["$link"], "bafkreif3qcpziagiyhkeoacmtrcirfvl53j7jucyko5byo4mlyjsgloqmi");
    assert_eq!(
        post["embed"]["record"]["record"]["uri"],
        "at://did:plc:cmpvykrzb2l22kj4ojlv3ox4/app.bsky.feed.post/3jrzqisyaic2k"
    );
}

#[test]
fn commit_signature_converts_to_unpadded_base64() {
    let raw = parse_raw_car(&fixture(JETSTREAM_REPO));
    let commit = decode(&raw.blocks[&raw.root]);
    let Some(Ipld::Bytes(sig)) = commit.get("sig").unwrap() else { panic!("sig") };
    assert_eq!(sig.len(), 64);
    let json = dagcbor_to_json(&commit, 8).unwrap();
    let encoded = json["sig"]["$bytes"].as_str().unwrap();
    assert_eq!(encoded.len(), 86, "64 bytes are 86 unpadded base64 symbols");
    assert_eq!(encoded, base64_encode_unpadded(sig));
    assert_eq!(json["data"], json!({"$link": "bafyreidigqr65jj2zsmitco3fcuag6pi7std6quxa2bcp2xrpin44ikzsy"}));
    assert_eq!(json["prev"], Value::Null);
}

// ---------------------------------------------------------------------------------------------
// (d) Truncated and hostile input.

/// 20 cut points strictly inside frames, spread over the file.
fn cuts_inside_frames(len: usize, frame_ends: &[usize]) -> Vec<usize> {
    let boundaries: HashSet<usize> = frame_ends.iter().copied().chain([0]).collect();
    let cuts: Vec<usize> = (0..20)
        .map(|i| 1 + i * (len - 2) / 19)
        .map(|cut| if boundaries.contains(&cut) { cut - 1 } else { cut })
        .collect();
    assert!(cuts.iter().all(|cut| !boundaries.contains(cut) && *cut < len));
    cuts
}

#[test]
fn cuts_inside_a_frame_are_truncation_errors() {
    for path in [JETSTREAM_REPO, "repo-stream/tiny.car"] {
        let bytes = fixture(path);
        let raw = parse_raw_car(&bytes);
        for cut in cuts_inside_frames(bytes.len(), &raw.frame_ends) {
            let result = read_both(&bytes[..cut], &CarLimits::default());
            assert!(matches!(result, Err(CarError::Truncated { .. })), "{path} cut at {cut}: {result:?}");
        }
    }
}

#[test]
fn cuts_at_frame_boundaries_read_as_partial_repos() {
    let bytes = fixture(JETSTREAM_REPO);
    let frame_ends = parse_raw_car(&bytes).frame_ends;
    let (_, full_records, _) = read_fixture(JETSTREAM_REPO);
    for (kept_blocks, &cut) in frame_ends.iter().enumerate() {
        let partial = &bytes[..cut];
        let raw = parse_raw_car(partial);
        let result = read_both(partial, &CarLimits::default());
        if !raw.blocks.contains_key(&raw.root) {
            assert!(matches!(result, Err(CarError::NoRoot { .. })), "{kept_blocks} blocks: {result:?}");
            continue;
        }
        let (_, records, stats) = result.unwrap();
        let (nodes, present, missing) = count_mst_breadth_first(&raw);
        assert_eq!((stats.mst_nodes, stats.records, stats.missing_blocks), (nodes, present, missing), "{kept_blocks}");
        assert_eq!(stats.blocks, kept_blocks);
        assert_eq!(missing == 0, kept_blocks == 29, "only the whole file has nothing missing");
        assert!(records.iter().all(|r| full_records.contains(r)), "a partial repo only drops records");
    }
}

fn commit_block(data: Cid) -> Ipld {
    car_writer::commit_block("did:plc:testtesttesttesttesttest", "3m2jradrsah2s", data)
}

fn mst_entry(prefix_len: usize, suffix: &str, value: Cid) -> Ipld {
    car_writer::mst_entry(prefix_len, suffix, value, None)
}

fn like_record() -> Ipld {
    map([
        ("$type", Ipld::String("app.bsky.feed.like".into())),
        ("createdAt", Ipld::String("2025-01-01T00:00:00Z".into())),
    ])
}

/// A well-formed two-record repo built by hand; the hostile variants below start from it.
fn synthetic_repo(records: [(Cid, Ipld); 2]) -> Vec<u8> {
    let (commit, node) = (fake_cid(1), fake_cid(2));
    let entries = vec![mst_entry(0, "app.bsky.feed.like/3aaa", records[0].0), mst_entry(20, "bbb", records[1].0)];
    let [first, second] = records;
    encode_car(&[commit], &[(commit, commit_block(node)), (node, mst_node(None, entries)), first, second])
}

#[test]
fn synthetic_repo_reads_and_expands_prefix_compressed_keys() {
    let bytes = synthetic_repo([(fake_cid(10), like_record()), (fake_cid(11), like_record())]);
    let (commit, records, stats) = read_both(&bytes, &CarLimits::default()).unwrap();
    assert_eq!(commit.rev, "3m2jradrsah2s");
    let keys: Vec<_> = records.iter().map(|r| r.rkey.as_str()).collect();
    assert_eq!(keys, ["3aaa", "3bbb"]);
    assert_eq!(stats, RepoStats { blocks: 4, records: 2, bad_records: 0, missing_blocks: 0, mst_nodes: 1 });
}

#[test]
fn undecodable_or_float_records_are_counted_not_fatal() {
    let float_record = map([("$type", Ipld::String("x.y.z".into())), ("f", Ipld::Float(0.5))]);
    let bytes = synthetic_repo([(fake_cid(10), float_record), (fake_cid(11), like_record())]);
    let (_, records, stats) = read_both(&bytes, &CarLimits::default()).unwrap();
    assert_eq!((records.len(), stats.bad_records), (1, 1));
    assert_eq!(records[0].rkey, "3bbb");

    let not_an_object = synthetic_repo([(fake_cid(10), Ipld::String("x".into())), (fake_cid(11), like_record())]);
    let (_, records, stats) = read_both(&not_an_object, &CarLimits::default()).unwrap();
    assert_eq!((records.len(), stats.bad_records), (1, 1));
}

#[test]
fn mst_cycles_depth_and_key_order_are_errors() {
    let (commit, node) = (fake_cid(1), fake_cid(2));
    let cycle = encode_car(&[commit], &[(commit, commit_block(node)), (node, mst_node(Some(node), vec![]))]);
    assert!(matches!(read_both(&cycle, &CarLimits::default()), Err(CarError::MstCycle { .. })));

    // A chain of 70 left links: too deep for the default 64 levels, fine with 100.
    let mut blocks = vec![(commit, commit_block(fake_cid(100)))];
    blocks.extend((100..170).map(|seed| (fake_cid(seed), mst_node(Some(fake_cid(seed + 1)), vec![]))));
    blocks.push((fake_cid(170), mst_node(None, vec![])));
    let chain = encode_car(&[commit], &blocks);
    assert!(matches!(read_both(&chain, &CarLimits::default()), Err(CarError::MstTooDeep { max: 64 })));
    let deep_limits = CarLimits { max_mst_depth: 100, ..CarLimits::default() };
    assert_eq!(read_both(&chain, &deep_limits).unwrap().2.mst_nodes, 71);

    let out_of_order = vec![mst_entry(0, "a.b.c/2", fake_cid(10)), mst_entry(0, "a.b.c/1", fake_cid(11))];
    let car = encode_car(&[commit], &[(commit, commit_block(node)), (node, mst_node(None, out_of_order))]);
    assert!(matches!(read_both(&car, &CarLimits::default()), Err(CarError::MstKeyOrder { .. })));

    let bad_prefix = vec![mst_entry(0, "a.b.c/1", fake_cid(10)), mst_entry(40, "2", fake_cid(11))];
    let car = encode_car(&[commit], &[(commit, commit_block(node)), (node, mst_node(None, bad_prefix))]);
    assert!(matches!(read_both(&car, &CarLimits::default()), Err(CarError::BadMstNode { .. })));
}

#[test]
fn limits_turn_big_inputs_into_errors() {
    let bytes = fixture(JETSTREAM_REPO);
    let limited = |limits: CarLimits| read_both(&bytes, &limits);
    let exact = CarLimits { max_bytes: bytes.len() as u64, ..CarLimits::default() };
    assert!(limited(exact).is_ok(), "a CAR of exactly max_bytes is accepted");
    let too_small = CarLimits { max_bytes: bytes.len() as u64 - 1, ..CarLimits::default() };
    assert!(matches!(limited(too_small), Err(CarError::TooBig { .. })));
    assert!(matches!(
        limited(CarLimits { max_blocks: 28, ..CarLimits::default() }),
        Err(CarError::TooManyBlocks { max: 28 })
    ));
    assert!(matches!(
        limited(CarLimits { max_records: 22, ..CarLimits::default() }),
        Err(CarError::TooManyRecords { max: 22 })
    ));
    assert!(matches!(
        limited(CarLimits { max_block_bytes: 200, ..CarLimits::default() }),
        Err(CarError::BlockTooBig { .. })
    ));
    let shallow = read_both(&bytes, &CarLimits { max_record_depth: 1, ..CarLimits::default() }).unwrap();
    assert_eq!(shallow.2.bad_records + shallow.2.records, 23, "too-deep records are counted, not fatal");
    assert!(shallow.2.bad_records > 0);
}

#[test]
fn garbage_inputs_are_errors() {
    let root = fake_cid(1);
    let valid_header = encode_car(&[root], &[]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("one byte", vec![0x05]),
        ("text", b"this is not a CAR file at all".to_vec()),
        ("huge declared header", vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0xa2]),
        ("overlong varint", vec![0xff; 12]),
        ("header is not cbor", frame(&[0xff, 0x00, 0x13])),
        ("no roots", encode_car(&[], &[])),
        ("two roots", encode_car(&[root, fake_cid(2)], &[])),
        ("huge declared block", [valid_header.clone(), vec![0xff, 0xff, 0xff, 0xff, 0x0f]].concat()),
        ("overlong block varint", [valid_header.clone(), vec![0xff; 12]].concat()),
        ("bad block cid", [valid_header.clone(), frame(&[0x01, 0xff, 0xff, 0xff])].concat()),
        ("root is not a commit", encode_car(&[root], &[(root, like_record())])),
        ("commit without data", encode_car(&[root], &[(root, map([("did", Ipld::String("did:x:y".into()))]))])),
    ];
    for (name, bytes) in cases {
        let result = read_both(&bytes, &CarLimits::default());
        let kind = match &result {
            Err(CarError::Truncated { .. }) => "truncated",
            Err(CarError::BlockTooBig { .. }) => "too big",
            Err(CarError::BadHeader(_)) => "header",
            Err(CarError::BadFraming(_)) => "framing",
            Err(CarError::BadCommit(_)) => "commit",
            other => panic!("{name}: unexpected {other:?}"),
        };
        let expected = match name {
            // A text's first byte declares a header longer than the text.
            "empty" | "one byte" | "text" => "truncated",
            "huge declared header" | "huge declared block" => "too big",
            "overlong block varint" | "bad block cid" => "framing",
            "root is not a commit" | "commit without data" => "commit",
            _ => "header",
        };
        assert_eq!(kind, expected, "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// (e) Links extracted from every record of every fixture.

fn links_of(record: &Value) -> Vec<(LinkTarget<'_>, String)> {
    let extraction = extract_links(record, &ExtractLimits::default());
    extraction.links.into_iter().map(|link| (link.target, link.location)).collect()
}

fn record_by_key<'r>(records: &'r [RepoRecord], collection: &str, rkey: &str) -> &'r RepoRecord {
    records.iter().find(|r| r.collection == collection && r.rkey == rkey).expect("record present")
}

/// Every `{"$link": cid}` value in a record.
fn cid_links(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(cid)) = object.get("$link") {
                out.push(cid.clone());
            }
            object.values().for_each(|child| cid_links(child, out));
        }
        Value::Array(items) => items.iter().for_each(|child| cid_links(child, out)),
        _ => {}
    }
}

fn target_text(target: &LinkTarget<'_>) -> String {
    match target {
        LinkTarget::Record { did, collection, rkey } => format!("at://{did}/{collection}/{rkey}"),
        LinkTarget::Did(did) => (*did).to_owned(),
    }
}

#[test]
fn no_link_ever_comes_from_a_cid() {
    let (mut cids_seen, mut links_seen) = (0, 0);
    for expected in REPOS {
        let (_, records, _) = read_fixture(expected.path);
        for record in &records {
            let mut cids = Vec::new();
            cid_links(&record.record, &mut cids);
            cids_seen += cids.len();
            for (target, location) in links_of(&record.record) {
                links_seen += 1;
                assert!(!location.contains("$link") && !location.contains("$bytes"), "{location}");
                let text = target_text(&target);
                assert!(cids.iter().all(|cid| !text.contains(cid.as_str())), "{text} in {}", record.rkey);
            }
        }
    }
    // Blob refs make the check meaningful: there are CIDs to mistake for links.
    assert_eq!(cids_seen, 41);
    assert!(links_seen > 600, "{links_seen} links");
}

#[test]
fn every_like_in_fakermaker_links_once_at_subject() {
    let (_, records, _) = read_fixture("indigo/fakermaker.repo.car");
    let likes: Vec<_> = records.iter().filter(|r| r.collection == "app.bsky.feed.like").collect();
    assert_eq!(likes.len(), 22);
    for like in likes {
        let links = links_of(&like.record);
        let [(target, location)] = links.as_slice() else { panic!("{}: {links:?}", like.rkey) };
        assert_eq!(location, "$.subject");
        assert!(matches!(target, LinkTarget::Record { collection: "app.bsky.feed.post", .. }), "{target:?}");
        assert_eq!(Value::String(target_text(target)), like.record["subject"]["uri"]);
    }
}

#[test]
fn tiny_repo_links_are_exact() {
    let (_, records, _) = read_fixture("repo-stream/tiny.car");
    let follow = record_by_key(&records, "app.bsky.graph.follow", "3lscuqc4sur2x");
    assert_eq!(links_of(&follow.record), [(LinkTarget::Did("did:plc:hdhoaan3xa3jiuq4fg4mefid"), "$.subject".into())]);
    let block = record_by_key(&records, "app.bsky.graph.block", "3ljga343k5v2c");
    assert_eq!(links_of(&block.record), [(LinkTarget::Did("did:plc:van2disi4hf7e5zryrujafxh"), "$.subject".into())]);

    let reply = record_by_key(&records, "app.bsky.feed.post", "3ljnfpfcarp2q");
    let parent = LinkTarget::Record {
        did: "did:plc:hdhoaan3xa3jiuq4fg4mefid",
        collection: "app.bsky.feed.post",
        rkey: "3ljnf2bptsc2e",
    };
    assert_eq!(links_of(&reply.record), [(parent, "$.reply.parent".into()), (parent, "$.reply.root".into())]);

    // A blob ref, an https facet and an external embed: no links at all.
    for (collection, rkey) in [("app.bsky.actor.profile", "self"), ("app.bsky.feed.post", "3lrbxndrdo22z")] {
        assert_eq!(links_of(&record_by_key(&records, collection, rkey).record), []);
    }
}

#[test]
fn legacy_mentions_and_quotes_link_at_their_paths() {
    let (_, records, _) = read_fixture("indigo/repo_slice.car");
    // The legacy image `cid` is a plain string here, not a link either.
    let mention = (LinkTarget::Did("did:plc:62h4kgufuxjsa4o5udp4dgdw"), "$.entities[].value".to_owned());
    assert_eq!(links_of(&records[0].record), [mention]);

    let (_, records, _) = read_fixture("indigo/paul_staging.repo.car");
    let quotes =
        records.iter().filter(|r| links_of(&r.record).iter().any(|(_, location)| location == "$.embed.record"));
    assert_eq!(quotes.count(), 3);
}

#[test]
fn generated_two_level_repositories_read_back_whole_and_in_order() {
    let car = car_writer::generated_repo("did:plc:generatedgeneratedgener", 2_500);
    let (commit, records, seen) = read_both(&car, &CarLimits::default()).unwrap();
    assert_eq!(commit.did, "did:plc:generatedgeneratedgener");
    // A root with two keys and three leaves (1,000 + 1,000 + 498 keys).
    assert_eq!(seen, stats(2_505, 2_500, 0, 4));
    assert!(records.windows(2).all(|w| (&w[0].collection, &w[0].rkey) < (&w[1].collection, &w[1].rkey)));
    assert!(records.iter().all(|r| r.record["subject"]["uri"].as_str().unwrap().starts_with("at://did:plc:author")));
}
