//! The workload's own checks: every line parses, links are counted exactly, accounts behave.

use super::*;
use crate::generator::{Generator, format_datetime, record_tid, tid};
use backlinks::extract::{ExtractLimits, extract_links};
use backlinks::ingest::jetstream::parse_event;
use backlinks::model::operation::Operation;
use std::collections::HashSet;

fn shape(seed: u64, events: u64) -> Shape {
    Shape { seed, max_events: events, max_links: u64::MAX, accounts: 5_000, posts: 2_000, post_zipf: 1.0 }
}

fn generate(shape: Shape) -> (Vec<u8>, Counts) {
    let mut out = Vec::new();
    let counts = Generator::new(shape).run(&mut out).unwrap();
    (out, counts)
}

#[test]
fn every_line_is_an_event_the_importer_applies_with_the_counted_links() {
    let (out, counts) = generate(shape(3, 20_000));
    let mut links = 0u64;
    let mut operations = [0u64; 5];
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let event = parse_event(line).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(line)));
        let slot = match &event.operation {
            Operation::Create(op) | Operation::Update(op) => {
                links += extract_links(&op.record, &ExtractLimits::default()).links.len() as u64;
                usize::from(matches!(event.operation, Operation::Update(_)))
            }
            Operation::Delete(_) => 2,
            Operation::Account { .. } => 3,
            Operation::Identity { .. } | Operation::Skip => 4,
        };
        operations[slot] += 1;
    }
    assert_eq!(counts.events, 20_000);
    assert_eq!(links, counts.links, "the summary counts exactly the links the extractor finds");
    assert_eq!(operations.iter().sum::<u64>(), 20_000);
    assert_eq!(operations[1], counts.updates);
    assert_eq!(operations[2], counts.deletes);
    assert_eq!(operations[3], counts.account_events);
    assert_eq!(operations[4], counts.identity_events);
    // The mix: likes 59 % and deletes 5 % (of 20,000 draws, within a few standard deviations).
    assert!((11_500..12_100).contains(&counts.likes), "likes {}", counts.likes);
    assert!((900..1_100).contains(&counts.deletes), "deletes {}", counts.deletes);
    assert!(counts.replies > 0 && counts.quotes > 0 && counts.mentions > 0 && counts.pages > 0 && counts.blocks > 0);
}

#[test]
fn deactivated_and_deleted_accounts_write_nothing() {
    let (out, _) = generate(Shape { accounts: 300, ..shape(5, 60_000) });
    let (mut deactivated, mut deleted) = (HashSet::new(), HashSet::new());
    let (mut deactivations, mut reactivations, mut commits) = (0, 0, 0);
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let did = match parse_event(line).unwrap().operation {
            Operation::Account { did, active, status } => {
                let did = did.into_owned();
                match (active, status.as_deref()) {
                    (false, Some("deleted")) => deleted.insert(did),
                    (false, _) => {
                        deactivations += 1;
                        deactivated.insert(did)
                    }
                    (true, _) => {
                        reactivations += usize::from(deactivated.contains(&did));
                        deactivated.remove(&did)
                    }
                };
                continue;
            }
            Operation::Create(op) | Operation::Update(op) => op.record_ref.did.into_owned(),
            Operation::Delete(record_ref) => record_ref.did.into_owned(),
            Operation::Identity { .. } | Operation::Skip => continue,
        };
        commits += 1;
        assert!(!deleted.contains(&did), "a deleted account wrote: {}", String::from_utf8_lossy(line));
        assert!(!deactivated.contains(&did), "a deactivated account wrote: {}", String::from_utf8_lossy(line));
    }
    // 60,000 events: about 30 deletions, 120 deactivations and 60 reactivations of 300 accounts.
    assert!(
        deleted.len() >= 10 && deactivations >= 60 && reactivations >= 20,
        "{deleted:?} {deactivations} {reactivations}"
    );
    assert!(commits > 55_000, "{commits} commits");
}

