//! Repository CAR reading against real fixtures (tests/data/car, see SOURCE.md there).
//!
//! Invariants checked:
//! - the jetstream repo matches, row for row, the listing indigo's `goat` produced for it;
//! - every fixture reads the same from memory and from a file;
//! - record counts are exact, and agree with an independent breadth-first count of the MST made
//!   here with our own CAR framing parser; the MST built here from the records (by the rules, no
//!   code shared) has the commit's root CID;
//! - records come out in strictly increasing `collection/rkey` order;
//! - JSON conversion of real records matches expected JSON literally;
//! - truncated, partial, oversized and hostile inputs give the right `CarError`, never a panic;
//! - links extracted from the fixture records sit at the expected paths, and never come from a CID.

#[path = "support/car_readers.rs"]
mod car_readers;
#[path = "support/car_writer.rs"]
mod car_writer;

use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::ingest::repo::{
    CarError, CarLimits, CarSource, Expect, RepoRecord, RepoStats, base64_encode_unpadded, dagcbor_to_json, read_repo,
    read_repo_bytes,
};
use backlinks::model::syntax::LinkTarget;
use car_readers::{RepoResult, agree};
use car_writer::{block, build_mst, encode_car, fake_cid, frame, map, mst_node};
use ipld_core::cid::Cid;
use ipld_core::ipld::Ipld;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/car");
const JETSTREAM_REPO: &str = "jetstream/repo.car";

fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}/{path}")).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// Whatever DID, no key: hashes and structure (the signatures are in tests/verified_ingest.rs).
const ANY: Expect<'static> = Expect { did: None, key: None, now_us: i64::MAX / 2, deadline: None };

fn read_from_file(bytes: &[u8], limits: &CarLimits) -> RepoResult {
    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, bytes).unwrap();
    read_repo(&CarSource::File(&file), limits, &ANY).map(|repo| (repo.commit, repo.records, repo.stats))
}

/// Reads from memory and from a file and checks they agree: same value, or the same error variant.
fn read_both(bytes: &[u8], limits: &CarLimits) -> RepoResult {
    let from_memory = read_repo_bytes(bytes, limits, &ANY).map(|repo| (repo.commit, repo.records, repo.stats));
    agree(from_memory, read_from_file(bytes, limits))
}

fn read_fixture(path: &str) -> (backlinks::ingest::repo::RepoCommit, Vec<RepoRecord>, RepoStats) {
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
    assert_eq!(stats, RepoStats { blocks: 29, records: 23, bad_records: 0, mst_nodes: 5 });
}

// ---------------------------------------------------------------------------------------------
// (b) Every other repo: exact counts, order, and an independent count.

struct Expected {
    path: &'static str,
    did: &'static str,
    version: i64,
    stats: RepoStats,
}

const fn stats(blocks: usize, records: usize, mst_nodes: usize) -> RepoStats {
    RepoStats { blocks, records, bad_records: 0, mst_nodes }
}