#[test]
fn the_same_seed_gives_the_same_bytes_and_another_seed_others() {
    let (a, _) = generate(shape(7, 2_000));
    let (b, _) = generate(shape(7, 2_000));
    let (c, _) = generate(shape(8, 2_000));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn the_link_bound_stops_the_stream() {
    let (_, counts) = generate(Shape { max_events: MAX_EVENTS, max_links: 5_000, ..shape(1, 0) });
    assert!((5_000..5_010).contains(&counts.links), "stopped at {} links", counts.links);
}

#[test]
fn tids_match_the_crate_encoding() {
    for value in [0, 1, 31, 0x194a_947d_4aac_b00c, tid(START_US, 1023)] {
        let mut generator = Generator::new(shape(1, 1));
        generator.tid(value);
        assert_eq!(generator.line, backlinks::model::tid::format_tid(value).into_bytes());
    }
}

#[test]
fn record_tids_are_spread_like_the_real_ones() {
    let mut state = 3;
    let micros = START_US + 123_456;
    let tids: Vec<u64> = (0..10_000).map(|_| record_tid(micros, splitmix64(&mut state))).collect();
    let whole_millis = tids.iter().filter(|&&t| (t >> 10) == micros - 456).count();
    let exact = tids.iter().filter(|&&t| (t >> 10) == micros).count();
    let small_clock = tids.iter().filter(|&&t| t & 0x3ff < 32).count();
    assert_eq!(whole_millis + exact, tids.len(), "only these two times");
    assert!((7_300..7_700).contains(&whole_millis), "{whole_millis} whole milliseconds");
    assert!((9_780..9_920).contains(&small_clock), "{small_clock} clock ids below 32");
    assert!(tids.iter().any(|&t| t & 0x3ff >= 512), "the other clock ids are drawn too");
}

#[test]
fn datetimes_are_rfc3339_utc() {
    assert_eq!(&format_datetime(0), b"1970-01-01T00:00:00.000Z");
    assert_eq!(&format_datetime(1_779_719_008_778_123), b"2026-05-25T14:23:28.778Z");
    assert_eq!(&format_datetime(951_782_400_000_000), b"2000-02-29T00:00:00.000Z");
}

#[test]
fn zipf_ranks_are_in_range_and_skewed() {
    let zipf = Zipf::new(1_000, 1.0);
    assert_eq!(zipf.rank(0.0), 0);
    assert_eq!(zipf.rank(0.999_999_999), 999);
    let mut state = 5;
    let draws: Vec<u64> =
        (0..10_000).map(|_| zipf.rank((splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64)).collect();
    let top_ten = draws.iter().filter(|&&r| r < 10).count();
    // P(rank < 10) = ln(11) / ln(1001), about 35 %.
    assert!((3_200..3_750).contains(&top_ten), "top ten drew {top_ten}");
    let flatter = Zipf::new(1_000, 0.5);
    assert!(flatter.rank(0.5) > zipf.rank(0.5));
}

#[test]
fn bad_sizes_are_refused() {
    let args = |events: Option<u64>, accounts: Option<u64>| Args {
        seed: 1,
        events,
        links: None,
        accounts,
        posts: None,
        zipf: 1.0,
        out: None,
    };
    assert!(Shape::from_args(&args(Some(0), None)).is_err());
    assert!(Shape::from_args(&args(Some(MAX_EVENTS + 1), None)).is_err());
    assert!(Shape::from_args(&args(None, Some(1))).is_err());
    assert_eq!(Shape::from_args(&args(None, None)).unwrap().max_events, DEFAULT_EVENTS);
}

/// The subject of a like, repost, follow or block, as its record holds it.
fn pair_subject(collection: &str, record: &serde_json::Value) -> Option<String> {
    match collection {
        "app.bsky.feed.like" | "app.bsky.feed.repost" => Some(record["subject"]["uri"].as_str()?.to_owned()),
        "app.bsky.graph.follow" | "app.bsky.graph.block" => Some(record["subject"].as_str()?.to_owned()),
        _ => None,
    }
}

/// (author, collection, subject) of each like, repost, follow and block created in `out`.
fn pairs_of(out: &[u8]) -> Vec<(String, String, String)> {
    let mut pairs = Vec::new();
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        if let Operation::Create(op) = parse_event(line).unwrap().operation {
            let (did, collection) = (op.record_ref.did.to_string(), op.record_ref.collection.to_string());
            if let Some(subject) = pair_subject(&collection, &op.record) {
                pairs.push((did, collection, subject));
            }
        }
    }
    pairs
}

#[test]
fn an_author_likes_reposts_follows_or_blocks_a_subject_once() {
    // Few accounts and posts, so that Zipf draws alone would repeat pairs often (a fifth of
    // the follows and an eighth of the likes of such a sample did).
    let shape = Shape { accounts: 300, posts: 2_000, ..shape(5, 30_000) };
    let (out, counts) = generate(shape);
    let pairs = pairs_of(&out);
    assert!(pairs.len() > 20_000, "{} pairs", pairs.len());
    let distinct: HashSet<&(String, String, String)> = pairs.iter().collect();
    assert_eq!(counts.repeated_pairs, 0);
    assert_eq!(distinct.len(), pairs.len(), "a pair repeated");
}

#[test]
fn a_workload_out_of_subjects_repeats_pairs_and_counts_them() {
    let shape = Shape { accounts: 2, posts: 1, ..shape(5, 2_000) };
    let (out, counts) = generate(shape);
    let pairs = pairs_of(&out);
    let distinct: HashSet<&(String, String, String)> = pairs.iter().collect();
    let repeated = pairs.len() - distinct.len();
    // The filter may take a new pair for an old one: counted, though no repeat.
    assert!(repeated > 0 && repeated as u64 <= counts.repeated_pairs, "{repeated} repeated");
}