/// The numbers our reader finds; the independent count below must agree with each.
const REPOS: &[Expected] = &[
    Expected { path: JETSTREAM_REPO, did: "did:plc:53iucmf5ldftgqyf2ac7hmhd", version: 3, stats: stats(29, 23, 5) },
    Expected {
        path: "indigo/fakermaker.repo.car",
        did: "did:plc:dpg45vsnuir2vqqqadsn6afg",
        version: 2,
        stats: stats(690, 142, 33),
    },
    Expected {
        path: "indigo/paul_staging.repo.car",
        did: "did:plc:cmpvykrzb2l22kj4ojlv3ox4",
        version: 2,
        stats: stats(458, 185, 51),
    },
    Expected {
        path: "indigo/greenground.repo.car",
        did: "did:plc:kzcqyc3unb33eh5sxzsfs25z",
        version: 3,
        stats: stats(4, 2, 1),
    },
    Expected { path: "indigo/divy.repo", did: "did:plc:fz36gecghqb353ek23nem3ca", version: 2, stats: stats(9, 6, 2) },
    Expected {
        path: "repo-stream/little.car",
        did: "did:plc:lulmyldiq4sb2ikags5sfb25",
        version: 3,
        stats: stats(375, 278, 96),
    },
    Expected {
        path: "repo-stream/tiny.car",
        did: "did:plc:7hptvnhdyeu53xp6rz7e42iy",
        version: 3,
        stats: stats(12, 8, 3),
    },
    Expected {
        path: "repo-stream/empty.car",
        did: "did:plc:mhkgaud2jb4rypzt4ph2a3co",
        version: 3,
        stats: stats(2, 0, 1),
    },
    Expected {
        path: "rsky/valid_repo.car",
        did: "did:plc:r7fdhqmw3h2cifeakw5hmvy6",
        version: 3,
        stats: stats(12, 6, 5),
    },
    Expected {
        path: "indigo/bafyreieovfuizojpw3zresz7sx3nk4trm2by23pt5rxbey3jme4uo5ogiu.car",
        did: "did:plc:z5vnbioquyhivxirw3bbljmu",
        version: 2,
        stats: stats(10, 6, 2),
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
        assert_eq!((nodes, records, missing), (stats.mst_nodes, stats.records, 0), "{}", expected.path);
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

/// The MST built here from a fixture's records, by the rules alone, has the commit's root: the
/// reader's idea of a well-formed tree is the network's.
#[test]
fn rebuilding_each_fixture_tree_gives_its_commits_root() {
    for expected in REPOS {
        let (commit, records, _) = read_fixture(expected.path);
        let keys: Vec<(String, Cid)> =
            records.iter().map(|r| (format!("{}/{}", r.collection, r.rkey), r.cid.parse().unwrap())).collect();
        let root = build_mst(&keys, &mut Vec::new());
        assert_eq!(root.to_string(), commit.data, "{}", expected.path);
    }
}

/// A partial repository (five MST nodes of the slice are not in it) is refused whole: indexing
/// what is there would revoke the account's other records and write nothing for them.
#[test]
fn a_partial_repository_is_an_error_naming_a_missing_block() {
    let result = read_both(&fixture("indigo/repo_slice.car"), &CarLimits::default());
    assert!(matches!(result, Err(CarError::MissingBlock { .. })), "{result:?}");
}

/// The one record of the partial slice, decoded straight from its block.
fn slice_record() -> (Cid, Value) {
    let raw = parse_raw_car(&fixture("indigo/repo_slice.car"));
    let is_post = |bytes: &Vec<u8>| decode(bytes).get("text").is_ok_and(|text| text.is_some());
    let (cid, bytes) = raw.blocks.iter().find(|(_, bytes)| is_post(bytes)).unwrap();
    (*cid, dagcbor_to_json(&decode(bytes), 64).unwrap())
}

// ---------------------------------------------------------------------------------------------
// (c) JSON conversion on real records.

#[test]
fn slice_record_json_equals_indigo_expected_json() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{DATA}/indigo/repo_slice_record.json")).unwrap())
            .unwrap();
    let (cid, record) = slice_record();
    assert_eq!(Value::String(cid.to_string()), expected["cid"]);
    assert_eq!(record, expected["value"]);
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
    // A quote with media: the quoted post at its strong reference, the page from the facet and
    // the card beside the quote, whose thumb is a CID and no link.
    let quoted = LinkTarget::Record {
        did: "did:plc:cmpvykrzb2l22kj4ojlv3ox4",
        collection: "app.bsky.feed.post",
        rkey: "3jrzqisyaic2k",
    };
    let page = LinkTarget::Url("https://atproto.com");
    let mut links = links_of(&post);
    links.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        links,
        [
            (page, "$.embed.media.external.uri".to_owned()),
            (quoted, "$.embed.record.record".to_owned()),
            (page, "$.facets[].features[app.bsky.richtext.facet#link].uri".to_owned()),
        ]
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
fn cuts_at_frame_boundaries_are_missing_blocks() {
    let bytes = fixture(JETSTREAM_REPO);
    let frame_ends = parse_raw_car(&bytes).frame_ends;
    for (kept_blocks, &cut) in frame_ends.iter().enumerate() {
        let result = read_both(&bytes[..cut], &CarLimits::default());
        match kept_blocks {
            29 => assert!(result.is_ok(), "the whole file"),
            _ => assert!(matches!(result, Err(CarError::MissingBlock { .. })), "{kept_blocks} blocks: {result:?}"),
        }
    }
}

fn commit_block(data: Cid) -> Ipld {
    car_writer::commit_block("did:plc:testtesttesttesttesttest", "3m2jradrsah2s", data, None)
}

/// A CAR of `blocks` whose root is the commit of the MST node `root`.
fn repo_car(root: Cid, mut blocks: Vec<(Cid, Ipld)>) -> Vec<u8> {
    let (commit, commit_value) = block(commit_block(root));
    blocks.insert(0, (commit, commit_value));
    encode_car(&[commit], &blocks)
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

/// Two keys of height 0, so one node holds them both.
const KEYS: [&str; 2] = ["app.bsky.feed.like/3aaa", "app.bsky.feed.like/3bbb"];

/// A well-formed two-record repo built by hand; the hostile variants below start from it.
fn synthetic_repo(records: [Ipld; 2]) -> Vec<u8> {
    assert!(KEYS.iter().all(|key| car_writer::height(key) == 0));
    let [first, second] = records.map(block);
    let entries = vec![mst_entry(0, KEYS[0], first.0), mst_entry(20, "bbb", second.0)];
    let node = block(mst_node(None, entries));
    repo_car(node.0, vec![node, first, second])
}

fn like_record_2() -> Ipld {
    map([
        ("$type", Ipld::String("app.bsky.feed.like".into())),
        ("createdAt", Ipld::String("2025-01-02T00:00:00Z".into())),
    ])
}

#[test]
fn synthetic_repo_reads_and_expands_prefix_compressed_keys() {
    let bytes = synthetic_repo([like_record(), like_record_2()]);
    let (commit, records, stats) = read_both(&bytes, &CarLimits::default()).unwrap();
    assert_eq!(commit.rev, "3m2jradrsah2s");
    let keys: Vec<_> = records.iter().map(|r| r.rkey.as_str()).collect();
    assert_eq!(keys, ["3aaa", "3bbb"]);
    assert_eq!(stats, RepoStats { blocks: 4, records: 2, bad_records: 0, mst_nodes: 1 });
}

#[test]
fn undecodable_or_float_records_are_counted_not_fatal() {
    let float_record = map([("$type", Ipld::String("x.y.z".into())), ("f", Ipld::Float(0.5))]);
    let bytes = synthetic_repo([float_record, like_record()]);
    let (_, records, stats) = read_both(&bytes, &CarLimits::default()).unwrap();
    assert_eq!((records.len(), stats.bad_records), (1, 1));
    assert_eq!(records[0].rkey, "3bbb");

    let not_an_object = synthetic_repo([Ipld::String("x".into()), like_record()]);
    let (_, records, stats) = read_both(&not_an_object, &CarLimits::default()).unwrap();
    assert_eq!((records.len(), stats.bad_records), (1, 1));
}

/// A block whose bytes no longer hash to its CID, anywhere in the tree, fails the whole CAR.
#[test]
fn a_block_that_does_not_match_its_cid_fails_the_car() {
    let bytes = synthetic_repo([like_record(), like_record_2()]);
    let raw = parse_raw_car(&bytes);
    let tampered = map([("$type", Ipld::String("app.bsky.feed.like".into())), ("forged", Ipld::Bool(true))]);
    for victim in raw.blocks.keys() {
        let blocks: Vec<(Cid, Ipld)> = raw
            .blocks
            .iter()
            .map(|(cid, bytes)| (*cid, if cid == victim { tampered.clone() } else { decode(bytes) }))
            .collect();
        let result = read_both(&encode_car(&[raw.root], &blocks), &CarLimits::default());
        assert!(matches!(result, Err(CarError::BadHash { .. })), "{victim}: {result:?}");
    }
}

/// Keys whose heights do not fit their nodes, and nodes in the wrong place, are refused.
#[test]
fn a_tree_that_breaks_the_layer_rules_is_refused() {
    let record = block(like_record());
    let keys: Vec<(String, Cid)> = (0..40).map(|i| (format!("app.bsky.feed.like/3k{i:04}"), record.0)).collect();
    assert!(keys.iter().any(|(key, _)| car_writer::height(key) > 0), "the keys span two layers");
    let mut blocks = vec![record.clone()];
    let root = build_mst(&keys, &mut blocks);
    assert!(read_both(&repo_car(root, blocks), &CarLimits::default()).is_ok());
    // All forty keys in one node: some are higher than the rest.
    let mut previous = String::new();
    let flat: Vec<Ipld> = keys
        .iter()
        .map(|(key, cid)| {
            let shared = key.bytes().zip(previous.bytes()).take_while(|(a, b)| a == b).count();
            previous = key.clone();
            mst_entry(shared, &key[shared..], *cid)
        })
        .collect();
    let node = block(mst_node(None, flat));
    let result = read_both(&repo_car(node.0, vec![node, record.clone()]), &CarLimits::default());
    assert!(matches!(&result, Err(CarError::BadMstNode { reason, .. }) if reason.contains("height")), "{result:?}");
    // The root pointing at a lone subtree.
    let leaf = block(mst_node(None, vec![mst_entry(0, KEYS[0], record.0)]));
    let pointer = block(mst_node(Some(leaf.0), vec![]));
    let result = read_both(&repo_car(pointer.0, vec![pointer, leaf, record.clone()]), &CarLimits::default());
    let refused = matches!(&result, Err(CarError::BadMstNode { reason, .. }) if reason.contains("bare pointer"));
    assert!(refused, "{result:?}");
    // A subtree under a node of layer 0.
    let empty = block(mst_node(None, vec![]));
    let parent = block(mst_node(Some(empty.0), vec![mst_entry(0, KEYS[0], record.0)]));
    let result = read_both(&repo_car(parent.0, vec![parent, empty, record]), &CarLimits::default());
    assert!(matches!(&result, Err(CarError::BadMstNode { reason, .. }) if reason.contains("layer 0")), "{result:?}");
}

/// A small CAR whose one big record is referenced by thousands of keys (the amplification
/// attack): refused after decoding the record once, instead of decoding it thousands of times.
#[test]
fn one_record_referenced_by_thousands_of_keys_is_refused_early() {
    let text = Ipld::String("x".repeat(1 << 20));
    let big = block(map([("$type", Ipld::String("app.bsky.feed.post".into())), ("text", text)]));
    let keys: Vec<(String, Cid)> = (0..3_000).map(|i| (format!("app.bsky.feed.post/3k{i:06}"), big.0)).collect();
    let mut blocks = vec![big];
    let root = build_mst(&keys, &mut blocks);
    let car = repo_car(root, blocks);
    assert!(car.len() < 2 << 20, "{} bytes", car.len());
    let result = read_both(&car, &CarLimits::default());
    assert!(matches!(result, Err(CarError::TooMuchReferenced { .. })), "{result:?}");
}

#[test]
fn mst_cycles_depth_and_key_order_are_errors() {
    // A node that names itself cannot hash to its own CID: a cycle reads as a forged block.
    let (commit, node) = (fake_cid(1), fake_cid(2));
    let cycle = encode_car(&[commit], &[(commit, commit_block(node)), (node, mst_node(Some(node), vec![]))]);
    assert!(read_both(&cycle, &CarLimits::default()).is_err());

    let record = block(like_record());
    let out_of_order = vec![mst_entry(0, KEYS[1], record.0), mst_entry(0, KEYS[0], record.0)];
    let node = block(mst_node(None, out_of_order));
    let car = repo_car(node.0, vec![node, record.clone()]);
    assert!(matches!(read_both(&car, &CarLimits::default()), Err(CarError::MstKeyOrder { .. })));

    let bad_prefix = vec![mst_entry(0, KEYS[0], record.0), mst_entry(40, "2", record.0)];
    let node = block(mst_node(None, bad_prefix));
    let car = repo_car(node.0, vec![node, record.clone()]);
    assert!(matches!(read_both(&car, &CarLimits::default()), Err(CarError::BadMstNode { .. })));

    // A deep tree (keys of high layers, chains of empty nodes between): refused past max_mst_depth.
    let keys: Vec<(String, Cid)> = (0..2_000).map(|i| (format!("app.bsky.feed.like/3k{i:06}"), record.0)).collect();
    let mut blocks = vec![record];
    let root = build_mst(&keys, &mut blocks);
    let car = repo_car(root, blocks);
    assert!(read_both(&car, &CarLimits::default()).is_ok());
    let shallow = CarLimits { max_mst_depth: 2, ..CarLimits::default() };
    assert!(matches!(read_both(&car, &shallow), Err(CarError::MstTooDeep { max: 2 })));
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
        ("root is not a commit", {
            let (cid, record) = block(like_record());
            encode_car(&[cid], &[(cid, record)])
        }),
        ("commit without data", {
            let (cid, commit) = block(map([("did", Ipld::String("did:x:y".into()))]));
            encode_car(&[cid], &[(cid, commit)])
        }),
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
                let text = target.to_string();
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
        assert_eq!(Value::String(target.to_string()), like.record["subject"]["uri"]);
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

    // A blob ref: no links at all.
    assert_eq!(links_of(&record_by_key(&records, "app.bsky.actor.profile", "self").record), []);
    // A link card and a link facet to the same page: two URL links, none from the card's thumb.
    let card = record_by_key(&records, "app.bsky.feed.post", "3lrbxndrdo22z");
    let page = LinkTarget::Url("https://ufos.microcosm.blue");
    assert_eq!(
        links_of(&card.record),
        [(page, "$.embed.external.uri".into()), (page, "$.facets[].features[app.bsky.richtext.facet#link].uri".into())]
    );
}

/// The URLs a post links to, found by its lexicon's shape (app.bsky.feed.post: a link card, a
/// card beside a quote, link facets, and the legacy `entities` of type `link`), not by a walk.
fn post_urls(post: &Value) -> BTreeSet<(String, String)> {
    let mut urls = BTreeSet::new();
    let mut add = |value: &Value, location: &str| {
        if let Some(url) = value.as_str().filter(|url| url.starts_with("https://") || url.starts_with("http://")) {
            urls.insert((url.to_owned(), location.to_owned()));
        }
    };
    add(&post["embed"]["external"]["uri"], "$.embed.external.uri");
    add(&post["embed"]["media"]["external"]["uri"], "$.embed.media.external.uri");
    for feature in
        post["facets"].as_array().into_iter().flatten().flat_map(|facet| facet["features"].as_array()).flatten()
    {
        if feature["$type"] == "app.bsky.richtext.facet#link" {
            add(&feature["uri"], "$.facets[].features[app.bsky.richtext.facet#link].uri");
        }
    }
    for entity in post["entities"].as_array().into_iter().flatten().filter(|entity| entity["type"] == "link") {
        add(&entity["value"], "$.entities[].value");
    }
    urls
}

#[test]
fn url_links_of_real_posts_are_their_cards_facets_and_entities() {
    let mut found = BTreeMap::new();
    for path in ["indigo/paul_staging.repo.car", "repo-stream/little.car", "repo-stream/tiny.car"] {
        let (_, records, _) = read_fixture(path);
        for post in records.iter().filter(|r| r.collection == "app.bsky.feed.post") {
            let extracted: BTreeSet<(String, String)> = links_of(&post.record)
                .into_iter()
                .filter_map(|(target, location)| match target {
                    LinkTarget::Url(url) => Some((url.to_owned(), location)),
                    _ => None,
                })
                .collect();
            assert_eq!(extracted, post_urls(&post.record), "{path} {}", post.rkey);
            for (_, location) in extracted {
                *found.entry(location).or_insert(0) += 1;
            }
        }
    }
    // Every kind of place occurs, so each comparison above had something to compare.
    let expected = [
        ("$.embed.external.uri", 28),
        ("$.embed.media.external.uri", 1),
        ("$.entities[].value", 22),
        ("$.facets[].features[app.bsky.richtext.facet#link].uri", 24),
    ];
    assert_eq!(found, expected.into_iter().map(|(location, n)| (location.to_owned(), n)).collect());
}

#[test]
fn url_links_of_another_lexicon_sit_at_their_paths() {
    // Leaflet documents (pub.leaflet.*) hold their links in rich-text facets of nested blocks.
    let (_, records, _) = read_fixture("repo-stream/little.car");
    let urls: Vec<(String, String)> = records
        .iter()
        .filter(|r| r.collection == "pub.leaflet.document")
        .flat_map(|r| links_of(&r.record))
        .filter_map(|(target, location)| match target {
            LinkTarget::Url(url) => Some((url.to_owned(), location)),
            _ => None,
        })
        .collect();
    assert_eq!(urls.len(), 209);
    assert!(
        urls.iter().all(
            |(url, location)| url.starts_with("http") && (location.ends_with(".uri") || location.ends_with(".src"))
        )
    );
}

#[test]
fn legacy_mentions_and_quotes_link_at_their_paths() {
    let (_, record) = slice_record();
    // The legacy image `cid` is a plain string here, not a link either.
    let mention = (LinkTarget::Did("did:plc:62h4kgufuxjsa4o5udp4dgdw"), "$.entities[].value".to_owned());
    assert_eq!(links_of(&record), [mention]);

    let (_, records, _) = read_fixture("indigo/paul_staging.repo.car");
    let quotes =
        records.iter().filter(|r| links_of(&r.record).iter().any(|(_, location)| location == "$.embed.record"));
    assert_eq!(quotes.count(), 3);
}

#[test]
fn generated_repositories_read_back_whole_and_in_order() {
    let car = car_writer::generated_repo("did:plc:generatedgeneratedgener", 2_500);
    let (commit, records, seen) = read_both(&car, &CarLimits::default()).unwrap();
    assert_eq!(commit.did, "did:plc:generatedgeneratedgener");
    assert_eq!((seen.blocks, seen.records), (1 + seen.mst_nodes + 2_500, 2_500));
    assert!(seen.mst_nodes > 100, "a tree of {} nodes", seen.mst_nodes);
    assert!(records.windows(2).all(|w| (&w[0].collection, &w[0].rkey) < (&w[1].collection, &w[1].rkey)));
    assert!(records.iter().all(|r| r.record["subject"]["uri"].as_str().unwrap().starts_with("at://did:plc:author")));
}
